//! Row-wise operations of a transformer layer: RMSNorm, RoPE, gated activations (SwiGLU,
//! GeGLU), biases, softmax. Each works on one row at a time and depends on nothing else, which
//! keeps the whole forward pass batch-invariant.

/// `out = x / sqrt(mean(x²) + eps) · weight`, the sum of squares accumulated in f64 (as GGML does).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert_eq!(x.len(), weight.len());
    let sum: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let scale = (1.0 / (sum / x.len() as f64 + f64::from(eps)).sqrt()) as f32;
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// How rotary position embedding pairs a head's dimensions (llama.cpp's rope types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeMode {
    /// Adjacent pairs (x₂ᵢ, x₂ᵢ₊₁): llama.
    Normal,
    /// The two halves (xᵢ, xᵢ₊ᵣ/₂) for r rotated dimensions: GPT-NeoX, Qwen, Gemma.
    Neox,
}

/// The angles RoPE turns by at one position: pair i of `rot_dims` turns by
/// `pos · freq_scale · base^(−2i/rot_dims) / divisorᵢ` (`divisors`: Llama 3's frequency
/// factors, 1 without them).
#[derive(Debug, Clone, Copy)]
pub struct RopeFreqs<'a> {
    pub rot_dims: usize,
    pub base: f32,
    pub freq_scale: f32,
    pub divisors: Option<&'a [f32]>,
}

/// (cos, sin) of each rotated pair's angle at `pos`: the same for every layer and for queries
/// and keys, so a forward pass computes them once per token. Angles are computed in f64, so large
/// positions lose no precision.
pub fn rope_angles(pos: usize, freqs: &RopeFreqs<'_>, out: &mut Vec<(f32, f32)>) {
    let n = freqs.rot_dims;
    debug_assert!(n.is_multiple_of(2));
    debug_assert!(freqs.divisors.is_none_or(|d| d.len() == n / 2));
    out.clear();
    out.extend((0..n / 2).map(|i| {
        let divisor = freqs.divisors.map_or(1.0, |d| f64::from(d[i]));
        let theta = pos as f64
            * f64::from(freqs.freq_scale)
            * f64::from(freqs.base).powf(-2.0 * i as f64 / n as f64)
            / divisor;
        let (sin, cos) = theta.sin_cos();
        (cos as f32, sin as f32)
    }));
}

/// Rotates each head's first `2 · angles.len()` dimensions by `angles`, paired as `mode` says;
/// the dimensions beyond pass through.
pub fn rope_apply(x: &mut [f32], head_dim: usize, mode: RopeMode, angles: &[(f32, f32)]) {
    let half = angles.len();
    debug_assert!(2 * half <= head_dim);
    let (step, offset) = match mode {
        RopeMode::Normal => (2, 1),
        RopeMode::Neox => (1, half),
    };
    for head in x.chunks_exact_mut(head_dim) {
        for (i, &(cos, sin)) in angles.iter().enumerate() {
            let (ia, ib) = (step * i, step * i + offset);
            let (a, b) = (head[ia], head[ib]);
            head[ia] = a * cos - b * sin;
            head[ib] = a * sin + b * cos;
        }
    }
}

/// The activation of a gated feed-forward's gate: SwiGLU's SiLU (llama, Qwen) or GeGLU's
/// tanh-approximated GELU (Gemma, `gelu_pytorch_tanh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    Silu,
    GeluTanh,
}

/// √(2/π), GELU's tanh approximation's constant.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic term's coefficient of that approximation.
const GELU_CUBIC: f32 = 0.044_715;

/// `gate ← act(gate) · up`. Both activations are `x · σ(z)`: SiLU with `z = x`, and the tanh
/// GELU `0.5·x·(1 + tanh(u))` with `z = 2u`, `u = √(2/π)·x·(1 + 0.044715·x²)` (the same function,
/// since `(1 + tanh u)/2 = σ(2u)`; computed exactly in f32, where llama.cpp's CPU GELU goes
/// through an f16 table).
pub fn gated_mul(act: Gate, gate: &mut [f32], up: &[f32]) {
    gated_mul_on(crate::gemm::isa(), act, gate, up);
}

/// [`gated_mul`] on the kernels of `isa` (which the CPU must have).
fn gated_mul_on(isa: crate::gemm::Isa, act: Gate, gate: &mut [f32], up: &[f32]) {
    use crate::gemm::Isa;
    assert_eq!(gate.len(), up.len());
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        assert!(isa.available(), "{isa:?} kernels on a CPU without them");
        if isa == Isa::Avx512 {
            // SAFETY: Avx512 means AVX-512 F and FMA (Isa::available, asserted).
            unsafe { gated_mul_avx512(act, gate, up) };
        } else {
            // SAFETY: Avx2 and above mean AVX2 and FMA (Isa::available, asserted).
            unsafe { gated_mul_avx2(act, gate, up) };
        }
        return;
    }
    let z = |x: f32| match act {
        Gate::Silu => x,
        Gate::GeluTanh => x * (2.0 * SQRT_2_OVER_PI + 2.0 * SQRT_2_OVER_PI * GELU_CUBIC * x * x),
    };
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-z(*g)).exp()) * u;
    }
}

/// [`gated_vector`] with AVX-512.
///
/// # Safety
/// The CPU must have AVX-512 F and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn gated_mul_avx512(act: Gate, gate: &mut [f32], up: &[f32]) {
    // SAFETY: the caller's contract.
    let s = unsafe { crate::simd::Avx512::new() };
    match act {
        Gate::Silu => gated_vector::<_, false>(s, gate, up),
        Gate::GeluTanh => gated_vector::<_, true>(s, gate, up),
    }
}

