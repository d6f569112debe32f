//! SIMD attention over the paged layout, written once over [`F32s`] and built for AVX-512
//! ([`attention_avx512`], 16 lanes) and AVX2 ([`attention_avx2`], 8 lanes).
//!
//! One KV head's group of query heads at a time: the query heads that share the KV head (up to
//! four at a time) read each key and value once. Scores are a register of keys at a time (keys
//! are transposed per block), the softmax uses a vector `exp`, and the weighted sum of values is
//! scaled by 1/Σ at the end. Masked loads and stores handle partial chunks, so every position is
//! computed by the same instructions whatever the context length around it. A draft-tree
//! query's ancestors (the context's tail) are copied a register's worth at a time into a
//! transposed scratch chunk, so their scores come from the same multiply-adds as any other key's.
//!
//! How work is grouped into registers (one or two registers of keys per pass over the
//! dimensions, one to eight registers of value dimensions per pass over the positions, plain
//! loads where a mask is full) changes no element's arithmetic: each score is its own chain of
//! multiply-adds over the dimensions in order, each output its own over the positions in order.

use super::{Context, KvDtype, KvElem, KvShape};
use crate::simd::{Avx2, Avx512, F32s, WideLoads};

/// Query heads computed together.
const MAX_HEADS: usize = 4;

/// [`attention`] with AVX-512: 16 keys a register; up to 28 accumulators of values.
///
/// # Safety
/// The CPU must support AVX-512 F, BW and VL, F16C and FMA; `head_dim` must be a multiple of 16;
/// `kv` and `q` come from `paged_attention`'s checked arguments.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
pub(super) unsafe fn attention_avx512<E: KvElem>(
    kv: &Kv<'_, E>,
    q: &[f32],
    scale: f32,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    // SAFETY: the caller's contract: the CPU has AVX-512 F and FMA (and BW, VL and F16C, which
    // `WideLoads` needs).
    let s = unsafe { Avx512::new() };
    attention(s, q, kv, scale, out, scores);
}

/// [`attention`] with AVX2: 8 keys a register; up to 12 accumulators of values (of the 16
/// registers), e.g. 2 registers of dimensions × 4 heads or 4 × 3.
///
/// # Safety
/// The CPU must support AVX2, F16C and FMA; `head_dim` must be a multiple of 8; `kv` and `q`
/// come from `paged_attention`'s checked arguments.
#[target_feature(enable = "avx2,f16c,fma")]
pub(super) unsafe fn attention_avx2<E: KvElem>(
    kv: &Kv<'_, E>,
    q: &[f32],
    scale: f32,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    // SAFETY: the caller's contract: the CPU has AVX2 and FMA (and F16C, which `WideLoads`
    // needs).
    let s = unsafe { Avx2::new() };
    attention(s, q, kv, scale, out, scores);
}

/// The heads of `q` (one KV head's group) over `kv`, into `out`; `scores` is scratch.
#[inline(always)]
fn attention<S: WideLoads, E: KvElem>(
    s: S,
    q: &[f32],
    kv: &Kv<'_, E>,
    scale: f32,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let d = kv.shape.head_dim;
    assert!(
        d.is_multiple_of(S::LANES),
        "head_dim must be a multiple of {}",
        S::LANES
    );
    let group = q.len() / d;
    // Score rows, then (for a tree query) one transposed chunk of a register of tail keys.
    let n_ctx = kv.ctx.len();
    let chunk = if kv.ctx.tail.is_empty() {
        0
    } else {
        S::LANES * d
    };
    scores.resize(MAX_HEADS * n_ctx + chunk, 0.0);
    let mut h = 0;
    while h < group {
        let take = (group - h).min(MAX_HEADS);
        let (q, out) = (&q[h * d..(h + take) * d], &mut out[h * d..(h + take) * d]);
        match take {
            1 => heads::<S, E, 1>(s, q, kv, scale, out, scores),
            2 => heads::<S, E, 2>(s, q, kv, scale, out, scores),
            3 => heads::<S, E, 3>(s, q, kv, scale, out, scores),
            _ => heads::<S, E, 4>(s, q, kv, scale, out, scores),
        }
        h += take;
    }
}

