//! Activations quantised in blocks of 32, the right-hand side of every quantised dot product,
//! in one of two modes ([`ActMode`]): 16 bits a value (exact to f32 rounding; two `vpdpbusd` per
//! four multiply-adds) or 8 bits (GGML's Q8 rounding with finer, f32 scales; one `vpdpbusd`).
//! GGML uses 8 bits here (Q8_0/Q8_K), and that rounding is almost all of llama.cpp's distance
//! from the exact model.

/// How finely activations are quantised: `--activations int16|int8`.
///
/// The default is the one that is at least as accurate as llama.cpp on every file of the
/// accuracy table (BENCHMARKS.md): int8, whose output head keeps 16 bits (see `model::Runner`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ActMode {
    /// 16 bits a value: products within f32 rounding of exact.
    Int16,
    /// 8 bits a value: half the integer multiply-adds, GGML's rounding (with f32 block scales).
    #[default]
    Int8,
}

impl ActMode {
    pub const ALL: [ActMode; 2] = [ActMode::Int16, ActMode::Int8];

    /// Largest quantised magnitude. Int16: 127·256 + 127, so every value splits into two signed
    /// bytes (see [`BlockQ8Pair`]) and `−q` is representable as well; Int8: 127, whose high
    /// byte is always 0.
    pub const fn qmax(self) -> f32 {
        match self {
            Self::Int16 => 32639.0,
            Self::Int8 => 127.0,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::Int16 => "int16",
            Self::Int8 => "int8",
        }
    }
}

impl std::fmt::Display for ActMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ActMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("activations must be int16 or int8, not {s:?}"))
    }
}

/// 32 activations: value ≈ `d · qs[i]`; `s = d · Σ qs` serves weights with an offset (Q4_1),
/// `sh` the same over each half (values 0..16, 16..32) for weights with 16-value sub-blocks.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[repr(C, align(64))]
pub struct BlockQ16 {
    pub qs: [i16; 32],
    pub d: f32,
    pub s: f32,
    pub sh: [f32; 2],
}

pub const ACT_BLOCK: usize = 32;

/// Quantises `x` (a multiple of 32 values) into `out` (one block per 32 values) at `mode`'s
/// precision. Depends on the row alone, so a sequence's activations quantise the same whatever
/// batch it is in.
pub fn quantize_row(x: &[f32], out: &mut [BlockQ16], mode: ActMode) {
    assert_eq!(
        x.len(),
        out.len() * ACT_BLOCK,
        "row length must be 32 × blocks"
    );
    let qmax = mode.qmax();
    for (xs, block) in x.chunks_exact(ACT_BLOCK).zip(out.iter_mut()) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / qmax;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sums = [0i32; 2];
        for (j, (q, &v)) in block.qs.iter_mut().zip(xs).enumerate() {
            // Ties to even, as the SIMD conversion rounds: both paths give the same blocks.
            *q = (v * inv).round_ties_even().clamp(-qmax, qmax) as i16;
            sums[j / 16] += i32::from(*q);
        }
        block.d = d;
        block.s = d * (sums[0] + sums[1]) as f32;
        block.sh = sums.map(|s| d * s as f32);
    }
}

/// [`quantize_row`] and, in the same pass, the byte pairs of every block.
pub fn quantize_row_pairs(
    x: &[f32],
    out: &mut [BlockQ16],
    pairs: &mut [BlockQ8Pair],
    mode: ActMode,
) {
    assert_eq!(
        x.len(),
        out.len() * ACT_BLOCK,
        "row length must be 32 × blocks"
    );
    assert_eq!(out.len(), pairs.len(), "one pair block per block");
    pairs_on(crate::gemm::isa(), x, out, pairs, mode);
}

