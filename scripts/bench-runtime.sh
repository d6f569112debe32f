#!/usr/bin/env bash
# The model runtime's speed beside llama.cpp's, in one run, on the same GGUF files and thread count,
# for each weight format and each of specula's activation modes:
#   llama-bench          prompt processing (pp512) and single-sequence decode (tg128)
#   llama-batched-bench  aggregate decode of 1/8/32/64 sequences in one batched step
#   specula model bench  the same three measurements on specula's runtime (--activations MODE),
#                        plus the cost of verifying drafts; its peak RSS is measured too
# then ONE summary table: a row per format, "llama.cpp → specula(mode) (ratio)" for pp512, tg128
# and decode ×32 (each further mode as "| specula(mode) (ratio)"), specula's verify +4 cost per
# mode (relative to a decode step), and specula's peak RSS beside the GGUF file's size (the
# whole model bench run's, the ×64 batch's KV cache included: about 0.5 GB of it for this model).
#
# The default model comes from scripts/fetch-model.sh (Q4_1) and its other formats from
# scripts/requantize.sh (llama-quantize --allow-requantize); llama.cpp from
# scripts/build-llama-cpp.sh. Run on an otherwise idle machine; compare ratios within one run.
#
# ISA picks the instruction sets of both sides, for CPUs without AVX-512 (on a machine that has it):
#   native   (default) llama.cpp built -march=native, specula's best path (SPECULA_KERNELS as set)
#   avx2     llama.cpp built for AVX2 only (LLAMA_CPP_ISA=avx2: no AVX-512, no AVX-VNNI) against
#            specula with SPECULA_KERNELS=avx2: like for like, an AVX2-only CPU
#   avxvnni  the same AVX2-only llama.cpp against specula with SPECULA_KERNELS=avxvnni (AVX2 +
#            256-bit AVX-VNNI): NOT like for like, specula has an instruction the peer lacks (this
#            llama.cpp's GGML_AVX_VNNI build would be the fair peer there); for CPUs with AVX-VNNI
#            but no AVX-512 (recent laptop and desktop CPUs)
# The summary's title names the comparison, and specula's path as its own runs reported it.
#
# Usage:
#     scripts/bench-runtime.sh
#     FORMATS="Q4_0 Q4_K_M" MODES=int16 REPEAT=1 scripts/bench-runtime.sh
#     FORMATS="Q4_0 Q4_K_M" MODES="int8 int8:f16" scripts/bench-runtime.sh
#     ISA=avx2 FORMATS="Q4_0 Q4_K_M" scripts/bench-runtime.sh
#     FORMATS="qwen2.5-coder-0.5b gemma3-270m" scripts/bench-runtime.sh
#
# Environment:
#     FORMATS   weight formats, space-separated llama-quantize presets (default: "Q4_1 Q4_0 Q4_K_M"),
#               or models by name (`specula model list`: qwen2.5-coder-0.5b, gemma3-270m), which
#               run as their files are
#     MODES     specula's activation modes, space-separated (default: "int16 int8"), each with
#               the KV cache's dtype after a colon where it is not the default f32 (int8:f16 is
#               int8 with an f16 cache, as llama.cpp's); before `specula model bench` took
#               --activations, only MODES=int16 runs (the flag is left out)
#     THREADS   threads for both engines (default: 2)
#     REPEAT    repetitions of each measurement: llama-bench -r, specula --repeat (default: 3)
#     ISA       native (default), avx2 or avxvnni, above; avx2 and avxvnni build only llama-bench
#               and llama-batched-bench for the AVX2 peer unless LLAMA_CPP_TARGETS says otherwise
#     (plus those of fetch-model.sh, requantize.sh and build-llama-cpp.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${THREADS:-2}"
REPEAT="${REPEAT:-3}"
read -r -a FORMATS <<< "${FORMATS:-Q4_1 Q4_0 Q4_K_M}"
read -r -a MODES <<< "${MODES:-int16 int8}"
PYTHON="${PYTHON:-python3}"
ISA="${ISA:-native}"

die() { echo "bench-runtime: error: $*" >&2; exit 1; }
[[ ${#FORMATS[@]} -gt 0 && ${#MODES[@]} -gt 0 ]] || die "FORMATS and MODES must name at least one each"

case "$ISA" in
    native)
        peer_isa=native
        peer_note=""
        ;;
    avx2|avxvnni)
        peer_isa=avx2
        peer_note=" (llama.cpp AVX2 build)"
        export SPECULA_KERNELS="$ISA"
        ;;
    *) die "ISA must be native, avx2 or avxvnni, not: $ISA" ;;
esac

if [[ $peer_isa == native ]]; then
    bin_dir=$(LLAMA_CPP_ISA=native scripts/build-llama-cpp.sh | tail -n1)
