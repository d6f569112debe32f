//! Attention of one query token over a sequence's keys and values in paged KV blocks.
//!
//! Keys are stored transposed within each block (`[kv head][dim][slot]`), so a query's scores
//! against a block's keys are 16-lane (AVX-512) or 8-lane (AVX2) multiply-adds with no horizontal
//! sums; values stay row-major (`[slot][kv head][dim]`), the layout the weighted sum reads. Each
//! query row is computed alone, in an order fixed by its context length, so attention is
//! batch-invariant (on each kernel path; the paths differ from each other in rounding).
//!
//! A query of a draft tree sees the sequence up to the tree's root and then only its own
//! ancestors, wherever their slots are ([`Context`]): the scores, softmax and weighted sum run
//! over those positions in the same order and lanes as they would if the ancestors sat in
//! consecutive slots, so a tree node's result is bitwise that of decoding its path.
//!
//! The store holds f32 or f16 ([`KvDtype`]): f16 halves the bytes every decode step reads (what
//! llama.cpp stores by default). A value is rounded to f16 once, when it is written; every read
//! widens it exactly, and the arithmetic after that is the f32 store's, so both stores are
//! batch-invariant alike.

mod elem;
#[cfg(target_arch = "x86_64")]
mod vector;

pub use elem::{KvDtype, KvElem, UnknownKvDtype, read_le, write_le};
pub use half::f16;

use crate::gemm::{Isa, isa};

/// Geometry of the KV storage, per layer: blocks of `block_size` token slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    pub block_size: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl KvShape {
    /// Floats of one token's keys (or values) in one layer.
    pub fn token_stride(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    pub fn block_stride(&self) -> usize {
        self.block_size * self.token_stride()
    }

    /// Start of the block holding `pos`, and `pos`'s slot in it.
    fn locate(&self, blocks: &[u32], pos: usize) -> (usize, usize) {
        (
            blocks[pos / self.block_size] as usize * self.block_stride(),
            pos % self.block_size,
        )
    }

    /// Index of key dimension `dim` of KV head `kvh` at `pos`.
    pub fn key_index(&self, blocks: &[u32], pos: usize, kvh: usize, dim: usize) -> usize {
        let (base, slot) = self.locate(blocks, pos);
        base + (kvh * self.head_dim + dim) * self.block_size + slot
    }

    /// Index of value dimension `dim` of KV head `kvh` at `pos`.
    pub fn value_index(&self, blocks: &[u32], pos: usize, kvh: usize, dim: usize) -> usize {
        let (base, slot) = self.locate(blocks, pos);
        base + slot * self.token_stride() + kvh * self.head_dim + dim
    }
}

/// The positions one query attends to, in order: the sequence's slots `start..direct`, then the
/// slots listed in `tail` (a draft-tree node's ancestors, root first, itself last). `start` is 0
/// but for a sliding window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Context<'a> {
    pub start: usize,
    pub direct: usize,
    pub tail: &'a [usize],
}

impl<'a> Context<'a> {
    /// Ordinary causal attention over slots `0..n`.
    pub fn causal(n: usize) -> Self {
        Self {
            start: 0,
            direct: n,
            tail: &[],
        }
    }

    /// The same context seen through a sliding window of `window` positions for a query at
    /// position `pos` (it sees `pos + 1 − window ..= pos`, as llama.cpp's standard window). The
    /// direct part loses its slots before the window; a draft tree's tail (its ancestors, at
    /// most a few positions back) stays whole.
    pub fn windowed(self, window: Option<usize>, pos: usize) -> Self {
        match window {
            Some(w) => Self {
                start: (pos + 1).saturating_sub(w).min(self.direct),
                ..self
            },
            None => self,
        }
    }

    /// How many positions of the direct part the query sees.
    pub fn direct_len(&self) -> usize {
        self.direct - self.start
    }