/// [`quantize_row_pairs`] on the kernels of `isa` (which the CPU must have), lengths checked.
fn pairs_on(
    isa: crate::gemm::Isa,
    x: &[f32],
    out: &mut [BlockQ16],
    pairs: &mut [BlockQ8Pair],
    mode: ActMode,
) {
    use crate::gemm::Isa;
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        assert!(isa.available(), "{isa:?} kernels on a CPU without them");
        if isa == Isa::Avx512 {
            // SAFETY: Avx512 means the CPU has AVX-512 F/BW (Isa::available, asserted).
            unsafe { pairs_avx512(x, out, pairs, mode.qmax()) };
        } else {
            // SAFETY: Avx2 and above mean the CPU has AVX2 (Isa::available, asserted).
            unsafe { pairs_avx2(x, out, pairs, mode.qmax()) };
        }
        return;
    }
    quantize_row(x, out, mode);
    for (p, b) in pairs.iter_mut().zip(out.iter()) {
        *p = BlockQ8Pair::from(b);
    }
}

/// [`quantize_row_pairs`] with AVX-512, the blocks' loop inside the instruction set.
///
/// # Safety
/// The CPU must have AVX-512 F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pairs_avx512(x: &[f32], out: &mut [BlockQ16], pairs: &mut [BlockQ8Pair], qmax: f32) {
    for ((xs, block), pair) in x.chunks_exact(ACT_BLOCK).zip(out).zip(pairs) {
        quantize_block_avx512(xs, block, pair, qmax);
    }
}

/// [`quantize_row_pairs`] with AVX2, the blocks' loop inside the instruction set.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn pairs_avx2(x: &[f32], out: &mut [BlockQ16], pairs: &mut [BlockQ8Pair], qmax: f32) {
    for ((xs, block), pair) in x.chunks_exact(ACT_BLOCK).zip(out).zip(pairs) {
        quantize_block_avx2(xs, block, pair, qmax);
    }
}

/// One block of [`quantize_row_pairs`], bitwise as the scalar code computes it: the same scale,
/// the same products, ties to even, and an exact integer sum.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn quantize_block_avx512(xs: &[f32], block: &mut BlockQ16, pair: &mut BlockQ8Pair, qmax: f32) {
    use std::arch::x86_64::*;
    assert_eq!(xs.len(), ACT_BLOCK);
    // SAFETY: 32 f32 readable from `xs` (asserted); the stores write 64 bytes into `qs` and 32
    // into each of `hi`, `lo`.
    unsafe {
        let x0 = _mm512_loadu_ps(xs.as_ptr());
        let x1 = _mm512_loadu_ps(xs.as_ptr().add(16));
        // `max` returns its second operand where either is NaN: with the running maximum
        // second, NaNs are skipped as `f32::max` skips them.
        let amax = _mm512_max_ps(_mm512_abs_ps(x0), _mm512_setzero_ps());
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x1), amax));
        let d = amax / qmax;
        let inv = _mm512_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let (lo_lim, hi_lim) = (_mm512_set1_ps(-qmax), _mm512_set1_ps(qmax));
        let quant = |x: __m512| {
            // NaN products (a NaN value, ∞ · 0) become 0, as the scalar cast makes them.
            let v = _mm512_mul_ps(x, inv);
            let v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v), v);
            let v = _mm512_min_ps(_mm512_max_ps(v, lo_lim), hi_lim);
            _mm512_cvtps_epi32(v) // MXCSR default: round to nearest, ties to even
        };
        let (q0, q1) = (quant(x0), quant(x1));
        let sums = [_mm512_reduce_add_epi32(q0), _mm512_reduce_add_epi32(q1)];
        _mm256_storeu_si256(block.qs.as_mut_ptr().cast(), _mm512_cvtepi32_epi16(q0));
        _mm256_storeu_si256(
            block.qs[16..].as_mut_ptr().cast(),
            _mm512_cvtepi32_epi16(q1),
        );
        block.d = d;
        block.s = d * (sums[0] + sums[1]) as f32;
        block.sh = sums.map(|s| d * s as f32);
        let split = |q: __m512i| {
            let hi = _mm512_srai_epi32::<8>(_mm512_add_epi32(q, _mm512_set1_epi32(128)));
            let lo = _mm512_sub_epi32(q, _mm512_slli_epi32::<8>(hi));
            (_mm512_cvtepi32_epi8(hi), _mm512_cvtepi32_epi8(lo))
        };
        let ((h0, l0), (h1, l1)) = (split(q0), split(q1));
        _mm_storeu_si128(pair.hi.as_mut_ptr().cast(), h0);
        _mm_storeu_si128(pair.hi[16..].as_mut_ptr().cast(), h1);
        _mm_storeu_si128(pair.lo.as_mut_ptr().cast(), l0);
        _mm_storeu_si128(pair.lo[16..].as_mut_ptr().cast(), l1);
        pair.d = d;
        pair.s = block.s;
        pair.sh = block.sh;
        pair.sums = sums;
    }
}

