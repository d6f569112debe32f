#!/usr/bin/env bash
# Instructions a server spends on a fixed workload, counted by callgrind: exact and repeatable
# where throughput on a shared host swings ±10 % a run. `specula serve` runs under
# `valgrind --tool=callgrind` on one thread; once it is healthy the counters are zeroed (start-up,
# weight packing and calibration are left out), one `specula bench` level runs against it, and the
# counters are dumped. Prints the total and the engine's and speculation's functions (inclusive).
#
# Usage: scripts/count-serve.sh NAME [specula serve flags, e.g. --speculative-algorithm EAGLE3]
# Environment: PORT (31000), OUT_DIR (target/count-serve), BENCH (the bench flags; default 8
#              requests at C=8 of 48 random prompt tokens and 40 answer tokens: about 28 billion
#              instructions, 10 minutes)
# Compare two runs side by side: run it twice with different flags (at once: each is one thread).
# Count fixed speculation policies: the adaptive one prices drafts from timings valgrind distorts
# and drafts far more than a server at full speed.
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: scripts/count-serve.sh NAME [serve flags]}
shift
PORT="${PORT:-31000}"
OUT_DIR="${OUT_DIR:-target/count-serve}"
BENCH="${BENCH:---concurrency 8 --requests-per-level 8 --max-tokens 40 --dataset random:48}"
command -v valgrind >/dev/null || { echo "count-serve: valgrind is not installed" >&2; exit 1; }
mkdir -p "$OUT_DIR"
model=$(scripts/fetch-model.sh | tail -n1)
cargo build --release --quiet
out="$OUT_DIR/$name.callgrind"
rm -f "$out" "$out".*
valgrind --tool=callgrind --callgrind-out-file="$out" target/release/specula serve \
    --model-path "$model" --host 127.0.0.1 --port "$PORT" --threads 1 "$@" \
    >"$OUT_DIR/$name.server.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 900); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
    kill -0 "$pid" 2>/dev/null || { echo "count-serve: the server exited; see $OUT_DIR/$name.server.log" >&2; exit 1; }
    sleep 1
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null ||
    { echo "count-serve: the server did not become healthy; see $OUT_DIR/$name.server.log" >&2; exit 1; }
callgrind_control -z "$pid" >/dev/null 2>&1
# shellcheck disable=SC2086 # BENCH is a list of flags
target/release/specula bench --port "$PORT" $BENCH --warmup-requests 0 --timeout 3000 \
    --output "$OUT_DIR/$name.bench.json" >"$OUT_DIR/$name.bench.txt"
callgrind_control -d serve "$pid" >/dev/null 2>&1
curl -s "http://127.0.0.1:$PORT/metrics" >"$OUT_DIR/$name.metrics"
kill -INT "$pid"
wait "$pid" || true
trap - EXIT
dump=$(ls "$out".* | head -n1)
echo "$name: $(grep '^totals:' "$dump" | cut -d' ' -f2) instructions serving ($dump)"
callgrind_annotate --inclusive=yes --threshold=100 "$dump" 2>/dev/null \
    | grep -E '^ *[0-9,]+ \([ 0-9.]+%\)  .*(engine/src|speculative/src|runner::Runner::forward_checked)' \
    | head -n 20
