//! Row-wise operations of a transformer layer: RMSNorm, RoPE, SwiGLU, softmax. Each works on one
//! row at a time and depends on nothing else, which keeps the whole forward pass batch-invariant.

/// `out = x / sqrt(mean(x²) + eps) · weight`, the sum of squares accumulated in f64 (as GGML does).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert_eq!(x.len(), weight.len());
    let sum: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let scale = (1.0 / (sum / x.len() as f64 + f64::from(eps)).sqrt()) as f32;
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// Rotary position embedding as llama.cpp applies it to `llama` models ("normal" mode): each
/// head's adjacent pairs (x₂ᵢ, x₂ᵢ₊₁) rotate by `pos · base^(−2i/rot_dims)`. Angles are computed in
/// f64, so large positions lose no precision.
pub fn rope_normal(x: &mut [f32], head_dim: usize, rot_dims: usize, pos: usize, base: f32) {
    let mut angles = Vec::new();
    rope_angles(pos, rot_dims, base, &mut angles);
    rope_apply(x, head_dim, &angles);
}

/// (cos, sin) of each rotated pair's angle at `pos`: the same for every layer and for queries
/// and keys, so a forward pass computes them once per token.
pub fn rope_angles(pos: usize, rot_dims: usize, base: f32, out: &mut Vec<(f32, f32)>) {
    debug_assert!(rot_dims.is_multiple_of(2));
    out.clear();
    out.extend((0..rot_dims / 2).map(|i| {
        let theta = pos as f64 * f64::from(base).powf(-2.0 * i as f64 / rot_dims as f64);
        let (sin, cos) = theta.sin_cos();
        (cos as f32, sin as f32)
    }));
}

/// Rotates each head's first `2 · angles.len()` dimensions pairwise (see [`rope_normal`]).
pub fn rope_apply(x: &mut [f32], head_dim: usize, angles: &[(f32, f32)]) {
    debug_assert!(2 * angles.len() <= head_dim);
    for head in x.chunks_exact_mut(head_dim) {
        for (i, &(cos, sin)) in angles.iter().enumerate() {
            let (a, b) = (head[2 * i], head[2 * i + 1]);
            head[2 * i] = a * cos - b * sin;
            head[2 * i + 1] = a * sin + b * cos;
        }
    }
}

/// `gate ← silu(gate) · up`, SwiGLU's gating.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    silu_mul_on(crate::gemm::isa(), gate, up);
}

/// [`silu_mul`] on the kernels of `isa` (which the CPU must have).
fn silu_mul_on(isa: crate::gemm::Isa, gate: &mut [f32], up: &[f32]) {
    use crate::gemm::Isa;
    assert_eq!(gate.len(), up.len());
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        assert!(isa.available(), "{isa:?} kernels on a CPU without them");
        if isa == Isa::Avx512 {
            // SAFETY: Avx512 means AVX-512 F and FMA (Isa::available, asserted).
            unsafe { silu_mul_avx512(gate, up) };
        } else {
            // SAFETY: Avx2 and above mean AVX2 and FMA (Isa::available, asserted).
            unsafe { silu_mul_avx2(gate, up) };
        }
        return;
    }
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// [`silu_vector`] with AVX-512.
///
/// # Safety
/// The CPU must have AVX-512 F and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn silu_mul_avx512(gate: &mut [f32], up: &[f32]) {
    // SAFETY: the caller's contract.
    silu_vector(unsafe { crate::simd::Avx512::new() }, gate, up);
}

/// [`silu_vector`] with AVX2.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) {
    // SAFETY: the caller's contract.
    silu_vector(unsafe { crate::simd::Avx2::new() }, gate, up);
}

