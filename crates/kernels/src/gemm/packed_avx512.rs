//! The AVX-512 VNNI product of packed weight panels (see `packed.rs`) with byte-pair activations:
//! a tile of up to [`MAX_ROWS`] activation rows × one panel of 16 weight rows. Each weight line
//! is loaded once per tile; each activation group of four bytes is broadcast once per line.
//!
//! Every output element follows [`PackedMatrix::reference_dot`]'s arithmetic whatever the tile
//! size, so results are bitwise the same in any batch. One kernel family per activation mode:
//! 16-bit activations take two `vpdpbusd` per group (high and low bytes), 8-bit ones one.

use super::packed::{Line, PANEL, PackedKind, PackedMatrix, Values, prefetch_ahead, tiles};
use super::{Activations, OutPtr};
use crate::quant::{ActMode, BlockQ8Pair, IQ4_UNSIGNED};
use std::arch::x86_64::*;
use std::ops::Range;

/// Activation rows per tile: 3 accumulators each, plus weights and scales, fit the 32 registers.
pub(super) const MAX_ROWS: usize = 8;

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

/// Group `g`'s unsigned values (four of each of the 16 rows) from a block's value lines.
///
/// # Safety
/// `block` points to a whole, 64-byte aligned panel block of `kind`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn values(kind: PackedKind, block: *const u8, g: usize) -> __m512i {
    // SAFETY: the lines read are within the block (the caller's contract), aligned (`Line`).
    unsafe {
        let line = |l: usize| _mm512_load_si512(block.add(64 * l).cast());
        let nibble = |g: usize| {
            let v = line(g % 4);
            let v = if g < 4 { v } else { _mm512_srli_epi16::<4>(v) };
            _mm512_and_si512(v, _mm512_set1_epi8(0x0f))
        };
        match kind.values() {
            Values::Byte => line(g),
            Values::Bits2 | Values::Bits3 => {
                // Bits 2·(g % 4) of line g / 4 moved to bits 0–1 (right shifts spill only
                // into bits the mask drops), and for 3 bits, bit g of line 2 to bit 2.
                let t = line(g / 4);
                let t = match g % 4 {
                    0 => t,
                    1 => _mm512_srli_epi16::<2>(t),
                    2 => _mm512_srli_epi16::<4>(t),
                    _ => _mm512_srli_epi16::<6>(t),
                };
                let low = _mm512_and_si512(t, _mm512_set1_epi8(0x03));
                if kind.values() == Values::Bits2 {
                    return low;
                }
                let t = line(2);
                let t = match g {
                    0 => _mm512_slli_epi16::<2>(t),
                    1 => _mm512_slli_epi16::<1>(t),
                    2 => t,
                    3 => _mm512_srli_epi16::<1>(t),
                    4 => _mm512_srli_epi16::<2>(t),
                    5 => _mm512_srli_epi16::<3>(t),
                    6 => _mm512_srli_epi16::<4>(t),
                    _ => _mm512_srli_epi16::<5>(t),
                };
                _mm512_or_si512(low, _mm512_and_si512(t, _mm512_set1_epi8(0x04)))
            }
            Values::Nib4 => nibble(g),
            Values::Table4 => {
                let table = _mm512_broadcast_i32x4(_mm_loadu_si128(IQ4_UNSIGNED.as_ptr().cast()));
                _mm512_shuffle_epi8(table, nibble(g))
            }
            Values::Nib5 => {
                // Bit g of the top line moved to bit 4 (16-bit shifts of at most 4 spill only
                // into bits the mask drops).
                let t = line(4);
                let t = match g {
                    0 => _mm512_slli_epi16::<4>(t),
                    1 => _mm512_slli_epi16::<3>(t),
                    2 => _mm512_slli_epi16::<2>(t),
                    3 => _mm512_slli_epi16::<1>(t),
                    4 => t,
                    5 => _mm512_srli_epi16::<1>(t),
                    6 => _mm512_srli_epi16::<2>(t),
                    _ => _mm512_srli_epi16::<3>(t),
                };
                _mm512_or_si512(nibble(g), _mm512_and_si512(t, _mm512_set1_epi8(0x10)))
            }
            Values::Nib6 => {
                // Bits 2·(g % 4) of the top line moved to bits 4–5 (16-bit shifts spill only
                // into bits the mask drops).
                let t = line(4 + g / 4);
                let t = match g % 4 {
                    0 => _mm512_slli_epi16::<4>(t),
                    1 => _mm512_slli_epi16::<2>(t),
                    2 => t,
                    _ => _mm512_srli_epi16::<2>(t),
                };
                _mm512_or_si512(nibble(g), _mm512_and_si512(t, _mm512_set1_epi8(0x30)))
            }
        }
    }
}

