#!/usr/bin/env bash
# The soak of issue 43: `specula serve` on the default model (tool calls parsed, so forced calls
# run too) under scripts/soak.py's mix of requests — streamed and whole chat, completions,
# streams dropped mid-way, structured outputs, forced tool calls, hostile requests — at C=32 for
# 30 minutes, its RSS sampled every 10 s. Fails on any 5xx, any request left without an answer,
# or RSS growing more than 10 % after the warm-up (the first tenth of the run).
#
# Usage: scripts/soak.sh [extra specula serve flags]
# Environment: SECONDS_TOTAL (1800), CONCURRENCY (32), PORT (31100), OUT_DIR (target/soak)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TOTAL="${SECONDS_TOTAL:-1800}"
CONCURRENCY="${CONCURRENCY:-32}"
PORT="${PORT:-31100}"
OUT_DIR="${OUT_DIR:-target/soak}"
mkdir -p "$OUT_DIR"
model=$(scripts/fetch-model.sh | tail -n1)
cargo build --release --quiet
target/release/specula serve --model-path "$model" --host 127.0.0.1 --port "$PORT" \
    --tool-call-parser hermes "$@" >"$OUT_DIR/server.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
    kill -0 "$pid" 2>/dev/null || { echo "soak: the server exited; see $OUT_DIR/server.log" >&2; exit 1; }
    sleep 1
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null ||
    { echo "soak: the server did not become healthy; see $OUT_DIR/server.log" >&2; exit 1; }
status=0
python3 scripts/soak.py --url "http://127.0.0.1:$PORT" --pid "$pid" --seconds "$SECONDS_TOTAL" \
    --concurrency "$CONCURRENCY" --json "$OUT_DIR/soak.json" || status=$?
curl -s "http://127.0.0.1:$PORT/metrics" >"$OUT_DIR/metrics.txt" || true
kill -0 "$pid" 2>/dev/null || { echo "soak: the server died during the run" >&2; exit 1; }
exit "$status"
