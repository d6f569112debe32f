//! x86-64 SIMD row dot products of the integer-product weight types (Q4_0, Q4_1, Q8_0) with
//! 16-bit activations, straight from GGUF blocks: AVX2 (`vpmaddwd`), and AVX-512 with VNNI
//! (`vpdpwssd`) for matrices that were not packed (see `packed.rs` for the fast AVX-512 path).
//!
//! Each function computes one output element the same way whatever the batch, so batch
//! invariance holds within a path; the paths differ from each other (and from the portable code)
//! only in float summation order.

use crate::quant::{BlockQ16, GgmlType};
use std::arch::x86_64::*;

/// Weight types these kernels handle.
pub(super) fn handles(dtype: GgmlType) -> bool {
    matches!(dtype, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0)
}

/// The two f16 at the start of `b` as [f32, f32, 0, 0].
#[inline]
#[target_feature(enable = "f16c")]
fn f16_pair(b: &[u8]) -> __m128 {
    let bits = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32))
}

/// f16 at `b[at..at + 2]` as f32.
#[inline]
#[target_feature(enable = "f16c")]
fn f16_at(b: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([b[at], b[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

#[inline]
#[target_feature(enable = "avx2")]
fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// A Q4 block's 16 bytes as (low nibbles, high nibbles): values 0..16 and 16..32 of the block.
#[inline]
#[target_feature(enable = "avx2")]
fn nibble_halves(qs: &[u8]) -> (__m128i, __m128i) {
    assert!(qs.len() >= 16);
    // SAFETY: 16 readable bytes (asserted).
    let raw = unsafe { _mm_loadu_si128(qs.as_ptr().cast()) };
    let mask = _mm_set1_epi8(0x0f);
    (
        _mm_and_si128(raw, mask),
        _mm_and_si128(_mm_srli_epi16::<4>(raw), mask),
    )
}

/// The 32 i16 activations of a block as two halves.
#[inline]
#[target_feature(enable = "avx2")]
fn act_halves(a: &BlockQ16) -> (__m256i, __m256i) {
    // SAFETY: `qs` holds 32 i16 = 64 bytes.
    unsafe {
        (
            _mm256_loadu_si256(a.qs.as_ptr().cast()),
            _mm256_loadu_si256(a.qs[16..].as_ptr().cast()),
        )
    }
}

/// Σ w·x over one block, AVX2: 8 lanes of i32 partial sums.
#[inline]
#[target_feature(enable = "avx2")]
fn block_sums_avx2(w_lo: __m256i, w_hi: __m256i, a: &BlockQ16) -> __m256i {
    let (x_lo, x_hi) = act_halves(a);
    _mm256_add_epi32(_mm256_madd_epi16(w_lo, x_lo), _mm256_madd_epi16(w_hi, x_hi))
}

/// One weight row · one activation row, AVX2.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `row` must hold `acts.len()` blocks of `dtype`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn row_dot_avx2(dtype: GgmlType, row: &[u8], acts: &[BlockQ16]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut offset_sum = 0.0f32;
    let blocks = row.chunks_exact(dtype.type_size()).zip(acts);
    match dtype {
        GgmlType::Q4_1 => {
            for (b, a) in blocks {
                let (lo, hi) = nibble_halves(&b[4..]);
                let p = block_sums_avx2(_mm256_cvtepu8_epi16(lo), _mm256_cvtepu8_epi16(hi), a);
                acc = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(p),
                    _mm256_set1_ps(f16_at(b, 0) * a.d),
                    acc,
                );
                offset_sum += f16_at(b, 2) * a.s;
            }
        }
        GgmlType::Q4_0 => {
            // Σ (q − 8)·x = Σ q·x − 8·Σx, and d_w·d_x·Σx = d_w·s_x.
            for (b, a) in blocks {
                let d = f16_at(b, 0);
                let (lo, hi) = nibble_halves(&b[2..]);
                let p = block_sums_avx2(_mm256_cvtepu8_epi16(lo), _mm256_cvtepu8_epi16(hi), a);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * a.d), acc);
                offset_sum -= 8.0 * d * a.s;
            }
        }
        GgmlType::Q8_0 => {
            for (b, a) in blocks {
                // SAFETY: a Q8_0 block has 32 quant bytes after its 2-byte scale.
                let (lo, hi) = unsafe {
                    (
                        _mm_loadu_si128(b[2..].as_ptr().cast()),
                        _mm_loadu_si128(b[18..].as_ptr().cast()),
                    )
                };
                let p = block_sums_avx2(_mm256_cvtepi8_epi16(lo), _mm256_cvtepi8_epi16(hi), a);
                acc = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(p),
                    _mm256_set1_ps(f16_at(b, 0) * a.d),
                    acc,
                );
            }
        }
        _ => unreachable!("handles() filters the types"),
    }
    hsum256(acc) + offset_sum
}

