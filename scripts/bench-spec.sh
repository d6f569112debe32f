#!/usr/bin/env bash
# Speculative decoding, measured: `specula serve` without speculation (the baseline) and with it
# (the candidate), both running at once on two loopback ports, and the `specula bench` levels run
# alternately (level 1 on the baseline, level 1 on the candidate, level 2 on the baseline, ...),
# so slow drifts of a shared machine hit both alike. Then `specula bench compare`.
#
# With SERVER=llama-server the same comparison runs on llama.cpp's llama-server (built by
# scripts/build-llama-cpp.sh): the peer's own speculation gain on the same prompts.
#
# Usage: scripts/bench-spec.sh [specula bench flags, e.g. --dataset rewrite]
# Environment: SERVER (specula or llama-server), SPEC (the candidate's server flags: specula
#              "--speculative-algorithm NGRAM", llama-server "--spec-type ngram-simple
#              --spec-draft-n-max 8"), BASE (the baseline's server flags, none by default; e.g.
#              BASE=--disable-radix-cache SPEC= compares the prefix cache off and on), NAME
#              (ngram: the candidate's result stem), LEVELS
#              (1,2,5,10,30,70,100,250), THREADS (2), PORT (30000; the candidate uses PORT+1),
#              OUT_DIR (target/bench-results; the candidate's files are NAME.*, the baseline's
#              NAME-baseline.*), ROUNDS (1: each level runs ROUNDS times per side,
#              the sides' order swapped every round so a steady drift cancels; the per-round
#              throughput ratios and their median are printed after the compare table of round 1;
#              with speculation, each level's decode time against the baseline's on the same
#              prompts, split by whether the candidate drafted for the request),
#              CANDIDATE_BODY (JSON merged into the candidate's requests only, e.g. a
#              `response_format`: structured outputs against the same requests unconstrained),
#              BODY (JSON merged into both sides' requests, where CANDIDATE_BODY does not
#              replace it: e.g. the same schema on both, BASE=--disable-grammar-forced-drafts SPEC=),
#              ONE_AT_A_TIME (1: each side's server is started for its own level and stopped after
#              it, so only one server is ever up; on some hosts an idle second server costs the
#              one being measured several per cent at low C, see BENCHMARKS.md)
set -euo pipefail
cd "$(dirname "$0")/.."
SERVER="${SERVER:-specula}"
if [ "$SERVER" = llama-server ]; then
    SPEC="${SPEC:---spec-type ngram-simple --spec-draft-n-max 8}"
else
    SPEC="${SPEC---speculative-algorithm NGRAM}"
fi
NAME="${NAME:-ngram}"
LEVELS="${LEVELS:-1,2,5,10,30,70,100,250}"
THREADS="${THREADS:-2}"
PORT="${PORT:-30000}"
OUT_DIR="${OUT_DIR:-target/bench-results}"
ROUNDS="${ROUNDS:-1}"
ONE_AT_A_TIME="${ONE_AT_A_TIME:-0}"
mkdir -p "$OUT_DIR/levels"
model=$(scripts/fetch-model.sh | tail -n1)
cargo build --release --quiet
bench_flags=()
if [ "$SERVER" = llama-server ]; then
    bin_dir=$(scripts/build-llama-cpp.sh | tail -n1)
    # One slot per concurrent request; llama-server ties a thread to each open connection.
    slots=$(tr , '\n' <<<"$LEVELS" | sort -n | tail -n1)
    bench_flags=(--no-keep-alive)
fi

pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true' EXIT
start_server() { # PORT LOG [flags...]
    local port=$1 log=$2
    shift 2
    if [ "$SERVER" = llama-server ]; then
        "$bin_dir/llama-server" -m "$model" --host 127.0.0.1 --port "$port" -t "$THREADS" \
            -np "$slots" -c $((slots * 1024)) "$@" >"$log" 2>&1 &
    else
        target/release/specula serve --model-path "$model" --host 127.0.0.1 --port "$port" \
            --threads "$THREADS" "$@" >"$log" 2>&1 &
    fi
    pids+=($!)
    for _ in $(seq 1 300); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null && return 0
        sleep 0.5
    done
    echo "specula serve on port $port did not start; see $log" >&2
    exit 1
}
start_side() { # SIDE LOG: the side's server on its port
    if [ "$1" = baseline ]; then
        # shellcheck disable=SC2086 # BASE and SPEC are lists of flags
        start_server "$PORT" "$2" ${BASE:-}
    else
        # shellcheck disable=SC2086
        start_server $((PORT + 1)) "$2" $SPEC
    fi
}
stop_last_server() {
    kill -INT "${pids[-1]}" 2>/dev/null || true
    wait "${pids[-1]}" 2>/dev/null || true
    unset 'pids[-1]'
}
# A side's file stem: the baseline's carries the candidate's name, so that runs of several
# candidates into one OUT_DIR keep each its own baseline.
stem() { if [ "$1" = baseline ]; then echo "$NAME-baseline"; else echo "$1"; fi; }
if [ "$ONE_AT_A_TIME" != 1 ]; then
    start_side baseline "$OUT_DIR/$(stem baseline).server.log"
    start_side "$NAME" "$OUT_DIR/$NAME.server.log"
