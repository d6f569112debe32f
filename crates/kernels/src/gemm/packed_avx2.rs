//! The 256-bit product of packed weight panels (see `packed.rs`) with byte-pair activations, for
//! CPUs without AVX-512: each 16-row panel is taken as two halves of 8 rows (the low and high 32
//! bytes of every line), a tile of up to [`MAX_ROWS`] activation rows at a time. Two builds of
//! the same kernel: with AVX-VNNI the byte products are `vpdpbusd` (every packed type); with AVX2
//! alone, `vpmaddubsw` pairs summed in 16 bits over as many groups as cannot overflow, then one
//! `vpmaddwd` (exact for values of at most 63; wider ones, Q8_0's bytes and IQ4's table values,
//! are taken as two nibbles, the high one's sum weighted 16).
//!
//! The integer sums are exact and each lane's float steps are [`PackedMatrix::reference_dot`]'s,
//! so results are bitwise those of the AVX-512 kernels, whatever the batch.

use super::packed::{Line, PANEL, PackedKind, PackedMatrix, Values, prefetch_ahead, tiles};
use super::{Activations, OutPtr};
use crate::quant::{ActMode, BlockQ8Pair, IQ4_UNSIGNED};
use std::arch::x86_64::*;
use std::ops::Range;

/// Activation rows per tile: three accumulators each fit the 16 registers with four rows.
pub(super) const MAX_ROWS: usize = 4;

