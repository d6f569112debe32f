//! Draft trees: the candidates a sequence verifies in one step. Node 0 is the sequence's last
//! token (the root, already decided); nodes `1..=len` are draft tokens, each following its
//! parent, numbered so that parents come before children. A chain is the tree whose node `i`
//! follows node `i - 1`. The target runs the root and every node in one pass (tree attention:
//! each node sees only its ancestors) and verification walks down from the root, taking the
//! child the target's own choice matches, so one branch at most is accepted. A draft may carry
//! the distribution it was drawn from (sampled drafts, verified by speculative sampling).

use std::sync::Arc;

/// The distribution a sampled draft was drawn from: `(token, probability)` sorted by token,
/// summing to 1.
pub type DraftDistribution = Arc<[(u32, f32)]>;

/// A tree of draft tokens below a sequence's last token.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftTree {
    /// `tokens[i]` is node `i + 1`'s token.
    tokens: Vec<u32>,
    /// `parents[n]` is node `n`'s parent (`parents[0] = 0` for the root).
    parents: Vec<usize>,
    /// `drawn_from[i]`: what node `i + 1`'s token was drawn from, if it was sampled.
    drawn_from: Vec<Option<DraftDistribution>>,
}

impl Default for DraftTree {
    fn default() -> Self {
        Self {
            tokens: Vec::new(),
            parents: vec![0],
            drawn_from: Vec::new(),
        }
    }
}

impl DraftTree {
    /// Drafts in a row.
    pub fn chain(tokens: Vec<u32>) -> Self {
        let parents = (0..=tokens.len()).map(|n| n.saturating_sub(1)).collect();
        let drawn_from = vec![None; tokens.len()];
        Self {
            tokens,
            parents,
            drawn_from,
        }
    }

    /// Adds `token` below `parent` (an existing node); returns the new node.
    pub fn push(&mut self, parent: usize, token: u32) -> usize {
        self.push_drawn(parent, token, None)
    }

    /// [`DraftTree::push`] for a token drawn from `from` (when sampled).
    pub fn push_drawn(
        &mut self,
        parent: usize,
        token: u32,
        from: Option<DraftDistribution>,
    ) -> usize {
        assert!(parent < self.parents.len(), "parent {parent} is not a node");
        self.tokens.push(token);
        self.parents.push(parent);
        self.drawn_from.push(from);
        self.tokens.len()
    }

    /// What node `n`'s token (`n ≥ 1`) was drawn from, if it was sampled.
    pub fn drawn_from(&self, n: usize) -> Option<&[(u32, f32)]> {
        self.drawn_from[n - 1].as_deref()
    }

    /// Number of draft tokens (nodes other than the root).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The draft tokens, node 1 first.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Node `n`'s token (`n ≥ 1`).
    pub fn token(&self, n: usize) -> u32 {
        self.tokens[n - 1]
    }

    /// Every node's parent, the root's (0) included.
    pub fn parents(&self) -> &[usize] {
        &self.parents
    }

    /// True when every node follows the one before it.
    pub fn is_chain(&self) -> bool {
        self.parents
            .iter()
            .enumerate()
            .skip(1)
            .all(|(n, &p)| p + 1 == n)
    }

    /// Node `n`'s children, in node order.
    pub fn children(&self, n: usize) -> Vec<usize> {
        (n + 1..self.parents.len())
            .filter(|&c| self.parents[c] == n)
            .collect()
    }

    /// Node `n`'s depth (the root's is 0).
    pub fn depth(&self, mut n: usize) -> usize {
        let mut d = 0;
        while n != 0 {
            n = self.parents[n];
            d += 1;
        }
        d
    }

    /// Keeps the first `n` drafts (parents come first, so it is still a tree).
    pub fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
        self.parents.truncate(n + 1);
        self.drawn_from.truncate(n);
    }

    /// The tree made of `nodes` (ancestors before descendants, each one's parent included),
    /// renumbered in that order.
    pub fn select(&self, nodes: &[usize]) -> Self {
        let mut out = Self::default();
        let mut new_id = vec![usize::MAX; self.parents.len()];
        new_id[0] = 0;
        for &n in nodes {
            let parent = new_id[self.parents[n]];
            assert!(parent != usize::MAX, "node {n} selected before its parent");
            new_id[n] = out.push_drawn(parent, self.token(n), self.drawn_from[n - 1].clone());
        }
        out
    }

    /// The nodes, root excluded, along the longest path that starts with `tokens`: how verified
    /// tokens map onto this tree.
    pub fn follow(&self, tokens: &[u32]) -> Vec<usize> {
        let mut path = Vec::new();
        let mut at = 0;
        for &t in tokens {
            match self.children(at).into_iter().find(|&c| self.token(c) == t) {
                Some(c) => {
                    path.push(c);
                    at = c;
                }
                None => break,
            }
        }
        path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_is_a_tree_of_single_children() {
        let c = DraftTree::chain(vec![7, 8, 9]);
        assert!(c.is_chain());
        assert_eq!(c.parents(), &[0, 0, 1, 2]);
        assert_eq!(c.children(1), vec![2]);
        assert_eq!(c.depth(3), 3);
        assert_eq!(c.follow(&[7, 8, 5]), vec![1, 2]);
        assert!(DraftTree::default().is_chain());
    }

    #[test]
    fn branches_selection_and_following() {
        // root → 10 (1) → 11 (3); root → 20 (2) → 21 (4), 22 (5)
        let mut t = DraftTree::default();
        let a = t.push(0, 10);
        let b = t.push(0, 20);
        t.push(a, 11);
        let d = t.push(b, 21);
        t.push(b, 22);
        assert!(!t.is_chain());
        assert_eq!(t.children(0), vec![1, 2]);
        assert_eq!(t.children(2), vec![4, 5]);
        assert_eq!(t.depth(d), 2);
        assert_eq!(t.follow(&[20, 22, 1]), vec![2, 5]);
        assert_eq!(t.follow(&[30]), Vec::<usize>::new());
        let s = t.select(&[2, 5]);
        assert_eq!(s.tokens(), &[20, 22]);
        assert_eq!(s.parents(), &[0, 0, 1]);
        let mut u = t.clone();
        u.truncate(3);
        assert_eq!(u.tokens(), &[10, 20, 11]);
        assert_eq!(u.parents(), &[0, 0, 0, 1]);
    }

    #[test]
    fn a_drawn_token_keeps_its_distribution_through_selection() {
        let mut t = DraftTree::default();
        let a = t.push(0, 10);
        let from: DraftDistribution = Arc::from(vec![(11, 0.25), (12, 0.75)]);
        let b = t.push_drawn(a, 12, Some(from));
        assert_eq!(t.drawn_from(a), None);
        assert_eq!(t.drawn_from(b), Some(&[(11, 0.25), (12, 0.75)][..]));
        let s = t.select(&[1, 2]);
        assert_eq!(s.drawn_from(2), t.drawn_from(b));
        let mut u = s.clone();
        u.truncate(1);
        assert_eq!(u, t.select(&[1]));
    }
}
