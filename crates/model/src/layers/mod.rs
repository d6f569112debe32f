//! The pieces transformer layers are built from (pre-norm attention and gated feed-forward
//! blocks, norms, RoPE, the KV store's writes), and the files that assemble them into an
//! architecture's layer (`standard.rs`: llama, qwen2, qwen3; `gemma3.rs`).
//!
//! Every piece works row by row (a row is one token of one sequence) or through products that fix
//! their reduction order per output element, so the forward pass stays batch-invariant.

pub(crate) mod gemma3;
pub(crate) mod standard;

use crate::SeqInput;
use crate::config::ModelConfig;
use crate::gguf::GgufFile;
use crate::kv_store::{KvLayer, KvSlices};
use crate::weights::LayerWeights;
use kernels::attention::{Context, KvElem, QueryRow, paged_attention_rows_group, write_kv};
use kernels::gemm::{Activations, gemm, gemm_many};
use kernels::ops::{RopeFreqs, add_bias, gated_mul, rms_norm, rope_angles, rope_apply};
use rayon::prelude::*;

/// One row of the batch: a token of one sequence.
pub(crate) struct Row {
    pub seq: usize,
    /// Its position (what RoPE rotates by).
    pub pos: usize,
    /// Where its keys and values are stored (its position, except in a draft tree).
    pub slot: usize,
    /// A draft-tree node's ancestors' slots, root first, itself last (empty otherwise).
    pub path: Vec<usize>,
    /// The sequence's first position that is not attended directly (the tree's root).
    pub direct: usize,
}

impl Row {
    /// The positions the row attends to (through a sliding window of `window` positions).
    pub fn context(&self, window: Option<usize>) -> Context<'_> {
        let all = if self.path.is_empty() {
            Context::causal(self.pos + 1)
        } else {
            Context {
                start: 0,
                direct: self.direct,
                tail: &self.path,
            }
        };
        all.windowed(window, self.pos)
    }
}

/// What every layer needs to know about the batch: each row's sequence, position and slot, and
/// the RoPE angles of each row (the same in every layer of a kind).
pub(crate) struct BatchRows<'a> {
    pub seqs: &'a [SeqInput<'a>],
    pub rows: Vec<Row>,
    /// The global layers' angles, a row's at its index.
    angles: Vec<Vec<(f32, f32)>>,
    /// The local (sliding-window) layers' angles, where they have their own.
    local_angles: Vec<Vec<(f32, f32)>>,
}

impl<'a> BatchRows<'a> {
    /// `local`: the local layers' RoPE frequencies, if the model has such layers.
    pub fn new(
        seqs: &'a [SeqInput<'a>],
        global: &RopeFreqs<'_>,
        local: Option<&RopeFreqs<'_>>,
    ) -> Self {
        let mut rows = Vec::new();
        for (seq, s) in seqs.iter().enumerate() {
            for slot in s.start_pos..s.start_pos + s.tokens.len() {
                rows.push(match s.tree {
                    None => Row {
                        seq,
                        pos: slot,
                        slot,
                        path: Vec::new(),
                        direct: slot,
                    },
                    Some(tree) => {
                        let path = tree.path(slot - tree.root);
                        Row {
                            seq,
                            pos: tree.root + path.len() - 1,
                            slot,
                            path: path.into_iter().map(|n| tree.root + n).collect(),
                            direct: tree.root,
                        }
                    }
                });
            }
        }
        let table = |freqs: &RopeFreqs<'_>| {
            rows.iter()
                .map(|r| {
                    let mut a = Vec::new();
                    rope_angles(r.pos, freqs, &mut a);
                    a
                })
                .collect()
        };
        let angles = table(global);
        let local_angles = local.map(table).unwrap_or_default();
        Self {
            seqs,
            rows,
            angles,
            local_angles,
        }
    }

    /// The RoPE angles of every row in a local layer, or in a global one.
    fn angles(&self, local: bool) -> &[Vec<(f32, f32)>] {
        if local && !self.local_angles.is_empty() {
            &self.local_angles
        } else {
            &self.angles
        }
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }
}

/// Per-forward buffers, kept by the runner and reused (resized to the batch) from one forward
/// pass to the next.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    pub normed: Vec<f32>,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub attn: Vec<f32>,
    pub proj: Vec<f32>,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub acts: Activations,
}

impl Scratch {
    /// Sizes every buffer for `m` rows of `cfg`'s model.
    pub fn resize(&mut self, cfg: &ModelConfig, m: usize) {
        let (hd, kvd, ffn) = (cfg.hidden, cfg.kv_dim(), cfg.ffn_hidden);
        for (buf, width) in [
            (&mut self.normed, hd),
            (&mut self.q, cfg.q_dim()),
            (&mut self.k, kvd),
            (&mut self.v, kvd),
            (&mut self.attn, cfg.q_dim()),
            (&mut self.proj, hd),
            (&mut self.gate, ffn),
            (&mut self.up, ffn),
        ] {
            buf.resize(m * width, 0.0);
        }
    }
}

