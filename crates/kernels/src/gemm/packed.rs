//! Weights repacked at load time for the packed kernels: panels of 16 rows whose blocks are
//! interleaved so that one 64-byte line holds four consecutive values of each of the 16 rows,
//! the operand layout of `vpdpbusd`. Each output lane is then one weight row: no horizontal sums,
//! and one load of activations (broadcast) feeds 16 rows.
//!
//! Every supported type becomes "unsigned values with a scale and offset" over blocks of 32
//! values, `w = d·u + c`, or for the K-quants whose scales change every 16 values, the same per
//! half block. A block's dot product with activations `x = d_x·q` is then
//! `Σu·q · d·d_x + c·s_x` (`s_x = d_x·Σq`, over the half where scales are per half); where the
//! offset is a fixed multiple of the scale, `c = f·d`, it is `(Σu·q + f·Σq) · d·d_x`, one integer
//! sum ([`PackedKind::offset_sum`]).
//!
//! The values are stored by their width ([`Values`]): 4 bits (two a byte, 4 lines), 5 or 6 bits
//! (the low four as nibbles, the rest in 1 or 2 bit-plane lines), 8 bits (8 lines), or IQ4's
//! 4-bit indices into its table of 16 values (as nibbles, looked up by the kernels). The
//! scales: GGUF's f16 `d` and min in one line after each block for the 32-value types; for the
//! K-quants, after each super-block's 8 blocks, 4 lines of the sub-blocks' two scale bytes per
//! row and one of the super-block's f16 `d` and `dmin`, from which the kernels form `d·sc` and
//! `dmin·m` (products f32 holds exactly). So the packed bytes stay within a few percent of the
//! GGUF's, except where a type's values are narrower than a nibble (Q2_K, Q3_K).

use super::QMatrix;
use crate::quant::{
    BlockQ8Pair, GgmlType, IQ4_UNSIGNED, f16_at, fixed_offset, iq4_index, iq4_indices,
    iq4_unsigned, k_scales, k_sub_block, k_super_scales, q5_values,
};
use std::ops::Range;

/// Weight rows in one panel: the 16 f32 lanes of a 512-bit register.
pub const PANEL: usize = 16;

/// How far ahead of the block being multiplied the kernels ask for panel bytes (about two panels
/// of a 576-wide Q4_0 matrix). One core's demand misses and the hardware prefetcher alone keep a
/// single-row product (decode, and each row of a verification step) at about half the memory's
/// read rate, and leave the extra rows of a verification exposed as stalls (figures:
/// BENCHMARKS.md). Past a panel's end it reaches into the next panel, which is the next one a
/// thread multiplies.
const PREFETCH_AHEAD: usize = 8192;

/// Asks for the lines `PREFETCH_AHEAD` bytes past `block` (as many as one block of `kind`
/// spans, its scales included) to be brought into L1.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn prefetch_ahead(kind: PackedKind, block: *const u8) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    for l in 0..=kind.value_lines() {
        // SAFETY: a prefetch is a hint: it never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(block.wrapping_add(PREFETCH_AHEAD + 64 * l).cast()) };
    }
}

/// Bytes of weight panels that one tile of activation rows passes before the next tile starts:
/// the tile's activations stay in L1 over these panels, whose lines come from L2. (Each panel
/// passing every activation row in turn would stream a long prompt's activations from L2 for
/// every panel.)
const PANEL_BYTES_PER_PASS: usize = 64 << 10;

/// The tiles of a product over weight rows `rows` (whole panels) with `m` activation rows, as
/// (panel, first activation row, rows in the tile) of at most `max_rows` rows, in the order that
/// keeps a tile's activations in L1: panels in runs of about [`PANEL_BYTES_PER_PASS`], each run
/// passing every tile.
pub(super) fn tiles(
    w: &PackedMatrix,
    rows: Range<usize>,
    m: usize,
    max_rows: usize,
) -> impl Iterator<Item = (usize, usize, usize)> {
    assert!(rows.start.is_multiple_of(PANEL), "rows must start a panel");
    let panels = rows.start / PANEL..rows.end.div_ceil(PANEL);
    let per_pass = (PANEL_BYTES_PER_PASS / (64 * w.panel_lines())).max(1);
    panels.clone().step_by(per_pass).flat_map(move |first| {
        let run = first..(first + per_pass).min(panels.end);
        (0..m).step_by(max_rows).flat_map(move |row| {
            run.clone()
                .map(move |panel| (panel, row, (m - row).min(max_rows)))
        })
    })
}

