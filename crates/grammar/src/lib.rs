//! Structured outputs: a request's JSON schema, `json_object`, regex or grammar is compiled by
//! llguidance over the model's vocabulary into a [`Grammar`], one per sequence, which masks the
//! logits of each position to the tokens that keep the output inside the language (the sampler
//! calls it through `model::sampler::TokenConstraint`).
//!
//! [`Grammars`] is made once per model: it holds llguidance's token trie and a cache of compiled
//! grammars (keyed by the request's spec, bounded in bytes), so a schema sent again is not
//! compiled again. A client's spec is first held to [`GrammarLimits`] (its size and shape, by
//! iterative code), then compiled on a small pool of threads with a large stack, under a
//! deadline and `catch_unwind`; every compilation and every mask is bounded by llguidance's
//! limits, set with ours. A spec past any of them is an error naming the limit, never a crash
//! or a hang.

mod cache;
mod compile;
mod constraint;
mod depth;
mod ebnf;
mod expand;
#[cfg(test)]
mod fuzz_tests;
mod lark;
mod limits;
mod pool;
mod scan;
mod schema_pass;
mod spec;
mod tools;
mod vocab;
mod width;

#[cfg(test)]
mod attack_tests;
#[cfg(test)]
mod tests;

pub use cache::{BYTES_PER_SPEC_BYTE, GRAMMAR_BASE_BYTES, estimated_bytes};
pub use compile::{CACHED_GRAMMARS, GrammarConfig, Grammars};
pub use constraint::Grammar;
pub use ebnf::ebnf_to_lark;
pub use limits::*;
pub use schema_pass::{close_objects, unique_items_paths};
pub use spec::{GrammarSpec, JSON_MAX_WHITESPACE};
pub use tools::{BareCalls, CallShape, OptionalCalls, StructuralTag, TaggedStructure};

/// llguidance's verbose errors carry its state and the grammar after the reason: the reason is
/// enough.
pub(crate) fn first_line(message: &str) -> String {
    message.lines().next().unwrap_or(message).trim().to_string()
}

/// Why a grammar cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The spec is invalid or unsupported (the request's fault), with llguidance's reason.
    #[error("{0}")]
    Invalid(String),
    /// The spec is past one of the [`GrammarLimits`] (the request's fault).
    #[error("{what}: {got}, over the limit of {limit}")]
    Limit {
        what: &'static str,
        limit: usize,
        got: usize,
    },
    /// The compilation ran past the deadline ([`GrammarConfig::deadline`]): the spec is too
    /// costly (the request's fault).
    #[error("the grammar took longer than the compile deadline of {}s to compile", .0.as_secs_f64())]
    Deadline(std::time::Duration),
    /// The compiler panicked on this spec (llguidance's fault, on the request's input).
    #[error("the grammar cannot be compiled: {0}")]
    Panicked(String),
    /// All compile threads are busy and the queue of this many is full, or the compilation did
    /// not start within the deadline: try again later.
    #[error("the grammar compiler is busy ({0} compilations queued): try again shortly")]
    Overloaded(usize),
    /// The model's vocabulary cannot be used for grammars (the model's fault).
    #[error("the model's vocabulary cannot be used for grammars: {0}")]
    Vocabulary(String),
    /// The compile threads cannot be started or have gone (the server's fault).
    #[error("grammars cannot be compiled: {0}")]
    Unavailable(String),
}
