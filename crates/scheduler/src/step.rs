//! One step's cycle as the engine sees it: [`Scheduler::plan`] makes the whole plan (batch,
//! drafts with their KV slots, what each entry feeds, the tier copies), the engine runs it, and
//! [`Scheduler::update`] applies what happened. Speculative decoding takes part in planning
//! through [`DraftPlanner`], so the plan never needs repairing after it is made.

use crate::{DraftTree, Scheduler, SeqId, Sequence, StepPlan};
use std::collections::HashMap;

/// What one batch entry feeds the forward pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepInput {
    /// `tokens[start..start + len]` of the sequence (for a decode with drafts: its last token,
    /// then the drafts).
    pub tokens: Vec<u32>,
    /// The sequence's KV block table, covering every position the entry writes.
    pub blocks: Vec<u32>,
    /// Prompt tokens the prefix cache supplied at the first admission (`None` before it).
    pub cached_prompt_tokens: Option<usize>,
}

/// The running and waiting counts when a plan is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    pub running: usize,
    pub waiting: usize,
}

/// A decoding sequence whose draft slots are reserved.
#[derive(Debug, Clone)]
pub struct Granted<'a> {
    pub seq: &'a Sequence,
    /// Its KV block table, with slots for its last token and the slots granted.
    pub blocks: Vec<u32>,
}

/// Speculative decoding's part in planning (implemented by `speculative::Speculator`).
pub trait DraftPlanner {
    /// The draft KV slots each of the plan's decoding sequences asks for (`decoding[i]`'s at
    /// `[i]`; 0 for none), given the plan so far (decodes, prompt chunks, admissions).
    fn slots(&mut self, plan: &StepPlan, decoding: &[&Sequence], load: Load) -> Vec<usize>;
    /// Drafts for the sequences granted their slots (`granted[i]`'s at `[i]`; empty for none),
    /// at most as many tokens as it asked slots for; called after every `slots`, with nothing
    /// granted too. A drafter may write its own KV for them into the reserved slots.
    fn draft(&mut self, granted: &[Granted<'_>]) -> Vec<DraftTree>;
}

/// What the engine did with a plan, reported once through [`Scheduler::update`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StepOutcome {
    /// Device blocks a copy from the storage tier could not fill: the cache forgets them and
    /// the sequences holding them are recomputed.
    pub unreadable: Vec<u32>,
    /// Whether the forward pass ran and wrote the batch's KV (false: nothing is committed).
    pub ran: bool,
    /// For each sequence whose drafts were verified: the indices of the drafts kept (the
    /// accepted branch, whose KV the engine moved into consecutive slots after the root).
    pub kept: HashMap<SeqId, Vec<usize>>,
    /// The token each continuing sequence feeds next (the one it sampled).
    pub next: Vec<(SeqId, u32)>,
}

impl Scheduler {
    /// Plans the next step: the batch (see the crate docs), then drafts for its decodes when
    /// `drafts` is given (slots reserved without preempting anyone), then what each entry
    /// feeds and the copies between cache tiers. An empty batch means there is nothing to run
    /// (the copies are still to be made).
    pub fn plan(&mut self, drafts: Option<&mut dyn DraftPlanner>) -> StepPlan {
        let mut plan = self.schedule();
        if let Some(planner) = drafts {
            self.add_planned_drafts(&mut plan, planner);
        }
        let index = self.running_index();
        plan.inputs = plan
            .batch
            .iter()
            .map(|b| {
                let seq = index[&b.id];
                StepInput {
                    tokens: seq.tokens()[b.start..b.start + b.len].to_vec(),
                    blocks: seq.block_ids(),
                    cached_prompt_tokens: seq.cached_prompt_tokens(),
                }
            })
            .collect();
        plan.copies = self.take_copies();
        plan
    }

    /// Asks the planner which decodes speculate, reserves their slots and adds the drafts.
    fn add_planned_drafts(&mut self, plan: &mut StepPlan, planner: &mut dyn DraftPlanner) {
        let decoding: Vec<SeqId> = plan
            .batch
            .iter()
            .filter(|b| b.len == 1 && b.logits && b.start > 0)
            .map(|b| b.id)
            .collect();
        plan.decodes = decoding.len();
        if decoding.is_empty() {
            return;
        }
        let load = Load {
            running: self.running_len(),
            waiting: self.waiting_len(),
        };
        let index = self.running_index();
        let seqs: Vec<&Sequence> = decoding.iter().map(|id| index[id]).collect();
        let slots = planner.slots(plan, &seqs, load);
        let granted_ids: Vec<SeqId> = decoding
            .iter()
            .zip(slots)
            .filter(|&(&id, n)| n > 0 && self.reserve_drafts(plan, id, n))
            .map(|(&id, _)| id)
            .collect();
        if granted_ids.is_empty() {
            planner.draft(&[]);
            return;
        }
        let index = self.running_index();
        let granted: Vec<Granted<'_>> = granted_ids
            .iter()
            .map(|id| index[id])
            .map(|seq| Granted {
                seq,
                blocks: seq.block_ids(),
            })
            .collect();
        let trees = planner.draft(&granted);
        for (id, tree) in granted_ids.into_iter().zip(trees) {
            // Within the reserved slots, so this cannot fail.
            if !tree.is_empty() && self.add_drafts(plan, id, tree.tokens()) {
                plan.drafts.insert(id, tree);
            }
        }
    }

    /// The running sequences by id (one pass, for a step's lookups).
    fn running_index(&self) -> HashMap<SeqId, &Sequence> {
        self.running.iter().map(|s| (s.id, s)).collect()
    }

    /// The running sequences holding any of `blocks` (device block ids).
    pub fn holders(&self, blocks: &[u32]) -> Vec<SeqId> {
        if blocks.is_empty() {
            return Vec::new();
        }
        let mut ids: Vec<SeqId> = self
            .running
            .iter()
            .filter(|s| s.block_ids().iter().any(|b| blocks.contains(b)))
            .map(|s| s.id)
            .collect();
        ids.sort();
        ids
    }

    /// Applies what the engine did with `plan`: forgets unreadable cached blocks and sends
    /// their holders back to be recomputed, releases the blocks pinned for the copies, and (if
    /// the forward pass ran) records the batch's KV as computed, keeps the accepted drafts and
    /// appends each sequence's next token. Returns the sequences sent back.
    pub fn update(&mut self, plan: &StepPlan, outcome: &StepOutcome) -> Vec<SeqId> {
        // A block that could not be read back holds nothing valid. It is still pinned, so the
        // sequences holding it are the ones that took the prefix.
        let lost = self.holders(&outcome.unreadable);
        for &block in &outcome.unreadable {
            self.forget_cached_block(block);
        }
        self.unpin_cache_blocks();
        for &id in &lost {
            self.requeue(id);
        }
        if outcome.ran {
            // Requeued sequences are not running: commit skips them.
            self.commit(plan);
            for (&id, kept) in &outcome.kept {
                self.resolve_drafts(id, kept);
            }
            for &(id, token) in &outcome.next {
                self.push_token(id, token);
            }
        }
        lost
    }
}
