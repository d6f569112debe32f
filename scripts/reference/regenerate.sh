#!/usr/bin/env bash
# regenerate.sh — rebuild specula's reference fixtures in crates/model/tests/data/reference/.
#
# Steps (see scripts/reference/README.md for what each file means):
#   1. model and llama.cpp via scripts/fetch-model.sh and scripts/build-llama-cpp.sh
#   2. a Python venv with the pinned pip packages (gguf, numpy)
#   3. tokens: llama-tokenize on reference_text.txt (no BOS: the model's add_bos_token is false)
#   4. llama.cpp logits at every position (llamacpp_logits.c, compiled here against libllama),
#      on the Q4_1 model and on an all-F32 copy of it (make_f32_gguf.py) with an F32 KV cache and
#      flash attention off (the exactness check of the reference)
#   5. the float64 NumPy reference (numpy_forward.py)
#   6. llama-perplexity in its normal mode on the same text (-c 1024), saving its logits file
#   7. compare_llamacpp.py: llama.cpp's fixture files, the figures and meta.json
#
# Usage (from anywhere; takes about 2-3 minutes on 2 cores, peak memory about 3.5 GiB):
#     scripts/reference/regenerate.sh
#
# Environment:
#     THREADS        threads for llama.cpp and for NumPy's BLAS (default: 2)
#     REF_VENV       the venv to create or reuse (default: ${TMPDIR:-/tmp}/specula-ref-venv)
#     REF_WORK_DIR   scratch folder for the full logits (about 2.5 GB; default: ${TMPDIR:-/tmp}/specula-ref-work)
#     KEEP_WORK      1 keeps the scratch folder afterwards (default: removed)
#     PYTHON         base interpreter for the venv (default: python3)
#     (plus those of fetch-model.sh and build-llama-cpp.sh: SPECULA_HOME, LLAMA_CPP_DIR, ...)
set -euo pipefail

GGUF_VERSION="0.19.0"
NUMPY_VERSION="2.4.6"
CHUNK=1024

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
TEXT="scripts/reference/reference_text.txt"
OUT="crates/model/tests/data/reference"
THREADS="${THREADS:-2}"
PYTHON="${PYTHON:-python3}"
REF_VENV="${REF_VENV:-${TMPDIR:-/tmp}/specula-ref-venv}"
WORK="${REF_WORK_DIR:-${TMPDIR:-/tmp}/specula-ref-work}"
export OMP_NUM_THREADS="$THREADS" OPENBLAS_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"

log() { echo "regenerate: $*" >&2; }
declare -A T
step_start=$SECONDS
lap() { T[$1]=$((SECONDS - step_start)); log "$1 took ${T[$1]} s"; step_start=$SECONDS; }

# 1. model and llama.cpp ----------------------------------------------------------------------
MODEL="$(scripts/fetch-model.sh | tail -n1)"
BIN="$(scripts/build-llama-cpp.sh | tail -n1)"
LLAMA_SRC="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BIN/../CMakeCache.txt")"
[[ -f "$LLAMA_SRC/include/llama.h" ]] || { log "error: llama.h not found under $LLAMA_SRC"; exit 1; }
LLAMA_VERSION="$(cat "$BIN/../../VERSION" 2>/dev/null || true)"

# 2. venv -------------------------------------------------------------------------------------
PY="$REF_VENV/bin/python"
if ! "$PY" -c "import gguf, numpy, importlib.metadata as m; assert m.version('gguf') == '$GGUF_VERSION' and numpy.__version__ == '$NUMPY_VERSION'" 2>/dev/null; then
    log "creating venv $REF_VENV (gguf==$GGUF_VERSION numpy==$NUMPY_VERSION)"
    "$PYTHON" -m venv "$REF_VENV"
    "$PY" -m pip install --quiet "gguf==$GGUF_VERSION" "numpy==$NUMPY_VERSION" >&2
fi
mkdir -p "$WORK" "$OUT"
lap setup

# 3. tokens -----------------------------------------------------------------------------------
grep -q '\\' "$TEXT" && { log "error: $TEXT must not contain backslashes (llama.cpp processes escapes)"; exit 1; }
"$BIN/llama-tokenize" -m "$MODEL" -f "$TEXT" --ids --log-disable 2>/dev/null | tail -n1 > "$WORK/ids.txt"
"$PY" - "$WORK/ids.txt" "$OUT" "$WORK" <<'PY'
import ast, json, sys, numpy as np
ids = ast.literal_eval(open(sys.argv[1]).read().strip())
out, work = sys.argv[2], sys.argv[3]
with open(f"{out}/tokens.json", "w") as f:
    json.dump({"ids": ids}, f, separators=(",", ":"))
    f.write("\n")
np.asarray(ids, dtype="<u4").tofile(f"{out}/tokens.bin")
np.asarray(ids, dtype="<i4").tofile(f"{work}/tokens.i32")
print(f"regenerate: {len(ids)} tokens", file=sys.stderr)
PY
lap tokenize

# 4. llama.cpp logits -------------------------------------------------------------------------
cc -O2 -std=c11 -Wall -I"$LLAMA_SRC/include" -I"$LLAMA_SRC/ggml/include" scripts/reference/llamacpp_logits.c \
    -L"$BIN" -Wl,-rpath,"$BIN" -lllama -lggml -lggml-base -o "$WORK/llamacpp_logits"
"$WORK/llamacpp_logits" "$MODEL" "$WORK/tokens.i32" "$CHUNK" "$THREADS" "$WORK/llamacpp_logits.f32"
lap llamacpp_logits_q4_1
"$PY" scripts/reference/make_f32_gguf.py "$MODEL" "$WORK/model-f32.gguf"
"$WORK/llamacpp_logits" "$WORK/model-f32.gguf" "$WORK/tokens.i32" "$CHUNK" "$THREADS" "$WORK/llamacpp_f32_logits.f32" exact
rm -f "$WORK/model-f32.gguf"
lap llamacpp_logits_f32_copy

# 5. float64 reference ------------------------------------------------------------------------
"$PY" scripts/reference/numpy_forward.py --model "$MODEL" --tokens "$OUT/tokens.json" --chunk "$CHUNK" \
    --out-dir "$OUT" --work-dir "$WORK" --info-json "$WORK/info.json"
lap numpy_forward

# 6. llama-perplexity, normal mode ------------------------------------------------------------
"$BIN/llama-perplexity" -m "$MODEL" -f "$TEXT" -c "$CHUNK" -b "$CHUNK" -t "$THREADS" \
    --kl-divergence-base "$WORK/kld_base.bin" > "$WORK/llama_perplexity.log" 2>&1
grep "Final estimate" "$WORK/llama_perplexity.log" >&2
lap llama_perplexity

# 7. compare + meta.json ----------------------------------------------------------------------
{
    echo "{"
    for k in "${!T[@]}"; do echo "\"$k\": ${T[$k]},"; done
    echo "\"threads\": $THREADS }"
} > "$WORK/timings.json"
"$PY" scripts/reference/compare_llamacpp.py --tokens "$OUT/tokens.json" --work-dir "$WORK" --out-dir "$OUT" \
    --chunk "$CHUNK" --model "$MODEL" --text "$TEXT" --llama-version "$LLAMA_VERSION" --threads "$THREADS"
lap compare
log "compare took ${T[compare]} s (not in meta.json)"

if [[ "${KEEP_WORK:-0}" != "1" ]]; then rm -rf "$WORK"; fi
ls -l "$OUT" >&2
log "done"
