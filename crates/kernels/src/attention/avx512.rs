//! AVX-512 attention over the paged layout, one KV head's group of query heads at a time: the
//! query heads that share the KV head (up to four at a time) read each key and value once. Scores are 16 keys a register (keys are transposed per
//! block), the softmax uses a vector `exp`, and the weighted sum of values is scaled by 1/Σ at
//! the end. Masked loads and stores handle partial chunks, so every position is computed by
//! the same instructions whatever the context length around it. A draft-tree query's ancestors
//! (the context's tail) are copied 16 at a time into a transposed scratch chunk, so their scores
//! come from the same multiply-adds as any other key's.

use super::{Context, KvShape};
use crate::simd::exp;
use std::arch::x86_64::*;

/// Query heads computed together.
const MAX_HEADS: usize = 4;

/// # Safety
/// The CPU must support AVX-512 F and FMA; `head_dim` must be a multiple of 16; the arguments
/// satisfy `paged_attention`'s contract (checked there).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,fma")]
pub(super) unsafe fn attention(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    shape: KvShape,
    blocks: &[u32],
    ctx: Context<'_>,
    kvh: usize,
    scale: f32,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let d = shape.head_dim;
    assert!(d.is_multiple_of(16), "head_dim must be a multiple of 16");
    assert!(
        kvh < shape.n_kv_heads,
        "KV head {kvh} of {}",
        shape.n_kv_heads
    );
    let stride = shape.block_stride();
    for &b in &blocks[..ctx.slot_end().div_ceil(shape.block_size)] {
        assert!(
            (b as usize + 1) * stride <= keys.len().min(values.len()),
            "block {b} outside the KV store"
        );
    }
    let group = q.len() / d;
    // Score rows, then (for a tree query) one transposed chunk of 16 tail keys.
    let n_ctx = ctx.len();
    let chunk = if ctx.tail.is_empty() { 0 } else { 16 * d };
    scores.resize(MAX_HEADS * n_ctx + chunk, 0.0);
    let kv = Kv {
        keys,
        values,
        shape,
        blocks,
        ctx,
        kvh,
    };
    let mut h = 0;
    while h < group {
        let take = (group - h).min(MAX_HEADS);
        let (q, out) = (&q[h * d..(h + take) * d], &mut out[h * d..(h + take) * d]);
        match take {
            1 => heads::<1>(q, &kv, scale, out, scores),
            2 => heads::<2>(q, &kv, scale, out, scores),
            3 => heads::<3>(q, &kv, scale, out, scores),
            _ => heads::<4>(q, &kv, scale, out, scores),
        }
        h += take;
    }
}

/// One KV head's keys and values over a sequence's context.
struct Kv<'a> {
    keys: &'a [f32],
    values: &'a [f32],
    shape: KvShape,
    blocks: &'a [u32],
    ctx: Context<'a>,
    kvh: usize,
}

impl Kv<'_> {
    /// For each block of the context's direct part: its first position, its start in the
    /// store and the slots in use.
    fn blocks(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let (bs, direct) = (self.shape.block_size, self.ctx.direct);
        (0..direct.div_ceil(bs)).map(move |i| {
            (
                i * bs,
                self.blocks[i] as usize * self.shape.block_stride(),
                (direct - i * bs).min(bs),
            )
        })
    }

    /// Where slot `slot`'s block starts in the store, and the slot's index in it.
    fn locate(&self, slot: usize) -> (usize, usize) {
        self.shape.locate(self.blocks, slot)
    }
}

/// Lanes `0..n` of a 16-lane mask.
#[inline]
fn mask(n: usize) -> __mmask16 {
    if n >= 16 { 0xffff } else { (1u16 << n) - 1 }
}

/// Attention for `G` query heads of one KV head: scores, softmax, weighted sum of values.
#[inline]
#[target_feature(enable = "avx512f,fma")]
fn heads<const G: usize>(q: &[f32], kv: &Kv<'_>, scale: f32, out: &mut [f32], scores: &mut [f32]) {
    let n_ctx = kv.ctx.len();
    let (scores, chunk) = scores.split_at_mut(MAX_HEADS * n_ctx);
    direct_scores::<G>(q, kv, scale, scores);
    tail_scores::<G>(q, kv, scale, scores, chunk);
    let inv = softmax_rows::<G>(scores, n_ctx);
    weighted_values::<G>(kv, scores, &inv, out);
}