/// One 64-byte line, aligned for full-width loads.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Line(pub [u8; 64]);

/// The weight types that have a packed form (GGML's names).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackedKind {
    Q4_0,
    Q4_1,
    Q8_0,
    Q5_0,
    Q5_1,
    /// Each 32-value sub-block of a K-quant super-block is a block of its own.
    Q4_K,
    Q5_K,
    /// Per-16 scales: `d` per half block.
    Q6_K,
    Q3_K,
    Q2_K,
    /// Table indices stored as nibbles, looked up by the kernels (see [`Values::Table4`]).
    IQ4_NL,
    IQ4_XS,
}

/// How a packed block stores its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Values {
    /// 0..3: two bits a value, line g / 4 holding group g's at bits `2·(g % 4)` of each byte.
    Bits2,
    /// 0..7: the low two bits as [`Values::Bits2`], the third in line 2, group g's at bit g.
    Bits3,
    /// 0..15: line `p` holds group `p` in its low nibbles and group `p + 4` in its high ones.
    Nib4,
    /// 0..31: the low four bits as [`Values::Nib4`], then one line of fifth bits: group g's at
    /// bit g of each byte of line 4.
    Nib5,
    /// 0..63: the low four bits as [`Values::Nib4`], then two lines of 2-bit tops: line 4 + g/4
    /// holds group g's at bits `2·(g % 4)` of each byte.
    Nib6,
    /// 0..255: line g holds group g.
    Byte,
    /// IQ4's 16 table values made unsigned (0..=240, [`IQ4_UNSIGNED`]): their 4-bit indices
    /// stored as [`Values::Nib4`], each group's value taken from the table by one byte shuffle.
    Table4,
}

impl Values {
    /// The largest value.
    pub(super) const fn max(self) -> u32 {
        match self {
            Self::Bits2 => 3,
            Self::Bits3 => 7,
            Self::Nib4 => 15,
            Self::Nib5 => 31,
            Self::Nib6 => 63,
            Self::Byte => 255,
            Self::Table4 => IQ4_UNSIGNED[15] as u32,
        }
    }

    /// How many groups' `vpmaddubsw` results (each lane the sum of two value·byte products, at
    /// most 2·max·128 in size) can be added in 16 bits without overflow: 8 for 4-bit values, 4 for
    /// 5-bit ones, 2 for 6-bit ones; 0 for bytes, whose single products can already overflow.
    pub(super) const fn groups_in_i16(self) -> usize {
        i16::MAX as usize / (2 * 128 * self.max() as usize)
    }
}

impl PackedKind {
    pub(super) const ALL: [PackedKind; 12] = [
        Self::Q4_0,
        Self::Q4_1,
        Self::Q8_0,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::Q3_K,
        Self::Q2_K,
        Self::IQ4_NL,
        Self::IQ4_XS,
    ];

    pub fn of(dtype: GgmlType) -> Option<Self> {
        Some(match dtype {
            GgmlType::Q4_0 => Self::Q4_0,
            GgmlType::Q4_1 => Self::Q4_1,
            GgmlType::Q8_0 => Self::Q8_0,
            GgmlType::Q5_0 => Self::Q5_0,
            GgmlType::Q5_1 => Self::Q5_1,
            GgmlType::Q4_K => Self::Q4_K,
            GgmlType::Q5_K => Self::Q5_K,
            GgmlType::Q6_K => Self::Q6_K,
            GgmlType::Q3_K => Self::Q3_K,
            GgmlType::Q2_K => Self::Q2_K,
            GgmlType::IQ4_NL => Self::IQ4_NL,
            GgmlType::IQ4_XS => Self::IQ4_XS,
            _ => return None,
        })
    }

    /// The kernels' compile-time code for this kind (its index in [`PackedKind::ALL`]).
    pub(super) const fn code(self) -> u8 {
        self as u8
    }

    pub(super) const fn from_code(code: u8) -> Self {
        Self::ALL[code as usize]
    }

    pub(super) const fn values(self) -> Values {
        match self {
            Self::Q2_K => Values::Bits2,
            Self::Q3_K => Values::Bits3,
            Self::Q4_0 | Self::Q4_1 | Self::Q4_K => Values::Nib4,
            Self::Q5_0 | Self::Q5_1 | Self::Q5_K => Values::Nib5,
            Self::Q6_K => Values::Nib6,
            Self::Q8_0 => Values::Byte,
            Self::IQ4_NL | Self::IQ4_XS => Values::Table4,
        }
    }

