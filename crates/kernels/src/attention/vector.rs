//! SIMD attention over the paged layout, written once over [`F32s`] and built for AVX-512
//! ([`attention_avx512`], 16 lanes) and AVX2 ([`attention_avx2`], 8 lanes).
//!
//! One KV head at a time, for one or more rows of a sequence (a verification's or a prompt's
//! consecutive rows, a draft tree's nodes) that share the context's start: the query heads of
//! all the rows read the part of the context every row sees (the shared direct part) together,
//! up to four heads a pass, so that part's keys and values are read once for the rows rather
//! than once a row; each row then adds the positions only it sees (its own last direct slots, a
//! tree node's ancestors) alone. Scores are computed a few registers of keys at a time (keys
//! are transposed per block; the registers may come from different blocks), the softmax uses a
//! vector `exp`, and the weighted sum of values is scaled by 1/Σ at the end. Masked loads and
//! stores handle partial chunks, so every position is computed by the same instructions
//! whatever the context length around it. A draft-tree query's ancestors (the context's tail)
//! are copied a register's worth at a time into a transposed scratch chunk, so their scores
//! come from the same multiply-adds as any other key's.
//!
//! How work is grouped (which rows' heads share a pass, how many registers of keys a pass over
//! the dimensions multiplies, how many registers of value dimensions a pass over the positions
//! accumulates, plain loads where a mask is full, a row's sums stored between its shared and
//! its own positions) changes no element's arithmetic: each score is its own chain of
//! multiply-adds over the dimensions in order, each output its own over the row's positions in
//! order, so a row's result is bitwise the same alone or with others.

use super::{KvDtype, KvElem, KvShape, QueryRow};
use crate::simd::{Avx2, Avx512, F32s, WideLoads};

/// Query heads computed together: each pass over the keys and values serves this many.
const MAX_HEADS: usize = 4;

/// Registers of keys a pass over the dimensions multiplies (chunks of `LANES` slots, from one
/// block or several): `G × K` independent chains of multiply-adds hide their latency even for
/// one query head, and all fit in the registers with the keys and a query broadcast.
const fn key_registers<S: F32s>() -> usize {
    if S::REGISTERS >= 32 { 4 } else { 2 }
}

