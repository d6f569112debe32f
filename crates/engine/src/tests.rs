//! The engine's step loop driven without a model: a fake target whose "model" reads back the
//! tokens written into its KV slots and answers made-up logits from them. Whatever the engine
//! does with KV (prefix sharing, preemption and recompute, draft rollback, moving a verified
//! tree branch, tier copies), the output must be what the same rule gives over the true token
//! sequence; a slot read before it is written, or holding another sequence's token, shows up as
//! a different output.

use crate::step_loop::Engine;
use crate::target::Target;
use crate::{
    Command, EngineConfig, EngineStats, FinishReason, GenerateRequest, RequestFailure, TokenEvent,
};
use model::sampler::{SamplingParams, TokenConstraint};
use model::{Capture, Logits, LogitsFor, ModelError, SeqInput};
use scheduler::{SchedulePolicy, SchedulerConfig, SeqId};
use speculative::{Algorithm, SpecConfig, SpecFlags};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;

const VOCAB: usize = 64;
const BLOCK: usize = 4;
/// The fake model's end-of-generation token.
const EOG: u32 = 63;

/// The made-up model: mostly the last token plus one (so prompt lookup finds continuations
/// in a prompt that counts), plus one more wherever the context's sum is a multiple of 5, so
/// every token of the context counts.
fn next(context: &[u32]) -> u32 {
    let last = *context.last().expect("a row has context");
    let sum: u32 = context.iter().sum();
    (last + 1 + u32::from(sum.is_multiple_of(5))) % VOCAB as u32
}

/// Greedy decoding of `next` from `prompt`: up to `max` tokens, ending at an `ends` token.
fn reference(prompt: &[u32], max: usize, ends: &[u32]) -> Vec<u32> {
    let mut tokens = prompt.to_vec();
    let mut out = Vec::new();
    while out.len() < max {
        let t = next(&tokens);
        tokens.push(t);
        out.push(t);
        if ends.contains(&t) {
            break;
        }
    }
    out
}

/// What the test can see of the fake after the engine took it.
#[derive(Default)]
struct Log {
    forwards: usize,
    moves: usize,
    /// Forward passes fail from this one on.
    fail_from: Option<usize>,
}

/// A target whose KV slots hold the tokens written into them.
struct FakeTarget {
    slots: Vec<Option<u32>>,
    log: Rc<RefCell<Log>>,
}

impl FakeTarget {
    fn slot(blocks: &[u32], position: usize) -> usize {
        blocks[position / BLOCK] as usize * BLOCK + position % BLOCK
    }

    fn read(&self, blocks: &[u32], position: usize) -> u32 {
        self.slots[Self::slot(blocks, position)]
            .unwrap_or_else(|| panic!("slot {position} read before it was written"))
    }

    /// The tokens row `k` of `s` attends to, read back from the KV.
    fn context(&self, s: &SeqInput<'_>, k: usize) -> Vec<u32> {
        match s.tree {
            None => (0..=s.start_pos + k)
                .map(|p| self.read(s.blocks, p))
                .collect(),
            Some(tree) => {
                let mut c: Vec<u32> = (0..tree.root).map(|p| self.read(s.blocks, p)).collect();
                c.extend(
                    tree.path(k)
                        .iter()
                        .map(|&n| self.read(s.blocks, tree.root + n)),
                );
                c
            }
        }
    }
}

impl Target for FakeTarget {
    fn vocab_size(&self) -> usize {
        VOCAB
    }

    fn context_length(&self) -> usize {
        4096
    }

    fn block_bytes(&self) -> usize {
        BLOCK * 4
    }