else
    bin_dir=$(LLAMA_CPP_ISA=avx2 \
        LLAMA_CPP_TARGETS="${LLAMA_CPP_TARGETS:-llama-bench llama-batched-bench}" \
        scripts/build-llama-cpp.sh | tail -n1)
fi
cargo build --release --quiet
specula=target/release/specula
if "$specula" model bench --help 2>/dev/null | grep -q -- '--activations'; then
    act_flag=1
elif [[ "${MODES[*]}" == int16 ]]; then
    act_flag=0      # the default mode, from before the flag
else
    die "specula model bench takes no --activations yet: run with MODES=int16"
fi

RESULTS="$(mktemp -d "${TMPDIR:-/tmp}/specula-bench-runtime.XXXXXX")"
trap 'rm -rf "$RESULTS"' EXIT

# The AVX2 peer's compiled-in instruction sets, as its ggml-cpu library reports them
# (ggml_cpu_has_*: compile-time answers), for the summary; it must have no AVX-512 or AVX-VNNI.
if [[ $peer_isa == avx2 ]]; then
    "$PYTHON" - "$bin_dir/libggml-cpu.so" > "$RESULTS/peer.features" <<'PY' ||
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
has = {n.upper(): getattr(lib, f"ggml_cpu_has_{n}")()
       for n in ["avx", "avx2", "fma", "f16c", "avx_vnni", "avx512", "avx512_vnni", "amx_int8"]}
print(" ".join(f"{k}={v}" for k, v in has.items()))
sys.exit(1 if has["AVX512"] or has["AVX512_VNNI"] or has["AVX_VNNI"] or not has["AVX2"] else 0)
PY
        die "the AVX2 llama.cpp build is not AVX2-only: $(cat "$RESULTS/peer.features")"
fi

# Runs a command and writes its peak resident set (KiB, the child's ru_maxrss) to the file $1.
peak_rss() {
    local out="$1"
    shift
    "$PYTHON" - "$out" "$@" <<'PY'
import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=f)
sys.exit(rc)
PY
}

for format in "${FORMATS[@]}"; do
    if [[ "$format" =~ ^[a-z0-9][a-z0-9.-]*$ && "$format" == *[.-]* ]]; then
        # Another model by name (its own file, whatever its mix of formats).
        model=$("$specula" model pull "$format" | tail -n1)
    else
        # requantize.sh builds llama-quantize from the native build whatever ISA is.
        model=$(env -u LLAMA_CPP_ISA scripts/requantize.sh "$format" | tail -n1)
    fi
    stat -c %s "$model" > "$RESULTS/$format.gguf_bytes"
    echo "== $format: llama-bench -t $THREADS -p 512 -n 128 -r $REPEAT$peer_note"
    "$bin_dir/llama-bench" -m "$model" -t "$THREADS" -p 512 -n 128 -r "$REPEAT" 2>/dev/null |
        grep -E "^\|" | tee "$RESULTS/$format.llama-bench"
    echo "== $format: llama-batched-bench -t $THREADS -npp 128 -ntg 32 -npl 1,8,32,64$peer_note"
    "$bin_dir/llama-batched-bench" -m "$model" -t "$THREADS" -c 16384 -b 2048 -ub 512 \
        -npp 128 -ntg 32 -npl 1,8,32,64 2>/dev/null | grep -E "^\|" | tee "$RESULTS/$format.batched"
    for mode in "${MODES[@]}"; do
        act=()
        # MODE or MODE:KV (the KV cache's dtype, e.g. int8:f16).
        IFS=: read -r act_mode kv_dtype <<< "$mode"
        [[ $act_flag == 1 ]] && act=(--activations "$act_mode")
        [[ -n $kv_dtype ]] && act+=(--kv-cache-dtype "$kv_dtype")
        echo "== $format: specula model bench ${act[*]} (SPECULA_THREADS=$THREADS${SPECULA_KERNELS:+ SPECULA_KERNELS=$SPECULA_KERNELS})"
        SPECULA_THREADS="$THREADS" peak_rss "$RESULTS/$format.$mode.rss" "$specula" model bench \
            --model "$model" "${act[@]}" --pp 512 --tg 128 --batch 1,8,32,64 --batch-prompt 128 \
            --batch-tokens 32 --repeat "$REPEAT" | tee "$RESULTS/$format.$mode.specula"
    done
done

"$PYTHON" - "$RESULTS" "$THREADS" "$REPEAT" "$ISA" "${#FORMATS[@]}" "${FORMATS[@]}" "${MODES[@]}" <<'PY'
import re, sys

res, threads, repeat, isa, nf = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
formats, modes = sys.argv[6:6 + nf], sys.argv[6 + nf:]

