//! Workloads: which prompts are sent, and when (the arrival schedule).

mod arrivals;
mod code;
mod edit;
mod file;
mod plan;
mod random;
mod rewrite;
mod shared_prefix;
mod synthetic;

pub use arrivals::poisson_offsets;
pub use file::{
    Exchange, LoadNote, load_exchanges, load_file, parse_jsonl, parse_sharegpt,
    parse_sharegpt_exchanges,
};
pub use plan::PromptPlan;

use crate::config::DatasetSpec;
use protocol::ChatMessage;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The I/O error is part of the message (not a `source`, which would print it twice).
    #[error("cannot read dataset {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("dataset {path}, line {line}: {message}")]
    BadLine {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("dataset {path}: {message}")]
    BadFile { path: PathBuf, message: String },
    #[error("dataset {0}: no usable prompts")]
    Empty(String),
    #[error("the `sharegpt` dataset must be resolved to a file before loading")]
    Unresolved,
}

/// One prompt: plain text (sent as a single user message to the chat endpoint) or a conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Messages(Vec<ChatMessage>),
}

impl Prompt {
    /// The messages for the chat endpoint.
    pub fn messages(&self) -> Vec<ChatMessage> {
        match self {
            Prompt::Text(t) => vec![ChatMessage::user(t.clone())],
            Prompt::Messages(m) => m.clone(),
        }
    }

    /// The text for the completions endpoint: the prompt, or the last user message.
    pub fn text(&self) -> String {
        match self {
            Prompt::Text(t) => t.clone(),
            Prompt::Messages(m) => m
                .iter()
                .rev()
                .find(|m| m.role == "user")
                .or(m.last())
                .map(ChatMessage::text)
                .unwrap_or_default(),
        }
    }
}

/// The prompts of a run, in the (seeded) order requests take them.
#[derive(Debug, Clone)]
pub struct Dataset {
    pub name: String,
    pub prompts: Vec<Prompt>,
    /// Things worth telling the user once (skipped lines, a truncated file).
    pub notes: Vec<String>,
}

impl Dataset {
    /// Loads the dataset in its seeded order (fixed sets shuffled with `seed`, generated ones
    /// made from it). `min_prompts` sizes generated sets.
    pub fn load(spec: &DatasetSpec, seed: u64, min_prompts: usize) -> Result<Self, WorkloadError> {
        let (name, mut prompts, notes) = match spec {
            DatasetSpec::Synthetic => ("synthetic".to_string(), synthetic::prompts(), Vec::new()),
            DatasetSpec::Rewrite => ("rewrite".to_string(), rewrite::prompts(), Vec::new()),
            DatasetSpec::Code => ("code".to_string(), code::prompts(), Vec::new()),
            DatasetSpec::Edit => ("edit".to_string(), edit::prompts(), Vec::new()),
            DatasetSpec::Random { input_tokens } => (
                format!("random:{input_tokens}"),
                random::prompts(*input_tokens, min_prompts.max(1), seed),
                Vec::new(),
            ),
            DatasetSpec::SharedPrefix {
                prefix_tokens,
                groups,
            } => (
                format!("shared-prefix:{prefix_tokens}:{groups}"),
                shared_prefix::prompts(*prefix_tokens, *groups, min_prompts.max(1), seed),
                Vec::new(),
            ),
            DatasetSpec::ShareGpt => return Err(WorkloadError::Unresolved),
            DatasetSpec::File(path) => {
                let (prompts, notes) = load_file(path)?;
                (path.display().to_string(), prompts, notes)
            }
        };
        if prompts.is_empty() {
            return Err(WorkloadError::Empty(name));
        }
        // Generated sets are random already, and prompt i is the same however many are made, so
        // levels keep their prompts whatever the sweep's size; fixed sets get the seeded order.
        let generated = matches!(
            spec,
            DatasetSpec::Random { .. } | DatasetSpec::SharedPrefix { .. }
        );
        if !generated {
            prompts.shuffle(&mut StdRng::seed_from_u64(seed));
        }
        Ok(Self {
            name,
            prompts,
            notes,
        })
    }

