//! When to speculate and how far ([`Budget`]). Fixed rule (SGLang's): every decoding sequence
//! gets up to `num_draft_tokens` drafts, unless more than `disable_batch_threshold` sequences are
//! running, when nobody speculates (at large batches the step is compute-bound and extra rows
//! cost their full price). Adaptive (`--speculative-adaptive`): up to `num_draft_tokens` each, as
//! many as raise the batch's expected tokens per second (see [`crate::adaptive`]).

#[derive(Debug, Clone)]
pub struct Policy {
    /// Most draft tokens a sequence verifies per step (`--speculative-num-draft-tokens`).
    num_draft_tokens: usize,
    /// No speculation while more than this many sequences run
    /// (`--speculative-disable-batch-threshold`); `None`: always speculate.
    disable_batch_threshold: Option<usize>,
}

impl Policy {
    pub fn new(num_draft_tokens: usize, disable_batch_threshold: Option<usize>) -> Self {
        Self {
            num_draft_tokens,
            disable_batch_threshold,
        }
    }

    /// Drafts each decoding sequence may verify this step, with `running` sequences running.
    pub fn drafts_per_sequence(&self, running: usize) -> usize {
        match self.disable_batch_threshold {
            Some(limit) if running > limit => 0,
            _ => self.num_draft_tokens,
        }
    }
}

/// The drafting policy: fixed or adaptive, one type.
#[derive(Debug, Clone)]
pub enum Budget {
    Fixed(Policy),
    Adaptive { num_draft_tokens: usize },
}

impl Budget {
    /// The most drafts a decoding sequence may take this step, with `running` sequences
    /// running (the adaptive policy then allocates within it).
    pub fn ceiling(&self, running: usize) -> usize {
        match self {
            Self::Fixed(p) => p.drafts_per_sequence(running),
            Self::Adaptive { num_draft_tokens } => *num_draft_tokens,
        }
    }

    pub fn is_adaptive(&self) -> bool {
        matches!(self, Self::Adaptive { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_switches_speculation_off() {
        let p = Policy::new(5, Some(4));
        assert_eq!(p.drafts_per_sequence(1), 5);
        assert_eq!(p.drafts_per_sequence(4), 5);
        assert_eq!(p.drafts_per_sequence(5), 0);
        let always = Policy::new(3, None);
        assert_eq!(always.drafts_per_sequence(500), 3);
    }
}
