//! Model hyper-parameters, read from GGUF metadata (`{arch}.*` keys).

use crate::ModelError;
use crate::gguf::GgufFile;
pub use kernels::ops::{Gate, RopeMode};

/// Gemma 3's local layers: all but every sixth (llama.cpp's `set_swa_pattern(6)`; no GGUF key).
const GEMMA3_GLOBAL_EVERY: usize = 6;
/// Gemma 3's local layers' RoPE base (hard-coded by llama.cpp and Hugging Face alike).
const GEMMA3_LOCAL_ROPE_BASE: f32 = 10_000.0;

/// The architectures whose layers exist (`general.architecture`). Others are refused at load
/// with their name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 1–3, SmolLM2, Mistral-style: no biases, RoPE on adjacent pairs.
    Llama,
    /// Qwen2 and Qwen2.5: biases on Q, K and V; NEOX RoPE.
    Qwen2,
    /// Qwen3: RMS norms over each query and key head before RoPE; no biases; NEOX RoPE.
    Qwen3,
    /// Gemma 3: embeddings scaled by √hidden, Q/K head norms, norms after attention and the
    /// feed-forward too, GeGLU, local layers with a sliding window and their own RoPE base.
    Gemma3,
}

impl Arch {
    const ALL: [Arch; 4] = [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3];

    /// The name GGUF files give it.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Which dimensions RoPE rotates together (as llama.cpp's `llama_model_rope_type`).
    pub fn rope_mode(self) -> RopeMode {
        match self {
            Arch::Llama => RopeMode::Normal,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 => RopeMode::Neox,
        }
    }
}

/// Names of every supported architecture, for messages.
pub fn supported_architectures() -> Vec<&'static str> {
    Arch::ALL.iter().map(|a| a.name()).collect()
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layers: usize,
    pub hidden: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Dimensions of each head that RoPE rotates.
    pub rope_dims: usize,
    pub rope_mode: RopeMode,
    pub ffn_hidden: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rope_base: f32,
    /// Multiplies every RoPE angle: 1/`rope.scaling.factor` for linear scaling, else 1 (on a
    /// model with local layers, the global layers' only).
    pub rope_freq_scale: f32,
    pub norm_eps: f32,
    /// Multiplies the attention scores: 1/√head_dim.
    pub attn_scale: f32,
    /// Multiplies the token embeddings (Gemma: √hidden).
    pub embed_scale: Option<f32>,
    /// The feed-forward gate's activation.
    pub gate: Gate,
    /// Local layers attend to this many positions (their own included); `None`: every layer
    /// is global.
    pub sliding_window: Option<usize>,
    /// Every this many layers one is global (the last of each period); the others are local.
    pub global_every: usize,
    /// The local layers' RoPE base (their angles are not scaled).
    pub rope_base_local: f32,
    /// Final logits become `c · tanh(logits / c)` (Gemma 3 without a sliding window).
    pub final_logit_softcap: Option<f32>,
}

