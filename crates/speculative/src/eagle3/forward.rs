//! The head's forward pass, one row at a time in f32 (the reference the batched kernels will be
//! held to): `[RMSNorm(embedding) ; RMSNorm(feature)]` through one decoder layer whose residual
//! is the feature, then the final norm and the reduced-vocabulary output layer. The feature is
//! `fc` over the three captured target states on a row from the target, or the head's own
//! previous pre-norm output on a row it drafts from itself; that output is returned to carry on.
//! The norms, RoPE (Hugging Face's pairing: dimension `i` with `i + d/2`), softmax and gating are
//! the runtime's own (`kernels::ops`).

use super::{Eagle3Head, Matrix};
use kernels::ops::{
    Gate, RopeFreqs, RopeMode, dot, gated_mul, rms_norm, rope_angles, rope_apply, softmax,
};

/// One row's results.
#[derive(Debug, Clone)]
pub struct HeadOutput {
    /// Over the draft vocabulary (`draft_to_target` maps an index to the target's token).
    pub logits: Vec<f32>,
    /// The pre-norm output: the next row's feature when the head drafts on from this one.
    pub carry: Vec<f32>,
}

/// A row's attention inputs: its query (every head, RoPE applied), key and value (RoPE applied
/// to the key) and the residual its attention output is added to.
#[derive(Debug, Clone)]
pub struct Projected {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub residual: Vec<f32>,
}

impl Eagle3Head {
    /// Values of one position's key (or value): `n_kv_heads × head_dim`.
    pub fn kv_width(&self) -> usize {
        self.config.n_kv_heads * self.config.head_dim
    }

    /// The first half of a row at `position`: the feature through `fc` if it is three captured
    /// states, both inputs normed side by side, then Q, K and V with RoPE.
    pub fn project(&self, embedding: &[f32], feature: &[f32], position: usize) -> Projected {
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
        let normed_g = rms(&g, &self.hidden_norm, c.rms_eps);
        let residual = if c.norm_before_residual {
            normed_g.clone()
        } else {
            g
        };
        let mut a = rms(embedding, &self.input_norm, c.rms_eps);
        a.extend_from_slice(&normed_g);
        let mut q = matvec(&self.wq, &a);
        let mut k = matvec(&self.wk, &a);
        let v = matvec(&self.wv, &a);
        let freqs = RopeFreqs {
            rot_dims: c.head_dim,
            base: c.rope_theta,
            freq_scale: 1.0,
            divisors: None,
        };
        let mut angles = Vec::new();
        rope_angles(position, &freqs, &mut angles);
        rope_apply(&mut q, c.head_dim, RopeMode::Neox, &angles);
        rope_apply(&mut k, c.head_dim, RopeMode::Neox, &angles);
        Projected { q, k, v, residual }
    }

    /// The second half: the attention output through `o_proj` onto the residual, then the MLP;
    /// returns the pre-norm output (the carry).
    pub fn finish(&self, attn: &[f32], residual: &[f32]) -> Vec<f32> {
        let c = &self.config;
        let h1: Vec<f32> = matvec(&self.wo, attn)
            .iter()
            .zip(residual)
            .map(|(o, r)| o + r)
            .collect();
        let n = rms(&h1, &self.post_attention_norm, c.rms_eps);
        let mut gate = matvec(&self.gate, &n);
        gated_mul(Gate::Silu, &mut gate, &matvec(&self.up, &n));
        matvec(&self.down, &gate)
            .iter()
            .zip(&h1)
            .map(|(m, r)| m + r)
            .collect()
    }

    /// Logits over the draft vocabulary from a carry.
    pub fn logits(&self, carry: &[f32]) -> Vec<f32> {
        matvec(&self.lm_head, &rms(carry, &self.norm, self.config.rms_eps))
    }

    /// Attention of `q` (all query heads) over the positions `kv` (each a key and a value of
    /// [`Eagle3Head::kv_width`] values), in order.
    pub fn attend(&self, q: &[f32], kv: &[(&[f32], &[f32])]) -> Vec<f32> {
        let c = &self.config;
        let d = c.head_dim;
        let group = c.n_heads / c.n_kv_heads;
        let scale = 1.0 / (d as f32).sqrt();
        let mut out = vec![0.0; c.n_heads * d];
        let mut p = Vec::with_capacity(kv.len());
        for (hq, o) in out.chunks_exact_mut(d).enumerate() {
            let qh = &q[hq * d..(hq + 1) * d];
            let at = (hq / group) * d;
            p.clear();
            p.extend(kv.iter().map(|(k, _)| dot(qh, &k[at..at + d]) * scale));
            softmax(&mut p);
            for (&p, (_, v)) in p.iter().zip(kv) {
                for (o, &x) in o.iter_mut().zip(&v[at..at + d]) {
                    *o += p * x;
                }
            }
        }
        out
    }
}

fn matvec(m: &Matrix, x: &[f32]) -> Vec<f32> {
    assert_eq!(x.len(), m.cols, "input width");
    m.data.chunks_exact(m.cols).map(|row| dot(row, x)).collect()
}

fn rms(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    rms_norm(x, w, eps, &mut out);
    out
}
