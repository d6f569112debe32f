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
    #[cfg(target_arch = "x86_64")]
    if crate::gemm::isa() == crate::gemm::Isa::Avx512 {
        for ((xs, block), pair) in x.chunks_exact(ACT_BLOCK).zip(out).zip(pairs) {
            // SAFETY: Avx512 means the CPU has AVX-512 F/BW (Isa::detect); 32 values in.
            unsafe { quantize_block_avx512(xs, block, pair, mode.qmax()) };
        }
        return;
    }
    quantize_row(x, out, mode);
    for (p, b) in pairs.iter_mut().zip(out.iter()) {
        *p = BlockQ8Pair::from(b);
    }
}

/// One block of [`quantize_row_pairs`], bitwise as the scalar code computes it: the same scale,
/// the same products, ties to even, and an exact integer sum.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
fn quantize_block_avx512(xs: &[f32], block: &mut BlockQ16, pair: &mut BlockQ8Pair, qmax: f32) {
    use std::arch::x86_64::*;
    assert_eq!(xs.len(), ACT_BLOCK);
    // SAFETY: 32 f32 readable from `xs` (asserted); the stores write 64 bytes into `qs` and 32
    // into each of `hi`, `lo`.
    unsafe {
        let x0 = _mm512_loadu_ps(xs.as_ptr());
        let x1 = _mm512_loadu_ps(xs.as_ptr().add(16));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        let d = amax / qmax;
        let inv = _mm512_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let (lo_lim, hi_lim) = (_mm512_set1_ps(-qmax), _mm512_set1_ps(qmax));
        let quant = |x: __m512| {
            let v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(x, inv), lo_lim), hi_lim);
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
    }
}

/// The same 32 activations split into two signed bytes each, `q = 256·hi + lo`, for the
/// byte-wise integer products (`vpdpbusd`) of the AVX-512 kernels: two 8-bit products give the
/// exact 16-bit one (in [`ActMode::Int8`], `hi` is all zeros and the kernels skip it). `d`, `s`
/// and `sh` are the [`BlockQ16`]'s.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[repr(C, align(8))]
pub struct BlockQ8Pair {
    pub hi: [i8; 32],
    pub lo: [i8; 32],
    pub d: f32,
    pub s: f32,
    pub sh: [f32; 2],
}

impl From<&BlockQ16> for BlockQ8Pair {
    fn from(b: &BlockQ16) -> Self {
        let mut out = Self {
            d: b.d,
            s: b.s,
            sh: b.sh,
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

    #[test]
    fn the_simd_pass_gives_the_scalar_blocks() {
        let x: Vec<f32> = (0..320)
            .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.013 * (1 + i % 7) as f32)
            .chain([0.5, -1.5, 2.5, 0.0].into_iter().cycle().take(32)) // ties
            .chain(std::iter::repeat_n(0.0, 32))
            .collect();
        let n = x.len() / 32;
        for mode in ActMode::ALL {
            let mut q = vec![BlockQ16::default(); n];
            let mut p = vec![BlockQ8Pair::default(); n];
            quantize_row_pairs(&x, &mut q, &mut p, mode);
            let mut q_ref = vec![BlockQ16::default(); n];
            quantize_row(&x, &mut q_ref, mode);
            assert_eq!(q, q_ref, "{mode}");
            let p_ref: Vec<BlockQ8Pair> = q_ref.iter().map(BlockQ8Pair::from).collect();
            assert_eq!(p, p_ref, "{mode}");
            if mode == ActMode::Int8 {
                assert!(
                    p.iter().all(|b| b.hi == [0; 32]),
                    "8-bit values have no high byte"
                );
            }
        }
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
