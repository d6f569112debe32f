//! The head's forward pass, one row at a time in f32 (the reference the batched kernels will be
//! held to): `[RMSNorm(embedding) ; RMSNorm(feature)]` through one decoder layer whose residual
//! is the feature, then the final norm and the reduced-vocabulary output layer. The feature is
//! `fc` over the three captured target states on a row from the target, or the head's own
//! previous pre-norm output on a row it drafts from itself; that output is returned to carry on.

use super::{Eagle3Head, Matrix};

/// The head's keys and values of one sequence, position after position.
#[derive(Debug, Clone, Default)]
pub struct HeadCache {
    keys: Vec<f32>,
    values: Vec<f32>,
}

impl HeadCache {
    /// Positions held.
    pub fn len(&self, head: &Eagle3Head) -> usize {
        self.keys.len() / head.kv_width()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Forgets positions from `len` on (drafts that were rejected).
    pub fn truncate(&mut self, head: &Eagle3Head, len: usize) {
        self.keys.truncate(len * head.kv_width());
        self.values.truncate(len * head.kv_width());
    }
}

/// One row's results.
#[derive(Debug, Clone)]
pub struct HeadOutput {
    /// Over the draft vocabulary (`draft_to_target` maps an index to the target's token).
    pub logits: Vec<f32>,
    /// The pre-norm output: the next row's feature when the head drafts on from this one.
    pub carry: Vec<f32>,
}

impl Eagle3Head {
    fn kv_width(&self) -> usize {
        self.config.n_kv_heads * self.config.head_dim
    }

    /// Runs one row at position `cache.len()`: the token's `embedding` (`hidden` values) and
    /// its `feature` (`3 × target_hidden` captured states, or `hidden` from [`HeadOutput::carry`]).
    pub fn step(&self, cache: &mut HeadCache, embedding: &[f32], feature: &[f32]) -> HeadOutput {
        let c = &self.config;
        let h = c.hidden;
        assert_eq!(embedding.len(), h, "an embedding of the head's width");
        let g = if feature.len() == h {
            feature.to_vec()
        } else {
            assert_eq!(
                feature.len(),
                3 * c.target_hidden,
                "three captured states or a carry"
            );
            matvec(&self.fc, feature)
        };
        let normed_g = rms_norm(&g, &self.hidden_norm, c.rms_eps);
        let residual = if c.norm_before_residual {
            normed_g.clone()
        } else {
            g
        };
        let mut a = rms_norm(embedding, &self.input_norm, c.rms_eps);
        a.extend_from_slice(&normed_g);
        let pos = cache.len(self);
        let mut q = matvec(&self.wq, &a);
        let mut k = matvec(&self.wk, &a);
        let v = matvec(&self.wv, &a);
        rope_neox(&mut q, c.head_dim, pos, c.rope_theta);
        rope_neox(&mut k, c.head_dim, pos, c.rope_theta);
        cache.keys.extend_from_slice(&k);
        cache.values.extend_from_slice(&v);
        let attn = self.attend(cache, &q);
        let h1: Vec<f32> = matvec(&self.wo, &attn)
            .iter()
            .zip(&residual)
            .map(|(o, r)| o + r)
            .collect();
        let n = rms_norm(&h1, &self.post_attention_norm, c.rms_eps);
        let (gate, up) = (matvec(&self.gate, &n), matvec(&self.up, &n));
        let act: Vec<f32> = gate
            .iter()
            .zip(&up)
            .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        let carry: Vec<f32> = matvec(&self.down, &act)
            .iter()
            .zip(&h1)
            .map(|(m, r)| m + r)
            .collect();
        let logits = matvec(&self.lm_head, &rms_norm(&carry, &self.norm, c.rms_eps));
        HeadOutput { logits, carry }
    }

    /// Causal attention of `q` (all query heads) over every cached position.
    fn attend(&self, cache: &HeadCache, q: &[f32]) -> Vec<f32> {
        let c = &self.config;
        let (d, kvw) = (c.head_dim, self.kv_width());
        let n = cache.keys.len() / kvw;
        let group = c.n_heads / c.n_kv_heads;
        let scale = 1.0 / (d as f32).sqrt();
        let mut out = vec![0.0; c.n_heads * d];
        for (hq, o) in out.chunks_exact_mut(d).enumerate() {
            let qh = &q[hq * d..(hq + 1) * d];
            let at = (hq / group) * d;
            let scores: Vec<f32> = (0..n)
                .map(|t| dot(qh, &cache.keys[t * kvw + at..t * kvw + at + d]) * scale)
                .collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
            let z: f32 = e.iter().sum();
            for (t, &p) in e.iter().enumerate() {
                let v = &cache.values[t * kvw + at..t * kvw + at + d];
                for (o, &x) in o.iter_mut().zip(v) {
                    *o += p / z * x;
                }
            }
        }
        out
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn matvec(m: &Matrix, x: &[f32]) -> Vec<f32> {
    assert_eq!(x.len(), m.cols, "input width");
    m.data.chunks_exact(m.cols).map(|row| dot(row, x)).collect()
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let r = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, w)| v * r * w).collect()
}

/// RoPE as Hugging Face's Llama applies it (dimension `i` paired with `i + d/2` in each head).
fn rope_neox(x: &mut [f32], d: usize, pos: usize, theta: f32) {
    let half = d / 2;
    for head in x.chunks_exact_mut(d) {
        for i in 0..half {
            let freq = (theta as f64).powf(-((2 * i) as f64) / d as f64);
            let (sin, cos) = (pos as f64 * freq).sin_cos();
            let (a, b) = (head[i] as f64, head[i + half] as f64);
            head[i] = (a * cos - b * sin) as f32;
            head[i + half] = (b * cos + a * sin) as f32;
        }
    }
}