/// [`attention`] with AVX-512: 16 keys a register; up to 28 accumulators of values.
///
/// # Safety
/// The CPU must support AVX-512 F, BW and VL, F16C and FMA; `head_dim` must be a multiple of 16;
/// `kv` and `rows` come from `paged_attention`'s checked arguments.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
pub(super) unsafe fn attention_avx512<E: KvElem>(
    kv: &Kv<'_, E>,
    rows: &mut [QueryRow<'_>],
    scale: f32,
    scratch: &mut Vec<f32>,
) {
    // SAFETY: the caller's contract: the CPU has AVX-512 F and FMA (and BW, VL and F16C, which
    // `WideLoads` needs).
    let s = unsafe { Avx512::new() };
    attention(s, kv, rows, scale, scratch);
}

/// [`attention`] with AVX2: 8 keys a register; up to 12 accumulators of values (of the 16
/// registers), e.g. 2 registers of dimensions × 4 heads or 4 × 3.
///
/// # Safety
/// The CPU must support AVX2, F16C and FMA; `head_dim` must be a multiple of 8; `kv` and `rows`
/// come from `paged_attention`'s checked arguments.
#[target_feature(enable = "avx2,f16c,fma")]
pub(super) unsafe fn attention_avx2<E: KvElem>(
    kv: &Kv<'_, E>,
    rows: &mut [QueryRow<'_>],
    scale: f32,
    scratch: &mut Vec<f32>,
) {
    // SAFETY: the caller's contract: the CPU has AVX2 and FMA (and F16C, which `WideLoads`
    // needs).
    let s = unsafe { Avx2::new() };
    attention(s, kv, rows, scale, scratch);
}

/// One query head of one row, as the passes see it.
#[derive(Clone, Copy)]
struct Head {
    /// Its query (`d` floats).
    q: *const f32,
    /// Its score row: one float a position it sees, in order.
    scores: *mut f32,
    /// Positions it sees.
    n_ctx: usize,
    /// Its output (`d` floats).
    out: *mut f32,
    /// Where its 1/Σ is kept between the softmax and the weighted sum.
    inv: *mut f32,
}

/// The part of the context a pass covers: direct slots `from..to` (score index `slot − start`)
/// and then, for one row alone, its tail (score indices from `tail_t0`).
#[derive(Clone, Copy)]
struct Span<'a> {
    from: usize,
    to: usize,
    start: usize,
    tail: &'a [usize],
    tail_t0: usize,
}

/// The heads of `rows` (one KV head's group each, rows sharing the context's start) over `kv`,
/// into their outputs; `scratch` holds the score rows, a transposed chunk of tail keys and the
/// 1/Σ of every head.
#[inline(always)]
fn attention<S: WideLoads, E: KvElem>(
    s: S,
    kv: &Kv<'_, E>,
    rows: &mut [QueryRow<'_>],
    scale: f32,
    scratch: &mut Vec<f32>,
) {
    let d = kv.shape.head_dim;
    assert!(
        d.is_multiple_of(S::LANES),
        "head_dim must be a multiple of {}",
        S::LANES
    );
    let start = rows[0].ctx.start;
    assert!(rows.iter().all(|r| r.ctx.start == start));
    let common = rows.iter().map(|r| r.ctx.direct).min().unwrap_or(start);
    let n_scores: usize = rows.iter().map(|r| r.q.len() / d * r.ctx.len()).sum();
    let n_heads: usize = rows.iter().map(|r| r.q.len() / d).sum();
    scratch.resize(n_scores + S::LANES * d + n_heads, 0.0);
    let (scores, rest) = scratch.split_at_mut(n_scores);
    let (chunk, invs) = rest.split_at_mut(S::LANES * d);
    let heads = row_heads(rows, d, scores, invs);
    let shared = Span {
        from: start,
        to: common,
        start,
        tail: &[],
        tail_t0: 0,
    };
    for set in heads.chunks(MAX_HEADS) {
        direct_scores(s, kv, set, shared, scale);
    }
    // Every row has one KV head's group of query heads.
    let group = rows[0].q.len() / d;
    for (row, own) in rows.iter().zip(heads.chunks(group)) {
        let span = own_span(row, common);
        for set in own.chunks(MAX_HEADS) {
            direct_scores(s, kv, set, span, scale);
            tail_scores(s, kv, set, span, scale, chunk);
        }
    }
    for h in &heads {
        // SAFETY: `row_heads` points each head at its own score row and 1/Σ in `scratch`.
        unsafe { *h.inv = softmax_row(s, h.scores, h.n_ctx) };
    }
    for set in heads.chunks(MAX_HEADS) {
        weighted_values(s, kv, set, shared, false);
    }
    for (row, own) in rows.iter().zip(heads.chunks(group)) {
        for set in own.chunks(MAX_HEADS) {
            weighted_values(s, kv, set, own_span(row, common), true);
        }
    }
}

/// The positions a row sees beyond the shared direct part `..common`: its own direct slots,
/// then its tail.
fn own_span<'a>(row: &QueryRow<'a>, common: usize) -> Span<'a> {
    Span {
        from: common,
        to: row.ctx.direct,
        start: row.ctx.start,
        tail: row.ctx.tail,
        tail_t0: row.ctx.direct_len(),
    }
}

/// Every head of `rows`, row by row, with its score row (rows of `n_ctx` floats laid out one
/// after another in `scores`) and its 1/Σ slot in `invs`.
fn row_heads(
    rows: &mut [QueryRow<'_>],
    d: usize,
    scores: &mut [f32],
    invs: &mut [f32],
) -> Vec<Head> {
    let mut heads = Vec::with_capacity(invs.len());
    let (mut at, mut h) = (0, 0);
    for row in rows.iter_mut() {
        let n_ctx = row.ctx.len();
        for g in 0..row.q.len() / d {
            heads.push(Head {
                q: row.q[g * d..(g + 1) * d].as_ptr(),
                scores: scores[at..at + n_ctx].as_mut_ptr(),
                n_ctx,
                out: row.out[g * d..(g + 1) * d].as_mut_ptr(),
                inv: &mut invs[h],
            });
            at += n_ctx;
            h += 1;
        }
    }
    heads
}

/// One KV head's keys and values.
pub(super) struct Kv<'a, E> {
    keys: &'a [E],
    values: &'a [E],
    shape: KvShape,
    blocks: &'a [u32],
    kvh: usize,
}

