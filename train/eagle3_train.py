"""Trains an EAGLE-3 draft head (SGLang/SpecForge layout) on features captured from a target model.

Run by `specula train-draft` as

    python eagle3_train.py --features FEAT --work WORK --draft-vocab-size N --num-epochs E
        --ttt-length K --learning-rate LR --batch-tokens T --seed S [--init-head HEAD]

FEAT holds `meta.json`, `target.safetensors` (the target's `embed`, `lm_head`, `output_norm`) and
`shard-*.safetensors` (per token: `input_ids`, `loss_mask`, the three captured streams `aux` and the
target's normed final stream `target`; `lengths` splits the tokens into sequences).

The head is one Llama decoder layer fed `[RMSNorm(embedding); RMSNorm(feature)]`, the feature being
`fc` over the captured streams or the head's previous output (the carry); it is the forward of
`crates/speculative/src/eagle3/forward.rs` (check_forward.py beside this file checks it against the
runtime's reference case, and the batched training unroll against row-by-row inference). Training
follows SpecForge: the head is unrolled `ttt_length` steps on its own carries ("training-time
test"), each step attending to the real rows before it plus its own earlier steps at the same row,
against the target's distribution restricted to the draft vocabulary; AdamW, warmup then cosine,
gradient-norm clip 0.5, all in float32.

Writes WORK/head/{config.json, model.safetensors} (SGLang's layout, F16) after every epoch and
WORK/checkpoint/ (resumed by a rerun with the same WORK and settings) after every epoch and every
ten minutes. Standard output carries only JSON lines: `start`, `step`, `epoch` and `done` events.
"""

import argparse
import json
import math
import os
import shutil
import struct
import sys
import time
from pathlib import Path
from typing import NamedTuple

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

STEP_DECAY = 0.8  # weight of TTT step i is STEP_DECAY ** i
WARMUP_FRACTION = 0.03
CLIP_NORM = 0.5
INIT_STD = 0.02
HELD_OUT_FRACTION = 0.05
CHECKPOINT_SECONDS = 600
LOG_EVERY = 5
NEG = -1e30

# Internal parameter names and the names SGLang's checkpoints use.
NAMES = {
    "fc": "fc.weight",
    "input_norm": "midlayer.input_layernorm.weight",
    "hidden_norm": "midlayer.hidden_norm.weight",
    "q": "midlayer.self_attn.q_proj.weight",
    "k": "midlayer.self_attn.k_proj.weight",
    "v": "midlayer.self_attn.v_proj.weight",
    "o": "midlayer.self_attn.o_proj.weight",
    "post_norm": "midlayer.post_attention_layernorm.weight",
    "gate": "midlayer.mlp.gate_proj.weight",
    "up": "midlayer.mlp.up_proj.weight",
    "down": "midlayer.mlp.down_proj.weight",
    "norm": "norm.weight",
    "lm_head": "lm_head.weight",
}


class Fail(Exception):
    """Bad input: reported as one line on stderr, exit status 1."""


# ---------------------------------------------------------------------------------------------
# safetensors, by hand (a JSON header, then raw little-endian data)

DTYPES = {"F16": "<f2", "F32": "<f4", "I32": "<i4", "I64": "<i8", "U8": "u1", "BOOL": "?"}


def read_safetensors(path):
    """Memory-maps every tensor of a .safetensors file: {name: numpy array}."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        return {name: map_tensor(path, 8 + n, name, t) for name, t in header.items()
                if name != "__metadata__"}
    except (OSError, struct.error, ValueError, KeyError, TypeError) as e:
        raise Fail(f"cannot read {path}: {e!r}") from e


def map_tensor(path, base, name, t):
    """One tensor of a .safetensors file whose data starts at byte base."""
    if t["dtype"] not in DTYPES:
        raise Fail(f"{path}: {name} is {t['dtype']}, not one of {sorted(DTYPES)}")
    dtype, shape = np.dtype(DTYPES[t["dtype"]]), tuple(t["shape"])
    start, end = t["data_offsets"]
    if end - start != math.prod(shape) * dtype.itemsize:
        raise Fail(f"{path}: {name} has {end - start} bytes for shape {list(shape)}")
    if math.prod(shape) == 0:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype, "r", offset=base + start, shape=shape)


def write_safetensors(path, tensors):
    """Writes {name: numpy array} (dtypes of DTYPES) as a .safetensors file."""
    codes = {np.dtype(v): k for k, v in DTYPES.items()}
    header, offset = {}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": codes[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a).tobytes())


# ---------------------------------------------------------------------------------------------
# The head's forward (the same computation as forward.rs, over many rows at once)

class Shape(NamedTuple):
    """The head's dimensions and constants."""
    hidden: int
    intermediate: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    eps: float
    theta: float