def read(name):
    try:
        return open(f"{res}/{name}").read()
    except FileNotFoundError:
        return ""

def md_rows(text):
    rows = [[c.strip() for c in l.strip().strip("|").split("|")] for l in text.splitlines() if l.startswith("|")]
    return [r for r in rows if not all(set(c) <= set("-: ") for c in r)]

def llama_bench(text):
    """{'pp512': t/s, 'tg128': t/s} from llama-bench's markdown table."""
    rows = md_rows(text)
    if not rows:
        return {}
    head = rows[0]
    ti, si = head.index("test"), head.index("t/s")
    return {r[ti]: float(r[si].split()[0]) for r in rows[1:]}

def batched(text):
    """{B: S_TG t/s} from llama-batched-bench's markdown table."""
    rows = md_rows(text)
    if not rows:
        return {}
    head = rows[0]
    bi, si = head.index("B"), head.index("S_TG t/s")
    return {int(r[bi]): float(r[si]) for r in rows[1:]}

def specula(text):
    out = {}
    for l in text.splitlines():
        if m := re.match(r"\s*(pp\d+|tg\d+)\s+([\d.]+) tok/s", l):
            out[m[1]] = float(m[2])
        elif m := re.match(r"\s*decode x(\d+)\s+([\d.]+) tok/s", l):
            out[f"x{m[1]}"] = float(m[2])
        elif m := re.match(r"\s*verify \+(\d+)\s+[\d.]+ ms/step\s+([\d.]+)x", l):
            out[f"verify{m[1]}"] = float(m[2])
    return out

def mib(kib_or_bytes, unit):
    return f"{kib_or_bytes / (1024 if unit == 'KiB' else 1024 * 1024):.0f} MiB"

def cell(peer, ours):
    if peer is None or not ours or any(o is None for o in ours):
        return "n/a"
    parts = [f"{peer:.1f} → {ours[0]:.1f} ({ours[0] / peer:.2f}×)"]
    parts += [f"{o:.1f} ({o / peer:.2f}×)" for o in ours[1:]]
    return " | ".join(parts)

mode_names = " | ".join(f"specula({m})" for m in modes)
# The kernel path specula's runs reported ("kernels: Avx2" on model bench's first line).
kernels = sorted({m[1] for f in formats for mo in modes
                  if (m := re.search(r"kernels: (\w+)", read(f"{f}.{mo}.specula")))})
head = ["format", "pp512", "tg128", "decode ×32", f"verify +4 ({' | '.join(modes)})",
        "specula peak RSS (GGUF)"]
table = [head]
for f in formats:
    lb, bb = llama_bench(read(f"{f}.llama-bench")), batched(read(f"{f}.batched"))
    sp = [specula(read(f"{f}.{m}.specula")) for m in modes]
    rss = [int(x) for m in modes if (x := read(f"{f}.{m}.rss").strip())]
    size = int(read(f"{f}.gguf_bytes") or 0)
    table.append([
        f,
        cell(lb.get("pp512"), [s.get("pp512") for s in sp]),
        cell(lb.get("tg128"), [s.get("tg128") for s in sp]),
        cell(bb.get(32), [s.get("x32") for s in sp]),
        " | ".join(f"{s['verify4']:.2f}×" if "verify4" in s else "n/a" for s in sp),
        f"{mib(max(rss), 'KiB') if rss else 'n/a'} ({mib(size, 'B')})",
    ])
widths = [max(len(r[i]) for r in table) for i in range(len(head))]
print()
if isa == "native":
    print(f"== summary: tok/s, llama.cpp → {mode_names} (ratio to llama.cpp); "
          f"{threads} threads, best of {repeat}; decode ×32 = llama-batched-bench S_TG at 32 sequences")
else:
    want = {"avx2": "Avx2", "avxvnni": "AvxVnni"}[isa]
    print(f"== summary: tok/s, llama.cpp (AVX2 build) → {mode_names} (SPECULA_KERNELS={isa}) "
          f"(ratio to llama.cpp); {threads} threads, best of {repeat}; "
          f"decode ×32 = llama-batched-bench S_TG at 32 sequences")
    if isa == "avx2":
        print("   like for like: both AVX2 only (FMA, F16C), no AVX-512, no AVX-VNNI")
    else:
        print("   NOT like for like: specula uses 256-bit AVX-VNNI, which this llama.cpp build lacks")
    print(f"   specula's path: kernels {', '.join(kernels) or 'not reported'}"
          + ("" if kernels == [want] else f"  <-- expected {want}: this CPU lacks it?"))
    print(f"   llama.cpp's ggml-cpu: {read('peer.features').strip() or 'not read'}")
for r in table:
    print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
PY
