//! An EAGLE-3 head's `config.json` in SGLang's (and vLLM's, SpecForge's) layout, checked against
//! the target it drafts for.
//!
//! Which target states the head reads: the residual stream entering three target layers (low,
//! middle, high). Without `eagle_config.eagle_aux_hidden_state_layer_ids` that is layers 2, n/2
//! and n − 3 of an n-layer target, as SGLang, vLLM and SpecForge all capture; with the ids, SGLang
//! reads each id as "the output of layer id", the stream entering layer id + 1, and so do we.

use super::Eagle3Error;
use serde_json::Value;

/// Dimensions beyond this are refused before anything is sized by them.
pub(super) const MAX_DIM: usize = 1 << 20;

/// The shapes of the target model a head must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetShape {
    pub n_layers: usize,
    pub hidden: usize,
    pub vocab: usize,
}

/// A head's configuration, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Eagle3Config {
    pub hidden: usize,
    pub intermediate: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// The target's vocabulary.
    pub vocab: usize,
    /// Rows of the head's own output layer (a reduced vocabulary, mapped by `d2t`).
    pub draft_vocab: usize,
    /// Width of each captured target state (the fc input is three of them).
    pub target_hidden: usize,
    /// The target layers whose entering residual streams are captured, low to high.
    pub capture_layers: [usize; 3],
    pub rms_eps: f32,
    pub rope_theta: f32,
    /// vLLM's `norm_before_residual`: the residual is the normed feature, not the raw one.
    pub norm_before_residual: bool,
}

impl Eagle3Config {
    /// Parses `config.json`'s text and checks it against `target`.
    pub fn parse(text: &str, target: TargetShape) -> Result<Self, Eagle3Error> {
        let v: Value =
            serde_json::from_str(text).map_err(|e| Eagle3Error::Config(e.to_string()))?;
        let hidden = dim(&v, "hidden_size")?;
        let n_heads = dim(&v, "num_attention_heads")?;
        let head_dim = match v.get("head_dim") {
            Some(_) => dim(&v, "head_dim")?,
            None if hidden.is_multiple_of(n_heads) => hidden / n_heads,
            None => {
                return Err(config_error(
                    "hidden_size is not a multiple of num_attention_heads",
                ));
            }
        };
        let vocab = dim(&v, "vocab_size")?;
        let cfg = Self {
            hidden,
            intermediate: dim(&v, "intermediate_size")?,
            n_heads,
            n_kv_heads: match v.get("num_key_value_heads") {
                Some(_) => dim(&v, "num_key_value_heads")?,
                None => n_heads,
            },
            head_dim,
            vocab,
            draft_vocab: optional_dim(&v, "draft_vocab_size")?.unwrap_or(vocab),
            target_hidden: optional_dim(&v, "target_hidden_size")?.unwrap_or(hidden),
            capture_layers: capture_layers(&v, target.n_layers)?,
            rms_eps: number(&v, "rms_norm_eps", 1e-6)?,
            rope_theta: number(&v, "rope_theta", 10_000.0)?,
            norm_before_residual: v
                .get("norm_before_residual")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        };
        cfg.check(target)?;
        Ok(cfg)
    }

    pub(super) fn check(&self, target: TargetShape) -> Result<(), Eagle3Error> {
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(config_error(
                "num_attention_heads is not a multiple of num_key_value_heads",
            ));
        }
        if self.draft_vocab > self.vocab {
            return Err(config_error("draft_vocab_size exceeds vocab_size"));
        }
        if self.target_hidden != target.hidden || self.vocab != target.vocab {
            return Err(Eagle3Error::WrongTarget(format!(
                "the head reads states of width {} over a vocabulary of {}, \
                 the target has {} and {}",
                self.target_hidden, self.vocab, target.hidden, target.vocab
            )));
        }
        Ok(())
    }
}

fn config_error(what: &str) -> Eagle3Error {
    Eagle3Error::Config(what.to_string())
}

/// A required positive dimension.
fn dim(v: &Value, key: &str) -> Result<usize, Eagle3Error> {
    optional_dim(v, key)?.ok_or_else(|| Eagle3Error::Config(format!("{key} is missing")))
}

fn optional_dim(v: &Value, key: &str) -> Result<Option<usize>, Eagle3Error> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => match x.as_u64() {
            Some(n) if n > 0 && n as usize <= MAX_DIM => Ok(Some(n as usize)),
            _ => Err(Eagle3Error::Config(format!(
                "{key} must be a whole number from 1 to {MAX_DIM}, not {x}"
            ))),
        },
    }
}

