//! Scalar dequantisation of GGML blocks into f32, following GGML's reference C code exactly
//! (same arithmetic, same order), so that it matches the `gguf` Python package bit for bit.

use super::{GgmlType, QuantError};
use half::{bf16, f16};

/// The f16 at `b[at..at + 2]` as f32.
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// The fifth bits of values `j` and `j + 16` of a Q5 block, from its 32-bit `qh`, at bit 4.
pub(crate) fn fifth_bits(qh: u32, j: usize) -> (u8, u8) {
    (
        (((qh >> j) << 4) & 0x10) as u8,
        ((qh >> (j + 12)) & 0x10) as u8,
    )
}

/// Whether `dequantize` handles this type.
pub fn supports_dequantize(dtype: GgmlType) -> bool {
    !matches!(dtype, GgmlType::Q2_K | GgmlType::Q3_K)
}

/// Dequantises `out.len()` values stored as `dtype` in `bytes`.
pub fn dequantize(dtype: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    if dtype.bytes_for(out.len()) != Some(bytes.len()) {
        return Err(QuantError::SizeMismatch {
            dtype,
            bytes: bytes.len(),
            values: out.len(),
        });
    }
    let blocks = bytes
        .chunks_exact(dtype.type_size())
        .zip(out.chunks_exact_mut(dtype.block_size()));
    match dtype {
        GgmlType::F32 => {
            blocks.for_each(|(b, y)| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
        GgmlType::F16 => blocks.for_each(|(b, y)| y[0] = f16_at(b, 0)),
        GgmlType::BF16 => {
            blocks.for_each(|(b, y)| y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32())
        }
        GgmlType::Q4_0 => blocks.for_each(|(b, y)| q4_0(b, y)),
        GgmlType::Q4_1 => blocks.for_each(|(b, y)| q4_1(b, y)),
        GgmlType::Q5_0 => blocks.for_each(|(b, y)| q5_0(b, y)),
        GgmlType::Q5_1 => blocks.for_each(|(b, y)| q5_1(b, y)),
        GgmlType::Q8_0 => blocks.for_each(|(b, y)| q8_0(b, y)),
        GgmlType::Q8_1 => blocks.for_each(|(b, y)| q8_1(b, y)),
        GgmlType::Q4_K => blocks.for_each(|(b, y)| q4_k(b, y)),
        GgmlType::Q5_K => blocks.for_each(|(b, y)| q5_k(b, y)),
        GgmlType::Q6_K => blocks.for_each(|(b, y)| q6_k(b, y)),
        GgmlType::Q8_K => blocks.for_each(|(b, y)| q8_k(b, y)),
        GgmlType::Q2_K | GgmlType::Q3_K => return Err(QuantError::Unsupported(dtype)),
    }
    Ok(())
}

/// `{f16 d; u8 qs[16]}`: low nibbles are values 0..16, high nibbles 16..32, offset by 8.
fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..16 {
        let q = b[2 + j];
        y[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
        y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

/// `{f16 d; f16 m; u8 qs[16]}`: value = q·d + m.
fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for j in 0..16 {
        let q = b[4 + j];
        y[j] = (q & 0x0f) as f32 * d + m;
        y[j + 16] = (q >> 4) as f32 * d + m;
    }
}

/// `{f16 d; u8 qh[4]; u8 qs[16]}`: a fifth bit per value in `qh`, offset by 16.
fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (y, u) in y.iter_mut().zip(q5_values(&b[2..22])) {
        *y = (u as i32 - 16) as f32 * d;
    }
}

/// The 32 five-bit values of a Q5_0/Q5_1 block from its `qh[4]` and `qs[16]` (`bits`): byte j
/// of `qs` holds values j and j + 16's low four bits, `qh` their fifth.
pub(crate) fn q5_values(bits: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes([bits[0], bits[1], bits[2], bits[3]]);
    let mut u = [0u8; 32];
    for j in 0..16 {
        let q = bits[4 + j];
        let (h0, h1) = fifth_bits(qh, j);
        u[j] = (q & 0x0f) | h0;
        u[j + 16] = (q >> 4) | h1;
    }
    u
}

/// `{f16 d; f16 m; u8 qh[4]; u8 qs[16]}`: value = q·d + m with 5-bit q.
fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (y, u) in y.iter_mut().zip(q5_values(&b[4..24])) {
        *y = u as f32 * d + m;
    }
}

/// `{f16 d; i8 qs[32]}`.
fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..32 {
        y[j] = b[2 + j] as i8 as f32 * d;
    }
}

