//! The AVX-512 VNNI product of packed weight panels (see `packed.rs`) with byte-pair activations:
//! a tile of up to [`MAX_ROWS`] activation rows × one panel of 16 weight rows. Each weight line
//! is loaded once per tile; each activation group of four bytes is broadcast once per line.
//!
//! Every output element follows [`PackedMatrix::reference_dot`]'s arithmetic whatever the tile
//! size, so results are bitwise the same in any batch.

use super::packed::{Line, PANEL, PackedKind, PackedMatrix};
use super::{Activations, OutPtr};
use crate::quant::BlockQ8Pair;
use std::arch::x86_64::*;
use std::ops::Range;

/// Activation rows per tile: 3 accumulators each, plus weights and scales, fit the 32 registers.
pub(super) const MAX_ROWS: usize = 8;

const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q8_0: u8 = 2;
const Q4_K: u8 = 3;
const Q5_0: u8 = 4;
const Q5_1: u8 = 5;

/// Four activation bytes (`group` of a block) broadcast to every lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn group(bytes: &[i8; 32], g: usize) -> __m512i {
    let word = i32::from_le_bytes([
        bytes[4 * g] as u8,
        bytes[4 * g + 1] as u8,
        bytes[4 * g + 2] as u8,
        bytes[4 * g + 3] as u8,
    ]);
    _mm512_set1_epi32(word)
}

