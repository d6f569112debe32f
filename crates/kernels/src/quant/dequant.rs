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
        GgmlType::Q2_K | GgmlType::Q3_K => blocks.for_each(|(b, y)| k_sub_blocks(dtype, b, y)),
        GgmlType::IQ4_NL => blocks.for_each(|(b, y)| iq4_nl(b, y)),
        GgmlType::IQ4_XS => blocks.for_each(|(b, y)| iq4_xs(b, y)),
        GgmlType::I32 => {
            blocks.for_each(|(b, y)| y[0] = i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32)
        }
        GgmlType::I64 => blocks
            .for_each(|(b, y)| y[0] = i64::from_le_bytes(b.try_into().expect("8 bytes")) as f32),
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

/// The 16 values IQ4_NL and IQ4_XS index (GGML's `kvalues_iq4nl`): a non-linear 4-bit grid.
pub(crate) const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The 32 table indices of 16 bytes of nibbles: low nibbles are values 0..16, high ones 16..32.
pub(crate) fn iq4_indices(qs: &[u8]) -> [u8; 32] {
    std::array::from_fn(|j| {
        let q = qs[j % 16];
        if j < 16 { q & 0x0f } else { q >> 4 }
    })
}

/// IQ4's table values plus [`IQ4_OFFSET`]: the packed layout's unsigned values (0..=240), in
/// index order (a byte-shuffle table for the kernels).
pub(crate) const IQ4_UNSIGNED: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (IQ4_VALUES[i] as i16 + IQ4_OFFSET) as u8;
        i += 1;
    }
    t
};

/// The packed layout's unsigned values of 32 indices.
pub(crate) fn iq4_unsigned(indices: [u8; 32]) -> [u8; 32] {
    indices.map(|i| IQ4_UNSIGNED[usize::from(i)])
}

/// The index of an unsigned IQ4 value (one of [`IQ4_UNSIGNED`]; the table is increasing).
pub(crate) fn iq4_index(u: u8) -> u8 {
    let at = IQ4_UNSIGNED.partition_point(|&v| v < u);
    debug_assert_eq!(IQ4_UNSIGNED.get(at), Some(&u), "{u} is not an IQ4 value");
    at as u8
}

/// The 32 table indices of IQ4_XS sub-block `j`.
fn iq4_xs_indices(b: &[u8], j: usize) -> [u8; 32] {
    iq4_indices(&b[8 + 16 * j..24 + 16 * j])
}

/// `{f16 d; u8 qs[16]}`: value = d · table[index] (both factors exact, one rounding).
fn iq4_nl(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (y, i) in y.iter_mut().zip(iq4_indices(&b[2..18])) {
        *y = d * f32::from(IQ4_VALUES[usize::from(i)]);
    }
}

/// The signed 6-bit scale of IQ4_XS sub-block `j` (its low four bits in `scales_l`, the top two
/// in `scales_h`), less 32.
fn iq4_xs_scale(b: &[u8], j: usize) -> i8 {
    let high = u16::from_le_bytes([b[2], b[3]]);
    let low = (b[4 + j / 2] >> (4 * (j % 2))) & 0x0f;
    (low | ((((high >> (2 * j)) & 3) as u8) << 4)) as i8 - 32
}

/// `{f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}`: sub-block j's value = (d · scale_j) ·
/// table[index], as GGML forms it (d · scale_j is exact in f32, and so is its product with a
/// table value: 11 + 6 + 7 significant bits).
fn iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (j, y) in y.chunks_exact_mut(32).enumerate() {
        let dl = d * f32::from(iq4_xs_scale(b, j));
        for (y, i) in y.iter_mut().zip(iq4_xs_indices(b, j)) {
            *y = dl * f32::from(IQ4_VALUES[usize::from(i)]);
        }
    }
}

/// A 32-value sub-block of a K-quant super-block as the packed layout keeps it: its unsigned
/// values `u` and two scale bytes `s`, whose meaning [`k_scales`] knows (Q4_K/Q5_K: 6-bit scale
/// and min; Q6_K/Q3_K: the signed scale of each half; Q2_K: each half's 4-bit scale and min).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct KSub {
    pub u: [u8; 32],
    pub s: [u8; 2],
}