/// One KV head's keys and values over a sequence's context.
pub(super) struct Kv<'a, E> {
    keys: &'a [E],
    values: &'a [E],
    shape: KvShape,
    blocks: &'a [u32],
    ctx: Context<'a>,
    kvh: usize,
}

impl<'a, E: KvElem> Kv<'a, E> {
    /// Checks what the kernels' unchecked reads rely on: the KV head exists and every block the
    /// context uses lies inside both stores.
    pub(super) fn new(
        keys: &'a [E],
        values: &'a [E],
        shape: KvShape,
        blocks: &'a [u32],
        ctx: Context<'a>,
        kvh: usize,
    ) -> Self {
        assert!(
            kvh < shape.n_kv_heads,
            "KV head {kvh} of {}",
            shape.n_kv_heads
        );
        let stride = shape.block_stride();
        assert!(
            ctx.start <= ctx.direct,
            "a window that starts after its end"
        );
        for &b in &blocks[ctx.start / shape.block_size..ctx.slot_end().div_ceil(shape.block_size)] {
            assert!(
                (b as usize + 1) * stride <= keys.len().min(values.len()),
                "block {b} outside the KV store"
            );
        }
        Self {
            keys,
            values,
            shape,
            blocks,
            ctx,
            kvh,
        }
    }

    /// For each block of the context's direct part: the score index of its slot 0 (it may
    /// lie before the window: only slots `first..end` are seen), its start in the store, and
    /// the slots `first..end` in use.
    fn blocks(&self) -> impl Iterator<Item = Block> + '_ {
        let (bs, start, direct) = (self.shape.block_size, self.ctx.start, self.ctx.direct);
        (start / bs..direct.div_ceil(bs)).map(move |i| Block {
            t0: (i * bs).wrapping_sub(start),
            base: self.blocks[i] as usize * self.shape.block_stride(),
            first: start.saturating_sub(i * bs),
            end: (direct - i * bs).min(bs),
        })
    }

    /// Where slot `slot`'s block starts in the store, and the slot's index in it.
    fn locate(&self, slot: usize) -> (usize, usize) {
        self.shape.locate(self.blocks, slot)
    }
}

/// Attention for `G` query heads of one KV head: scores, softmax, weighted sum of values.
#[inline(always)]
fn heads<S: WideLoads, E: KvElem, const G: usize>(
    s: S,
    q: &[f32],
    kv: &Kv<'_, E>,
    scale: f32,
    out: &mut [f32],
    scores: &mut [f32],
) {
    let n_ctx = kv.ctx.len();
    let (scores, chunk) = scores.split_at_mut(MAX_HEADS * n_ctx);
    direct_scores::<S, E, G>(s, q, kv, scale, scores);
    tail_scores::<S, E, G>(s, q, kv, scale, scores, chunk);
    let inv = softmax_rows::<S, G>(s, scores, n_ctx);
    weighted_values::<S, E, G>(s, kv, scores, &inv, out);
}

/// One KV block of a context's direct part (see [`Kv::blocks`]).
struct Block {
    /// Score index of the block's slot 0 (wrapping: slot 0 may precede the window).
    t0: usize,
    /// Where the block starts in the store.
    base: usize,
    /// The slots seen: `first..end`.
    first: usize,
    end: usize,
}

/// Scores (× `scale`) of the context's direct part into the heads' score rows (`n_ctx` long
/// each, in `scores`), two registers of keys at a time while a block has more than one left.
#[inline(always)]
fn direct_scores<S: WideLoads, E: KvElem, const G: usize>(
    s: S,
    q: &[f32],
    kv: &Kv<'_, E>,
    scale: f32,
    scores: &mut [f32],
) {
    let (d, n_ctx, bs, l) = (
        kv.shape.head_dim,
        kv.ctx.len(),
        kv.shape.block_size,
        S::LANES,
    );
    debug_assert!(G <= MAX_HEADS && scores.len() >= G * n_ctx);
    let rows = scores.as_mut_ptr();
    for Block {
        t0,
        base,
        first,
        end: used,
    } in kv.blocks()
    {
        let mut c = first;
        while c < used {
            // SAFETY: `Kv::new` checked every used block lies inside the key store; the reads
            // are head kvh's rows of block `base..base + stride` (dimension `i` at `i × bs`),
            // lanes `c..` masked past `used`; positions `t0 + c..` of the score rows lie within
            // `n_ctx` (`c ≥ first`: at or after the window's start), masked the same.
            unsafe {
                let (keys, row) = (
                    kv.keys.as_ptr().add(base + kv.kvh * d * bs + c),
                    rows.add(t0.wrapping_add(c)),
                );
                if used - c > l {
                    let m = [s.mask(used - c), s.mask(used - c - l)];
                    let dots = dots::<S, E, G, 2>(s, q, d, keys, bs, m);
                    store_scores::<S, G, 2>(s, &dots, row, n_ctx, m, scale);
                    c += 2 * l;
                } else {
                    let m = [s.mask(used - c)];
                    let dots = dots::<S, E, G, 1>(s, q, d, keys, bs, m);
                    store_scores::<S, G, 1>(s, &dots, row, n_ctx, m, scale);
                    c += l;
                }
            }
        }
    }
}

