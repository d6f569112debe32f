#!/usr/bin/env bash
# build-llama-cpp.sh — build llama.cpp's llama-server (and a few tools) as a comparison peer.
#
# llama.cpp's source is only reachable here as the `vendor/llama.cpp` folder inside the
# `llama-cpp-python` source distribution, so this script downloads that sdist with pip, unpacks
# it and builds with CMake + Ninja:
#
#     llama-server  llama-bench  llama-batched-bench  llama-tokenize  llama-perplexity  llama-quantize
#
# Everything lives in a scratch folder outside the repository (never commit source or binaries):
#
#     ${LLAMA_CPP_DIR:-${SPECULA_HOME:-$HOME/.cache/specula}/peers/llama.cpp}
#         sdist/                         downloaded llama_cpp_python-VERSION.tar.gz
#         src/llama_cpp_python-VERSION/  unpacked sdist (llama.cpp under vendor/llama.cpp)
#         build/bin/                     the binaries (native build)
#         VERSION                        what was built (llama-cpp-python version, llama.cpp build)
#         build-avx2/bin/, VERSION-avx2  the same for LLAMA_CPP_ISA=avx2
#
# Usage:
#     scripts/build-llama-cpp.sh            # prints the bin folder as the last line of stdout
#     BIN=$(scripts/build-llama-cpp.sh | tail -n1); "$BIN/llama-server" --version
#     LLAMA_CPP_TARGETS=llama-quantize scripts/build-llama-cpp.sh    # just that tool (CI)
#     LLAMA_CPP_ISA=avx2 LLAMA_CPP_TARGETS="llama-bench llama-batched-bench" scripts/build-llama-cpp.sh
#
# Environment:
#     SPECULA_HOME              cache root (default: $HOME/.cache/specula)
#     LLAMA_CPP_DIR             scratch folder (default: $SPECULA_HOME/peers/llama.cpp)
#     LLAMA_CPP_PYTHON_VERSION  llama-cpp-python sdist version to take llama.cpp from (default below)
#     BUILD_JOBS                ninja parallelism (default: 2)
#     PYTHON                    python interpreter to use (default: python3)
#     LLAMA_CPP_AMX             on: keep llama.cpp's AMX kernels (default off: they fault here)
#     LLAMA_CPP_ISA             native (default): -march=native, as above, into build/;
#                               avx2: a peer for CPUs without AVX-512, into its own build-avx2/
#                               (never touching the native build): GGML_NATIVE=OFF with SSE4.2,
#                               AVX, AVX2, FMA, F16C and BMI2 on, and AVX-512 (F, VBMI, VNNI,
#                               BF16), AVX-VNNI and AMX off; the built ggml libraries are checked
#                               for AVX-512 (zmm) instructions with objdump
#     LLAMA_CPP_TARGETS         the targets to build, space- or comma-separated (default: all six
#                               above); only these must exist for the build to count as done, so
#                               a later call with more targets builds the rest into the same folder
#
# Build tools (cmake, ninja-build via apt-get; scikit-build-core via pip, needed by pip to read the
# sdist's metadata with --no-build-isolation) are installed when missing. If the binaries for the
# requested version already exist, nothing is rebuilt. A full build takes about 4 minutes on 2 cores;
# llama-quantize alone about 80 % of that (it needs ggml, libllama and the common library).
set -euo pipefail

# Pinned after a first build: llama-cpp-python 0.3.36 was the newest sdist at the time.
LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
PYTHON="${PYTHON:-python3}"
BUILD_JOBS="${BUILD_JOBS:-2}"
SPECULA_HOME="${SPECULA_HOME:-$HOME/.cache/specula}"
LLAMA_CPP_DIR="${LLAMA_CPP_DIR:-$SPECULA_HOME/peers/llama.cpp}"
ALL_TARGETS=(llama-server llama-bench llama-batched-bench llama-tokenize llama-perplexity llama-quantize)
targets_spec="${LLAMA_CPP_TARGETS:-${ALL_TARGETS[*]}}"
read -r -a TARGETS <<< "${targets_spec//,/ }"

log() { echo "build-llama-cpp: $*" >&2; }
die() { echo "build-llama-cpp: error: $*" >&2; exit 1; }