/// [`silu_mul`] a register at a time (masked tail: every element gets the same arithmetic).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn silu_vector<S: crate::simd::F32s>(s: S, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    let one = s.splat(1.0);
    for c in (0..gate.len()).step_by(S::LANES) {
        let m = s.mask(gate.len() - c);
        // SAFETY: lanes past the end are masked off; `up` is as long as `gate` (asserted).
        unsafe {
            let g = s.load(m, gate.as_ptr().add(c));
            let u = s.load(m, up.as_ptr().add(c));
            let e = s.exp(s.sub(s.zero(), g));
            let y = s.mul(s.div(g, s.add(one, e)), u);
            s.store(gate.as_mut_ptr().add(c), m, y);
        }
    }
}

/// In-place softmax.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// A dot product in eight interleaved partial sums: a fixed order that the compiler vectorises.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut lanes = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (xa, xb) in ca.zip(cb) {
        for i in 0..8 {
            lanes[i] += xa[i] * xb[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `acc += x`.
pub fn add_assign(acc: &mut [f32], x: &[f32]) {
    acc.iter_mut().zip(x).for_each(|(a, &b)| *a += b);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::Isa;

    #[test]
    fn rms_norm_against_f64() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) * 0.1).collect();
        let w: Vec<f32> = (0..64).map(|i| 1.0 + i as f32 * 0.01).collect();
        let mut out = vec![0.0; 64];
        rms_norm(&x, &w, 1e-5, &mut out);
        let ms: f64 = x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / 64.0;
        for i in 0..64 {
            let want = x[i] as f64 / (ms + 1e-5).sqrt() * w[i] as f64;
            assert!((out[i] as f64 - want).abs() < 1e-6 * want.abs().max(1.0));
        }
    }

    #[test]
    fn rope_rotates_pairs_and_keeps_norms() {
        let mut x: Vec<f32> = (0..128).map(|i| (i as f32 * 0.37).sin()).collect();
        let before = x.clone();
        rope_normal(&mut x, 64, 64, 7, 10000.0);
        // Pair 0 of head 1 turns by exactly 7 radians.
        let (a, b) = (before[64], before[65]);
        assert!((x[64] - (a * 7f32.cos() - b * 7f32.sin())).abs() < 1e-6);
        for p in 0..64 {
            let n0 = before[2 * p].hypot(before[2 * p + 1]);
            let n1 = x[2 * p].hypot(x[2 * p + 1]);
            assert!((n0 - n1).abs() < 1e-5);
        }
        let mut y = before.clone();
        rope_normal(&mut y, 64, 64, 0, 10000.0);
        assert_eq!(y, before, "position 0 is the identity");
    }

    #[test]
    fn softmax_and_silu() {
        let mut x = vec![1.0, 2.0, 3.0];
        softmax(&mut x);
        let e: Vec<f64> = [1.0f64, 2.0, 3.0].iter().map(|v| v.exp()).collect();
        let s: f64 = e.iter().sum();
        for i in 0..3 {
            assert!((x[i] as f64 - e[i] / s).abs() < 1e-7);
        }
        // 37 values: two full 16-lane chunks (four of 8) and a masked tail.
        let g0: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) * 0.7).collect();
        let up: Vec<f32> = (0..37).map(|i| 1.0 + i as f32 * 0.1).collect();
        for isa in [Isa::Portable, Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
            if !isa.available() {
                continue;
            }
            let mut g = g0.clone();
            silu_mul_on(isa, &mut g, &up);
            for i in 0..37 {
                let (x, u) = (f64::from(g0[i]), f64::from(up[i]));
                let want = x / (1.0 + (-x).exp()) * u;
                assert!(
                    (f64::from(g[i]) - want).abs() <= 4e-7 * want.abs(),
                    "{isa:?} {i}"
                );
            }
            assert_eq!(g[18], 0.0);
            // Far below zero silu is −0 (e^−x overflows), and nothing is NaN.
            let mut g = vec![-100.0, -1e30, 100.0];
            silu_mul_on(isa, &mut g, &[1.0; 3]);
            assert_eq!(g, [-0.0, -0.0, 100.0], "{isa:?}");
        }
    }
}
