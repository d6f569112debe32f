//! Speculation's settings, owned here: the flags as given (SGLang's names) become one checked
//! [`SpecConfig`] once, each algorithm's draft-token count is derived here, a loaded [`Draft`] is
//! checked against the algorithm and the target here, and the [`Speculator`] with its drafter is
//! built here. Callers (the server's settings, the engine) only pass these along.

use crate::eagle3::{Eagle3Drafter, Eagle3Head, TokenEmbedding};
use crate::{
    Algorithm, Algorithms, DraftError, DraftModel, Drafter, NgramDrafter, NgramProposer,
    Speculator, SuffixDrafter, SuffixSettings, WindowError,
};
use model::{Model, ModelConfig};

/// Draft tokens an NGRAM sequence verifies per step without `--speculative-num-draft-tokens`
/// (its help says so; the default depends on the algorithm, so the flag cannot hold it).
pub const NGRAM_DRAFT_TOKENS: usize = 8;

/// Draft tokens a SUFFIX sequence verifies per step at most without
/// `--speculative-num-draft-tokens` (a long match drafts up to this many).
pub const SUFFIX_DRAFT_TOKENS: usize = 16;

/// The speculation flags as the user gave them (SGLang's names), before any derivation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpecFlags {
    /// `--speculative-algorithm` (one, or several combined).
    pub algorithm: Algorithms,
    /// `--speculative-num-draft-tokens`, if given.
    pub num_draft_tokens: Option<usize>,
    /// `--speculative-num-steps`.
    pub num_steps: usize,
    /// `--speculative-eagle-topk`.
    pub eagle_topk: usize,
    /// `--speculative-ngram-min-match-window` / `--speculative-ngram-max-match-window`.
    pub ngram_min_match_window: usize,
    pub ngram_max_match_window: usize,
    /// `--speculative-disable-batch-threshold`.
    pub disable_batch_threshold: Option<usize>,
    /// `--speculative-adaptive`, if given (the default is the adaptive policy).
    pub adaptive: Option<bool>,
    /// Whether `--speculative-draft-model-path` is given.
    pub draft_model_path: bool,
    /// `--speculative-suffix-*`.
    pub suffix: SuffixSettings,
}

/// Speculation's checked settings: made only by [`SpecConfig::from_flags`], so every value
/// here has been checked once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpecConfig {
    algorithm: Algorithms,
    /// Drafts a sequence verifies per step at most, per algorithm in `algorithm`'s order.
    num_draft_tokens: [usize; crate::MOST_DRAFTERS],
    topk: usize,
    num_steps: usize,
    ngram_windows: (usize, usize),
    disable_batch_threshold: Option<usize>,
    adaptive: bool,
    suffix: SuffixSettings,
}

/// What drafts for the target, besides prompt lookup.
#[derive(Debug)]
pub enum Draft {
    /// A smaller model with the same vocabulary (`STANDALONE`).
    Model(Box<Model>),
    /// An EAGLE-3 head, checked against the target when loaded (`EAGLE3`).
    Eagle3(Box<Eagle3Head>),
}

impl Draft {
    fn what(&self) -> &'static str {
        match self {
            Self::Model(_) => "a draft model",
            Self::Eagle3(_) => "an EAGLE-3 head",
        }
    }
}

/// Speculation settings that cannot work, each naming its flag.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("--speculative-eagle-topk must be at least 1 (1 drafts a chain)")]
    NoTopk,
    #[error("--speculative-num-steps must be at least 1")]
    NoSteps,
    #[error("--speculative-num-draft-tokens must be at least 1")]
    NoDraftTokens,
    #[error("--speculative-num-draft-tokens counts the root for EAGLE3: give at least 2")]
    NoEagle3DraftTokens,
    #[error(transparent)]
    Windows(#[from] WindowError),
    #[error("{0}")]
    Suffix(&'static str),
    #[error("--speculative-algorithm STANDALONE needs --speculative-draft-model-path")]
    NoDraftModel,
    #[error("EAGLE3 speculation needs an EAGLE-3 head (--speculative-draft-model-path)")]
    NoHead,
    #[error(
        "--speculative-draft-model-path gives {given}, which {algorithm} speculation does not use"
    )]
    WrongDraft {
        given: &'static str,
        algorithm: Algorithms,
    },
    #[error(transparent)]
    Vocabulary(#[from] DraftError),
}

