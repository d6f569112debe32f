//! The scheduler's tests: requests run to completion against a stand-in model, through chunked
//! prefill, preemption, drafts and the prefix cache, with its invariants checked at every step.

use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

/// A stand-in model: the next token is a hash of everything before it, so any mistake in what
/// was fed (a skipped chunk, a wrong position after preemption) changes the output.
fn next_token(context: &[u32]) -> u32 {
    context
        .iter()
        .fold(17u32, |h, &t| h.wrapping_mul(31).wrapping_add(t))
        % 1000
}

struct Request {
    prompt: Vec<u32>,
    max_new: usize,
}

/// Runs requests arriving at given steps to completion; returns each one's generated tokens
/// and the preemptions, checking the scheduler's invariants at every step.
///
/// The "KV cache" is a store of token slots per block: a step writes each fed token into its
/// slot, and a sequence's next token is computed from what its block table reads back, so
/// wrong sharing (a cached block with other tokens, a shared block overwritten) changes the
/// output.
fn simulate(
    config: SchedulerConfig,
    blocks: u32,
    arrivals: &[(usize, Request)],
) -> (HashMap<u64, Vec<u32>>, u64) {
    simulate_counting(config, blocks, arrivals).0
}

/// [`simulate`], also returning the prompt tokens the steps computed.
fn simulate_counting(
    config: SchedulerConfig,
    blocks: u32,
    arrivals: &[(usize, Request)],
) -> ((HashMap<u64, Vec<u32>>, u64), usize) {
    const BS: usize = 4;
    let pool = BlockPool::with_blocks(BS, blocks).unwrap();
    let mut s = Scheduler::new(config, pool.clone()).unwrap();
    let mut store: Vec<[Option<u32>; BS]> = vec![[None; BS]; blocks as usize];
    let mut host_store: Vec<[Option<u32>; BS]> = vec![[None; BS]; config.host_blocks as usize];
    let mut max_new: HashMap<u64, usize> = HashMap::new();
    let mut done = HashMap::new();
    let (mut step, mut next, mut prompt_computed) = (0, 0, 0);
    while next < arrivals.len() || !s.is_idle() {
        while next < arrivals.len() && arrivals[next].0 <= step {
            let id = next as u64;
            s.add(SeqId(id), arrivals[next].1.prompt.clone());
            max_new.insert(id, arrivals[next].1.max_new);
            next += 1;
        }
        let plan = s.schedule();
        for copy in s.take_copies() {
            match copy {
                kvcache::KvCopy::ToHost { device, host } => {
                    host_store[host.index()] = store[device.index()];
                }
                kvcache::KvCopy::ToDevice { host, device } => {
                    store[device.index()] = host_store[host.index()];
                }
                other => unreachable!("no storage tier here: {other:?}"),
            }
        }
        let prefill: usize = plan.batch.iter().filter(|b| b.len > 1).map(|b| b.len).sum();
        assert!(prefill <= config.prefill_budget, "budget exceeded");
        assert!(s.running_len() <= config.max_running);
        let mut sampled = Vec::new();
        for b in &plan.batch {
            let seq = s.get(b.id).unwrap();
            assert_eq!(seq.computed(), b.start, "chunks must be contiguous");
            let table = seq.block_ids();
            assert!(table.len() * BS >= b.start + b.len, "slots reserved");
            for pos in b.start..b.start + b.len {
                let (block, at) = (table[pos / BS], pos % BS);
                let token = seq.tokens()[pos];
                let slot = &mut store[block as usize][at];
                assert!(
                    pool.ref_count(kvcache::BlockId(block)) == 1 || *slot == Some(token),
                    "a shared block overwritten"
                );
                *slot = Some(token);
                if pos < seq.prompt_len() {
                    prompt_computed += 1;
                }
            }
            if b.logits {
                let kv: Vec<u32> = (0..b.start + b.len)
                    .map(|p| store[table[p / BS] as usize][p % BS].expect("slot written"))
                    .collect();
                assert_eq!(kv, seq.tokens(), "the KV read back is the sequence's");
                sampled.push((b.id, next_token(&kv)));
            }
        }
        s.commit(&plan);
        for (id, tok) in sampled {
            s.push_token(id, tok);
            let seq = s.get(id).unwrap();
            if seq.generated().len() == max_new[&id.0] {
                let seq = s.finish(id).unwrap();
                done.insert(id.0, seq.generated().to_vec());
            }
        }
        step += 1;
        assert!(step < 100_000, "no progress");
    }
    pool.assert_consistent();
    assert_eq!(
        pool.used_blocks(),
        s.cache_stats().cached_blocks,
        "blocks leaked"
    );
    if config.prefix_cache {
        s.flush_cache().unwrap();
    }
    assert_eq!(pool.used_blocks(), 0, "blocks leaked");
    ((done, s.preemptions()), prompt_computed)
}