    /// How many positions the query sees.
    pub fn len(&self) -> usize {
        self.direct_len() + self.tail.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slot of the `t`-th position seen.
    pub fn slot(&self, t: usize) -> usize {
        if t < self.direct_len() {
            self.start + t
        } else {
            self.tail[t - self.direct_len()]
        }
    }

    /// One past the highest slot seen.
    fn slot_end(&self) -> usize {
        self.tail
            .iter()
            .map(|&s| s + 1)
            .fold(self.direct, usize::max)
    }
}

/// Stores one token's keys and values (`n_kv_heads × head_dim` each) at `pos`.
pub fn write_kv<E: KvElem>(
    keys: &mut [E],
    values: &mut [E],
    shape: KvShape,
    blocks: &[u32],
    pos: usize,
    k: &[f32],
    v: &[f32],
) {
    let at = shape.value_index(blocks, pos, 0, 0);
    for (o, &x) in values[at..at + shape.token_stride()].iter_mut().zip(v) {
        *o = E::from_f32(x);
    }
    let (base, slot) = shape.locate(blocks, pos);
    for (i, &x) in k.iter().enumerate() {
        keys[base + i * shape.block_size + slot] = E::from_f32(x);
    }
}

/// One row's query heads of one KV head's group (`q` and `out`: `G × head_dim`) and the
/// positions it sees.
#[derive(Debug)]
pub struct QueryRow<'a> {
    pub q: &'a [f32],
    pub out: &'a mut [f32],
    pub ctx: Context<'a>,
}

/// `out` (n_heads × head_dim) = softmax(q·Kᵀ · scale) · V over the positions of `ctx`, with
/// grouped query heads (`n_heads / n_kv_heads` query heads share a KV head). `scratch` is
/// scratch.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention<E: KvElem>(
    q: &[f32],
    keys: &[E],
    values: &[E],
    shape: KvShape,
    blocks: &[u32],
    ctx: Context<'_>,
    scale: f32,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    paged_attention_rows(q, keys, values, shape, blocks, &[ctx], scale, out, scratch);
}

/// [`paged_attention`] for several rows of one sequence at once (`q` and `out`: a row of
/// `n_heads × head_dim` each, row `r` seeing `contexts[r]`): the part of the context every row
/// sees is read once for all of them, and each row's result is bitwise its result alone.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_rows<E: KvElem>(
    q: &[f32],
    keys: &[E],
    values: &[E],
    shape: KvShape,
    blocks: &[u32],
    contexts: &[Context<'_>],
    scale: f32,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    all_heads_on(
        isa(),
        q,
        keys,
        values,
        shape,
        blocks,
        contexts,
        scale,
        out,
        scratch,
    );
}