/// [`quantize_block_avx512`] in 8-lane registers: bitwise the scalar blocks likewise.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
fn quantize_block_avx2(xs: &[f32], block: &mut BlockQ16, pair: &mut BlockQ8Pair, qmax: f32) {
    use std::arch::x86_64::*;
    assert_eq!(xs.len(), ACT_BLOCK);
    // SAFETY: 32 f32 readable from `xs` (asserted); the stores write 64 bytes into `qs` and 32
    // into each of `hi`, `lo`.
    unsafe {
        let x: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(xs.as_ptr().add(8 * i)));
        let abs = |v: __m256| _mm256_andnot_ps(_mm256_set1_ps(-0.0), v);
        // NaNs skipped as in the AVX-512 block.
        let m = x
            .iter()
            .fold(_mm256_setzero_ps(), |m, &x| _mm256_max_ps(abs(x), m));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        let d = amax / qmax;
        let inv = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let (lo_lim, hi_lim) = (_mm256_set1_ps(-qmax), _mm256_set1_ps(qmax));
        // NaN products become 0; MXCSR default: round to nearest, ties to even.
        let q = x.map(|x| {
            let v = _mm256_mul_ps(x, inv);
            let v = _mm256_and_ps(v, _mm256_cmp_ps::<_CMP_ORD_Q>(v, v));
            _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo_lim), hi_lim))
        });
        let hsum = |v: __m256i| {
            let h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
            let h = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
            _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32::<0b01>(h)))
        };
        let sums = [
            hsum(_mm256_add_epi32(q[0], q[1])),
            hsum(_mm256_add_epi32(q[2], q[3])),
        ];
        // |q| ≤ 32639: the saturating packs are exact; they interleave 128-bit lanes, which
        // the permutes undo.
        let pack16 = |a: __m256i, b: __m256i| {
            _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(a, b))
        };
        _mm256_storeu_si256(block.qs.as_mut_ptr().cast(), pack16(q[0], q[1]));
        _mm256_storeu_si256(block.qs[16..].as_mut_ptr().cast(), pack16(q[2], q[3]));
        block.d = d;
        block.s = d * (sums[0] + sums[1]) as f32;
        block.sh = sums.map(|s| d * s as f32);
        let hi = q.map(|q| _mm256_srai_epi32::<8>(_mm256_add_epi32(q, _mm256_set1_epi32(128))));
        let lo: [__m256i; 4] =
            std::array::from_fn(|i| _mm256_sub_epi32(q[i], _mm256_slli_epi32::<8>(hi[i])));
        let pack8 = |v: [__m256i; 4]| {
            let b = _mm256_packs_epi16(
                _mm256_packs_epi32(v[0], v[1]),
                _mm256_packs_epi32(v[2], v[3]),
            );
            _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
        };
        _mm256_storeu_si256(pair.hi.as_mut_ptr().cast(), pack8(hi));
        _mm256_storeu_si256(pair.lo.as_mut_ptr().cast(), pack8(lo));
        pair.d = d;
        pair.s = block.s;
        pair.sh = block.sh;
        pair.sums = sums;
    }
}

