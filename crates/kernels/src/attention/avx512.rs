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

#[inline]
#[target_feature(enable = "avx512f,fma")]
fn heads<const G: usize>(q: &[f32], kv: &Kv<'_>, scale: f32, out: &mut [f32], scores: &mut [f32]) {
    let (d, n_ctx, bs) = (kv.shape.head_dim, kv.ctx.len(), kv.shape.block_size);
    let (direct, tail) = (kv.ctx.direct, kv.ctx.tail);
    let (scores, chunk) = scores.split_at_mut(MAX_HEADS * n_ctx);
    // SAFETY: (for the whole body) `attention` checked every used block lies inside both stores; key
    // reads stay within block `base..base + stride` (head kvh's rows, masked past `used`), value
    // reads within the slot's row; score rows are `n_ctx` long and masked past it; the tail
    // chunk is `16 × d` long.
    unsafe {
        // Scores, 16 keys at a time.
        for (t0, base, used) in kv.blocks() {
            let key_rows = kv.keys.as_ptr().add(base + kv.kvh * d * bs);
            for c in (0..used).step_by(16) {
                let m = mask(used - c);
                let mut s = [_mm512_setzero_ps(); G];
                for i in 0..d {
                    let k = _mm512_maskz_loadu_ps(m, key_rows.add(i * bs + c));
                    for (h, s) in s.iter_mut().enumerate() {
                        *s = _mm512_fmadd_ps(_mm512_set1_ps(q[h * d + i]), k, *s);
                    }
                }
                for (h, s) in s.iter().enumerate() {
                    let row = scores.as_mut_ptr().add(h * n_ctx + t0 + c);
                    _mm512_mask_storeu_ps(row, m, _mm512_mul_ps(*s, _mm512_set1_ps(scale)));
                }
            }
        }
        // The tail's keys, gathered 16 slots at a time into `chunk` (`[dim][lane]`).
        for c in (0..tail.len()).step_by(16) {
            let lanes = (tail.len() - c).min(16);
            for (l, &slot) in tail[c..c + lanes].iter().enumerate() {
                let (base, at) = kv.locate(slot);
                let key = kv.keys.as_ptr().add(base + kv.kvh * d * bs + at);
                for i in 0..d {
                    *chunk.get_unchecked_mut(i * 16 + l) = *key.add(i * bs);
                }
            }
            let m = mask(lanes);
            let mut s = [_mm512_setzero_ps(); G];
            for i in 0..d {
                let k = _mm512_maskz_loadu_ps(m, chunk.as_ptr().add(i * 16));
                for (h, s) in s.iter_mut().enumerate() {
                    *s = _mm512_fmadd_ps(_mm512_set1_ps(q[h * d + i]), k, *s);
                }
            }
            for (h, s) in s.iter().enumerate() {
                let row = scores.as_mut_ptr().add(h * n_ctx + direct + c);
                _mm512_mask_storeu_ps(row, m, _mm512_mul_ps(*s, _mm512_set1_ps(scale)));
            }
        }
        // Softmax numerators in place; 1/Σ kept for the end.
        let mut inv = [0.0f32; G];
        for (h, inv) in inv.iter_mut().enumerate() {
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
        // Weighted sum of values, 64 dimensions at a time.
        for dc in (0..d).step_by(64) {
            let nv = ((d - dc) / 16).min(4);
            let mut acc = [[_mm512_setzero_ps(); 4]; G];
            let values = kv.values.as_ptr();
            let stride = kv.shape.token_stride();
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