fn number(v: &Value, key: &str, default: f32) -> Result<f32, Eagle3Error> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(x) => match x.as_f64() {
            Some(n) if n.is_finite() && n > 0.0 => Ok(n as f32),
            _ => Err(Eagle3Error::Config(format!(
                "{key} must be a positive number, not {x}"
            ))),
        },
    }
}

/// The layers whose entering streams a head reads by default: 2, n/2 and n − 3 of an n-layer
/// target (SGLang's, vLLM's and SpecForge's choice); `None` under 4 layers.
pub fn default_capture_layers(n_layers: usize) -> Option<[usize; 3]> {
    (n_layers >= 4).then(|| [2, n_layers / 2, n_layers - 3])
}

/// The captured layers: SGLang's reading of the config's ids (each + 1), or its default.
fn capture_layers(v: &Value, n_layers: usize) -> Result<[usize; 3], Eagle3Error> {
    let ids = v
        .get("eagle_config")
        .and_then(|c| c.get("eagle_aux_hidden_state_layer_ids"))
        .or_else(|| v.get("eagle_aux_hidden_state_layer_ids"));
    let layers = match ids {
        None | Some(Value::Null) => default_capture_layers(n_layers).ok_or_else(|| {
            Eagle3Error::WrongTarget(format!(
                "a target of {n_layers} layers has no layers 2, n/2 and n − 3 to read"
            ))
        })?,
        Some(Value::Array(a)) if a.len() == 3 => {
            let mut out = [0; 3];
            for (o, x) in out.iter_mut().zip(a) {
                *o = x
                    .as_u64()
                    .and_then(|id| usize::try_from(id).ok()?.checked_add(1))
                    .filter(|&l| l < n_layers)
                    .ok_or_else(|| {
                        Eagle3Error::WrongTarget(format!(
                            "eagle_aux_hidden_state_layer_ids {x} is not a layer \
                             of a {n_layers}-layer target"
                        ))
                    })?;
            }
            out
        }
        Some(x) => {
            return Err(Eagle3Error::Config(format!(
                "eagle_aux_hidden_state_layer_ids must be three layer ids, not {x}"
            )));
        }
    };
    Ok(layers)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TARGET: TargetShape = TargetShape {
        n_layers: 30,
        hidden: 576,
        vocab: 49152,
    };

    fn config(extra: &str) -> String {
        format!(
            r#"{{"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 576,
            "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
            "vocab_size": 49152, "draft_vocab_size": 8192, "rms_norm_eps": 1e-5{extra}}}"#
        )
    }

    #[test]
    fn a_config_reads_with_sglangs_defaults() {
        let c = Eagle3Config::parse(&config(""), TARGET).unwrap();
        assert_eq!(
            (c.head_dim, c.target_hidden, c.draft_vocab),
            (64, 576, 8192)
        );
        assert_eq!(c.capture_layers, [2, 15, 27]);
        assert_eq!((c.rms_eps, c.rope_theta), (1e-5, 10_000.0));
        assert!(!c.norm_before_residual);
    }

    #[test]
    fn configured_layer_ids_are_read_as_sglang_does() {
        let ids = r#", "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 26]}"#;
        let c = Eagle3Config::parse(&config(ids), TARGET).unwrap();
        assert_eq!(c.capture_layers, [2, 15, 27]);
        let e = Eagle3Config::parse(
            &config(r#", "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 29]}"#),
            TARGET,
        )
        .unwrap_err();
        assert!(e.to_string().contains("29"), "{e}");
    }

    #[test]
    fn a_head_for_another_target_is_one_line_naming_both() {
        let other = TargetShape {
            hidden: 896,
            ..TARGET
        };
        let e = Eagle3Config::parse(&config(""), other)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("576") && e.contains("896") && !e.contains('\n'),
            "{e}"
        );
        let e = Eagle3Config::parse(&config(r#", "target_hidden_size": 896"#), TARGET)
            .unwrap_err()
            .to_string();
        assert!(e.contains("896"), "{e}");
    }

    #[test]
    fn bad_values_are_errors_naming_the_key() {
        for (extra, key) in [
            (r#", "head_dim": 0"#, "head_dim"),
            (r#", "rope_theta": -1"#, "rope_theta"),
            (r#", "draft_vocab_size": 99999999999"#, "draft_vocab_size"),
            (r#", "num_key_value_heads": 2"#, "num_key_value_heads"),
        ] {
            let e = Eagle3Config::parse(&config(extra), TARGET)
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{extra}: {e}");
        }
        assert!(Eagle3Config::parse("{", TARGET).is_err());
    }
}
