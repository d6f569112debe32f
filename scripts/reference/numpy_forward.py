#!/usr/bin/env python3
"""numpy_forward.py — exact float64 NumPy reference forward pass of a GGUF model (llama, qwen2, qwen3,
gemma3).

Part of specula's reference fixtures (see scripts/reference/README.md; regenerate.sh runs it).
It reads the GGUF file with the `gguf` package, dequantises every tensor with
`gguf.quants.dequantize` (and checks that the result equals an independent float64
dequantisation, i.e. that the weights are exact), converts them to float64 and runs the llama
forward pass in float64 throughout:

    x = token_embd[ids]
    per layer:  h = rmsnorm(x) * attn_norm
                q, k, v = h Wq^T, h Wk^T, h Wv^T             (per head, head_dim = attention.key_length,
                                                               default n_embd / n_head)
                q, k, v += bq, bk, bv                          (qwen2: biases)
                q, k = rmsnorm(q_h) * q_norm, rmsnorm(k_h) * k_norm   (qwen3: per head)
                q, k = rope(q), rope(k)                        NORMAL mode (llama) or NEOX (qwen2, qwen3)
                a = softmax(q k^T / sqrt(head_dim) + causal mask) v   (grouped-query: head h reads KV head h // (n_head / n_head_kv))
                x = x + a Wo^T
                h = rmsnorm(x) * ffn_norm
                x = x + (silu(h Wgate^T) * (h Wup^T)) Wdown^T
    logits = (rmsnorm(x) * output_norm) W_out^T              (W_out = output.weight, or token_embd when tied)

gemma3 differs (llama.cpp's llm_build_gemma3): x = token_embd[ids] * sqrt(n_embd) (the square root in
float32, as ggml takes it); Q/K head norms as qwen3; the local layers (all but every sixth) use RoPE
base 10000 unscaled and attend only to the last `attention.sliding_window` positions (their own
included), the global ones the file's base and scaling over the whole chunk; q is scaled by
1/sqrt(head_dim) (exact: a power of two for head_dim 256); attention and feed-forward outputs go
through rmsnorm * post_attention_norm / post_ffw_norm before the residual add; the feed-forward is
gelu_tanh(g) * u (the exact formula; ggml's CPU path uses an f16 table); the norm weights already
include Gemma's "+1". Final-logit soft-capping applies only without a sliding window.

RoPE: llama.cpp evaluates the `llama` architecture with rope mode 0 ("NORMAL"), which rotates
ADJACENT pairs (x[2i], x[2i+1]) by pos * base^(-2i/n_rot). Hugging Face's Llama rotates the halves
(x[i], x[i + d/2]); llama.cpp's converter permutes the rows of attn_q/attn_k so that the adjacent-pair
rotation on GGUF weights is the same computation. qwen2 and qwen3 keep Hugging Face's order and use
the half split ("NEOX", rope type 2). `--rope` overrides the architecture's mode, only to show that
the other one is wrong for a file (top-1 agreement with llama.cpp collapses). The angle of pair i is
pos * freq_scale * base^(-2i/n_rot) / rope_freqs[i]: `rope_freqs.weight` is Llama 3's frequency
scaling as converters store it, freq_scale is 1 / `rope.scaling.factor` (linear scaling).

The token sequence is evaluated in independent chunks of at most --chunk tokens, each from a fresh
context at positions 0..len-1 (no BOS is inserted: the ids are used as given).

Outputs (in --out-dir; raw little-endian, row-major, one row per position i of the whole sequence):
    numpy_top20_ids.bin          uint32  [n_pos, k]  ids of the k most probable next tokens, best first
    numpy_top20_logprobs.bin     float32 [n_pos, k]  their log-probabilities (log-softmax over the vocab)
    numpy_target_logprobs.bin    float64 [n_pos-1]   log-probability of the actual next token ids[i+1]
and, with --work-dir, the full float64 log-probabilities [n_pos, n_vocab] as numpy_logprobs.npy
(about 1.2 GB for 3,128 tokens; used by compare_llamacpp.py, not committed).

Run (from the repository root; regenerate.sh does all of this):
    python3 -m venv /tmp/specula-ref-venv
    /tmp/specula-ref-venv/bin/pip install gguf==0.19.0 numpy==2.4.6
    /tmp/specula-ref-venv/bin/python scripts/reference/numpy_forward.py \
        --model "$(scripts/fetch-model.sh | tail -n1)" \
        --tokens crates/model/tests/data/reference/tokens.json \
        --out-dir crates/model/tests/data/reference --work-dir /tmp/specula-ref-work

pip packages: gguf==0.19.0, numpy==2.4.6 (tested with these versions; Python 3.11).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT


# llama.cpp's rope type of each architecture (llama_model_rope_type).
ROPE_MODES = {"llama": "normal", "qwen2": "neox", "qwen3": "neox", "gemma3": "neox"}
# Gemma 3's local layers: all but every sixth; their RoPE base (hard-coded by llama.cpp).
GEMMA3_GLOBAL_EVERY = 6
GEMMA3_LOCAL_ROPE_BASE = 10000.0


def log(msg: str) -> None:
    print(f"numpy_forward: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# GGUF loading
# ---------------------------------------------------------------------------------------------

def field_value(reader: gguf.GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def exact_dequant_f64(raw: np.ndarray, qtype: QT) -> np.ndarray | None:
    """Independent float64 dequantisation (ggml's block layouts; None: not covered): Q4_0, Q4_1,
    Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, i.e. the shipped Q4_1 file and its
    requantisations to Q4_0, Q5_0, Q5_1, Q8_0, Q4_K_S/M, Q5_K_S/M, Q6_K and IQ4_NL/XS
    (scripts/requantize.sh)."""
    b = np.asarray(raw).reshape(-1)
    if qtype == QT.Q4_1:  # block: f16 d, f16 m, 16 bytes of 4-bit quants; x = d*q + m
        b = b.reshape(-1, 20)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
        m = b[:, 2:4].copy().view(np.float16).astype(np.float64)
        qs = b[:, 4:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64)
        return d * q + m
    if qtype == QT.Q8_0:  # block: f16 d, 32 int8 quants; x = d*q
        b = b.reshape(-1, 34)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
        q = b[:, 2:].copy().view(np.int8).astype(np.float64)
        return d * q
    if qtype == QT.Q4_0:  # block: f16 d, 16 bytes of 4-bit quants; x = d*(q - 8)
        b = b.reshape(-1, 18)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
        qs = b[:, 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64) - 8.0
        return d * q
    if qtype in (QT.Q5_0, QT.Q5_1):  # f16 d, [f16 m], 4 bytes of high bits, 16 bytes of low nibbles
        b = b.reshape(-1, 22 if qtype == QT.Q5_0 else 24)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
        o = 2 if qtype == QT.Q5_0 else 4
        qh = b[:, o:o + 4].copy().view("<u4").astype(np.int64)          # bit j: high bit of value j
        qs = b[:, o + 4:].astype(np.int64)
        low = np.concatenate([qs & 0x0F, qs >> 4], axis=1)               # values 0..15, 16..31
        high = (qh >> np.arange(32)) & 1
        q = (low | (high << 4)).astype(np.float64)
        if qtype == QT.Q5_0:                                             # x = d*(q - 16)
            return d * (q - 16.0)
        m = b[:, 2:4].copy().view(np.float16).astype(np.float64)         # x = d*q + m
        return d * q + m
    if qtype in (QT.Q4_K, QT.Q5_K):  # super-blocks of 256: 8 sub-blocks of 32 with 6-bit scale and min
        b = b.reshape(-1, 144 if qtype == QT.Q4_K else 176)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
        dmin = b[:, 2:4].copy().view(np.float16).astype(np.float64)
        sc, mn = _k_scales_mins(b[:, 4:16].astype(np.int64))            # [n, 8] each
        if qtype == QT.Q4_K:
            qh, ql = None, b[:, 16:144].astype(np.int64).reshape(-1, 4, 32)
        else:
            qh, ql = b[:, 16:48].astype(np.int64), b[:, 48:176].astype(np.int64).reshape(-1, 4, 32)
        q = np.empty((b.shape[0], 8, 32), dtype=np.int64)
        for g in range(4):                                               # 64 values per 32 bytes
            q[:, 2 * g] = ql[:, g] & 0x0F
            q[:, 2 * g + 1] = ql[:, g] >> 4
            if qh is not None:                                           # bit 2g / 2g+1 of qh[l]
                q[:, 2 * g] |= ((qh >> (2 * g)) & 1) << 4
                q[:, 2 * g + 1] |= ((qh >> (2 * g + 1)) & 1) << 4
        x = (d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]          # d*sc*q - dmin*m
        return x.reshape(b.shape[0], 256)
    if qtype == QT.Q6_K:  # 128 bytes low nibbles, 64 bytes 2-bit highs, 16 int8 scales, f16 d
        b = b.reshape(-1, 210)
        ql = b[:, 0:128].astype(np.int64).reshape(-1, 2, 64)
        qh = b[:, 128:192].astype(np.int64).reshape(-1, 2, 32)
        sc = b[:, 192:208].copy().view(np.int8).astype(np.float64).reshape(-1, 2, 8)
        d = b[:, 208:210].copy().view(np.float16).astype(np.float64)
        q = np.empty((b.shape[0], 2, 4, 32), dtype=np.int64)             # [block, half, quarter, l]
        q[:, :, 0] = (ql[:, :, 0:32] & 0x0F) | (((qh >> 0) & 3) << 4)
        q[:, :, 1] = (ql[:, :, 32:64] & 0x0F) | (((qh >> 2) & 3) << 4)
        q[:, :, 2] = (ql[:, :, 0:32] >> 4) | (((qh >> 4) & 3) << 4)
        q[:, :, 3] = (ql[:, :, 32:64] >> 4) | (((qh >> 6) & 3) << 4)
        # scale index within a half: quarter*2 + l // 16
        s = sc.reshape(-1, 2, 4, 2)[:, :, :, :, None]                    # [block, half, quarter, l//16, 1]
        x = d[:, :, None, None, None] * s * (q.reshape(-1, 2, 4, 2, 16) - 32).astype(np.float64)
        return x.reshape(b.shape[0], 256)
    if qtype == QT.IQ4_NL:  # block: f16 d, 16 bytes of 4-bit indices into IQ4_GRID; x = d*grid[i]
        b = b.reshape(-1, 18)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
        qs = b[:, 2:]
        return d * IQ4_GRID[np.concatenate([qs & 0x0F, qs >> 4], axis=1)]
    if qtype == QT.IQ4_XS:  # f16 d, u16 scales_h, 4 bytes scales_l, 128 bytes of indices
        b = b.reshape(-1, 136)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
        high = b[:, 2:4].copy().view("<u2").astype(np.int64)
        low = b[:, 4:8].astype(np.int64)
        j = np.arange(8)
        ls = ((low[:, j // 2] >> (4 * (j % 2))) & 0x0F) | (((high >> (2 * j)) & 3) << 4)
        qs = b[:, 8:].reshape(-1, 8, 16)
        idx = np.concatenate([qs & 0x0F, qs >> 4], axis=2)               # [block, sub, 32]
        x = (d * (ls - 32))[:, :, None] * IQ4_GRID[idx]                 # d*(scale-32)*grid[i]
        return x.reshape(b.shape[0], 256)
    return None


# The 16 values IQ4_NL and IQ4_XS index (the format's definition, ggml's kvalues_iq4nl).
IQ4_GRID = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                    dtype=np.float64)


def _k_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: the 12 packed bytes -> 8 six-bit scales and 8 six-bit mins (ggml's get_scale_min_k4)."""
    sc = np.empty((s.shape[0], 8), dtype=np.int64)
    mn = np.empty((s.shape[0], 8), dtype=np.int64)
    for j in range(8):
        if j < 4:
            sc[:, j] = s[:, j] & 63
            mn[:, j] = s[:, j + 4] & 63
        else:
            sc[:, j] = (s[:, j + 4] & 0x0F) | ((s[:, j - 4] >> 6) << 4)
            mn[:, j] = (s[:, j + 4] >> 4) | ((s[:, j] >> 6) << 4)
    return sc.astype(np.float64), mn.astype(np.float64)


class Model:
    """Float64 weights and hyper-parameters of a llama, qwen2, qwen3 or gemma3 GGUF file."""

    def __init__(self, path: str, check_exact: bool = True):
        t0 = time.time()
        r = gguf.GGUFReader(path)
        arch = field_value(r, "general.architecture")
        if arch not in ROPE_MODES:
            raise SystemExit(f"numpy_forward: architecture {arch!r} is not one of {sorted(ROPE_MODES)}")
        self.arch = arch
        self.rope_mode = ROPE_MODES[arch]
        p = f"{arch}."
        self.n_layer = int(field_value(r, p + "block_count"))
        self.n_embd = int(field_value(r, p + "embedding_length"))
        self.n_head = int(field_value(r, p + "attention.head_count"))
        self.n_head_kv = int(field_value(r, p + "attention.head_count_kv", self.n_head))
        self.head_dim = int(field_value(r, p + "attention.key_length", self.n_embd // self.n_head))
        self.n_rot = int(field_value(r, p + "rope.dimension_count", self.head_dim))
        # float32 values in the file, taken exactly into float64
        self.rope_base = float(field_value(r, p + "rope.freq_base", 10000.0))
        self.eps = float(field_value(r, p + "attention.layer_norm_rms_epsilon"))
        scaling = field_value(r, p + "rope.scaling.type")
        factor = float(field_value(r, p + "rope.scaling.factor", 1.0))
        if scaling not in (None, "none", "linear"):
            raise SystemExit(f"numpy_forward: rope scaling {scaling!r} is not implemented")
        self.freq_scale = 1.0 / factor if scaling == "linear" and factor not in (0.0, 1.0) else 1.0
        window = int(field_value(r, p + "attention.sliding_window", 0) or 0)
        self.window = window if arch == "gemma3" and window > 0 else None
        cap = float(field_value(r, p + "final_logit_softcapping", 0.0) or 0.0)
        self.softcap = cap if arch == "gemma3" and self.window is None and cap > 0 else None
        self.metadata = {
            "general.architecture": arch,
            "general.name": field_value(r, "general.name"),
            "general.file_type": field_value(r, "general.file_type"),
            p + "block_count": self.n_layer,
            p + "context_length": field_value(r, p + "context_length"),
            p + "embedding_length": self.n_embd,
            p + "feed_forward_length": field_value(r, p + "feed_forward_length"),
            p + "attention.head_count": self.n_head,
            p + "attention.head_count_kv": self.n_head_kv,
            p + "rope.dimension_count": self.n_rot,
            p + "rope.freq_base": self.rope_base,
            p + "attention.key_length": self.head_dim,
            p + "rope.scaling.type": scaling,
            p + "rope.scaling.factor": factor,
            p + "attention.sliding_window": field_value(r, p + "attention.sliding_window"),
            p + "final_logit_softcapping": field_value(r, p + "final_logit_softcapping"),
            p + "attention.layer_norm_rms_epsilon": self.eps,
            p + "vocab_size": field_value(r, p + "vocab_size"),
            "tokenizer.ggml.model": field_value(r, "tokenizer.ggml.model"),
            "tokenizer.ggml.pre": field_value(r, "tokenizer.ggml.pre"),
            "tokenizer.ggml.add_bos_token": field_value(r, "tokenizer.ggml.add_bos_token"),
            "tokenizer.ggml.add_space_prefix": field_value(r, "tokenizer.ggml.add_space_prefix"),
            "tokenizer.ggml.bos_token_id": field_value(r, "tokenizer.ggml.bos_token_id"),
            "tokenizer.ggml.eos_token_id": field_value(r, "tokenizer.ggml.eos_token_id"),
            "tokenizer.ggml.padding_token_id": field_value(r, "tokenizer.ggml.padding_token_id"),
            "tokenizer.ggml.unknown_token_id": field_value(r, "tokenizer.ggml.unknown_token_id"),
        }
        types: dict[str, int] = {}
        self.w: dict[str, np.ndarray] = {}
        n_checked = 0
        for t in r.tensors:
            types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
            w32 = gguf.quants.dequantize(t.data, t.tensor_type)
            w64 = np.asarray(w32, dtype=np.float64)
            if check_exact and t.tensor_type not in (QT.F32, QT.F64):
                ref = exact_dequant_f64(t.data, t.tensor_type)
                if ref is None:
                    if t.tensor_type not in (QT.F16, QT.BF16):
                        raise SystemExit(f"numpy_forward: no exactness check for {t.tensor_type.name}")
                else:
                    ref = ref.reshape(w64.shape)
                    if not np.array_equal(ref, w64):
                        # gguf computes in float32 (as ggml does): d*q + m (Q4_1, Q5_1) and
                        # d*sc*q - dmin*m (Q4_K, Q5_K) can need more than float32's 24 bits.
                        # Anything beyond that rounding is a bug in one of the two.
                        n_bad = int((ref != w64).sum())
                        # (relative to the tensor's largest value: d*sc*q - dmin*m can cancel)
                        rel = float(np.max(np.abs(ref - w64)) / max(float(np.max(np.abs(ref))), 1e-30))
                        if rel > 2.0 ** -20:
                            raise SystemExit(f"numpy_forward: {t.name} ({t.tensor_type.name}): gguf's "
                                             f"dequantisation and the float64 one differ by {rel:.3g} "
                                             f"(relative) at {n_bad} values: not float32 rounding")
                        log(f"{t.name}: gguf's float32 dequantisation is inexact at {n_bad} values "
                            f"(at most {rel:.2g} of its largest value: float32 rounding); using float64")
                        w64 = ref
                    n_checked += 1
            # gguf gives shape reversed from ggml's ne: [ne1, ne0] = [out, in] for matrices
            self.w[t.name] = w64
        self.tensor_types = types
        self.tied_embeddings = "output.weight" not in self.w
        self.n_vocab = self.w["token_embd.weight"].shape[0]
        self.rope_freqs = self.w.get("rope_freqs.weight")
        log(f"loaded {len(self.w)} tensors ({types}) in {time.time() - t0:.1f} s; "
            f"{n_checked} quantised tensors checked exact; tied embeddings: {self.tied_embeddings}")

    def out_weight(self) -> np.ndarray:
        return self.w["token_embd.weight"] if self.tied_embeddings else self.w["output.weight"]


# ---------------------------------------------------------------------------------------------
# Forward pass (float64)
# ---------------------------------------------------------------------------------------------

def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(ms + eps) * weight


def rope_tables(n_pos: int, n_rot: int, base: float, freq_scale: float = 1.0,
                divisors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(n_rot // 2, dtype=np.float64)
    inv_freq = freq_scale * base ** (-2.0 * i / n_rot)          # theta_i = base^(-2i/n_rot)
    if divisors is not None:
        inv_freq = inv_freq / divisors
    ang = np.arange(n_pos, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(ang), np.sin(ang)                              # [n_pos, n_rot/2]


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_rot: int, mode: str) -> np.ndarray:
    """x: [T, n_heads, head_dim]; rotates the first n_rot dims of each head."""
    y = x.copy()
    c = cos[:, None, :]
    s = sin[:, None, :]
    if mode == "normal":    # llama.cpp mode 0: adjacent pairs (2i, 2i+1)
        x0 = x[..., 0:n_rot:2]
        x1 = x[..., 1:n_rot:2]
        y[..., 0:n_rot:2] = x0 * c - x1 * s
        y[..., 1:n_rot:2] = x0 * s + x1 * c
    elif mode == "neox":    # half split (i, i + n_rot/2)
        h = n_rot // 2
        x0 = x[..., 0:h]
        x1 = x[..., h:n_rot]
        y[..., 0:h] = x0 * c - x1 * s
        y[..., h:n_rot] = x0 * s + x1 * c
    else:
        raise ValueError(mode)
    return y


def forward(m: Model, ids: np.ndarray, rope_mode: str | None = None) -> np.ndarray:
    """Logits [T, n_vocab] (float64) for one chunk evaluated from position 0 with a causal mask."""
    T = len(ids)
    H, HKV, D = m.n_head, m.n_head_kv, m.head_dim
    group = H // HKV
    rope_mode = rope_mode or m.rope_mode
    gemma = m.arch == "gemma3"
    global_rope = rope_tables(T, m.n_rot, m.rope_base, m.freq_scale, m.rope_freqs)
    local_rope = rope_tables(T, m.n_rot, GEMMA3_LOCAL_ROPE_BASE) if m.window else global_rope
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    if m.window:                                                 # query i sees keys i-window+1..i
        local_mask = mask + np.tril(np.full((T, T), -np.inf), k=-m.window)
    scale = 1.0 / np.sqrt(D)

    x = m.w["token_embd.weight"][ids]                            # [T, n_embd]
    if gemma:
        x = x * float(np.sqrt(np.float32(m.n_embd)))
    for layer in range(m.n_layer):
        local = m.window is not None and layer % GEMMA3_GLOBAL_EVERY != GEMMA3_GLOBAL_EVERY - 1
        cos, sin = local_rope if local else global_rope
        layer_mask = local_mask if local else mask
        w = lambda name: m.w[f"blk.{layer}.{name}.weight"]      # noqa: E731
        h = rmsnorm(x, w("attn_norm"), m.eps)
        q = (h @ w("attn_q").T).reshape(T, H, D)
        k = (h @ w("attn_k").T).reshape(T, HKV, D)
        v = (h @ w("attn_v").T).reshape(T, HKV, D)
        bias = lambda name: m.w.get(f"blk.{layer}.{name}.bias")  # noqa: E731
        if bias("attn_q") is not None:
            q = q + bias("attn_q").reshape(H, D)
            k = k + bias("attn_k").reshape(HKV, D)
            v = v + bias("attn_v").reshape(HKV, D)
        if f"blk.{layer}.attn_q_norm.weight" in m.w:
            q = rmsnorm(q, w("attn_q_norm"), m.eps)              # over each head's D values
            k = rmsnorm(k, w("attn_k_norm"), m.eps)
        q = apply_rope(q, cos, sin, m.n_rot, rope_mode)
        k = apply_rope(k, cos, sin, m.n_rot, rope_mode)
        out = np.empty((T, H, D))
        for hh in range(H):
            kv = hh // group
            s = (q[:, hh, :] @ k[:, kv, :].T) * scale + layer_mask   # [T, T]
            s = s - s.max(axis=1, keepdims=True)
            p = np.exp(s)
            p /= p.sum(axis=1, keepdims=True)
            out[:, hh, :] = p @ v[:, kv, :]
        a = out.reshape(T, H * D) @ w("attn_output").T
        if gemma:
            a = rmsnorm(a, w("post_attention_norm"), m.eps)
        x = x + a
        h = rmsnorm(x, w("ffn_norm"), m.eps)
        g = h @ w("ffn_gate").T
        u = h @ w("ffn_up").T
        if gemma:                                                 # gelu_tanh(g) * u
            f = 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * g * (1.0 + 0.044715 * g * g))) * u
        else:
            f = (g / (1.0 + np.exp(-g))) * u                      # silu(g) * u
        f = f @ w("ffn_down").T
        if gemma:
            f = rmsnorm(f, w("post_ffw_norm"), m.eps)
        x = x + f
    h = rmsnorm(x, m.w["output_norm.weight"], m.eps)
    logits = h @ m.out_weight().T
    if m.softcap:
        logits = m.softcap * np.tanh(logits / m.softcap)
    return logits


def log_softmax(logits: np.ndarray) -> np.ndarray:
    mx = logits.max(axis=-1, keepdims=True)
    z = logits - mx
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def top_k(lp: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the k largest entries, best first; ties broken by the smaller id."""
    part = np.argpartition(-lp, k, axis=1)[:, : k + 1]
    ids = np.empty((lp.shape[0], k), dtype=np.int64)
    for r in range(lp.shape[0]):
        # candidates: the partition plus anything tied with its k-th value (rare)
        kth = np.sort(lp[r, part[r]])[::-1][k - 1]
        cand = np.nonzero(lp[r] >= kth)[0]
        order = np.lexsort((cand, -lp[r, cand]))
        ids[r] = cand[order[:k]]
    return ids, np.take_along_axis(lp, ids, axis=1)


def chunks(n: int, size: int):
    return [(s, min(n, s + size)) for s in range(0, n, size)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="GGUF file")
    ap.add_argument("--tokens", required=True, help="tokens.json (a JSON object with an 'ids' list, or a list)")
    ap.add_argument("--chunk", type=int, default=1024, help="tokens per independent chunk (default 1024)")
    ap.add_argument("--k", type=int, default=20, help="top-k to store (default 20)")
    ap.add_argument("--out-dir", required=True, help="where the compact fixture files go")
    ap.add_argument("--work-dir", help="where the full float64 log-probs go (numpy_logprobs.npy)")
    ap.add_argument("--rope", choices=["normal", "neox"], default=None,
                    help="RoPE pairing instead of the architecture's (only to show the other is wrong)")
    ap.add_argument("--max-tokens", type=int, default=0, help="only the first N tokens (debugging)")
    ap.add_argument("--info-json", help="write model metadata and timing as JSON here")
    args = ap.parse_args()

    with open(args.tokens) as f:
        doc = json.load(f)
    ids = np.asarray(doc["ids"] if isinstance(doc, dict) else doc, dtype=np.int64)
    if args.max_tokens:
        ids = ids[: args.max_tokens]
    n = len(ids)

    t_start = time.time()
    m = Model(args.model)
    t_loaded = time.time()
    os.makedirs(args.out_dir, exist_ok=True)
    full = None
    if args.work_dir:
        os.makedirs(args.work_dir, exist_ok=True)
        full = np.lib.format.open_memmap(os.path.join(args.work_dir, "numpy_logprobs.npy"), mode="w+",
                                         dtype=np.float64, shape=(n, m.n_vocab))
    top_ids = np.zeros((n, args.k), dtype=np.uint32)
    top_lp = np.zeros((n, args.k), dtype=np.float32)
    target = np.zeros(max(n - 1, 0), dtype=np.float64)
    for (s, e) in chunks(n, args.chunk):
        t0 = time.time()
        lp = log_softmax(forward(m, ids[s:e], args.rope))
        ti, tl = top_k(lp, args.k)
        top_ids[s:e] = ti
        top_lp[s:e] = tl
        for i in range(s, min(e, n - 1)):
            target[i] = lp[i - s, ids[i + 1]]
        if full is not None:
            full[s:e] = lp
        log(f"chunk [{s}, {e}) done in {time.time() - t0:.1f} s")
    if full is not None:
        full.flush()
        del full

    top_ids.astype("<u4").tofile(os.path.join(args.out_dir, "numpy_top20_ids.bin"))
    top_lp.astype("<f4").tofile(os.path.join(args.out_dir, "numpy_top20_logprobs.bin"))
    target.astype("<f8").tofile(os.path.join(args.out_dir, "numpy_target_logprobs.bin"))
    ppl = float(np.exp(-target.mean())) if len(target) else float("nan")
    log(f"{n} tokens, chunk {args.chunk}, rope {args.rope or m.rope_mode}: perplexity {ppl:.4f} "
        f"(load {t_loaded - t_start:.1f} s, forward {time.time() - t_loaded:.1f} s)")
    if args.info_json:
        info = {
            "metadata": m.metadata,
            "tensor_types": m.tensor_types,
            "tied_embeddings": m.tied_embeddings,
            "n_vocab": m.n_vocab,
            "rope_mode": args.rope or m.rope_mode,
            "perplexity": ppl,
            "load_seconds": round(t_loaded - t_start, 1),
            "forward_seconds": round(time.time() - t_loaded, 1),
            "gguf_version": getattr(gguf, "__version__", None) or _dist_version("gguf"),
            "numpy_version": np.__version__,
        }
        with open(args.info_json, "w") as f:
            json.dump(info, f, indent=2)


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return None


if __name__ == "__main__":
    main()