def rope_table(shape, positions):
    """RoPE's cos and sin [positions, head_dim/2], angles in float64 as the runtime takes them."""
    half = shape.head_dim // 2
    inv = float(shape.theta) ** (-2.0 * np.arange(half) / shape.head_dim)
    angles = np.arange(positions)[:, None] * inv[None, :]
    return jnp.asarray(np.cos(angles), jnp.float32), jnp.asarray(np.sin(angles), jnp.float32)


def rms_norm(x, w, eps):
    """w * x / sqrt(mean(x²) + eps) over the last axis."""
    return w * (x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps))


def rope(x, pos, table):
    """Rotates x [rows, heads, head_dim] at positions pos [rows]: dimension i pairs with i + d/2."""
    cos, sin = table[0][pos][:, None, :], table[1][pos][:, None, :]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def project(P, shape, e, g, pos, table):
    """Rows' queries, keys (RoPE applied) and values from embeddings e and features g [rows, H]."""
    a = jnp.concatenate([rms_norm(e, P["input_norm"], shape.eps),
                         rms_norm(g, P["hidden_norm"], shape.eps)], -1)
    rows, hd = a.shape[0], shape.head_dim
    q = (a @ P["q"].T).reshape(rows, shape.n_heads, hd)
    k = (a @ P["k"].T).reshape(rows, shape.n_kv_heads, hd)
    v = (a @ P["v"].T).reshape(rows, shape.n_kv_heads, hd)
    return rope(q, pos, table), rope(k, pos, table), v


def attend(shape, q, keys, values, mask, diag_keys=(), diag_values=()):
    """GQA attention of q [T, nh, hd] over keys/values [S, nkv, hd] where mask [T, S] holds, and
    over each row's own extra keys/values (diag_*: a list of [T, nkv, hd], SpecForge's "cache
    hidden" diagonal); returns [T, nh·hd]."""
    rows, group = q.shape[0], shape.n_heads // shape.n_kv_heads
    qg = q.reshape(rows, shape.n_kv_heads, group, shape.head_dim) / math.sqrt(shape.head_dim)
    s = jnp.where(mask[:, None, None, :], jnp.einsum("tkgd,skd->tkgs", qg, keys), NEG)
    extra = [jnp.einsum("tkgd,tkd->tkg", qg, k)[..., None] for k in diag_keys]
    p = jax.nn.softmax(jnp.concatenate([s, *extra], -1), -1)
    n = keys.shape[0]
    out = jnp.einsum("tkgs,skd->tkgd", p[..., :n], values)
    for d, v in enumerate(diag_values):
        out = out + p[..., n + d, None] * v[:, :, None, :]
    return out.reshape(rows, shape.n_heads * shape.head_dim)


def finish(P, shape, attn, g):
    """o_proj onto the raw feature, then the SiLU MLP; returns the pre-norm output (the carry)."""
    h1 = attn @ P["o"].T + g
    n = rms_norm(h1, P["post_norm"], shape.eps)
    return h1 + (jax.nn.silu(n @ P["gate"].T) * (n @ P["up"].T)) @ P["down"].T


def draft_logits(P, shape, carry):
    """Logits over the draft vocabulary from carries."""
    return rms_norm(carry, P["norm"], shape.eps) @ P["lm_head"].T


def unroll(P, shape, batch, frozen, ttt):
    """The training-time test: the head's logits [T, N] at each of ttt steps over a packed batch.

    Row j at step i reads token ids[j+1+i] at position pos[j]+i, the feature fc(aux[j]) at step 0
    and its own step i−1 carry after, and attends to the step-0 rows of its sequence up to j and
    to itself at steps 1..i.
    """
    rows = batch["aux"].shape[0]
    seg = batch["seg"]
    mask = (seg[:, None] == seg[None, :]) & jnp.tril(jnp.ones((rows, rows), bool))
    g = batch["aux"] @ P["fc"].T
    keys, values, out = [], [], []
    for i in range(ttt):
        e = frozen["embed"][batch["ids"][1 + i:1 + i + rows]]
        q, k, v = project(P, shape, e, g, batch["pos"] + i, frozen["rope"])
        if i == 0:
            k0, v0 = k, v
        else:
            keys.append(k)
            values.append(v)
        g = finish(P, shape, attend(shape, q, k0, v0, mask, keys, values), g)
        out.append(draft_logits(P, shape, g))
    return out