/// [`gated_vector`] with AVX2.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gated_mul_avx2(act: Gate, gate: &mut [f32], up: &[f32]) {
    // SAFETY: the caller's contract.
    let s = unsafe { crate::simd::Avx2::new() };
    match act {
        Gate::Silu => gated_vector::<_, false>(s, gate, up),
        Gate::GeluTanh => gated_vector::<_, true>(s, gate, up),
    }
}

/// [`gated_mul`] a register at a time (masked tail: every element gets the same arithmetic);
/// `GELU` picks the tanh GELU, else SiLU.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn gated_vector<S: crate::simd::F32s, const GELU: bool>(s: S, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    let one = s.splat(1.0);
    let (c1, c3) = (
        s.splat(2.0 * SQRT_2_OVER_PI),
        s.splat(2.0 * SQRT_2_OVER_PI * GELU_CUBIC),
    );
    for c in (0..gate.len()).step_by(S::LANES) {
        let m = s.mask(gate.len() - c);
        // SAFETY: lanes past the end are masked off; `up` is as long as `gate` (asserted).
        unsafe {
            let g = s.load(m, gate.as_ptr().add(c));
            let u = s.load(m, up.as_ptr().add(c));
            let z = if GELU {
                s.mul(g, s.fmadd(s.mul(g, g), c3, c1))
            } else {
                g
            };
            let e = s.exp(s.sub(s.zero(), z));
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

/// `x += bias` on every row of `x` (`bias.len()` wide).
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add_assign(row, bias);
    }
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

    fn rope(x: &mut [f32], mode: RopeMode, pos: usize, divisors: Option<&[f32]>) {
        let mut angles = Vec::new();
        let freqs = RopeFreqs {
            rot_dims: 64,
            base: 10000.0,
            freq_scale: 1.0,
            divisors,
        };
        rope_angles(pos, &freqs, &mut angles);
        rope_apply(x, 64, mode, &angles);
    }

    #[test]
    fn rope_rotates_pairs_and_keeps_norms() {
        let before: Vec<f32> = (0..128).map(|i| (i as f32 * 0.37).sin()).collect();
        // (mode, the partner of dimension d of a head for d in the first half)
        let partner = [
            (RopeMode::Normal, (|d| d + 1) as fn(usize) -> usize, 2),
            (RopeMode::Neox, |d| d + 32, 1),
        ];
        for (mode, partner, step) in partner {
            let mut x = before.clone();
            rope(&mut x, mode, 7, None);
            // Pair 0 of head 1 turns by exactly 7 radians; pair i by 7 · 10000^(−2i/64).
            for (i, pair) in [(0usize, 7.0f64), (5, 7.0 * 10000f64.powf(-10.0 / 64.0))] {
                let d = 64 + step * i;
                let (a, b) = (f64::from(before[d]), f64::from(before[partner(d)]));
                let want = a * pair.cos() - b * pair.sin();
                assert!((f64::from(x[d]) - want).abs() < 1e-6, "{mode:?} pair {i}");
            }
            for d in (0..128).filter(|d| partner(d % 64) < 64 && (d % 64) % step == 0) {
                let (e, f) = (d, d - d % 64 + partner(d % 64));
                let n0 = before[e].hypot(before[f]);
                let n1 = x[e].hypot(x[f]);
                assert!((n0 - n1).abs() < 1e-5, "{mode:?} norm of pair ({e}, {f})");
            }
            let mut y = before.clone();
            rope(&mut y, mode, 0, None);
            assert_eq!(y, before, "position 0 is the identity");
        }
    }

    #[test]
    fn rope_frequency_divisors_slow_each_pair_down() {
        // Dividing pair i's frequency by dᵢ equals turning by the angle of position pos / dᵢ
        // (for that pair): compare with a position 4 times smaller on a divisor of 4.
        let before: Vec<f32> = (0..64).map(|i| (i as f32 * 0.91).cos()).collect();
        let (mut x, mut y) = (before.clone(), before.clone());
        rope(&mut x, RopeMode::Normal, 40, Some(&[4.0; 32]));
        rope(&mut y, RopeMode::Normal, 10, None);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 1e-6);
        }
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
            gated_mul_on(isa, Gate::Silu, &mut g, &up);
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
            gated_mul_on(isa, Gate::Silu, &mut g, &[1.0; 3]);
            assert_eq!(g, [-0.0, -0.0, 100.0], "{isa:?}");
        }
    }

    #[test]
    fn gelu_tanh_against_f64() {
        let gelu = |x: f64| {
            0.5 * x
                * (1.0
                    + ((2.0 / std::f64::consts::PI).sqrt() * x * (1.0 + 0.044715 * x * x)).tanh())
        };
        // 37 values across −11..11 (beyond ±10, where llama.cpp's table stops) and a masked tail.
        let g0: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) * 0.61).collect();
        let up: Vec<f32> = (0..37).map(|i| 1.0 - i as f32 * 0.05).collect();
        for isa in [Isa::Portable, Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
            if !isa.available() {
                continue;
            }
            let mut g = g0.clone();
            gated_mul_on(isa, Gate::GeluTanh, &mut g, &up);
            for i in 0..37 {
                let want = gelu(f64::from(g0[i])) * f64::from(up[i]);
                assert!(
                    (f64::from(g[i]) - want).abs() <= 1e-6 * want.abs().max(1e-3),
                    "{isa:?} {i}: {} vs {want}",
                    g[i]
                );
            }
            let mut g = vec![-30.0, -1e30, 30.0, 0.0];
            gated_mul_on(isa, Gate::GeluTanh, &mut g, &[1.0; 4]);
            assert_eq!(g, [-0.0, -0.0, 30.0, 0.0], "{isa:?}");
        }
    }
}
