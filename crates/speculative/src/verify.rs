//! Verification: rows of the target's logits for a draft tree become the tokens the target
//! itself would have produced (greedy match, or rejection sampling over each node's
//! candidates, or speculative sampling against the distribution a lone draft was drawn from, by
//! the request's sampler), so speculation is lossless.

use crate::DraftTree;
use model::sampler::{Sampled, Sampler};

/// What verifying one sequence's drafts gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The tokens emitted: the accepted drafts, then one of the target's own.
    pub emitted: Vec<Sampled>,
    /// The accepted branch's nodes, root excluded (`path[k]` is the node at depth `k + 1`).
    pub path: Vec<usize>,
}

/// Row `n` (of `row(n)`) holds the logits after draft node `n` (row 0: after the sequence's
/// last token). Walks down from the root, verifying each node's children on its row and
/// following the one the target chose; the row where the walk stops gives one more token of
/// the model's own.
pub fn walk<'a>(
    tree: &DraftTree,
    row: impl Fn(usize) -> &'a [f32],
    sampler: &mut Sampler,
    logprobs: Option<usize>,
) -> Verdict {
    let mut emitted: Vec<Sampled> = Vec::with_capacity(tree.len() + 1);
    let mut path: Vec<usize> = Vec::new();
    let mut node = 0;
    loop {
        let mut logits = row(node).to_vec();
        let children = tree.children(node);
        if children.is_empty() {
            emitted.push(sampler.sample(&mut logits, logprobs));
            break;
        }
        // A lone child drawn from the drafter's distribution: speculative sampling with it.
        // Otherwise (trees, argmax drafts) the candidates are verified as point masses.
        let (s, which) = if let [child] = children[..]
            && let Some(from) = tree.drawn_from(child)
        {
            let (s, ok) = sampler.verify_proposed(&mut logits, tree.token(child), from, logprobs);
            (s, ok.then_some(0))
        } else {
            let tokens: Vec<u32> = children.iter().map(|&c| tree.token(c)).collect();
            sampler.verify(&mut logits, &tokens, logprobs)
        };
        emitted.push(s);
        match which {
            Some(w) => {
                node = children[w];
                path.push(node);
            }
            None => break,
        }
    }
    Verdict { emitted, path }
}
