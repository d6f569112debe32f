#!/usr/bin/env bash
# The model runtime's speed beside llama.cpp's, in one run, on the same GGUF and thread count:
#   llama-bench          prompt processing (pp512) and single-sequence decode (tg128)
#   llama-batched-bench  aggregate decode of 1/8/32/64 sequences in one batched step
#   specula model bench  the same three measurements on specula's runtime
# Fetches the model and builds llama.cpp first if needed (scripts/fetch-model.sh,
# scripts/build-llama-cpp.sh). Run on an otherwise idle machine; compare ratios within one run.
#
# Usage: scripts/bench-runtime.sh      Environment: THREADS (2)
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${THREADS:-2}"
model=$(scripts/fetch-model.sh | tail -n1)
bin_dir=$(scripts/build-llama-cpp.sh | tail -n1)
cargo build --release --quiet

echo "== llama-bench -t $THREADS -p 512 -n 128"
"$bin_dir/llama-bench" -m "$model" -t "$THREADS" -p 512 -n 128 -r 3 2>/dev/null | grep -E "^\|"
echo "== llama-batched-bench -t $THREADS -npp 128 -ntg 32 -npl 1,8,32,64"
"$bin_dir/llama-batched-bench" -m "$model" -t "$THREADS" -c 16384 -b 2048 -ub 512 \
    -npp 128 -ntg 32 -npl 1,8,32,64 2>/dev/null | grep -E "^\|"
echo "== specula model bench (SPECULA_THREADS=$THREADS)"
SPECULA_THREADS="$THREADS" target/release/specula model bench --model "$model" \
    --pp 512 --tg 128 --batch 1,8,32,64 --batch-prompt 128 --batch-tokens 32