/// Scores (× `scale`) of the context's tail (a draft tree's ancestors, in scattered slots) after
/// the direct part's, its keys gathered a register's worth of slots at a time into `chunk`
/// (`[dim][lane]`, `LANES × d` long when there is a tail).
#[inline(always)]
fn tail_scores<S: WideLoads, E: KvElem, const G: usize>(
    s: S,
    q: &[f32],
    kv: &Kv<'_, E>,
    scale: f32,
    scores: &mut [f32],
    chunk: &mut [f32],
) {
    let (d, n_ctx, bs, l) = (
        kv.shape.head_dim,
        kv.ctx.len(),
        kv.shape.block_size,
        S::LANES,
    );
    let (direct, tail) = (kv.ctx.direct_len(), kv.ctx.tail);
    debug_assert!(G <= MAX_HEADS && scores.len() >= G * n_ctx);
    for c in (0..tail.len()).step_by(l) {
        let lanes = (tail.len() - c).min(l);
        for (j, &slot) in tail[c..c + lanes].iter().enumerate() {
            let (base, at) = kv.locate(slot);
            // SAFETY: `Kv::new` checked the slot's block lies inside the key store; the reads
            // are head kvh's dimensions of slot `at` in it; `chunk` is `LANES × d` long.
            unsafe {
                let key = kv.keys.as_ptr().add(base + kv.kvh * d * bs + at);
                for i in 0..d {
                    *chunk.get_unchecked_mut(i * l + j) = (*key.add(i * bs)).to_f32();
                }
            }
        }
        let m = [s.mask(lanes)];
        // SAFETY: `chunk` holds `LANES × d` floats (rows of LANES, masked past `lanes`);
        // positions `direct + c..` of the score rows lie within `n_ctx`, masked.
        unsafe {
            let dots = dots::<S, f32, G, 1>(s, q, d, chunk.as_ptr(), l, m);
            let row = scores.as_mut_ptr().add(direct + c);
            store_scores::<S, G, 1>(s, &dots, row, n_ctx, m, scale);
        }
    }
}

/// The `G` heads' dot products with `K` registers of keys (lanes past `m[k]` zero), dimension
/// `i` of register `k`'s keys at `keys + i × stride + k × LANES`.
///
/// # Safety
/// Lanes `m[k]` of `keys + i × stride + k × LANES ..+ LANES` are readable for every `i < d`.
#[inline(always)]
unsafe fn dots<S: WideLoads, E: KvElem, const G: usize, const K: usize>(
    s: S,
    q: &[f32],
    d: usize,
    keys: *const E,
    stride: usize,
    m: [S::M; K],
) -> [[S::V; K]; G] {
    assert!(q.len() >= G * d);
    // SAFETY: the caller's contract, and `q` holds `G × d` (asserted).
    unsafe {
        if m.iter().all(|&m| s.is_full(m)) {
            dots_loop::<S, E, G, K, true>(s, q, d, keys, stride, m)
        } else {
            dots_loop::<S, E, G, K, false>(s, q, d, keys, stride, m)
        }
    }
}

