#!/usr/bin/env bash
# serve-model.sh — the GGUF file the side-by-side server benchmarks serve, printed as the last
# line of stdout: MODEL (a model by name, `specula model list`: pulled by `specula model pull`)
# if set, else the default model in FORMAT (Q4_1 as shipped, or requantised by llama.cpp:
# scripts/requantize.sh). scripts/bench-serve.sh and scripts/bench-llama-server.sh use it, and
# serve the model under the name it prints first (`name: ...`).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n "${MODEL:-}" ]]; then
    cargo build --release --quiet -p specula
    echo "name: $MODEL"
    target/release/specula model pull "$MODEL" | tail -n1
else
    echo "name: SmolLM2-135M-Instruct-${FORMAT:-Q4_1}"
    scripts/requantize.sh "${FORMAT:-Q4_1}" | tail -n1
fi
