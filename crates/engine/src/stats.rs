//! Live engine statistics, written by the engine thread and admission, read by `/metrics` and
//! `/server_info`.

use speculative::{Algorithm, DrafterCounts, MOST_DRAFTERS};
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
    spec_proposed: AtomicU64,
    spec_accepted: AtomicU64,
    spec_verifications: AtomicU64,
    spec_tree_verifications: AtomicU64,
    spec_steps_on: AtomicU64,
    spec_steps_off: AtomicU64,
    /// Structured outputs: token masks computed, and their nanoseconds.
    grammar_masks: AtomicU64,
    grammar_mask_ns: AtomicU64,
    /// Grammar-forced drafts verified, and those accepted.
    grammar_forced_drafts: AtomicU64,
    grammar_forced_accepted: AtomicU64,
    /// Verifications by drafts accepted (the last bucket counts that many or more).
    accept_hist: [AtomicU64; ACCEPT_BUCKETS],
    /// The adaptive policy's step-cost fit, f64 bits: seconds per step and per work unit.
    cost_a: AtomicU64,
    cost_b: AtomicU64,
    /// What proposing one draft token costs the drafter, f64 seconds' bits.
    draft_cost: AtomicU64,
    /// What catching up on one row costs the drafter, f64 seconds' bits.
    catch_up_cost: AtomicU64,
    /// What the drafter has spent: rows caught up on, and nanoseconds catching up and drafting.
    catch_up_rows: AtomicU64,
    catch_up_ns: AtomicU64,
    draft_ns: AtomicU64,
    /// What the drafter remembers of earlier requests: requests, tokens, bytes.
    drafter_memory: [AtomicU64; 3],
    /// Per drafter of the combination, in order: its index in `Algorithm::DRAFTING` plus one
    /// (0: no drafter there), then its verifications, draft tokens verified and accepted.
    drafters: [[AtomicU64; 4]; MOST_DRAFTERS],
    /// Decode-only steps without drafts ([0]) and with ([1]): nanoseconds in plan, forward and
    /// update, and their count.
    phase_ns: [[AtomicU64; 3]; 2],
    phase_steps: [AtomicU64; 2],
    cache_blocks: AtomicUsize,
    cache_idle_blocks: AtomicUsize,
    cache_evicted_blocks: AtomicU64,
    cache_prompt_tokens: AtomicU64,
    cache_hit_tokens: AtomicU64,
    cache_host_hit_tokens: AtomicU64,
    cache_host_blocks: AtomicUsize,
    cache_demoted_blocks: AtomicU64,
    cache_promoted_blocks: AtomicU64,
    cache_storage_hit_tokens: AtomicU64,
    cache_stored_blocks: AtomicU64,
}

/// Buckets of the accepted-drafts histogram: 0, 1, …, 15, and 16 or more.
pub const ACCEPT_BUCKETS: usize = 17;

/// A copy of the statistics at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
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
    /// Draft tokens proposed and accepted, and verifications (one per speculating sequence and
    /// step).
    pub spec_proposed: u64,
    pub spec_accepted: u64,
    pub spec_verifications: u64,
    /// Verifications of a draft tree with branches (more than one candidate somewhere).
    pub spec_tree_verifications: u64,
    /// Steps with at least one sequence speculating, and decode steps with none.
    pub spec_steps_on: u64,
    pub spec_steps_off: u64,
    /// Structured outputs: token masks computed (one per constrained position sampled or
    /// verified) and the seconds they took together.
    pub grammar_masks: u64,
    pub grammar_mask_seconds: f64,
    /// Structured outputs: drafts of the tokens a grammar forced, verified and accepted (they
    /// are not in the `spec_*` figures).
    pub grammar_forced_drafts: u64,
    pub grammar_forced_accepted: u64,
    pub accept_hist: [u64; ACCEPT_BUCKETS],
    /// The adaptive policy's fit of step time, `a + b·work` seconds (0 without it).
    pub step_cost_a: f64,
    pub step_cost_b: f64,
    /// Seconds the drafter takes per draft token (a moving average; 0 before any draft, and
    /// for prompt lookup, whose guesses are made with the plan).
    pub draft_cost: f64,
    /// Seconds the drafter takes per row it catches up on before drafting (an EAGLE-3 head's
    /// rows for what was decoded while the sequence did not draft; a moving average).
    pub catch_up_cost: f64,
    /// What the drafter has spent since start-up: rows caught up on, and seconds catching up
    /// and proposing drafts (the head's share of speculative steps).
    pub spec_catch_up_rows: u64,
    pub spec_catch_up_seconds: f64,
    pub spec_draft_seconds: f64,
    /// What the drafter remembers of earlier requests (`SUFFIX`'s cache): requests, tokens and
    /// bytes.
    pub spec_cache_requests: u64,
    pub spec_cache_tokens: u64,
    pub spec_cache_bytes: u64,
    /// Each drafter's own figures (a combination has several), in the order given.
    pub spec_drafters: [Option<(Algorithm, DrafterCounts)>; MOST_DRAFTERS],
    /// Where a decode-only step's time goes, without drafts ([0]) and with ([1]): mean
    /// milliseconds in plan (drafting included), forward and update (verification included),
    /// and the steps averaged.
    pub step_phases_ms: [[f64; 3]; 2],
    pub step_phase_counts: [u64; 2],
    /// Prefix cache: blocks held (and of those, idle ones), blocks evicted, and prompt tokens
    /// of admitted requests with those the cache supplied.
    pub cache_blocks: usize,
    pub cache_idle_blocks: usize,
    pub cache_evicted_blocks: u64,
    pub cache_prompt_tokens: u64,
    pub cache_hit_tokens: u64,
    /// Host tier: cached tokens promoted from it, blocks in it, blocks moved there and back.
    pub cache_host_hit_tokens: u64,
    pub cache_host_blocks: usize,
    pub cache_demoted_blocks: u64,
    pub cache_promoted_blocks: u64,
    /// Storage tier: cached tokens read from it, blocks written to it.
    pub cache_storage_hit_tokens: u64,
    pub cache_stored_blocks: u64,
}