    fn forward(
        &mut self,
        seqs: &[SeqInput<'_>],
        _capture: Option<Capture<'_>>,
    ) -> Result<Logits, ModelError> {
        let mut log = self.log.borrow_mut();
        log.forwards += 1;
        if log.fail_from.is_some_and(|n| log.forwards >= n) {
            return Err(ModelError::BadBatch("the fake's forward fails".into()));
        }
        drop(log);
        for s in seqs {
            for (k, &t) in s.tokens.iter().enumerate() {
                let slot = Self::slot(s.blocks, s.start_pos + k);
                self.slots[slot] = Some(t);
            }
        }
        let mut logits = Logits {
            vocab: VOCAB,
            ..Logits::default()
        };
        for s in seqs {
            let rows = match s.logits {
                LogitsFor::All => 0..s.tokens.len(),
                LogitsFor::Last => s.tokens.len() - 1..s.tokens.len(),
                LogitsFor::None => 0..0,
            };
            let first = logits.data.len() / VOCAB;
            for k in rows {
                let mut row = vec![0.0; VOCAB];
                row[next(&self.context(s, k)) as usize] = 10.0;

                logits.data.extend(row);
            }
            logits.ranges.push(first..logits.data.len() / VOCAB);
            logits.feature_ranges.push(0..0);
        }
        Ok(logits)
    }

    fn save_block(&self, block: u32, out: &mut [u8]) -> Result<(), ModelError> {
        let at = block as usize * BLOCK;
        for (i, chunk) in out.chunks_exact_mut(4).enumerate() {
            chunk.copy_from_slice(&self.slots[at + i].unwrap_or(u32::MAX).to_le_bytes());
        }
        Ok(())
    }

    fn load_block(&mut self, block: u32, data: &[u8]) -> Result<(), ModelError> {
        let at = block as usize * BLOCK;
        for (i, chunk) in data.chunks_exact(4).enumerate() {
            let t = u32::from_le_bytes(chunk.try_into().unwrap());
            self.slots[at + i] = (t != u32::MAX).then_some(t);
        }
        Ok(())
    }

    fn move_kv(&mut self, blocks: &[u32], from: usize, to: usize) -> Result<(), ModelError> {
        self.log.borrow_mut().moves += 1;
        self.slots[Self::slot(blocks, to)] = self.slots[Self::slot(blocks, from)];
        Ok(())
    }
}

/// The settings a test changes.
struct Setup {
    blocks: usize,
    max_running: usize,
    prefix_cache: bool,
    host_blocks: usize,
    /// NGRAM speculation with trees this wide (`None`: off).
    ngram_topk: Option<usize>,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            blocks: 256,
            max_running: 8,
            prefix_cache: false,
            host_blocks: 0,
            ngram_topk: None,
        }
    }
}

struct Harness {
    engine: Engine,
    log: Rc<RefCell<Log>>,
    stats: Arc<EngineStats>,
    next_id: u64,
}

impl Harness {
    fn new(setup: Setup) -> Self {
        let speculative = setup.ngram_topk.map(|topk| {
            SpecConfig::from_flags(SpecFlags {
                algorithm: Algorithm::Ngram,
                num_draft_tokens: Some(4),
                num_steps: 4,
                eagle_topk: topk,
                ngram_min_match_window: 1,
                ngram_max_match_window: 4,
                disable_batch_threshold: None,
                adaptive: false,
                draft_model_path: false,
            })
            .unwrap()
            .unwrap()
        });
        let config = EngineConfig {
            max_running: setup.max_running,
            max_queued: 64,
            max_total_tokens: setup.blocks * BLOCK,
            chunked_prefill_size: 64,
            context_length: 4096,
            block_size: BLOCK,
            speculative,
            prefix_cache: setup.prefix_cache,
            schedule_policy: SchedulePolicy::Fcfs,
            host_cache_blocks: setup.host_blocks,
            hicache_storage_dir: None,
            model_fingerprint: "fake".into(),
            grammar_forced_drafts: true,
            test_fault: None,
        };
        let sched = SchedulerConfig {
            max_running: setup.max_running,
            prefill_budget: config.chunked_prefill_size,
            prefix_cache: setup.prefix_cache,
            host_blocks: setup.host_blocks as u32,
            policy: SchedulePolicy::Fcfs,
        };
        let log = Rc::new(RefCell::new(Log::default()));
        let target = FakeTarget {
            slots: vec![None; setup.blocks * BLOCK],
            log: log.clone(),
        };
        let speculator = speculative.map(|c| {
            let (min, max) = c.ngram_windows();
            let drafter =
                speculative::NgramDrafter(speculative::NgramProposer::new(min, max).unwrap());
            speculative::Speculator::new(&c, 0.1, Box::new(drafter))
        });
        let stats = Arc::new(EngineStats::default());
        let engine = Engine::new(
            Box::new(target),
            speculator,
            &config,
            sched,
            vec![EOG],
            stats.clone(),
            None,
        );
        Self {
            engine,
            log,
            stats,
            next_id: 1,
        }
    }

