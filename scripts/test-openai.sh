#!/usr/bin/env bash
# The official `openai` and `anthropic` Python packages against `specula serve`
# (scripts/openai_client_test.py, scripts/openai_tools_test.py, scripts/openai_structured_test.py,
# scripts/openai_responses_test.py, scripts/openai_embeddings_test.py,
# scripts/anthropic_messages_test.py). Installs the packages (and `jsonschema`, and
# `email-validator` for Pydantic's EmailStr) into target/pylib-openai on first use (pip --target:
# no virtualenv needed), starts three servers on free loopback ports (the real default model with the tool-call and
# reasoning parsers on, the same with its output scripted, the same with EAGLE-3 speculation) and
# with --with-qwen a fourth (Qwen2.5-Coder-0.5B with its tool-call parser: the tool round trip on
# a model that makes calls), runs the checks, stops the servers.
#
# Usage: scripts/test-openai.sh              (after `cargo build --release`; test.sh runs it)
#        scripts/test-openai.sh --with-qwen  (Qwen2.5-Coder pulled; test-heavy.sh runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
with_qwen=false
case "${1:-}" in
    "") ;;
    --with-qwen) with_qwen=true ;;
    *) echo "usage: scripts/test-openai.sh [--with-qwen]" >&2; exit 2 ;;
esac
lib=target/pylib-openai
if ! PYTHONPATH="$lib" python3 -c "import openai, anthropic, jsonschema, email_validator" \
    2>/dev/null; then
    echo "test-openai: installing the openai, anthropic and jsonschema packages into $lib" >&2
    packages=("openai>=1.40" "anthropic>=0.40" "jsonschema>=4" "email-validator>=2")
    python3 -m pip install --quiet --disable-pip-version-check --target "$lib" "${packages[@]}" \
        >/dev/null 2>&1 || python3 -m pip install --quiet --disable-pip-version-check \
        --target "$lib" "${packages[@]}"
fi
model=$(scripts/fetch-model.sh | tail -n1)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done' EXIT

# Starts `specula serve` with the given flags; sets `url` to its base URL once it is ready.
serve() {
    local log=$1
    shift
    # The log exists before the server opens it, so the readiness poll never reads a missing
    # file (a race that ended the script under `set -e`).
    : >"$log"
    target/release/specula serve --port 0 --log-level warning "$@" >"$log" 2>&1 &
    local pid=$!
    pids+=("$pid")
    url=""
    for _ in $(seq 1 600); do
        url=$(sed -n 's/^specula serve: ready on \(http[^ ]*\).*/\1/p' "$log")
        [ -n "$url" ] && break
        kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
        sleep 0.2
    done
    [ -n "$url" ] || { echo "test-openai: the server did not become ready" >&2; cat "$log" >&2; exit 1; }
}
smollm=(--model-path "$model" --tool-call-parser hermes --reasoning-parser qwen3)
serve target/openai-serve.log "${smollm[@]}"
real=$url
serve target/openai-serve-scripted.log "${smollm[@]}" \
    --scripted-output crates/specula/tests/fixtures/tool_script.json
scripted=$url
serve target/openai-serve-eagle3.log --model-path "$model" --speculative-algorithm EAGLE3 \
    --speculative-adaptive false
eagle3=$url
qwen=()
if $with_qwen; then
    serve target/openai-serve-qwen.log --model qwen2.5-coder-0.5b --tool-call-parser qwen25
    qwen=("$url/v1")
fi
PYTHONPATH="$lib" python3 scripts/openai_client_test.py "$real/v1"
PYTHONPATH="$lib" python3 scripts/openai_tools_test.py "$scripted/v1" "$real/v1" "${qwen[@]}"
PYTHONPATH="$lib" python3 scripts/openai_structured_test.py "$real/v1" "$eagle3/v1" "$real/v1"
PYTHONPATH="$lib" python3 scripts/anthropic_messages_test.py "$real" "$scripted"
PYTHONPATH="$lib" python3 scripts/openai_responses_test.py "$real/v1" "$scripted/v1"
PYTHONPATH="$lib" python3 scripts/openai_embeddings_test.py "$real/v1"