/// Sub-block `j` (of 8) of K-quant block `b`.
pub(crate) fn k_sub_block(dtype: GgmlType, b: &[u8], j: usize) -> KSub {
    match dtype {
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let five = dtype == GgmlType::Q5_K;
            let at = if five { 48 } else { 16 } + 32 * (j / 2);
            let q = &b[at..at + 32];
            let u = std::array::from_fn(|l| {
                let low = if j % 2 == 1 { q[l] >> 4 } else { q[l] & 0x0f };
                // Q5_K: the fifth bit of sub-block j is bit j of qh[l].
                if five {
                    low | (((b[16 + l] >> j) & 1) << 4)
                } else {
                    low
                }
            });
            let (sc, m) = scale_min_k4(j, &b[4..16]);
            KSub { u, s: [sc, m] }
        }
        GgmlType::Q6_K => {
            // ql[64h + l (+32)] low or high nibble, qh[32h + l] bits 2s..2s+2 (see `q6_k`).
            let (h, s) = (j / 4, j % 4);
            let (ql, qh) = (&b[64 * h..64 * h + 64], &b[128 + 32 * h..128 + 32 * h + 32]);
            let u = std::array::from_fn(|l| {
                let low = ql[l + 32 * (s % 2)];
                let low = if s < 2 { low & 0x0f } else { low >> 4 };
                low | (((qh[l] >> (2 * s)) & 3) << 4)
            });
            let sc = 192 + 8 * h + 2 * s;
            KSub {
                u,
                s: [b[sc], b[sc + 1]],
            }
        }
        GgmlType::Q3_K => {
            // Low bits 2·(j % 4) of qs[32·(j / 4) + l], +4 where bit j of hmask[l] is set.
            let q = &b[32 + 32 * (j / 4)..32 + 32 * (j / 4) + 32];
            let shift = 2 * (j % 4);
            let u = std::array::from_fn(|l| ((q[l] >> shift) & 3) | (((b[l] >> j) & 1) << 2));
            let s = [0, 1].map(|h| q3_k_scale(&b[96..108], 2 * j + h) as i8 as u8);
            KSub { u, s }
        }
        GgmlType::Q2_K => {
            // Bits 2·(j % 4) of qs[32·(j / 4) + l]; per half a byte of 4-bit scale and min.
            let q = &b[16 + 32 * (j / 4)..16 + 32 * (j / 4) + 32];
            let shift = 2 * (j % 4);
            KSub {
                u: std::array::from_fn(|l| (q[l] >> shift) & 3),
                s: [b[2 * j], b[2 * j + 1]],
            }
        }
        GgmlType::IQ4_XS => {
            // Table values shifted to 0..=240; the sub-block's one scale in both bytes.
            let sc = iq4_xs_scale(b, j) as u8;
            KSub {
                u: iq4_unsigned(iq4_xs_indices(b, j)),
                s: [sc, sc],
            }
        }
        _ => unreachable!("{dtype} is not a K-quant with sub-blocks"),
    }
}

/// What the packed layout adds to IQ4's table values to make them unsigned (0..=240).
pub(crate) const IQ4_OFFSET: i16 = 127;

/// The offset of the types whose values, made unsigned, sit a fixed multiple of the scale above
/// the stored ones (`w = d·(u + f)`): `f`, or `None` for the types with a min of their own.
pub(crate) const fn fixed_offset(dtype: GgmlType) -> Option<i32> {
    match dtype {
        GgmlType::Q4_0 => Some(-8),
        GgmlType::Q5_0 => Some(-16),
        GgmlType::Q8_0 => Some(-128),
        GgmlType::Q6_K => Some(-32),
        GgmlType::Q3_K => Some(-4),
        GgmlType::IQ4_NL | GgmlType::IQ4_XS => Some(-(IQ4_OFFSET as i32)),
        _ => None,
    }
}

/// The f16 `d` and `dmin` of K-quant block `b` (`dmin` 0 where the type has none).
pub(crate) fn k_super_scales(dtype: GgmlType, b: &[u8]) -> [[u8; 2]; 2] {
    let at = |i: usize| [b[i], b[i + 1]];
    match dtype {
        GgmlType::Q4_K | GgmlType::Q5_K => [at(0), at(2)],
        GgmlType::Q6_K => [at(208), [0; 2]],
        GgmlType::Q3_K => [at(108), [0; 2]],
        GgmlType::IQ4_XS => [at(0), [0; 2]],
        GgmlType::Q2_K => [at(80), at(82)],
        _ => unreachable!("{dtype} is not a K-quant with sub-blocks"),
    }
}

/// Per half of a sub-block, the scale `d` and offset `c` with value = `d·u + c`, from its scale
/// bytes and the super-block's `d`, `dmin` (every product exact in f32, as GGML forms them).
pub(crate) fn k_scales(dtype: GgmlType, s: [u8; 2], d: f32, dmin: f32) -> ([f32; 2], [f32; 2]) {
    match dtype {
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (sc, c) = (d * f32::from(s[0]), -(dmin * f32::from(s[1])));
            ([sc; 2], [c; 2])
        }
        GgmlType::Q6_K | GgmlType::Q3_K | GgmlType::IQ4_XS => {
            let sc = s.map(|x| d * f32::from(x as i8));
            let f = fixed_offset(dtype).expect("these types have a fixed offset");
            (sc, sc.map(|x| x * f as f32))
        }
        GgmlType::Q2_K => (
            s.map(|x| d * f32::from(x & 0x0f)),
            s.map(|x| -(dmin * f32::from(x >> 4))),
        ),
        _ => unreachable!("{dtype} is not a K-quant with sub-blocks"),
    }
}