/// [`dots`], with plain loads where `FULL` (every mask full): the same values, fewer
/// instructions.
///
/// # Safety
/// [`dots`]'s contract, and `q` holds `G × d`.
#[inline(always)]
unsafe fn dots_loop<S: WideLoads, E: KvElem, const G: usize, const K: usize, const FULL: bool>(
    s: S,
    q: &[f32],
    d: usize,
    keys: *const E,
    stride: usize,
    m: [S::M; K],
) -> [[S::V; K]; G] {
    let mut acc = [[s.zero(); K]; G];
    for i in 0..d {
        let mut k = [s.zero(); K];
        for (j, k) in k.iter_mut().enumerate() {
            let p = keys.wrapping_add(i * stride + j * S::LANES);
            // SAFETY: the caller's contract.
            *k = unsafe {
                if FULL {
                    load_all(s, p)
                } else {
                    load(s, m[j], p)
                }
            };
        }
        for (h, acc) in acc.iter_mut().enumerate() {
            // SAFETY: `h × d + i < G × d`, inside `q` (the caller's contract).
            let qh = s.splat(unsafe { *q.get_unchecked(h * d + i) });
            for (a, &k) in acc.iter_mut().zip(&k) {
                *a = s.fmadd(qh, k, *a);
            }
        }
    }
    acc
}

/// Stores lanes `m[k]` of `dots[h][k] × scale` at `row + h × n_ctx + k × LANES` for each head
/// `h`.
///
/// # Safety
/// Lanes `m[k]` of `row + h × n_ctx + k × LANES ..+ LANES` are writable for every `h < G`.
#[inline(always)]
unsafe fn store_scores<S: F32s, const G: usize, const K: usize>(
    s: S,
    dots: &[[S::V; K]; G],
    row: *mut f32,
    n_ctx: usize,
    m: [S::M; K],
    scale: f32,
) {
    for (h, dots) in dots.iter().enumerate() {
        for (k, &dot) in dots.iter().enumerate() {
            let at = h * n_ctx + k * S::LANES;
            // SAFETY: the caller's contract.
            unsafe { s.store(row.add(at), m[k], s.mul(dot, s.splat(scale))) };
        }
    }
}

/// Softmax numerators in place over each head's score row (`n_ctx` long, in `scores`); returns
/// each row's 1/Σ, kept for the end.
#[inline(always)]
fn softmax_rows<S: F32s, const G: usize>(s: S, scores: &mut [f32], n_ctx: usize) -> [f32; G] {
    assert!(G <= MAX_HEADS && scores.len() >= G * n_ctx);
    let mut inv = [0.0f32; G];
    for (h, inv) in inv.iter_mut().enumerate() {
        // SAFETY: row `h` is `n_ctx` floats inside `scores` (asserted); loads and stores are
        // masked past `n_ctx`.
        unsafe {
            let row = scores.as_mut_ptr().add(h * n_ctx);
            let mut vmax = s.splat(f32::NEG_INFINITY);
            for c in (0..n_ctx).step_by(S::LANES) {
                let m = s.mask(n_ctx - c);
                vmax = s.max_masked(vmax, m, s.load(m, row.add(c)));
            }
            let max = s.splat(s.reduce_max(vmax));
            let mut vsum = s.zero();
            for c in (0..n_ctx).step_by(S::LANES) {
                let m = s.mask(n_ctx - c);
                let e = s.exp(s.sub(s.load(m, row.add(c)), max));
                s.store(row.add(c), m, e);
                vsum = s.add_masked(vsum, m, e);
            }
            *inv = 1.0 / s.reduce_add(vsum);
        }
    }
    inv
}

/// `out` (`G × d`) = each head's softmax numerators (in `scores`) times the values, scaled by
/// its 1/Σ (`inv`), in passes over the positions of 8, 4, 2 or 1 registers of dimensions: the
/// widest whose `G ×` accumulators leave four registers free (enough independent multiply-adds
/// to hide their latency, none spilled), then narrower ones for what is left of `d`.
#[inline(always)]
fn weighted_values<S: WideLoads, E: KvElem, const G: usize>(
    s: S,
    kv: &Kv<'_, E>,
    scores: &[f32],
    inv: &[f32; G],
    out: &mut [f32],
) {
    let d = kv.shape.head_dim;
    assert!(G <= MAX_HEADS && scores.len() >= G * kv.ctx.len() && out.len() == G * d);
    let widest = (S::REGISTERS - 4) / G;
    let mut dc = 0;
    // SAFETY: asserted above.
    unsafe {
        if widest >= 8 {
            dc = value_passes::<S, E, G, 8>(s, kv, scores, inv, out, dc);
        }
        if widest >= 4 {
            dc = value_passes::<S, E, G, 4>(s, kv, scores, inv, out, dc);
        }
        if widest >= 2 {
            dc = value_passes::<S, E, G, 2>(s, kv, scores, inv, out, dc);
        }
        value_passes::<S, E, G, 1>(s, kv, scores, inv, out, dc);
    }
}

