//! Prompt/output lookup ("n-gram") drafting, as SGLang's NGRAM, vLLM's `ngram` and llama.cpp's
//! lookup decoding: find the most recent earlier occurrence of the sequence's last n tokens
//! (n from the max match window down to the min) and propose the tokens that followed it.

use crate::DraftTree;

/// Match windows out of order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "--speculative-ngram-min-match-window and --speculative-ngram-max-match-window must satisfy 1 ≤ min ({min}) ≤ max ({max})"
)]
pub struct WindowError {
    pub min: usize,
    pub max: usize,
}

/// Earlier occurrences a draft tree is built from, at most.
pub(crate) const TREE_OCCURRENCES: usize = 16;

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
    pub fn new(min_window: usize, max_window: usize) -> Result<Self, WindowError> {
        if min_window == 0 || max_window < min_window {
            return Err(WindowError {
                min: min_window,
                max: max_window,
            });
        }
        Ok(Self {
            min_window,
            max_window,
        })
    }
}

impl NgramProposer {
    /// Up to `max` draft tokens to follow `tokens` (the prompt and output so far); none when
    /// no n-gram of the window sizes recurs.
    pub fn propose(&mut self, tokens: &[u32], max: usize) -> Vec<u32> {
        self.lookup(tokens, max).map(|(d, _)| d).unwrap_or_default()
    }

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

impl NgramProposer {
    /// Up to `max` drafts as a tree with at most `width` children a node, and the longest match
    /// length: the continuations of the best earlier occurrences of the suffix (longest matches,
    /// then most recent) vote for their paths, each with weight 2^match length (every matched
    /// token makes a chance match less likely); the `max` heaviest nodes are kept, heaviest
    /// first (a node never outweighs its parent, so every prefix of the order is a tree).
    pub fn lookup_tree(
        &self,
        tokens: &[u32],
        max: usize,
        width: usize,
    ) -> Option<(DraftTree, usize)> {
        let len = tokens.len();
        if max == 0 || width == 0 || len < 2 {
            return None;
        }
        let found = occurrences(tokens, self.max_window, self.min_window, TREE_OCCURRENCES);
        let longest = found.first()?.0;
        let votes: Vec<(usize, &[u32])> = found
            .iter()
            .map(|&(n, end)| (n, &tokens[end..(end + max).min(len)]))
            .collect();
        let tree = vote_tree(&votes, max, width, 0.0);
        Some((tree, longest))
    }
}

/// The earlier occurrences of `tokens`' suffix, as (match length, where the continuation
/// starts): matches of `min` to `cap` tokens with something after them, the `most` longest
/// (the most recent among equals), longest first.
pub(crate) fn occurrences(
    tokens: &[u32],
    cap: usize,
    min: usize,
    most: usize,
) -> Vec<(usize, usize)> {
    let len = tokens.len();
    let Some(&last) = tokens.last() else {
        return Vec::new();
    };
    let cap = cap.min(len - 1);
    let mut found: Vec<(usize, usize)> = (1..len)
        .rev()
        .filter(|&end| tokens[end - 1] == last)
        .map(|end| {
            let n = (1..=cap.min(end))
                .take_while(|&k| tokens[end - k] == tokens[len - k])
                .count();
            (n, end)
        })
        .filter(|&(n, end)| n >= min && end < len)
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
    found.truncate(most);
    found
}

/// The draft tree the continuations `votes` (each with the length of the match it follows) vote
/// for: every continuation votes for its path with weight 2^match length (every matched token
/// makes a chance match less likely); the `max` heaviest nodes are kept, heaviest first (a node
/// never outweighs its parent, so every prefix of the order is a tree), at most `width` children
/// a node, and only nodes with at least `min_share` of all the weight.
pub(crate) fn vote_tree(
    votes: &[(usize, &[u32])],
    max: usize,
    width: usize,
    min_share: f64,
) -> DraftTree {
    // A trie of the continuations: (parent, token, weight, depth); node 0 is the root.
    let mut trie: Vec<(usize, u32, f64, usize)> = vec![(0, 0, 0.0, 0)];
    let mut children: Vec<Vec<usize>> = vec![Vec::new()];
    let mut total = 0.0;
    for &(n, continuation) in votes {
        let weight = (n.min(30) as f64).exp2();
        total += weight;
        let mut at = 0;
        for &t in continuation.iter().take(max) {
            at = match children[at].iter().find(|&&c| trie[c].1 == t) {
                Some(&c) => c,
                None => {
                    trie.push((at, t, 0.0, trie[at].3 + 1));
                    children.push(Vec::new());
                    children[at].push(trie.len() - 1);
                    trie.len() - 1
                }
            };
            trie[at].2 += weight;
        }
    }
    // Heaviest first, shallower first among equals (a deeper guess is less likely), keeping
    // the `width` heaviest children of each node and only nodes whose parent is kept.
    let mut order: Vec<usize> = (1..trie.len())
        .filter(|&n| trie[n].2 >= min_share * total)
        .collect();
    order.sort_by(|&a, &b| {
        trie[b]
            .2
            .total_cmp(&trie[a].2)
            .then((trie[a].3, a).cmp(&(trie[b].3, b)))
    });
    let mut kept = vec![false; trie.len()];
    let mut kept_children = vec![0usize; trie.len()];
    kept[0] = true;
    let mut chosen = Vec::with_capacity(max);
    for n in order {
        let parent = trie[n].0;
        if chosen.len() == max {
            break;
        }
        if !kept[parent] || kept_children[parent] == width {
            continue;
        }
        kept[n] = true;
        kept_children[parent] += 1;
        chosen.push(n);
    }
    let mut tree = DraftTree::default();
    let mut id = vec![0usize; trie.len()];
    for n in chosen {
        id[n] = tree.push(id[trie[n].0], trie[n].1);
    }
    tree
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_branches_where_earlier_continuations_differ() {
        let p = NgramProposer::new(1, 4).unwrap();
        // [1, 2] was followed by 3 4 once and by 5 6 twice; the sequence ends in [1, 2].
        let tokens = [1, 2, 3, 4, 0, 1, 2, 5, 6, 0, 1, 2, 5, 6, 0, 9, 1, 2];
        let (tree, matched) = p.lookup_tree(&tokens, 6, 2).unwrap();
        assert_eq!(matched, 2);
        // Two votes for 5 6 0 outweigh the one for 3 4 0: that path comes first, then the other
        // branch (shallower than the single votes for 9 or 1 after 5 6 0).
        assert_eq!(tree.tokens(), &[5, 6, 0, 3, 4, 0]);
        assert_eq!(tree.parents(), &[0, 0, 1, 2, 0, 4, 5]);
        let (tree, _) = p.lookup_tree(&tokens, 8, 2).unwrap();
        assert_eq!(tree.tokens(), &[5, 6, 0, 3, 4, 0, 9, 1]);
        assert_eq!(tree.children(3), vec![7, 8]);
        // One child a node: the heaviest path only.
        let (chain, _) = p.lookup_tree(&tokens, 4, 1).unwrap();
        assert!(chain.is_chain());
        assert_eq!(chain.tokens(), &[5, 6, 0, 9]);
        // The budget caps the nodes, heaviest first.
        assert_eq!(p.lookup_tree(&tokens, 1, 2).unwrap().0.tokens(), &[5]);
        assert!(p.lookup_tree(&[1, 2, 3], 4, 2).is_none());
    }

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
