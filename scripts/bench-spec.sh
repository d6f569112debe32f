#!/usr/bin/env bash
# Speculative decoding, measured: the same `specula bench` sweep against `specula serve` without
# speculation (the baseline) and with it (the candidate), one after the other on this machine,
# then `specula bench compare`.
#
# Usage: scripts/bench-spec.sh [extra specula bench flags, e.g. --dataset rewrite]
# Environment: SPEC ("--speculative-algorithm NGRAM", the candidate's serve flags), NAME (ngram:
#              the candidate's result stem), THREADS (2), PORT (30000), OUT_DIR (target/bench-results)
set -euo pipefail
cd "$(dirname "$0")/.."
SPEC="${SPEC:---speculative-algorithm NGRAM}"
NAME="${NAME:-ngram}"
THREADS="${THREADS:-2}"
PORT="${PORT:-30000}"
OUT_DIR="${OUT_DIR:-target/bench-results}"
mkdir -p "$OUT_DIR"
model=$(scripts/fetch-model.sh | tail -n1)
cargo build --release --quiet

# run_sweep STEM [serve flags...] -- [bench flags...]
run_sweep() {
    local stem=$1
    shift
    local serve_flags=()
    while [ "$1" != "--" ]; do serve_flags+=("$1"); shift; done
    shift
    local log="$OUT_DIR/$stem.server.log"
    target/release/specula serve --model-path "$model" --host 127.0.0.1 --port "$PORT" \
        --threads "$THREADS" "${serve_flags[@]}" >"$log" 2>&1 &
    local server=$!
    for _ in $(seq 1 300); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
        kill -0 $server 2>/dev/null || { echo "specula serve exited; see $log" >&2; exit 1; }
        sleep 0.5
    done
    echo "== $stem: specula serve ${serve_flags[*]}"
    target/release/specula bench --base-url "http://127.0.0.1:$PORT" \
        --output "$OUT_DIR/$stem.json" "$@"
    curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^specula:spec_(draft|accepted|acceptance|steps)' || true
    kill $server
    wait $server 2>/dev/null || true
}

# shellcheck disable=SC2086 # SPEC is a list of flags
run_sweep baseline -- "$@"
# shellcheck disable=SC2086
run_sweep "$NAME" $SPEC -- "$@"
echo "== compare (baseline: no speculation, candidate: $NAME)"
target/release/specula bench compare "$OUT_DIR/baseline.json" "$OUT_DIR/$NAME.json"