def step_terms(P, shape, batch, frozen, ttt, softcap):
    """Per TTT step: the soft cross-entropy summed over counted rows, their count, the logits."""
    rows = batch["aux"].shape[0]
    t = batch["target"] @ frozen["lm_target"].T
    if softcap:
        t = softcap * jnp.tanh(t / softcap)
    sums, counts, logits = [], [], unroll(P, shape, batch, frozen, ttt)
    for i, lg in enumerate(logits):
        p = jax.nn.softmax(t[1 + i:1 + i + rows], -1)
        ce = -jnp.sum(p * jax.nn.log_softmax(lg, -1), -1)
        sums.append(jnp.sum(ce * batch["counted"][i]))
        counts.append(jnp.sum(batch["counted"][i]))
    return jnp.stack(sums), jnp.stack(counts), logits


def weighted_loss(sums, counts):
    """Σ_i 0.8^i · (mean cross-entropy over step i's counted rows)."""
    w = STEP_DECAY ** jnp.arange(sums.shape[0])
    return jnp.sum(w * sums / jnp.maximum(counts, 1.0))


def compile_steps(shape, ttt, softcap, optimizer, example):
    """Jit-compiled (train_step, eval_step) for batches shaped like example = (params, opt_state,
    batch, frozen)."""
    def loss_fn(P, batch, frozen):
        """The weighted TTT loss of a batch."""
        sums, counts, _ = step_terms(P, shape, batch, frozen, ttt, softcap)
        return weighted_loss(sums, counts)

    def train_step(P, opt_state, batch, frozen):
        """One optimizer step: (params, optimizer state, loss)."""
        loss, grads = jax.value_and_grad(loss_fn)(P, batch, frozen)
        updates, opt_state = optimizer.update(grads, opt_state, P)
        return optax.apply_updates(P, updates), opt_state, loss

    def eval_step(P, batch, frozen):
        """Per-step loss sums and counts, and the drafts (target ids) [K, T]."""
        sums, counts, logits = step_terms(P, shape, batch, frozen, ttt, softcap)
        preds = jnp.stack([frozen["used"][jnp.argmax(lg, -1)] for lg in logits])
        return sums, counts, preds

    P, opt_state, batch, frozen = example
    train = jax.jit(train_step, donate_argnums=(0, 1)).lower(P, opt_state, batch, frozen).compile()
    evaluate = jax.jit(eval_step).lower(P, batch, frozen).compile()
    return train, evaluate


# ---------------------------------------------------------------------------------------------
# Data

