//! EAGLE-3 heads built into the binary, each found for its target by the target's shape and a
//! digest of its vocabulary (so any quantisation of the same model gets it): what
//! `--speculative-algorithm EAGLE3` uses when no `--speculative-draft-model-path` is given.

use anyhow::Context;
use model::{Model, ModelConfig};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use speculative::eagle3::{Eagle3Config, Eagle3Head, TargetShape};

/// A head in SGLang's layout and the target it was trained for.
struct Shipped {
    name: &'static str,
    config: &'static str,
    weights: &'static [u8],
    target: &'static str,
}

/// The heads shipped (`heads/`, trained with `specula train-draft`; the recipe is in docs/training.md).
const SHIPPED: &[Shipped] = &[Shipped {
    name: "smollm2-135m-instruct",
    config: include_str!("../../../heads/smollm2-135m-instruct/config.json"),
    weights: include_bytes!("../../../heads/smollm2-135m-instruct/model.safetensors"),
    target: include_str!("../../../heads/smollm2-135m-instruct/target.json"),
}];

/// What identifies a head's target.
#[derive(Deserialize)]
struct Target {
    architecture: String,
    layers: usize,
    hidden: usize,
    vocab: usize,
    tokens_sha256: String,
}

/// The SHA-256 of the model's tokens joined by newlines, in hex.
fn tokens_digest(model: &Model) -> anyhow::Result<String> {
    let tokens = model.file.get_str_array("tokenizer.ggml.tokens")?;
    let digest = Sha256::digest(tokens.join("\n").as_bytes());
    Ok(digest.iter().map(|b| format!("{b:02x}")).collect())
}

/// The shape a head for a model of `config` must have.
pub fn target_shape(config: &ModelConfig) -> TargetShape {
    TargetShape {
        n_layers: config.n_layers,
        hidden: config.hidden,
        vocab: config.vocab_size,
    }
}

/// The shipped head for `model`, with its name, if one fits it.
pub fn shipped_for(model: &Model) -> anyhow::Result<Option<(&'static str, Eagle3Head)>> {
    let c = &model.config;
    let digest = tokens_digest(model)?;
    for s in SHIPPED {
        let t: Target = serde_json::from_str(s.target).context("a shipped head's target.json")?;
        let fits = t.architecture == c.arch.name()
            && (t.layers, t.hidden, t.vocab) == (c.n_layers, c.hidden, c.vocab_size)
            && t.tokens_sha256 == digest;
        if !fits {
            continue;
        }
        let config = Eagle3Config::parse(s.config, target_shape(c))?;
        let head = Eagle3Head::from_parts(config, &[(s.name.to_string(), s.weights)])?;
        return Ok(Some((s.name, head)));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_head_parses_and_names_a_target() {
        for s in SHIPPED {
            let t: Target = serde_json::from_str(s.target).unwrap();
            let shape = TargetShape {
                n_layers: t.layers,
                hidden: t.hidden,
                vocab: t.vocab,
            };
            let config = Eagle3Config::parse(s.config, shape).unwrap();
            let head = Eagle3Head::from_parts(config, &[(s.name.into(), s.weights)]).unwrap();
            assert_eq!(head.config.target_hidden, t.hidden, "{}", s.name);
            assert_eq!(t.tokens_sha256.len(), 64);
        }
    }
}