/// `{f16 d; f16 s; i8 qs[32]}` (`s` = d·Σq, used by dot products only).
fn q8_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..32 {
        y[j] = b[4 + j] as i8 as f32 * d;
    }
}

/// The 6-bit scale and min of sub-block `j` of a Q4_K/Q5_K block's packed `scales[12]`.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Scale and offset (`d·sc`, `dmin·m`) of the two 32-value sub-blocks of 64-value chunk `chunk`.
fn k4_pair_scales(chunk: usize, scales: &[u8], d: f32, min: f32) -> ((f32, f32), (f32, f32)) {
    let (sc1, m1) = scale_min_k4(2 * chunk, scales);
    let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
    (
        (d * sc1 as f32, min * m1 as f32),
        (d * sc2 as f32, min * m2 as f32),
    )
}

/// Sub-block `j` (of 8) of a Q4_K block: its 32 values `u` (0..15), and the scale `d·sc` and
/// min `dmin·m` the dequantisation applies (`u·(d·sc) − dmin·m`), computed as [`dequantize`]
/// does.
pub(crate) fn q4_k_sub_block(b: &[u8], j: usize) -> ([u8; 32], f32, f32) {
    let (d, min) = (f16_at(b, 0), f16_at(b, 2));
    let ((d1, m1), (d2, m2)) = k4_pair_scales(j / 2, &b[4..16], d, min);
    let q = &b[16 + 32 * (j / 2)..16 + 32 * (j / 2) + 32];
    let high = j % 2 == 1;
    let u = std::array::from_fn(|l| if high { q[l] >> 4 } else { q[l] & 0x0f });
    if high { (u, d2, m2) } else { (u, d1, m1) }
}

/// `{f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}`: 8 sub-blocks of 32, value = d·sc·q − dmin·m.
fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, min) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (chunk, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let ((d1, m1), (d2, m2)) = k4_pair_scales(chunk, scales, d, min);
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0x0f) as f32 - m1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// `{f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}`: Q4_K with a fifth bit in `qh`.
fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, min) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (chunk, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let ((d1, m1), (d2, m2)) = k4_pair_scales(chunk, scales, d, min);
        let (u1, u2) = (1u8 << (2 * chunk), 2u8 << (2 * chunk));
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((q[l] & 0x0f) + h1) as f32 - m1;
            y[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
        }
    }
}

/// `{u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}`: 16 sub-blocks of 16, 6-bit q offset by 32.
fn q6_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 208);
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        let y = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

/// `{f32 d; i8 qs[256]; i16 bsums[16]}`.
fn q8_k(b: &[u8], y: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for j in 0..256 {
        y[j] = b[4 + j] as i8 as f32 * d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_1_by_hand() {
        // d = 0.5, m = -1.0, nibbles 0..15 in the low half and 15..0 in the high half.
        let mut b = vec![0u8; 20];
        b[0..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        b[2..4].copy_from_slice(&f16::from_f32(-1.0).to_le_bytes());
        for j in 0..16 {
            b[4 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut y = [0f32; 32];
        dequantize(GgmlType::Q4_1, &b, &mut y).unwrap();
        for j in 0..16 {
            assert_eq!(y[j], j as f32 * 0.5 - 1.0);
            assert_eq!(y[j + 16], (15 - j) as f32 * 0.5 - 1.0);
        }
    }

    #[test]
    fn q8_0_and_q4_0_by_hand() {
        let mut b = vec![0u8; 34];
        b[0..2].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
        for j in 0..32 {
            b[2 + j] = (j as i8 - 16) as u8;
        }
        let mut y = [0f32; 32];
        dequantize(GgmlType::Q8_0, &b, &mut y).unwrap();
        assert_eq!(y[0], -4.0);
        assert_eq!(y[31], 15.0 * 0.25);
        let mut b = vec![0x8fu8; 18];
        b[0..2].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
        dequantize(GgmlType::Q4_0, &b, &mut y).unwrap();
        assert_eq!((y[0], y[16]), ((15 - 8) as f32 * 2.0, 0.0));
    }

    #[test]
    fn sizes_are_checked() {
        let mut y = [0f32; 32];
        assert!(matches!(
            dequantize(GgmlType::Q4_1, &[0u8; 19], &mut y),
            Err(QuantError::SizeMismatch { .. })
        ));
        let mut y = [0f32; 256];
        assert_eq!(
            dequantize(GgmlType::Q2_K, &[0u8; 84], &mut y),
            Err(QuantError::Unsupported(GgmlType::Q2_K))
        );
    }
}
