//! Speculative decoding as one component ([`Speculator`]): drafters behind one interface
//! ([`Drafter`]) guess a sequence's next tokens cheaply, the policy ([`Budget`]) decides which
//! sequences speculate in a step and how far, and verification turns rows of the target's logits
//! into accepted tokens, keeping the acceptance statistics and the step cost model the policy
//! prices drafts with. Drafts are a chain or a tree
//! ([`DraftTree`], `--speculative-eagle-topk` > 1). The engine runs the target model over
//! `[last token, drafts…]` in one batched pass (tree attention for trees: `model::Tree`) and
//! verifies the drafts with the sampler (`model::sampler::Sampler::verify`: greedy match, or
//! rejection sampling over a node's candidates), so the output is exactly the model's either way.
//!
//! Why verification is cheap: a decode step reads every weight once whatever the number of rows
//! up to a tile (8 rows here), so while decoding is memory-bound, k extra rows cost little and
//! each accepted draft saves a whole step. As the batch grows the step becomes compute-bound and
//! extra rows cost their full price: that is what the policy weighs.

pub mod adaptive;
pub mod config;
pub mod draft_model;
pub mod drafter;
pub mod eagle3;
pub mod ngram;
pub mod policy;
pub mod speculator;
pub mod suffix;
pub mod verify;

pub use adaptive::{Acceptance, CostModel, MatchAcceptance};
pub use config::{Draft, NGRAM_DRAFT_TOKENS, SpecConfig, SpecError, SpecFlags};
pub use draft_model::{DraftError, DraftModel, DraftRequest, DraftSampling, check_vocabulary};
pub use drafter::{Drafter, DrafterMemory, Guess, NgramDrafter};
pub use ngram::{NgramProposer, WindowError};
pub use policy::{Budget, Policy};
pub use scheduler::DraftTree;
pub use speculator::{DrafterSpent, Speculator};
pub use suffix::{SuffixCache, SuffixDrafter, SuffixSettings};
pub use verify::Verdict;

/// The speculative algorithm (SGLang's `--speculative-algorithm` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "UPPER")]
pub enum Algorithm {
    None,
    Ngram,
    Standalone,
    /// A learned EAGLE-3 head reading the target's residual streams.
    Eagle3,
    /// Suffix decoding: the sequence's own text and a cache of recent requests' (vLLM's
    /// `suffix`).
    Suffix,
}

impl Algorithm {
    /// Whether it drafts with something loaded beside the target (a draft model or a head,
    /// `--speculative-draft-model-path`); prompt lookup does not.
    pub fn needs_draft(self) -> bool {
        matches!(self, Self::Standalone | Self::Eagle3)
    }

    /// Whether it speculates at all (`NONE` does not).
    pub fn speculates(self) -> bool {
        self != Self::None
    }

    /// Whether it must be given its draft model: `STANDALONE` has no built-in one (`EAGLE3`
    /// falls back to the head built in for the target).
    pub fn needs_draft_model(self) -> bool {
        self == Self::Standalone
    }

    /// Whether it runs under the adaptive policy without `--speculative-adaptive`: SUFFIX, whose
    /// drafts on text that repeats little would cost more than they save in a full batch.
    pub fn adaptive_by_default(self) -> bool {
        self == Self::Suffix
    }

    /// Whether its drafts come from an EAGLE-3 head.
    pub fn uses_head(self) -> bool {
        self == Self::Eagle3
    }
}

/// The flag's spelling: `NONE`, `NGRAM`, `STANDALONE`, `EAGLE3`.
impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::None => "NONE",
            Self::Ngram => "NGRAM",
            Self::Standalone => "STANDALONE",
            Self::Eagle3 => "EAGLE3",
            Self::Suffix => "SUFFIX",
        })
    }
}

impl std::str::FromStr for Algorithm {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_uppercase().as_str() {
            "NONE" => Ok(Self::None),
            "NGRAM" => Ok(Self::Ngram),
            "STANDALONE" => Ok(Self::Standalone),
            "EAGLE3" => Ok(Self::Eagle3),
            "SUFFIX" => Ok(Self::Suffix),
            other => Err(format!(
                "unknown speculative algorithm {other}: use NONE, NGRAM, STANDALONE, EAGLE3 or SUFFIX"
            )),
        }
    }
}
