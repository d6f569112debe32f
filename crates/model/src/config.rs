//! Model hyper-parameters, read from GGUF metadata (`{arch}.*` keys).

use crate::ModelError;
use crate::gguf::GgufFile;

/// Architectures whose layer code exists. Others are refused at load with their name.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &["llama"];

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: String,
    pub n_layers: usize,
    pub hidden: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Dimensions of each head that RoPE rotates.
    pub rope_dims: usize,
    pub ffn_hidden: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rope_base: f32,
    pub norm_eps: f32,
}

impl ModelConfig {
    pub fn from_gguf(file: &GgufFile) -> Result<Self, ModelError> {
        let arch = file.architecture()?.to_string();
        if !SUPPORTED_ARCHITECTURES.contains(&arch.as_str()) {
            return Err(ModelError::UnsupportedArchitecture(arch));
        }
        let key = |k: &str| format!("{arch}.{k}");
        let n = |k: &str| file.get_u32(&key(k)).map(|v| v as usize);
        let hidden = n("embedding_length")?;
        let n_heads = n("attention.head_count")?;
        let n_kv_heads = n("attention.head_count_kv").unwrap_or(n_heads);
        if hidden == 0
            || n_heads == 0
            || hidden % n_heads != 0
            || n_kv_heads == 0
            || n_heads % n_kv_heads != 0
        {
            return Err(ModelError::BadConfig(format!(
                "{n_heads} heads, {n_kv_heads} KV heads and hidden size {hidden} do not fit together"
            )));
        }
        let head_dim = hidden / n_heads;
        let rope_dims = n("rope.dimension_count").unwrap_or(head_dim);
        if rope_dims > head_dim || rope_dims % 2 != 0 {
            return Err(ModelError::BadConfig(format!(
                "RoPE over {rope_dims} of {head_dim} dimensions"
            )));
        }
        let vocab_size = match n("vocab_size") {
            Ok(v) => v,
            Err(_) => file.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let ffn_hidden = n("feed_forward_length")?;
        let context_length = n("context_length")?;
        if hidden % 32 != 0
            || ffn_hidden == 0
            || ffn_hidden % 32 != 0
            || vocab_size == 0
            || context_length == 0
        {
            return Err(ModelError::BadConfig(format!(
                "hidden size {hidden} and feed-forward size {ffn_hidden} must be positive multiples of 32, and vocabulary ({vocab_size}) and context ({context_length}) not empty"
            )));
        }
        Ok(Self {
            n_layers: n("block_count")?,
            hidden,
            n_heads,
            n_kv_heads,
            head_dim,
            rope_dims,
            ffn_hidden,
            vocab_size,
            context_length,
            rope_base: file.get_f32(&key("rope.freq_base")).unwrap_or(10_000.0),
            norm_eps: file.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            architecture: arch,
        })
    }

    /// Floats of one token's keys (or values) in one layer.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}
