//! Vector helpers shared by the x86-64 kernels.

use std::arch::x86_64::*;

/// e^x, accurate to about 2 ulp for the softmax's arguments (x ≤ 0): 2^n · p(r) with
/// r = x − n·ln 2 and p a degree-6 polynomial.
#[inline]
#[target_feature(enable = "avx512f,fma")]
pub(crate) fn exp(x: __m512) -> __m512 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = _mm512_max_ps(x, _mm512_set1_ps(-87.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    _mm512_scalef_ps(p, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_exp_is_within_a_few_ulp() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        for i in 0..2000 {
            let x = -(i as f32) * 0.0437;
            let mut got = [0.0f32; 16];
            // SAFETY: AVX-512F checked above.
            unsafe { _mm512_storeu_ps(got.as_mut_ptr(), exp(_mm512_set1_ps(x))) };
            let want = f64::from(x).exp();
            assert!(
                (f64::from(got[0]) - want).abs() <= 3e-7 * want + 1e-38,
                "exp({x}) = {} vs {want}",
                got[0]
            );
        }
    }
}
