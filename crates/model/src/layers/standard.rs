//! The standard decoder layer of `llama`, `qwen2` and `qwen3`: pre-norm attention
//! (grouped-query; Q/K/V biases for qwen2, RMS norms over each Q and K head for qwen3; RoPE as
//! the architecture pairs it) and a pre-norm SwiGLU feed-forward, each added back to the
//! residual stream.

use super::{BatchRows, KvLayer, Scratch, attend, norm_heads, norm_rows, rope_and_store};
use crate::config::ModelConfig;
use crate::gguf::GgufFile;
use crate::weights::LayerWeights;
use kernels::gemm::{gemm, gemm_many};
use kernels::ops::{add_assign, add_bias, silu_mul};

/// Runs one layer over the batch, updating the residual stream `h` (rows × hidden) in place.
pub(crate) fn layer(
    cfg: &ModelConfig,
    file: &GgufFile,
    lw: &LayerWeights,
    batch: &BatchRows<'_>,
    kv: &mut KvLayer<'_>,
    s: &mut Scratch,
    h: &mut [f32],
) {
    let (m, hd, ffn) = (batch.len(), cfg.hidden, cfg.ffn_hidden);

    norm_rows(h, &lw.attn_norm, cfg.norm_eps, &mut s.normed);
    s.acts.set(&s.normed, m, hd);
    gemm_many(
        &mut [
            (lw.wq.matrix(file), &mut s.q),
            (lw.wk.matrix(file), &mut s.k),
            (lw.wv.matrix(file), &mut s.v),
        ],
        &s.acts,
    );
    if let Some([bq, bk, bv]) = &lw.qkv_bias {
        add_bias(&mut s.q, bq);
        add_bias(&mut s.k, bk);
        add_bias(&mut s.v, bv);
    }
    if let Some([nq, nk]) = &lw.qk_norm {
        norm_heads(&mut s.q, nq, cfg.norm_eps);
        norm_heads(&mut s.k, nk, cfg.norm_eps);
    }
    rope_and_store(batch, cfg, &mut s.q, &mut s.k, &s.v, kv);
    let scale = 1.0 / (cfg.head_dim as f32).sqrt();
    attend(batch, &s.q, kv, scale, &mut s.attn);
    s.acts.set(&s.attn, m, cfg.q_dim());
    gemm(&lw.wo.matrix(file), &s.acts, &mut s.proj);
    add_assign(h, &s.proj);

    norm_rows(h, &lw.ffn_norm, cfg.norm_eps, &mut s.normed);
    s.acts.set(&s.normed, m, hd);
    gemm_many(
        &mut [
            (lw.gate.matrix(file), &mut s.gate),
            (lw.up.matrix(file), &mut s.up),
        ],
        &s.acts,
    );
    silu_mul(&mut s.gate, &s.up);
    s.acts.set(&s.gate, m, ffn);
    gemm(&lw.down.matrix(file), &s.acts, &mut s.proj);
    add_assign(h, &s.proj);
}
