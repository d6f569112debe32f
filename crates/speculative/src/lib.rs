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
pub use speculator::{DrafterCounts, DrafterReport, DrafterSpent, Speculator};
pub use suffix::{SuffixCache, SuffixDrafter, SuffixSettings};
pub use verify::Verdict;

use std::fmt;

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

    /// Whether its drafts come from an EAGLE-3 head.
    pub fn uses_head(self) -> bool {
        self == Self::Eagle3
    }

    /// The algorithms that draft, each once (a combination's members, an index into this the
    /// way the statistics name them).
    pub const DRAFTING: [Algorithm; MOST_DRAFTERS] =
        [Self::Ngram, Self::Standalone, Self::Eagle3, Self::Suffix];

    /// Its name as a metric label: `ngram`, `standalone`, `eagle3`, `suffix` (`none`).
    pub fn label(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Ngram => "ngram",
            Self::Standalone => "standalone",
            Self::Eagle3 => "eagle3",
            Self::Suffix => "suffix",
        }
    }
}

/// The flag's spelling: `NONE`, `NGRAM`, `STANDALONE`, `EAGLE3`, `SUFFIX`.
impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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

/// The most drafters one server combines: every algorithm that drafts, once.
pub const MOST_DRAFTERS: usize = 4;

/// `--speculative-algorithm` as given: one algorithm, or drafters combined with commas
/// (llama.cpp's convention: `EAGLE3,SUFFIX`), each sequence taking, each step, the draft of
/// whichever pays best (see [`Speculator`]). At most one of them loads a draft
/// (`STANDALONE` or `EAGLE3`: there is one `--speculative-draft-model-path`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Algorithms {
    list: [Algorithm; MOST_DRAFTERS],
    len: usize,
}

impl Algorithms {
    /// `NONE`: no speculation.
    pub const NONE: Self = Self::one(Algorithm::None);

    pub const fn one(algorithm: Algorithm) -> Self {
        // The unused places hold NONE, so that equal lists compare equal.
        let mut list = [Algorithm::None; MOST_DRAFTERS];
        list[0] = algorithm;
        Self { list, len: 1 }
    }

    /// The algorithms in the order given.
    pub fn iter(&self) -> impl Iterator<Item = Algorithm> + '_ {
        self.list[..self.len].iter().copied()
    }

    /// Whether there is more than one drafter.
    pub fn combined(&self) -> bool {
        self.len > 1
    }

    pub fn contains(&self, algorithm: Algorithm) -> bool {
        self.iter().any(|a| a == algorithm)
    }

    /// Whether it speculates at all (`NONE` does not).
    pub fn speculates(&self) -> bool {
        self.iter().any(Algorithm::speculates)
    }

    /// Whether one of them drafts with something loaded beside the target.
    pub fn needs_draft(&self) -> bool {
        self.iter().any(Algorithm::needs_draft)
    }

    /// Whether one of them must be given its draft model (`STANDALONE`).
    pub fn needs_draft_model(&self) -> bool {
        self.iter().any(Algorithm::needs_draft_model)
    }

    /// Whether one of them drafts with an EAGLE-3 head.
    pub fn uses_head(&self) -> bool {
        self.iter().any(Algorithm::uses_head)
    }
}

impl From<Algorithm> for Algorithms {
    fn from(a: Algorithm) -> Self {
        Self::one(a)
    }
}

/// The flag's spelling, combined ones joined by commas: `EAGLE3,SUFFIX`.
impl fmt::Display for Algorithms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, a) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{a}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Algorithms {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut out = Self::NONE;
        out.len = 0;
        for part in s.split(',') {
            let a: Algorithm = part.trim().parse()?;
            if out.contains(a) {
                return Err(format!("{a} is named twice in {s}"));
            }
            if out.len == MOST_DRAFTERS {
                return Err(format!("{s}: at most {MOST_DRAFTERS} drafters combine"));
            }
            out.list[out.len] = a;
            out.len += 1;
        }
        if out.len > 1 && out.contains(Algorithm::None) {
            return Err(format!("NONE cannot be combined with drafters: {s}"));
        }
        if out.contains(Algorithm::Standalone) && out.contains(Algorithm::Eagle3) {
            return Err(format!(
                "{s}: STANDALONE and EAGLE3 both load --speculative-draft-model-path; combine one of them"
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod algorithms_tests {
    use super::*;

    #[test]
    fn drafters_combine_with_commas_in_the_order_given() {
        let a: Algorithms = "eagle3, SUFFIX".parse().unwrap();
        assert_eq!(
            a.iter().collect::<Vec<_>>(),
            [Algorithm::Eagle3, Algorithm::Suffix]
        );
        assert!(a.combined() && a.uses_head() && a.needs_draft() && !a.needs_draft_model());
        assert_eq!(a.to_string(), "EAGLE3,SUFFIX");
        let one: Algorithms = "ngram".parse().unwrap();
        assert_eq!(one, Algorithms::one(Algorithm::Ngram));
        assert!(!one.combined() && one.speculates() && !Algorithms::NONE.speculates());
    }

    #[test]
    fn combinations_that_cannot_work_are_refused() {
        for bad in [
            "SUFFIX,SUFFIX",
            "NONE,NGRAM",
            "STANDALONE,EAGLE3",
            "SUFFIX,",
            "EAGLE9",
        ] {
            assert!(bad.parse::<Algorithms>().is_err(), "{bad}");
        }
    }
}
