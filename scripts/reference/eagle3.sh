#!/usr/bin/env bash
# eagle3.sh — regenerate the tiny EAGLE-3 head fixture and its float64 forward pass
# (crates/speculative/tests/data/eagle3/tiny; see eagle3_reference.py). Deterministic: the same
# files on every run.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/reference/venv.sh
ref_venv
"$PY" scripts/reference/eagle3_reference.py crates/speculative/tests/data/eagle3/tiny