/// Scores (× `scale`) of the context's direct part into the heads' score rows (`n_ctx` long
/// each, in `scores`), 16 keys at a time.
#[inline]
#[target_feature(enable = "avx512f,fma")]
fn direct_scores<const G: usize>(q: &[f32], kv: &Kv<'_>, scale: f32, scores: &mut [f32]) {
    let (d, n_ctx, bs) = (kv.shape.head_dim, kv.ctx.len(), kv.shape.block_size);
    debug_assert!(G <= MAX_HEADS && scores.len() >= G * n_ctx);
    for (t0, base, used) in kv.blocks() {
        // SAFETY: `attention` checked every used block lies inside the key store; the reads stay
        // within head kvh's rows of block `base..base + stride`, masked past `used`.
        let key_rows = unsafe { kv.keys.as_ptr().add(base + kv.kvh * d * bs) };
        for c in (0..used).step_by(16) {
            let m = mask(used - c);
            // SAFETY: as above for the keys (dimension `i` at `i × bs`, lanes `c..c + 16` masked
            // past `used`); positions `t0 + c..` of the score rows lie within `n_ctx`, masked.
            unsafe {
                let s = dots::<G>(q, d, key_rows.add(c), bs, m);
                store_scores::<G>(&s, scores.as_mut_ptr().add(t0 + c), n_ctx, m, scale);
            }
        }
    }
}

/// Scores (× `scale`) of the context's tail (a draft tree's ancestors, in scattered slots) after
/// the direct part's, its keys gathered 16 slots at a time into `chunk` (`[dim][lane]`, `16 × d`
/// long when there is a tail).
#[inline]
#[target_feature(enable = "avx512f,fma")]
fn tail_scores<const G: usize>(
    q: &[f32],
    kv: &Kv<'_>,
    scale: f32,
    scores: &mut [f32],
    chunk: &mut [f32],
) {
    let (d, n_ctx, bs) = (kv.shape.head_dim, kv.ctx.len(), kv.shape.block_size);
    let (direct, tail) = (kv.ctx.direct, kv.ctx.tail);
    debug_assert!(G <= MAX_HEADS && scores.len() >= G * n_ctx);
    for c in (0..tail.len()).step_by(16) {
        let lanes = (tail.len() - c).min(16);
        for (l, &slot) in tail[c..c + lanes].iter().enumerate() {
            let (base, at) = kv.locate(slot);
            // SAFETY: `attention` checked the slot's block lies inside the key store; the reads
            // are head kvh's dimensions of slot `at` in it; `chunk` is `16 × d` long.
            unsafe {
                let key = kv.keys.as_ptr().add(base + kv.kvh * d * bs + at);
                for i in 0..d {
                    *chunk.get_unchecked_mut(i * 16 + l) = *key.add(i * bs);
                }
            }
        }
        let m = mask(lanes);
        // SAFETY: `chunk` holds `16 × d` floats (rows of 16, masked past `lanes`); positions
        // `direct + c..` of the score rows lie within `n_ctx`, masked.
        unsafe {
            let s = dots::<G>(q, d, chunk.as_ptr(), 16, m);
            store_scores::<G>(&s, scores.as_mut_ptr().add(direct + c), n_ctx, m, scale);
        }
    }
}

/// The `G` heads' dot products with 16 keys (lanes past `m` zero), dimension `i` of the keys at
/// `keys + i × stride`.
///
/// # Safety
/// Lanes `m` of `keys + i × stride ..+ 16` are readable for every `i < d`; `q` holds `G × d`.
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn dots<const G: usize>(
    q: &[f32],
    d: usize,
    keys: *const f32,
    stride: usize,
    m: __mmask16,
) -> [__m512; G] {
    let mut s = [_mm512_setzero_ps(); G];
    for i in 0..d {
        // SAFETY: the caller's contract.
        let k = unsafe { _mm512_maskz_loadu_ps(m, keys.add(i * stride)) };
        for (h, s) in s.iter_mut().enumerate() {
            *s = _mm512_fmadd_ps(_mm512_set1_ps(q[h * d + i]), k, *s);
        }
    }
    s
}

