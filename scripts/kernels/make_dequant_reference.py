#!/usr/bin/env python3
"""Reference dequantisations for specula's kernel tests, made by the `gguf` Python package.

For each GGML block type, draws random blocks (random bytes, with the f16/f32 scale fields set to
finite random values) and dequantises them with `gguf.quants.dequantize`, an implementation
independent of ours. Writes crates/kernels/tests/data/dequant_reference.json: per type, the raw
block bytes (hex) and the expected f32 values.

Needs: pip install numpy gguf   (made with numpy 2.x and gguf 0.19.0)
Run:   python3 scripts/kernels/make_dequant_reference.py
"""
import json
import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

BLOCKS = 4
rng = np.random.default_rng(20261129)


def f16_bytes(x):
    return np.float16(x).tobytes()


def random_block(qtype):
    """Random block bytes whose scale fields hold sensible f16/f32 values (no NaN/inf)."""
    _, size = GGML_QUANT_SIZES[qtype]
    b = bytearray(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    scale = lambda: float(rng.uniform(-0.1, 0.1))
    if qtype in (T.Q4_0, T.Q5_0, T.Q8_0):
        b[0:2] = f16_bytes(scale())
    elif qtype in (T.Q4_1, T.Q5_1, T.Q8_1):
        b[0:2] = f16_bytes(scale())
        b[2:4] = f16_bytes(scale())
    elif qtype in (T.Q4_K, T.Q5_K):
        b[0:2] = f16_bytes(scale())
        b[2:4] = f16_bytes(scale())
    elif qtype in (T.IQ4_NL, T.IQ4_XS):
        b[0:2] = f16_bytes(scale())
    elif qtype == T.Q6_K:
        b[208:210] = f16_bytes(scale())
    elif qtype == T.Q3_K:
        b[108:110] = f16_bytes(scale())
    elif qtype == T.Q2_K:
        b[80:82] = f16_bytes(scale())
        b[82:84] = f16_bytes(scale())
    elif qtype == T.F16:
        b[0:2] = f16_bytes(float(rng.normal()))
    elif qtype == T.BF16:
        x = np.float32(rng.normal()).tobytes()
        b[0:2] = x[2:4]
    elif qtype == T.F32:
        b[0:4] = np.float32(rng.normal()).tobytes()
    return bytes(b)


out = {}
# New types go at the end, so the blocks drawn for the earlier ones stay the same.
for qtype in [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.Q2_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS]:
    block_size, _ = GGML_QUANT_SIZES[qtype]
    n_blocks = BLOCKS if block_size > 1 else 64
    raw = b"".join(random_block(qtype) for _ in range(n_blocks))
    values = dequantize(np.frombuffer(raw, dtype=np.uint8), qtype).astype(np.float32).reshape(-1)
    assert values.size == n_blocks * block_size and np.isfinite(values).all()
    out[qtype.name] = {"bytes": raw.hex(), "values": [float(v) for v in values]}

path = pathlib.Path(__file__).resolve().parents[2] / "crates/kernels/tests/data/dequant_reference.json"
path.write_text(json.dumps(out))
print(f"wrote {path.name}: {', '.join(out)}")
