# venv.sh — sourced by regenerate.sh and synthetic.sh: the reference's Python environment, one
# place for its pinned packages. Defines ref_venv, which creates or reuses the venv REF_VENV
# (default ${TMPDIR:-/tmp}/specula-ref-venv, from the interpreter PYTHON, default python3) with
# gguf and numpy at the pinned versions, and sets PY to its python.
GGUF_VERSION="0.19.0"
NUMPY_VERSION="2.4.6"
REF_VENV="${REF_VENV:-${TMPDIR:-/tmp}/specula-ref-venv}"
PY="$REF_VENV/bin/python"

ref_venv() {
    if ! "$PY" -c "import gguf, numpy, importlib.metadata as m; assert m.version('gguf') == '$GGUF_VERSION' and numpy.__version__ == '$NUMPY_VERSION'" 2>/dev/null; then
        echo "creating venv $REF_VENV (gguf==$GGUF_VERSION numpy==$NUMPY_VERSION)" >&2
        "${PYTHON:-python3}" -m venv "$REF_VENV"
        "$PY" -m pip install --quiet "gguf==$GGUF_VERSION" "numpy==$NUMPY_VERSION" >&2
    fi
}