impl ModelConfig {
    pub fn from_gguf(file: &GgufFile) -> Result<Self, ModelError> {
        let name = file.architecture()?.to_string();
        let arch = Arch::from_name(&name).ok_or(ModelError::UnsupportedArchitecture(name))?;
        let key = |k: &str| format!("{}.{k}", arch.name());
        let n = |k: &str| file.get_u32(&key(k)).map(|v| v as usize);
        let hidden = n("embedding_length")?;
        let n_heads = n("attention.head_count")?;
        let n_kv_heads = n("attention.head_count_kv").unwrap_or(n_heads);
        if hidden == 0 || n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(ModelError::BadConfig(format!(
                "{n_heads} heads, {n_kv_heads} KV heads and hidden size {hidden} do not fit together"
            )));
        }
        let head_dim = match n("attention.key_length") {
            Ok(d) => d,
            Err(_) if hidden % n_heads == 0 => hidden / n_heads,
            Err(_) => {
                return Err(ModelError::BadConfig(format!(
                    "hidden size {hidden} is not a multiple of its {n_heads} heads and `{}` is missing",
                    key("attention.key_length")
                )));
            }
        };
        if n("attention.value_length").is_ok_and(|v| v != head_dim) || head_dim == 0 {
            return Err(ModelError::BadConfig(format!(
                "key and value heads must have the same non-zero size (key length {head_dim})"
            )));
        }
        let rope_dims = n("rope.dimension_count").unwrap_or(head_dim);
        // llama.cpp asserts full rotation for these architectures too.
        if rope_dims != head_dim {
            return Err(ModelError::BadConfig(format!(
                "RoPE over {rope_dims} of {head_dim} dimensions (a {} model rotates all of them)",
                arch.name()
            )));
        }
        let vocab_size = match n("vocab_size") {
            Ok(v) => v,
            Err(_) => file.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let ffn_hidden = n("feed_forward_length")?;
        let context_length = n("context_length")?;
        let q_width = n_heads * head_dim;
        if hidden % 32 != 0
            || q_width % 32 != 0
            || head_dim % 2 != 0
            || ffn_hidden == 0
            || ffn_hidden % 32 != 0
            || vocab_size == 0
            || context_length == 0
        {
            return Err(ModelError::BadConfig(format!(
                "hidden size {hidden}, attention width {q_width} and feed-forward size {ffn_hidden} must be positive multiples of 32, and vocabulary ({vocab_size}) and context ({context_length}) not empty"
            )));
        }
        let gemma = arch == Arch::Gemma3;
        let sliding_window = match n("attention.sliding_window") {
            Ok(w) if gemma && w > 0 => Some(w),
            _ => None,
        };
        // llama.cpp caps the final logits only in the variant without a sliding window.
        let final_logit_softcap = file
            .get_f32(&key("final_logit_softcapping"))
            .ok()
            .filter(|&c| gemma && sliding_window.is_none() && c > 0.0);
        Ok(Self {
            n_layers: n("block_count")?,
            hidden,
            n_heads,
            n_kv_heads,
            head_dim,
            rope_dims,
            rope_mode: arch.rope_mode(),
            ffn_hidden,
            vocab_size,
            context_length,
            rope_base: file.get_f32(&key("rope.freq_base")).unwrap_or(10_000.0),
            rope_freq_scale: rope_freq_scale(file, &key)?,
            norm_eps: file.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            attn_scale: attention_scale(arch, n("block_count")?, hidden, n_heads, head_dim),
            embed_scale: gemma.then(|| (hidden as f32).sqrt()),
            gate: if gemma { Gate::GeluTanh } else { Gate::Silu },
            sliding_window,
            global_every: GEMMA3_GLOBAL_EVERY,
            rope_base_local: GEMMA3_LOCAL_ROPE_BASE,
            final_logit_softcap,
            arch,
        })
    }

    /// Floats of one token's keys (or values) in one layer.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Whether layer `layer` attends through the sliding window (with the local RoPE base).
    pub fn is_local(&self, layer: usize) -> bool {
        self.sliding_window.is_some() && layer % self.global_every != self.global_every - 1
    }

    /// Floats of one token's queries (and of the attention's output) in one layer.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
}

impl std::fmt::Display for ModelConfig {
    /// One line a person reads: `specula model info` prints it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "architecture: {}, {} layers, hidden {}, {} heads ({} KV) of {}, feed-forward {} ({:?}), \
             vocabulary {}, context {}, RoPE {:?} base {}",
            self.arch.name(),
            self.n_layers,
            self.hidden,
            self.n_heads,
            self.n_kv_heads,
            self.head_dim,
            self.ffn_hidden,
            self.gate,
            self.vocab_size,
            self.context_length,
            self.rope_mode,
            self.rope_base,
        )?;
        if self.rope_freq_scale != 1.0 {
            write!(f, " scaled ×{}", self.rope_freq_scale)?;
        }
        if let Some(w) = self.sliding_window {
            write!(
                f,
                ", sliding window {w} on all but every {}th layer (RoPE base {} there)",
                self.global_every, self.rope_base_local
            )?;
        }
        Ok(())
    }
}

/// 1/√head_dim, but for Gemma 3 27B (62 layers), which llama.cpp scales by 1/√(hidden/heads)
/// (Hugging Face's `query_pre_attn_scalar`; no GGUF key holds it).
fn attention_scale(arch: Arch, layers: usize, hidden: usize, heads: usize, head_dim: usize) -> f32 {
    let d = if arch == Arch::Gemma3 && layers == 62 {
        hidden / heads
    } else {
        head_dim
    };
    1.0 / (d as f32).sqrt()
}

