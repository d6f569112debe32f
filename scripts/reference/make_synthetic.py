#!/usr/bin/env python3
"""make_synthetic.py — tiny random-weight GGUF models for the architectures no reachable file has.

No Qwen3 or Llama 3 (RoPE-scaled) GGUF can be downloaded here, so their forward passes are checked
on synthetic weights instead (and Gemma 3's sliding window in a form small enough for CI and for
windows that cross many KV blocks): this script writes, with the `gguf` package,

    qwen3.gguf    arch qwen3: 2 layers, hidden 64, 4 query heads of 32 (so the attention width, 128,
                  differs from the hidden size), 2 KV heads, per-head Q/K RMS norms, no biases, tied
                  output (no output.weight), NEOX RoPE base 1e6
    llama3.gguf   arch llama: 2 layers, hidden 64, 4 heads of 16, 2 KV heads, RoPE base 5e5 with
                  Llama 3's frequency scaling stored as `rope_freqs.weight` (the converter's formula,
                  factor 8, low/high frequency factors 1 and 4, original context 64 so that the
                  three regions of the formula all occur among the 8 pairs), untied output
    gemma3.gguf   arch gemma3: 6 layers (5 local, the last global), hidden 64, 4 heads of 32, 1 KV
                  head, a sliding window of 24 positions, post-attention and post-FFN norms,
                  GeGLU, embeddings scaled by 8, tied output

and tokens.json / tokens.bin / tokens.i32: 384 random token ids, the same for both. Matrices are
Q8_0 (the feed-forward down projection Q5_0), norms F32; weights are seeded random numbers, so
the files are the same on every run. The vocabulary is a 320-token byte-level BPE (the 256 GPT-2
byte symbols, 63 merges, `<|endoftext|>`) that llama.cpp accepts; its text does not matter since
the ids are given.

Usage: make_synthetic.py OUT_DIR   (scripts/reference/synthetic.sh runs it, then the references)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

N_TOKENS = 384
HIDDEN = 64
FFN = 128
LAYERS = 2


def byte_symbols() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    tokens = byte_symbols()
    merges = []
    letters = "etaoinshr"
    for a in letters:
        for b in letters[:7]:
            if len(merges) < 63:
                merges.append(f"{a} {b}")
                tokens.append(a + b)
    tokens.append("<|endoftext|>")
    types = [1] * (len(tokens) - 1) + [3]          # normal, then one control token
    return tokens, types, merges


def quantised(w: np.ndarray, qtype: QT) -> np.ndarray:
    return gguf.quants.quantize(w.astype(np.float32), qtype)


class Builder:
    def __init__(self, arch: str, seed: int):
        self.arch = arch
        self.rng = np.random.default_rng(seed)
        self.tensors: list[tuple[str, np.ndarray, QT]] = []

    def matrix(self, name: str, rows: int, cols: int, qtype: QT = QT.Q8_0, scale: float = 1.0):
        w = self.rng.standard_normal((rows, cols)) * scale / math.sqrt(cols)
        self.tensors.append((name, quantised(w, qtype), qtype))

    def vector(self, name: str, n: int, center: float = 1.0, spread: float = 0.2):
        v = center + spread * self.rng.standard_normal(n)
        self.tensors.append((name, v.astype(np.float32), QT.F32))

    def write(self, path: Path, meta: dict, tokenizer_pre: str):
        w = gguf.GGUFWriter(str(path), self.arch)
        w.add_name(f"synthetic {self.arch} (random weights)")
        for key, value in meta.items():
            getattr(w, key)(*value) if isinstance(value, tuple) else getattr(w, key)(value)
        tokens, types, merges = vocabulary()
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(tokenizer_pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(len(tokens) - 1)
        w.add_eos_token_id(len(tokens) - 1)
        w.add_add_bos_token(False)
        for name, data, qtype in self.tensors:
            w.add_tensor(name, data, raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


def common_layers(b: Builder, heads: int, kv_heads: int, head_dim: int, layers: int = LAYERS):
    for i in range(layers):
        p = f"blk.{i}."
        b.vector(p + "attn_norm.weight", HIDDEN)
        b.matrix(p + "attn_q.weight", heads * head_dim, HIDDEN, scale=2.0)
        b.matrix(p + "attn_k.weight", kv_heads * head_dim, HIDDEN, scale=2.0)
        b.matrix(p + "attn_v.weight", kv_heads * head_dim, HIDDEN)
        b.matrix(p + "attn_output.weight", HIDDEN, heads * head_dim)
        b.vector(p + "ffn_norm.weight", HIDDEN)
        b.matrix(p + "ffn_gate.weight", FFN, HIDDEN)
        b.matrix(p + "ffn_up.weight", FFN, HIDDEN)
        b.matrix(p + "ffn_down.weight", HIDDEN, FFN, QT.Q5_0)
        if b.arch in ("qwen3", "gemma3"):
            b.vector(p + "attn_q_norm.weight", head_dim)
            b.vector(p + "attn_k_norm.weight", head_dim)
        if b.arch == "gemma3":
            b.vector(p + "post_attention_norm.weight", HIDDEN)
            b.vector(p + "post_ffw_norm.weight", HIDDEN)


def base_meta(heads: int, kv_heads: int, head_dim: int, rope_base: float, layers: int = LAYERS) -> dict:
    return {
        "add_block_count": layers,
        "add_context_length": 4096,
        "add_embedding_length": HIDDEN,
        "add_feed_forward_length": FFN,
        "add_head_count": heads,
        "add_head_count_kv": kv_heads,
        "add_key_length": head_dim,
        "add_value_length": head_dim,
        "add_rope_freq_base": rope_base,
        "add_layer_norm_rms_eps": 1e-6,
    }


def llama3_rope_divisors(head_dim: int, base: float, factor=8.0, low=1.0, high=4.0, original=64):
    """The converter's `rope_freqs` (LlamaModel.generate_extra_tensors): divisors of each pair's
    frequency."""
    out = []
    low_wl, high_wl = original / low, original / high
    for i in range(head_dim // 2):
        freq = 1.0 / base ** (2 * i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < high_wl:
            out.append(1.0)
        elif wavelen > low_wl:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    n_vocab = len(vocabulary()[0])

    q = Builder("qwen3", seed=3)
    q.matrix("token_embd.weight", n_vocab, HIDDEN, scale=2.0)
    common_layers(q, heads=4, kv_heads=2, head_dim=32)
    q.vector("output_norm.weight", HIDDEN)
    q.write(out / "qwen3.gguf", base_meta(4, 2, 32, 1e6), "qwen2")

    l = Builder("llama", seed=4)
    l.matrix("token_embd.weight", n_vocab, HIDDEN, scale=2.0)
    common_layers(l, heads=4, kv_heads=2, head_dim=16)
    l.vector("output_norm.weight", HIDDEN)
    l.matrix("output.weight", n_vocab, HIDDEN, scale=2.0)
    divisors = llama3_rope_divisors(16, 5e5)
    assert 1.0 in divisors and 8.0 in divisors and len(set(divisors.tolist())) > 2, divisors
    l.tensors.append(("rope_freqs.weight", divisors, QT.F32))
    meta = base_meta(4, 2, 16, 5e5)
    meta["add_rope_dimension_count"] = 16
    l.write(out / "llama3.gguf", meta, "llama-bpe")

    g = Builder("gemma3", seed=6)
    g.matrix("token_embd.weight", n_vocab, HIDDEN, scale=2.0)
    common_layers(g, heads=4, kv_heads=1, head_dim=32, layers=6)
    g.vector("output_norm.weight", HIDDEN)
    meta = base_meta(4, 1, 32, 1e6, layers=6)
    meta["add_sliding_window"] = 24
    g.write(out / "gemma3.gguf", meta, "default")

    ids = np.random.default_rng(5).integers(0, n_vocab - 1, N_TOKENS)
    (out / "tokens.json").write_text(json.dumps({"ids": ids.tolist()}, separators=(",", ":")) + "\n")
    ids.astype("<u4").tofile(out / "tokens.bin")
    ids.astype("<i4").tofile(out / "tokens.i32")
    print(f"make_synthetic: wrote qwen3.gguf, llama3.gguf, gemma3.gguf and {N_TOKENS} tokens to {out}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
