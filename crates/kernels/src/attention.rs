//! Attention of one query token over a sequence's keys and values in paged KV blocks.

/// Geometry of the KV storage: `[block][slot in block][kv head][head_dim]`, per layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    pub block_size: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl KvShape {
    /// Floats of one token's keys (or values) in one layer.
    pub fn token_stride(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    pub fn block_stride(&self) -> usize {
        self.block_size * self.token_stride()
    }

    /// Offset of a position's row in a layer's storage, given the sequence's block table.
    pub fn offset(&self, blocks: &[u32], pos: usize) -> usize {
        blocks[pos / self.block_size] as usize * self.block_stride()
            + (pos % self.block_size) * self.token_stride()
    }
}

/// `out` (n_heads × head_dim) = softmax(q·Kᵀ · scale) · V over positions `0..n_ctx`, with grouped
/// query heads (`n_heads / n_kv_heads` query heads share a KV head). `scores` is scratch.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    shape: KvShape,
    blocks: &[u32],
    n_ctx: usize,
    scale: f32,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let d = shape.head_dim;
    let n_heads = q.len() / d;
    let group = n_heads / shape.n_kv_heads;
    scores.resize(n_ctx, 0.0);
    for h in 0..n_heads {
        let kvh = h / group;
        let qh = &q[h * d..(h + 1) * d];
        for (t, s) in scores.iter_mut().enumerate() {
            let at = shape.offset(blocks, t) + kvh * d;
            let k = &keys[at..at + d];
            *s = crate::ops::dot(qh, k) * scale;
        }
        crate::ops::softmax(scores);
        let oh = &mut out[h * d..(h + 1) * d];
        oh.fill(0.0);
        for (t, &p) in scores.iter().enumerate() {
            let at = shape.offset(blocks, t) + kvh * d;
            for (o, &v) in oh.iter_mut().zip(&values[at..at + d]) {
                *o += p * v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paged_matches_contiguous_attention() {
        // 2 query heads sharing 1 KV head, head_dim 4, 5 positions over blocks [3, 1] of size 4.
        let shape = KvShape {
            block_size: 4,
            n_kv_heads: 1,
            head_dim: 4,
        };
        let blocks = [3u32, 1];
        let n_ctx = 5;
        let mut keys = vec![0.0; 4 * shape.block_stride()];
        let mut values = keys.clone();
        let k_rows: Vec<[f32; 4]> = (0..n_ctx)
            .map(|t| [t as f32 * 0.1, 0.2, -0.3, 0.05 * t as f32])
            .collect();
        let v_rows: Vec<[f32; 4]> = (0..n_ctx)
            .map(|t| [1.0, t as f32, -(t as f32), 0.5])
            .collect();
        for t in 0..n_ctx {
            let at = shape.offset(&blocks, t);
            keys[at..at + 4].copy_from_slice(&k_rows[t]);
            values[at..at + 4].copy_from_slice(&v_rows[t]);
        }
        let q = [0.3, -0.1, 0.7, 0.2, -0.5, 0.4, 0.1, 0.9];
        let mut out = [0.0; 8];
        paged_attention(
            &q,
            &keys,
            &values,
            shape,
            &blocks,
            n_ctx,
            0.5,
            &mut out,
            &mut Vec::new(),
        );
        for h in 0..2 {
            let s: Vec<f64> = k_rows
                .iter()
                .map(|k| {
                    (0..4)
                        .map(|i| q[h * 4 + i] as f64 * k[i] as f64)
                        .sum::<f64>()
                        * 0.5
                })
                .collect();
            let m = s.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for i in 0..4 {
                let want: f64 = (0..n_ctx).map(|t| e[t] / z * v_rows[t][i] as f64).sum();
                assert!(
                    (out[h * 4 + i] as f64 - want).abs() < 1e-6,
                    "head {h} dim {i}"
                );
            }
        }
    }
}