/// Passes of `NV` registers of dimensions from `dc` while they fit in `d`; returns where they
/// stopped.
///
/// # Safety
/// `scores` holds the `G` rows of `n_ctx` and `out` is `G × d`.
#[inline(always)]
unsafe fn value_passes<S: WideLoads, E: KvElem, const G: usize, const NV: usize>(
    s: S,
    kv: &Kv<'_, E>,
    scores: &[f32],
    inv: &[f32; G],
    out: &mut [f32],
    mut dc: usize,
) -> usize {
    while dc + NV * S::LANES <= kv.shape.head_dim {
        // SAFETY: `dc + NV × LANES ≤ d`; the rest is the caller's contract.
        unsafe { value_pass::<S, E, G, NV>(s, kv, scores, inv, out, dc) };
        dc += NV * S::LANES;
    }
    dc
}

/// Dimensions `dc..dc + NV × LANES` of [`weighted_values`].
///
/// # Safety
/// `dc + NV × LANES ≤ d`, `scores` holds the `G` rows of `n_ctx` and `out` is `G × d`.
#[inline(always)]
unsafe fn value_pass<S: WideLoads, E: KvElem, const G: usize, const NV: usize>(
    s: S,
    kv: &Kv<'_, E>,
    scores: &[f32],
    inv: &[f32; G],
    out: &mut [f32],
    dc: usize,
) {
    let (d, n_ctx, l) = (kv.shape.head_dim, kv.ctx.len(), S::LANES);
    let (direct, tail) = (kv.ctx.direct_len(), kv.ctx.tail);
    let (values, stride) = (kv.values.as_ptr(), kv.shape.token_stride());
    // SAFETY: `Kv::new` checked every used block lies inside the value store; the reads are
    // `NV × LANES` floats of head kvh's row of a slot in use (`dc + NV × LANES ≤ d`); score reads
    // are inside the heads' rows and the stores inside `out` (the caller's contract).
    unsafe {
        let mut acc = [[s.zero(); NV]; G];
        let p = scores.as_ptr();
        for b in kv.blocks() {
            for slot in b.first..b.end {
                let v = values.add(b.base + slot * stride + kv.kvh * d + dc);
                accumulate::<S, E, G, NV>(s, &mut acc, p.add(b.t0.wrapping_add(slot)), n_ctx, v);
            }
        }
        for (i, &slot) in tail.iter().enumerate() {
            let (base, slot) = kv.locate(slot);
            let v = values.add(base + slot * stride + kv.kvh * d + dc);
            accumulate::<S, E, G, NV>(s, &mut acc, p.add(direct + i), n_ctx, v);
        }
        for (h, acc) in acc.iter().enumerate() {
            for (j, &a) in acc.iter().enumerate() {
                let o = out.as_mut_ptr().add(h * d + dc + l * j);
                s.store_all(o, s.mul(a, s.splat(inv[h])));
            }
        }
    }
}

/// `acc[h][j] += p[h × n_ctx] · v[j × LANES ..+ LANES]` for each head `h` and `j < NV`: one
/// position's value row into the heads' accumulators.
///
/// # Safety
/// `p + h × n_ctx` is readable for `h < G`, and `v ..+ NV × LANES` is readable.
#[inline(always)]
unsafe fn accumulate<S: WideLoads, E: KvElem, const G: usize, const NV: usize>(
    s: S,
    acc: &mut [[S::V; NV]; G],
    p: *const f32,
    n_ctx: usize,
    v: *const E,
) {
    for j in 0..NV {
        // SAFETY: the caller's contract.
        let vj = unsafe { load_all(s, v.add(S::LANES * j)) };
        for (h, acc) in acc.iter_mut().enumerate() {
            // SAFETY: the caller's contract.
            let p = s.splat(unsafe { *p.add(h * n_ctx) });
            acc[j] = s.fmadd(p, vj, acc[j]);
        }
    }
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
