//! The standard decoder layer of `llama`, `qwen2` and `qwen3`: pre-norm attention
//! (grouped-query; Q/K/V biases for qwen2, RMS norms over each Q and K head for qwen3; RoPE as
//! the architecture pairs it) and a pre-norm SwiGLU feed-forward, each added back to the
//! residual stream.

use super::{BatchRows, KvLayer, Scratch, attention, feed_forward};
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
    attention(cfg, file, lw, layer, batch, kv, s, h);
    add_assign(h, &s.proj);
    feed_forward(cfg, file, lw, s, h);
    add_assign(h, &s.proj);
}
