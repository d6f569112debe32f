//! Weights repacked at load time for the AVX-512 kernels: panels of 16 rows whose blocks are
//! interleaved so that one 64-byte load holds four consecutive values of each of the 16 rows,
//! the operand layout of `vpdpbusd`. Each output lane is then one weight row: no horizontal sums,
//! and one load of activations (broadcast) feeds 16 rows.
//!
//! Every supported type becomes "unsigned values with a per-block scale and offset" over blocks
//! of 32 values: `w = d·u + c`, with `u` 0..15 (Q4_0, Q4_1, Q4_K) or 0..255 (Q8_0 shifted by
//! 128), and `c` = Q4_1's min, `−8·d` (Q4_0), `−128·d` (Q8_0), or for Q4_K's sub-blocks `d` =
//! `d·sc` and `c` = `−dmin·m` (stored as f32: they are products a half float cannot hold). A
//! block's dot product with activations `x = d_x·q` is then `Σu·q · d·d_x + c·s_x`, where
//! `s_x = d_x·Σq`.

use super::QMatrix;
use crate::quant::{BlockQ8Pair, GgmlType, f16_at, q4_k_sub_block, q5_values};

/// Weight rows in one panel: the 16 f32 lanes of a 512-bit register.
pub const PANEL: usize = 16;

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
    /// Each 32-value sub-block of a Q4_K super-block as a block of its own.
    Q4_K,
    /// Q5_0 and Q5_1 with their 5-bit values a byte each, in Q8_0's lines (for now: 1.6× the
    /// GGUF's bytes, where a bit-plane layout would need 1.1×).
    Q5_0,
    Q5_1,
}

impl PackedKind {
    pub(super) fn of(dtype: GgmlType) -> Option<Self> {
        match dtype {
            GgmlType::Q4_0 => Some(Self::Q4_0),
            GgmlType::Q4_1 => Some(Self::Q4_1),
            GgmlType::Q8_0 => Some(Self::Q8_0),
            GgmlType::Q4_K => Some(Self::Q4_K),
            GgmlType::Q5_0 => Some(Self::Q5_0),
            GgmlType::Q5_1 => Some(Self::Q5_1),
            _ => None,
        }
    }

    /// Lines of one panel block: the values (two nibbles a byte for Q4, a byte for Q8), then one
    /// line of scales: 16 f16 `d`, then 16 f16 mins (Q4_1 only); Q4_K: two lines, 16 f32 `d`
    /// then 16 f32 `c`.
    pub(super) const fn block_lines(self) -> usize {
        match self {
            Self::Q4_0 | Self::Q4_1 => 5,
            Self::Q4_K => 6,
            Self::Q8_0 | Self::Q5_0 | Self::Q5_1 => 9,
        }
    }

    /// Whether values are a byte each (else two nibbles a byte).
    pub(super) const fn byte_values(self) -> bool {
        matches!(self, Self::Q8_0 | Self::Q5_0 | Self::Q5_1)
    }

    /// Values in one block of the GGUF type (a Q4_K super-block holds 8 panel blocks).
    const fn gguf_block(self) -> usize {
        match self {
            Self::Q4_K => 256,
            _ => 32,
        }
    }

    /// The block offset `c` from its scale `d` and stored min `m` (Q4_1) or offset (Q4_K) (f32
    /// arithmetic the kernels repeat exactly: the products by −8 and −128 are exact).
    pub(super) fn offset(self, d: f32, m: f32) -> f32 {
        match self {
            Self::Q4_0 => d * -8.0,
            Self::Q4_1 | Self::Q4_K | Self::Q5_1 => m,
            Self::Q8_0 => d * -128.0,
            Self::Q5_0 => d * -16.0,
        }
    }
}

