//! Live engine statistics, written by the engine thread and admission, read by `/metrics` and
//! `/server_info`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

#[derive(Debug, Default)]
pub struct EngineStats {
    in_flight: AtomicUsize,
    running: AtomicUsize,
    queued: AtomicUsize,
    kv_used_blocks: AtomicUsize,
    kv_total_blocks: AtomicUsize,
    preemptions: AtomicU64,
    aborted: AtomicU64,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    steps: AtomicU64,
    finished: AtomicU64,
}

/// A copy of the statistics at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatsSnapshot {
    /// Admitted and not yet finished (running, queued, or on their way to the engine).
    pub in_flight: usize,
    pub running: usize,
    pub queued: usize,
    pub kv_used_blocks: usize,
    pub kv_total_blocks: usize,
    pub preemptions: u64,
    /// Requests ended because their client went away.
    pub aborted: u64,
    /// Prompt tokens of every request the engine has received.
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub steps: u64,
    pub finished: u64,
}

impl EngineStats {
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            in_flight: self.in_flight.load(Relaxed),
            running: self.running.load(Relaxed),
            queued: self.queued.load(Relaxed),
            kv_used_blocks: self.kv_used_blocks.load(Relaxed),
            kv_total_blocks: self.kv_total_blocks.load(Relaxed),
            preemptions: self.preemptions.load(Relaxed),
            aborted: self.aborted.load(Relaxed),
            prompt_tokens: self.prompt_tokens.load(Relaxed),
            generation_tokens: self.generation_tokens.load(Relaxed),
            steps: self.steps.load(Relaxed),
            finished: self.finished.load(Relaxed),
        }
    }

    /// Takes one admission slot if fewer than `capacity` are taken.
    pub(crate) fn try_admit(&self, capacity: usize) -> bool {
        self.in_flight
            .fetch_update(Relaxed, Relaxed, |n| (n < capacity).then_some(n + 1))
            .is_ok()
    }

    pub(crate) fn release_admission(&self) {
        self.in_flight.fetch_sub(1, Relaxed);
    }

    pub(crate) fn set_kv_total(&self, blocks: usize) {
        self.kv_total_blocks.store(blocks, Relaxed);
    }

    pub(crate) fn set_load(&self, running: usize, queued: usize, kv_used: usize) {
        self.running.store(running, Relaxed);
        self.queued.store(queued, Relaxed);
        self.kv_used_blocks.store(kv_used, Relaxed);
    }

    pub(crate) fn add_preemptions(&self, n: u64) {
        self.preemptions.fetch_add(n, Relaxed);
    }

    pub(crate) fn add_aborted(&self) {
        self.aborted.fetch_add(1, Relaxed);
    }

    pub(crate) fn add_prompt_tokens(&self, n: usize) {
        self.prompt_tokens.fetch_add(n as u64, Relaxed);
    }

    pub(crate) fn add_generation_tokens(&self, n: usize) {
        self.generation_tokens.fetch_add(n as u64, Relaxed);
    }

    pub(crate) fn add_step(&self) {
        self.steps.fetch_add(1, Relaxed);
    }

    pub(crate) fn add_finished(&self) {
        self.finished.fetch_add(1, Relaxed);
    }
}
