#!/usr/bin/env bash
# synthetic.sh — the reference fixtures of the architectures checked on synthetic weights only
# (qwen3 and Llama 3's RoPE scaling: no such GGUF is reachable here), and of a small gemma3
# whose sliding window (24 positions) the 128-token chunks cross many times, in
# crates/model/tests/data/reference/synthetic/.
#
# make_synthetic.py writes three tiny random-weight GGUFs and 384 token ids (committed: 130 KB
# each); then for each model, as regenerate.sh does for the real ones, teacher-forced in chunks
# of 128 tokens: llama.cpp's logits (llamacpp_logits.c) and the float64 NumPy reference
# (numpy_forward.py), kept as the reference's top-20, llama.cpp's top-20, llama.cpp's
# log-probabilities at the reference's top-20 and both targets, with meta.json. The Rust test
# (crates/model/tests/reference_numpy.rs) computes llama.cpp's figures from these files and its
# own beside them.
#
# Usage: scripts/reference/synthetic.sh   (seconds, after regenerate.sh's venv and llama.cpp)
# Environment: REF_VENV, PYTHON, THREADS as for regenerate.sh.
set -euo pipefail

CHUNK=128
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="crates/model/tests/data/reference/synthetic"
THREADS="${THREADS:-2}"
source scripts/reference/venv.sh
log() { echo "synthetic: $*" >&2; }

BIN="$(scripts/build-llama-cpp.sh | tail -n1)"
LLAMA_SRC="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BIN/../CMakeCache.txt")"
ref_venv
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cc -O2 -std=c11 -Wall -I"$LLAMA_SRC/include" -I"$LLAMA_SRC/ggml/include" scripts/reference/llamacpp_logits.c \
    -L"$BIN" -Wl,-rpath,"$BIN" -lllama -lggml -lggml-base -o "$WORK/llamacpp_logits"

mkdir -p "$OUT"
"$PY" scripts/reference/make_synthetic.py "$OUT"
mv "$OUT/tokens.i32" "$WORK/tokens.i32"
for arch in qwen3 llama3 gemma3; do
    dir="$OUT/$arch"
    mkdir -p "$dir"
    "$WORK/llamacpp_logits" "$OUT/$arch.gguf" "$WORK/tokens.i32" "$CHUNK" "$THREADS" "$WORK/$arch-cpp.f32"
    "$PY" scripts/reference/numpy_forward.py --model "$OUT/$arch.gguf" --tokens "$OUT/tokens.json" \
        --chunk "$CHUNK" --out-dir "$dir" --work-dir "$WORK/$arch"
    "$PY" - "$OUT" "$arch" "$WORK" "$CHUNK" "$(cat "$BIN/../../VERSION" 2>/dev/null || true)" <<'PY'
import hashlib, json, sys
import numpy as np
out, arch, work, chunk, version = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
ids = np.fromfile(f"{out}/tokens.bin", dtype="<u4")
ref = np.load(f"{work}/{arch}/numpy_logprobs.npy")
n, V = ref.shape
cpp = np.fromfile(f"{work}/{arch}-cpp.f32", dtype="<f4").reshape(n, V).astype(np.float64)
cpp -= cpp.max(axis=1, keepdims=True)
cpp -= np.log(np.exp(cpp).sum(axis=1, keepdims=True))
ref_top = np.fromfile(f"{out}/{arch}/numpy_top20_ids.bin", dtype="<u4").reshape(n, 20)
cpp_top = np.argsort(-cpp, axis=1, kind="stable")[:, :20]
d = f"{out}/{arch}"
cpp_top.astype("<u4").tofile(f"{d}/llamacpp_top20_ids.bin")
np.take_along_axis(cpp, ref_top.astype(np.int64), axis=1).astype("<f4").tofile(f"{d}/llamacpp_logprobs_at_numpy_top20.bin")
cpp[np.arange(n - 1), ids[1:]].astype("<f8").tofile(f"{d}/llamacpp_target_logprobs.bin")
p = np.exp(ref)
kl = (p * (ref - cpp)).sum(axis=1)
meta = {
    "description": f"Synthetic {arch} model (random weights, scripts/reference/make_synthetic.py): "
                   "the float64 NumPy reference and llama.cpp, teacher-forced over tokens.bin",
    "n_pos": int(n), "k": 20,
    "chunking": {"chunk_size": chunk},
    "model": {"file": f"{arch}.gguf",
              "sha256": hashlib.sha256(open(f"{out}/{arch}.gguf", "rb").read()).hexdigest()},
    "llamacpp": {"version": version,
                 "vs_reference": {"top1_agreement_percent": float(100 * (ref.argmax(1) == cpp.argmax(1)).mean()),
                                  "kl_full_vocab_mean_nats": float(kl.mean())}},
}
json.dump(meta, open(f"{d}/meta.json", "w"), indent=1)
print(f"synthetic: {arch}: llama.cpp top-1 {meta['llamacpp']['vs_reference']['top1_agreement_percent']:.2f} %, "
      f"mean KL {kl.mean():.3g}", file=sys.stderr)
PY
done
rm -f "$OUT/tokens.json"
ls -l "$OUT" "$OUT"/* >&2