/// A weight matrix in panel layout: panel `p` holds rows `16p..16p + 16` (missing rows of the
/// last panel are zeros), its blocks in order, each [`PackedKind::block_lines`] lines.
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
        let lines = kind.block_lines();
        let mut data = vec![Line([0; 64]); panels * blocks * lines];
        let size = w.dtype.type_size();
        let per_gguf = kind.gguf_block() / 32;
        for n in 0..w.rows {
            let (panel, lane) = (n / PANEL, n % PANEL);
            for (i, b) in w.row(n).chunks_exact(size).enumerate() {
                for j in 0..per_gguf {
                    let at = (panel * blocks + i * per_gguf + j) * lines;
                    pack_block(kind, b, j, lane, &mut data[at..at + lines]);
                }
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

    pub fn panels(&self) -> usize {
        self.rows.div_ceil(PANEL)
    }

    /// Blocks of 32 values in a row.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// The lines of panel `p`: all its blocks in order.
    pub(super) fn panel(&self, p: usize) -> &[Line] {
        let per = self.blocks * self.kind.block_lines();
        &self.data[p * per..(p + 1) * per]
    }

    pub fn bytes(&self) -> usize {
        self.data.len() * 64
    }

    /// Row `n`'s unsigned value `k`, its block's scale and offset (the scalar view of the
    /// layout, for the reference product and tests).
    fn value(&self, n: usize, k: usize) -> (u8, f32, f32) {
        let (panel, lane, i, j) = (n / PANEL, n % PANEL, k / 32, k % 32);
        let lines = self.kind.block_lines();
        let block = &self.panel(panel)[i * lines..(i + 1) * lines];
        let (d, m) = if self.kind == PackedKind::Q4_K {
            let f32_at = |line: &Line| {
                let b = &line.0[4 * lane..4 * lane + 4];
                f32::from_le_bytes([b[0], b[1], b[2], b[3]])
            };
            (f32_at(&block[4]), f32_at(&block[5]))
        } else {
            let scales = &block[lines - 1].0;
            (f16_at(scales, 2 * lane), f16_at(scales, 32 + 2 * lane))
        };
        let (g, t) = (j / 4, j % 4);
        let u = match self.kind {
            k if k.byte_values() => block[g].0[4 * lane + t],
            _ => {
                let byte = block[g % 4].0[4 * lane + t];
                if g < 4 { byte & 0x0f } else { byte >> 4 }
            }
        };
        (u, d, self.kind.offset(d, m))
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

    /// Row `n` · one activation row, in exactly the arithmetic of the AVX-512 kernel (so the two
    /// agree bitwise): per block an exact integer sum, then `acc = fma(Σ, d·d_x, acc)` and
    /// `acc = fma(c, s_x, acc)`, blocks in order.
    pub fn reference_dot(&self, n: usize, acts: &[BlockQ8Pair]) -> f32 {
        let mut acc = 0.0f32;
        for (i, a) in acts.iter().enumerate() {
            let mut sum = 0i32;
            for j in 0..32 {
                let (u, _, _) = self.value(n, 32 * i + j);
                let q = 256 * i32::from(a.hi[j]) + i32::from(a.lo[j]);
                sum += i32::from(u) * q;
            }
            let (_, d, c) = self.value(n, 32 * i);
            acc = (sum as f32).mul_add(d * a.d, acc);
            acc = c.mul_add(a.s, acc);
        }
        acc
    }
}

/// Writes panel block `block` (`kind`'s lines) of row `lane`: from GGUF block `b`, or for Q4_K
/// from sub-block `sub` of super-block `b`.
fn pack_block(kind: PackedKind, b: &[u8], sub: usize, lane: usize, block: &mut [Line]) {
    let lines = block.len();
    // Line g (Q8) or p (Q4) holds values 4g..4g+4 of each row at bytes 4·lane...
    let (scale, min) = match kind {
        PackedKind::Q8_0 => {
            for g in 0..8 {
                for t in 0..4 {
                    let q = b[2 + 4 * g + t] as i8;
                    block[g].0[4 * lane + t] = (i32::from(q) + 128) as u8;
                }
            }
            (&b[0..2], None)
        }
        PackedKind::Q5_0 | PackedKind::Q5_1 => {
            let at = if kind == PackedKind::Q5_1 { 4 } else { 2 };
            for (j, u) in q5_values(&b[at..at + 20]).into_iter().enumerate() {
                block[j / 4].0[4 * lane + j % 4] = u;
            }
            let min = (kind == PackedKind::Q5_1).then(|| &b[2..4]);
            (&b[0..2], min)
        }
        PackedKind::Q4_0 | PackedKind::Q4_1 => {
            let qs = if kind == PackedKind::Q4_1 { 4 } else { 2 };
            // ...and for Q4, GGML's byte j already holds values j (low nibble) and j + 16
            // (high nibble): line p gets bytes 4p..4p+4, so its low nibbles are group p and its
            // high nibbles group p + 4.
            for p in 0..4 {
                let src = &b[qs + 4 * p..qs + 4 * p + 4];
                block[p].0[4 * lane..4 * lane + 4].copy_from_slice(src);
            }
            let min = (kind == PackedKind::Q4_1).then(|| &b[2..4]);
            (&b[0..2], min)
        }
        PackedKind::Q4_K => {
            // ...the same nibble order, built from the sub-block's values.
            let (u, d, m) = q4_k_sub_block(b, sub);
            for p in 0..4 {
                for t in 0..4 {
                    block[p].0[4 * lane + t] = u[4 * p + t] | (u[16 + 4 * p + t] << 4);
                }
            }
            block[4].0[4 * lane..4 * lane + 4].copy_from_slice(&d.to_le_bytes());
            block[5].0[4 * lane..4 * lane + 4].copy_from_slice(&(-m).to_le_bytes());
            return;
        }
    };
    let scales = &mut block[lines - 1].0;
    scales[2 * lane..2 * lane + 2].copy_from_slice(scale);
    if let Some(m) = min {
        scales[32 + 2 * lane..32 + 2 * lane + 2].copy_from_slice(m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::tests::random_weights;
    use crate::quant::dequantize;

    #[test]
    fn packed_rows_dequantise_like_gguf() {
        for dtype in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
        ] {
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
                    // Q4_0/Q8_0: d·(u − 8) vs d·u − 8d, equal up to one rounding.
                    assert!(
                        (g - e).abs() <= 1e-6 * e.abs().max(1e-3),
                        "{dtype} [{n},{k}] {g} vs {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn types_without_a_packed_form_are_left_alone() {
        let bytes = random_weights(GgmlType::Q6_K, 2, 256, 1);
        let w = QMatrix::new(GgmlType::Q6_K, 2, 256, &bytes).unwrap();
        assert!(PackedMatrix::pack(&w).is_none());
    }
}