/// Dequantises a K-quant super-block through its eight sub-blocks (Q2_K and Q3_K, whose values
/// come out exactly as GGML's `d·sc·q − dmin·m` and `d·sc·(q − 4)`).
fn k_sub_blocks(dtype: GgmlType, b: &[u8], y: &mut [f32]) {
    let [d, dmin] = k_super_scales(dtype, b).map(|h| f16::from_le_bytes(h).to_f32());
    for (j, y) in y.chunks_exact_mut(32).enumerate() {
        let sub = k_sub_block(dtype, b, j);
        let (sc, c) = k_scales(dtype, sub.s, d, dmin);
        for (l, y) in y.iter_mut().enumerate() {
            *y = sc[l / 16] * f32::from(sub.u[l]) + c[l / 16];
        }
    }
}

/// The signed 6-bit scale `i` (of 16) of a Q3_K block's packed `scales[12]`, less 32.
fn q3_k_scale(scales: &[u8], i: usize) -> i32 {
    let low = if i < 8 {
        scales[i] & 0x0f
    } else {
        scales[i - 8] >> 4
    };
    let high = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
    i32::from(low | (high << 4)) - 32
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
    fn iq4_by_hand() {
        // IQ4_NL: d = 0.5, indices 0..15 in the low nibbles, 15..0 in the high ones.
        let mut b = vec![0u8; 18];
        b[0..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        for j in 0..16 {
            b[2 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut y = [0f32; 32];
        dequantize(GgmlType::IQ4_NL, &b, &mut y).unwrap();
        assert_eq!((y[0], y[15], y[16]), (-63.5, 56.5, 56.5));
        // IQ4_XS: d = 0.25; sub-block 1's scale 33 (low nibble 1 of scales_l[0]'s high half, top
        // bits 2 of scales_h bits 2..4), so 33 − 32 = 1; index 8 everywhere (table value 1).
        let mut b = vec![0x88u8; 136];
        b[0..2].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
        b[2..4].copy_from_slice(&(2u16 << 2).to_le_bytes());
        b[4] = 1 << 4;
        let mut y = [0f32; 256];
        dequantize(GgmlType::IQ4_XS, &b, &mut y).unwrap();
        assert_eq!((y[32], y[63]), (0.25, 0.25));
        assert_eq!(y[0], 0.25 * -32.0, "sub-block 0's scale is 0 − 32");
    }

    #[test]
    fn sizes_are_checked() {
        let mut y = [0f32; 32];
        assert!(matches!(
            dequantize(GgmlType::Q4_1, &[0u8; 19], &mut y),
            Err(QuantError::SizeMismatch { .. })
        ));
        let mut y = [0f32; 256];
        assert!(matches!(
            dequantize(GgmlType::Q2_K, &[0u8; 83], &mut y),
            Err(QuantError::SizeMismatch { .. })
        ));
    }

    /// The sub-block views the packed kernels use give the dequantised values (to one rounding:
    /// Q6_K's d·sc·u − 32·d·sc rounds twice where d·sc·(u − 32) rounds once).
    #[test]
    fn sub_blocks_reproduce_the_dequantisation() {
        let mut state = 0x2545_f491_u32;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state
        };
        let types = [
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q3_K,
        ];
        for dtype in types.into_iter().chain([GgmlType::Q2_K, GgmlType::IQ4_XS]) {
            let mut b: Vec<u8> = (0..dtype.type_size()).map(|_| next() as u8).collect();
            let scales = match dtype {
                GgmlType::Q6_K => vec![208],
                GgmlType::Q3_K => vec![108],
                GgmlType::Q2_K => vec![80, 82],
                GgmlType::IQ4_XS => vec![0],
                _ => vec![0, 2],
            };
            for a in scales {
                b[a..a + 2].copy_from_slice(&f16::from_f32(0.0123).to_le_bytes());
            }
            let mut y = [0f32; 256];
            dequantize(dtype, &b, &mut y).unwrap();
            let [d, dmin] = k_super_scales(dtype, &b).map(|h| f16::from_le_bytes(h).to_f32());
            for j in 0..8 {
                let sub = k_sub_block(dtype, &b, j);
                let (sc, c) = k_scales(dtype, sub.s, d, dmin);
                for l in 0..32 {
                    let (g, e) = (sc[l / 16] * f32::from(sub.u[l]) + c[l / 16], y[32 * j + l]);
                    assert!(
                        (g - e).abs() <= 1e-6 * e.abs(),
                        "{dtype} [{j},{l}]: {g} vs {e}"
                    );
                }
            }
        }
    }
}
