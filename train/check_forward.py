"""Checks that the trainer's head computes what the Rust runtime does.

1. Parity: loads the tiny head in crates/speculative/tests/data/eagle3/tiny/ (SGLang layout; its
   case.json holds five rows' embeddings, features, logits and carries computed in float64 by
   scripts/reference/eagle3_reference.py, which forward.rs is tested against) and runs it one row
   after another through eagle3_train's own functions, each row attending to the cache of the rows
   before it, at positions 0..4: rows with a "state" feature go through fc, the others take the
   previous row's carry. Logits and carries must agree within 1e-4 relative.
2. Training-time test: the trainer's batched unroll (two sequences packed in one batch) must give,
   for every row and TTT step, the logits of the same row-by-row computation as inference does it:
   the real rows up to that row, then the head's own drafts.

Run: python train/check_forward.py [TINY_DIR]
"""

import json
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np

sys.dont_write_bytecode = True  # no __pycache__ beside the trainer
sys.path.insert(0, str(Path(__file__).resolve().parent))
import eagle3_train as e3  # noqa: E402

TINY = Path(__file__).resolve().parents[1] / "crates/speculative/tests/data/eagle3/tiny"
TOLERANCE = 1e-4


def load_head(folder):
    """(Shape, params keyed as the trainer keys them) of a head folder."""
    cfg = json.loads((folder / "config.json").read_text())
    shape = e3.Shape(cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"],
                     cfg["num_key_value_heads"], cfg["head_dim"], float(cfg["rms_norm_eps"]),
                     float(cfg["rope_theta"]))
    tensors = e3.read_safetensors(folder / "model.safetensors")
    params = {k: jnp.asarray(np.asarray(tensors[name], np.float32)) for k, name in e3.NAMES.items()}
    return shape, params


class RowByRow:
    """The head run as inference runs it: one row at a time, attending to all rows so far."""

    def __init__(self, shape, params, positions):
        """An empty cache for a head run at positions below positions."""
        self.shape, self.params, self.keys, self.values = shape, params, [], []
        self.table = e3.rope_table(shape, positions)

    def row(self, embedding, feature, position):
        """Runs one row (feature: 3·H captured values or an H-wide carry): (logits, carry)."""
        P, shape = self.params, self.shape
        g = jnp.asarray([feature], jnp.float32)
        if g.shape[1] != shape.hidden:
            g = g @ P["fc"].T
        q, k, v = e3.project(P, shape, jnp.asarray([embedding], jnp.float32), g,
                             jnp.asarray([position]), self.table)
        self.keys.append(k[0])
        self.values.append(v[0])
        mask = jnp.ones((1, len(self.keys)), bool)
        attn = e3.attend(shape, q, jnp.stack(self.keys), jnp.stack(self.values), mask)
        carry = e3.finish(P, shape, attn, g)
        return np.asarray(e3.draft_logits(P, shape, carry)[0]), np.asarray(carry[0])


def relative_error(got, want):
    """Largest difference over the largest magnitude of want."""
    want = np.asarray(want)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def check_case(shape, params, case):
    """Part 1; returns the worst relative error."""
    head, carry, worst = RowByRow(shape, params, len(case["embeddings"])), None, 0.0
    for r, (emb, kind) in enumerate(zip(case["embeddings"], case["features"], strict=True)):
        logits, carry = head.row(emb, case["states"][r] if kind == "state" else carry, r)
        for name, got, want in [("logits", logits, case["logits"][r]),
                                ("carry", carry, case["carries"][r])]:
            err = relative_error(got, want)
            assert err <= TOLERANCE, f"row {r} {name}: relative error {err:.2e}"
            worst = max(worst, err)
    return worst


def check_unroll(shape, params, lengths=(7, 5), ttt=3):
    """Part 2; returns the worst relative error."""
    rng = np.random.default_rng(0)
    rows, H = sum(lengths), shape.hidden
    embed = rng.standard_normal((50, H)).astype(np.float32)
    ids = rng.integers(0, 50, rows + ttt + 1)
    aux = rng.standard_normal((rows, 3 * H)).astype(np.float32)
    starts = np.cumsum((0,) + lengths[:-1])
    batch = {"aux": jnp.asarray(aux), "ids": jnp.asarray(ids),
             "pos": jnp.asarray(np.concatenate([np.arange(n) for n in lengths])),
             "seg": jnp.asarray(np.repeat(np.arange(len(lengths)), lengths))}
    frozen = {"embed": jnp.asarray(embed), "rope": e3.rope_table(shape, rows + ttt)}
    got = [np.asarray(x) for x in e3.unroll(params, shape, batch, frozen, ttt)]
    worst = 0.0
    for start, n in zip(starts, lengths, strict=True):
        for j in range(n):
            head = RowByRow(shape, params, rows + ttt)
            for r in range(j + 1):
                logits, carry = head.row(embed[ids[start + r + 1]], aux[start + r], r)
            for i in range(ttt):
                if i:
                    logits, carry = head.row(embed[ids[start + j + 1 + i]], carry, j + i)
                err = relative_error(got[i][start + j], logits)
                assert err <= TOLERANCE, f"sequence at {start}, row {j}, step {i}: {err:.2e}"
                worst = max(worst, err)
    return worst


def main():
    """Runs both checks; an AssertionError (non-zero exit) on a mismatch."""
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else TINY
    shape, params = load_head(folder)
    worst = check_case(shape, params, json.loads((folder / "case.json").read_text()))
    print(f"forward parity with case.json: 5 rows within {worst:.1e} relative")
    worst = check_unroll(shape, params)
    print(f"training-time test unroll = row-by-row inference: within {worst:.1e} relative")


if __name__ == "__main__":
    main()