/// Stores lanes `m` of `s[h] × scale` at `row + h × n_ctx` for each head `h`.
///
/// # Safety
/// Lanes `m` of `row + h × n_ctx ..+ 16` are writable for every `h < G`.
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn store_scores<const G: usize>(
    s: &[__m512; G],
    row: *mut f32,
    n_ctx: usize,
    m: __mmask16,
    scale: f32,
) {
    for (h, s) in s.iter().enumerate() {
        // SAFETY: the caller's contract.
        unsafe {
            _mm512_mask_storeu_ps(
                row.add(h * n_ctx),
                m,
                _mm512_mul_ps(*s, _mm512_set1_ps(scale)),
            )
        };
    }
}

/// Softmax numerators in place over each head's score row (`n_ctx` long, in `scores`); returns
/// each row's 1/Σ, kept for the end.
#[inline]
#[target_feature(enable = "avx512f,fma")]
fn softmax_rows<const G: usize>(scores: &mut [f32], n_ctx: usize) -> [f32; G] {
    debug_assert!(G <= MAX_HEADS && scores.len() >= G * n_ctx);
    let mut inv = [0.0f32; G];
    for (h, inv) in inv.iter_mut().enumerate() {
        // SAFETY: row `h` is `n_ctx` floats inside `scores` (`heads` split off `MAX_HEADS × n_ctx`
        // of them); loads and stores are masked past `n_ctx`.
        unsafe {
            let row = scores.as_mut_ptr().add(h * n_ctx);
            let mut vmax = _mm512_set1_ps(f32::NEG_INFINITY);
            for c in (0..n_ctx).step_by(16) {
                let m = mask(n_ctx - c);
                vmax = _mm512_mask_max_ps(vmax, m, vmax, _mm512_maskz_loadu_ps(m, row.add(c)));
            }
            let max = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
            let mut vsum = _mm512_setzero_ps();
            for c in (0..n_ctx).step_by(16) {
                let m = mask(n_ctx - c);
                let e = exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row.add(c)), max));
                _mm512_mask_storeu_ps(row.add(c), m, e);
                vsum = _mm512_mask_add_ps(vsum, m, vsum, e);
            }
            *inv = 1.0 / _mm512_reduce_add_ps(vsum);
        }
    }
    inv
}

/// `out` (`G × d`) = each head's softmax numerators (in `scores`) times the values, scaled by
/// its 1/Σ (`inv`), 64 dimensions at a time.
#[inline]
#[target_feature(enable = "avx512f,fma")]
fn weighted_values<const G: usize>(kv: &Kv<'_>, scores: &[f32], inv: &[f32; G], out: &mut [f32]) {
    let (d, n_ctx) = (kv.shape.head_dim, kv.ctx.len());
    let (direct, tail) = (kv.ctx.direct, kv.ctx.tail);
    debug_assert!(G <= MAX_HEADS && scores.len() >= G * n_ctx && out.len() == G * d);
    let (values, stride) = (kv.values.as_ptr(), kv.shape.token_stride());
    // SAFETY: `attention` checked every used block lies inside the value store; the reads are
    // `nv × 16` floats of head kvh's row of a slot in use (`d` is a multiple of 16); score reads
    // are inside the heads' rows (`MAX_HEADS × n_ctx` split off by `heads`) and the stores inside
    // `out` (`G × d`, sliced so by `attention`).
    unsafe {
        for dc in (0..d).step_by(64) {
            let nv = ((d - dc) / 16).min(4);
            let mut acc = [[_mm512_setzero_ps(); 4]; G];
            let mut add = |t: usize, v: *const f32| {
                for j in 0..nv {
                    let vj = _mm512_loadu_ps(v.add(16 * j));
                    for (h, acc) in acc.iter_mut().enumerate() {
                        let p = _mm512_set1_ps(*scores.get_unchecked(h * n_ctx + t));
                        acc[j] = _mm512_fmadd_ps(p, vj, acc[j]);
                    }
                }
            };
            for (t0, base, used) in kv.blocks() {
                for slot in 0..used {
                    add(
                        t0 + slot,
                        values.add(base + slot * stride + kv.kvh * d + dc),
                    );
                }
            }
            for (i, &slot) in tail.iter().enumerate() {
                let (base, at) = kv.locate(slot);
                add(direct + i, values.add(base + at * stride + kv.kvh * d + dc));
            }
            for (h, acc) in acc.iter().enumerate() {
                for (j, a) in acc.iter().enumerate().take(nv) {
                    let o = out.as_mut_ptr().add(h * d + dc + 16 * j);
                    _mm512_storeu_ps(o, _mm512_mul_ps(*a, _mm512_set1_ps(inv[h])));
                }
            }
        }
    }
}
