#!/usr/bin/env bash
# How fast is the benchmark client itself? Runs the mock server on one core and `specula bench`
# on another, at high concurrency, and prints the client's streamed tokens/s and its CPU seconds
# per 1,000 tokens (from the run's JSON). Needs 2 cores and taskset (util-linux).
#
# Usage: scripts/bench-client.sh [extra specula bench flags]
# Environment: CONCURRENCY (250), REQUESTS (1000), MAX_TOKENS (200), MOCK_TPS (per stream, 200)
set -euo pipefail
cd "$(dirname "$0")/.."
CONCURRENCY="${CONCURRENCY:-250}"
REQUESTS="${REQUESTS:-1000}"
MAX_TOKENS="${MAX_TOKENS:-200}"
MOCK_TPS="${MOCK_TPS:-200}"
OUT_DIR="${OUT_DIR:-target/bench-results}"
mkdir -p "$OUT_DIR"
cargo build --release --quiet
BIN=target/release/specula

fifo=$(mktemp -u); mkfifo "$fifo"
taskset -c 1 "$BIN" bench mock-server --port 0 --tokens-per-second "$MOCK_TPS" --ttft-ms 20 >"$fifo" &
mock=$!
trap 'kill $mock 2>/dev/null; rm -f "$fifo"' EXIT
exec 3<"$fifo"
read -r line <&3
url=${line#mock server listening on }

json="$OUT_DIR/client-c$CONCURRENCY.json"
taskset -c 0 "$BIN" bench --base-url "$url" --concurrency "$CONCURRENCY" \
    --requests-per-level "$REQUESTS" --max-tokens "$MAX_TOKENS" --warmup-requests 10 \
    --output "$json" --verbose "$@"

python3 - "$json" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))
for level in run["levels"]:
    s = level["stats"]
    per_k = s["client_cpu_s"] / s["completion_tokens"] * 1000
    print(f"client at C={s['concurrency']}: {s['throughput_tok_s']:.0f} streamed tok/s, "
          f"{s['client_cpu_s']:.2f} CPU s for {s['completion_tokens']} tokens = "
          f"{per_k * 1000:.1f} CPU ms per 1,000 tokens "
          f"(one core would sustain ~{1000 / per_k:.0f} tok/s)")
PY