/// Σ w·x over one block, AVX-512 VNNI: 16 lanes of i32 partial sums.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn block_sums_avx512(w: __m512i, a: &BlockQ16) -> __m512i {
    // SAFETY: `qs` holds 32 i16 = 64 bytes.
    let x = unsafe { _mm512_loadu_si512(a.qs.as_ptr().cast()) };
    _mm512_dpwssd_epi32(_mm512_setzero_si512(), w, x)
}

/// Partial sums that break the dependency between consecutive blocks' FMAs.
const LANES: usize = 4;

/// Σ over blocks of (weights · activations) · d_w · d_x + c · s_x, where `block(i)` gives block
/// i's weights as 32 i16, its `d_w` and its offset coefficient `c`. Block i goes into partial sum
/// i mod 4, summed at the end in a fixed order, so a row's result does not depend on the batch.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
fn accumulate_avx512<F: FnMut(usize) -> (__m512i, __m128)>(acts: &[BlockQ16], mut block: F) -> f32 {
    let mut acc = [_mm512_setzero_ps(); LANES];
    // Lane 1 of each holds the Σ c·s_x partial sum (lane 0 collects unused d·d_x products).
    let mut off = [_mm_setzero_ps(); LANES];
    for (i, a) in acts.iter().enumerate() {
        let lane = i % LANES;
        // `dc` is [d_w, c, 0, 0]; one multiply by [d_x, s_x] gives both scale and offset.
        let (w, dc) = block(i);
        let p = block_sums_avx512(w, a);
        // SAFETY: `d` and `s` are adjacent f32 fields of the #[repr(C)] block.
        let ds = unsafe { _mm_castpd_ps(_mm_load_sd((&raw const a.d).cast())) };
        let prod = _mm_mul_ps(dc, ds);
        acc[lane] = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(p),
            _mm512_broadcastss_ps(prod),
            acc[lane],
        );
        off[lane] = _mm_add_ps(off[lane], prod);
    }
    let total = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    let o = off.map(|v| _mm_cvtss_f32(_mm_shuffle_ps::<1>(v, v)));
    _mm512_reduce_add_ps(total) + ((o[0] + o[1]) + (o[2] + o[3]))
}

/// A Q4 block's nibbles as 32 i16 (values 0..16 of the block, then 16..32).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
fn nibbles_i16(qs: &[u8]) -> __m512i {
    let (lo, hi) = nibble_halves(qs);
    _mm512_cvtepu8_epi16(_mm256_set_m128i(hi, lo))
}

/// One weight row · one activation row, AVX-512 with VNNI.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL and VNNI, and F16C; `row` must hold `acts.len()` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn row_dot_avx512(dtype: GgmlType, row: &[u8], acts: &[BlockQ16]) -> f32 {
    let size = dtype.type_size();
    let b = |i: usize| &row[i * size..(i + 1) * size];
    match dtype {
        // Q4_1 stores [d, m] as two f16: one conversion gives [d, m, 0, 0].
        GgmlType::Q4_1 => accumulate_avx512(acts, |i| (nibbles_i16(&b(i)[4..]), f16_pair(b(i)))),
        GgmlType::Q4_0 => accumulate_avx512(acts, |i| {
            let d = f16_at(b(i), 0);
            // Σ (q − 8)·x = Σ q·x − 8·Σx, and d_w·d_x·Σx = d_w·s_x.
            (
                nibbles_i16(&b(i)[2..]),
                _mm_setr_ps(d, -(8.0 * d), 0.0, 0.0),
            )
        }),
        GgmlType::Q8_0 => accumulate_avx512(acts, |i| {
            // SAFETY: a Q8_0 block has 32 quant bytes after its 2-byte scale.
            let q = unsafe { _mm256_loadu_si256(b(i)[2..].as_ptr().cast()) };
            (
                _mm512_cvtepi8_epi16(q),
                _mm_setr_ps(f16_at(b(i), 0), 0.0, 0.0, 0.0),
            )
        }),
        _ => unreachable!("handles() filters the types"),
    }
}
