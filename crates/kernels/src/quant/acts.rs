//! Activations quantised to 16 bits per value in blocks of 32, the right-hand side of every
//! quantised dot product. GGML uses 8 bits here (Q8_0/Q8_1), and that rounding is almost all of
//! llama.cpp's distance from the exact model; 16 bits keep the product within f32 rounding of
//! exact while still using integer multiply-adds (`vpmaddwd`, `vpdpwssd`).

/// 32 activations: value ≈ `d · qs[i]`; `s = d · Σ qs` serves weights with an offset (Q4_1).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[repr(C, align(64))]
pub struct BlockQ16 {
    pub qs: [i16; 32],
    pub d: f32,
    pub s: f32,
}

pub const ACT_BLOCK: usize = 32;

/// Largest quantised magnitude. One below i16::MAX keeps `−q` representable as well.
const QMAX: f32 = 32767.0;

/// Quantises `x` (a multiple of 32 values) into `out` (one block per 32 values). Depends on the
/// row alone, so a sequence's activations quantise the same whatever batch it is in.
pub fn quantize_row(x: &[f32], out: &mut [BlockQ16]) {
    assert_eq!(
        x.len(),
        out.len() * ACT_BLOCK,
        "row length must be 32 × blocks"
    );
    for (xs, block) in x.chunks_exact(ACT_BLOCK).zip(out.iter_mut()) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / QMAX;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in block.qs.iter_mut().zip(xs) {
            *q = (v * inv).round().clamp(-QMAX, QMAX) as i16;
            sum += i32::from(*q);
        }
        block.d = d;
        block.s = d * sum as f32;
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
        quantize_row(&x, &mut b);
        for (i, &v) in x.iter().enumerate() {
            let blk = &b[i / 32];
            let back = blk.d * blk.qs[i % 32] as f32;
            assert!((back - v).abs() <= blk.d * 0.5 + 1e-6, "{v} -> {back}");
            // Half a step is 1/65534 of the block's largest magnitude.
            assert!((back - v).abs() <= 1.6e-5 * blk.d * QMAX);
        }
        let s0: i32 = b[0].qs.iter().map(|&q| i32::from(q)).sum();
        assert_eq!(b[0].s, b[0].d * s0 as f32);
        assert_eq!(b[0].qs.iter().map(|q| q.unsigned_abs()).max(), Some(32767));
    }

    #[test]
    fn zeros_stay_zero() {
        let mut b = [BlockQ16::default(); 1];
        quantize_row(&[0.0; 32], &mut b);
        assert_eq!(b[0], BlockQ16::default());
    }
}