/// The RoPE angle multiplier from `rope.scaling.*`: linear scaling (and none) are exact;
/// YaRN and LongRoPE change the attention too and are refused by name. (Llama 3's scaling is
/// not a key: converters store it as the `rope_freqs.weight` tensor, read with the weights.)
fn rope_freq_scale(file: &GgufFile, key: &dyn Fn(&str) -> String) -> Result<f32, ModelError> {
    let kind = file
        .get_str(&key("rope.scaling.type"))
        .unwrap_or("linear")
        .to_string();
    let factor = file
        .get_f32(&key("rope.scaling.factor"))
        .or_else(|_| file.get_f32(&key("rope.scale_linear")))
        .unwrap_or(1.0);
    match kind.as_str() {
        "none" => Ok(1.0),
        "linear" if factor == 0.0 || factor == 1.0 => Ok(1.0),
        "linear" if factor.is_finite() && factor > 0.0 => Ok(1.0 / factor),
        "linear" => Err(ModelError::BadConfig(format!(
            "RoPE scaling factor {factor} is not a positive number"
        ))),
        other => Err(ModelError::BadConfig(format!(
            "RoPE scaling `{other}` is not supported (none, linear and Llama 3's are)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::MetaValue;
    use crate::gguf::write::GgufWriter;

    /// A header-only file of architecture `arch` with `extra` metadata (Qwen2.5-0.5B's shape).
    fn config(arch: &str, extra: &[(&str, MetaValue)]) -> Result<ModelConfig, ModelError> {
        let mut w = GgufWriter::new();
        w.meta("general.architecture", MetaValue::String(arch.into()));
        let u = |k: &str, v: u32| (format!("{arch}.{k}"), MetaValue::U32(v));
        for (k, v) in [
            u("block_count", 24),
            u("context_length", 32768),
            u("embedding_length", 896),
            u("feed_forward_length", 4864),
            u("attention.head_count", 14),
            u("attention.head_count_kv", 2),
            u("vocab_size", 151_936),
            (
                format!("{arch}.attention.layer_norm_rms_epsilon"),
                MetaValue::F32(1e-6),
            ),
        ] {
            w.meta(&k, v);
        }
        for (k, v) in extra {
            w.meta(&format!("{arch}.{k}"), v.clone());
        }
        ModelConfig::from_gguf(&GgufFile::from_bytes(w.finish()).unwrap())
    }

    #[test]
    fn each_architecture_has_its_rope_pairing_and_head_size() {
        let c = config("qwen2", &[]).unwrap();
        assert_eq!((c.arch, c.rope_mode), (Arch::Qwen2, RopeMode::Neox));
        assert_eq!((c.head_dim, c.q_dim(), c.kv_dim()), (64, 896, 128));
        assert_eq!(config("llama", &[]).unwrap().rope_mode, RopeMode::Normal);
        // Qwen3 states its head size: the attention is wider than the hidden size.
        let c = config("qwen3", &[("attention.key_length", MetaValue::U32(128))]).unwrap();
        assert_eq!((c.head_dim, c.q_dim(), c.kv_dim()), (128, 1792, 256));
    }

    #[test]
    fn what_is_not_supported_is_refused_by_name() {
        let e = config("mamba", &[]).unwrap_err().to_string();
        assert!(
            e.contains("`mamba`") && e.contains("llama, qwen2, qwen3"),
            "{e}"
        );
        let yarn = ("rope.scaling.type", MetaValue::String("yarn".into()));
        let e = config("qwen2", &[yarn]).unwrap_err().to_string();
        assert!(e.contains("RoPE scaling `yarn` is not supported"), "{e}");
        let e = config("qwen2", &[("rope.dimension_count", MetaValue::U32(32))])
            .unwrap_err()
            .to_string();
        assert!(e.contains("RoPE over 32 of 64 dimensions"), "{e}");
        let e = config("qwen2", &[("attention.value_length", MetaValue::U32(32))])
            .unwrap_err()
            .to_string();
        assert!(e.contains("same non-zero size"), "{e}");
    }

    #[test]
    fn linear_rope_scaling_slows_every_angle() {
        let linear = [
            ("rope.scaling.type", MetaValue::String("linear".into())),
            ("rope.scaling.factor", MetaValue::F32(4.0)),
        ];
        assert_eq!(config("llama", &linear).unwrap().rope_freq_scale, 0.25);
        assert_eq!(config("llama", &[]).unwrap().rope_freq_scale, 1.0);
    }
}