fi

IFS=, read -r -a levels <<<"$LEVELS"
# Each (level, round) takes its own slice of the dataset (--first-slice), the same on both sides:
# no invocation finds its prompts in a server's prefix cache from an earlier one, and the sides
# stay paired.
slice=0
for level in "${levels[@]}"; do
    for round in $(seq 1 "$ROUNDS"); do
        sides=(baseline "$NAME")
        [ $((round % 2)) = 1 ] || sides=("$NAME" baseline)
        for side in "${sides[@]}"; do
            port=$PORT
            body="${BODY:-}"
            if [ "$side" != baseline ]; then
                port=$((PORT + 1))
                body="${CANDIDATE_BODY:-$body}"
            fi
            side_flags=()
            [ -z "$body" ] || side_flags=(--extra-body "$body")
            echo "== $side, C=$level, round $round"
            file="$OUT_DIR/levels/$(stem "$side").$level.r$round"
            [ "$ONE_AT_A_TIME" != 1 ] || start_side "$side" "$file.server.log"
            target/release/specula bench --base-url "http://127.0.0.1:$port" --concurrency "$level" \
                --first-slice "$slice" --output "$file.json" \
                "${bench_flags[@]}" "${side_flags[@]}" "$@" | grep -E "C=|Note:" || true
            [ "$ONE_AT_A_TIME" != 1 ] || stop_last_server
        done
        slice=$((slice + 1))
    done
done
if [ "$ONE_AT_A_TIME" = 1 ]; then
    : # the servers are down; each level's file holds its server's counters
elif [ "$SERVER" = specula ]; then
    curl -s "http://127.0.0.1:$((PORT + 1))/metrics" |
        grep -E '^specula:(spec_(draft|accepted|acceptance|steps|catch_up)|grammar_|generation_tokens)' || true
    for side in baseline "$NAME"; do
        port=$PORT
        [ "$side" = baseline ] || port=$((PORT + 1))
        # The baseline's speculation too, when it has some (BASE=...).
        curl -s "http://127.0.0.1:$port/metrics" |
            grep -E '^specula:(cache_hit_rate|cached_tokens_total|spec_(accepted_tokens|verifications)_total)' |
            sed "s/^/$side: /" || true
    done
else
    grep -E "draft acceptance|accepted" "$OUT_DIR/$NAME.server.log" | tail -n 3 || true
fi

# One run file per side (round 1), its levels in order, for `specula bench compare`; with
# several rounds, each level's throughput ratio per round and the median.
python3 - "$OUT_DIR" "$NAME" "$LEVELS" "$ROUNDS" "$(stem baseline)" <<'PY'
import json, statistics, sys
out, name, levels, rounds = sys.argv[1], sys.argv[2], sys.argv[3].split(","), int(sys.argv[4])
base = sys.argv[5]
load = lambda side, level, r: json.load(open(f"{out}/levels/{side}.{level}.r{r}.json"))
for side in (base, name):
    runs = [load(side, l, 1) for l in levels]
    merged = runs[0]
    merged["levels"] = [lv for r in runs for lv in r["levels"]]
    merged["config"]["concurrency"] = [int(l) for l in levels]
    json.dump(merged, open(f"{out}/{side}.json", "w"))
if rounds > 1:
    print(f"== throughput ratio ({name} / baseline) per round")
    for l in levels:
        tput = lambda side, r: load(side, l, r)["levels"][0]["stats"]["throughput_tok_s"]
        ratios = [tput(name, r) / tput(base, r) for r in range(1, rounds + 1)]
        shown = " ".join(f"x{x:.2f}" for x in ratios)
        print(f"  C={int(l):>3} | {shown} | median x{statistics.median(ratios):.2f}")
# Where the candidate's time went: each request against the same prompt's on the baseline
# (decode time, latency less TTFT), summed over rounds, split by whether the candidate drafted
# for it. Requests that never drafted show what merely enabling speculation costs.
def decode_s(q):
    return q["latency_s"] - q["ttft_s"]
split_lines = []
for l in levels:
    sums = {True: [0, 0.0, 0.0], False: [0, 0.0, 0.0]}
    for r in range(1, rounds + 1):
        b = {q["index"]: q for q in load(base, l, r)["levels"][0]["requests"] if not q["error"]}
        for q in load(name, l, r)["levels"][0]["requests"]:
            if q["error"] or q["index"] not in b:
                continue
            s = sums[bool(q.get("spec_accept_length"))]
            s[0] += 1
            s[1] += decode_s(b[q["index"]])
            s[2] += decode_s(q)
    if sums[True][0]:
        cell = lambda s: f"{s[0]} requests, x{s[1] / s[2]:.3f}" if s[0] and s[2] else "none"
        split_lines.append(f"  C={int(l):>3} | drafted: {cell(sums[True])} | never drafted: {cell(sums[False])}")
if split_lines:
    print(f"== decode speed ({name} / baseline, same prompts, all rounds) by whether it drafted")
    print("\n".join(split_lines))
PY
echo "== compare, round 1 (baseline: ${BASE:-plain}, candidate: $NAME)"
target/release/specula bench compare "$OUT_DIR/$(stem baseline).json" "$OUT_DIR/$NAME.json"