/// `out = RMSNorm(x) · weight`, row by row.
pub(crate) fn norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let width = weight.len();
    for (x, o) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        rms_norm(x, weight, eps, o);
    }
}

/// `x ← RMSNorm(x) · weight` over each head (`weight.len()` values) of every row.
pub(crate) fn norm_heads(x: &mut [f32], weight: &[f32], eps: f32) {
    let mut head = vec![0.0; weight.len()];
    for chunk in x.chunks_exact_mut(weight.len()) {
        head.copy_from_slice(chunk);
        rms_norm(&head, weight, eps, chunk);
    }
}

/// One layer of a model: what its code reads besides the batch.
pub(crate) struct Layer<'a> {
    pub cfg: &'a ModelConfig,
    pub file: &'a GgufFile,
    pub weights: &'a LayerWeights,
    /// Its index (which decides its window and RoPE table).
    pub index: usize,
}

/// Pre-norm attention of `layer` (grouped-query; the layer's biases and Q/K head norms if it
/// has them; its RoPE table and window): the output projection, rows × hidden, in `s.proj`.
pub(crate) fn attention(
    layer: &Layer<'_>,
    batch: &BatchRows<'_>,
    kv: &mut KvLayer<'_>,
    s: &mut Scratch,
    h: &[f32],
) {
    let Layer {
        cfg,
        file,
        weights: lw,
        index,
    } = *layer;
    let m = batch.len();
    norm_rows(h, &lw.attn_norm, cfg.norm_eps, &mut s.normed);
    s.acts.set(&s.normed, m, cfg.hidden);
    gemm_many(
        &mut [
            (lw.wq.matrix(file), &mut s.q),
            (lw.wk.matrix(file), &mut s.k),
            (lw.wv.matrix(file), &mut s.v),
        ],
        &s.acts,
    );
    if let Some([bq, bk, bv]) = &lw.qkv_bias {
        add_bias(&mut s.q, bq);
        add_bias(&mut s.k, bk);
        add_bias(&mut s.v, bv);
    }
    if let Some([nq, nk]) = &lw.qk_norm {
        norm_heads(&mut s.q, nq, cfg.norm_eps);
        norm_heads(&mut s.k, nk, cfg.norm_eps);
    }
    let local = cfg.is_local(index);
    rope_and_store(
        batch,
        cfg,
        batch.angles(local),
        &mut s.q,
        &mut s.k,
        &s.v,
        kv,
    );
    let window = cfg.sliding_window.filter(|_| local);
    attend(batch, &s.q, kv, cfg.attn_scale, window, &mut s.attn);
    s.acts.set(&s.attn, m, cfg.q_dim());
    gemm(&lw.wo.matrix(file), &s.acts, &mut s.proj);
}

/// Pre-norm gated feed-forward (`down · (act(gate · x) ⊙ up · x)`): its output, rows × hidden,
/// in `s.proj`.
pub(crate) fn feed_forward(layer: &Layer<'_>, s: &mut Scratch, h: &[f32]) {
    let (cfg, file, lw) = (layer.cfg, layer.file, layer.weights);
    let m = h.len() / cfg.hidden;
    norm_rows(h, &lw.ffn_norm, cfg.norm_eps, &mut s.normed);
    s.acts.set(&s.normed, m, cfg.hidden);
    gemm_many(
        &mut [
            (lw.gate.matrix(file), &mut s.gate),
            (lw.up.matrix(file), &mut s.up),
        ],
        &s.acts,
    );
    gated_mul(cfg.gate, &mut s.gate, &s.up);
    s.acts.set(&s.gate, m, cfg.ffn_hidden);
    gemm(&lw.down.matrix(file), &s.acts, &mut s.proj);
}

/// Rotates each row's queries and keys by its position (RoPE as the architecture pairs it, by
/// the angles of `angles`), then stores its keys and values in the sequence's KV blocks.
pub(crate) fn rope_and_store(
    batch: &BatchRows<'_>,
    cfg: &ModelConfig,
    angles: &[Vec<(f32, f32)>],
    q: &mut [f32],
    k: &mut [f32],
    v: &[f32],
    kv: &mut KvLayer<'_>,
) {
    let (qd, kvd) = (q.len() / batch.len(), kv.shape().token_stride());
    for (r, angles) in angles[..batch.len()].iter().enumerate() {
        let (hd, mode) = (cfg.head_dim, cfg.rope_mode);
        rope_apply(&mut q[r * qd..(r + 1) * qd], hd, mode, angles);
        rope_apply(&mut k[r * kvd..(r + 1) * kvd], hd, mode, angles);
    }
    match kv {
        KvLayer::F32(s) => store_rows(batch, k, v, s),
        KvLayer::F16(s) => store_rows(batch, k, v, s),
    }
}

/// Each row's keys and values (`k`, `v`: a row of `token_stride` each) into its KV slot.
fn store_rows<E: KvElem>(batch: &BatchRows<'_>, k: &[f32], v: &[f32], kv: &mut KvSlices<'_, E>) {
    let kvd = kv.shape.token_stride();
    for (r, row) in batch.rows.iter().enumerate() {
        write_kv(
            kv.keys,
            kv.values,
            kv.shape,
            batch.seqs[row.seq].blocks,
            row.slot,
            &k[r * kvd..(r + 1) * kvd],
            &v[r * kvd..(r + 1) * kvd],
        );
    }
}

