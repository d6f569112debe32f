#!/usr/bin/env bash
# The default `specula bench` sweep against llama.cpp's llama-server serving the default model
# (SmolLM2-135M-Instruct Q4_1): the first peer figure the engine is held against.
# Fetches the model and builds llama-server first if needed (scripts/fetch-model.sh,
# scripts/build-llama-cpp.sh), starts it on loopback, runs the sweep, stops it.
#
# Usage: scripts/bench-llama-server.sh [extra specula bench flags, e.g. --concurrency 1,2,5]
# Environment: PORT (30000), PARALLEL (llama-server -np, 8), CTX_PER_SLOT (2048), THREADS (2),
#              OUT_DIR (target/bench-results), NAME (llama-server: the result files' stem),
#              MODEL or FORMAT (which file: scripts/serve-model.sh)
# llama-server ties an HTTP thread to each open connection, so the sweep runs with
# --no-keep-alive (see docs/bench.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${PORT:-30000}"
PARALLEL="${PARALLEL:-8}"
CTX_PER_SLOT="${CTX_PER_SLOT:-2048}"
THREADS="${THREADS:-2}"
OUT_DIR="${OUT_DIR:-target/bench-results}"
NAME="${NAME:-llama-server}"
mkdir -p "$OUT_DIR"

# MODEL (a model by name) or FORMAT (the default model as shipped, Q4_1, or requantised).
served=$(scripts/serve-model.sh)
model=$(tail -n1 <<< "$served")
name=$(sed -n 's/^name: //p' <<< "$served")
bin_dir=$(scripts/build-llama-cpp.sh | tail -n1)
cargo build --release --quiet

log="$OUT_DIR/$NAME.server.log"
"$bin_dir/llama-server" -m "$model" -a "$name" --host 127.0.0.1 --port "$PORT" \
    -np "$PARALLEL" -c $((PARALLEL * CTX_PER_SLOT)) -t "$THREADS" >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT

for _ in $(seq 1 120); do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then break; fi
    if ! kill -0 $server 2>/dev/null; then echo "llama-server exited; see $log" >&2; exit 1; fi
    sleep 1
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { echo "llama-server not ready after 120 s" >&2; exit 1; }
"$bin_dir/llama-server" --version 2>&1 | head -n1 | sed 's/^/llama-server /'

target/release/specula bench --base-url "http://127.0.0.1:$PORT" --no-keep-alive \
    --output "$OUT_DIR/$NAME.json" --csv "$OUT_DIR/$NAME.csv" --plot "$OUT_DIR/$NAME.svg" "$@"