    /// A short digest of the prompts at these positions, in order (the first 16 hex digits of
    /// a SHA-256 over their messages).
    pub fn digest(&self, positions: impl Iterator<Item = usize>) -> String {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        for p in positions {
            let messages =
                serde_json::to_vec(&self.prompt(p).messages()).expect("messages serialise");
            hash.update((messages.len() as u64).to_le_bytes());
            hash.update(&messages);
        }
        hash.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The prompt at a position of the seeded order, which wraps round (see [`PromptPlan`]).
    pub fn prompt(&self, position: usize) -> &Prompt {
        &self.prompts[position % self.prompts.len()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_is_large_and_varied() {
        let d = Dataset::load(&DatasetSpec::Synthetic, 1, 0).unwrap();
        assert!(d.prompts.len() >= 100, "{} prompts", d.prompts.len());
        let mut lens: Vec<usize> = d.prompts.iter().map(|p| p.text().len()).collect();
        lens.sort();
        assert!(
            lens[lens.len() - 1] > 8 * lens[0],
            "lengths should vary a lot"
        );
    }

    #[test]
    fn rewrite_prompts_carry_the_text_to_repeat() {
        let d = Dataset::load(&DatasetSpec::Rewrite, 1, 0).unwrap();
        assert_eq!(d.prompts.len(), 36);
        // Long enough that a copy fills most of a 200-token answer (prose is about 4 characters
        // a token, code 2–3).
        assert!(d.prompts.iter().all(|p| p.text().len() > 500));
    }

    #[test]
    fn code_requests_are_many_and_most_carry_code() {
        let d = Dataset::load(&DatasetSpec::Code, 1, 0).unwrap();
        assert!(d.prompts.len() >= 100, "{} prompts", d.prompts.len());
        let with_code = d
            .prompts
            .iter()
            .filter(|p| p.text().contains("```"))
            .count();
        assert!(2 * with_code > d.prompts.len(), "{with_code} carry code");
    }

    #[test]
    fn seed_fixes_the_order() {
        let a = Dataset::load(&DatasetSpec::Synthetic, 7, 0).unwrap();
        let b = Dataset::load(&DatasetSpec::Synthetic, 7, 0).unwrap();
        let c = Dataset::load(&DatasetSpec::Synthetic, 8, 0).unwrap();
        assert_eq!(a.prompts, b.prompts);
        assert_ne!(a.prompts, c.prompts);
    }

    #[test]
    fn generated_prompts_do_not_depend_on_how_many_are_made() {
        for spec in [
            DatasetSpec::Random { input_tokens: 16 },
            DatasetSpec::SharedPrefix {
                prefix_tokens: 20,
                groups: 3,
            },
        ] {
            let few = Dataset::load(&spec, 5, 10).unwrap();
            let many = Dataset::load(&spec, 5, 100).unwrap();
            assert_eq!(few.prompts[..], many.prompts[..10], "{spec:?}");
            let other = Dataset::load(&spec, 6, 10).unwrap();
            assert_ne!(few.prompts, other.prompts, "{spec:?}: the seed matters");
        }
    }

    #[test]
    fn random_makes_enough_prompts() {
        let d = Dataset::load(&DatasetSpec::Random { input_tokens: 64 }, 1, 40).unwrap();
        assert_eq!(d.prompts.len(), 40);
        assert_eq!(d.prompt(41), &d.prompts[1]);
    }

    #[test]
    fn completions_text_of_a_conversation_is_the_last_user_turn() {
        let p = Prompt::Messages(vec![
            ChatMessage::user("first"),
            ChatMessage {
                role: "assistant".into(),
                content: Some("reply".into()),
                extra: Default::default(),
            },
            ChatMessage::user("second"),
        ]);
        assert_eq!(p.text(), "second");
        assert_eq!(p.messages().len(), 3);
    }
}