impl SpecConfig {
    /// The settings `flags` give, checked; `None` for `--speculative-algorithm NONE`.
    pub fn from_flags(flags: SpecFlags) -> Result<Option<Self>, SpecError> {
        let algorithms = flags.algorithm;
        if !algorithms.speculates() {
            return Ok(None);
        }
        if flags.eagle_topk == 0 {
            return Err(SpecError::NoTopk);
        }
        if flags.num_steps == 0 {
            return Err(SpecError::NoSteps);
        }
        if flags.num_draft_tokens == Some(0) {
            return Err(SpecError::NoDraftTokens);
        }
        let mut num_draft_tokens = [0; crate::MOST_DRAFTERS];
        for (n, a) in num_draft_tokens.iter_mut().zip(algorithms.iter()) {
            *n = draft_tokens(a, &flags)?;
        }
        let windows = (flags.ngram_min_match_window, flags.ngram_max_match_window);
        NgramProposer::new(windows.0, windows.1)?;
        if algorithms.needs_draft_model() && !flags.draft_model_path {
            return Err(SpecError::NoDraftModel);
        }
        check_suffix(&flags.suffix)?;
        Ok(Some(Self {
            algorithm: algorithms,
            num_draft_tokens,
            topk: flags.eagle_topk,
            num_steps: flags.num_steps,
            ngram_windows: windows,
            disable_batch_threshold: flags.disable_batch_threshold,
            // Adaptive unless told otherwise: the fixed policy drafts at a loss wherever the
            // batch is large or the drafts poor (NGRAM's fixed drafts ×0.57 of plain at C=5).
            adaptive: flags.adaptive.unwrap_or(true),
            suffix: flags.suffix,
        }))
    }

    pub fn algorithm(&self) -> Algorithms {
        self.algorithm
    }

    /// Drafts a sequence verifies per step at most (the most of any of its drafters).
    pub fn num_draft_tokens(&self) -> usize {
        self.num_draft_tokens.iter().copied().max().unwrap_or(0)
    }

    /// Drafts a sequence verifies per step at most when `algorithm` (one of the combination)
    /// drafts for it.
    pub fn num_draft_tokens_of(&self, algorithm: Algorithm) -> usize {
        self.algorithm
            .iter()
            .zip(self.num_draft_tokens)
            .find_map(|(a, n)| (a == algorithm).then_some(n))
            .unwrap_or(0)
    }

    /// Candidates per draft-tree node (1 = chains).
    pub fn topk(&self) -> usize {
        self.topk
    }

    /// Levels of a drafted tree (a draft model's or a head's chain length).
    pub fn num_steps(&self) -> usize {
        self.num_steps
    }

    /// Suffix decoding's settings.
    pub fn suffix(&self) -> SuffixSettings {
        self.suffix
    }

    /// The longest match `algorithm` measures, if it matches (acceptance is learned per match
    /// length up to it).
    pub fn longest_match(&self, algorithm: Algorithm) -> usize {
        match algorithm {
            Algorithm::Suffix => self.suffix.max_tree_depth,
            _ => self.ngram_windows.1,
        }
    }

    /// Prompt lookup's shortest and longest n-gram match.
    pub fn ngram_windows(&self) -> (usize, usize) {
        self.ngram_windows
    }

    /// No speculation while more sequences than this run (the fixed policy).
    pub fn disable_batch_threshold(&self) -> Option<usize> {
        self.disable_batch_threshold
    }

    /// Drafts per sequence and step from the cost model (see [`crate::adaptive`]).
    pub fn adaptive(&self) -> bool {
        self.adaptive
    }

    /// Whether this algorithm needs a loaded [`Draft`] (prompt lookup does not).
    pub fn needs_draft(&self) -> bool {
        self.algorithm.needs_draft()
    }

    /// Checks that `draft` is what the algorithms draft with, and fits `target`: before the
    /// engine thread starts, so a mismatch is a start-up error.
    pub fn check_draft(&self, target: &Model, draft: Option<&Draft>) -> Result<(), SpecError> {
        let a = self.algorithm;
        match draft {
            Some(Draft::Model(d)) if a.contains(Algorithm::Standalone) => {
                crate::check_vocabulary(&d.file, &target.file)?;
                Ok(())
            }
            Some(Draft::Eagle3(_)) if a.contains(Algorithm::Eagle3) => Ok(()),
            None if a.contains(Algorithm::Standalone) => Err(SpecError::NoDraftModel),
            None if a.contains(Algorithm::Eagle3) => Err(SpecError::NoHead),
            None => Ok(()),
            Some(d) => Err(SpecError::WrongDraft {
                given: d.what(),
                algorithm: a,
            }),
        }
    }