/// Panel `lines` × `MR` activation rows: 16 sums per row.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma,f16c")]
#[allow(clippy::needless_range_loop)] // block i of every row: an index reads clearest
fn tile<const MR: usize, const KIND: u8>(
    lines: &[Line],
    acts: [&[BlockQ8Pair]; MR],
) -> [__m512; MR] {
    // SAFETY: (for the whole body) loads stay within `lines` (checked below) and are 64-byte aligned
    // (`Line`); the f16 scale loads are at offsets 0 and 32 of an aligned line, the f32 ones
    // (Q4_K) whole aligned lines.
    unsafe {
        let bytes = matches!(KIND, Q8_0 | Q5_0 | Q5_1);
        let per = match KIND {
            _ if bytes => PackedKind::Q8_0.block_lines(),
            Q4_K => PackedKind::Q4_K.block_lines(),
            _ => PackedKind::Q4_0.block_lines(),
        };
        let nb = acts[0].len();
        assert!(
            lines.len() >= nb * per,
            "panel shorter than the activations"
        );
        let mask = _mm512_set1_epi8(0x0f);
        let mut acc = [_mm512_setzero_ps(); MR];
        for i in 0..nb {
            let block = lines.as_ptr().add(i * per).cast::<u8>();
            let (d, c) = if KIND == Q4_K {
                // Two lines of f32: the sub-blocks' d·sc, then −dmin·m.
                let scales = block.add(4 * 64).cast::<f32>();
                (_mm512_load_ps(scales), _mm512_load_ps(scales.add(16)))
            } else {
                let scales = block.add((per - 1) * 64);
                let d = _mm512_cvtph_ps(_mm256_load_si256(scales.cast()));
                let c = match KIND {
                    Q4_1 | Q5_1 => _mm512_cvtph_ps(_mm256_load_si256(scales.add(32).cast())),
                    Q4_0 => _mm512_mul_ps(d, _mm512_set1_ps(-8.0)),
                    Q5_0 => _mm512_mul_ps(d, _mm512_set1_ps(-16.0)),
                    _ => _mm512_mul_ps(d, _mm512_set1_ps(-128.0)),
                };
                (d, c)
            };
            let mut hi = [_mm512_setzero_si512(); MR];
            let mut lo = [_mm512_setzero_si512(); MR];
            let mut feed = |w: __m512i, g: usize| {
                for r in 0..MR {
                    let a = &acts[r][i];
                    hi[r] = _mm512_dpbusd_epi32(hi[r], w, group(&a.hi, g));
                    lo[r] = _mm512_dpbusd_epi32(lo[r], w, group(&a.lo, g));
                }
            };
            if bytes {
                for g in 0..8 {
                    feed(_mm512_load_si512(block.add(64 * g).cast()), g);
                }
            } else {
                for p in 0..4 {
                    let v = _mm512_load_si512(block.add(64 * p).cast());
                    feed(_mm512_and_si512(v, mask), p);
                    feed(_mm512_and_si512(_mm512_srli_epi16::<4>(v), mask), p + 4);
                }
            }
            for r in 0..MR {
                let a = &acts[r][i];
                let sum = _mm512_add_epi32(_mm512_slli_epi32::<8>(hi[r]), lo[r]);
                let scale = _mm512_mul_ps(d, _mm512_set1_ps(a.d));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc[r]);
                acc[r] = _mm512_fmadd_ps(c, _mm512_set1_ps(a.s), acc[r]);
            }
        }
        acc
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma,f16c")]
fn tile_kind<const MR: usize>(
    kind: PackedKind,
    lines: &[Line],
    acts: [&[BlockQ8Pair]; MR],
) -> [[f32; 16]; MR] {
    let acc = match kind {
        PackedKind::Q4_0 => tile::<MR, Q4_0>(lines, acts),
        PackedKind::Q4_1 => tile::<MR, Q4_1>(lines, acts),
        PackedKind::Q8_0 => tile::<MR, Q8_0>(lines, acts),
        PackedKind::Q4_K => tile::<MR, Q4_K>(lines, acts),
        PackedKind::Q5_0 => tile::<MR, Q5_0>(lines, acts),
        PackedKind::Q5_1 => tile::<MR, Q5_1>(lines, acts),
    };
    acc.map(|v| {
        let mut out = [0.0f32; 16];
        // SAFETY: 16 f32 = 64 writable bytes.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) };
        out
    })
}

/// Panel `panel` of `w` times activation rows `rows[0..MR]`: `MR` runs of 16 sums (lane j is
/// weight row `16·panel + j`).
///
/// # Safety
/// The CPU must support AVX-512 F/BW and VNNI, F16C and FMA.
pub(super) unsafe fn product<const MR: usize>(
    w: &PackedMatrix,
    panel: usize,
    rows: [&[BlockQ8Pair]; MR],
) -> [[f32; 16]; MR] {
    // SAFETY: the caller guarantees the features.
    unsafe { tile_kind::<MR>(w.kind, w.panel(panel), rows) }
}

/// Computes the output columns of weight rows `rows` (whole panels: `rows.start` a multiple of
/// 16, `rows.end` too or the matrix's end) for every activation row.
///
/// # Safety
/// The CPU must support AVX-512 F/BW and VNNI, F16C and FMA; `x` must hold byte pairs
/// ([`Activations::set`] makes them on such a CPU).
pub(super) unsafe fn gemm(w: &PackedMatrix, x: &Activations, out: &OutPtr, rows: Range<usize>) {
    assert!(rows.start.is_multiple_of(PANEL), "rows must start a panel");
    assert_eq!(x.pairs.len(), x.q16.len(), "activations lack byte pairs");
    for panel in rows.start / PANEL..rows.end.div_ceil(PANEL) {
        let mut m = 0;
        while m < x.m {
            let take = (x.m - m).min(MAX_ROWS);
            // SAFETY: the caller guarantees the features; these columns belong to this call.
            unsafe {
                match take {
                    8 => tile_out::<8>(w, panel, x, m, out),
                    7 => tile_out::<7>(w, panel, x, m, out),
                    6 => tile_out::<6>(w, panel, x, m, out),
                    5 => tile_out::<5>(w, panel, x, m, out),
                    4 => tile_out::<4>(w, panel, x, m, out),
                    3 => tile_out::<3>(w, panel, x, m, out),
                    2 => tile_out::<2>(w, panel, x, m, out),
                    _ => tile_out::<1>(w, panel, x, m, out),
                }
            }
            m += take;
        }
    }
}

/// One tile: panel `panel` × activation rows `m..m + MR`, written to `out`.
///
/// # Safety
/// As for [`gemm`]; no other thread writes this panel's columns.
unsafe fn tile_out<const MR: usize>(
    w: &PackedMatrix,
    panel: usize,
    x: &Activations,
    m: usize,
    out: &OutPtr,
) {
    let first = panel * PANEL;
    let valid = (w.rows - first).min(PANEL);
    // SAFETY: the caller guarantees the features.
    let sums = unsafe { product::<MR>(w, panel, std::array::from_fn(|r| x.row_pairs(m + r))) };
    for (r, s) in sums.iter().enumerate() {
        // SAFETY: the caller owns these columns.
        unsafe { out.write_run((m + r) * w.rows + first, &s[..valid]) };
    }
}
