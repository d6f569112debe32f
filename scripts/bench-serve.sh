#!/usr/bin/env bash
# specula serve beside llama.cpp's llama-server: the same `specula bench` sweep against each, on
# the same GGUF, thread count and machine, one after the other; then `specula bench compare`
# (llama-server as the baseline, specula as the candidate).
#
# Usage: scripts/bench-serve.sh [extra specula bench flags, e.g. --concurrency 1,2,5,10]
# Environment: THREADS (2), PARALLEL (llama-server -np, 64), CTX_PER_SLOT (1024),
#              OUT_DIR (target/bench-results), PORT (30000), FORMAT (Q4_1: the shipped file; any
#              llama-quantize preset, e.g. Q4_0 or Q4_K_M, serves the default model requantised),
#              MODEL (instead of FORMAT: a model by name, e.g. qwen2.5-coder-0.5b),
#              SPECULA_ARGS (extra `specula serve` flags, e.g. "--activations int16")
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${THREADS:-2}"
PORT="${PORT:-30000}"
OUT_DIR="${OUT_DIR:-target/bench-results}"
export THREADS PORT OUT_DIR FORMAT MODEL
mkdir -p "$OUT_DIR"
# MODEL (a model by name) or FORMAT (the default model as shipped, Q4_1, or requantised).
served=$(scripts/serve-model.sh)
model=$(tail -n1 <<< "$served")
name=$(sed -n 's/^name: //p' <<< "$served")
cargo build --release --quiet

log="$OUT_DIR/specula.server.log"
target/release/specula serve --model-path "$model" --host 127.0.0.1 --port "$PORT" \
    --threads "$THREADS" --served-model-name "$name" ${SPECULA_ARGS:-} >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 1 300); do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then break; fi
    if ! kill -0 $server 2>/dev/null; then echo "specula serve exited; see $log" >&2; exit 1; fi
    sleep 0.5
done
echo "== specula serve"
target/release/specula bench --base-url "http://127.0.0.1:$PORT" \
    --output "$OUT_DIR/specula.json" --csv "$OUT_DIR/specula.csv" "$@"
kill $server
wait $server 2>/dev/null || true
trap - EXIT

echo "== llama-server"
PARALLEL="${PARALLEL:-64}" CTX_PER_SLOT="${CTX_PER_SLOT:-1024}" NAME=llama-server \
    scripts/bench-llama-server.sh "$@"

echo "== compare (baseline llama-server, candidate specula)"
target/release/specula bench compare "$OUT_DIR/llama-server.json" "$OUT_DIR/specula.json" \
    --plot "$OUT_DIR/specula-vs-llama-server.svg"
