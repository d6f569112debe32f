//! Vector helpers shared by the x86-64 kernels: `e^x` at 512 and 256 bits, and [`F32s`], the few
//! f32 vector operations of the kernels written once for both widths (attention, SwiGLU), with
//! its two instruction sets: [`Avx512`] (16 lanes) and [`Avx2`] (8 lanes); [`WideLoads`] widens
//! 16-bit floats (f16, bf16) into them.
//!
//! A kernel over [`F32s`] is generic code marked `#[inline(always)]`, instantiated inside one
//! `#[target_feature]` function per instruction set: the methods (and the intrinsics in them)
//! inline there, so the generic code compiles to what the hand-written one would.

use std::arch::x86_64::*;

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Coefficients of the polynomial after the leading 1/720, highest degree first (Horner).
const POLY: [f32; 6] = [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0];

/// e^x, accurate to about 2 ulp for the softmax's arguments (x ≤ 0): 2^n · p(r) with
/// r = x − n·ln 2 and p a degree-6 polynomial.
#[inline]
#[target_feature(enable = "avx512f,fma")]
pub(crate) fn exp(x: __m512) -> __m512 {
    let x = _mm512_max_ps(x, _mm512_set1_ps(-87.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_set1_ps(1.0 / 720.0);
    for c in POLY {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    _mm512_scalef_ps(p, n)
}

/// [`exp`] in 8 lanes: the same reduction and polynomial, and 2^n made from exponent bits
/// (AVX2 has no `scalef`), so bitwise [`exp`]'s values up to x = 127.5·ln 2 ≈ 88.37; above
/// that +∞ (e^x overflows f32 from 88.72).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn exp256(x: __m256) -> __m256 {
    // The upper clamp keeps n ≤ 128, whose exponent bits are +∞'s.
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.0)),
        _mm256_set1_ps(89.0),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(LOG2E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let mut p = _mm256_set1_ps(1.0 / 720.0);
    for c in POLY {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    // n ∈ −126..=128: 2^n is a normal float (or +∞ at 128), so p · 2^n rounds as scalef does.
    let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_mul_ps(p, _mm256_castsi256_ps(bits))
}

/// The f32 vector operations of one instruction set. A value of an implementing type is the
/// proof that the CPU has the instructions, so the methods are safe to call wherever one
/// exists (those taking raw pointers stay `unsafe` for the pointers).
///
/// # Safety
/// An implementation's values may exist only where the CPU has the instructions its methods use.
pub(crate) unsafe trait F32s: Copy {
    /// f32 lanes of a vector.
    const LANES: usize;
    /// Vector registers of the instruction set.
    const REGISTERS: usize;
    type V: Copy;
    /// Which lanes a masked operation touches.
    type M: Copy;

    fn zero(self) -> Self::V;
    fn splat(self, x: f32) -> Self::V;
    /// Lanes `0..n` (all of them when `n ≥ LANES`).
    fn mask(self, n: usize) -> Self::M;
    /// Whether `m` has every lane.
    fn is_full(self, m: Self::M) -> bool;
    /// Lanes `m` from `p..p + LANES`, the others zero.
    ///
    /// # Safety
    /// Lanes `m` of `p..p + LANES` are readable.
    unsafe fn load(self, m: Self::M, p: *const f32) -> Self::V;
    /// # Safety
    /// `p..p + LANES` is readable.
    unsafe fn load_all(self, p: *const f32) -> Self::V;
    /// Lanes `m` of `v` into `p..p + LANES`, the other floats untouched.
    ///
    /// # Safety
    /// Lanes `m` of `p..p + LANES` are writable.
    unsafe fn store(self, p: *mut f32, m: Self::M, v: Self::V);
    /// # Safety
    /// `p..p + LANES` is writable.
    unsafe fn store_all(self, p: *mut f32, v: Self::V);
    /// `a · b + c`, rounded once.
    fn fmadd(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    fn div(self, a: Self::V, b: Self::V) -> Self::V;
    /// `max(acc, x)` in lanes `m`, `acc` in the others.
    fn max_masked(self, acc: Self::V, m: Self::M, x: Self::V) -> Self::V;
    /// `acc + x` in lanes `m`, `acc` in the others.
    fn add_masked(self, acc: Self::V, m: Self::M, x: Self::V) -> Self::V;
    /// The largest lane.
    fn reduce_max(self, v: Self::V) -> f32;
    /// The lanes' sum, in a fixed order.
    fn reduce_add(self, v: Self::V) -> f32;
    /// e^x in every lane ([`exp`], [`exp256`]).
    fn exp(self, x: Self::V) -> Self::V;
}

/// AVX-512 F with FMA: 16 lanes, 32 registers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx512(());

impl Avx512 {
    /// # Safety
    /// The CPU must have AVX-512 F and FMA.
    #[inline(always)]
    pub(crate) unsafe fn new() -> Self {
        Self(())
    }
}

// SAFETY: values exist only through `Avx512::new`, whose contract is AVX-512 F and FMA; the
// methods use nothing else.
unsafe impl F32s for Avx512 {
    const LANES: usize = 16;
    const REGISTERS: usize = 32;
    type V = __m512;
    type M = __mmask16;

    // In every method, SAFETY: `self` proves AVX-512 F and FMA; pointer contracts are the
    // caller's (as documented on the trait).
    #[inline(always)]
    fn zero(self) -> __m512 {
        // SAFETY: see above.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    fn splat(self, x: f32) -> __m512 {
        // SAFETY: see above.
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    fn mask(self, n: usize) -> __mmask16 {
        if n >= 16 { 0xffff } else { (1u16 << n) - 1 }
    }
    #[inline(always)]
    fn is_full(self, m: __mmask16) -> bool {
        m == 0xffff
    }
    #[inline(always)]
    unsafe fn load(self, m: __mmask16, p: *const f32) -> __m512 {
        // SAFETY: see above.
        unsafe { _mm512_maskz_loadu_ps(m, p) }
    }
    #[inline(always)]
    unsafe fn load_all(self, p: *const f32) -> __m512 {
        // SAFETY: see above.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, m: __mmask16, v: __m512) {
        // SAFETY: see above.
        unsafe { _mm512_mask_storeu_ps(p, m, v) }
    }
    #[inline(always)]
    unsafe fn store_all(self, p: *mut f32, v: __m512) {
        // SAFETY: see above.
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    fn fmadd(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: see above.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn add(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see above.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see above.
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see above.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see above.
        unsafe { _mm512_div_ps(a, b) }
    }
    #[inline(always)]
    fn max_masked(self, acc: __m512, m: __mmask16, x: __m512) -> __m512 {
        // SAFETY: see above.
        unsafe { _mm512_mask_max_ps(acc, m, acc, x) }
    }
    #[inline(always)]
    fn add_masked(self, acc: __m512, m: __mmask16, x: __m512) -> __m512 {
        // SAFETY: see above.
        unsafe { _mm512_mask_add_ps(acc, m, acc, x) }
    }
    #[inline(always)]
    fn reduce_max(self, v: __m512) -> f32 {
        // SAFETY: see above.
        unsafe { _mm512_reduce_max_ps(v) }
    }
    #[inline(always)]
    fn reduce_add(self, v: __m512) -> f32 {
        // SAFETY: see above.
        unsafe { _mm512_reduce_add_ps(v) }
    }
    #[inline(always)]
    fn exp(self, x: __m512) -> __m512 {
        // SAFETY: see above.
        unsafe { exp(x) }
    }
}

/// AVX2 with FMA: 8 lanes, 16 registers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx2(());

/// An AVX2 lane mask: all-ones or zero lanes, and whether it has every lane, for which loads
/// and stores are plain ones (masked stores are slow on some AMD CPUs; plain loads fold into
/// the arithmetic). The values read and written are the same either way.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mask8 {
    lanes: __m256i,
    full: bool,
    /// How many lanes (a prefix): `lanes` as a count.
    count: u8,
}

impl Mask8 {
    /// The mask's lanes, `0..count()`.
    pub(crate) fn count(self) -> usize {
        self.count as usize
    }
}

impl Avx2 {
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[inline(always)]
    pub(crate) unsafe fn new() -> Self {
        Self(())
    }
}

// SAFETY: values exist only through `Avx2::new`, whose contract is AVX2 and FMA; the methods
// use nothing else (AVX, SSE and SSE3 come with AVX2).
unsafe impl F32s for Avx2 {
    const LANES: usize = 8;
    const REGISTERS: usize = 16;
    type V = __m256;
    type M = Mask8;

    // In every method, SAFETY: `self` proves AVX2 and FMA; pointer contracts are the caller's
    // (as documented on the trait).
    #[inline(always)]
    fn zero(self) -> __m256 {
        // SAFETY: see above.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    fn splat(self, x: f32) -> __m256 {
        // SAFETY: see above.
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    fn mask(self, n: usize) -> Mask8 {
        // SAFETY: see above.
        let lanes = unsafe {
            _mm256_cmpgt_epi32(
                _mm256_set1_epi32(n.min(8) as i32),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            )
        };
        Mask8 {
            lanes,
            full: n >= 8,
            count: n.min(8) as u8,
        }
    }
    #[inline(always)]
    fn is_full(self, m: Mask8) -> bool {
        m.full
    }
    #[inline(always)]
    unsafe fn load(self, m: Mask8, p: *const f32) -> __m256 {
        // SAFETY: see above (masked-off lanes are not read).
        unsafe {
            if m.full {
                _mm256_loadu_ps(p)
            } else {
                _mm256_maskload_ps(p, m.lanes)
            }
        }
    }
    #[inline(always)]
    unsafe fn load_all(self, p: *const f32) -> __m256 {
        // SAFETY: see above.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, m: Mask8, v: __m256) {
        // SAFETY: see above (masked-off lanes are not written).
        unsafe {
            if m.full {
                _mm256_storeu_ps(p, v)
            } else {
                _mm256_maskstore_ps(p, m.lanes, v)
            }
        }
    }
    #[inline(always)]
    unsafe fn store_all(self, p: *mut f32, v: __m256) {
        // SAFETY: see above.
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    fn fmadd(self, a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: see above.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn add(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see above.
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see above.
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see above.
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see above.
        unsafe { _mm256_div_ps(a, b) }
    }
    #[inline(always)]
    fn max_masked(self, acc: __m256, m: Mask8, x: __m256) -> __m256 {
        // SAFETY: see above.
        unsafe { _mm256_blendv_ps(acc, _mm256_max_ps(acc, x), _mm256_castsi256_ps(m.lanes)) }
    }
    #[inline(always)]
    fn add_masked(self, acc: __m256, m: Mask8, x: __m256) -> __m256 {
        // SAFETY: see above.
        unsafe { _mm256_blendv_ps(acc, _mm256_add_ps(acc, x), _mm256_castsi256_ps(m.lanes)) }
    }
    #[inline(always)]
    fn reduce_max(self, v: __m256) -> f32 {
        // SAFETY: see above.
        unsafe {
            let h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)))
        }
    }
    #[inline(always)]
    fn reduce_add(self, v: __m256) -> f32 {
        // SAFETY: see above.
        unsafe {
            let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)))
        }
    }
    #[inline(always)]
    fn exp(self, x: __m256) -> __m256 {
        // SAFETY: see above.
        unsafe { exp256(x) }
    }
}

/// Loads of 16-bit floats widened exactly to f32 lanes: f16 (the KV cache's, F16 weights') and
/// bf16 (BF16 weights'). The kernels that use them (attention, float-weight products) enable what
/// these need besides their [`F32s`] set: F16C, and for AVX-512 also BW and VL.
///
/// # Safety
/// As [`F32s`]: values exist only where the CPU has the instructions; callers of the methods are
/// compiled with F16C (and AVX-512 BW and VL for [`Avx512`]).
pub(crate) unsafe trait WideLoads: F32s {
    /// Lanes `m` of the f16 values at `p..p + LANES`, widened, the others zero.
    ///
    /// # Safety
    /// Lanes `m` of `p..p + LANES` are readable.
    unsafe fn load_f16(self, m: Self::M, p: *const half::f16) -> Self::V;
    /// # Safety
    /// `p..p + LANES` is readable.
    unsafe fn load_all_f16(self, p: *const half::f16) -> Self::V;
    /// The bf16 values at `p..p + LANES` (their bits), widened.
    ///
    /// # Safety
    /// `p..p + LANES` is readable.
    unsafe fn load_all_bf16(self, p: *const u16) -> Self::V;
}

// SAFETY: the kernels that meet these methods with an `Avx512` enable AVX-512 BW and VL and F16C
// as the trait's contract requires.
unsafe impl WideLoads for Avx512 {
    #[inline(always)]
    unsafe fn load_f16(self, m: __mmask16, p: *const half::f16) -> __m512 {
        // SAFETY: masked-off lanes are not read; the rest is the caller's contract.
        unsafe { _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p.cast())) }
    }
    #[inline(always)]
    unsafe fn load_all_f16(self, p: *const half::f16) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
    #[inline(always)]
    unsafe fn load_all_bf16(self, p: *const u16) -> __m512 {
        // SAFETY: the caller's contract. A bf16 is the top half of the f32 it stands for.
        unsafe {
            let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wide))
        }
    }
}

