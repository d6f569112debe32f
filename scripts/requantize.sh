#!/usr/bin/env bash
# requantize.sh — the default model (SmolLM2-135M-Instruct) in another GGUF weight format.
#
# Only the Q4_1 file can be fetched here (scripts/fetch-model.sh), so the other formats are made
# from it by llama.cpp's quantiser, once, and cached beside it:
#
#     llama-quantize --allow-requantize SmolLM2-135M-Instruct.Q4_1.gguf \
#         ${SPECULA_HOME:-$HOME/.cache/specula}/models/SmolLM2-135M-Instruct.FORMAT.gguf FORMAT
#
# FORMAT is any llama-quantize preset name (Q4_0, Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q2_K, Q3_K_M, ...;
# case-insensitive); FORMAT Q4_1 is the shipped file itself. llama-quantize comes from
# scripts/build-llama-cpp.sh, which builds only that tool here unless a full build exists.
#
# This is a *requantisation*: the weights are dequantised from Q4_1 and quantised again, so the
# file's quality is not that of quantising the original f16 weights to FORMAT (it is at best
# Q4_1's, and usually a little below it). That is fine for what the project uses these files for:
# kernel coverage, speed, and accuracy against references (scripts/reference/) that are computed
# on the requantised file's own weights, so the figures measure the arithmetic, not the format.
# The output of llama-quantize is deterministic for one llama.cpp version; the reference fixtures
# record the SHA-256 of the file they were made from, and the tests check it.
#
# Usage:
#     scripts/requantize.sh FORMAT          # prints the model path as the last line of stdout
#     MODEL=$(scripts/requantize.sh Q4_K_M | tail -n1)
#
# Environment:
#     SPECULA_HOME   cache root (default: $HOME/.cache/specula)
#     THREADS        llama-quantize threads (default: the number of CPUs)
#     PYTHON         python interpreter to use (default: python3)
#     (plus those of fetch-model.sh and build-llama-cpp.sh; LLAMA_CPP_TARGETS defaults to
#     llama-quantize here)
#
# Idempotent: a cached file is reused (delete it to make it again). The new file is written under
# a temporary name and renamed into place, so an interrupted run leaves nothing that looks done.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
SPECULA_HOME="${SPECULA_HOME:-$HOME/.cache/specula}"
MODEL_DIR="$SPECULA_HOME/models"
STEM="SmolLM2-135M-Instruct"

die() { echo "requantize: error: $*" >&2; exit 1; }
log() { echo "requantize: $*" >&2; }

[[ $# -eq 1 ]] || die "usage: scripts/requantize.sh FORMAT (a llama-quantize preset, e.g. Q4_K_M)"
FORMAT="${1^^}"
[[ "$FORMAT" =~ ^[A-Z0-9_]+$ ]] || die "bad format name: $1"

SOURCE="$(scripts/fetch-model.sh | tail -n1)"
[[ -f "$SOURCE" ]] || die "scripts/fetch-model.sh gave no model file"
if [[ "$FORMAT" == Q4_1 ]]; then
    echo "$SOURCE"
    exit 0
fi

MODEL_PATH="$MODEL_DIR/$STEM.$FORMAT.gguf"
if [[ -f "$MODEL_PATH" ]]; then
    if [[ "$(head -c4 "$MODEL_PATH")" == GGUF ]]; then
        log "cached copy: $MODEL_PATH"
        echo "$MODEL_PATH"
        exit 0
    fi
    log "cached copy is not a GGUF file; making it again"
    rm -f "$MODEL_PATH"
fi

BIN="$(LLAMA_CPP_TARGETS="${LLAMA_CPP_TARGETS:-llama-quantize}" scripts/build-llama-cpp.sh | tail -n1)"
[[ -x "$BIN/llama-quantize" ]] || die "no llama-quantize in $BIN"

mkdir -p "$MODEL_DIR"
PARTIAL="$MODEL_PATH.partial.$$"
QLOG="$MODEL_PATH.log.$$"
trap 'rm -f "$PARTIAL" "$QLOG"' EXIT
THREADS="${THREADS:-$(nproc 2>/dev/null || echo 2)}"
log "llama-quantize --allow-requantize $(basename "$SOURCE") -> $FORMAT ($THREADS threads)"
if ! "$BIN/llama-quantize" --allow-requantize "$SOURCE" "$PARTIAL" "$FORMAT" "$THREADS" >"$QLOG" 2>&1; then
    reason="$(grep -iE 'error|invalid|failed|usage|please' "$QLOG" | head -n1 | sed 's/^[[:space:]]*//' || true)"
    die "llama-quantize failed for $FORMAT${reason:+: $reason}"
fi
[[ "$(head -c4 "$PARTIAL" 2>/dev/null)" == GGUF ]] || die "llama-quantize wrote no GGUF file for $FORMAT"

mv -f "$PARTIAL" "$MODEL_PATH"
sha="$("$PYTHON" -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$MODEL_PATH")"
log "stored $(stat -c %s "$MODEL_PATH") bytes, SHA-256 $sha"
echo "$MODEL_PATH"