    pub(super) const fn value_lines(self) -> usize {
        match self.values() {
            Values::Bits2 => 2,
            Values::Bits3 => 3,
            Values::Nib4 | Values::Table4 => 4,
            Values::Nib5 => 5,
            Values::Nib6 => 6,
            Values::Byte => 8,
        }
    }

    pub(super) const fn dtype(self) -> GgmlType {
        match self {
            Self::Q4_0 => GgmlType::Q4_0,
            Self::Q4_1 => GgmlType::Q4_1,
            Self::Q8_0 => GgmlType::Q8_0,
            Self::Q5_0 => GgmlType::Q5_0,
            Self::Q5_1 => GgmlType::Q5_1,
            Self::Q4_K => GgmlType::Q4_K,
            Self::Q5_K => GgmlType::Q5_K,
            Self::Q6_K => GgmlType::Q6_K,
            Self::Q3_K => GgmlType::Q3_K,
            Self::Q2_K => GgmlType::Q2_K,
            Self::IQ4_NL => GgmlType::IQ4_NL,
            Self::IQ4_XS => GgmlType::IQ4_XS,
        }
    }

    /// Scales per block: 2 (one per half) for the types with 16-value sub-blocks, else 1.
    pub(super) const fn halves(self) -> usize {
        match self {
            Self::Q6_K | Self::Q3_K | Self::Q2_K => 2,
            _ => 1,
        }
    }

    /// A K-quant: blocks grouped by super-block, with the scale lines after each group.
    pub(super) const fn super_blocks(self) -> bool {
        matches!(
            self,
            Self::Q4_K | Self::Q5_K | Self::Q6_K | Self::Q3_K | Self::Q2_K | Self::IQ4_XS
        )
    }

    /// Blocks that share their scale lines: a K-quant's super-block of 8; 2 for the types with
    /// one f16 scale (each takes half the line); 1 for those with a min too.
    pub(super) const fn unit_blocks(self) -> usize {
        if self.super_blocks() {
            8
        } else if self.offset_factor().is_some() {
            2
        } else {
            1
        }
    }

    /// Lines of such a unit: the blocks' values, then 1 f16 scale line (32-value types: 16 `d`
    /// of each block, or 16 `d` then 16 mins) or 4 lines of scale bytes and 1 of f16 `d`, `dmin`
    /// (K-quants). A row's last unit may be part-filled.
    pub(super) const fn unit_lines(self) -> usize {
        self.unit_blocks() * self.value_lines() + if self.super_blocks() { 5 } else { 1 }
    }

    /// The panel layout's bytes for a whole number of units, over the GGUF blocks' bytes for the
    /// same values (what packing a matrix of this type costs in memory, padding rows aside).
    pub fn size_ratio(self) -> f64 {
        let dtype = self.dtype();
        let values = (PANEL * self.unit_blocks() * 32) as f64;
        let gguf = values / dtype.block_size() as f64 * dtype.type_size() as f64;
        (self.unit_lines() * 64) as f64 / gguf
    }

    /// The first line of block `i`'s values within its panel.
    pub(super) const fn value_at(self, i: usize) -> usize {
        let u = self.unit_blocks();
        (i / u) * self.unit_lines() + (i % u) * self.value_lines()
    }

    /// The first scale line of block `i`'s unit within its panel.
    pub(super) const fn scales_at(self, i: usize) -> usize {
        let u = self.unit_blocks();
        (i / u) * self.unit_lines() + u * self.value_lines()
    }

    /// The offset as a fixed multiple `f` of the scale, for the types that store none (a
    /// K-quant's per sub-block: see [`k_scales`]).
    pub(super) const fn offset_factor(self) -> Option<i32> {
        fixed_offset(self.dtype())
    }

    /// What the integer sum of (half) block `h` starts from: with a fixed offset `f`, `f·Σq` over
    /// the activations it meets, so that the sum is `Σ(u + f)·q`, the weights' own values times
    /// the activations, and the offset costs no float step; 0 for the kinds with a min.
    #[inline(always)]
    pub(super) fn offset_sum(self, a: &BlockQ8Pair, h: usize) -> i32 {
        match self.offset_factor() {
            Some(f) if self.halves() == 2 => f * a.sums[h],
            Some(f) => f * (a.sums[0] + a.sums[1]),
            None => 0,
        }
    }

    /// Values in one block of the GGUF type (a K-quant super-block holds 8 panel blocks).
    const fn gguf_block(self) -> usize {
        if self.super_blocks() { 256 } else { 32 }
    }
}