impl<'a, E: KvElem> Kv<'a, E> {
    /// Checks what the kernels' unchecked reads rely on: the KV head exists and every block
    /// the rows' contexts use lies inside both stores.
    pub(super) fn new(
        keys: &'a [E],
        values: &'a [E],
        shape: KvShape,
        blocks: &'a [u32],
        rows: &[QueryRow<'_>],
        kvh: usize,
    ) -> Self {
        assert!(
            kvh < shape.n_kv_heads,
            "KV head {kvh} of {}",
            shape.n_kv_heads
        );
        let stride = shape.block_stride();
        for ctx in rows.iter().map(|r| r.ctx) {
            assert!(
                ctx.start <= ctx.direct,
                "a window that starts after its end"
            );
            let used = ctx.start / shape.block_size..ctx.slot_end().div_ceil(shape.block_size);
            for &b in &blocks[used] {
                assert!(
                    (b as usize + 1) * stride <= keys.len().min(values.len()),
                    "block {b} outside the KV store"
                );
            }
        }
        Self {
            keys,
            values,
            shape,
            blocks,
            kvh,
        }
    }

    /// For each block of the direct slots `span.from..span.to`: the score index of its slot 0
    /// (it may lie before the span: only slots `first..end` are seen), its start in the store,
    /// and the slots `first..end` in the span.
    fn blocks(&self, span: Span<'_>) -> impl Iterator<Item = Block> + '_ {
        let bs = self.shape.block_size;
        let (from, to) = (span.from, span.to.max(span.from));
        let last = to.div_ceil(bs);
        let stride = self.shape.block_stride();
        (from / bs..last).map(move |i| Block {
            t0: (i * bs).wrapping_sub(span.start),
            base: self.blocks[i] as usize * stride,
            next: (i + 1 < last).then(|| self.blocks[i + 1] as usize * stride),
            first: from.saturating_sub(i * bs),
            end: (to - i * bs).min(bs),
        })
    }

    /// Where slot `slot`'s block starts in the store, and the slot's index in it.
    fn locate(&self, slot: usize) -> (usize, usize) {
        self.shape.locate(self.blocks, slot)
    }
}

/// One KV block of a span's direct slots (see [`Kv::blocks`]).
struct Block {
    /// Score index of the block's slot 0 (wrapping: slot 0 may precede the span's start).
    t0: usize,
    /// Where the block starts in the store.
    base: usize,
    /// Where the span's next block starts, if it has one (read ahead while this one is).
    next: Option<usize>,
    /// The slots seen: `first..end`.
    first: usize,
    end: usize,
}

/// A register's worth of keys: `lanes` slots from `keys` (dimension `i` at `i × stride`),
/// scores at index `t..` of the heads' rows.
#[derive(Clone, Copy)]
struct Chunk<E> {
    keys: *const E,
    lanes: usize,
    t: usize,
}

/// Scores (× `scale`) of the span's direct slots into the heads' score rows, up to
/// [`key_registers`] chunks of `LANES` slots at a time (from one block or several).
#[inline(always)]
fn direct_scores<S: WideLoads, E: KvElem>(
    s: S,
    kv: &Kv<'_, E>,
    heads: &[Head],
    span: Span<'_>,
    scale: f32,
) {
    let (d, bs, l) = (kv.shape.head_dim, kv.shape.block_size, S::LANES);
    let k_max = key_registers::<S>();
    let none = Chunk {
        keys: kv.keys.as_ptr(),
        lanes: 0,
        t: 0,
    };
    // Chunks in order, two groups at a time: a group's keys are scored while the next
    // group's are read ahead.
    let mut chunks = [none; 8];
    let mut n = 0;
    for b in kv.blocks(span) {
        let mut c = b.first;
        while c < b.end {
            chunks[n] = Chunk {
                keys: kv.keys[b.base + kv.kvh * d * bs + c..].as_ptr(),
                lanes: (b.end - c).min(l),
                t: b.t0.wrapping_add(c),
            };
            n += 1;
            c += l;
            if n == 2 * k_max {
                score_chunks(s, heads, &chunks[..k_max], &chunks[k_max..n], d, bs, scale);
                chunks.copy_within(k_max..n, 0);
                n = k_max;
            }
        }
    }
    let first = n.min(k_max);
    score_chunks(s, heads, &chunks[..first], &chunks[first..n], d, bs, scale);
    if n > first {
        score_chunks(s, heads, &chunks[first..n], &[], d, bs, scale);
    }
}

/// Scores (× `scale`) of a row's tail (a draft tree's ancestors, in scattered slots) after its
/// direct part's, its keys gathered a register's worth of slots at a time into `chunk`
/// (`[dim][lane]`, `LANES × d` long).
#[inline(always)]
fn tail_scores<S: WideLoads, E: KvElem>(
    s: S,
    kv: &Kv<'_, E>,
    heads: &[Head],
    span: Span<'_>,
    scale: f32,
    chunk: &mut [f32],
) {
    let (d, bs, l) = (kv.shape.head_dim, kv.shape.block_size, S::LANES);
    assert!(chunk.len() >= l * d);
    let tail = span.tail;
    for c in (0..tail.len()).step_by(l) {
        let lanes = (tail.len() - c).min(l);
        for (j, &slot) in tail[c..c + lanes].iter().enumerate() {
            let (base, at) = kv.locate(slot);
            let key = &kv.keys[base + kv.kvh * d * bs + at..];
            for i in 0..d {
                // SAFETY: `i × l + j < l × d ≤ chunk.len()`; `Kv::new` checked the slot's block
                // lies inside the key store, so dimension `i` of head kvh at `i × bs` is in it.
                unsafe { *chunk.get_unchecked_mut(i * l + j) = key.get_unchecked(i * bs).to_f32() };
            }
        }
        let gathered = Chunk {
            keys: chunk.as_ptr(),
            lanes,
            t: span.tail_t0 + c,
        };
        score_chunks(s, heads, &[gathered], &[], d, l, scale);
    }
}

/// Scores of `chunks` (0 to 4, dimension `i` at `i × stride` from each) for `heads` (1 to
/// [`MAX_HEADS`]), reading the keys of `ahead` (the chunks that come next, as many or fewer)
/// into the cache meanwhile.
#[inline(always)]
fn score_chunks<S: WideLoads, E: KvElem>(
    s: S,
    heads: &[Head],
    chunks: &[Chunk<E>],
    ahead: &[Chunk<E>],
    d: usize,
    stride: usize,
    scale: f32,
) {
    let Some(first) = chunks.first() else {
        return;
    };
    // A chunk with nothing after it reads its own keys ahead (they are in the cache by then).
    let ahead = std::array::from_fn(|k| ahead.get(k).or(chunks.get(k)).unwrap_or(first).keys);
    match heads.len() {
        1 => score_chunks_g::<S, E, 1>(s, heads, chunks, ahead, d, stride, scale),
        2 => score_chunks_g::<S, E, 2>(s, heads, chunks, ahead, d, stride, scale),
        3 => score_chunks_g::<S, E, 3>(s, heads, chunks, ahead, d, stride, scale),
        _ => score_chunks_g::<S, E, 4>(s, heads, chunks, ahead, d, stride, scale),
    }
}

/// [`score_chunks`] for `G` heads.
#[inline(always)]
fn score_chunks_g<S: WideLoads, E: KvElem, const G: usize>(
    s: S,
    heads: &[Head],
    chunks: &[Chunk<E>],
    ahead: [*const E; 4],
    d: usize,
    stride: usize,
    scale: f32,
) {
    match chunks.len() {
        1 => score_chunks_k::<S, E, G, 1>(s, heads, chunks, ahead, d, stride, scale),
        2 => score_chunks_k::<S, E, G, 2>(s, heads, chunks, ahead, d, stride, scale),
        3 => score_chunks_k::<S, E, G, 3>(s, heads, chunks, ahead, d, stride, scale),
        _ => score_chunks_k::<S, E, G, 4>(s, heads, chunks, ahead, d, stride, scale),
    }
}

/// [`score_chunks`] for `G` heads and `K` chunks.
#[inline(always)]
fn score_chunks_k<S: WideLoads, E: KvElem, const G: usize, const K: usize>(
    s: S,
    heads: &[Head],
    chunks: &[Chunk<E>],
    ahead: [*const E; 4],
    d: usize,
    stride: usize,
    scale: f32,
) {
    assert!(heads.len() == G && chunks.len() == K && G <= MAX_HEADS);
    let q: [*const f32; G] = std::array::from_fn(|h| heads[h].q);
    let keys: [*const E; K] = std::array::from_fn(|k| chunks[k].keys);
    let m: [S::M; K] = std::array::from_fn(|k| s.mask(chunks[k].lanes));
    // SAFETY: each chunk's lanes are slots of a block `Kv::new` checked (or of the gathered
    // chunk), dimension `i` at `i × stride`; each head's query is `d` floats and its score row
    // holds the chunk's positions `t..t + lanes` (they are positions the head's row sees).
    unsafe {
        let ahead = std::array::from_fn(|k| ahead[k]);
        let dots = dots::<S, E, G, K>(s, q, d, keys, ahead, stride, m);
        for (h, dots) in heads.iter().zip(&dots) {
            for ((c, &dot), &m) in chunks.iter().zip(dots).zip(&m) {
                s.store(h.scores.add(c.t), m, s.mul(dot, s.splat(scale)));
            }
        }
    }
}

/// The `G` heads' dot products with `K` registers of keys (lanes past `m[k]` zero), dimension
/// `i` of register `k`'s keys at `keys[k] + i × stride`; the same rows of `ahead` are read into
/// the cache.
///
/// # Safety
/// Lanes `m[k]` of `keys[k] + i × stride ..+ LANES` are readable for every `i < d`, and every
/// `q[h]` points at `d` floats.
#[inline(always)]
unsafe fn dots<S: WideLoads, E: KvElem, const G: usize, const K: usize>(
    s: S,
    q: [*const f32; G],
    d: usize,
    keys: [*const E; K],
    ahead: [*const E; K],
    stride: usize,
    m: [S::M; K],
) -> [[S::V; K]; G] {
    // SAFETY: the caller's contract.
    unsafe {
        if m.iter().all(|&m| s.is_full(m)) {
            dots_loop::<S, E, G, K, true>(s, q, d, keys, ahead, stride, m)
        } else {
            dots_loop::<S, E, G, K, false>(s, q, d, keys, ahead, stride, m)
        }
    }
}

/// [`dots`], with plain loads where `FULL` (every mask full): the same values, fewer
/// instructions.
///
/// # Safety
/// [`dots`]'s contract.
#[inline(always)]
unsafe fn dots_loop<S: WideLoads, E: KvElem, const G: usize, const K: usize, const FULL: bool>(
    s: S,
    q: [*const f32; G],
    d: usize,
    keys: [*const E; K],
    ahead: [*const E; K],
    stride: usize,
    m: [S::M; K],
) -> [[S::V; K]; G] {
    let mut acc = [[s.zero(); K]; G];
    for i in 0..d {
        for &a in &ahead {
            prefetch(a.wrapping_add(i * stride));
        }
        let mut k = [s.zero(); K];
        for (j, k) in k.iter_mut().enumerate() {
            let p = keys[j].wrapping_add(i * stride);
            // SAFETY: the caller's contract.
            *k = unsafe {
                if FULL {
                    load_all(s, p)
                } else {
                    load(s, m[j], p)
                }
            };
        }
        for (acc, &q) in acc.iter_mut().zip(&q) {
            // SAFETY: `i < d`, inside the head's query (the caller's contract).
            let qh = s.splat(unsafe { *q.add(i) });
            for (a, &k) in acc.iter_mut().zip(&k) {
                *a = s.fmadd(qh, k, *a);
            }
        }
    }
    acc
}

/// Softmax numerators in place over a score row of `n` floats at `row`; returns 1/Σ, kept for
/// the end.
///
/// # Safety
/// `row..row + n` is readable and writable.
#[inline(always)]
unsafe fn softmax_row<S: F32s>(s: S, row: *mut f32, n: usize) -> f32 {
    // SAFETY: the caller's contract; loads and stores are masked past `n`.
    unsafe {
        let mut vmax = s.splat(f32::NEG_INFINITY);
        for c in (0..n).step_by(S::LANES) {
            let m = s.mask(n - c);
            vmax = s.max_masked(vmax, m, s.load(m, row.add(c)));
        }
        let max = s.splat(s.reduce_max(vmax));
        let mut vsum = s.zero();
        for c in (0..n).step_by(S::LANES) {
            let m = s.mask(n - c);
            let e = s.exp(s.sub(s.load(m, row.add(c)), max));
            s.store(row.add(c), m, e);
            vsum = s.add_masked(vsum, m, e);
        }
        1.0 / s.reduce_add(vsum)
    }
}

/// The heads' softmax numerators times the values of `span`'s positions, added to each head's
/// output: from zero, or (`resume`) from the sums a shared span left in the output, and then
/// scaled by the head's 1/Σ. Passes over the positions of 8, 4, 2 or 1 registers of dimensions:
/// the widest whose `G ×` accumulators leave four registers free (enough independent
/// multiply-adds to hide their latency, none spilled), then narrower ones for what is left.
#[inline(always)]
fn weighted_values<S: WideLoads, E: KvElem>(
    s: S,
    kv: &Kv<'_, E>,
    heads: &[Head],
    span: Span<'_>,
    resume: bool,
) {
    match heads.len() {
        1 => weighted_values_g::<S, E, 1>(s, kv, heads, span, resume),
        2 => weighted_values_g::<S, E, 2>(s, kv, heads, span, resume),
        3 => weighted_values_g::<S, E, 3>(s, kv, heads, span, resume),
        _ => weighted_values_g::<S, E, 4>(s, kv, heads, span, resume),
    }
}

/// [`weighted_values`] for `G` heads.
#[inline(always)]
fn weighted_values_g<S: WideLoads, E: KvElem, const G: usize>(
    s: S,
    kv: &Kv<'_, E>,
    heads: &[Head],
    span: Span<'_>,
    resume: bool,
) {
    assert!(heads.len() == G && G <= MAX_HEADS);
    let heads: [Head; G] = std::array::from_fn(|h| heads[h]);
    let widest = (S::REGISTERS - 4) / G;
    let mut dc = 0;
    // SAFETY: every head's score row holds the positions of `span` and its output `d` floats
    // (`row_heads`).
    unsafe {
        if widest >= 8 {
            dc = value_passes::<S, E, G, 8>(s, kv, &heads, span, resume, dc);
        }
        if widest >= 4 {
            dc = value_passes::<S, E, G, 4>(s, kv, &heads, span, resume, dc);
        }
        if widest >= 2 {
            dc = value_passes::<S, E, G, 2>(s, kv, &heads, span, resume, dc);
        }
        value_passes::<S, E, G, 1>(s, kv, &heads, span, resume, dc);
    }
}

/// Passes of `NV` registers of dimensions from `dc` while they fit in `d`; returns where they
/// stopped.
///
/// # Safety
/// Every head's score row holds the positions of `span`, and its output is `d` floats.
#[inline(always)]
unsafe fn value_passes<S: WideLoads, E: KvElem, const G: usize, const NV: usize>(
    s: S,
    kv: &Kv<'_, E>,
    heads: &[Head; G],
    span: Span<'_>,
    resume: bool,
    mut dc: usize,
) -> usize {
    while dc + NV * S::LANES <= kv.shape.head_dim {
        // SAFETY: `dc + NV × LANES ≤ d`; the rest is the caller's contract.
        unsafe { value_pass::<S, E, G, NV>(s, kv, heads, span, resume, dc) };
        dc += NV * S::LANES;
    }
    dc
}

/// Dimensions `dc..dc + NV × LANES` of [`weighted_values`].
///
/// # Safety
/// `dc + NV × LANES ≤ d`; every head's score row holds the positions of `span`, and its output
/// is `d` floats.
#[inline(always)]
unsafe fn value_pass<S: WideLoads, E: KvElem, const G: usize, const NV: usize>(
    s: S,
    kv: &Kv<'_, E>,
    heads: &[Head; G],
    span: Span<'_>,
    resume: bool,
    dc: usize,
) {
    let (d, l) = (kv.shape.head_dim, S::LANES);
    let (values, stride) = (kv.values.as_ptr(), kv.shape.token_stride());
    let p: [*const f32; G] = std::array::from_fn(|h| heads[h].scores.cast_const());
    // SAFETY: `Kv::new` checked every used block lies inside the value store; the reads are
    // `NV × LANES` floats of head kvh's row of a slot in use (`dc + NV × LANES ≤ d`); score reads
    // are inside the heads' rows and the loads and stores of sums inside their outputs (the
    // caller's contract).
    unsafe {
        let mut acc = [[s.zero(); NV]; G];
        if resume {
            for (acc, h) in acc.iter_mut().zip(heads) {
                for (j, a) in acc.iter_mut().enumerate() {
                    *a = s.load_all(h.out.add(dc + l * j));
                }
            }
        }
        let row_bytes = NV * l * size_of::<E>();
        for b in kv.blocks(span) {
            for slot in b.first..b.end {
                if let Some(next) = b.next {
                    let ahead = values.wrapping_add(next + slot * stride + kv.kvh * d + dc);
                    for byte in (0..row_bytes).step_by(64) {
                        prefetch(ahead.cast::<u8>().wrapping_add(byte));
                    }
                }
                let v = values.add(b.base + slot * stride + kv.kvh * d + dc);
                accumulate::<S, E, G, NV>(s, &mut acc, &p, b.t0.wrapping_add(slot), v);
            }
        }
        for (i, &slot) in span.tail.iter().enumerate() {
            let (base, slot) = kv.locate(slot);
            let v = values.add(base + slot * stride + kv.kvh * d + dc);
            accumulate::<S, E, G, NV>(s, &mut acc, &p, span.tail_t0 + i, v);
        }
        for (acc, h) in acc.iter().zip(heads) {
            let inv = s.splat(if resume { *h.inv } else { 1.0 });
            for (j, &a) in acc.iter().enumerate() {
                let sum = if resume { s.mul(a, inv) } else { a };
                s.store_all(h.out.add(dc + l * j), sum);
            }
        }
    }
}

/// `acc[h][j] += p[h][t] · v[j × LANES ..+ LANES]` for each head `h` and `j < NV`: one
/// position's value row into the heads' accumulators.
///
/// # Safety
/// `p[h] + t` is readable for `h < G`, and `v ..+ NV × LANES` is readable.
#[inline(always)]
unsafe fn accumulate<S: WideLoads, E: KvElem, const G: usize, const NV: usize>(
    s: S,
    acc: &mut [[S::V; NV]; G],
    p: &[*const f32; G],
    t: usize,
    v: *const E,
) {
    for j in 0..NV {
        // SAFETY: the caller's contract.
        let vj = unsafe { load_all(s, v.add(S::LANES * j)) };
        for (acc, &p) in acc.iter_mut().zip(p) {
            // SAFETY: the caller's contract.
            let p = s.splat(unsafe { *p.add(t) });
            acc[j] = s.fmadd(p, vj, acc[j]);
        }
    }
}

/// Asks for the cache line holding `p` (no fault whatever `p` is).
#[inline(always)]
fn prefetch<T>(p: *const T) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    // SAFETY: a prefetch reads nothing the program sees and never faults; SSE is baseline on
    // x86_64.
    #[allow(unused_unsafe)]
    unsafe {
        _mm_prefetch::<_MM_HINT_T0>(p.cast())
    };
}

/// Lanes `m` of the elements at `p..p + LANES` as f32, the others zero.
///
/// # Safety
/// Lanes `m` of `p..p + LANES` are readable.
#[inline(always)]
unsafe fn load<S: WideLoads, E: KvElem>(s: S, m: S::M, p: *const E) -> S::V {
    // SAFETY: `E::DTYPE` names `E` (the trait is sealed to f32 and f16); the caller's contract.
    unsafe {
        match E::DTYPE {
            KvDtype::F32 => s.load(m, p.cast()),
            KvDtype::F16 => s.load_f16(m, p.cast()),
        }
    }
}

/// The elements at `p..p + LANES` as f32.
///
/// # Safety
/// `p..p + LANES` is readable.
#[inline(always)]
unsafe fn load_all<S: WideLoads, E: KvElem>(s: S, p: *const E) -> S::V {
    // SAFETY: as for `load`.
    unsafe {
        match E::DTYPE {
            KvDtype::F32 => s.load_all(p.cast()),
            KvDtype::F16 => s.load_all_f16(p.cast()),
        }
    }
}
