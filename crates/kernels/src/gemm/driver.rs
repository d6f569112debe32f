//! The GEMM driver (packed panels where the ISA has kernels, that is AVX2 and up; else scalar
//! row dots from GGUF blocks, or dequantised rows for the types without an integer product) and
//! those scalar block dot products.

use super::{Activations, Isa, OutPtr, QMatrix};
use crate::quant::{BlockQ16, GgmlType, dequantize, f16_at, fifth_bits};
use std::ops::Range;

/// Weight rows processed together: their blocks stay in L1 while every batch row passes.
pub(super) const ROW_TILE: usize = 4;

/// Computes the output columns of weight rows `rows` for every batch row. Concurrent calls for
/// one product must get disjoint `rows` (each writes only its rows' columns of `out`).
pub(super) fn gemm(isa: Isa, w: &QMatrix<'_>, x: &Activations, out: &OutPtr, rows: Range<usize>) {
    let n_total = w.rows;
    #[cfg(target_arch = "x86_64")]
    if let Some(packed) = w.packed
        && super::packs(w.dtype, isa)
    {
        // SAFETY: `isa` is what the CPU supports (Isa::detect): Avx512 means F/BW/VNNI, F16C
        // and FMA, Avx2 AVX2, F16C and FMA, AvxVnni those and AVX-VNNI; `packs` admits only the
        // kinds each kernel handles; `Activations::set` made byte pairs on all of them.
        unsafe {
            match isa {
                Isa::Avx512 => super::packed_avx512::gemm(packed, x, out, rows),
                _ => super::packed_avx2::gemm(packed, x, out, rows, isa == Isa::AvxVnni),
            }
        };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if super::float::multiplies(w.dtype) && isa >= Isa::Avx2 {
        // SAFETY: as above for the ISAs; `multiplies` admits the type; the activations keep
        // their f32 rows wherever a product is not packed (`Activations::skip_f32`).
        unsafe {
            match isa {
                Isa::Avx512 => super::float::gemm_avx512(w, x, out, rows),
                _ => super::float::gemm_avx2(w, x, out, rows),
            }
        }
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    if !integer_product(w.dtype) {
        // No integer product for this type: dequantise each weight row once, then f32 dots with
        // every batch row.
        let mut wrow = vec![0.0f32; w.cols];
        for n in rows {
            dequantize(w.dtype, w.row(n), &mut wrow)
                .expect("QMatrix::new checked the type and size");
            for m in 0..x.m {
                let v = crate::ops::dot(&wrow, x.row_f32(m));
                // SAFETY: column n belongs to this call's rows.
                unsafe { out.write(m * n_total + n, v) };
            }
        }
        return;
    }
    let mut start = rows.start;
    while start < rows.end {
        let end = (start + ROW_TILE).min(rows.end);
        for m in 0..x.m {
            for n in start..end {
                let v = row_dot(w, n, x, m);
                // SAFETY: column n belongs to this call's rows.
                unsafe { out.write(m * n_total + n, v) };
            }
        }
        start = end;
    }
}

/// Weight types multiplied as integers with the 16-bit activations.
pub(super) fn integer_product(dtype: GgmlType) -> bool {
    matches!(
        dtype,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0
    )
}

/// One output element of an integer-product type: weight row `n` · activation row `m`.
fn row_dot(w: &QMatrix<'_>, n: usize, x: &Activations, m: usize) -> f32 {
    let row = w.row(n);
    let size = w.dtype.type_size();
    let blocks = row.chunks_exact(size).zip(x.row_q16(m));
    match w.dtype {
        GgmlType::Q4_0 => blocks.fold(0.0, |acc, (b, a)| acc + dot_q4_0(b, a)),
        GgmlType::Q4_1 => blocks.fold(0.0, |acc, (b, a)| acc + dot_q4_1(b, a)),
        GgmlType::Q5_0 => blocks.fold(0.0, |acc, (b, a)| acc + dot_q5_0(b, a)),
        GgmlType::Q5_1 => blocks.fold(0.0, |acc, (b, a)| acc + dot_q5_1(b, a)),
        GgmlType::Q8_0 => blocks.fold(0.0, |acc, (b, a)| acc + dot_q8_0(b, a)),
        _ => unreachable!("only integer-product types come here"),
    }
}

pub(crate) fn dot_q4_0(b: &[u8], a: &BlockQ16) -> f32 {
    let mut sumi = 0i32;
    for j in 0..16 {
        let q = b[2 + j];
        sumi += (i32::from(q & 0x0f) - 8) * i32::from(a.qs[j]);
        sumi += (i32::from(q >> 4) - 8) * i32::from(a.qs[j + 16]);
    }
    f16_at(b, 0) * a.d * sumi as f32
}

pub(crate) fn dot_q4_1(b: &[u8], a: &BlockQ16) -> f32 {
    let mut sumi = 0i32;
    for j in 0..16 {
        let q = b[4 + j];
        sumi += i32::from(q & 0x0f) * i32::from(a.qs[j]);
        sumi += i32::from(q >> 4) * i32::from(a.qs[j + 16]);
    }
    f16_at(b, 0) * a.d * sumi as f32 + f16_at(b, 2) * a.s
}

pub(crate) fn dot_q5_0(b: &[u8], a: &BlockQ16) -> f32 {
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let mut sumi = 0i32;
    for j in 0..16 {
        let q = b[6 + j];
        let (h0, h1) = fifth_bits(qh, j);
        sumi += (i32::from((q & 0x0f) | h0) - 16) * i32::from(a.qs[j]);
        sumi += (i32::from((q >> 4) | h1) - 16) * i32::from(a.qs[j + 16]);
    }
    f16_at(b, 0) * a.d * sumi as f32
}

pub(crate) fn dot_q5_1(b: &[u8], a: &BlockQ16) -> f32 {
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let mut sumi = 0i32;
    for j in 0..16 {
        let q = b[8 + j];
        let (h0, h1) = fifth_bits(qh, j);
        sumi += i32::from((q & 0x0f) | h0) * i32::from(a.qs[j]);
        sumi += i32::from((q >> 4) | h1) * i32::from(a.qs[j + 16]);
    }
    f16_at(b, 0) * a.d * sumi as f32 + f16_at(b, 2) * a.s
}

pub(crate) fn dot_q8_0(b: &[u8], a: &BlockQ16) -> f32 {
    let mut sumi = 0i32;
    for j in 0..32 {
        sumi += i32::from(b[2 + j] as i8) * i32::from(a.qs[j]);
    }
    f16_at(b, 0) * a.d * sumi as f32
}
