//! Continuous batching, as pure bookkeeping: which tokens of which sequences go into the next
//! forward pass. No model, no threads, no clocks: the engine calls [`Scheduler::schedule`], runs
//! the batch, then reports back with [`Scheduler::commit`], [`Scheduler::push_token`] and
//! [`Scheduler::finish`].
//!
//! Each step:
//! 1. every running sequence that is decoding gets its one new token (oldest first);
//! 2. running sequences part-way through their prompt get the next chunk, within the step's
//!    prefill token budget (`chunked_prefill_size`);
//! 3. waiting sequences are admitted, oldest first (preempted ones first of all), while there is
//!    room in the running set, budget and KV blocks.
//!
//! When KV blocks run out for a running sequence, the newest running sequence is preempted: its
//! blocks are freed and it goes back to the front of the queue with its tokens so far, to be
//! recomputed later (the runner is batch-invariant, so recomputing changes nothing). The oldest
//! sequence is never preempted by a newer one, so every admitted sequence makes progress.

mod sequence;

pub use sequence::{SeqId, Sequence};

use kvcache::BlockPool;
use std::collections::VecDeque;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Sequences in the running set at most (SGLang's `--max-running-requests`).
    pub max_running: usize,
    /// Prompt tokens one step prefills at most, over all sequences (`--chunked-prefill-size`).
    pub prefill_budget: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("max running requests must be at least 1")]
    NoRunning,
    #[error("the chunked prefill size must be at least 1 token")]
    NoBudget,
}

impl SchedulerConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_running == 0 {
            return Err(ConfigError::NoRunning);
        }
        if self.prefill_budget == 0 {
            return Err(ConfigError::NoBudget);
        }
        Ok(())
    }
}

/// One sequence's share of a step: feed `tokens[start..start + len]` at positions
/// `start..start + len`; `logits` is true when the chunk ends the known tokens, so the step
/// yields the sequence's next token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduled {
    pub id: SeqId,
    pub start: usize,
    pub len: usize,
    pub logits: bool,
}

/// What a step runs, and what happened while planning it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StepPlan {
    pub batch: Vec<Scheduled>,
    /// Sequences preempted to make room (they are waiting again).
    pub preempted: Vec<SeqId>,
}

impl StepPlan {
    pub fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }

    /// Tokens in the batch.
    pub fn tokens(&self) -> usize {
        self.batch.iter().map(|s| s.len).sum()
    }
}

/// The waiting queue and the running set, over one KV block pool.
pub struct Scheduler {
    config: SchedulerConfig,
    pool: BlockPool,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    preemptions: u64,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("waiting", &self.waiting.len())
            .field("running", &self.running.len())
            .field("pool", &self.pool)
            .finish()
    }
}