/// Causal attention of every row over its sequence's positions up to its own (a tree node's:
/// its ancestors'; the last `window` of them in a sliding-window layer). Consecutive rows of a
/// sequence (a verification's, a prompt's) attend together, so the context they share is read
/// once for them; the work is split over the kernel threads by such runs of rows and KV head,
/// into enough pieces that even one row's attention (a decode step) runs on every thread.
pub(crate) fn attend(
    batch: &BatchRows<'_>,
    q: &[f32],
    kv: &KvLayer<'_>,
    scale: f32,
    window: Option<usize>,
    out: &mut [f32],
) {
    match kv {
        KvLayer::F32(s) => attend_in(batch, q, s, scale, window, out),
        KvLayer::F16(s) => attend_in(batch, q, s, scale, window, out),
    }
}

/// [`attend`] over a store of `E`.
fn attend_in<E: KvElem>(
    batch: &BatchRows<'_>,
    q: &[f32],
    kv: &KvSlices<'_, E>,
    scale: f32,
    window: Option<usize>,
    out: &mut [f32],
) {
    let (keys, values, shape) = (&*kv.keys, &*kv.values, kv.shape);
    let n_kv = shape.n_kv_heads;
    let width = q.len() / (batch.len() * n_kv);
    let mut groups: Vec<Option<(&[f32], &mut [f32])>> = q
        .chunks(width)
        .zip(out.chunks_mut(width))
        .map(Some)
        .collect();
    let mut jobs = Vec::new();
    // Two jobs a thread where the batch has that many rows.
    let min_runs = (2 * rayon::current_num_threads()).div_ceil(n_kv);
    let row_seqs: Vec<usize> = batch.rows.iter().map(|r| r.seq).collect();
    for run in row_runs(&row_seqs, batch.seqs.len(), min_runs) {
        for kvh in 0..n_kv {
            let rows: Vec<QueryRow<'_>> = run
                .clone()
                .map(|r| {
                    let (q, out) = groups[r * n_kv + kvh].take().expect("each group once");
                    QueryRow {
                        q,
                        out,
                        ctx: batch.rows[r].context(window),
                    }
                })
                .collect();
            jobs.push((batch.seqs[batch.rows[run.start].seq].blocks, rows, kvh));
        }
    }
    jobs.into_par_iter()
        .for_each_init(Vec::new, |scratch, (blocks, mut rows, kvh)| {
            paged_attention_rows_group(keys, values, shape, blocks, &mut rows, kvh, scale, scratch);
        });
}

/// Rows attended together at most: a prompt's rows come in runs this long, each reading the
/// context before its first row once.
const ROWS_TOGETHER: usize = 8;

/// The rows (each of the sequence `row_seqs[r]`, a sequence's rows consecutive) in runs of
/// consecutive rows of one sequence (at most [`ROWS_TOGETHER`]), a sequence's rows split into
/// more runs where the `n_seqs` sequences would otherwise give fewer than `min_runs`.
fn row_runs(row_seqs: &[usize], n_seqs: usize, min_runs: usize) -> Vec<std::ops::Range<usize>> {
    let per_seq = min_runs.div_ceil(n_seqs.max(1));
    let mut runs = Vec::new();
    let mut first = 0;
    while first < row_seqs.len() {
        let seq = row_seqs[first];
        let end = first + row_seqs[first..].iter().take_while(|&&s| s == seq).count();
        let n = end - first;
        let pieces = n.div_ceil(ROWS_TOGETHER).max(per_seq.min(n));
        let len = n.div_ceil(pieces);
        runs.extend((first..end).step_by(len).map(|a| a..(a + len).min(end)));
        first = end;
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_attend_in_runs_of_one_sequence() {
        // A decode row, a verification of 5 rows, a 20-row prompt chunk.
        let seqs: Vec<usize> = [vec![0], vec![1; 5], vec![2; 20]].concat();
        let runs = row_runs(&seqs, 3, 2);
        assert_eq!(runs, [0..1, 1..6, 6..13, 13..20, 20..26]);
        // Alone in a step on 2 threads over 3 KV heads (2 runs wanted): the verification splits
        // so that both threads have work.
        assert_eq!(row_runs(&[0; 5], 1, 2), [0..3, 3..5]);
        assert_eq!(row_runs(&[0], 1, 2), vec![0..1]);
        // Every row once, in order, and no run longer than ROWS_TOGETHER.
        for (seqs, n, min) in [(&seqs[..], 3, 8), (&[0usize; 17][..], 1, 1)] {
            let runs = row_runs(seqs, n, min);
            assert_eq!(
                runs.iter().flat_map(|r| r.clone()).collect::<Vec<_>>(),
                (0..seqs.len()).collect::<Vec<_>>()
            );
            assert!(
                runs.iter().all(|r| r.len() <= ROWS_TOGETHER
                    && seqs[r.clone()].iter().all(|&s| s == seqs[r.start]))
            );
        }
    }
}
