//! Speculation under structured output: a sequence's drafts that its grammar rejects are cut
//! before verification (the mask would reject them for sure), so no rows are spent on them.

use crate::step_loop::Active;
use model::sampler::TokenConstraint;
use scheduler::{DraftPlanner, DraftTree, Granted, Load, SeqId, Sequence, StepPlan};
use speculative::Speculator;
use std::collections::HashMap;

/// The speculator as the scheduler's planner, with each sequence's drafts checked against its
/// grammar.
pub(crate) struct GrammarGuard<'a> {
    pub(crate) spec: &'a mut Speculator,
    pub(crate) active: &'a mut HashMap<SeqId, Active>,
}

impl DraftPlanner for GrammarGuard<'_> {
    fn slots(&mut self, plan: &StepPlan, decoding: &[&Sequence], load: Load) -> Vec<usize> {
        self.spec.slots(plan, decoding, load)
    }

    fn draft(&mut self, granted: &[Granted<'_>]) -> Vec<DraftTree> {
        let mut trees = self.spec.draft(granted);
        for (g, tree) in granted.iter().zip(&mut trees) {
            let constraint = self
                .active
                .get_mut(&g.seq.id)
                .and_then(|a| a.sampler.constraint_mut());
            if let Some(c) = constraint {
                tree.truncate(valid_drafts(tree, c));
            }
        }
        trees
    }
}

/// How many of `tree`'s drafts, in node order, the constraint accepts along their paths from
/// the root: those before the first it rejects. Truncating keeps node numbers (a drafter's own
/// KV is laid out by them); a tree loses the valid nodes after a rejected one too.
fn valid_drafts(tree: &DraftTree, constraint: &mut dyn TokenConstraint) -> usize {
    let parents = tree.parents();
    for n in 1..=tree.len() {
        let mut path = Vec::new();
        let mut at = n;
        while at != 0 {
            path.push(tree.token(at));
            at = parents[at];
        }
        path.reverse();
        if constraint.valid_prefix(&path) < path.len() {
            return n - 1;
        }
    }
    tree.len()
}