    fn submit(&mut self, request: GenerateRequest) -> UnboundedReceiver<TokenEvent> {
        let (events, rx) = tokio::sync::mpsc::unbounded_channel();
        let id = SeqId(self.next_id);
        self.next_id += 1;
        // As `EngineHandle::submit` does before sending the command.
        assert!(self.stats.try_admit(usize::MAX));
        self.engine.handle(Command::Submit {
            id,
            request,
            events,
        });
        rx
    }

    /// Steps until nothing runs or waits (a bounded number of steps).
    fn run(&mut self) {
        for _ in 0..10_000 {
            if self.engine.scheduler.is_idle() {
                return;
            }
            self.engine.turn();
        }
        panic!("the engine did not finish its requests");
    }

    fn free_blocks(&self) -> usize {
        self.engine.scheduler.pool().free_blocks()
    }
}

fn request(prompt: &[u32], max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        sampling: SamplingParams::greedy(),
        ignore_eos: false,
        stop_token_ids: Vec::new(),
        logprobs: None,
        scripted: Vec::new(),
        constraint: None,
    }
}

/// A request's events: its tokens and how it ended.
#[derive(Debug)]
struct Outcome {
    tokens: Vec<u32>,
    finish: Option<FinishReason>,
    failed: Option<RequestFailure>,
}

fn outcome(rx: &mut UnboundedReceiver<TokenEvent>) -> Outcome {
    let mut o = Outcome {
        tokens: Vec::new(),
        finish: None,
        failed: None,
    };
    while let Ok(event) = rx.try_recv() {
        match event {
            TokenEvent::Token { id, .. } => o.tokens.push(id),
            TokenEvent::Finished { reason, .. } => o.finish = Some(reason),
            TokenEvent::Failed(f) => o.failed = Some(f),
            TokenEvent::Admitted { .. } => {}
        }
    }
    o
}

/// A prompt that counts up from `from`, then starts again: prompt lookup drafts from it.
fn counting(from: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| from + i % 7).collect()
}

/// A prompt in which `a, a + 1` is followed by `a + 2` and, more recently, by `a + 3`, and
/// that ends with `a`: once the model adds `a + 1`, prompt lookup drafts a tree with both, and
/// the model takes `a + 2` unless the context's sum says otherwise, so a branch off the first
/// child can win.
fn branching(a: u32) -> Vec<u32> {
    let mut p = Vec::new();
    for (k, third) in [2, 3, 2, 3].into_iter().enumerate() {
        p.extend([50 + k as u32, a, a + 1, a + third]);
    }
    p.extend([55, a]);
    p
}