    /// The speculator for `target`, drafting with `draft` (as [`SpecConfig::check_draft`]
    /// accepted) beside the drafters that need nothing loaded, over a KV pool of `blocks`
    /// blocks of `block_size` tokens. Built on the engine thread: a draft model's KV pool
    /// stays on the thread that made it.
    pub fn build(
        &self,
        target: &Model,
        draft: Option<Draft>,
        block_size: usize,
        blocks: usize,
    ) -> Result<Speculator, SpecError> {
        self.check_draft(target, draft.as_ref())?;
        let mut draft = draft;
        let mut entries = Vec::new();
        for algorithm in self.algorithm.iter() {
            let drafter: Box<dyn Drafter> = match algorithm {
                Algorithm::Standalone | Algorithm::Eagle3 => {
                    match draft.take().expect("check_draft: the draft is there") {
                        Draft::Model(d) => Box::new(DraftModel::new(*d, block_size, blocks)),
                        Draft::Eagle3(head) => {
                            let e = target.weights.embeddings.matrix(&target.file);
                            let embedding = TokenEmbedding {
                                dtype: e.dtype,
                                width: e.cols,
                                data: e.data.to_vec(),
                            };
                            Box::new(Eagle3Drafter::new(*head, embedding, block_size, blocks))
                        }
                    }
                }
                Algorithm::Suffix => Box::new(SuffixDrafter::new(self.suffix)),
                Algorithm::Ngram => {
                    let (min, max) = self.ngram_windows;
                    Box::new(NgramDrafter(NgramProposer::new(min, max)?))
                }
                Algorithm::None => unreachable!("from_flags makes no config with NONE"),
            };
            entries.push((algorithm, drafter));
        }
        Ok(Speculator::with_drafters(
            self,
            logits_weight(&target.config),
            entries,
        ))
    }
}

/// The most drafts `algorithm` verifies per sequence and step under `flags`.
fn draft_tokens(algorithm: Algorithm, flags: &SpecFlags) -> Result<usize, SpecError> {
    let (steps, topk, asked) = (flags.num_steps, flags.eagle_topk, flags.num_draft_tokens);
    Ok(match algorithm {
        Algorithm::None => 0,
        // A chain of num_steps drafts, capped by num_draft_tokens if given; a tree's
        // num_steps levels of topk, of which num_draft_tokens are verified.
        Algorithm::Standalone if topk == 1 => asked.map_or(steps, |n| n.min(steps)),
        Algorithm::Standalone => asked.unwrap_or(steps * topk),
        Algorithm::Ngram => asked.unwrap_or(NGRAM_DRAFT_TOKENS),
        Algorithm::Suffix => asked.unwrap_or(SUFFIX_DRAFT_TOKENS),
        // SGLang's meaning: the verified tokens, the root included; a chain is num_steps
        // drafts whatever is asked (SGLang sets the count to num_steps + 1).
        Algorithm::Eagle3 if topk == 1 => steps,
        Algorithm::Eagle3 => match asked {
            Some(n) if n < 2 => return Err(SpecError::NoEagle3DraftTokens),
            Some(n) => n - 1,
            None => steps * topk,
        },
    })
}

/// Suffix decoding's settings that cannot work.
fn check_suffix(s: &SuffixSettings) -> Result<(), SpecError> {
    if s.max_tree_depth == 0 {
        return Err(SpecError::Suffix(
            "--speculative-suffix-max-tree-depth must be at least 1",
        ));
    }
    if !(s.max_spec_factor.is_finite() && s.max_spec_factor > 0.0) {
        return Err(SpecError::Suffix(
            "--speculative-suffix-max-spec-factor must be positive",
        ));
    }
    if !(0.0..=1.0).contains(&s.min_token_prob) {
        return Err(SpecError::Suffix(
            "--speculative-suffix-min-token-prob must be between 0 and 1",
        ));
    }
    Ok(())
}

