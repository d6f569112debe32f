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

/// Runs requests arriving at given steps to completion; returns each one's generated tokens,
/// checking the scheduler's invariants at every step.
fn simulate(
    config: SchedulerConfig,
    blocks: u32,
    arrivals: &[(usize, Request)],
) -> (HashMap<u64, Vec<u32>>, u64) {
    let pool = BlockPool::with_blocks(4, blocks).unwrap();
    let mut s = Scheduler::new(config, pool.clone()).unwrap();
    // What the "KV cache" holds for each sequence: the tokens fed so far.
    let mut fed: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut max_new: HashMap<u64, usize> = HashMap::new();
    let mut done = HashMap::new();
    let mut step = 0;
    let mut next = 0;
    while next < arrivals.len() || !s.is_idle() {
        while next < arrivals.len() && arrivals[next].0 <= step {
            let id = next as u64;
            s.add(SeqId(id), arrivals[next].1.prompt.clone());
            max_new.insert(id, arrivals[next].1.max_new);
            next += 1;
        }
        let plan = s.schedule();
        for id in &plan.preempted {
            fed.remove(&id.0);
        }
        let prefill: usize = plan.batch.iter().filter(|b| b.len > 1).map(|b| b.len).sum();
        assert!(prefill <= config.prefill_budget, "budget exceeded");
        assert!(s.running_len() <= config.max_running);
        let mut sampled = Vec::new();
        for b in &plan.batch {
            let seq = s.get(b.id).unwrap();
            let kv = fed.entry(b.id.0).or_default();
            assert_eq!(kv.len(), b.start, "chunks must be contiguous");
            kv.extend_from_slice(&seq.tokens()[b.start..b.start + b.len]);
            assert!(
                seq.block_ids().len() * 4 >= b.start + b.len,
                "slots reserved"
            );
            if b.logits {
                assert_eq!(kv.len(), seq.tokens().len());
                sampled.push((b.id, next_token(kv)));
            }
        }
        s.commit(&plan);
        for (id, tok) in sampled {
            s.push_token(id, tok);
            let seq = s.get(id).unwrap();
            if seq.generated().len() == max_new[&id.0] {
                let seq = s.finish(id).unwrap();
                done.insert(id.0, seq.generated().to_vec());
                fed.remove(&id.0);
            }
        }
        step += 1;
        assert!(step < 100_000, "no progress");
    }
    assert_eq!(pool.used_blocks(), 0, "blocks leaked");
    (done, s.preemptions())
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
    };
    assert_eq!(
        Scheduler::new(zero, pool.clone()).unwrap_err(),
        ConfigError::NoRunning
    );
    let no_budget = SchedulerConfig {
        max_running: 1,
        prefill_budget: 0,
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
    ) {
        let config = SchedulerConfig { max_running, prefill_budget: budget };
        let (got, _) = simulate(config, blocks, &requests(&spec));
        let roomy = SchedulerConfig { max_running: 64, prefill_budget: 1000 };
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