#[test]
fn output_and_finish_reasons_are_the_models() {
    let mut h = Harness::new(Setup::default());
    let prompt = [3, 4, 5];
    let mut by_length = h.submit(request(&prompt, 6));
    // A prompt whose continuation reaches the end-of-generation token.
    let near_end = [41, 42];
    let mut by_eog = h.submit(request(&near_end, 20));
    let mut past_eog = h.submit(GenerateRequest {
        ignore_eos: true,
        ..request(&near_end, 24)
    });
    let stop_at = reference(&prompt, 6, &[])[2];
    let mut by_stop_id = h.submit(GenerateRequest {
        stop_token_ids: vec![stop_at],
        ..request(&prompt, 6)
    });
    h.run();
    let o = outcome(&mut by_length);
    assert_eq!(o.tokens, reference(&prompt, 6, &[]));
    assert_eq!(o.finish, Some(FinishReason::Length));
    let o = outcome(&mut by_eog);
    let expected = reference(&near_end, 20, &[EOG]);
    assert_eq!(
        expected.last(),
        Some(&EOG),
        "the test's prompt must reach EOG"
    );
    assert_eq!(o.tokens, expected);
    assert_eq!(o.finish, Some(FinishReason::Stop));
    let o = outcome(&mut past_eog);
    assert_eq!(o.tokens, reference(&near_end, 24, &[]));
    assert!(o.tokens.contains(&EOG), "ignore_eos went past it");
    assert_eq!(o.finish, Some(FinishReason::Length));
    let o = outcome(&mut by_stop_id);
    assert_eq!(o.tokens, reference(&prompt, 6, &[stop_at]));
    assert_eq!(o.finish, Some(FinishReason::Stop));
    assert_eq!(h.free_blocks(), 256, "every block comes back");
}

#[test]
fn speculation_keeps_the_output_and_accepts_drafts() {
    for topk in [1, 2] {
        let mut h = Harness::new(Setup {
            ngram_topk: Some(topk),
            ..Setup::default()
        });
        let prompts: Vec<Vec<u32>> = (0..4)
            .map(|i| {
                if topk == 1 {
                    counting(10 + i * 9, 30)
                } else {
                    branching(1 + i * 9)
                }
            })
            .collect();
        let mut streams: Vec<_> = prompts.iter().map(|p| h.submit(request(p, 24))).collect();
        h.run();
        for (p, rx) in prompts.iter().zip(&mut streams) {
            let o = outcome(rx);
            assert_eq!(o.tokens, reference(p, 24, &[EOG]), "topk {topk}");
        }
        let s = h.stats.snapshot();
        assert!(s.spec_accepted > 0, "topk {topk}: nothing accepted: {s:?}");
        assert!(
            s.spec_accepted < s.spec_proposed,
            "topk {topk}: some drafts must fail"
        );
        if topk > 1 {
            assert!(s.spec_tree_verifications > 0);
            assert!(
                h.log.borrow().moves > 0,
                "a verified branch off the first child moves its KV"
            );
        }
        assert_eq!(h.free_blocks(), 256);
    }
}

#[test]
fn preempted_sequences_are_recomputed_with_the_same_output() {
    // 14 blocks of 4 tokens; each request needs 5 blocks at the end, three of them 15.
    let mut h = Harness::new(Setup {
        blocks: 14,
        ..Setup::default()
    });
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| vec![1 + i, 2 + i, 3 + i, 4 + i]).collect();
    let mut streams: Vec<_> = prompts.iter().map(|p| h.submit(request(p, 16))).collect();
    h.run();
    assert!(
        h.stats.snapshot().preemptions > 0,
        "the pool was meant to run out"
    );
    for (p, rx) in prompts.iter().zip(&mut streams) {
        let o = outcome(rx);
        assert_eq!(o.tokens, reference(p, 16, &[EOG]));
        assert!(o.failed.is_none());
    }
    assert_eq!(h.free_blocks(), 14);
}

