#!/usr/bin/env bash
# The official `openai` Python package against `specula serve` (scripts/openai_client_test.py).
# Installs the package into target/pylib-openai on first use (pip --target: no virtualenv
# needed), starts the server on a free loopback port, runs the checks, stops the server.
#
# Usage: scripts/test-openai.sh      (after `cargo build --release`)
set -euo pipefail
cd "$(dirname "$0")/.."
lib=target/pylib-openai
if ! PYTHONPATH="$lib" python3 -c "import openai" 2>/dev/null; then
    echo "test-openai: installing the openai package into $lib" >&2
    python3 -m pip install --quiet --disable-pip-version-check --target "$lib" "openai>=1.40" \
        >/dev/null 2>&1 || python3 -m pip install --quiet --disable-pip-version-check \
        --target "$lib" "openai>=1.40"
fi
model=$(scripts/fetch-model.sh | tail -n1)
log=target/openai-serve.log
target/release/specula serve --port 0 --model-path "$model" --log-level warning >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT
url=""
for _ in $(seq 1 600); do
    url=$(sed -n 's/^specula serve: ready on \(http[^ ]*\).*/\1/p' "$log")
    [ -n "$url" ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.2
done
[ -n "$url" ] || { echo "test-openai: the server did not become ready" >&2; cat "$log" >&2; exit 1; }
PYTHONPATH="$lib" python3 scripts/openai_client_test.py "$url/v1"