/// Scales `d` and offsets `c` of block `i` of a panel, per half (both the same where there is
/// one scale), formed as [`crate::quant::k_scales`] forms them for the K-quants; `c` is 0 for
/// the kinds with a fixed offset, which the integer sums hold ([`PackedKind::offset_sum`]).
///
/// # Safety
/// `panel` points to a whole, 64-byte aligned panel of `kind` with more than `i` blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,f16c")]
unsafe fn scales(kind: PackedKind, panel: *const u8, i: usize) -> ([__m512; 2], [__m512; 2]) {
    // SAFETY: the lines read are the unit's scale lines, within the panel (the caller's
    // contract); every load is 32 bytes at offset 0 or 32 of an aligned line.
    unsafe {
        let at = panel.add(64 * kind.scales_at(i));
        let f16s = |off: usize| _mm512_cvtph_ps(_mm256_load_si256(at.add(off).cast()));
        if !kind.super_blocks() {
            // One `d` per block, two blocks a line; or `d`, then the min.
            let (d, c) = match kind.offset_factor() {
                Some(_) => (f16s(32 * (i % 2)), _mm512_setzero_ps()),
                None => (f16s(0), f16s(32)),
            };
            return ([d; 2], [c; 2]);
        }
        // Each row's two scale bytes of sub-block i % 8, as the low and high byte of a lane.
        let sub = i % 8;
        let bytes = _mm512_cvtepu16_epi32(_mm256_load_si256(
            at.add(64 * (sub / 2) + 32 * (sub % 2)).cast(),
        ));
        let (d, dmin) = (f16s(4 * 64), f16s(4 * 64 + 32));
        let ff = _mm512_set1_epi32(0xff);
        let (b0, b1) = (_mm512_and_si512(bytes, ff), _mm512_srli_epi32::<8>(bytes));
        let times = |x: __m512i, by: __m512| _mm512_mul_ps(_mm512_cvtepi32_ps(x), by);
        let neg = |x: __m512| {
            _mm512_castsi512_ps(_mm512_xor_si512(
                _mm512_castps_si512(x),
                _mm512_set1_epi32(i32::MIN),
            ))
        };
        match kind {
            PackedKind::Q4_K | PackedKind::Q5_K => {
                let (sc, c) = (times(b0, d), neg(times(b1, dmin)));
                ([sc; 2], [c; 2])
            }
            PackedKind::Q2_K => {
                let low = |b: __m512i| _mm512_and_si512(b, _mm512_set1_epi32(0x0f));
                let sc = [b0, b1].map(|b| times(low(b), d));
                let c = [b0, b1].map(|b| neg(times(_mm512_srli_epi32::<4>(b), dmin)));
                (sc, c)
            }
            _ => {
                // Q6_K, Q3_K, IQ4_XS: signed bytes, the offset a fixed multiple of the scale.
                let s0 = _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(bytes));
                let s1 = _mm512_srai_epi32::<24>(_mm512_slli_epi32::<16>(bytes));
                ([times(s0, d), times(s1, d)], [_mm512_setzero_ps(); 2])
            }
        }
    }
}

/// Panel `lines` × `MR` activation rows: 16 sums per row. `WIDE`: the activations have high
/// bytes (16-bit mode); without, the high bytes are zero and skipped, bitwise the same result.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma,f16c")]
#[allow(clippy::needless_range_loop)] // block i of every row: an index reads clearest
fn tile<const MR: usize, const KIND: u8, const WIDE: bool>(
    lines: &[Line],
    acts: [&[BlockQ8Pair]; MR],
) -> [__m512; MR] {
    let kind = PackedKind::from_code(KIND);
    let nb = acts[0].len();
    assert!(
        lines.len() == nb.div_ceil(kind.unit_blocks()) * kind.unit_lines(),
        "panel and activations differ in length"
    );
    let halves = kind.halves();
    let groups = 8 / halves;
    let mut acc = [_mm512_setzero_ps(); MR];
    for i in 0..nb {
        let panel = lines.as_ptr().cast::<u8>();
        // SAFETY: block i lies within the panel (asserted above), 64-byte aligned.
        let block = unsafe { panel.add(64 * kind.value_at(i)) };
        prefetch_ahead(kind, block);
        // SAFETY: as above.
        let (d, c) = unsafe { scales(kind, panel, i) };
        for h in 0..halves {
            let mut hi = [_mm512_setzero_si512(); MR];
            let mut lo: [__m512i; MR] =
                std::array::from_fn(|r| _mm512_set1_epi32(kind.offset_sum(&acts[r][i], h)));
            for g in h * groups..(h + 1) * groups {
                // SAFETY: as above.
                let w = unsafe { values(kind, block, g) };
                for r in 0..MR {
                    let a = &acts[r][i];
                    if WIDE {
                        hi[r] = _mm512_dpbusd_epi32(hi[r], w, group(&a.hi, g));
                        lo[r] = _mm512_dpbusd_epi32(lo[r], w, group(&a.lo, g));
                    } else if MR == 1 && g % 2 == 1 {
                        // 8-bit activations, one row: odd groups into the idle `hi` accumulator,
                        // so the row has two dependency chains (the integer sum is the same);
                        // several rows are independent chains already.
                        hi[r] = _mm512_dpbusd_epi32(hi[r], w, group(&a.lo, g));
                    } else {
                        lo[r] = _mm512_dpbusd_epi32(lo[r], w, group(&a.lo, g));
                    }
                }
            }
            for r in 0..MR {
                let a = &acts[r][i];
                let sum = if WIDE {
                    _mm512_add_epi32(_mm512_slli_epi32::<8>(hi[r]), lo[r])
                } else if MR == 1 {
                    _mm512_add_epi32(hi[r], lo[r])
                } else {
                    lo[r]
                };
                let s = if halves == 2 { a.sh[h] } else { a.s };
                let scale = _mm512_mul_ps(d[h], _mm512_set1_ps(a.d));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc[r]);
                if kind.offset_factor().is_none() {
                    acc[r] = _mm512_fmadd_ps(c[h], _mm512_set1_ps(s), acc[r]);
                }
            }
        }
    }
    acc
}