// SAFETY: the kernels that meet these methods with an `Avx2` enable F16C.
unsafe impl WideLoads for Avx2 {
    #[inline(always)]
    unsafe fn load_f16(self, m: Mask8, p: *const half::f16) -> __m256 {
        if self.is_full(m) {
            // SAFETY: the caller's contract.
            return unsafe { self.load_all_f16(p) };
        }
        // No 16-bit masked load: the lanes in `m` (a prefix) through a zeroed buffer.
        let mut buf = [half::f16::ZERO; 8];
        for (i, b) in buf.iter_mut().enumerate().take(m.count()) {
            // SAFETY: lane `i` is in `m`, readable by the caller's contract.
            *b = unsafe { *p.add(i) };
        }
        // SAFETY: `buf` holds 8 values.
        unsafe { self.load_all_f16(buf.as_ptr()) }
    }
    #[inline(always)]
    unsafe fn load_all_f16(self, p: *const half::f16) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn load_all_bf16(self, p: *const u16) -> __m256 {
        // SAFETY: the caller's contract. A bf16 is the top half of the f32 it stands for.
        unsafe {
            let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn avx512() -> bool {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma")
    }

    fn avx2() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    fn exp512_at(x: f32) -> f32 {
        let mut got = [0.0f32; 16];
        // SAFETY: callers check AVX-512 F and FMA.
        unsafe { _mm512_storeu_ps(got.as_mut_ptr(), exp(_mm512_set1_ps(x))) };
        got[0]
    }

    fn exp256_at(x: f32) -> f32 {
        let mut got = [0.0f32; 8];
        // SAFETY: callers check AVX2 and FMA.
        unsafe { _mm256_storeu_ps(got.as_mut_ptr(), exp256(_mm256_set1_ps(x))) };
        got[0]
    }

    fn assert_accurate(exp: fn(f32) -> f32) {
        for i in 0..2000 {
            let x = -(i as f32) * 0.0437;
            let got = exp(x);
            let want = f64::from(x).exp();
            assert!(
                (f64::from(got) - want).abs() <= 3e-7 * want + 1e-38,
                "exp({x}) = {got} vs {want}"
            );
        }
    }

    #[test]
    fn vector_exp_is_within_a_few_ulp() {
        if avx512() {
            assert_accurate(exp512_at);
        }
        if avx2() {
            assert_accurate(exp256_at);
        }
    }

    /// The 8-lane exp gives the 16-lane one's bits wherever the latter is finite below 88.37,
    /// including the clamp at −87 and positive arguments (SwiGLU's), and overflows to +∞.
    #[test]
    fn the_two_exps_agree_bitwise() {
        if !avx2() {
            return;
        }
        assert_eq!(exp256_at(89.0), f32::INFINITY);
        assert_eq!(exp256_at(1e9), f32::INFINITY);
        assert_eq!(exp256_at(f32::INFINITY), f32::INFINITY);
        assert!(exp256_at(88.3) > 1e38 && exp256_at(88.3).is_finite());
        if !avx512() {
            return;
        }
        for i in -20_000..=17_670 {
            let x = i as f32 * 0.005 + 0.000_37;
            assert_eq!(exp256_at(x).to_bits(), exp512_at(x).to_bits(), "exp({x})");
        }
        for x in [-1e9, -87.5, -87.0, -86.99, 0.0, -0.0] {
            assert_eq!(exp256_at(x).to_bits(), exp512_at(x).to_bits(), "exp({x})");
        }
    }
}