fn requests(spec: &[(usize, usize, usize)]) -> Vec<(usize, Request)> {
    spec.iter()
        .enumerate()
        .map(|(i, &(at, plen, max_new))| {
            let prompt = (0..plen as u32).map(|t| t * 7 + i as u32).collect();
            (at, Request { prompt, max_new })
        })
        .collect()
}

#[test]
fn chunked_prefill_joins_running_decodes() {
    let config = SchedulerConfig {
        max_running: 8,
        prefill_budget: 6,
        ..SchedulerConfig::default()
    };
    let pool = BlockPool::with_blocks(4, 64).unwrap();
    let mut s = Scheduler::new(config, pool).unwrap();
    s.add(SeqId(1), vec![1, 2, 3]);
    let plan = s.schedule();
    assert_eq!(
        plan.batch,
        [Scheduled {
            id: SeqId(1),
            start: 0,
            len: 3,
            logits: true
        }]
    );
    s.commit(&plan);
    s.push_token(SeqId(1), 9);
    s.add(SeqId(2), (0..10).collect());
    // Seq 1 decodes its one token; seq 2's 10-token prompt is cut to the budget of 6.
    let plan = s.schedule();
    assert_eq!(
        plan.batch,
        [
            Scheduled {
                id: SeqId(1),
                start: 3,
                len: 1,
                logits: true
            },
            Scheduled {
                id: SeqId(2),
                start: 0,
                len: 6,
                logits: false
            }
        ]
    );
    s.commit(&plan);
    s.push_token(SeqId(1), 4);
    let plan = s.schedule();
    assert_eq!(plan.batch[1].start, 6);
    assert_eq!(plan.batch[1].len, 4);
    assert!(plan.batch[1].logits);
}

#[test]
fn the_newest_sequence_is_preempted_and_recomputed_with_the_same_result() {
    let config = SchedulerConfig {
        max_running: 4,
        prefill_budget: 16,
        ..SchedulerConfig::default()
    };
    let spec = [(0, 5, 20), (0, 6, 20), (1, 3, 20), (2, 7, 20)];
    // 12 blocks of 4 tokens: too few for four 25-token sequences at once.
    let (tight, preemptions) = simulate(config, 12, &requests(&spec));
    assert!(preemptions > 0, "the pool was meant to run short");
    let (roomy, none) = simulate(config, 1000, &requests(&spec));
    assert_eq!(none, 0);
    assert_eq!(tight, roomy);
    assert!(tight.values().all(|g| g.len() == 20));
}

#[test]
fn the_running_set_is_capped_and_the_rest_wait() {
    let config = SchedulerConfig {
        max_running: 2,
        prefill_budget: 100,
        ..SchedulerConfig::default()
    };
    let pool = BlockPool::with_blocks(4, 100).unwrap();
    let mut s = Scheduler::new(config, pool).unwrap();
    for i in 0..5 {
        s.add(SeqId(i), vec![1, 2]);
    }
    let plan = s.schedule();
    assert_eq!(plan.batch.len(), 2);
    assert_eq!((s.running_len(), s.waiting_len()), (2, 3));
    // Aborting a waiting and a running sequence frees their places.
    assert!(s.finish(SeqId(4)).is_some());
    s.commit(&plan);
    assert!(s.finish(SeqId(0)).is_some());
    assert!(s.finish(SeqId(0)).is_none());
    let plan = s.schedule();
    assert_eq!(plan.batch.iter().filter(|b| b.id == SeqId(2)).count(), 1);
    assert_eq!(s.pool().used_blocks(), 2);
}