/// A weight matrix in panel layout: panel `p` holds rows `16p..16p + 16` (missing rows of the
/// last panel are zeros), its units (a block, or a K-quant's super-block) in order, each
/// [`PackedKind::unit_lines`] lines.
pub struct PackedMatrix {
    pub kind: PackedKind,
    pub rows: usize,
    pub cols: usize,
    blocks: usize,
    data: Vec<Line>,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedMatrix")
            .field("kind", &self.kind)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish()
    }
}

impl PackedMatrix {
    /// The packed form of `w`, or `None` when its type has none.
    pub fn pack(w: &QMatrix<'_>) -> Option<Self> {
        let kind = PackedKind::of(w.dtype)?;
        let blocks = w.cols / 32;
        let panels = w.rows.div_ceil(PANEL);
        let lines = kind.unit_lines();
        let units = blocks.div_ceil(kind.unit_blocks());
        let mut data = vec![Line([0; 64]); panels * units * lines];
        let size = w.dtype.type_size();
        let per_unit = kind.unit_blocks() / (kind.gguf_block() / 32);
        for n in 0..w.rows {
            let (panel, lane) = (n / PANEL, n % PANEL);
            for (i, b) in w.row(n).chunks_exact(size).enumerate() {
                let at = (panel * units + i / per_unit) * lines;
                pack_unit(kind, b, i % per_unit, lane, &mut data[at..at + lines]);
            }
        }
        Some(Self {
            kind,
            rows: w.rows,
            cols: w.cols,
            blocks,
            data,
        })
    }

    /// The packed form of `w` if this CPU's kernels multiply its type packed (see
    /// [`super::packs`]), else `None`: what a model loader calls for each weight matrix.
    pub fn for_this_cpu(w: &QMatrix<'_>) -> Option<Self> {
        super::packs(w.dtype, super::isa())
            .then(|| Self::pack(w))
            .flatten()
    }

    pub fn panels(&self) -> usize {
        self.rows.div_ceil(PANEL)
    }

    /// Blocks of 32 values in a row.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Lines in one panel.
    fn panel_lines(&self) -> usize {
        self.blocks.div_ceil(self.kind.unit_blocks()) * self.kind.unit_lines()
    }

    /// The lines of panel `p`: all its blocks in order.
    pub(super) fn panel(&self, p: usize) -> &[Line] {
        let per = self.panel_lines();
        &self.data[p * per..(p + 1) * per]
    }

    pub fn bytes(&self) -> usize {
        self.data.len() * 64
    }

    /// Sets every packed value to its type's largest (all value bits on), for overflow tests.
    #[cfg(test)]
    pub(super) fn saturate_values(&mut self) {
        let per = self.panel_lines();
        for panel in self.data.chunks_exact_mut(per) {
            for i in 0..self.blocks {
                let at = self.kind.value_at(i);
                for line in &mut panel[at..at + self.kind.value_lines()] {
                    line.0 = [0xff; 64];
                }
            }
        }
    }

    /// Row `n`'s unsigned value `k`, and the scale and offset of its (half) block (the scalar
    /// view of the layout, for the reference product and tests).
    fn value(&self, n: usize, k: usize) -> (u8, f32, f32) {
        let (panel, lane, i, j) = (n / PANEL, n % PANEL, k / 32, k % 32);
        let kind = self.kind;
        let lines = self.panel(panel);
        let block = &lines[kind.value_at(i)..];
        let scales = &lines[kind.scales_at(i)..];
        let (d, c) = if kind.super_blocks() {
            let sub = i % 8;
            let at = 32 * (sub % 2) + 2 * lane;
            let bytes = &scales[sub / 2].0[at..at + 2];
            let (d, dmin) = (
                f16_at(&scales[4].0, 2 * lane),
                f16_at(&scales[4].0, 32 + 2 * lane),
            );
            let (d, c) = k_scales(kind.dtype(), [bytes[0], bytes[1]], d, dmin);
            (d[j / 16], c[j / 16])
        } else {
            match kind.offset_factor() {
                Some(f) => {
                    let d = f16_at(&scales[0].0, 32 * (i % 2) + 2 * lane);
                    (d, d * f as f32)
                }
                None => (
                    f16_at(&scales[0].0, 2 * lane),
                    f16_at(&scales[0].0, 32 + 2 * lane),
                ),
            }
        };
        let (g, t) = (j / 4, j % 4);
        let byte = |line: usize| block[line].0[4 * lane + t];
        let u = match kind.values() {
            Values::Byte => byte(g),
            Values::Bits2 | Values::Bits3 => {
                let low = (byte(g / 4) >> (2 * (g % 4))) & 3;
                let top = if kind.values() == Values::Bits3 {
                    ((byte(2) >> g) & 1) << 2
                } else {
                    0
                };
                low | top
            }
            values => {
                let low = if g < 4 {
                    byte(g) & 0x0f
                } else {
                    byte(g - 4) >> 4
                };
                match values {
                    Values::Nib5 => low | ((byte(4) >> g) & 1) << 4,
                    Values::Nib6 => low | ((byte(4 + g / 4) >> (2 * (g % 4))) & 3) << 4,
                    Values::Table4 => IQ4_UNSIGNED[usize::from(low)],
                    _ => low,
                }
            }
        };
        (u, d, c)
    }