#[test]
fn shared_prefixes_and_the_host_tier_keep_the_output() {
    // A pool too small to keep every prefix: cached blocks are demoted to the host tier and
    // promoted back, and the KV read back must be the tokens written.
    let mut h = Harness::new(Setup {
        blocks: 24,
        prefix_cache: true,
        host_blocks: 64,
        ..Setup::default()
    });
    // Four prefixes of 8 blocks each, taken in turn: more than the pool keeps, so each one
    // comes back from the host tier the next time round.
    let prefix = |k: u32| -> Vec<u32> { (0..32).map(|i| (i * 3 + k * 11) % 50).collect() };
    for round in 0..3 {
        for k in 0..4 {
            let mut prompt = prefix(k);
            prompt.push(20 + round);
            let mut rx = h.submit(request(&prompt, 4));
            h.run();
            let o = outcome(&mut rx);
            assert_eq!(
                o.tokens,
                reference(&prompt, 4, &[EOG]),
                "round {round}, {k}"
            );
        }
    }
    let s = h.stats.snapshot();
    assert!(
        s.cache_host_hit_tokens > 0,
        "prefixes came back from the host tier"
    );
    assert!(
        s.cache_demoted_blocks > 0 && s.cache_promoted_blocks > 0,
        "{s:?}"
    );
}

#[test]
fn an_abandoned_request_frees_its_kv_at_once() {
    let mut h = Harness::new(Setup::default());
    let rx = h.submit(request(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 100));
    let mut other = h.submit(request(&[9, 8], 5));
    h.engine.turn();
    assert!(h.free_blocks() < 256);
    drop(rx);
    h.run();
    assert_eq!(h.stats.snapshot().aborted, 1);
    assert_eq!(h.free_blocks(), 256);
    assert_eq!(outcome(&mut other).tokens, reference(&[9, 8], 5, &[EOG]));
}

/// A grammar that gives up after `after` tokens (as one past its limits does).
#[derive(Debug, Clone)]
struct FailingGrammar {
    after: usize,
    seen: usize,
    failed: bool,
}

impl TokenConstraint for FailingGrammar {
    fn mask(&mut self, logits: &mut [f32]) {
        self.failed |= self.seen >= self.after;
        if self.failed {
            for (t, l) in logits.iter_mut().enumerate() {
                if t as u32 != EOG {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }

    fn advance(&mut self, _token: u32) {
        self.seen += 1;
    }

    fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        tokens.len()
    }

    fn forced(&mut self) -> Vec<u32> {
        Vec::new()
    }

    fn failure(&self) -> Option<String> {
        self.failed.then(|| "too deep".to_string())
    }

    fn boxed_clone(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.clone())
    }
}

#[test]
fn a_failing_grammar_fails_its_request_alone() {
    let mut h = Harness::new(Setup::default());
    let mut failing = h.submit(GenerateRequest {
        constraint: Some(Box::new(FailingGrammar {
            after: 2,
            seen: 0,
            failed: false,
        })),
        ..request(&[1, 2, 3], 10)
    });
    let mut plain = h.submit(request(&[4, 5, 6], 10));
    h.run();
    let o = outcome(&mut failing);
    assert!(
        matches!(&o.failed, Some(RequestFailure::Grammar(m)) if m.contains("too deep")),
        "{o:?}"
    );
    assert_eq!(o.tokens.len(), 2, "{o:?}");
    assert_eq!(
        outcome(&mut plain).tokens,
        reference(&[4, 5, 6], 10, &[EOG])
    );
    assert_eq!(h.free_blocks(), 256);
}

#[test]
fn a_failed_forward_pass_fails_the_requests_that_ran() {
    let mut h = Harness::new(Setup::default());
    let mut a = h.submit(request(&[1, 2, 3], 10));
    h.engine.turn();
    h.engine.turn();
    let forwards = h.log.borrow().forwards;
    h.log.borrow_mut().fail_from = Some(forwards + 1);
    let mut b = h.submit(request(&[7, 8], 10));
    h.run();
    for rx in [&mut a, &mut b] {
        let o = outcome(rx);
        assert!(
            matches!(o.failed, Some(RequestFailure::Forward(_))),
            "{o:?}"
        );
        assert_eq!(o.finish, None);
    }
    assert_eq!(h.free_blocks(), 256);
}