/// The same 32 activations split into two signed bytes each, `q = 256·hi + lo`, for the
/// byte-wise integer products (`vpdpbusd`) of the AVX-512 kernels: two 8-bit products give the
/// exact 16-bit one (in [`ActMode::Int8`], `hi` is all zeros and the kernels skip it). `d`, `s`
/// and `sh` are the [`BlockQ16`]'s, `sums` the integer sums those are `d` times.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[repr(C, align(8))]
pub struct BlockQ8Pair {
    pub hi: [i8; 32],
    pub lo: [i8; 32],
    pub d: f32,
    pub s: f32,
    pub sh: [f32; 2],
    /// Σq over each half, exact: what the kernels start a block's integer sum from for weights
    /// whose offset is a fixed multiple of their scale (`f·Σq`, see `PackedKind::offset_sum`).
    pub sums: [i32; 2],
}

impl From<&BlockQ16> for BlockQ8Pair {
    fn from(b: &BlockQ16) -> Self {
        let mut out = Self {
            d: b.d,
            s: b.s,
            sh: b.sh,
            sums: [0, 1].map(|h| {
                b.qs[16 * h..16 * h + 16]
                    .iter()
                    .map(|&q| i32::from(q))
                    .sum()
            }),
            ..Self::default()
        };
        for (i, &q) in b.qs.iter().enumerate() {
            // |q| ≤ 32639 keeps hi within i8 and lo within −128..=127.
            let hi = (i32::from(q) + 128) >> 8;
            out.hi[i] = hi as i8;
            out.lo[i] = (i32::from(q) - 256 * hi) as i8;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::Isa;

    #[test]
    fn quantisation_error_is_within_half_a_step() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.37)
            .collect();
        let mut b = [BlockQ16::default(); 2];
        quantize_row(&x, &mut b, ActMode::Int16);
        for (i, &v) in x.iter().enumerate() {
            let blk = &b[i / 32];
            let back = blk.d * blk.qs[i % 32] as f32;
            assert!((back - v).abs() <= blk.d * 0.5 + 1e-6, "{v} -> {back}");
            // Half a step is 1/65534 of the block's largest magnitude.
            assert!((back - v).abs() <= 1.6e-5 * blk.d * ActMode::Int16.qmax());
        }
        let s0: i32 = b[0].qs.iter().map(|&q| i32::from(q)).sum();
        assert_eq!(b[0].s, b[0].d * s0 as f32);
        let h1: i32 = b[0].qs[16..].iter().map(|&q| i32::from(q)).sum();
        assert_eq!(b[0].sh[1], b[0].d * h1 as f32);
        assert_eq!(b[0].qs.iter().map(|q| q.unsigned_abs()).max(), Some(32639));
    }

    /// A block's fields as bits (NaN scales compare equal to themselves).
    fn bits(q: &BlockQ16, p: &BlockQ8Pair) -> (Vec<i64>, [u32; 8]) {
        let ints = (q.qs.iter().map(|&v| i64::from(v)))
            .chain(p.hi.iter().chain(&p.lo).map(|&v| i64::from(v)))
            .collect();
        let f = [q.d, q.s, q.sh[0], q.sh[1], p.d, p.s, p.sh[0], p.sh[1]];
        (ints, f.map(f32::to_bits))
    }