#[test]
fn bad_configs_are_refused() {
    let pool = BlockPool::with_blocks(4, 4).unwrap();
    let zero = SchedulerConfig {
        max_running: 0,
        prefill_budget: 1,
        ..SchedulerConfig::default()
    };
    assert_eq!(
        Scheduler::new(zero, pool.clone()).unwrap_err(),
        ConfigError::NoRunning
    );
    let no_budget = SchedulerConfig {
        max_running: 1,
        prefill_budget: 0,
        ..SchedulerConfig::default()
    };
    assert_eq!(
        Scheduler::new(no_budget, pool).unwrap_err(),
        ConfigError::NoBudget
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random arrivals over a pool that fits any one sequence: everything finishes, nothing
    /// leaks, and the output is what an unconstrained run gives.
    #[test]
    fn every_sequence_finishes_with_the_unconstrained_output(
        spec in prop::collection::vec((0usize..20, 1usize..30, 1usize..20), 1..12),
        max_running in 1usize..6,
        budget in 1usize..40,
        blocks in 13u32..40,
        prefix_cache in any::<bool>(),
        lpm in any::<bool>(),
    ) {
        let policy = if lpm { SchedulePolicy::Lpm } else { SchedulePolicy::Fcfs };
        let config = SchedulerConfig { max_running, prefill_budget: budget, prefix_cache, policy, host_blocks: 0 };
        let (got, _) = simulate(config, blocks, &requests(&spec));
        let roomy = SchedulerConfig { max_running: 64, prefill_budget: 1000, ..SchedulerConfig::default() };
        let (want, _) = simulate(roomy, 10_000, &requests(&spec));
        prop_assert_eq!(got, want);
    }
}

/// A scheduler over `pool` whose one sequence (prompt [1, 2, 3], then token 4) is decoding in
/// the returned plan.
fn decoding_one(pool: &BlockPool) -> (Scheduler, StepPlan) {
    let config = SchedulerConfig {
        max_running: 4,
        prefill_budget: 64,
        ..SchedulerConfig::default()
    };
    let mut s = Scheduler::new(config, pool.clone()).unwrap();
    s.add(SeqId(1), vec![1, 2, 3]);
    let plan = s.schedule();
    s.commit(&plan);
    s.push_token(SeqId(1), 4);
    let plan = s.schedule();
    (s, plan)
}

#[test]
fn drafts_ride_along_a_decode_and_rejected_ones_leave_no_trace() {
    let pool = BlockPool::with_blocks(4, 8).unwrap();
    let (mut s, mut plan) = decoding_one(&pool);
    assert_eq!(plan.batch[0].len, 1);
    // Not decoding in this plan: refused.
    assert!(!s.add_drafts(&mut plan, SeqId(9), &[5]));
    assert!(s.add_drafts(&mut plan, SeqId(1), &[5, 6, 7]));
    assert_eq!(plan.batch[0].len, 4);
    assert_eq!(s.get(SeqId(1)).unwrap().tokens(), [1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(pool.used_blocks(), 2); // 7 slots
    s.commit(&plan);
    // The target agreed with the first draft only.
    s.resolve_drafts(SeqId(1), &[0]);
    let seq = s.get(SeqId(1)).unwrap();
    assert_eq!(seq.tokens(), [1, 2, 3, 4, 5]);
    assert_eq!(seq.computed(), 5);
    assert_eq!(pool.used_blocks(), 2); // 5 slots still need two blocks
    s.push_token(SeqId(1), 8);
    let mut plan = s.schedule();
    assert_eq!((plan.batch[0].start, plan.batch[0].len), (5, 1));
    // More drafts than the pool can hold: refused, without preempting anyone.
    assert!(!s.add_drafts(&mut plan, SeqId(1), &[0; 40]));
    assert_eq!(plan.batch[0].len, 1);
    assert_eq!(s.get(SeqId(1)).unwrap().tokens().len(), 6);
    // A tree's branch: drafts 1 and 3 of [9, 10, 11, 12] (10 then 12) are kept, in order.
    assert!(s.add_drafts(&mut plan, SeqId(1), &[9, 10, 11, 12]));
    s.commit(&plan);
    s.resolve_drafts(SeqId(1), &[1, 3]);
    let seq = s.get(SeqId(1)).unwrap();
    assert_eq!(seq.tokens(), [1, 2, 3, 4, 5, 8, 10, 12]);
    assert_eq!(seq.computed(), 8);
}

#[test]
fn slots_reserved_for_drafts_before_they_exist() {
    let pool = BlockPool::with_blocks(4, 4).unwrap();
    let (mut s, mut plan) = decoding_one(&pool);
    assert!(!s.reserve_drafts(&plan, SeqId(9), 2), "not decoding");
    assert!(!s.reserve_drafts(&plan, SeqId(1), 0), "nothing to reserve");
    assert!(
        !s.reserve_drafts(&plan, SeqId(1), 40),
        "more than the pool holds"
    );
    assert_eq!(pool.used_blocks(), 1, "a refused reservation takes nothing");
    assert!(s.reserve_drafts(&plan, SeqId(1), 3));
    // Slots for the last token and three drafts: positions 3..7, two blocks.
    assert_eq!(pool.used_blocks(), 2);
    assert_eq!(s.get(SeqId(1)).unwrap().block_ids().len(), 2);
    assert!(s.add_drafts(&mut plan, SeqId(1), &[5, 6, 7]));
    assert_eq!(pool.used_blocks(), 2);
}

/// `n` prompts of a shared `prefix`-token head and a distinct 3-token tail, arriving at once.
fn shared_prefix_requests(n: usize, prefix: usize, max_new: usize) -> Vec<(usize, Request)> {
    (0..n)
        .map(|i| {
            let mut prompt: Vec<u32> = (0..prefix as u32).map(|t| t * 3 + 1).collect();
            prompt.extend([900 + i as u32, 901, 902]);
            (0, Request { prompt, max_new })
        })
        .collect()
}

fn cached(max_running: usize, prefill_budget: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_running,
        prefill_budget,
        prefix_cache: true,
        host_blocks: 0,
        policy: SchedulePolicy::Fcfs,
    }
}

#[test]
fn a_prefix_shared_by_requests_arriving_together_is_computed_once() {
    let reqs = shared_prefix_requests(10, 40, 5);
    let ((with, _), computed) = simulate_counting(cached(16, 64), 400, &reqs);
    let off = SchedulerConfig {
        prefix_cache: false,
        ..cached(16, 64)
    };
    let ((without, _), all) = simulate_counting(off, 400, &reqs);
    assert_eq!(with, without, "the cache must not change any output");
    assert_eq!(all, 10 * 43);
    // The first computes its whole prompt; the others wait for its blocks, then compute
    // their own 3-token tail only.
    assert_eq!(computed, 43 + 9 * 3);
}

#[test]
fn cached_tokens_are_counted_and_the_cache_is_flushed_only_when_idle() {
    let pool = BlockPool::with_blocks(4, 64).unwrap();
    let mut s = Scheduler::new(cached(4, 64), pool.clone()).unwrap();
    let prompt: Vec<u32> = (0..10).collect();
    s.add(SeqId(1), prompt.clone());
    let plan = s.schedule();
    s.commit(&plan);
    assert_eq!(s.get(SeqId(1)).unwrap().cached_prompt_tokens(), Some(0));
    assert_eq!(
        s.flush_cache(),
        Err(FlushError::Busy(1)),
        "refused while a request runs"
    );
    s.finish(SeqId(1));
    // The same prompt again: its two full blocks come from the cache (not the last, partial one).
    s.add(SeqId(2), prompt);
    let plan = s.schedule();
    assert_eq!((plan.batch[0].start, plan.batch[0].len), (8, 2));
    assert_eq!(s.get(SeqId(2)).unwrap().cached_prompt_tokens(), Some(8));
    let stats = s.cache_stats();
    assert_eq!((stats.prompt_tokens, stats.cached_prompt_tokens), (20, 8));
    s.commit(&plan);
    s.finish(SeqId(2));
    assert_eq!(s.flush_cache(), Ok(2));
    assert_eq!(pool.used_blocks(), 0);
    let off = SchedulerConfig {
        prefix_cache: false,
        ..cached(4, 64)
    };
    let mut s = Scheduler::new(off, pool).unwrap();
    assert_eq!(s.flush_cache(), Err(FlushError::Disabled));
}

#[test]
fn lpm_admits_the_longest_cached_prefix_first() {
    for (policy, first) in [(SchedulePolicy::Fcfs, 2), (SchedulePolicy::Lpm, 3)] {
        let pool = BlockPool::with_blocks(4, 64).unwrap();
        let config = SchedulerConfig {
            policy,
            ..cached(1, 64)
        };
        let mut s = Scheduler::new(config, pool).unwrap();
        let warm: Vec<u32> = (0..9).collect();
        s.add(SeqId(1), warm.clone());
        let plan = s.schedule();
        s.commit(&plan);
        s.finish(SeqId(1));
        s.add(SeqId(2), vec![50, 51, 52, 53, 54]); // nothing cached
        s.add(SeqId(3), warm); // 8 tokens cached
        let plan = s.schedule();
        assert_eq!(plan.batch.len(), 1, "one running at most");
        assert_eq!(plan.batch[0].id, SeqId(first), "{policy:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Prompts sharing heads of different lengths, random arrivals, pools from tight to roomy:
    /// the cache (either policy) never changes an output and leaves no block behind; with room
    /// to spare it computes no more prompt tokens than no cache.
    #[test]
    fn shared_prefixes_give_the_uncached_output(
        spec in prop::collection::vec((0usize..10, 0usize..3, 1usize..12, 1usize..10), 1..14),
        max_running in 1usize..6,
        budget in 1usize..40,
        blocks in 14u32..60,
        lpm in any::<bool>(),
        host_blocks in prop_oneof![Just(0u32), 1u32..40],
    ) {
        let heads: [Vec<u32>; 3] = [
            (0..17).map(|t| t * 5 + 2).collect(),
            (0..9).map(|t| t * 5 + 2).collect(), // the first head's first 9 tokens
            (0..12).map(|t| t * 11 + 3).collect(),
        ];
        let reqs: Vec<(usize, Request)> = spec
            .iter()
            .enumerate()
            .map(|(i, &(at, head, tail, max_new))| {
                let mut prompt = heads[head].clone();
                prompt.extend((0..tail as u32).map(|t| 500 + t * 13 + i as u32));
                (at, Request { prompt, max_new })
            })
            .collect();
        let policy = if lpm { SchedulePolicy::Lpm } else { SchedulePolicy::Fcfs };
        let on = SchedulerConfig { policy, host_blocks, ..cached(max_running, budget) };
        let off = SchedulerConfig { prefix_cache: false, host_blocks: 0, ..on };
        let ((got, _), _) = simulate_counting(on, blocks, &reqs);
        let ((want, _), uncached) = simulate_counting(off, 10_000, &reqs);
        prop_assert_eq!(&got, &want);
        // With room for everything (no preemption), the cache only ever saves work.
        let ((roomy, _), computed) =
            simulate_counting(SchedulerConfig { host_blocks: 0, ..on }, 10_000, &reqs);
        prop_assert_eq!(roomy, want);
        prop_assert!(computed <= uncached, "{} > {}", computed, uncached);
    }
}
