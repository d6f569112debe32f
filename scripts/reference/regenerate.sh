#!/usr/bin/env bash
# regenerate.sh — rebuild specula's reference fixtures in crates/model/tests/data/reference/
# (the shipped Q4_1 file), for another format of it in crates/model/tests/data/reference/FORMAT/,
# or for another model known by name (`specula model list`) in .../reference/NAME/.
#
# Steps (see scripts/reference/README.md for what each file means):
#   1. model and llama.cpp via scripts/fetch-model.sh (FORMAT Q4_1) or scripts/requantize.sh
#      FORMAT (the Q4_1 file requantised by llama-quantize), and scripts/build-llama-cpp.sh
#   2. a Python venv with the pinned pip packages (gguf, numpy)
#   3. tokens: llama-tokenize on reference_text.txt (no BOS: the model's add_bos_token is false)
#   4. llama.cpp logits at every position (llamacpp_logits.c, compiled here against libllama),
#      on the Q4_1 model and on an all-F32 copy of it (make_f32_gguf.py) with an F32 KV cache and
#      flash attention off (the exactness check of the reference)
#   5. the float64 NumPy reference (numpy_forward.py)
#   6. llama-perplexity in its normal mode on the same text (-c 1024), saving its logits file
#   7. compare_llamacpp.py: llama.cpp's fixture files, the figures and meta.json
#
# For a FORMAT other than Q4_1 the folder keeps only what the Rust test needs: the three numpy_*
# files and meta.json (llama.cpp's figures, the model file's SHA-256 and where it came from). The
# tokens must equal the Q4_1 fixture's tokens.bin (same tokenizer; checked, not stored again).
# A named model's folder keeps the same files and its own tokens.bin (its own tokenizer).
#
# Usage (from anywhere; takes about 2-3 minutes on 2 cores, peak memory about 3.5 GiB):
#     scripts/reference/regenerate.sh              # Q4_1: crates/model/tests/data/reference/
#     scripts/reference/regenerate.sh Q4_K_M       # crates/model/tests/data/reference/Q4_K_M/
#     scripts/reference/regenerate.sh qwen2.5-coder-0.5b   # .../reference/qwen2.5-coder-0.5b/
#                                                  # (pulled by `specula model pull`: a few minutes,
#                                                  # about 8 GiB of scratch and 6 GiB of memory)
#
# Environment:
#     THREADS        threads for llama.cpp and for NumPy's BLAS (default: 2)
#     REF_VENV       the venv to create or reuse (default: ${TMPDIR:-/tmp}/specula-ref-venv)
#     REF_WORK_DIR   scratch folder for the full logits (about 2.5 GB; default: ${TMPDIR:-/tmp}/specula-ref-work)
#     KEEP_WORK      1 keeps the scratch folder afterwards (default: removed)
#     PYTHON         base interpreter for the venv (default: python3)
#     (plus those of fetch-model.sh and build-llama-cpp.sh: SPECULA_HOME, LLAMA_CPP_DIR, ...)
set -euo pipefail

CHUNK=1024

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
TEXT="scripts/reference/reference_text.txt"
BASE_OUT="crates/model/tests/data/reference"
FORMAT="${1:-Q4_1}"
NAMED=""
if [[ "$FORMAT" =~ ^[a-z0-9][a-z0-9.-]*$ && "$FORMAT" == *[.-]* ]]; then
    NAMED="$FORMAT"                 # a model by name, e.g. qwen2.5-coder-0.5b
else
    FORMAT="${FORMAT^^}"
    [[ "$FORMAT" =~ ^[A-Z0-9_]+$ ]] || { echo "regenerate: error: bad format or model name: $FORMAT" >&2; exit 1; }
fi
# What a requantised format's folder keeps (the rest stays in the scratch folder).
KEPT_FILES="numpy_top20_ids.bin numpy_top20_logprobs.bin numpy_target_logprobs.bin meta.json"
THREADS="${THREADS:-2}"
source scripts/reference/venv.sh
WORK="${REF_WORK_DIR:-${TMPDIR:-/tmp}/specula-ref-work}"
export OMP_NUM_THREADS="$THREADS" OPENBLAS_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"