[[ ${#TARGETS[@]} -gt 0 ]] || die "LLAMA_CPP_TARGETS names no target"
for t in "${TARGETS[@]}"; do
    [[ "$t" =~ ^[A-Za-z0-9_.-]+$ ]] || die "bad target name in LLAMA_CPP_TARGETS: $t"
done

mkdir -p "$LLAMA_CPP_DIR"
# Resolve symlinks: the sdist's vendor/llama.cpp/.git pointer file breaks ninja when the source is
# configured through a symlinked path.
LLAMA_CPP_DIR="$(cd -P "$LLAMA_CPP_DIR" && pwd)"
BUILD_DIR="$LLAMA_CPP_DIR/build"
BIN_DIR="$BUILD_DIR/bin"
VERSION_FILE="$LLAMA_CPP_DIR/VERSION"
LLAMA_CPP_AMX="${LLAMA_CPP_AMX:-off}"
LLAMA_CPP_ISA="${LLAMA_CPP_ISA:-native}"
# The AMX choice is part of what was built: changing it rebuilds.
WANT_VERSION_LINE="llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION amx=$LLAMA_CPP_AMX"
case "$LLAMA_CPP_ISA" in
    native) ;;
    avx2)
        [[ "$LLAMA_CPP_AMX" == off ]] || die "LLAMA_CPP_AMX=$LLAMA_CPP_AMX makes no sense with LLAMA_CPP_ISA=avx2"
        # A variant of its own: its own build folder and VERSION file, so the native build (and its
        # VERSION line, unchanged from before this option) is never disturbed.
        BUILD_DIR="$LLAMA_CPP_DIR/build-avx2"
        BIN_DIR="$BUILD_DIR/bin"
        VERSION_FILE="$LLAMA_CPP_DIR/VERSION-avx2"
        WANT_VERSION_LINE="llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION isa=avx2 amx=off"
        ;;
    *) die "LLAMA_CPP_ISA must be native or avx2, not: $LLAMA_CPP_ISA" ;;
esac

all_built() {
    local t
    for t in "${TARGETS[@]}"; do
        [[ -x "$BIN_DIR/$t" ]] || return 1
    done
    [[ -f "$VERSION_FILE" ]] && [[ "$(head -n1 "$VERSION_FILE")" == "$WANT_VERSION_LINE" ]]
}

if all_built; then
    log "already built ($WANT_VERSION_LINE)"
    echo "$BIN_DIR"
    exit 0
fi

# --- build tools -------------------------------------------------------------------------------
as_root() {
    if [[ "$(id -u)" -eq 0 ]]; then "$@"
    elif command -v sudo >/dev/null 2>&1; then sudo "$@"
    else die "need root (or sudo) to run: $*"
    fi
}