/// κ: the output head's multiply-adds per row relative to all layers' (the adaptive policy's
/// price of a verification row's logits).
pub fn logits_weight(c: &ModelConfig) -> f64 {
    let q = c.n_heads * c.head_dim;
    let per_layer = c.hidden * (q + 2 * c.kv_dim()) + q * c.hidden + 3 * c.hidden * c.ffn_hidden;
    (c.vocab_size * c.hidden) as f64 / (c.n_layers * per_layer) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(algorithm: Algorithm) -> SpecFlags {
        SpecFlags {
            algorithm: algorithm.into(),
            num_draft_tokens: None,
            num_steps: 4,
            eagle_topk: 1,
            ngram_min_match_window: 1,
            ngram_max_match_window: 12,
            disable_batch_threshold: None,
            adaptive: None,
            draft_model_path: true,
            suffix: SuffixSettings::default(),
        }
    }

    fn tokens(f: SpecFlags) -> usize {
        SpecConfig::from_flags(f)
            .unwrap()
            .unwrap()
            .num_draft_tokens()
    }

    #[test]
    fn each_algorithm_derives_its_draft_token_count() {
        assert!(
            SpecConfig::from_flags(flags(Algorithm::None))
                .unwrap()
                .is_none()
        );
        assert_eq!(tokens(flags(Algorithm::Ngram)), NGRAM_DRAFT_TOKENS);
        let asked = |a, n, topk| {
            tokens(SpecFlags {
                num_draft_tokens: n,
                eagle_topk: topk,
                ..flags(a)
            })
        };
        assert_eq!(asked(Algorithm::Ngram, Some(3), 1), 3);
        // A draft model's chain is num_steps long, capped by what is asked.
        assert_eq!(asked(Algorithm::Standalone, None, 1), 4);
        assert_eq!(asked(Algorithm::Standalone, Some(2), 1), 2);
        assert_eq!(asked(Algorithm::Standalone, Some(9), 1), 4);
        assert_eq!(asked(Algorithm::Standalone, None, 2), 8);
        // EAGLE3 counts the root (SGLang's meaning); a chain is num_steps whatever is asked.
        assert_eq!(asked(Algorithm::Eagle3, Some(9), 1), 4);
        assert_eq!(asked(Algorithm::Eagle3, Some(6), 4), 5);
        assert_eq!(asked(Algorithm::Eagle3, None, 4), 16);
    }

    #[test]
    fn every_algorithm_is_adaptive_unless_told_and_combined_ones_keep_their_counts() {
        for a in [
            Algorithm::Ngram,
            Algorithm::Standalone,
            Algorithm::Eagle3,
            Algorithm::Suffix,
        ] {
            let c = SpecConfig::from_flags(flags(a)).unwrap().unwrap();
            assert!(c.adaptive(), "{a}");
            let fixed = SpecFlags {
                adaptive: Some(false),
                ..flags(a)
            };
            assert!(!SpecConfig::from_flags(fixed).unwrap().unwrap().adaptive());
        }
        let combined = SpecFlags {
            algorithm: "EAGLE3,SUFFIX".parse().unwrap(),
            ..flags(Algorithm::None)
        };
        let c = SpecConfig::from_flags(combined).unwrap().unwrap();
        assert_eq!(c.num_draft_tokens_of(Algorithm::Eagle3), 4);
        assert_eq!(
            c.num_draft_tokens_of(Algorithm::Suffix),
            SUFFIX_DRAFT_TOKENS
        );
        assert_eq!(c.num_draft_tokens(), SUFFIX_DRAFT_TOKENS);
        assert_eq!(
            c.longest_match(Algorithm::Suffix),
            c.suffix().max_tree_depth
        );
        assert!(c.needs_draft());
        let standalone = SpecFlags {
            algorithm: "SUFFIX,STANDALONE".parse().unwrap(),
            draft_model_path: false,
            ..flags(Algorithm::None)
        };
        let e = SpecConfig::from_flags(standalone).unwrap_err().to_string();
        assert!(e.contains("--speculative-draft-model-path"), "{e}");
    }

    #[test]
    fn bad_flags_name_the_flag() {
        let e = |f: SpecFlags| SpecConfig::from_flags(f).unwrap_err().to_string();
        let msg = e(SpecFlags {
            eagle_topk: 0,
            ..flags(Algorithm::Ngram)
        });
        assert!(msg.contains("--speculative-eagle-topk"), "{msg}");
        let msg = e(SpecFlags {
            num_steps: 0,
            ..flags(Algorithm::Eagle3)
        });
        assert!(msg.contains("--speculative-num-steps"), "{msg}");
        let msg = e(SpecFlags {
            num_draft_tokens: Some(0),
            ..flags(Algorithm::Ngram)
        });
        assert!(msg.contains("--speculative-num-draft-tokens"), "{msg}");
        let msg = e(SpecFlags {
            num_draft_tokens: Some(1),
            eagle_topk: 2,
            ..flags(Algorithm::Eagle3)
        });
        assert!(msg.contains("counts the root"), "{msg}");
        let msg = e(SpecFlags {
            ngram_min_match_window: 3,
            ngram_max_match_window: 2,
            ..flags(Algorithm::Ngram)
        });
        assert!(
            msg.contains("--speculative-ngram-max-match-window"),
            "{msg}"
        );
        let msg = e(SpecFlags {
            draft_model_path: false,
            ..flags(Algorithm::Standalone)
        });
        assert!(msg.contains("--speculative-draft-model-path"), "{msg}");
    }
}
