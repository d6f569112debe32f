//! The `gemma3` decoder layer: pre-norm attention (Q/K head norms, RoPE with the local or global
//! base, the sliding window on local layers) and a pre-norm GeGLU feed-forward, each normed
//! again (`post_attention_norm`, `post_ffw_norm`) before it is added to the residual stream.
//! Gemma's norm weights already hold the `1 +` of its `x · (1 + w)` (the converter adds it).

use super::{BatchRows, KvLayer, Scratch, attention, feed_forward, norm_rows};
use crate::config::ModelConfig;
use crate::gguf::GgufFile;
use crate::weights::LayerWeights;
use kernels::ops::add_assign;

/// Runs layer `layer` over the batch, updating the residual stream `h` (rows × hidden) in place.
#[allow(clippy::too_many_arguments)]
pub(crate) fn layer(
    cfg: &ModelConfig,
    file: &GgufFile,
    lw: &LayerWeights,
    layer: usize,
    batch: &BatchRows<'_>,
    kv: &mut KvLayer<'_>,
    s: &mut Scratch,
    h: &mut [f32],
) {
    let [post_attn, post_ffn] = lw
        .post_norms
        .as_ref()
        .expect("gemma3 layers load their post norms");
    attention(cfg, file, lw, layer, batch, kv, s, h);
    norm_rows(&s.proj, post_attn, cfg.norm_eps, &mut s.normed);
    add_assign(h, &s.normed);
    feed_forward(cfg, file, lw, s, h);
    norm_rows(&s.proj, post_ffn, cfg.norm_eps, &mut s.normed);
    add_assign(h, &s.normed);
}