/// [`paged_attention_rows`] on the kernels of `isa` (which the CPU must have).
#[allow(clippy::too_many_arguments)]
fn all_heads_on<E: KvElem>(
    isa: Isa,
    q: &[f32],
    keys: &[E],
    values: &[E],
    shape: KvShape,
    blocks: &[u32],
    contexts: &[Context<'_>],
    scale: f32,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    assert_eq!(q.len(), out.len());
    let n_kv = shape.n_kv_heads;
    let width = q.len() / (contexts.len() * n_kv);
    let mut groups: Vec<(&[f32], &mut [f32])> =
        q.chunks(width).zip(out.chunks_mut(width)).collect();
    for kvh in 0..n_kv {
        let mut rows: Vec<QueryRow<'_>> = groups
            .chunks_mut(n_kv)
            .zip(contexts)
            .map(|(row, &ctx)| {
                let (q, out) = &mut row[kvh];
                QueryRow { q, out, ctx }
            })
            .collect();
        rows_on(
            isa, keys, values, shape, blocks, &mut rows, kvh, scale, scratch,
        );
    }
}

/// [`paged_attention_rows`] for the query heads of KV head `kvh` alone (each row's `q` and
/// `out` hold that group's heads): the KV heads are independent, so they can run on different
/// threads, and so can a sequence's rows split into runs. Bitwise each row's result alone.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_rows_group<E: KvElem>(
    keys: &[E],
    values: &[E],
    shape: KvShape,
    blocks: &[u32],
    rows: &mut [QueryRow<'_>],
    kvh: usize,
    scale: f32,
    scratch: &mut Vec<f32>,
) {
    rows_on(
        isa(),
        keys,
        values,
        shape,
        blocks,
        rows,
        kvh,
        scale,
        scratch,
    );
}

/// [`paged_attention_rows_group`] on the kernels of `isa` (which the CPU must have): AVX-512
/// for head sizes that are multiples of 16, AVX2 (with AVX-VNNI too) for multiples of 8, else
/// the portable loops. Rows whose windows start at different slots run one at a time.
#[allow(clippy::too_many_arguments)]
fn rows_on<E: KvElem>(
    isa: Isa,
    keys: &[E],
    values: &[E],
    shape: KvShape,
    blocks: &[u32],
    rows: &mut [QueryRow<'_>],
    kvh: usize,
    scale: f32,
    scratch: &mut Vec<f32>,
) {
    for row in rows.iter() {
        assert!(
            !row.ctx.is_empty() && row.ctx.slot_end() <= blocks.len() * shape.block_size,
            "context beyond the blocks"
        );
        assert_eq!(row.q.len(), row.out.len());
        assert!(row.q.len() == rows[0].q.len() && row.q.len().is_multiple_of(shape.head_dim));
    }
    if rows.len() > 1 && rows.iter().any(|r| r.ctx.start != rows[0].ctx.start) {
        for row in rows.chunks_mut(1) {
            rows_on(isa, keys, values, shape, blocks, row, kvh, scale, scratch);
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && shape.head_dim.is_multiple_of(16) {
        assert!(isa.available(), "{isa:?} kernels on a CPU without them");
        let kv = vector::Kv::new(keys, values, shape, blocks, rows, kvh);
        // SAFETY: Avx512 means the CPU has AVX-512 F, BW and VL, F16C and FMA
        // (Isa::available, asserted).
        unsafe { vector::attention_avx512(&kv, rows, scale, scratch) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && shape.head_dim.is_multiple_of(8) {
        assert!(isa.available(), "{isa:?} kernels on a CPU without them");
        let kv = vector::Kv::new(keys, values, shape, blocks, rows, kvh);
        // SAFETY: Avx2 and above mean the CPU has AVX2, F16C and FMA (Isa::available,
        // asserted).
        unsafe { vector::attention_avx2(&kv, rows, scale, scratch) };
        return;
    }
    for row in rows {
        portable_group(keys, values, shape, blocks, row, kvh, scale, scratch);
    }
}

/// One row's group of query heads over its context, in plain loops.
#[allow(clippy::too_many_arguments)]
fn portable_group<E: KvElem>(
    keys: &[E],
    values: &[E],
    shape: KvShape,
    blocks: &[u32],
    row: &mut QueryRow<'_>,
    kvh: usize,
    scale: f32,
    scores: &mut Vec<f32>,
) {
    let ctx = row.ctx;
    let n_ctx = ctx.len();
    let d = shape.head_dim;
    scores.resize(n_ctx, 0.0);
    for (qh, oh) in row.q.chunks_exact(d).zip(row.out.chunks_exact_mut(d)) {
        for (t, s) in scores.iter_mut().enumerate() {
            let dot = (0..d).fold(0.0f32, |acc, i| {
                acc + qh[i] * keys[shape.key_index(blocks, ctx.slot(t), kvh, i)].to_f32()
            });
            *s = dot * scale;
        }
        crate::ops::softmax(scores);
        oh.fill(0.0);
        for (t, &p) in scores.iter().enumerate() {
            let at = shape.value_index(blocks, ctx.slot(t), kvh, 0);
            for (o, &v) in oh.iter_mut().zip(&values[at..at + d]) {
                *o += p * v.to_f32();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`paged_attention`] on the kernels of `isa`.
    #[allow(clippy::too_many_arguments)]
    fn paged_attention_on<E: KvElem>(
        isa: Isa,
        q: &[f32],
        keys: &[E],
        values: &[E],
        shape: KvShape,
        blocks: &[u32],
        ctx: Context<'_>,
        scale: f32,
        out: &mut [f32],
        scratch: &mut Vec<f32>,
    ) {
        all_heads_on(
            isa,
            q,
            keys,
            values,
            shape,
            blocks,
            &[ctx],
            scale,
            out,
            scratch,
        );
    }

    /// Every kernel path this CPU has.
    fn paths() -> Vec<Isa> {
        [Isa::Portable, Isa::Avx2, Isa::AvxVnni, Isa::Avx512]
            .into_iter()
            .filter(|i| i.available())
            .collect()
    }

    /// Attention in f64 over contiguous rows.
    fn reference(
        q: &[f32],
        k_rows: &[Vec<f32>],
        v_rows: &[Vec<f32>],
        shape: KvShape,
        scale: f32,
    ) -> Vec<f64> {
        let d = shape.head_dim;
        let n_heads = q.len() / d;
        let group = n_heads / shape.n_kv_heads;
        let mut out = vec![0.0; q.len()];
        for h in 0..n_heads {
            let kvh = h / group;
            let s: Vec<f64> = k_rows
                .iter()
                .map(|k| {
                    (0..d)
                        .map(|i| q[h * d + i] as f64 * k[kvh * d + i] as f64)
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            let m = s.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for i in 0..d {
                out[h * d + i] = (0..k_rows.len())
                    .map(|t| e[t] / z * v_rows[t][kvh * d + i] as f64)
                    .sum();
            }
        }
        out
    }

    fn check(shape: KvShape, n_heads: usize, n_ctx: usize, blocks: &[u32]) {
        for isa in paths() {
            check_on::<f32>(isa, shape, n_heads, n_ctx, blocks);
            check_on::<f16>(isa, shape, n_heads, n_ctx, blocks);
        }
    }

    /// `x` as a store of `E` keeps it.
    fn stored<E: KvElem>(x: f32) -> f32 {
        E::from_f32(x).to_f32()
    }

    /// Attention of `q` over `ctx` with `rows` (keys, values) written at slots 0.. of `blocks`
    /// in stores that hold NaN everywhere else: nothing outside the context may leak in.
    fn stored_attention<E: KvElem>(
        isa: Isa,
        shape: KvShape,
        blocks: &[u32],
        rows: (&[Vec<f32>], &[Vec<f32>]),
        q: &[f32],
        ctx: Context<'_>,
        scale: f32,
    ) -> Vec<f32> {
        let n_blocks = *blocks.iter().max().unwrap() as usize + 1;
        let mut keys = vec![E::from_f32(f32::NAN); n_blocks * shape.block_stride()];
        let mut values = keys.clone();
        for (slot, (k, v)) in rows.0.iter().zip(rows.1).enumerate() {
            write_kv(&mut keys, &mut values, shape, blocks, slot, k, v);
        }
        let mut out = vec![0.0; q.len()];
        paged_attention_on(
            isa,
            q,
            &keys,
            &values,
            shape,
            blocks,
            ctx,
            scale,
            &mut out,
            &mut Vec::new(),
        );
        out
    }

    /// Attention from a store of `E` against the f64 reference over the values it stores.
    fn check_on<E: KvElem>(isa: Isa, shape: KvShape, n_heads: usize, n_ctx: usize, blocks: &[u32]) {
        let d = shape.head_dim;
        let kvd = shape.token_stride();
        let wave = |t: usize, i: usize, f: f32| stored::<E>(((t * 31 + i * 7) as f32 * f).sin());
        let k_rows: Vec<Vec<f32>> = (0..n_ctx)
            .map(|t| (0..kvd).map(|i| wave(t, i, 0.37)).collect())
            .collect();
        let v_rows: Vec<Vec<f32>> = (0..n_ctx)
            .map(|t| (0..kvd).map(|i| wave(t, i, 0.11) * 2.0).collect())
            .collect();
        let q: Vec<f32> = (0..n_heads * d).map(|i| wave(99, i, 0.23)).collect();
        let scale = 1.0 / (d as f32).sqrt();
        let kv = (&k_rows[..], &v_rows[..]);
        let out = stored_attention::<E>(isa, shape, blocks, kv, &q, Context::causal(n_ctx), scale);
        let want = reference(&q, &k_rows, &v_rows, shape, scale);
        for (i, (&g, &w)) in out.iter().zip(&want).enumerate() {
            assert!(
                (g as f64 - w).abs() < 2e-6,
                "[{i}] {g} vs {w} ({isa:?}, {:?}, n_ctx {n_ctx})",
                E::DTYPE
            );
        }
    }

    #[test]
    fn a_window_sees_exactly_its_last_positions() {
        // Gemma 3's geometry (4 query heads over 1 KV head of 256) and a smaller one.
        for (head_dim, n_heads) in [(256, 4), (64, 3)] {
            for isa in paths() {
                window_on::<f32>(isa, head_dim, n_heads);
                window_on::<f16>(isa, head_dim, n_heads);
            }
        }
    }

    /// Windows that start inside a block, on a block boundary, before the first position, and
    /// a tree tail after a windowed direct part: bitwise the attention over just those positions
    /// written from slot 0.
    fn window_on<E: KvElem>(isa: Isa, head_dim: usize, n_heads: usize) {
        let shape = KvShape {
            block_size: 16,
            n_kv_heads: 1,
            head_dim,
        };
        let wave = |t: usize, i: usize, f: f32| ((t * 31 + i * 7) as f32 * f).sin();
        let row = |t: usize, f: f32| (0..head_dim).map(|i| wave(t, i, f)).collect::<Vec<_>>();
        let q: Vec<f32> = (0..n_heads * head_dim).map(|i| wave(99, i, 0.23)).collect();
        for (n, window, tail) in [
            (70usize, 20usize, 0usize),
            (70, 22, 0),
            (64, 32, 0),
            (10, 20, 0),
            (50, 20, 3),
        ] {
            let run = |positions: &[usize], ctx: Context<'_>, slots: usize| {
                let blocks: Vec<u32> = (0..slots.div_ceil(16) as u32).rev().collect();
                let keys: Vec<Vec<f32>> = positions.iter().map(|&t| row(t, 0.37)).collect();
                let values: Vec<Vec<f32>> = positions.iter().map(|&t| row(t, 0.11)).collect();
                stored_attention::<E>(isa, shape, &blocks, (&keys, &values), &q, ctx, 0.0625)
            };
            // The sequence: positions 0..n directly, then a tail of `tail` slots after them
            // (the tree's ancestors: positions n..n+tail).
            let all: Vec<usize> = (0..n + tail).collect();
            let tail_slots: Vec<usize> = (n..n + tail).collect();
            let pos = n + tail - 1;
            let ctx = Context {
                start: 0,
                direct: n,
                tail: &tail_slots,
            }
            .windowed(Some(window), pos);
            let got = run(&all, ctx, n + tail);
            let seen: Vec<usize> = ((pos + 1).saturating_sub(window).min(n)..n + tail).collect();
            assert_eq!(ctx.len(), seen.len());
            let want = run(&seen, Context::causal(seen.len()), seen.len());
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{isa:?}, {:?}, head {head_dim}: {n} positions, window {window}, tail {tail}",
                E::DTYPE
            );
        }
    }

    #[test]
    fn an_f16_store_reads_as_the_f32_store_of_its_values() {
        // Keys and values rounded to f16 once: attention over the f16 store is bitwise the
        // attention over an f32 store of the same values, on every path and partial block.
        let shape = KvShape {
            block_size: 16,
            n_kv_heads: 3,
            head_dim: 64,
        };
        let wave = |t: usize, i: usize, f: f32| ((t * 31 + i * 7) as f32 * f).sin();
        let kvd = shape.token_stride();
        let q: Vec<f32> = (0..9 * 64).map(|i| wave(99, i, 0.23)).collect();
        for n_ctx in [1usize, 9, 16, 45] {
            let rows = |f: f32| -> Vec<Vec<f32>> {
                (0..n_ctx)
                    .map(|t| {
                        (0..kvd)
                            .map(|i| stored::<f16>(wave(t, i, f) * 3.0))
                            .collect()
                    })
                    .collect()
            };
            let (keys, values) = (rows(0.37), rows(0.11));
            let blocks: Vec<u32> = (0..n_ctx.div_ceil(16) as u32).rev().collect();
            for isa in paths() {
                let ctx = Context::causal(n_ctx);
                let half =
                    stored_attention::<f16>(isa, shape, &blocks, (&keys, &values), &q, ctx, 0.125);
                let full =
                    stored_attention::<f32>(isa, shape, &blocks, (&keys, &values), &q, ctx, 0.125);
                assert_eq!(
                    half.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    full.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{isa:?}, {n_ctx} positions"
                );
            }
        }
    }

    /// Rows attended together (a verification's consecutive rows, a prompt's, a draft tree's
    /// nodes over a shared root, windows that start at different slots) give bitwise each
    /// row's result alone, on every path, for both stores.
    #[test]
    fn rows_together_are_bitwise_each_row_alone() {
        for isa in paths() {
            for (head_dim, n_kv_heads, n_heads, block_size) in [
                (64, 3, 9, 16),
                (64, 2, 14, 16),
                (48, 1, 5, 24),
                (16, 2, 4, 16),
            ] {
                let shape = KvShape {
                    block_size,
                    n_kv_heads,
                    head_dim,
                };
                rows_together_on::<f32>(isa, shape, n_heads);
                rows_together_on::<f16>(isa, shape, n_heads);
            }
        }
    }

    fn rows_together_on<E: KvElem>(isa: Isa, shape: KvShape, n_heads: usize) {
        let wave = |t: usize, i: usize, f: f32| ((t * 31 + i * 7) as f32 * f).sin();
        let kvd = shape.token_stride();
        let n_blocks = 12;
        let blocks: Vec<u32> = (0..n_blocks as u32)
            .map(|b| (b * 5) % n_blocks as u32)
            .collect();
        let mut keys = vec![E::default(); n_blocks * shape.block_stride()];
        let mut values = keys.clone();
        for slot in 0..n_blocks * shape.block_size {
            let k: Vec<f32> = (0..kvd).map(|i| wave(slot, i, 0.37)).collect();
            let v: Vec<f32> = (0..kvd).map(|i| wave(slot, i, 0.11) * 2.0).collect();
            write_kv(&mut keys, &mut values, shape, &blocks, slot, &k, &v);
        }
        let tails = [
            vec![100usize],
            vec![100, 101],
            vec![100, 103],
            vec![100, 101, 104],
        ];
        let cases: Vec<Vec<Context<'_>>> = vec![
            // A verification: 5 consecutive rows.
            (60..65).map(Context::causal).collect(),
            // A prompt's rows from the start, and rows across a block boundary.
            (1..9).map(Context::causal).collect(),
            (14..20).map(Context::causal).collect(),
            // A draft tree's nodes over a root at 100.
            tails
                .iter()
                .map(|t| Context {
                    start: 0,
                    direct: 100,
                    tail: t,
                })
                .collect(),
            // Sliding windows: the same start, then starts that differ.
            (60..64)
                .map(|n| Context {
                    start: 40,
                    ..Context::causal(n)
                })
                .collect(),
            (60..64)
                .map(|n| Context::causal(n).windowed(Some(20), n - 1))
                .collect(),
            // One row.
            vec![Context::causal(33)],
        ];
        for contexts in &cases {
            let width = n_heads * shape.head_dim;
            let q: Vec<f32> = (0..contexts.len() * width)
                .map(|i| wave(99, i, 0.23))
                .collect();
            let mut together = vec![0f32; q.len()];
            let scale = 0.125;
            let mut scratch = Vec::new();
            all_heads_on(
                isa,
                &q,
                &keys,
                &values,
                shape,
                &blocks,
                contexts,
                scale,
                &mut together,
                &mut scratch,
            );
            for (r, ctx) in contexts.iter().enumerate() {
                let at = r * width..(r + 1) * width;
                let mut alone = vec![0f32; width];
                paged_attention_on(
                    isa,
                    &q[at.clone()],
                    &keys,
                    &values,
                    shape,
                    &blocks,
                    *ctx,
                    scale,
                    &mut alone,
                    &mut scratch,
                );
                assert!(
                    alone.iter().all(|x| x.is_finite()),
                    "{isa:?}: row {r} of {contexts:?}"
                );
                assert_eq!(
                    together[at].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    alone.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{isa:?}, {:?}, {shape:?}, {n_heads} heads: row {r} of {contexts:?}",
                    E::DTYPE
                );
            }
        }
    }

    #[test]
    fn paged_matches_contiguous_attention() {
        // 2 query heads sharing 1 KV head, head_dim 4, 5 positions over blocks [3, 1] of size 4.
        let shape = KvShape {
            block_size: 4,
            n_kv_heads: 1,
            head_dim: 4,
        };
        check(shape, 2, 5, &[3, 1]);
    }

    #[test]
    fn model_sized_heads_over_partial_blocks() {
        // SmolLM2's geometry: 9 query heads over 3 KV heads of 64; 16-slot and 24-slot blocks.
        for block_size in [16, 24] {
            let shape = KvShape {
                block_size,
                n_kv_heads: 3,
                head_dim: 64,
            };
            for n_ctx in [1usize, 15, 16, 17, 70] {
                let blocks: Vec<u32> = (0..n_ctx.div_ceil(block_size) as u32).rev().collect();
                check(shape, 9, n_ctx, &blocks);
            }
        }
    }

    #[test]
    fn other_head_sizes_and_groups() {
        // Head sizes that fill no whole pass of value registers (48), or are a multiple of 8 but
        // not of 16 (40: AVX2 on an AVX-512 CPU); 5 query heads a KV head (a group of 4, then 1).
        for (head_dim, n_kv_heads, n_heads) in [(48, 2, 10), (40, 1, 5), (16, 2, 4), (6, 1, 3)] {
            let shape = KvShape {
                block_size: 24,
                n_kv_heads,
                head_dim,
            };
            for n_ctx in [1usize, 9, 24, 41] {
                let blocks: Vec<u32> = (0..n_ctx.div_ceil(24) as u32).rev().collect();
                check(shape, n_heads, n_ctx, &blocks);
            }
        }
    }

    /// A draft-tree query over its ancestors in scattered slots gives bitwise the result of the
    /// same keys and values in consecutive slots (what decoding the path would see).
    #[test]
    fn tree_tail_is_bitwise_the_consecutive_context() {
        for isa in paths() {
            for block_size in [16, 24] {
                tree_tail_on::<f32>(isa, block_size);
                tree_tail_on::<f16>(isa, block_size);
            }
        }
    }

    fn tree_tail_on<E: KvElem>(isa: Isa, block_size: usize) {
        let shape = KvShape {
            block_size,
            n_kv_heads: 3,
            head_dim: 64,
        };
        let kvd = shape.token_stride();
        let wave = |t: usize, i: usize, f: f32| ((t * 31 + i * 7) as f32 * f).sin();
        let q: Vec<f32> = (0..9 * 64).map(|i| wave(77, i, 0.19)).collect();
        let scale = 0.125;
        for (direct, tail_at) in [
            (1usize, vec![0usize, 3, 4]),
            (13, vec![0, 1, 5, 9, 17, 18]),
            (
                30,
                vec![
                    0, 2, 3, 8, 11, 12, 13, 14, 19, 20, 22, 24, 25, 26, 28, 29, 31, 33,
                ],
            ),
        ] {
            let n = direct + tail_at.len();
            let blocks: Vec<u32> = (0..8).rev().collect();
            let kv = |t: usize| -> (Vec<f32>, Vec<f32>) {
                (
                    (0..kvd).map(|i| wave(t, i, 0.37)).collect(),
                    (0..kvd).map(|i| wave(t, i, 0.11)).collect(),
                )
            };
            let store = || vec![E::default(); 8 * shape.block_stride()];
            // Consecutive: position t in slot t.
            let (mut ck, mut cv) = (store(), store());
            for t in 0..n {
                let (k, v) = kv(t);
                write_kv(&mut ck, &mut cv, shape, &blocks, t, &k, &v);
            }
            // Tree: the tail's positions in scattered slots after `direct`, other slots noise.
            let (mut tk, mut tv) = (store(), store());
            let noise: Vec<f32> = (0..kvd).map(|i| wave(500, i, 0.7) * 9.0).collect();
            for slot in 0..direct + tail_at.iter().max().unwrap() + 1 {
                write_kv(&mut tk, &mut tv, shape, &blocks, slot, &noise, &noise);
            }
            let slots: Vec<usize> = tail_at.iter().map(|&a| direct + a).collect();
            for t in 0..n {
                let (k, v) = kv(t);
                let slot = if t < direct { t } else { slots[t - direct] };
                write_kv(&mut tk, &mut tv, shape, &blocks, slot, &k, &v);
            }
            let run = |k: &[E], v: &[E], ctx: Context<'_>| {
                let mut out = vec![0.0f32; q.len()];
                paged_attention_on(
                    isa,
                    &q,
                    k,
                    v,
                    shape,
                    &blocks,
                    ctx,
                    scale,
                    &mut out,
                    &mut Vec::new(),
                );
                out
            };
            let want = run(&ck, &cv, Context::causal(n));
            let got = run(
                &tk,
                &tv,
                Context {
                    start: 0,
                    direct,
                    tail: &slots,
                },
            );
            assert_eq!(
                got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{isa:?}, {:?}, blocks of {block_size}: direct {direct}, tail {tail_at:?}",
                E::DTYPE
            );
        }
    }
}