def load_meta(features):
    """meta.json, checked for the fields the trainer needs."""
    try:
        meta = json.loads((features / "meta.json").read_text())
    except (OSError, ValueError) as e:
        raise Fail(f"cannot read {features / 'meta.json'}: {e}") from e
    need = ["hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "rms_norm_eps", "rope_theta", "capture_layers"]
    missing = [k for k in need if k not in meta]
    if missing:
        raise Fail(f"{features / 'meta.json'} lacks {', '.join(missing)}")
    if meta["num_attention_heads"] % meta["num_key_value_heads"]:
        raise Fail("num_attention_heads is not a multiple of num_key_value_heads")
    layers = meta["capture_layers"]
    if not (isinstance(layers, list) and len(layers) == 3
            and all(isinstance(x, int) and x >= 1 for x in layers)):
        raise Fail(f"capture_layers should be three layer numbers from 1, is {layers}")
    return meta


def load_target(features, meta):
    """The target's embedding, output matrix and final norm weight, shapes checked."""
    t = read_safetensors(features / "target.safetensors")
    V, H = meta["vocab_size"], meta["hidden_size"]
    for name, shape in [("embed", (V, H)), ("lm_head", (V, H)), ("output_norm", (H,))]:
        if name not in t or t[name].shape != shape:
            got = list(t[name].shape) if name in t else "missing"
            raise Fail(f"target.safetensors: {name} should be {list(shape)}, is {got}")
    return t


class Data(NamedTuple):
    """Every shard's tokens: ids, loss mask and the target's full-vocabulary argmax concatenated;
    the captured streams and normed final streams per shard (memory-mapped)."""
    ids: np.ndarray
    loss_mask: np.ndarray
    argmax: np.ndarray
    aux: list
    target: list


class Piece(NamedTuple):
    """A sequence, or a cut of one: its first token overall, its shard, its first token in the
    shard, its length."""
    start: int
    shard: int
    local: int
    length: int


def load_shards(features, meta):
    """Every shard-*.safetensors, checked against meta.json: (shards' tensors, sequences)."""
    paths = sorted(features.glob("shard-*.safetensors"))
    if not paths:
        raise Fail(f"no shard-*.safetensors in {features}")
    H, V = meta["hidden_size"], meta["vocab_size"]
    shards, sequences, start = [], [], 0
    for index, path in enumerate(paths):
        s = read_safetensors(path)
        for key in ["input_ids", "loss_mask", "lengths", "aux", "target"]:
            if key not in s:
                raise Fail(f"{path}: {key} is missing")
        n, lengths = s["input_ids"].shape[0], s["lengths"].astype(np.int64)
        if (s["loss_mask"].shape != (n,) or s["aux"].shape != (n, 3 * H)
                or s["target"].shape != (n, H) or lengths.sum() != n or (lengths < 1).any()):
            raise Fail(f"{path}: input_ids, loss_mask, lengths, aux [n, {3 * H}] and "
                       f"target [n, {H}] disagree")
        if n and (s["input_ids"].min() < 0 or s["input_ids"].max() >= V):
            raise Fail(f"{path}: a token id outside the vocabulary of {V}")
        local = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        sequences += [Piece(start + int(o), index, int(o), int(m))
                      for o, m in zip(local, lengths, strict=True)]
        shards.append(s)
        start += n
    if len(sequences) < 2:
        raise Fail("need at least two sequences (the last is held out)")
    return shards, sequences


def full_argmax(shards, lm_head):
    """The target's argmax over its whole vocabulary at every token (softcapping keeps it)."""
    chunk, lm = 512, jnp.asarray(lm_head, jnp.float32)
    top = jax.jit(lambda f: jnp.argmax(f.astype(jnp.float32) @ lm.T, -1))
    out = []
    for s in shards:
        for i in range(0, s["target"].shape[0], chunk):
            rows = np.asarray(s["target"][i:i + chunk])
            f = np.zeros((chunk, rows.shape[1]), np.float16)
            f[:len(rows)] = rows
            out.append(np.asarray(top(f))[:len(rows)])
    return np.concatenate(out).astype(np.int64)


def cached_argmax(features, work, shards, lm_head):
    """full_argmax, kept in work/argmax.npz beside the shards' names and sizes it was computed
    from (on a large set it takes a sizeable part of an epoch); recomputed when they differ."""
    key = json.dumps(sorted((p.name, p.stat().st_size)
                            for p in features.glob("shard-*.safetensors")))
    path = work / "argmax.npz"
    try:
        with np.load(path) as f:
            if str(f["key"]) == key:
                return f["argmax"]
    except (OSError, KeyError, ValueError):
        pass
    log(f"computing the target's argmax over {sum(s['input_ids'].shape[0] for s in shards)} "
        "tokens")
    top = full_argmax(shards, lm_head)
    work.mkdir(parents=True, exist_ok=True)
    np.savez(work / "argmax.tmp.npz", key=np.array(key), argmax=top)
    os.replace(work / "argmax.tmp.npz", path)
    return top


def load_data(features, work, meta, target):
    """The shards as Data, and the sequences split into (training, held-out) Pieces."""
    shards, sequences = load_shards(features, meta)
    data = Data(ids=np.concatenate([s["input_ids"] for s in shards]).astype(np.int64),
                loss_mask=np.concatenate([s["loss_mask"] for s in shards]).astype(bool),
                argmax=cached_argmax(features, work, shards, target["lm_head"]),
                aux=[s["aux"] for s in shards], target=[s["target"] for s in shards])
    held = max(1, round(HELD_OUT_FRACTION * len(sequences)))
    return data, sequences[:-held], sequences[-held:]


def cut(pieces, size):
    """Pieces of at most size tokens (longer sequences cut), dropping those under 3 tokens (no
    row of theirs can count)."""
    out = [Piece(p.start + o, p.shard, p.local + o, min(size, p.length - o))
           for p in pieces for o in range(0, p.length, size)]
    return [p for p in out if p.length >= 3]


def draft_vocabulary(data, pieces, size, vocab):
    """The size most frequent answer tokens of pieces (ties: lower id first; then unused ids from
    the lowest), ascending."""
    chosen = np.zeros(len(data.ids), bool)
    for p in pieces:
        chosen[p.start:p.start + p.length] = True
    counts = np.bincount(data.ids[chosen & data.loss_mask], minlength=vocab)
    order = np.lexsort((np.arange(vocab), -counts))
    return np.sort(order[:size])


def pack(pieces, order, size):
    """Packs pieces, in order, into batches of at most size tokens: lists of piece indices."""
    batches, current, used = [], [], 0
    for i in order:
        if current and used + pieces[i].length > size:
            batches.append(current)
            current, used = [], 0
        current.append(i)
        used += pieces[i].length
    return batches + [current] if current else batches


def make_batch(data, pieces, size, ttt, in_draft, answers_only):
    """A packed batch: the arrays the compiled steps take, and host-side arrays for acceptance.

    Rows 0..size-1 are the packed tokens (padding after); per-token arrays run ttt + 1 further so
    that step i reads row j + 1 + i with a fixed slice. counted[i, j] says whether row j's loss
    at step i counts: its predicted token is in the sequence and in the draft vocabulary, and,
    if answers_only, in the answer. Training counts the prompt's rows too: the target's
    distribution there is as much its own as in the answer, and they nearly double what a step
    learns from.
    """
    reach = size + ttt + 1
    H = data.target[0].shape[1]
    aux = np.zeros((size, 3 * H), np.float32)
    final = np.zeros((reach, H), np.float32)
    ids, argmax = np.zeros(reach, np.int64), np.zeros(reach, np.int64)
    answer = np.zeros(reach, bool)
    pos, seg = np.zeros(size, np.int32), np.full(size, -1, np.int32)
    length = np.zeros(size, np.int64)
    at = 0
    for n, p in enumerate(pieces):
        rows, src = slice(at, at + p.length), slice(p.start, p.start + p.length)
        aux[rows] = data.aux[p.shard][p.local:p.local + p.length]
        final[rows] = data.target[p.shard][p.local:p.local + p.length]
        ids[rows], argmax[rows], answer[rows] = data.ids[src], data.argmax[src], data.loss_mask[src]
        pos[rows], seg[rows], length[rows] = np.arange(p.length), n, p.length
        at += p.length
    j = np.arange(size)
    counted = np.stack([(pos + 2 + i <= length - 1) & (answer[j + 2 + i] | (not answers_only))
                        & in_draft[argmax[j + 1 + i]] for i in range(ttt)]).astype(np.float32)
    device = {"aux": aux, "target": final, "ids": ids.astype(np.int32), "pos": pos, "seg": seg,
              "counted": counted}
    host = {"ids": ids, "argmax": argmax, "pos": pos, "length": length, "tokens": at}
    return device, host


def accepted(host, preds):
    """(Σ accepted drafts, rows) of a batch: per row j with j + 1 + K ≤ L − 1, the leading TTT
    steps whose draft is the target's argmax, on the greedy chain (input token = argmax before)."""
    ttt, size = preds.shape
    j, ids, top = np.arange(size), host["ids"], host["argmax"]
    alive, run = np.ones(size, bool), np.zeros(size)
    for i in range(ttt):
        alive &= preds[i] == top[j + 1 + i]
        if i:
            alive &= ids[j + 1 + i] == top[j + i]
        run += alive
    rows = host["pos"] + 1 + ttt <= host["length"] - 1
    return float(run[rows].sum()), int(rows.sum())


def log(message):
    """A line on stderr."""
    print(message, file=sys.stderr, flush=True)


def emit(event):
    """A JSON line on stdout."""
    print(json.dumps(event), flush=True)


# ---------------------------------------------------------------------------------------------
# Parameters, optimizer, outputs

def init_params(shape, draft_vocab, seed):
    """Every matrix normal with std 0.02, norms 1.

    A warm start from the target (lm_head its rows of the draft vocabulary, norm its final norm,
    fc the identity on the high captured stream) was measured on a 9k-token set (SmolLM2-135M,
    8 epochs, K=4, 2048 draft tokens): held-out loss 15.46 and acceptance 1.13 against 14.36 and
    1.21 from this plain start; its confident logits start far above the uniform loss, and the
    high stream's logit lens predicts the token the row already reads, not the one after.
    """
    rng = np.random.default_rng(seed)
    params = {k: rng.normal(0.0, INIT_STD, s).astype(np.float32) if len(s) == 2
              else np.ones(s, np.float32) for k, s in param_shapes(shape, draft_vocab).items()}
    return {k: jnp.asarray(v) for k, v in params.items()}


def param_shapes(shape, draft_vocab):
    """Every parameter's shape (the norms are vectors)."""
    H, inter, hd = shape.hidden, shape.intermediate, shape.head_dim
    norms = {k: (H,) for k in ["input_norm", "hidden_norm", "post_norm", "norm"]}
    return norms | {"fc": (H, 3 * H), "q": (shape.n_heads * hd, 2 * H),
                    "k": (shape.n_kv_heads * hd, 2 * H), "v": (shape.n_kv_heads * hd, 2 * H),
                    "o": (H, shape.n_heads * hd), "gate": (inter, H), "up": (inter, H),
                    "down": (H, inter), "lm_head": (draft_vocab, H)}


def read_head(path, shape, meta):
    """(parameters in float32, vocabulary) of a head in SGLang's layout made for this target: a
    warm start, so that training accumulates over runs on new data."""
    try:
        config = json.loads((path / "config.json").read_text())
        layers = config.get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids")
    except (OSError, ValueError, AttributeError) as e:
        raise Fail(f"cannot read {path / 'config.json'}: {e!r}") from e
    if layers is not None and [x + 1 for x in layers] != meta["capture_layers"]:
        raise Fail(f"{path} reads layers {layers} (0-based), the streams are of "
                   f"{[x - 1 for x in meta['capture_layers']]}")
    tensors = {}
    for f in sorted(path.glob("*.safetensors")):
        tensors |= read_safetensors(f)
    if "d2t" not in tensors:
        raise Fail(f"{path} has no d2t")
    d2t = np.asarray(tensors["d2t"], np.int64)
    used = d2t + np.arange(len(d2t))
    if len(used) == 0 or used.min() < 0 or used.max() >= meta["vocab_size"] \
            or len(np.unique(used)) != len(used):
        raise Fail(f"{path}: d2t does not map the draft vocabulary onto distinct target tokens")
    params = {}
    for k, want in param_shapes(shape, len(used)).items():
        if NAMES[k] not in tensors:
            raise Fail(f"{path} has no {NAMES[k]}")
        a = np.asarray(tensors[NAMES[k]], np.float32)
        if a.shape != want:
            raise Fail(f"{path}: {NAMES[k]} is {list(a.shape)}, this target needs {list(want)}")
        params[k] = jnp.asarray(a)
    return params, used


def make_optimizer(peak, steps):
    """AdamW (no weight decay) after a global-norm clip; linear warmup then cosine to 0."""
    warmup = max(1, round(WARMUP_FRACTION * steps))
    schedule = optax.warmup_cosine_decay_schedule(0.0, peak, warmup, max(steps, warmup + 1), 0.0)
    return optax.chain(optax.clip_by_global_norm(CLIP_NORM),
                       optax.adamw(schedule, weight_decay=0.0))


def replace_dir(work, name, fill):
    """Writes folder work/name anew: fill(temp folder), then renames it into place."""
    tmp, dst, old = work / f"{name}.tmp", work / name, work / f"{name}.old"
    for d in (tmp, old):
        shutil.rmtree(d, ignore_errors=True)
    tmp.mkdir(parents=True)
    fill(tmp)
    if dst.exists():
        dst.rename(old)
    tmp.rename(dst)
    shutil.rmtree(old, ignore_errors=True)


def head_config(meta, draft_vocab):
    """The head's config.json in SGLang's layout."""
    keys = ["hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "vocab_size", "rms_norm_eps", "rope_theta"]
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
            "num_hidden_layers": 1, **{k: meta[k] for k in keys},
            "draft_vocab_size": draft_vocab, "target_hidden_size": meta["hidden_size"],
            "tie_word_embeddings": False,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids":
                             [layer - 1 for layer in meta["capture_layers"]]}}


