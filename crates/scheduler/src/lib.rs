//! Continuous batching, as pure bookkeeping: which tokens of which sequences go into the next
//! forward pass. No model, no threads, no clocks. A step is one cycle: [`Scheduler::plan`] makes
//! a [`StepPlan`] that holds everything the forward pass needs (each entry's tokens and block
//! table, the drafts being verified with their KV slots reserved, the KV copies between cache
//! tiers to make first); the engine runs it and reports back once with [`Scheduler::update`]
//! (what was computed, which drafts were kept, each sequence's next token, which copies failed).
//! Requests that end leave with [`Scheduler::finish`].
//!
//! Each step:
//! 1. every running sequence that is decoding gets its one new token (oldest first);
//! 2. running sequences part-way through their prompt get the next chunk, within the step's
//!    prefill token budget (`chunked_prefill_size`);
//! 3. waiting sequences are admitted, oldest first (preempted ones first of all), while there is
//!    room in the running set, budget and KV blocks.
//!
//! With the prefix cache on ([`SchedulerConfig::prefix_cache`]), an admitted sequence starts
//! from the longest cached prefix of its tokens ([`kvcache::RadixCache`]) and each step's newly
//! completed full blocks are inserted into the cache, so later sequences (and this one, if
//! preempted) reuse them. A waiting sequence whose next uncached block another running sequence
//! is computing right now waits for it instead of computing it too, so a prefix shared by many
//! requests that arrive together is computed once. `lpm` admits the waiting sequences with the
//! longest cached prefix first. Idle cached blocks are evicted (least recently used first)
//! before anyone is preempted.
//!
//! When KV blocks run out for a running sequence, the newest running sequence is preempted: its
//! blocks are freed and it goes back to the front of the queue with its tokens so far, to be
//! recomputed later (the runner is batch-invariant, so recomputing changes nothing). The oldest
//! sequence is never preempted by a newer one, so every admitted sequence makes progress.

mod draft_tree;
mod sequence;
mod step;

pub use draft_tree::{DraftDistribution, DraftTree};
pub use sequence::{SeqId, Sequence};
pub use step::{DraftPlanner, Granted, Load, StepInput, StepOutcome};

use kvcache::{BlockPool, KvCopy, OutOfBlocks, RadixCache, ToPersist};
use std::collections::{HashMap, VecDeque};

/// The order waiting sequences are admitted in (SGLang's `--schedule-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SchedulePolicy {
    /// Arrival order (preempted sequences first).
    #[default]
    Fcfs,
    /// Longest cached prefix first (arrival order among equals); arrival order without the
    /// prefix cache or with a long queue.
    Lpm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Sequences in the running set at most (SGLang's `--max-running-requests`).
    pub max_running: usize,
    /// Prompt tokens one step prefills at most, over all sequences (`--chunked-prefill-size`).
    pub prefill_budget: usize,
    /// Reuse the KV of cached prefixes (off: `--disable-radix-cache`).
    pub prefix_cache: bool,
    /// Slots of the prefix cache's host tier (`--enable-hierarchical-cache`); 0 for none.
    pub host_blocks: u32,
    pub policy: SchedulePolicy,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_running: 256,
            prefill_budget: 8192,
            prefix_cache: false,
            host_blocks: 0,
            policy: SchedulePolicy::Fcfs,
        }
    }
}

/// Above this many waiting sequences `lpm` admits in arrival order (as SGLang does): matching
/// every waiting prompt against the cache each step would cost more than it saves.
const LPM_MAX_QUEUE: usize = 128;

/// Why the prefix cache could not be flushed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlushError {
    #[error("the prefix cache is off (--disable-radix-cache)")]
    Disabled,
    #[error("{0} requests are running or waiting; flush the cache when the server is idle")]
    Busy(usize),
}

