//! Prompt/output lookup ("n-gram") drafting, as SGLang's NGRAM, vLLM's `ngram` and llama.cpp's
//! lookup decoding: find the most recent earlier occurrence of the sequence's last n tokens
//! (n from the max match window down to the min) and propose the tokens that followed it.

use crate::Proposer;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramProposer {
    /// Shortest suffix that counts as a match (`--speculative-ngram-min-match-window`).
    pub min_window: usize,
    /// Longest suffix tried first (`--speculative-ngram-max-match-window`).
    pub max_window: usize,
}

impl Default for NgramProposer {
    fn default() -> Self {
        Self {
            min_window: 1,
            max_window: 12,
        }
    }
}

impl NgramProposer {
    /// Validates the windows.
    pub fn new(min_window: usize, max_window: usize) -> Result<Self, String> {
        if min_window == 0 || max_window < min_window {
            return Err(format!(
                "n-gram match windows must satisfy 1 ≤ min ({min_window}) ≤ max ({max_window})"
            ));
        }
        Ok(Self {
            min_window,
            max_window,
        })
    }
}

impl Proposer for NgramProposer {
    fn propose(&mut self, tokens: &[u32], max: usize) -> Vec<u32> {
        self.lookup(tokens, max).map(|(d, _)| d).unwrap_or_default()
    }
}

impl NgramProposer {
    /// Up to `max` drafts and the length of the suffix they were matched on (a longer match
    /// predicts acceptance better: the adaptive policy keeps statistics per match length).
    pub fn lookup(&self, tokens: &[u32], max: usize) -> Option<(Vec<u32>, usize)> {
        let len = tokens.len();
        if max == 0 || len < 2 {
            return None;
        }
        // One pass over the earlier occurrences of the last token, most recent first, measuring
        // how far back each matches the sequence's suffix: the longest match wins, the most
        // recent among equals (what trying the longest window first would find).
        let cap = self.max_window.min(len - 1);
        let last = tokens[len - 1];
        let mut best: Option<(usize, usize)> = None; // (match length, end of the occurrence)
        for end in (1..len).rev() {
            if tokens[end - 1] != last {
                continue;
            }
            let n = (1..=cap.min(end))
                .take_while(|&k| tokens[end - k] == tokens[len - k])
                .count();
            if n >= self.min_window && best.is_none_or(|(m, _)| n > m) {
                best = Some((n, end));
                if n == cap {
                    break;
                }
            }
        }
        let (n, from) = best?;
        let to = (from + max).min(len);
        Some((tokens[from..to].to_vec(), n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_latest_longest_match() {
        let mut p = NgramProposer::new(1, 4).unwrap();
        //            0  1  2  3  4  5  6  7  8  9
        let tokens = [5, 6, 7, 8, 9, 1, 6, 7, 2, 6, 7];
        // Suffix [6, 7] last seen at 6..8, followed by [2, 6, 7]; [2, 6, 7] has no earlier match.
        assert_eq!(p.propose(&tokens, 3), [2, 6, 7]);
        assert_eq!(p.propose(&tokens, 1), [2]);
        // A copy of a span: the continuation of the first copy.
        let doc = [10, 11, 12, 13, 14, 15, 99, 10, 11, 12];
        assert_eq!(p.propose(&doc, 4), [13, 14, 15, 99]);
        assert_eq!(
            p.lookup(&doc, 2),
            Some((vec![13, 14], 3)),
            "matched on 3 tokens"
        );
    }

    #[test]
    fn no_match_no_draft_and_windows_are_checked() {
        let mut p = NgramProposer::new(2, 3).unwrap();
        assert!(p.propose(&[1, 2, 3, 4], 5).is_empty());
        assert!(p.propose(&[1], 5).is_empty());
        assert!(p.propose(&[1, 2, 1, 2], 0).is_empty());
        assert!(NgramProposer::new(0, 3).is_err());
        assert!(NgramProposer::new(4, 3).is_err());
    }

    /// The definition: for each window, longest first, the most recent earlier occurrence.
    fn lookup_by_windows(
        p: &NgramProposer,
        tokens: &[u32],
        max: usize,
    ) -> Option<(Vec<u32>, usize)> {
        let len = tokens.len();
        if max == 0 || len < 2 {
            return None;
        }
        for n in (p.min_window..=p.max_window.min(len - 1)).rev() {
            let suffix = &tokens[len - n..];
            let found = (0..len - n)
                .rev()
                .find(|&start| &tokens[start..start + n] == suffix);
            if let Some(start) = found {
                let to = (start + n + max).min(len);
                return Some((tokens[start + n..to].to_vec(), n));
            }
        }
        None
    }

    proptest::proptest! {
        /// The one-pass search finds what trying each window in turn finds.
        #[test]
        fn one_pass_equals_window_by_window(
            tokens in proptest::collection::vec(0u32..3, 0..80),
            max in 0usize..8,
            min in 1usize..4,
            extra in 0usize..6,
        ) {
            let p = NgramProposer::new(min, min + extra).unwrap();
            proptest::prop_assert_eq!(p.lookup(&tokens, max), lookup_by_windows(&p, &tokens, max));
        }

        /// Whatever it proposes continues an earlier occurrence of the sequence's suffix.
        #[test]
        fn drafts_copy_an_earlier_continuation(
            tokens in proptest::collection::vec(0u32..4, 0..60),
            max in 0usize..8,
        ) {
            let mut p = NgramProposer::new(1, 5).unwrap();
            let draft = p.propose(&tokens, max);
            proptest::prop_assert!(draft.len() <= max);
            if !draft.is_empty() {
                let found = (1..tokens.len()).any(|start| {
                    tokens[start..].starts_with(&draft) && tokens[start - 1] == *tokens.last().unwrap()
                });
                proptest::prop_assert!(found);
            }
        }
    }
}