impl StatsSnapshot {
    /// Share of admitted prompt tokens the prefix cache supplied (SGLang's `cache_hit_rate`).
    pub fn cache_hit_rate(&self) -> f64 {
        if self.cache_prompt_tokens == 0 {
            0.0
        } else {
            self.cache_hit_tokens as f64 / self.cache_prompt_tokens as f64
        }
    }
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
            spec_proposed: self.spec_proposed.load(Relaxed),
            spec_accepted: self.spec_accepted.load(Relaxed),
            spec_verifications: self.spec_verifications.load(Relaxed),
            spec_tree_verifications: self.spec_tree_verifications.load(Relaxed),
            spec_steps_on: self.spec_steps_on.load(Relaxed),
            spec_steps_off: self.spec_steps_off.load(Relaxed),
            grammar_masks: self.grammar_masks.load(Relaxed),
            grammar_mask_seconds: self.grammar_mask_ns.load(Relaxed) as f64 / 1e9,
            grammar_forced_drafts: self.grammar_forced_drafts.load(Relaxed),
            grammar_forced_accepted: self.grammar_forced_accepted.load(Relaxed),
            accept_hist: std::array::from_fn(|i| self.accept_hist[i].load(Relaxed)),
            step_cost_a: f64::from_bits(self.cost_a.load(Relaxed)),
            step_cost_b: f64::from_bits(self.cost_b.load(Relaxed)),
            draft_cost: f64::from_bits(self.draft_cost.load(Relaxed)),
            catch_up_cost: f64::from_bits(self.catch_up_cost.load(Relaxed)),
            spec_catch_up_rows: self.catch_up_rows.load(Relaxed),
            spec_catch_up_seconds: self.catch_up_ns.load(Relaxed) as f64 / 1e9,
            spec_draft_seconds: self.draft_ns.load(Relaxed) as f64 / 1e9,
            spec_cache_requests: self.drafter_memory[0].load(Relaxed),
            spec_cache_tokens: self.drafter_memory[1].load(Relaxed),
            spec_cache_bytes: self.drafter_memory[2].load(Relaxed),
            spec_drafters: std::array::from_fn(|i| self.drafter(i)),
            step_phases_ms: std::array::from_fn(|k| {
                let n = self.phase_steps[k].load(Relaxed).max(1) as f64;
                std::array::from_fn(|p| self.phase_ns[k][p].load(Relaxed) as f64 / n / 1e6)
            }),
            step_phase_counts: std::array::from_fn(|k| self.phase_steps[k].load(Relaxed)),
            cache_blocks: self.cache_blocks.load(Relaxed),
            cache_idle_blocks: self.cache_idle_blocks.load(Relaxed),
            cache_evicted_blocks: self.cache_evicted_blocks.load(Relaxed),
            cache_prompt_tokens: self.cache_prompt_tokens.load(Relaxed),
            cache_hit_tokens: self.cache_hit_tokens.load(Relaxed),
            cache_host_hit_tokens: self.cache_host_hit_tokens.load(Relaxed),
            cache_host_blocks: self.cache_host_blocks.load(Relaxed),
            cache_demoted_blocks: self.cache_demoted_blocks.load(Relaxed),
            cache_promoted_blocks: self.cache_promoted_blocks.load(Relaxed),
            cache_storage_hit_tokens: self.cache_storage_hit_tokens.load(Relaxed),
            cache_stored_blocks: self.cache_stored_blocks.load(Relaxed),
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

