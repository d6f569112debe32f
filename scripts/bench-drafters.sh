#!/usr/bin/env bash
# Speculation's configurations against plain decoding, one server at a time: each round starts
# one `specula serve` per configuration (in an order rotated every round), runs the workloads on
# it, saves each run as JSON and the server's `/server_info` after it, and stops it. Then the
# per-round throughput ratios against plain (same round) and their medians, per workload and
# level. What BENCHMARKS.md's speculation sections were measured with.
#
# Usage: scripts/bench-drafters.sh
# Environment: MODEL (`--model` name, default: the default SmolLM2 file), CONFIGS (a `;`-list of
#              `--speculative-algorithm` values, `plain` for none; default "plain;NGRAM;SUFFIX"),
#              WORKLOADS (a `;`-list of `name:bench flags`; default: code at C=1,5 and edit at C=1),
#              ROUNDS (3), THREADS (2), PORT (30100), OUT_DIR (target/bench-drafters)
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIGS="${CONFIGS:-plain;NGRAM;SUFFIX}"
WORKLOADS="${WORKLOADS:-code:--dataset code --seed 31 --concurrency 1,5 --requests-per-level 15;edit:--dataset edit --seed 41 --concurrency 1 --requests-per-level 10 --max-tokens 400 --disable-ignore-eos}"
ROUNDS="${ROUNDS:-3}"
THREADS="${THREADS:-2}"
PORT="${PORT:-30100}"
OUT_DIR="${OUT_DIR:-target/bench-drafters}"
mkdir -p "$OUT_DIR"
cargo build --release --quiet
if [ -n "${MODEL:-}" ]; then
    model_flags=(--model "$MODEL")
else
    model_flags=(--model-path "$(scripts/fetch-model.sh | tail -n1)")
fi
IFS=';' read -r -a configs <<<"$CONFIGS"
IFS=';' read -r -a workloads <<<"$WORKLOADS"
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true' EXIT
for round in $(seq 1 "$ROUNDS"); do
    n=${#configs[@]}
    for k in $(seq 0 $((n - 1))); do
        config=${configs[$(((k + round - 1) % n))]}
        flags=()
        [ "$config" != plain ] && flags=(--speculative-algorithm "$config")
        log="$OUT_DIR/serve-$config-$round.log"
        target/release/specula serve --port "$PORT" --threads "$THREADS" "${model_flags[@]}" \
            "${flags[@]}" >"$log" 2>&1 &
        pid=$!
        for _ in $(seq 1 600); do
            curl -sf "localhost:$PORT/health" >/dev/null && break
            sleep 0.5
        done
        for w in "${workloads[@]}"; do
            name=${w%%:*}
            read -r -a bench <<<"${w#*:}"
            echo "bench-drafters: round $round, $config, $name" >&2
            target/release/specula bench --port "$PORT" "${bench[@]}" \
                --output "$OUT_DIR/$name-$config-$round.json" >"$OUT_DIR/$name-$config-$round.txt"
            curl -sf "localhost:$PORT/server_info" >"$OUT_DIR/$name-$config-$round.info.json"
        done
        kill "$pid"
        wait "$pid" 2>/dev/null || true
        pid=""
    done
done
python3 - "$OUT_DIR" "$ROUNDS" "$CONFIGS" "$WORKLOADS" <<'PY'
import json, statistics, sys
out, rounds, configs, workloads = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(";"), sys.argv[4].split(";")
def levels(path):
    run = json.load(open(path))
    return {l["stats"]["concurrency"]: l["stats"]["throughput_tok_s"] for l in run["levels"]}
print("| workload | C | plain tok/s | " + " | ".join(c for c in configs if c != "plain") + " |")
print("| --- | --- | --- |" + " --- |" * (len(configs) - 1))
for w in workloads:
    name = w.split(":")[0]
    runs = {(c, r): levels(f"{out}/{name}-{c}-{r}.json") for c in configs for r in range(1, rounds + 1)}
    for level in sorted(runs[("plain", 1)]):
        plain = [runs[("plain", r)][level] for r in range(1, rounds + 1)]
        cells = []
        for c in configs:
            if c == "plain":
                continue
            ratios = [runs[(c, r)][level] / runs[("plain", r)][level] for r in range(1, rounds + 1)]
            cells.append(f"×{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})")
        print(f"| {name} | {level} | {statistics.median(plain):.1f} | " + " | ".join(cells) + " |")
PY