def write_head(work, meta, params, used):
    """WORK/head: config.json and model.safetensors (F16 weights, d2t, t2d)."""
    tensors = {NAMES[k]: np.asarray(v).astype(np.float16) for k, v in params.items()}
    tensors["d2t"] = (used - np.arange(len(used))).astype(np.int64)
    t2d = np.zeros(meta["vocab_size"], bool)
    t2d[used] = True
    tensors["t2d"] = t2d

    def fill(d):
        """Writes the head's files into d."""
        (d / "config.json").write_text(json.dumps(head_config(meta, len(used)), indent=1) + "\n")
        write_safetensors(d / "model.safetensors", tensors)

    replace_dir(work, "head", fill)


def save_checkpoint(work, params, opt_state, used, progress):
    """WORK/checkpoint: parameters, optimizer state and vocabulary (state.npz), progress.json."""
    arrays = {f"param.{k}": np.asarray(v) for k, v in params.items()}
    leaves = jax.tree_util.tree_leaves(opt_state)
    arrays |= {f"opt.{i:05d}": np.asarray(x) for i, x in enumerate(leaves)}

    def fill(d):
        """Writes the checkpoint's files into d."""
        np.savez(d / "state.npz", used=used, **arrays)
        (d / "progress.json").write_text(json.dumps(progress))

    replace_dir(work, "checkpoint", fill)


