//! The `gemma3` decoder layer: pre-norm attention (Q/K head norms, RoPE with the local or global
//! base, the sliding window on local layers) and a pre-norm GeGLU feed-forward, each normed
//! again (`post_attention_norm`, `post_ffw_norm`) before it is added to the residual stream.
//! Gemma's norm weights already hold the `1 +` of its `x · (1 + w)` (the converter adds it).

use super::{BatchRows, KvLayer, Layer, Scratch, attention, feed_forward, norm_rows};
use kernels::ops::add_assign;

/// Runs `layer` over the batch, updating the residual stream `h` (rows × hidden) in place.
pub(crate) fn layer(
    layer: &Layer<'_>,
    batch: &BatchRows<'_>,
    kv: &mut KvLayer<'_>,
    s: &mut Scratch,
    h: &mut [f32],
) {
    let [post_attn, post_ffn] = layer
        .weights
        .post_norms
        .as_ref()
        .expect("gemma3 layers load their post norms");
    let eps = layer.cfg.norm_eps;
    attention(layer, batch, kv, s, h);
    norm_rows(&s.proj, post_attn, eps, &mut s.normed);
    add_assign(h, &s.normed);
    feed_forward(layer, s, h);
    norm_rows(&s.proj, post_ffn, eps, &mut s.normed);
    add_assign(h, &s.normed);
}