    /// Rows of blocks that probe the rounding: varied magnitudes, exact ties (x · inv = k + ½
    /// with inv 1 or ½), values at ±qmax and just inside, zeros, a denormal block whose inverse
    /// scale overflows, NaN and ∞.
    fn probe_row() -> Vec<f32> {
        let mut x: Vec<f32> = (0..320)
            .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.013 * (1 + i % 7) as f32)
            .collect();
        for qmax in [ActMode::Int8.qmax(), ActMode::Int16.qmax()] {
            for scale in [1.0, 2.0] {
                // amax = scale · qmax: d = scale, inv = 1/scale exactly.
                let mut b = vec![scale * qmax, -scale * qmax];
                b.extend((0..30).map(|j| {
                    let k = [0.0, 1.0, 2.0, 3.0, qmax - 1.0, qmax - 2.0][j % 6];
                    let sign = if j % 4 < 2 { 1.0 } else { -1.0 };
                    sign * scale * (k + 0.5)
                }));
                x.extend(b);
            }
            // Values within a rounding of ±amax: products within a rounding of ±qmax.
            let v = 3.7f32 * qmax;
            x.extend((0..32).map(|j| [v, v.next_up(), v.next_down(), -v, -v.next_up()][j % 5]));
        }
        x.extend(std::iter::repeat_n(0.0, 32));
        x.extend((0..32).map(|j| [0.0, 1e-39, -5e-40, 3e-45][j % 4]));
        x.extend((0..32).map(|j| [1.0, f32::NAN, -2.5, 0.0][j % 4]));
        x.extend((0..32).map(|j| [1.0, f32::INFINITY, -2.5, 0.0][j % 4]));
        x
    }

    /// Every SIMD path this CPU has gives bitwise the scalar blocks and byte pairs.
    #[test]
    fn the_simd_pass_gives_the_scalar_blocks() {
        let x = probe_row();
        let n = x.len() / 32;
        for mode in ActMode::ALL {
            let mut q_ref = vec![BlockQ16::default(); n];
            quantize_row(&x, &mut q_ref, mode);
            let p_ref: Vec<BlockQ8Pair> = q_ref.iter().map(BlockQ8Pair::from).collect();
            let want: Vec<_> = q_ref.iter().zip(&p_ref).map(|(q, p)| bits(q, p)).collect();
            for isa in [Isa::Portable, Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
                if !isa.available() {
                    continue;
                }
                let mut q = vec![BlockQ16::default(); n];
                let mut p = vec![BlockQ8Pair::default(); n];
                pairs_on(isa, &x, &mut q, &mut p, mode);
                for (b, (got, want)) in q
                    .iter()
                    .zip(&p)
                    .map(|(q, p)| bits(q, p))
                    .zip(&want)
                    .enumerate()
                {
                    assert_eq!(
                        &got,
                        want,
                        "{isa:?} {mode}: block {b} of {:?}",
                        &x[32 * b..32 * b + 32]
                    );
                }
                if mode == ActMode::Int8 {
                    assert!(
                        p.iter().all(|b| b.hi == [0; 32]),
                        "8-bit values have no high byte"
                    );
                }
            }
        }
        // The probes reach what they aim at: ties to even both ways, and both limits.
        let mut q = vec![BlockQ16::default(); n];
        quantize_row(&x, &mut q, ActMode::Int8);
        assert_eq!(&q[10].qs[..6], &[127, -127, 0, 2, -2, -4]);
        assert_eq!(q[10].qs[6], 126);
        assert!(
            q.iter()
                .any(|b| b.qs.contains(&-127) && b.qs.contains(&127))
        );
        // The denormal block: its inverse scale is +∞, 0 · ∞ is NaN (0), the rest clamp.
        assert_eq!(&q[17].qs[..4], &[0, 127, -127, 127]);
    }

    #[test]
    fn byte_pairs_recompose_every_representable_value() {
        for q in -32639..=32639i32 {
            let mut b = BlockQ16::default();
            b.qs[q.unsigned_abs() as usize % 32] = q as i16;
            let p = BlockQ8Pair::from(&b);
            let i = q.unsigned_abs() as usize % 32;
            assert_eq!(256 * i32::from(p.hi[i]) + i32::from(p.lo[i]), q);
        }
    }

    #[test]
    fn eight_bit_mode_rounds_to_within_half_of_a_coarser_step() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.37)
            .collect();
        let mut b = [BlockQ16::default(); 2];
        quantize_row(&x, &mut b, ActMode::Int8);
        for (i, &v) in x.iter().enumerate() {
            let blk = &b[i / 32];
            assert!((blk.d * blk.qs[i % 32] as f32 - v).abs() <= blk.d * 0.5 + 1e-6);
        }
        assert_eq!(b[0].qs.iter().map(|q| q.unsigned_abs()).max(), Some(127));
        assert_eq!("int8".parse::<ActMode>(), Ok(ActMode::Int8));
        assert!("fp8".parse::<ActMode>().is_err());
    }

    #[test]
    fn zeros_stay_zero() {
        let mut b = [BlockQ16::default(); 1];
        quantize_row(&[0.0; 32], &mut b, ActMode::Int8);
        assert_eq!(b[0], BlockQ16::default());
    }
}
