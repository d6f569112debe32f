//! The head's forward pass one row at a time over a plain per-sequence cache, built from the
//! same pieces as the batched one (`forward.rs`): what the float64 NumPy test checks the head's
//! arithmetic with. Not on the serving path, which runs rows batched over paged KV
//! (`batched.rs`).

use super::{Eagle3Head, HeadOutput};

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

impl Eagle3Head {
    /// Runs one row at position `cache.len()`: the token's `embedding` (`hidden` values) and
    /// its `feature` (`3 × target_hidden` captured states, or `hidden` values from
    /// [`HeadOutput::carry`]).
    pub fn step(&self, cache: &mut HeadCache, embedding: &[f32], feature: &[f32]) -> HeadOutput {
        let p = self.project(embedding, feature, cache.len(self));
        cache.keys.extend_from_slice(&p.k);
        cache.values.extend_from_slice(&p.v);
        let kvw = self.kv_width();
        let kv: Vec<(&[f32], &[f32])> = cache
            .keys
            .chunks_exact(kvw)
            .zip(cache.values.chunks_exact(kvw))
            .collect();
        let attn = self.attend(&p.q, &kv);
        let carry = self.finish(&attn, &p.residual);
        HeadOutput {
            logits: self.logits(&carry),
            carry,
        }
    }
}