missing_pkgs=()
command -v cmake >/dev/null 2>&1 || missing_pkgs+=(cmake)
command -v ninja >/dev/null 2>&1 || missing_pkgs+=(ninja-build)
if [[ ${#missing_pkgs[@]} -gt 0 ]]; then
    command -v apt-get >/dev/null 2>&1 || die "missing ${missing_pkgs[*]} and no apt-get to install them"
    log "installing ${missing_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! as_root apt-get install -y -q "${missing_pkgs[@]}" >&2; then
        log "apt-get install failed; running apt-get update and retrying"
        as_root apt-get update -q >&2
        as_root apt-get install -y -q "${missing_pkgs[@]}" >&2
    fi
fi
command -v cc >/dev/null 2>&1 && command -v c++ >/dev/null 2>&1 || die "a C/C++ compiler (cc, c++) is required"

if ! "$PYTHON" -c 'import scikit_build_core' >/dev/null 2>&1; then
    log "installing scikit-build-core"
    "$PYTHON" -m pip install --quiet scikit-build-core >&2
fi

# --- source ------------------------------------------------------------------------------------
SDIST_DIR="$LLAMA_CPP_DIR/sdist"
SRC_PARENT="$LLAMA_CPP_DIR/src"
SRC_DIR="$SRC_PARENT/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
LLAMA_SRC="$SRC_DIR/vendor/llama.cpp"

if [[ ! -f "$LLAMA_SRC/CMakeLists.txt" ]]; then
    mkdir -p "$SDIST_DIR" "$SRC_PARENT"
    sdist="$SDIST_DIR/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
    if [[ ! -f "$sdist" ]]; then
        log "downloading llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION sdist"
        # --no-build-isolation: otherwise pip builds cmake from source just to read the metadata.
        "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
            -d "$SDIST_DIR" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >&2
    fi
    [[ -f "$sdist" ]] || die "sdist not found after download: $sdist"
    log "unpacking $(basename "$sdist")"
    rm -rf "$SRC_DIR"
    tar -xzf "$sdist" -C "$SRC_PARENT"
    [[ -f "$LLAMA_SRC/CMakeLists.txt" ]] || die "no vendor/llama.cpp/CMakeLists.txt in the sdist"
fi

# --- configure + build -------------------------------------------------------------------------
# A build folder configured from another source tree (another version) must be started afresh.
if [[ -f "$BUILD_DIR/CMakeCache.txt" ]] &&
   ! grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$LLAMA_SRC" "$BUILD_DIR/CMakeCache.txt"; then
    log "build folder belongs to another source tree; removing it"
    rm -rf "$BUILD_DIR"
fi

# The native build uses AMX where /proc/cpuinfo lists it. On this project's machines (VMs that
# list amx_tile; a lone tile instruction runs once AMX is requested) llama.cpp's AMX GEMM dies
# with SIGILL on `tilezero` in a worker thread, so AMX is left out unless LLAMA_CPP_AMX=on
# (explicit -mno-* flags win over -march=native).
amx_off=("-DCMAKE_C_FLAGS=" "-DCMAKE_CXX_FLAGS=")
if [[ "$LLAMA_CPP_AMX" != on && "$LLAMA_CPP_ISA" == native ]]; then
    amx_off=("-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
fi

# The instruction sets. Native: whatever -march=native gives (less AMX, above). avx2: ggml's own
# per-feature options with native off (each one adds its -m flag, ggml/src/ggml-cpu/CMakeLists.txt),
# every AVX-512 and AMX one off, and AVX-VNNI off too: an AVX2-only CPU (Haswell to Comet Lake,
# Zen 1-3) has no AVX-VNNI. The options are all set explicitly so a reused CMakeCache cannot keep
# another choice.
if [[ "$LLAMA_CPP_ISA" == native ]]; then
    isa_opts=(-DGGML_NATIVE=ON)
else
    isa_opts=(-DGGML_NATIVE=OFF
        -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
        -DGGML_AVX_VNNI=OFF
        -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
        -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_BACKEND_DL=OFF)
fi

# Binaries of another version or AMX choice (say a partial build left others behind) must not
# count as built later: clear them all before building for a new version line.
if [[ ! -f "$VERSION_FILE" ]] || [[ "$(head -n1 "$VERSION_FILE")" != "$WANT_VERSION_LINE" ]]; then
    for t in "${ALL_TARGETS[@]}" "${TARGETS[@]}"; do rm -f "$BIN_DIR/$t"; done
    rm -f "$VERSION_FILE"
fi

log "configuring ($LLAMA_SRC, isa=$LLAMA_CPP_ISA, into $BUILD_DIR)"
cmake -S "$LLAMA_SRC" -B "$BUILD_DIR" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    "${isa_opts[@]}" \
    "${amx_off[@]}" \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_CURL=OFF >&2

log "building ${TARGETS[*]} with -j$BUILD_JOBS"
start=$SECONDS
ninja -C "$BUILD_DIR" -j"$BUILD_JOBS" "${TARGETS[@]}" >&2
log "build took $((SECONDS - start)) s"

for t in "${TARGETS[@]}"; do
    [[ -x "$BIN_DIR/$t" ]] || die "$t was not produced in $BIN_DIR"
done

# The avx2 variant must hold no AVX-512 code: no instruction of ggml's libraries may name a zmm
# register (AVX-512's 512-bit registers; its 128/256-bit EVEX forms may use xmm/ymm16-31 or
# mask registers k0-k7, checked too).
if [[ "$LLAMA_CPP_ISA" == avx2 ]]; then
    if command -v objdump >/dev/null 2>&1; then
        checked=0
        for lib in "$BIN_DIR"/libggml*.so*; do
            [[ -f "$lib" && ! -L "$lib" ]] || continue      # the versioned file, not its links
            checked=$((checked + 1))
            n=$(objdump -d --no-show-raw-insn "$lib" |
                grep -cE '%zmm|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|%k[0-7]' || true)
            [[ "$n" -eq 0 ]] || die "$(basename "$lib") has $n AVX-512 instructions; the avx2 build is not AVX2-only"
            log "$(basename "$lib"): no AVX-512 instructions"
        done
        [[ $checked -gt 0 ]] || die "no libggml*.so in $BIN_DIR to check for AVX-512 code"
    else
        log "warning: no objdump; the avx2 build's libraries were not checked for AVX-512 code"
    fi
fi

# The version lines come from any built tool that takes --version (llama-quantize does not).
version_tool=""
for t in llama-server llama-bench llama-tokenize llama-perplexity llama-batched-bench; do
    if [[ -x "$BIN_DIR/$t" ]]; then version_tool="$BIN_DIR/$t"; break; fi
done
{
    echo "$WANT_VERSION_LINE"
    if [[ -n "$version_tool" ]]; then
        "$version_tool" --version 2>&1 | grep -E '^(version|built with)' || true
    fi
} > "$VERSION_FILE"
log "recorded $(tr '\n' ' ' < "$VERSION_FILE")"

echo "$BIN_DIR"