    /// Row `n` as f32 (tests compare it with the GGUF dequantisation).
    pub fn dequantize_row(&self, n: usize) -> Vec<f32> {
        (0..self.cols)
            .map(|k| {
                let (u, d, c) = self.value(n, k);
                d * f32::from(u) + c
            })
            .collect()
    }

    /// Row `n` · one activation row, in exactly the arithmetic of the packed kernels (so they
    /// agree bitwise): per block, or per half block for the types with two scales, an exact
    /// integer sum from [`PackedKind::offset_sum`], then `acc = fma(Σ, d·d_x, acc)` and, for the
    /// kinds with a min, `acc = fma(c, s_x, acc)`, in order.
    pub fn reference_dot(&self, n: usize, acts: &[BlockQ8Pair]) -> f32 {
        let halves = self.kind.halves();
        let span = 32 / halves;
        let mut acc = 0.0f32;
        for (i, a) in acts.iter().enumerate() {
            for h in 0..halves {
                let mut sum = self.kind.offset_sum(a, h);
                for j in h * span..(h + 1) * span {
                    let (u, _, _) = self.value(n, 32 * i + j);
                    let q = 256 * i32::from(a.hi[j]) + i32::from(a.lo[j]);
                    sum += i32::from(u) * q;
                }
                let (_, d, c) = self.value(n, 32 * i + h * span);
                let s = if halves == 2 { a.sh[h] } else { a.s };
                acc = (sum as f32).mul_add(d * a.d, acc);
                if self.kind.offset_factor().is_none() {
                    acc = c.mul_add(s, acc);
                }
            }
        }
        acc
    }
}

/// Writes GGUF block `b`, block `at` of its unit, into row `lane` of the unit's lines (`kind`'s
/// layout).
fn pack_unit(kind: PackedKind, b: &[u8], at: usize, lane: usize, unit: &mut [Line]) {
    let vl = kind.value_lines();
    let (values, scales) = unit.split_at_mut(kind.unit_blocks() * vl);
    if kind.super_blocks() {
        for j in 0..8 {
            let sub = k_sub_block(kind.dtype(), b, j);
            let at = 32 * (j % 2) + 2 * lane;
            scales[j / 2].0[at..at + 2].copy_from_slice(&sub.s);
            put_values(kind, &sub.u, lane, &mut values[j * vl..(j + 1) * vl]);
        }
        let [d, dmin] = k_super_scales(kind.dtype(), b);
        scales[4].0[2 * lane..2 * lane + 2].copy_from_slice(&d);
        scales[4].0[32 + 2 * lane..32 + 2 * lane + 2].copy_from_slice(&dmin);
        return;
    }
    let u: [u8; 32] = match kind {
        PackedKind::Q8_0 => std::array::from_fn(|j| (b[2 + j] as i8 as i32 + 128) as u8),
        PackedKind::Q4_0 | PackedKind::Q4_1 => {
            let qs = if kind == PackedKind::Q4_1 { 4 } else { 2 };
            std::array::from_fn(|j| {
                let q = b[qs + j % 16];
                if j < 16 { q & 0x0f } else { q >> 4 }
            })
        }
        PackedKind::Q5_0 => q5_values(&b[2..22]),
        PackedKind::IQ4_NL => iq4_unsigned(iq4_indices(&b[2..18])),
        _ => q5_values(&b[4..24]),
    };
    let vl = kind.value_lines();
    put_values(kind, &u, lane, &mut values[at * vl..(at + 1) * vl]);
    let line = &mut scales[0].0;
    if kind.offset_factor().is_some() {
        // One `d` per block: the unit's two blocks each take half the line.
        line[32 * at + 2 * lane..32 * at + 2 * lane + 2].copy_from_slice(&b[0..2]);
    } else {
        // Q4_1 and Q5_1: `d`, then the min.
        line[2 * lane..2 * lane + 2].copy_from_slice(&b[0..2]);
        line[32 + 2 * lane..32 + 2 * lane + 2].copy_from_slice(&b[2..4]);
    }
}

