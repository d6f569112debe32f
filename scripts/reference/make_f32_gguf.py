#!/usr/bin/env python3
"""make_f32_gguf.py — write a copy of a GGUF model with every tensor dequantised to F32.

Part of specula's reference fixtures (see scripts/reference/README.md; regenerate.sh runs it).
It serves one check only: llama.cpp run on the F32 copy (llamacpp_logits "exact": F32 KV cache,
flash attention off) does plain float32 arithmetic on exactly the weights the float64 NumPy reference uses, without the 8-bit activation
quantisation of its Q4_1/Q8_0 matmul kernels. Its logits must then match numpy_forward.py's almost
perfectly, which shows that the reference implements llama.cpp's computation (RoPE pairing, GQA,
norms, tied output) and that the gap to llama.cpp on the Q4_1 file is llama.cpp's own rounding.
The copy is a scratch file (about 540 MB for SmolLM2-135M); never commit it.

Run:
    /tmp/specula-ref-venv/bin/python scripts/reference/make_f32_gguf.py IN.gguf OUT.gguf

pip packages: gguf==0.19.0, numpy==2.4.6.
"""

from __future__ import annotations

import sys

import numpy as np
import gguf


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for field in r.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        val = field.contents()
        if field.name == gguf.Keys.General.FILE_TYPE:
            val = int(gguf.LlamaFileType.ALL_F32)
        w.add_key_value(field.name, val, vtype, sub_type=sub)
    for t in r.tensors:
        data = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"make_f32_gguf: wrote {dst}", file=sys.stderr)


if __name__ == "__main__":
    main()