def load_checkpoint(work, settings, optimizer):
    """(params, opt_state, used, progress) from WORK/checkpoint if it was made with these
    settings, else None."""
    for d in (work / "checkpoint", work / "checkpoint.old"):
        if (d / "progress.json").is_file() and (d / "state.npz").is_file():
            break
    else:
        return None
    progress = json.loads((d / "progress.json").read_text())
    if progress["settings"] != settings:
        log(f"{d} was made with other settings or data: starting over")
        return None
    z = np.load(d / "state.npz")
    params = {k.removeprefix("param."): jnp.asarray(z[k])
              for k in z.files if k.startswith("param.")}
    leaves = [jnp.asarray(z[k]) for k in sorted(k for k in z.files if k.startswith("opt."))]
    structure = jax.tree_util.tree_structure(optimizer.init(params))
    log(f"resuming from {d} at step {progress['step']}")
    return params, jax.tree_util.tree_unflatten(structure, leaves), z["used"], progress


# ---------------------------------------------------------------------------------------------
# The run

class Trainer:
    """One training run: the data, the compiled steps, and the state a checkpoint holds."""

    def __init__(self, args):
        """Loads and checks the data, restores or initialises the head, compiles the steps."""
        self.args, self.work = args, Path(args.work)
        features = Path(args.features)
        self.meta = meta = load_meta(features)
        if not 1 <= args.draft_vocab_size <= meta["vocab_size"]:
            raise Fail(f"--draft-vocab-size must be from 1 to {meta['vocab_size']}")
        target = load_target(features, meta)
        self.shape = Shape(meta["hidden_size"], meta["intermediate_size"],
                           meta["num_attention_heads"], meta["num_key_value_heads"],
                           meta["head_dim"], float(meta["rms_norm_eps"]), float(meta["rope_theta"]))
        self.data, train, held = load_data(features, self.work, meta, target)
        self.train, self.held = cut(train, args.batch_tokens), cut(held, args.batch_tokens)
        if not self.train or not self.held:
            raise Fail("no training or no held-out sequence of 3 tokens or more")
        orders = [np.random.default_rng([args.seed, e]).permutation(len(self.train))
                  for e in range(args.num_epochs)]
        self.plans = [pack(self.train, order, args.batch_tokens) for order in orders]
        self.steps = sum(map(len, self.plans))
        self.optimizer = make_optimizer(args.learning_rate, self.steps)
        self.restore_or_init(train)
        self.in_draft = np.zeros(meta["vocab_size"], bool)
        self.in_draft[self.used] = True
        self.frozen = {"embed": jnp.asarray(target["embed"], jnp.float32),
                       "lm_target": jnp.asarray(target["lm_head"][self.used], jnp.float32),
                       "used": jnp.asarray(self.used, jnp.int32),
                       "rope": rope_table(self.shape, args.batch_tokens + args.ttt_length)}
        log("compiling the training and evaluation steps")
        example = self.batch(self.held[:1])[0]
        self.train_step, self.eval_step = compile_steps(
            self.shape, args.ttt_length, meta.get("final_logit_softcapping"), self.optimizer,
            (self.params, self.opt_state, example, self.frozen))

    def restore_or_init(self, sequences):
        """Parameters, optimizer state, vocabulary and progress: from the checkpoint, or new (the
        vocabulary from the training sequences)."""
        a = self.args
        settings = {"draft_vocab_size": a.draft_vocab_size, "num_epochs": a.num_epochs,
                    "ttt_length": a.ttt_length, "learning_rate": a.learning_rate,
                    "batch_tokens": a.batch_tokens, "seed": a.seed, "init_head": a.init_head,
                    "tokens": len(self.data.ids), "pieces": len(self.train) + len(self.held)}
        state = load_checkpoint(self.work, settings, self.optimizer)
        if state is None:
            if a.init_head:
                params, used = read_head(Path(a.init_head), self.shape, self.meta)
                if len(used) != a.draft_vocab_size:
                    raise Fail(f"{a.init_head} drafts {len(used)} tokens, not "
                               f"--draft-vocab-size {a.draft_vocab_size}")
                log(f"starting from the head in {a.init_head}")
            else:
                used = draft_vocabulary(self.data, sequences, a.draft_vocab_size,
                                        self.meta["vocab_size"])
                params = init_params(self.shape, len(used), a.seed)
            progress = {"settings": settings, "epoch": 0, "step": 0, "batch": 0, "loss_sum": 0.0,
                        "metrics": []}
            state = params, self.optimizer.init(params), used, progress
        self.params, self.opt_state, self.used, self.progress = state

    def batch(self, pieces, answers_only=True):
        """make_batch with this run's sizes (loss on answers only, or on every row)."""
        return make_batch(self.data, pieces, self.args.batch_tokens, self.args.ttt_length,
                          self.in_draft, answers_only)

    def checkpoint(self):
        """Saves the checkpoint."""
        save_checkpoint(self.work, self.params, self.opt_state, self.used, self.progress)

    def train_epoch(self, epoch):
        """Runs the optimizer over the epoch's batches from where the progress left off (a
        checkpoint every CHECKPOINT_SECONDS); returns (mean batch loss, tokens per second)."""
        p, plan = self.progress, self.plans[epoch]
        tokens, window, start = 0, [], time.monotonic()
        saved = start
        for b in range(p["batch"], len(plan)):
            device, host = self.batch([self.train[i] for i in plan[b]], answers_only=False)
            self.params, self.opt_state, loss = self.train_step(
                self.params, self.opt_state, device, self.frozen)
            loss = float(loss)
            if not math.isfinite(loss):
                raise Fail(f"the loss is {loss} at step {p['step'] + 1}")
            tokens += host["tokens"]
            window.append(loss)
            p.update(step=p["step"] + 1, batch=b + 1, loss_sum=p["loss_sum"] + loss)
            if p["step"] % LOG_EVERY == 0 or b + 1 == len(plan):
                emit({"event": "step", "step": p["step"], "loss": sum(window) / len(window)})
                window = []
            if time.monotonic() - saved > CHECKPOINT_SECONDS:
                self.checkpoint()
                saved = time.monotonic()
        return p["loss_sum"] / len(plan), tokens / max(time.monotonic() - start, 1e-9)

    def evaluate(self):
        """(held-out loss, held-out greedy acceptance length with ttt_length drafts)."""
        sums = counts = 0.0
        drafts, rows = 0.0, 0
        for batch in pack(self.held, range(len(self.held)), self.args.batch_tokens):
            device, host = self.batch([self.held[i] for i in batch])
            s, c, preds = self.eval_step(self.params, device, self.frozen)
            sums, counts = sums + np.asarray(s), counts + np.asarray(c)
            a, r = accepted(host, np.asarray(preds))
            drafts, rows = drafts + a, rows + r
        loss = float(weighted_loss(jnp.asarray(sums), jnp.asarray(counts)))
        return loss, 1.0 + drafts / max(rows, 1)

    def run(self):
        """Trains the remaining epochs; after each, evaluates and writes the head and checkpoint."""
        tokens = sum(p.length for p in self.train)
        emit({"event": "start", "steps": self.steps, "tokens": tokens})
        for m in self.progress["metrics"]:
            emit({"event": "epoch", **m})
        for epoch in range(self.progress["epoch"], self.args.num_epochs):
            train_loss, speed = self.train_epoch(epoch)
            held_loss, acceptance = self.evaluate()
            m = {"epoch": epoch + 1, "train_loss": train_loss, "held_out_loss": held_loss,
                 "held_out_acceptance": acceptance, "tokens_per_second": speed}
            self.progress.update(epoch=epoch + 1, batch=0, loss_sum=0.0)
            self.progress["metrics"].append(m)
            emit({"event": "epoch", **m})
            write_head(self.work, self.meta, self.params, self.used)
            self.checkpoint()
        if not (self.work / "head").is_dir():
            write_head(self.work, self.meta, self.params, self.used)
        emit({"event": "done"})


def parse_args(argv):
    """The command line (the flags specula train-draft passes)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--features", required=True)
    ap.add_argument("--work", required=True)
    # Every setting is required: `specula train-draft` declares the defaults and passes them.
    ap.add_argument("--draft-vocab-size", type=int, required=True)
    ap.add_argument("--num-epochs", type=int, required=True)
    ap.add_argument("--ttt-length", type=int, required=True)
    ap.add_argument("--learning-rate", type=float, required=True)
    ap.add_argument("--batch-tokens", type=int, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--init-head", help="a head (SGLang's layout) to start from, not a new one")
    args = ap.parse_args(argv)
    if min(args.num_epochs, args.ttt_length) < 1 or not args.learning_rate > 0:
        ap.error("--num-epochs and --ttt-length must be at least 1, --learning-rate positive")
    if args.batch_tokens < args.ttt_length + 2:
        ap.error("--batch-tokens must be at least --ttt-length + 2")
    return args


def main(argv=None):
    """Entry point: bad input ends with one line on stderr and exit status 1."""
    args = parse_args(argv)
    try:
        Trainer(args).run()
    except Fail as e:
        sys.exit(f"eagle3_train: {e}")


if __name__ == "__main__":
    main()
