"""A tiny EAGLE-3 head in SGLang's checkpoint layout and its forward pass in float64.

Writes, into the folder given (crates/speculative/tests/data/eagle3/tiny by scripts/reference/
eagle3.sh):
    config.json         the head's config (hidden 16, 4 query heads of 8 over 2 KV heads,
                        a 10-token draft vocabulary of a 100-token target with 8 layers)
    model.safetensors   random f32 weights (seeded) and d2t, written by hand (the format is a
                        JSON header and raw little-endian data), no torch needed
    case.json           five rows: token embeddings, the features (three captured target states
                        for the first three rows, the previous row's carry for the last two),
                        and the expected logits and carries, computed here in float64

The forward follows SGLang's llama_eagle3.py: the feature through fc when it is three states wide,
the residual the (raw) feature, attention input [RMSNorm(embedding); RMSNorm(feature)], Hugging
Face's RoPE (dimension i with i + d/2), causal attention over the head's own cache, SiLU MLP, the
pre-norm sum carried, the final norm and lm_head.
"""

import json
import struct
import sys
from pathlib import Path

import numpy as np

H, I, NH, NKV, HD = 16, 24, 4, 2, 8
VOCAB, DRAFT_VOCAB, TARGET_HIDDEN = 100, 10, 16
EPS, THETA = 1e-5, 10000.0


def weights(rng):
    def m(rows, cols, scale=0.3):
        return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    return {
        "fc.weight": m(H, 3 * TARGET_HIDDEN, 1.0),
        "midlayer.input_layernorm.weight": norm(H),
        "midlayer.hidden_norm.weight": norm(H),
        "midlayer.self_attn.q_proj.weight": m(NH * HD, 2 * H, 2.0),
        "midlayer.self_attn.k_proj.weight": m(NKV * HD, 2 * H, 2.0),
        "midlayer.self_attn.v_proj.weight": m(NKV * HD, 2 * H, 1.0),
        "midlayer.self_attn.o_proj.weight": m(H, NH * HD, 1.0),
        "midlayer.post_attention_layernorm.weight": norm(H),
        "midlayer.mlp.gate_proj.weight": m(I, H, 1.0),
        "midlayer.mlp.up_proj.weight": m(I, H, 1.0),
        "midlayer.mlp.down_proj.weight": m(H, I, 1.0),
        "norm.weight": norm(H),
        "lm_head.weight": m(DRAFT_VOCAB, H, 2.0),
    }


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        dtype = {np.float32: "F32", np.int64: "I64"}[arr.dtype.type]
        data = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def rms(x, w):
    return x / np.sqrt(np.mean(x * x) + EPS) * w


def rope(x, pos):
    out = x.copy()
    half = HD // 2
    for h in range(len(x) // HD):
        for i in range(half):
            freq = THETA ** (-(2 * i) / HD)
            c, s = np.cos(pos * freq), np.sin(pos * freq)
            a, b = x[h * HD + i], x[h * HD + i + half]
            out[h * HD + i] = a * c - b * s
            out[h * HD + i + half] = b * c + a * s
    return out


def step(w, cache, emb, feat):
    g = w["fc.weight"] @ feat if len(feat) != H else feat
    residual = g
    a = np.concatenate([rms(emb, w["midlayer.input_layernorm.weight"]), rms(g, w["midlayer.hidden_norm.weight"])])
    pos = len(cache)
    q = rope(w["midlayer.self_attn.q_proj.weight"] @ a, pos)
    k = rope(w["midlayer.self_attn.k_proj.weight"] @ a, pos)
    v = w["midlayer.self_attn.v_proj.weight"] @ a
    cache.append((k, v))
    attn = np.zeros(NH * HD)
    for hq in range(NH):
        kvh = hq // (NH // NKV)
        qh = q[hq * HD:(hq + 1) * HD]
        s = np.array([qh @ kk[kvh * HD:(kvh + 1) * HD] for kk, _ in cache]) / np.sqrt(HD)
        p = np.exp(s - s.max())
        p /= p.sum()
        attn[hq * HD:(hq + 1) * HD] = sum(pt * vv[kvh * HD:(kvh + 1) * HD] for pt, (_, vv) in zip(p, cache))
    h1 = w["midlayer.self_attn.o_proj.weight"] @ attn + residual
    n = rms(h1, w["midlayer.post_attention_layernorm.weight"])
    gate, up = w["midlayer.mlp.gate_proj.weight"] @ n, w["midlayer.mlp.up_proj.weight"] @ n
    h2 = w["midlayer.mlp.down_proj.weight"] @ (gate / (1 + np.exp(-gate)) * up) + h1
    return w["lm_head.weight"] @ rms(h2, w["norm.weight"]), h2


def main(out_dir):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261203)
    w = weights(rng)
    d2t = (np.arange(DRAFT_VOCAB, dtype=np.int64) * 7 + 3)  # target id = i + d2t[i] = 8·i + 3
    write_safetensors(out / "model.safetensors", {**w, "d2t": d2t})
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
        "intermediate_size": I, "num_attention_heads": NH, "num_key_value_heads": NKV,
        "head_dim": HD, "num_hidden_layers": 1, "vocab_size": VOCAB,
        "draft_vocab_size": DRAFT_VOCAB, "rms_norm_eps": EPS, "rope_theta": THETA,
        "tie_word_embeddings": False,
    }
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    embeddings = rng.standard_normal((5, H)).astype(np.float32)
    states = rng.standard_normal((3, 3 * TARGET_HIDDEN)).astype(np.float32)
    cache, logits, carries, features = [], [], [], []
    for r in range(5):
        feat = states[r].astype(np.float64) if r < 3 else carries[-1]
        lg, carry = step(w64, cache, embeddings[r].astype(np.float64), feat)
        logits.append(lg)
        carries.append(carry)
        features.append("state" if r < 3 else "carry")
    case = {
        "embeddings": embeddings.tolist(), "states": states.tolist(), "features": features,
        "logits": [l.tolist() for l in logits], "carries": [c.tolist() for c in carries],
    }
    (out / "case.json").write_text(json.dumps(case) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