/// The prefix cache's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheStats {
    /// Blocks the cache holds, in use by sequences or not.
    pub cached_blocks: usize,
    /// Of those, blocks no sequence uses (evictable).
    pub idle_blocks: usize,
    /// Blocks dropped from the cache so far, moved to the host tier, and brought back.
    pub evicted_blocks: u64,
    pub demoted_blocks: u64,
    pub promoted_blocks: u64,
    /// Blocks in the host tier, only in the storage tier, and written to storage so far.
    pub host_blocks: usize,
    pub stored_only_blocks: usize,
    pub stored_blocks: u64,
    /// Prompt tokens of admitted sequences, those found in the cache (first admissions), and of
    /// those, the ones promoted from the host tier.
    pub prompt_tokens: u64,
    pub cached_prompt_tokens: u64,
    pub host_prompt_tokens: u64,
    pub storage_prompt_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("--max-running-requests must be at least 1")]
    NoRunning,
    #[error("--chunked-prefill-size must be at least 1 token")]
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
#[derive(Debug, Default, Clone, PartialEq)]
pub struct StepPlan {
    pub batch: Vec<Scheduled>,
    /// Sequences preempted to make room (they are waiting again).
    pub preempted: Vec<SeqId>,
    /// What each batch entry feeds (same order as `batch`; filled by [`Scheduler::plan`]).
    pub inputs: Vec<StepInput>,
    /// The drafts verified this step, by sequence: each is a decode of the batch whose entry
    /// feeds its last token and the drafts (`len` = 1 + drafts), their KV slots reserved.
    pub drafts: HashMap<SeqId, DraftTree>,
    /// KV copies between the prefix cache's tiers, to be made in order before the forward pass
    /// (it could overwrite a block being demoted).
    pub copies: Vec<KvCopy>,
    /// Decoding sequences offered to the draft planner (0 without one).
    pub decodes: usize,
}

impl StepPlan {
    pub fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }

    /// Tokens in the batch.
    pub fn tokens(&self) -> usize {
        self.batch.iter().map(|s| s.len).sum()
    }

    /// Whether every entry decodes (its last token, and its drafts if any): no prompt chunk,
    /// whose rows cost much less each and need no logits.
    pub fn is_decode_only(&self) -> bool {
        self.batch
            .iter()
            .all(|b| b.start > 0 && (b.len == 1 || self.drafts.contains_key(&b.id)))
    }
}

/// The waiting queue and the running set, over one KV block pool.
pub struct Scheduler {
    config: SchedulerConfig,
    pool: BlockPool,
    cache: Option<RadixCache>,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    preemptions: u64,
    prompt_tokens: u64,
    cached_prompt_tokens: u64,
    host_prompt_tokens: u64,
    storage_prompt_tokens: u64,
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
            cache: config.prefix_cache.then(|| match config.host_blocks {
                0 => RadixCache::new(pool.clone()),
                n => {
                    let host = BlockPool::with_blocks(pool.block_size(), n)
                        .expect("a host tier of at least one block");
                    RadixCache::with_host_tier(pool.clone(), host)
                }
            }),
            pool,
            waiting: VecDeque::new(),
            running: Vec::new(),
            preemptions: 0,
            prompt_tokens: 0,
            cached_prompt_tokens: 0,
            host_prompt_tokens: 0,
            storage_prompt_tokens: 0,
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

    /// The prefix cache's counters (zeros when it is off).
    pub fn cache_stats(&self) -> CacheStats {
        let mut stats = CacheStats {
            prompt_tokens: self.prompt_tokens,
            cached_prompt_tokens: self.cached_prompt_tokens,
            ..CacheStats::default()
        };
        stats.host_prompt_tokens = self.host_prompt_tokens;
        stats.storage_prompt_tokens = self.storage_prompt_tokens;
        if let Some(c) = &self.cache {
            let r = c.stats();
            stats.cached_blocks = r.device_blocks;
            stats.idle_blocks = r.idle_blocks;
            stats.host_blocks = r.host_blocks;
            stats.evicted_blocks = r.evicted;
            stats.demoted_blocks = r.demoted;
            stats.promoted_blocks = r.promoted;
            stats.stored_only_blocks = r.stored_blocks;
            stats.stored_blocks = r.stored;
        }
        stats
    }

