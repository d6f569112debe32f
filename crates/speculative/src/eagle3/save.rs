//! Writing a head in SGLang's layout (`config.json` and `model.safetensors`, the names SpecForge
//! exports), and an untrained head with small random weights (tests; a trainer's start).

use super::{Eagle3Config, Eagle3Error, Eagle3Head, Matrix};
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use std::path::Path;

/// A tensor's shape and values.
type Shaped<'a> = (Vec<usize>, &'a [f32]);

fn m(x: &Matrix) -> Shaped<'_> {
    (vec![x.rows, x.cols], &x.data)
}

fn v(x: &[f32]) -> Shaped<'_> {
    (vec![x.len()], x)
}

/// The float type a head's weights are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDtype {
    F32,
    F16,
}

impl Eagle3Config {
    /// `config.json` for this configuration, as SGLang reads it (the captured layers written as
    /// the ids of the layers whose outputs they are).
    pub fn to_json(&self) -> serde_json::Value {
        let ids: Vec<usize> = self.capture_layers.iter().map(|l| l - 1).collect();
        serde_json::json!({
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "num_hidden_layers": 1,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab,
            "draft_vocab_size": self.draft_vocab,
            "target_hidden_size": self.target_hidden,
            "rms_norm_eps": self.rms_eps,
            "rope_theta": self.rope_theta,
            "norm_before_residual": self.norm_before_residual,
            "tie_word_embeddings": false,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids},
        })
    }
}

impl Eagle3Head {
    /// An untrained head: weights uniform in ±1/√(fan-in), norms 1, draft token `i` mapped to
    /// `draft_to_target[i]`.
    pub fn random(config: Eagle3Config, draft_to_target: Vec<u32>, seed: u64) -> Self {
        let mut state = seed ^ 0x2545_f491_4f6c_dd1d;
        let mut m = |rows: usize, cols: usize| {
            let bound = 1.0 / (cols as f32).sqrt();
            let data = (0..rows * cols)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * bound
                })
                .collect();
            Matrix { rows, cols, data }
        };
        let c = &config;
        let (h, q, kv) = (c.hidden, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
        Self {
            fc: m(h, 3 * c.target_hidden),
            input_norm: vec![1.0; h],
            hidden_norm: vec![1.0; h],
            wq: m(q, 2 * h),
            wk: m(kv, 2 * h),
            wv: m(kv, 2 * h),
            wo: m(h, q),
            post_attention_norm: vec![1.0; h],
            gate: m(c.intermediate, h),
            up: m(c.intermediate, h),
            down: m(h, c.intermediate),
            norm: vec![1.0; h],
            lm_head: m(c.draft_vocab, h),
            draft_to_target,
            embed: None,
            config,
        }
    }

    /// Writes the head into `dir` (created if missing) in SGLang's layout.
    pub fn save(&self, dir: &Path, dtype: WeightDtype) -> Result<(), Eagle3Error> {
        let io = |e: std::io::Error| Eagle3Error::Io {
            path: dir.display().to_string(),
            message: e.to_string(),
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let text = serde_json::to_string_pretty(&self.config.to_json()).expect("plain JSON");
        std::fs::write(dir.join("config.json"), text).map_err(io)?;
        let d2t: Vec<u8> = self
            .draft_to_target
            .iter()
            .enumerate()
            .flat_map(|(i, &t)| (i64::from(t) - i as i64).to_le_bytes())
            .collect();
        let attn = "midlayer.self_attn.";
        let mlp = "midlayer.mlp.";
        let mut tensors: Vec<(String, Shaped<'_>)> = vec![
            ("fc.weight".into(), m(&self.fc)),
            (
                "midlayer.input_layernorm.weight".into(),
                v(&self.input_norm),
            ),
            ("midlayer.hidden_norm.weight".into(), v(&self.hidden_norm)),
            (format!("{attn}q_proj.weight"), m(&self.wq)),
            (format!("{attn}k_proj.weight"), m(&self.wk)),
            (format!("{attn}v_proj.weight"), m(&self.wv)),
            (format!("{attn}o_proj.weight"), m(&self.wo)),
            (
                "midlayer.post_attention_layernorm.weight".into(),
                v(&self.post_attention_norm),
            ),
            (format!("{mlp}gate_proj.weight"), m(&self.gate)),
            (format!("{mlp}up_proj.weight"), m(&self.up)),
            (format!("{mlp}down_proj.weight"), m(&self.down)),
            ("norm.weight".into(), v(&self.norm)),
            ("lm_head.weight".into(), m(&self.lm_head)),
        ];
        if let Some(e) = &self.embed {
            tensors.push(("embed_tokens.weight".into(), m(e)));
        }
        let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
            .into_iter()
            .map(|(name, (shape, values))| {
                let data = match dtype {
                    WeightDtype::F32 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    WeightDtype::F16 => values
                        .iter()
                        .flat_map(|&x| kernels::attention::f16::from_f32(x).to_le_bytes())
                        .collect(),
                };
                (name, shape, data)
            })
            .collect();
        let dt = match dtype {
            WeightDtype::F32 => Dtype::F32,
            WeightDtype::F16 => Dtype::F16,
        };
        let mut views: Vec<(String, TensorView<'_>)> = bytes
            .iter()
            .map(|(name, shape, data)| {
                let view = TensorView::new(dt, shape.clone(), data).expect("sized to its shape");
                (name.clone(), view)
            })
            .collect();
        let n = self.draft_to_target.len();
        views.push((
            "d2t".into(),
            TensorView::new(Dtype::I64, vec![n], &d2t).expect("sized to its shape"),
        ));
        safetensors::serialize_to_file(views, None, &dir.join("model.safetensors"))
            .map_err(|e| Eagle3Error::Weights(e.to_string()))
    }
}
