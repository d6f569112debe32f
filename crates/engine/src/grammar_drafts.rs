//! Speculation under structured output. A sequence's drafts that its grammar rejects are cut
//! before verification (the mask would reject them for sure), so no rows are spent on them; and
//! a sequence the speculator does not draft (speculation off, no n-gram match) drafts the tokens
//! its grammar forces (a schema's keys, JSON punctuation): free drafts, verified like any other,
//! so the output is what it would be without them.

use crate::active::Active;
use model::sampler::TokenConstraint;
use scheduler::{DraftPlanner, DraftTree, Granted, Load, SeqId, Sequence, StepPlan};
use speculative::Speculator;
use std::collections::{HashMap, HashSet};

/// Grammar-forced drafts a sequence verifies per step at most.
pub(crate) const MAX_FORCED_DRAFTS: usize = 8;

/// The scheduler's planner: the speculator (if any), with each sequence's drafts checked against
/// its grammar, and grammar-forced drafts for the sequences it leaves out.
pub(crate) struct GrammarGuard<'a> {
    spec: Option<&'a mut Speculator>,
    active: &'a mut HashMap<SeqId, Active>,
    /// Whether sequences the speculator leaves out draft what their grammar forces.
    forced_drafts: bool,
    /// This step's forced drafts, asked for in `slots`.
    forced: HashMap<SeqId, Vec<u32>>,
    /// The sequences whose granted drafts are forced ones (verified without the speculator).
    drafted: HashSet<SeqId>,
}

impl<'a> GrammarGuard<'a> {
    pub(crate) fn new(
        spec: Option<&'a mut Speculator>,
        active: &'a mut HashMap<SeqId, Active>,
        forced_drafts: bool,
    ) -> Self {
        Self {
            spec,
            active,
            forced_drafts,
            forced: HashMap::new(),
            drafted: HashSet::new(),
        }
    }

    /// The sequences granted forced drafts this step.
    pub(crate) fn into_forced(self) -> HashSet<SeqId> {
        self.drafted
    }

    /// `seq`'s forced drafts, if it may have them: it has a grammar that forces tokens, room
    /// under its `max_tokens`, and no drafter keeping state of its own for it (an EAGLE-3
    /// head's KV follows the drafts it made itself).
    fn forced_for(&mut self, seq: &Sequence) -> Vec<u32> {
        if self.spec.as_ref().is_some_and(|s| s.captures(seq.id)) {
            return Vec::new();
        }
        let Some(a) = self.active.get_mut(&seq.id) else {
            return Vec::new();
        };
        // Never past max_tokens: the bonus token comes on top of the drafts.
        let room = (a.request.max_tokens)
            .saturating_sub(seq.generated().len() + 1)
            .min(MAX_FORCED_DRAFTS);
        match a.sampler.constraint_mut() {
            Some(c) if room > 0 => {
                let mut tokens = c.forced();
                tokens.truncate(room);
                tokens
            }
            _ => Vec::new(),
        }
    }
}

impl DraftPlanner for GrammarGuard<'_> {
    fn slots(&mut self, plan: &StepPlan, decoding: &[&Sequence], load: Load) -> Vec<usize> {
        let mut slots = match self.spec.as_deref_mut() {
            Some(spec) => spec.slots(plan, decoding, load),
            None => vec![0; decoding.len()],
        };
        self.forced.clear();
        self.drafted.clear();
        if !self.forced_drafts {
            return slots;
        }
        for (seq, n) in decoding.iter().zip(&mut slots) {
            if *n == 0 {
                let tokens = self.forced_for(seq);
                if !tokens.is_empty() {
                    *n = tokens.len();
                    self.forced.insert(seq.id, tokens);
                }
            }
        }
        slots
    }

    fn draft(&mut self, granted: &[Granted<'_>]) -> Vec<DraftTree> {
        let mut speculated = match self.spec.as_deref_mut() {
            // The usual step: every grant is the speculator's (no copies made).
            Some(spec) if self.forced.is_empty() => spec.draft(granted).into_iter(),
            Some(spec) => {
                let own: Vec<Granted<'_>> = granted
                    .iter()
                    .filter(|g| !self.forced.contains_key(&g.seq.id))
                    .cloned()
                    .collect();
                spec.draft(&own).into_iter()
            }
            None => Vec::new().into_iter(),
        };
        let mut trees = Vec::with_capacity(granted.len());
        for g in granted {
            let id = g.seq.id;
            if let Some(tokens) = self.forced.remove(&id) {
                self.drafted.insert(id);
                trees.push(DraftTree::chain(tokens));
                continue;
            }
            let mut tree = speculated.next().unwrap_or_default();
            let constraint = self
                .active
                .get_mut(&id)
                .and_then(|a| a.sampler.constraint_mut());
            if let Some(c) = constraint {
                tree.truncate(valid_drafts(&tree, c));
            }
            trees.push(tree);
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
