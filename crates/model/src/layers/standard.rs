//! The standard decoder layer of `llama`, `qwen2` and `qwen3`: pre-norm attention
//! (grouped-query; Q/K/V biases for qwen2, RMS norms over each Q and K head for qwen3; RoPE as
//! the architecture pairs it) and a pre-norm SwiGLU feed-forward, each added back to the
//! residual stream.

use super::{BatchRows, KvLayer, Layer, Scratch, attention, feed_forward};
use kernels::ops::add_assign;

/// Runs `layer` over the batch, updating the residual stream `h` (rows × hidden) in place.
pub(crate) fn layer(
    layer: &Layer<'_>,
    batch: &BatchRows<'_>,
    kv: &mut KvLayer<'_>,
    s: &mut Scratch,
    h: &mut [f32],
) {
    attention(layer, batch, kv, s, h);
    add_assign(h, &s.proj);
    feed_forward(layer, s, h);
    add_assign(h, &s.proj);
}