/// Writes one block's 32 values of row `lane` into its value lines (`kind`'s [`Values`]).
fn put_values(kind: PackedKind, u: &[u8; 32], lane: usize, values: &mut [Line]) {
    // Value j is group g = j / 4, byte t = j % 4 of row `lane`'s four bytes in its line.
    for (j, &u) in u.iter().enumerate() {
        let (g, at) = (j / 4, 4 * lane + j % 4);
        match kind.values() {
            Values::Byte => values[g].0[at] = u,
            Values::Bits2 | Values::Bits3 => {
                values[g / 4].0[at] |= (u & 3) << (2 * (g % 4));
                if kind.values() == Values::Bits3 {
                    values[2].0[at] |= (u >> 2) << g;
                }
            }
            nibbles => {
                let u = if nibbles == Values::Table4 {
                    iq4_index(u)
                } else {
                    u
                };
                values[g % 4].0[at] |= if g < 4 { u & 0x0f } else { (u & 0x0f) << 4 };
                match nibbles {
                    Values::Nib5 => values[4].0[at] |= (u >> 4) << g,
                    Values::Nib6 => values[4 + g / 4].0[at] |= (u >> 4) << (2 * (g % 4)),
                    _ => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::tests::random_weights;
    use crate::quant::dequantize;

    #[test]
    fn packed_rows_dequantise_like_gguf() {
        for kind in PackedKind::ALL {
            let dtype = GgmlType::from_id(
                (0..64)
                    .find(|&id| GgmlType::from_id(id).and_then(PackedKind::of) == Some(kind))
                    .unwrap(),
            )
            .unwrap();
            let (rows, cols) = (21, 512); // a partial last panel
            let bytes = random_weights(dtype, rows, cols, 5);
            let w = QMatrix::new(dtype, rows, cols, &bytes).unwrap();
            let p = PackedMatrix::pack(&w).unwrap();
            assert_eq!(p.panels(), 2);
            let mut want = vec![0.0; cols];
            for n in 0..rows {
                dequantize(dtype, w.row(n), &mut want).unwrap();
                let got = p.dequantize_row(n);
                for (k, (g, e)) in got.iter().zip(&want).enumerate() {
                    // Q4_0/Q8_0: d·(u − 8) vs d·u − 8d, equal up to one rounding (relative to
                    // the block's scale where the value itself is tiny).
                    let scale = p.value(n, k).1.abs();
                    assert!(
                        (g - e).abs() <= 1e-6 * e.abs().max(scale),
                        "{dtype} [{n},{k}] {g} vs {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn types_without_a_packed_form_are_left_alone() {
        let bytes = random_weights(GgmlType::F16, 2, 256, 1);
        let w = QMatrix::new(GgmlType::F16, 2, 256, &bytes).unwrap();
        assert!(PackedMatrix::pack(&w).is_none());
    }

    /// Packed weights take about the GGUF's bytes (the last panel's padding rows aside): at most
    /// 1.06×, IQ4_XS 1.09× (its 6-bit sub-block scales take the K-quants' two bytes a row).
    #[test]
    fn packed_bytes_stay_within_a_few_percent_of_the_gguf() {
        for kind in PackedKind::ALL {
            let dtype = kind.dtype();
            let (rows, cols) = (64, 1536);
            let bytes = random_weights(dtype, rows, cols, 3);
            let w = QMatrix::new(dtype, rows, cols, &bytes).unwrap();
            let ratio = PackedMatrix::pack(&w).unwrap().bytes() as f64 / bytes.len() as f64;
            assert!(
                (ratio - kind.size_ratio()).abs() < 1e-9,
                "{dtype}: the layout's ratio {} is not the packed one {ratio}",
                kind.size_ratio()
            );
            let limit = if kind == PackedKind::IQ4_XS {
                1.09
            } else {
                1.06
            };
            assert!(ratio <= limit, "{dtype}: {ratio:.3}× the GGUF's bytes");
        }
    }

    #[test]
    fn kinds_round_trip_through_their_codes() {
        for kind in PackedKind::ALL {
            assert_eq!(PackedKind::from_code(kind.code()), kind);
        }
    }
}