log() { echo "regenerate: $*" >&2; }
declare -A T
step_start=$SECONDS
lap() { T[$1]=$((SECONDS - step_start)); log "$1 took ${T[$1]} s"; step_start=$SECONDS; }

# 1. model and llama.cpp ----------------------------------------------------------------------
SOURCE_MODEL="$(scripts/fetch-model.sh | tail -n1)"
BIN="$(scripts/build-llama-cpp.sh | tail -n1)"
if [[ -n "$NAMED" ]]; then
    MODEL="$(cargo run --release --quiet -p specula -- model pull "$NAMED" | tail -n1)"
    OUT="$WORK/fixture-$NAMED"
    FINAL="$BASE_OUT/$NAMED"
    KEPT_FILES="$KEPT_FILES tokens.bin"
elif [[ "$FORMAT" == Q4_1 ]]; then
    MODEL="$SOURCE_MODEL"
    OUT="$BASE_OUT"                 # written in place, every file committed
    FINAL=""
else
    MODEL="$(scripts/requantize.sh "$FORMAT" | tail -n1)"
    OUT="$WORK/fixture-$FORMAT"     # staged; only $KEPT_FILES go to $FINAL
    FINAL="$BASE_OUT/$FORMAT"
    [[ -f "$BASE_OUT/tokens.bin" ]] || { log "error: run scripts/reference/regenerate.sh (Q4_1) first"; exit 1; }
fi
log "format $FORMAT: $MODEL"
LLAMA_SRC="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BIN/../CMakeCache.txt")"
[[ -f "$LLAMA_SRC/include/llama.h" ]] || { log "error: llama.h not found under $LLAMA_SRC"; exit 1; }
LLAMA_VERSION="$(cat "$BIN/../../VERSION" 2>/dev/null || true)"

# 2. venv -------------------------------------------------------------------------------------
ref_venv
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
if [[ -n "$FINAL" && -z "$NAMED" ]] && ! cmp -s "$OUT/tokens.bin" "$BASE_OUT/tokens.bin"; then
    log "error: $FORMAT's tokens differ from $BASE_OUT/tokens.bin (the tokenizer should be the same)"
    exit 1
fi
lap tokenize

# 4. llama.cpp logits -------------------------------------------------------------------------
cc -O2 -std=c11 -Wall -I"$LLAMA_SRC/include" -I"$LLAMA_SRC/ggml/include" scripts/reference/llamacpp_logits.c \
    -L"$BIN" -Wl,-rpath,"$BIN" -lllama -lggml -lggml-base -o "$WORK/llamacpp_logits"
"$WORK/llamacpp_logits" "$MODEL" "$WORK/tokens.i32" "$CHUNK" "$THREADS" "$WORK/llamacpp_logits.f32"
lap "llamacpp_logits_${FORMAT,,}"
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
requant_args=()
if [[ -n "$NAMED" ]]; then
    requant_args=(--format "$NAMED" --kept-files "${KEPT_FILES// /,}")
elif [[ -n "$FINAL" ]]; then
    requant_args=(--format "$FORMAT" --requantized-from "$SOURCE_MODEL" --kept-files "${KEPT_FILES// /,}")
fi
"$PY" scripts/reference/compare_llamacpp.py --tokens "$OUT/tokens.json" --work-dir "$WORK" --out-dir "$OUT" \
    --chunk "$CHUNK" --model "$MODEL" --text "$TEXT" --llama-version "$LLAMA_VERSION" --threads "$THREADS" \
    "${requant_args[@]}"
lap compare
log "compare took ${T[compare]} s (not in meta.json)"

if [[ -n "$FINAL" ]]; then
    mkdir -p "$FINAL"
    for f in $KEPT_FILES; do cp "$OUT/$f" "$FINAL/$f.partial.$$" && mv -f "$FINAL/$f.partial.$$" "$FINAL/$f"; done
    OUT="$FINAL"
fi
if [[ "${KEEP_WORK:-0}" != "1" ]]; then rm -rf "$WORK"; fi
ls -l "$OUT" >&2
log "done"