    pub(crate) fn set_cache(&self, c: scheduler::CacheStats) {
        self.cache_blocks.store(c.cached_blocks, Relaxed);
        self.cache_idle_blocks.store(c.idle_blocks, Relaxed);
        self.cache_evicted_blocks.store(c.evicted_blocks, Relaxed);
        self.cache_prompt_tokens.store(c.prompt_tokens, Relaxed);
        self.cache_hit_tokens.store(c.cached_prompt_tokens, Relaxed);
        self.cache_host_hit_tokens
            .store(c.host_prompt_tokens, Relaxed);
        self.cache_host_blocks.store(c.host_blocks, Relaxed);
        self.cache_demoted_blocks.store(c.demoted_blocks, Relaxed);
        self.cache_promoted_blocks.store(c.promoted_blocks, Relaxed);
        self.cache_storage_hit_tokens
            .store(c.storage_prompt_tokens, Relaxed);
        self.cache_stored_blocks.store(c.stored_blocks, Relaxed);
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

    /// A decode-only step (`drafted`: with drafts) took these plan, forward and update times.
    pub(crate) fn add_step_phases(&self, drafted: bool, phases: [std::time::Duration; 3]) {
        let k = usize::from(drafted);
        for (total, d) in self.phase_ns[k].iter().zip(phases) {
            total.fetch_add(d.as_nanos() as u64, Relaxed);
        }
        self.phase_steps[k].fetch_add(1, Relaxed);
    }

    pub(crate) fn add_grammar_masks(&self, masks: u64, seconds: f64) {
        self.grammar_masks.fetch_add(masks, Relaxed);
        self.grammar_mask_ns
            .fetch_add((seconds * 1e9) as u64, Relaxed);
    }

    /// A sequence verified `drafts` grammar-forced drafts and accepted `accepted` of them.
    pub(crate) fn add_forced_drafts(&self, drafts: usize, accepted: usize) {
        self.grammar_forced_drafts.fetch_add(drafts as u64, Relaxed);
        self.grammar_forced_accepted
            .fetch_add(accepted as u64, Relaxed);
    }

    pub(crate) fn add_step(&self) {
        self.steps.fetch_add(1, Relaxed);
    }

    pub(crate) fn add_verification(&self, proposed: usize, accepted: usize, branched: bool) {
        if branched {
            self.spec_tree_verifications.fetch_add(1, Relaxed);
        }
        self.spec_proposed.fetch_add(proposed as u64, Relaxed);
        self.spec_accepted.fetch_add(accepted as u64, Relaxed);
        self.spec_verifications.fetch_add(1, Relaxed);
        self.accept_hist[accepted.min(ACCEPT_BUCKETS - 1)].fetch_add(1, Relaxed);
    }

    /// What the speculator measured so far: the step-cost fit (adaptive only), the drafter's
    /// seconds per draft token and per row caught up on, and its totals since start-up.
    pub(crate) fn set_speculator(&self, spec: &speculative::Speculator) {
        if spec.is_adaptive() {
            let (a, b) = spec.step_cost();
            self.cost_a.store(a.to_bits(), Relaxed);
            self.cost_b.store(b.to_bits(), Relaxed);
        }
        self.draft_cost
            .store(spec.draft_seconds().to_bits(), Relaxed);
        self.catch_up_cost
            .store(spec.catch_up_seconds().to_bits(), Relaxed);
        let spent = spec.spent();
        self.catch_up_rows.store(spent.catch_up_rows, Relaxed);
        self.catch_up_ns
            .store((spent.catch_up_seconds * 1e9) as u64, Relaxed);
        self.draft_ns
            .store((spent.draft_seconds * 1e9) as u64, Relaxed);
        for (slot, d) in self.drafters.iter().zip(spec.drafters()) {
            let index = Algorithm::DRAFTING.iter().position(|&a| a == d.algorithm);
            let c = d.counts;
            for (v, n) in slot.iter().zip([
                index.map_or(0, |i| i as u64 + 1),
                c.chosen,
                c.proposed,
                c.accepted,
            ]) {
                v.store(n, Relaxed);
            }
        }
        let memory = spec.memory();
        for (slot, v) in
            self.drafter_memory
                .iter()
                .zip([memory.requests, memory.tokens, memory.bytes])
        {
            slot.store(v, Relaxed);
        }
    }

    /// Drafter `i` of the combination and its figures, if there is one.
    fn drafter(&self, i: usize) -> Option<(Algorithm, DrafterCounts)> {
        let [index, chosen, proposed, accepted] =
            self.drafters[i].each_ref().map(|v| v.load(Relaxed));
        let algorithm = *Algorithm::DRAFTING.get(usize::try_from(index).ok()?.checked_sub(1)?)?;
        let counts = DrafterCounts {
            chosen,
            proposed,
            accepted,
        };
        Some((algorithm, counts))
    }

    pub(crate) fn add_spec_step(&self, on: bool) {
        let counter = if on {
            &self.spec_steps_on
        } else {
            &self.spec_steps_off
        };
        counter.fetch_add(1, Relaxed);
    }

    pub(crate) fn add_finished(&self) {
        self.finished.fetch_add(1, Relaxed);
    }
}