    /// Gives the prefix cache a storage tier (it needs the host tier); false without one.
    pub fn enable_storage(&mut self) -> bool {
        match self.cache.as_mut() {
            Some(c) if self.config.host_blocks > 0 => {
                c.enable_storage();
                true
            }
            _ => false,
        }
    }

    /// Puts a stored block (its whole token path) back into the prefix cache; false if its
    /// parent is missing or there is no cache.
    pub fn restore_stored(&mut self, tokens: &[u32]) -> bool {
        self.cache.as_mut().is_some_and(|c| c.restore(tokens))
    }

    /// Drops the cached node holding device block `block` (and what follows it): its KV is not
    /// valid (it could not be read back).
    pub(crate) fn forget_cached_block(&mut self, block: u32) {
        if let Some(c) = self.cache.as_mut() {
            c.forget_device_block(kvcache::BlockId(block));
        }
    }

    /// Releases the blocks pinned for storage reads, once the engine has made the copies.
    pub(crate) fn unpin_cache_blocks(&mut self) {
        if let Some(c) = self.cache.as_mut() {
            c.unpin();
        }
    }

    /// Sends a running sequence back to the front of the queue without its blocks, to be
    /// recomputed (as a preemption does), e.g. after its cached prefix turned out unreadable.
    pub(crate) fn requeue(&mut self, id: SeqId) {
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            let mut seq = self.running.remove(i);
            seq.release();
            self.waiting.push_front(seq);
        }
    }

    /// Every cached block the storage tier lacks, to be written now (see
    /// [`RadixCache::persist`]).
    pub fn persist_cache(&mut self) -> Vec<ToPersist> {
        self.cache
            .as_mut()
            .map(RadixCache::persist)
            .unwrap_or_default()
    }

    /// The KV copies between the prefix cache's tiers that planning (and draft reservations)
    /// queued, in the order the runner must make them, before the step's forward pass.
    pub(crate) fn take_copies(&mut self) -> Vec<KvCopy> {
        self.cache
            .as_mut()
            .map(RadixCache::take_copies)
            .unwrap_or_default()
    }

    /// Empties the prefix cache (SGLang's `/flush_cache`): only while nothing runs or waits, so
    /// no request loses a prefix it was about to use. Returns the blocks dropped.
    pub fn flush_cache(&mut self) -> Result<usize, FlushError> {
        let busy = self.running.len() + self.waiting.len();
        let cache = self.cache.as_mut().ok_or(FlushError::Disabled)?;
        if busy > 0 {
            return Err(FlushError::Busy(busy));
        }
        Ok(cache.clear())
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
    pub(crate) fn schedule(&mut self) -> StepPlan {
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
        // 3. Admissions, without preempting anyone.
        self.order_waiting();
        let mut i = 0;
        while budget > 0 && self.running.len() < self.config.max_running && i < self.waiting.len() {
            let bs = self.pool.block_size();
            let seq = &mut self.waiting[i];
            if let Some(cache) = self.cache.as_mut().filter(|_| !seq.has_blocks()) {
                let tokens = seq.tokens();
                let known = &tokens[..tokens.len() - 1];
                // Its next block is being computed by a running sequence: wait for it.
                let next = cache.prefix_len(known) / bs + 1;
                if next * bs < tokens.len() {
                    let shared = &tokens[..next * bs];
                    if self
                        .running
                        .iter()
                        .any(|r| r.pending_prefix(bs, next) == Some(shared))
                    {
                        i += 1;
                        continue;
                    }
                }
                let reuse = cache.acquire(known);
                seq.start_from(reuse);
            }
            let len = seq.pending().min(budget);
            if reserve_evicting(seq, &self.pool, self.cache.as_mut(), len).is_err() {
                // Not now; it keeps no blocks while it waits.
                seq.release();
                break;
            }
            let mut seq = self.waiting.remove(i).expect("index in range");
            if let Some((prompt, cached, from_host, from_storage)) = seq.admitted() {
                self.prompt_tokens += prompt as u64;
                self.cached_prompt_tokens += cached as u64;
                self.host_prompt_tokens += from_host as u64;
                self.storage_prompt_tokens += from_storage as u64;
            }
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

    /// For `lpm`: the waiting queue sorted by cached prefix length, longest first (a stable
    /// sort, so arrival order among equals; preempted sequences stay in front).
    fn order_waiting(&mut self) {
        let Some(cache) = self.cache.as_ref() else {
            return;
        };
        if self.config.policy != SchedulePolicy::Lpm
            || self.waiting.len() < 2
            || self.waiting.len() > LPM_MAX_QUEUE
        {
            return;
        }
        let mut keyed: Vec<(bool, usize, Sequence)> = self
            .waiting
            .drain(..)
            .map(|s| {
                let t = s.tokens();
                (s.has_started(), cache.prefix_len(&t[..t.len() - 1]), s)
            })
            .collect();
        keyed.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
        self.waiting.extend(keyed.into_iter().map(|(_, _, s)| s));
    }

    /// Makes room for `len` more tokens of running sequence `i`, evicting idle cached blocks and
    /// then preempting the newest running sequences while blocks are short. False if `i` itself
    /// had to go.
    fn reserve(&mut self, i: usize, len: usize, plan: &mut StepPlan) -> bool {
        loop {
            if reserve_evicting(&mut self.running[i], &self.pool, self.cache.as_mut(), len).is_ok()
            {
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
    pub(crate) fn reserve_drafts(&mut self, plan: &StepPlan, id: SeqId, drafts: usize) -> bool {
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
        drafts > 0 && reserve_evicting(seq, &self.pool, self.cache.as_mut(), 1 + drafts).is_ok()
    }

    /// Adds speculative draft tokens to a decode of the plan: the sequence feeds its last token
    /// and the drafts in this step (`1 + drafts.len()` rows, all wanting logits). False, and
    /// nothing changes, if `id` is not decoding in the plan or its KV blocks cannot grow (a draft
    /// never preempts anyone).
    pub(crate) fn add_drafts(&mut self, plan: &mut StepPlan, id: SeqId, drafts: &[u32]) -> bool {
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
        if drafts.is_empty()
            || reserve_evicting(seq, &self.pool, self.cache.as_mut(), 1 + drafts.len()).is_err()
        {
            return false;
        }
        seq.add_drafts(drafts);
        entry.len = 1 + drafts.len();
        true
    }

    /// After the step that verified `id`'s drafts (and [`Scheduler::commit`]): keeps the drafts
    /// at indices `kept` (the accepted branch, whose KV the caller moved into consecutive
    /// slots) and drops the rest, their KV slots included.
    pub(crate) fn resolve_drafts(&mut self, id: SeqId, kept: &[usize]) {
        if let Some(seq) = self.running_mut(id) {
            seq.resolve_drafts(kept);
        }
    }

    /// Records that the step ran: each scheduled sequence's fed tokens now have their KV, and
    /// the full blocks they completed (drafts aside) go into the prefix cache.
    pub(crate) fn commit(&mut self, plan: &StepPlan) {
        for s in &plan.batch {
            let Some(seq) = self.running.iter_mut().find(|q| q.id == s.id) else {
                continue;
            };
            seq.advance(s.len);
            if let Some(cache) = self.cache.as_mut() {
                seq.cache_blocks(cache);
            }
        }
    }

    /// Appends a sampled token to a running sequence (to be fed next step).
    pub(crate) fn push_token(&mut self, id: SeqId, token: u32) {
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

/// Makes sure `seq` has slots for its next `len` tokens, evicting idle cached blocks if the
/// pool is short.
fn reserve_evicting(
    seq: &mut Sequence,
    pool: &BlockPool,
    cache: Option<&mut RadixCache>,
    len: usize,
) -> Result<(), OutOfBlocks> {
    match seq.reserve(pool, len) {
        Err(short) if cache.is_some() => {
            let cache = cache.expect("checked");
            cache.evict(short.needed - short.free);
            seq.reserve(pool, len)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests;