impl Scheduler {
    pub fn new(config: SchedulerConfig, pool: BlockPool) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            config,
            pool,
            waiting: VecDeque::new(),
            running: Vec::new(),
            preemptions: 0,
        })
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Queues a new sequence (the engine checked at admission that it can ever fit).
    pub fn add(&mut self, id: SeqId, prompt: Vec<u32>) {
        assert!(!prompt.is_empty(), "a sequence needs at least one token");
        self.waiting.push_back(Sequence::new(id, prompt));
    }

    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Preemptions so far.
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// A sequence, running or waiting.
    pub fn get(&self, id: SeqId) -> Option<&Sequence> {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .find(|s| s.id == id)
    }

    fn running_mut(&mut self, id: SeqId) -> Option<&mut Sequence> {
        self.running.iter_mut().find(|s| s.id == id)
    }

    /// Plans the next step (see the crate docs). An empty plan means there is nothing to run.
    pub fn schedule(&mut self) -> StepPlan {
        let mut plan = StepPlan::default();
        // 1. Decodes, then 2. prompt chunks of running sequences, oldest first.
        let mut budget = self.config.prefill_budget;
        for decoding in [true, false] {
            let mut i = 0;
            while i < self.running.len() {
                let seq = &self.running[i];
                let pending = seq.pending();
                if (pending == 1 && seq.computed() > 0) != decoding {
                    i += 1;
                    continue;
                }
                let len = if decoding { 1 } else { pending.min(budget) };
                if len == 0 {
                    break;
                }
                if !self.reserve(i, len, &mut plan) {
                    // Sequence i itself was preempted (it was the newest): nothing more fits.
                    break;
                }
                let seq = &self.running[i];
                plan.batch.push(Scheduled {
                    id: seq.id,
                    start: seq.computed(),
                    len,
                    logits: len == pending,
                });
                if !decoding {
                    budget -= len;
                }
                i += 1;
            }
        }
        // 3. Admissions, oldest first, without preempting anyone.
        while budget > 0 && self.running.len() < self.config.max_running {
            let Some(seq) = self.waiting.front_mut() else {
                break;
            };
            let len = seq.pending().min(budget);
            if seq.reserve(&self.pool, len).is_err() {
                break;
            }
            let seq = self.waiting.pop_front().expect("front exists");
            plan.batch.push(Scheduled {
                id: seq.id,
                start: seq.computed(),
                len,
                logits: len == seq.pending(),
            });
            budget -= len;
            self.running.push(seq);
        }
        plan
    }

    /// Makes room for `len` more tokens of running sequence `i`, preempting the newest running
    /// sequences while blocks are short. False if `i` itself had to go.
    fn reserve(&mut self, i: usize, len: usize, plan: &mut StepPlan) -> bool {
        loop {
            if self.running[i].reserve(&self.pool, len).is_ok() {
                return true;
            }
            let victim = self.running.len() - 1;
            let mut seq = self.running.pop().expect("sequence i is running");
            seq.release();
            self.preemptions += 1;
            plan.preempted.push(seq.id);
            plan.batch.retain(|s| s.id != seq.id);
            self.waiting.push_front(seq);
            if victim == i {
                return false;
            }
        }
    }

    /// Reserves KV slots for `drafts` draft tokens of a decode of the plan before the drafts
    /// exist (a draft model writes its own KV for them into the same blocks while drafting).
    /// False, and nothing changes, if `id` is not decoding in the plan or its blocks cannot grow.
    /// [`Scheduler::add_drafts`] with at most that many drafts then succeeds.
    pub fn reserve_drafts(&mut self, plan: &StepPlan, id: SeqId, drafts: usize) -> bool {
        if !plan
            .batch
            .iter()
            .any(|b| b.id == id && b.len == 1 && b.logits)
        {
            return false;
        }
        let Some(seq) = self.running.iter_mut().find(|s| s.id == id) else {
            return false;
        };
        drafts > 0 && seq.reserve(&self.pool, 1 + drafts).is_ok()
    }

    /// Adds speculative draft tokens to a decode of the plan: the sequence feeds its last token
    /// and the drafts in this step (`1 + drafts.len()` rows, all wanting logits). False, and
    /// nothing changes, if `id` is not decoding in the plan or its KV blocks cannot grow (a draft
    /// never preempts anyone).
    pub fn add_drafts(&mut self, plan: &mut StepPlan, id: SeqId, drafts: &[u32]) -> bool {
        let Some(entry) = plan
            .batch
            .iter_mut()
            .find(|b| b.id == id && b.len == 1 && b.logits)
        else {
            return false;
        };
        let Some(seq) = self.running.iter_mut().find(|s| s.id == id) else {
            return false;
        };
        if drafts.is_empty() || seq.reserve(&self.pool, 1 + drafts.len()).is_err() {
            return false;
        }
        seq.add_drafts(drafts);
        entry.len = 1 + drafts.len();
        true
    }

    /// After the step that verified `id`'s drafts (and [`Scheduler::commit`]): keeps the drafts
    /// at indices `kept` (the accepted branch, whose KV the caller moved into consecutive
    /// slots) and drops the rest, their KV slots included.
    pub fn resolve_drafts(&mut self, id: SeqId, kept: &[usize]) {
        if let Some(seq) = self.running_mut(id) {
            seq.resolve_drafts(kept);
        }
    }

    /// Records that the step ran: each scheduled sequence's fed tokens now have their KV.
    pub fn commit(&mut self, plan: &StepPlan) {
        for s in &plan.batch {
            if let Some(seq) = self.running_mut(s.id) {
                seq.advance(s.len);
            }
        }
    }

    /// Appends a sampled token to a running sequence (to be fed next step).
    pub fn push_token(&mut self, id: SeqId, token: u32) {
        if let Some(seq) = self.running_mut(id) {
            seq.push(token);
        }
    }

    /// Removes a sequence, running or waiting (finished or aborted), freeing its blocks.
    /// Returns it, or `None` if unknown.
    pub fn finish(&mut self, id: SeqId) -> Option<Sequence> {
        let mut seq = if let Some(i) = self.running.iter().position(|s| s.id == id) {
            self.running.remove(i)
        } else {
            let i = self.waiting.iter().position(|s| s.id == id)?;
            self.waiting.remove(i).expect("index from position")
        };
        seq.release();
        Some(seq)
    }

    /// Every sequence id, running then waiting.
    pub fn ids(&self) -> Vec<SeqId> {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .map(|s| s.id)
            .collect()
    }
}

#[cfg(test)]
mod tests;