/// The kernel body, built once per instruction set: `$base` and `$full` are the target features
/// of the helpers and of the float-handling functions, `$dot4` the byte product, and `$pairs16`
/// whether products are `vpmaddubsw` pairs summed in 16 bits over several groups (as many as
/// [`Values::groups_in_i16`] allows) before one `vpmaddwd` widens them: AVX2 alone.
macro_rules! kernel {
    ($base:literal, $full:literal, $dot4:path, $pairs16:expr) => {
        /// Four activation bytes (`group` of a block) broadcast to every lane.
        #[inline]
        #[target_feature(enable = $base)]
        fn group(bytes: &[i8; 32], g: usize) -> __m256i {
            let word = i32::from_le_bytes([
                bytes[4 * g] as u8,
                bytes[4 * g + 1] as u8,
                bytes[4 * g + 2] as u8,
                bytes[4 * g + 3] as u8,
            ]);
            _mm256_set1_epi32(word)
        }

        /// Σ of four u8·i8 products per lane, added to `acc`.
        #[inline]
        #[target_feature(enable = $full)]
        fn dot4(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
            $dot4(acc, w, x)
        }

        /// Adds group `x`'s products with `w` to row sums: with `$pairs16`, as pairs into the 16-bit
        /// `part` (widened into `sum` by [`widen`]), bytes (`byte`) as their two nibbles, the high
        /// one's pairs in `part[1]`; else as whole dot products into `sum`.
        #[inline]
        #[target_feature(enable = $full)]
        fn product(sum: &mut __m256i, part: &mut [__m256i; 2], w: __m256i, x: __m256i, byte: bool) {
            if !$pairs16 {
                *sum = dot4(*sum, w, x);
            } else if byte {
                let nib = _mm256_set1_epi8(0x0f);
                let (low, high) = (
                    _mm256_and_si256(w, nib),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(w), nib),
                );
                part[0] = _mm256_add_epi16(part[0], _mm256_maddubs_epi16(low, x));
                part[1] = _mm256_add_epi16(part[1], _mm256_maddubs_epi16(high, x));
            } else {
                part[0] = _mm256_add_epi16(part[0], _mm256_maddubs_epi16(w, x));
            }
        }

        /// Moves the 16-bit pair sums `part` into `sum` (with `$pairs16`; else nothing is there),
        /// the high nibbles' (`byte`) times 16.
        #[inline]
        #[target_feature(enable = $full)]
        fn widen(sum: &mut __m256i, part: &mut [__m256i; 2], byte: bool) {
            if $pairs16 {
                *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(part[0], _mm256_set1_epi16(1)));
                if byte {
                    let high = _mm256_madd_epi16(part[1], _mm256_set1_epi16(16));
                    *sum = _mm256_add_epi32(*sum, high);
                }
                *part = [_mm256_setzero_si256(); 2];
            }
        }

        /// Group `g`'s unsigned values (four of each of the 8 rows) from the value lines of a block,
        /// `half` 0 or 1 for rows 0..8 or 8..16 of the panel.
        ///
        /// # Safety
        /// `block` points to a whole, 64-byte aligned panel block of `kind`.
        #[inline]
        #[target_feature(enable = $base)]
        unsafe fn values(kind: PackedKind, block: *const u8, half: usize, g: usize) -> __m256i {
            // SAFETY: the 32-byte halves read are within the block (the caller's contract), aligned.
            unsafe {
                let line = |l: usize| _mm256_load_si256(block.add(64 * l + 32 * half).cast());
                let nibble = |g: usize| {
                    let v = line(g % 4);
                    let v = if g < 4 { v } else { _mm256_srli_epi16::<4>(v) };
                    _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
                };
                match kind.values() {
                    Values::Byte => line(g),
                    Values::Bits2 | Values::Bits3 => {
                        // Bits 2·(g % 4) of line g / 4 moved to bits 0–1 (right shifts spill only
                        // into bits the mask drops), and for 3 bits, bit g of line 2 to bit 2.
                        let t = line(g / 4);
                        let t = match g % 4 {
                            0 => t,
                            1 => _mm256_srli_epi16::<2>(t),
                            2 => _mm256_srli_epi16::<4>(t),
                            _ => _mm256_srli_epi16::<6>(t),
                        };
                        let low = _mm256_and_si256(t, _mm256_set1_epi8(0x03));
                        if kind.values() == Values::Bits2 {
                            return low;
                        }
                        let t = line(2);
                        let t = match g {
                            0 => _mm256_slli_epi16::<2>(t),
                            1 => _mm256_slli_epi16::<1>(t),
                            2 => t,
                            3 => _mm256_srli_epi16::<1>(t),
                            4 => _mm256_srli_epi16::<2>(t),
                            5 => _mm256_srli_epi16::<3>(t),
                            6 => _mm256_srli_epi16::<4>(t),
                            _ => _mm256_srli_epi16::<5>(t),
                        };
                        _mm256_or_si256(low, _mm256_and_si256(t, _mm256_set1_epi8(0x04)))
                    }
                    Values::Nib4 => nibble(g),
                    Values::Table4 => {
                        let table = _mm_loadu_si128(IQ4_UNSIGNED.as_ptr().cast());
                        _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table), nibble(g))
                    }
                    Values::Nib5 => {
                        // Bit g of the top line moved to bit 4 (16-bit shifts of at most 4 spill only
                        // into bits the mask drops).
                        let t = line(4);
                        let t = match g {
                            0 => _mm256_slli_epi16::<4>(t),
                            1 => _mm256_slli_epi16::<3>(t),
                            2 => _mm256_slli_epi16::<2>(t),
                            3 => _mm256_slli_epi16::<1>(t),
                            4 => t,
                            5 => _mm256_srli_epi16::<1>(t),
                            6 => _mm256_srli_epi16::<2>(t),
                            _ => _mm256_srli_epi16::<3>(t),
                        };
                        _mm256_or_si256(nibble(g), _mm256_and_si256(t, _mm256_set1_epi8(0x10)))
                    }
                    Values::Nib6 => {
                        // As in the AVX-512 kernel: the two top bits moved to bits 4–5.
                        let t = line(4 + g / 4);
                        let t = match g % 4 {
                            0 => _mm256_slli_epi16::<4>(t),
                            1 => _mm256_slli_epi16::<2>(t),
                            2 => t,
                            _ => _mm256_srli_epi16::<2>(t),
                        };
                        _mm256_or_si256(nibble(g), _mm256_and_si256(t, _mm256_set1_epi8(0x30)))
                    }
                }
            }
        }

        /// Scales `d` and offsets `c` of block `i` of a panel for rows `8·half..8·half + 8`, per half
        /// block, as the AVX-512 kernel forms them.
        ///
        /// # Safety
        /// `panel` points to a whole, 64-byte aligned panel of `kind` with more than `i` blocks.
        #[inline]
        #[target_feature(enable = $full)]
        unsafe fn scales(
            kind: PackedKind,
            panel: *const u8,
            i: usize,
            half: usize,
        ) -> ([__m256; 2], [__m256; 2]) {
            // SAFETY: the lines read are the unit's scale lines, within the panel (the caller's
            // contract); every load is 16 bytes at a multiple of 16 within an aligned line.
            unsafe {
                let at = panel.add(64 * kind.scales_at(i) + 16 * half);
                let f16s = |off: usize| _mm256_cvtph_ps(_mm_load_si128(at.add(off).cast()));
                if !kind.super_blocks() {
                    let (d, c) = match kind.offset_factor() {
                        Some(_) => (f16s(32 * (i % 2)), _mm256_setzero_ps()),
                        None => (f16s(0), f16s(32)),
                    };
                    return ([d; 2], [c; 2]);
                }
                let sub = i % 8;
                let bytes = _mm256_cvtepu16_epi32(_mm_load_si128(
                    at.add(64 * (sub / 2) + 32 * (sub % 2)).cast(),
                ));
                let (d, dmin) = (f16s(4 * 64), f16s(4 * 64 + 32));
                let ff = _mm256_set1_epi32(0xff);
                let (b0, b1) = (_mm256_and_si256(bytes, ff), _mm256_srli_epi32::<8>(bytes));
                let times = |x: __m256i, by: __m256| _mm256_mul_ps(_mm256_cvtepi32_ps(x), by);
                let neg = |x: __m256| _mm256_xor_ps(x, _mm256_set1_ps(-0.0));
                match kind {
                    PackedKind::Q4_K | PackedKind::Q5_K => {
                        let (sc, c) = (times(b0, d), neg(times(b1, dmin)));
                        ([sc; 2], [c; 2])
                    }
                    PackedKind::Q2_K => {
                        let low = |b: __m256i| _mm256_and_si256(b, _mm256_set1_epi32(0x0f));
                        let sc = [b0, b1].map(|b| times(low(b), d));
                        let c = [b0, b1].map(|b| neg(times(_mm256_srli_epi32::<4>(b), dmin)));
                        (sc, c)
                    }
                    _ => {
                        let s0 = _mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(bytes));
                        let s1 = _mm256_srai_epi32::<24>(_mm256_slli_epi32::<16>(bytes));
                        ([times(s0, d), times(s1, d)], [_mm256_setzero_ps(); 2])
                    }
                }
            }
        }

        /// Rows `8·half..8·half + 8` of a panel × `MR` activation rows: 8 sums per row. `WIDE` as in the
        /// AVX-512 kernel: 16-bit activations (high bytes too), else 8-bit ones.
        #[inline]
        #[target_feature(enable = $full)]
        #[allow(clippy::needless_range_loop)] // block i of every row: an index reads clearest
        fn tile<const MR: usize, const KIND: u8, const WIDE: bool>(
            lines: &[Line],
            half: usize,
            acts: [&[BlockQ8Pair]; MR],
        ) -> [__m256; MR] {
            let kind = PackedKind::from_code(KIND);
            let nb = acts[0].len();
            assert!(
                lines.len() == nb.div_ceil(kind.unit_blocks()) * kind.unit_lines(),
                "panel and activations differ in length"
            );
            let halves = kind.halves();
            let groups = 8 / halves;
            let mut acc = [_mm256_setzero_ps(); MR];
            for i in 0..nb {
                let panel = lines.as_ptr().cast::<u8>();
                // SAFETY: block i lies within the panel (asserted above), 64-byte aligned.
                let block = unsafe { panel.add(64 * kind.value_at(i)) };
                prefetch_ahead(kind, block);
                // SAFETY: as above.
                let (d, c) = unsafe { scales(kind, panel, i, half) };
                for h in 0..halves {
                    let mut hi = [_mm256_setzero_si256(); MR];
                    let mut lo: [__m256i; MR] =
                        std::array::from_fn(|r| _mm256_set1_epi32(kind.offset_sum(&acts[r][i], h)));
                    let mut hi16 = [[_mm256_setzero_si256(); 2]; MR];
                    let mut lo16 = hi16;
                    // Bytes (values past 63) go through the 16-bit sums as two nibbles.
                    let byte = kind.values().groups_in_i16() == 0;
                    let run = if byte { Values::Nib4 } else { kind.values() }.groups_in_i16();
                    for g in h * groups..(h + 1) * groups {
                        // SAFETY: as above.
                        let w = unsafe { values(kind, block, half, g) };
                        // The 16-bit pair sums hold this many groups (exact: see `groups_in_i16`).
                        let n = g + 1 - h * groups;
                        let full = n % run == 0 || n == groups;
                        for r in 0..MR {
                            let a = &acts[r][i];
                            if WIDE {
                                product(&mut hi[r], &mut hi16[r], w, group(&a.hi, g), byte);
                                product(&mut lo[r], &mut lo16[r], w, group(&a.lo, g), byte);
                            } else if !$pairs16 && g % 2 == 1 {
                                // 8-bit activations: odd groups into the idle `hi`, two dependency
                                // chains a row (the integer sum is the same).
                                hi[r] = dot4(hi[r], w, group(&a.lo, g));
                            } else {
                                product(&mut lo[r], &mut lo16[r], w, group(&a.lo, g), byte);
                            }
                            if full {
                                if WIDE {
                                    widen(&mut hi[r], &mut hi16[r], byte);
                                }
                                widen(&mut lo[r], &mut lo16[r], byte);
                            }
                        }
                    }
                    for r in 0..MR {
                        let a = &acts[r][i];
                        let sum = if WIDE {
                            _mm256_add_epi32(_mm256_slli_epi32::<8>(hi[r]), lo[r])
                        } else {
                            _mm256_add_epi32(hi[r], lo[r])
                        };
                        let s = if halves == 2 { a.sh[h] } else { a.s };
                        let scale = _mm256_mul_ps(d[h], _mm256_set1_ps(a.d));
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, acc[r]);
                        if kind.offset_factor().is_none() {
                            acc[r] = _mm256_fmadd_ps(c[h], _mm256_set1_ps(s), acc[r]);
                        }
                    }
                }
            }
            acc
        }

        /// [`tile`] for `kind`'s code, as 8 f32 per activation row.
        #[target_feature(enable = $full)]
        pub(super) fn tile_kind<const MR: usize, const WIDE: bool>(
            kind: PackedKind,
            lines: &[Line],
            half: usize,
            acts: [&[BlockQ8Pair]; MR],
        ) -> [[f32; 8]; MR] {
            const fn c(k: PackedKind) -> u8 {
                k.code()
            }
            let acc = match kind {
                PackedKind::Q4_0 => tile::<MR, { c(PackedKind::Q4_0) }, WIDE>(lines, half, acts),
                PackedKind::Q4_1 => tile::<MR, { c(PackedKind::Q4_1) }, WIDE>(lines, half, acts),
                PackedKind::Q5_0 => tile::<MR, { c(PackedKind::Q5_0) }, WIDE>(lines, half, acts),
                PackedKind::Q5_1 => tile::<MR, { c(PackedKind::Q5_1) }, WIDE>(lines, half, acts),
                PackedKind::Q4_K => tile::<MR, { c(PackedKind::Q4_K) }, WIDE>(lines, half, acts),
                PackedKind::Q5_K => tile::<MR, { c(PackedKind::Q5_K) }, WIDE>(lines, half, acts),
                PackedKind::Q6_K => tile::<MR, { c(PackedKind::Q6_K) }, WIDE>(lines, half, acts),
                PackedKind::Q3_K => tile::<MR, { c(PackedKind::Q3_K) }, WIDE>(lines, half, acts),
                PackedKind::Q2_K => tile::<MR, { c(PackedKind::Q2_K) }, WIDE>(lines, half, acts),
                PackedKind::IQ4_NL => {
                    tile::<MR, { c(PackedKind::IQ4_NL) }, WIDE>(lines, half, acts)
                }
                PackedKind::IQ4_XS => {
                    tile::<MR, { c(PackedKind::IQ4_XS) }, WIDE>(lines, half, acts)
                }
                PackedKind::Q8_0 => tile::<MR, { c(PackedKind::Q8_0) }, WIDE>(lines, half, acts),
            };
            acc.map(|v| {
                let mut out = [0.0f32; 8];
                // SAFETY: 8 f32 = 32 writable bytes.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
                out
            })
        }
    };
}