/// [`tile`] for `kind`'s code.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma,f16c")]
fn tile_kind<const MR: usize, const WIDE: bool>(
    kind: PackedKind,
    lines: &[Line],
    acts: [&[BlockQ8Pair]; MR],
) -> [[f32; 16]; MR] {
    const fn c(k: PackedKind) -> u8 {
        k.code()
    }
    let acc = match kind {
        PackedKind::Q4_0 => tile::<MR, { c(PackedKind::Q4_0) }, WIDE>(lines, acts),
        PackedKind::Q4_1 => tile::<MR, { c(PackedKind::Q4_1) }, WIDE>(lines, acts),
        PackedKind::Q8_0 => tile::<MR, { c(PackedKind::Q8_0) }, WIDE>(lines, acts),
        PackedKind::Q5_0 => tile::<MR, { c(PackedKind::Q5_0) }, WIDE>(lines, acts),
        PackedKind::Q5_1 => tile::<MR, { c(PackedKind::Q5_1) }, WIDE>(lines, acts),
        PackedKind::Q4_K => tile::<MR, { c(PackedKind::Q4_K) }, WIDE>(lines, acts),
        PackedKind::Q5_K => tile::<MR, { c(PackedKind::Q5_K) }, WIDE>(lines, acts),
        PackedKind::Q6_K => tile::<MR, { c(PackedKind::Q6_K) }, WIDE>(lines, acts),
        PackedKind::Q3_K => tile::<MR, { c(PackedKind::Q3_K) }, WIDE>(lines, acts),
        PackedKind::Q2_K => tile::<MR, { c(PackedKind::Q2_K) }, WIDE>(lines, acts),
        PackedKind::IQ4_NL => tile::<MR, { c(PackedKind::IQ4_NL) }, WIDE>(lines, acts),
        PackedKind::IQ4_XS => tile::<MR, { c(PackedKind::IQ4_XS) }, WIDE>(lines, acts),
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
    mode: ActMode,
) -> [[f32; 16]; MR] {
    // SAFETY: the caller guarantees the features.
    unsafe {
        match mode {
            ActMode::Int16 => tile_kind::<MR, true>(w.kind, w.panel(panel), rows),
            ActMode::Int8 => tile_kind::<MR, false>(w.kind, w.panel(panel), rows),
        }
    }
}

/// Computes the output columns of weight rows `rows` (whole panels: `rows.start` a multiple of
/// 16, `rows.end` too or the matrix's end) for every activation row.
///
/// # Safety
/// The CPU must support AVX-512 F/BW and VNNI, F16C and FMA; `x` must hold byte pairs
/// ([`Activations::set`] makes them on such a CPU).
pub(super) unsafe fn gemm(w: &PackedMatrix, x: &Activations, out: &OutPtr, rows: Range<usize>) {
    assert_eq!(x.pairs.len(), x.q16.len(), "activations lack byte pairs");
    for (panel, m, take) in tiles(w, rows, x.m, MAX_ROWS) {
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
    let sums = unsafe {
        product::<MR>(
            w,
            panel,
            std::array::from_fn(|r| x.row_pairs(m + r)),
            x.mode,
        )
    };
    for (r, s) in sums.iter().enumerate() {
        // SAFETY: the caller owns these columns.
        unsafe { out.write_run((m + r) * w.rows + first, &s[..valid]) };
    }
}
