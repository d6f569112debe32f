//! Structured outputs: a request's JSON schema, `json_object`, regex or grammar is compiled by
//! llguidance over the model's vocabulary into a [`Grammar`], one per sequence, which masks the
//! logits of each position to the tokens that keep the output inside the language (the sampler
//! calls it through `model::sampler::TokenConstraint`).
//!
//! [`Grammars`] is made once per model: it holds llguidance's token trie and a cache of compiled
//! grammars (keyed by the request's spec), so a schema sent again is not compiled again. Every
//! compilation and every mask is bounded by llguidance's limits; a grammar past them is an error
//! naming the problem, never a hang.

mod compile;
mod constraint;
mod ebnf;
mod spec;
mod tools;
mod vocab;

#[cfg(test)]
mod tests;

pub use compile::{CACHED_GRAMMARS, Grammars};
pub use constraint::Grammar;
pub use ebnf::ebnf_to_lark;
pub use spec::{GrammarSpec, JSON_MAX_WHITESPACE};
pub use tools::{BareCalls, CallShape, OptionalCalls, StructuralTag, TaggedStructure};

/// llguidance's verbose errors carry its state and the grammar after the reason: the reason is
/// enough.
pub(crate) fn first_line(message: &str) -> String {
    message.lines().next().unwrap_or(message).trim().to_string()
}

/// Why a grammar cannot be used: the request's fault (a 400), with llguidance's reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    #[error("{0}")]
    Invalid(String),
    #[error("the model's vocabulary cannot be used for grammars: {0}")]
    Vocabulary(String),
}