/// `vpmaddubsw` then `vpmaddwd`: exact for values below 128 (unused: the AVX2 build sums pairs in
/// 16 bits first, see `product`).
#[inline]
#[target_feature(enable = "avx2")]
fn dot4_avx2(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(w, x);
    _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

/// `vpdpbusd` (VEX-encoded, AVX-VNNI): exact for every byte value.
#[inline]
#[target_feature(enable = "avx2,avxvnni")]
fn dot4_vnni(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(acc, w, x)
}

/// AVX2 alone.
mod plain {
    use super::*;
    kernel!("avx2", "avx2,fma,f16c", dot4_avx2, true);
}

/// AVX2 with AVX-VNNI.
mod vnni {
    use super::*;
    kernel!("avx2,avxvnni", "avx2,fma,f16c,avxvnni", dot4_vnni, false);
}

/// Computes the output columns of weight rows `rows` (whole panels, as for the AVX-512 kernel)
/// for every activation row.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C, and AVX-VNNI if `vnni`; `x` must hold byte pairs ([`Activations::set`] makes them where packed
/// kernels run).
pub(super) unsafe fn gemm(
    w: &PackedMatrix,
    x: &Activations,
    out: &OutPtr,
    rows: Range<usize>,
    vnni: bool,
) {
    assert_eq!(x.pairs.len(), x.q16.len(), "activations lack byte pairs");
    for (panel, m, take) in tiles(w, rows, x.m, MAX_ROWS) {
        let valid = (w.rows - panel * PANEL).min(PANEL);
        for half in 0..valid.div_ceil(PANEL / 2) {
            // SAFETY: the caller guarantees the features; these columns are this call's.
            unsafe {
                match take {
                    4 => tile_out::<4>(w, (panel, half), x, m, out, vnni),
                    3 => tile_out::<3>(w, (panel, half), x, m, out, vnni),
                    2 => tile_out::<2>(w, (panel, half), x, m, out, vnni),
                    _ => tile_out::<1>(w, (panel, half), x, m, out, vnni),
                }
            }
        }
    }
}

/// One tile: rows `8·half..` of panel `panel` × activation rows `m..m + MR`, written to `out`.
///
/// # Safety
/// As for [`gemm`]; no other thread writes these columns.
unsafe fn tile_out<const MR: usize>(
    w: &PackedMatrix,
    (panel, half): (usize, usize),
    x: &Activations,
    m: usize,
    out: &OutPtr,
    vnni: bool,
) {
    let first = panel * PANEL + half * PANEL / 2;
    let valid = (w.rows - first).min(PANEL / 2);
    let rows: [&[BlockQ8Pair]; MR] = std::array::from_fn(|r| x.row_pairs(m + r));
    let lines = w.panel(panel);
    // SAFETY: the caller guarantees the features.
    let sums = unsafe {
        match (x.mode, vnni) {
            (ActMode::Int16, false) => plain::tile_kind::<MR, true>(w.kind, lines, half, rows),
            (ActMode::Int8, false) => plain::tile_kind::<MR, false>(w.kind, lines, half, rows),
            (ActMode::Int16, true) => vnni::tile_kind::<MR, true>(w.kind, lines, half, rows),
            (ActMode::Int8, true) => vnni::tile_kind::<MR, false>(w.kind, lines, half, rows),
        }
    };
    for (r, s) in sums.iter().enumerate() {
        // SAFETY: the caller owns these columns.
        unsafe { out.write_run((m + r) * w.rows + first, &s[..valid]) };
    }
}
