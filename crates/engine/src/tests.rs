//! The engine's step loop driven without a model: a fake target whose "model" reads back the
//! tokens written into its KV slots and answers made-up logits from them. Whatever the engine
//! does with KV (prefix sharing, preemption and recompute, draft rollback, moving a verified
//! tree branch, tier copies), the output must be what the same rule gives over the true token
//! sequence; a slot read before it is written, or holding another sequence's token, shows up as
//! a different output.

use crate::step_loop::Engine;
use crate::target::Target;
use crate::{
    Command, EngineConfig, EngineHandle, EngineStats, FinishReason, GenerateRequest,
    RequestFailure, SubmitError, TokenEvent,
};
use model::sampler::{SamplingParams, TokenConstraint};
use model::{Capture, Logits, LogitsFor, ModelError, SeqInput};
use scheduler::{FlushError, SchedulePolicy, SchedulerConfig, SeqId};
use speculative::{Algorithm, SpecConfig, SpecFlags};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
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
    /// The most sequences one forward pass took, and the tokens fed over all passes.
    widest: usize,
    fed: usize,
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
        log.widest = log.widest.max(seqs.len());
        log.fed += seqs.iter().map(|s| s.tokens.len()).sum::<usize>();
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
                LogitsFor::None | LogitsFor::Hidden => 0..0,
            };
            // The fake's hidden state: the last token and its position.
            let hidden = (s.logits == LogitsFor::Hidden).then(|| {
                let last = s.tokens.len() - 1;
                let at = logits.hidden.len() / 2;
                logits
                    .hidden
                    .extend([s.tokens[last] as f32, (s.start_pos + last) as f32]);
                at
            });
            logits.hidden_rows.push(hidden);
            logits.hidden_width = 2;
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
    /// `--speculative-disable-batch-threshold`.
    spec_batch_threshold: Option<usize>,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            blocks: 256,
            max_running: 8,
            prefix_cache: false,
            host_blocks: 0,
            ngram_topk: None,
            spec_batch_threshold: None,
        }
    }
}

struct Harness {
    engine: Engine,
    log: Rc<RefCell<Log>>,
    stats: Arc<EngineStats>,
    next_id: u64,
}

/// The engine's settings for `setup`.
fn engine_config(setup: &Setup) -> EngineConfig {
    let speculative = setup.ngram_topk.map(|topk| {
        SpecConfig::from_flags(SpecFlags {
            algorithm: Algorithm::Ngram.into(),
            num_draft_tokens: Some(4),
            num_steps: 4,
            eagle_topk: topk,
            ngram_min_match_window: 1,
            ngram_max_match_window: 4,
            disable_batch_threshold: setup.spec_batch_threshold,
            adaptive: Some(false),
            draft_model_path: false,
            suffix: speculative::SuffixSettings::default(),
        })
        .unwrap()
        .unwrap()
    });
    EngineConfig {
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
    }
}

impl Harness {
    fn new(setup: Setup) -> Self {
        let config = engine_config(&setup);
        let speculative = config.speculative;
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

    /// Asks the engine to empty the prefix cache (it answers within the command).
    fn flush(&mut self) -> Result<usize, FlushError> {
        let (reply, mut answer) = tokio::sync::oneshot::channel();
        self.engine.handle(Command::FlushCache(reply));
        answer.try_recv().expect("the engine answers at once")
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
        embed: false,
    }
}

/// A token's log-probability and the top ones, as sent.
type TokenLogprobs = (Option<f32>, Vec<(u32, f32)>);

/// A request's events: its tokens and how it ended.
#[derive(Debug, Default)]
struct Outcome {
    tokens: Vec<u32>,
    /// Each token's `is_stop`.
    stops: Vec<bool>,
    logprobs: Vec<TokenLogprobs>,
    /// `Admitted`'s cached prompt tokens.
    cached: Option<usize>,
    finish: Option<FinishReason>,
    /// `Finished`'s prompt and completion tokens, and its tokens per verification pass.
    usage: Option<(usize, usize)>,
    accept_length: Option<f32>,
    failed: Option<RequestFailure>,
    embedding: Option<Vec<f32>>,
}

/// The events received so far (checking that `Admitted` comes once, before any token).
fn outcome(rx: &mut UnboundedReceiver<TokenEvent>) -> Outcome {
    let mut o = Outcome::default();
    while let Ok(event) = rx.try_recv() {
        match event {
            TokenEvent::Token {
                id,
                is_stop,
                logprob,
                top_logprobs,
                ..
            } => {
                o.tokens.push(id);
                o.stops.push(is_stop);
                o.logprobs.push((logprob, top_logprobs));
            }
            TokenEvent::Finished {
                reason,
                prompt_tokens,
                completion_tokens,
                spec_accept_length,
            } => {
                o.finish = Some(reason);
                o.usage = Some((prompt_tokens, completion_tokens));
                o.accept_length = spec_accept_length;
            }
            TokenEvent::Failed(f) => o.failed = Some(f),
            TokenEvent::Embedding(v) => {
                assert!(o.embedding.is_none() && o.tokens.is_empty(), "{o:?}");
                o.embedding = Some(v);
            }
            TokenEvent::Admitted { cached_tokens } => {
                assert!(o.cached.is_none() && o.tokens.is_empty(), "{o:?}");
                o.cached = Some(cached_tokens);
            }
        }
    }
    o
}

/// Runs `prompt` alone on a fresh engine with `setup`.
fn alone(setup: Setup, request: GenerateRequest) -> Outcome {
    let mut h = Harness::new(setup);
    let mut rx = h.submit(request);
    h.run();
    outcome(&mut rx)
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
fn an_embedding_is_the_last_tokens_hidden_state_batched_with_generations_and_cached_alike() {
    let mut h = Harness::new(Setup {
        prefix_cache: true,
        ..Setup::default()
    });
    let long: Vec<u32> = (1..=40).collect();
    let embed = |prompt: &[u32]| GenerateRequest {
        embed: true,
        ..request(prompt, 1)
    };
    let mut generating = h.submit(request(&[3, 4, 5], 6));
    let mut first = h.submit(embed(&long));
    h.run();
    // The same prompt again: its prefix comes from the cache, and the vector is the same.
    let mut again = h.submit(embed(&long));
    h.run();
    let (g, a, b) = (
        outcome(&mut generating),
        outcome(&mut first),
        outcome(&mut again),
    );
    assert_eq!(g.tokens, reference(&[3, 4, 5], 6, &[]));
    // The fake's hidden state is (last token, its position), normalised.
    let n = (40f64 * 40.0 + 39.0 * 39.0).sqrt();
    let want = vec![(40.0 / n) as f32, (39.0 / n) as f32];
    assert_eq!(a.embedding.as_ref(), Some(&want), "{a:?}");
    assert_eq!(b.embedding, a.embedding, "{b:?}");
    assert!(
        b.cached.unwrap() > 0,
        "the prefix cache was not used: {b:?}"
    );
    for o in [&a, &b] {
        assert!(o.tokens.is_empty());
        assert_eq!(o.usage, Some((40, 0)));
        assert_eq!(o.finish, Some(FinishReason::Stop));
    }
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

#[test]
fn requests_joining_mid_flight_get_the_output_they_get_alone() {
    let prompts: Vec<Vec<u32>> = (0..4u32)
        .map(|i| (0..5 + 3 * i).map(|t| (t * 7 + i) % 40).collect())
        .collect();
    let mut h = Harness::new(Setup::default());
    let mut streams = Vec::new();
    for p in &prompts {
        streams.push(h.submit(request(p, 12)));
        // The next one arrives while the earlier ones decode.
        for _ in 0..3 {
            h.engine.turn();
        }
    }
    h.run();
    assert_eq!(
        h.log.borrow().widest,
        4,
        "all four ran in one pass at some point"
    );
    for (p, rx) in prompts.iter().zip(&mut streams) {
        let o = outcome(rx);
        assert_eq!(o.tokens, alone(Setup::default(), request(p, 12)).tokens);
        assert_eq!(o.tokens, reference(p, 12, &[EOG]));
    }
    assert_eq!(h.free_blocks(), 256);
}

#[test]
fn seeded_sampling_gives_the_same_output_alone_and_batched() {
    // A high temperature makes the fake's peaked rows a spread the seed decides.
    let sampled = |seed: u64| GenerateRequest {
        sampling: SamplingParams {
            temperature: 4.0,
            seed,
            ..SamplingParams::default()
        },
        ..request(&[5, 6, 7], 16)
    };
    let by_itself = alone(Setup::default(), sampled(7)).tokens;
    assert_ne!(
        by_itself,
        alone(Setup::default(), sampled(8)).tokens,
        "the seed must matter for the test to mean anything"
    );
    let mut h = Harness::new(Setup::default());
    let mut others: Vec<_> = (0..3).map(|i| h.submit(sampled(100 + i))).collect();
    h.engine.turn();
    let mut rx = h.submit(sampled(7));
    others.push(h.submit(request(&[9, 10], 8)));
    h.run();
    assert_eq!(outcome(&mut rx).tokens, by_itself);
    for rx in &mut others {
        assert!(outcome(rx).finish.is_some());
    }
}

#[test]
fn a_repeated_prompt_prefix_comes_from_the_cache() {
    let mut h = Harness::new(Setup {
        prefix_cache: true,
        ..Setup::default()
    });
    // Ten shared tokens: two full blocks the second request can reuse.
    let shared: Vec<u32> = (0..10).map(|t| (t * 5 + 1) % 40).collect();
    let first = [&shared[..], &[7]].concat();
    let second = [&shared[..], &[9, 11]].concat();
    let mut a = h.submit(request(&first, 6));
    h.run();
    let fed_before = h.log.borrow().fed;
    let mut b = h.submit(request(&second, 6));
    h.run();
    let (a, b) = (outcome(&mut a), outcome(&mut b));
    assert_eq!(a.cached, Some(0));
    assert_eq!(b.cached, Some(8));
    assert_eq!(a.tokens, reference(&first, 6, &[EOG]));
    assert_eq!(b.tokens, reference(&second, 6, &[EOG]));
    // The second request fed only its uncached prompt tokens, then one token per decode.
    let fed = h.log.borrow().fed - fed_before;
    assert_eq!(fed, second.len() - 8 + b.tokens.len() - 1);
    let s = h.stats.snapshot();
    assert_eq!(s.cache_hit_tokens, 8);
    assert_eq!(s.cache_prompt_tokens, (first.len() + second.len()) as u64);
    assert_eq!(
        b.usage,
        Some((second.len(), b.tokens.len())),
        "usage counts the whole prompt"
    );
}

#[test]
fn a_prefix_shared_by_requests_arriving_together_is_computed_once() {
    // As `n` choices of one prompt, or one system prompt under several users' turns.
    let mut h = Harness::new(Setup {
        prefix_cache: true,
        ..Setup::default()
    });
    let shared: Vec<u32> = (0..16).map(|t| (t * 3 + 2) % 40).collect();
    let prompts: Vec<Vec<u32>> = (0..4).map(|k| [&shared[..], &[k + 1]].concat()).collect();
    let mut streams: Vec<_> = prompts.iter().map(|p| h.submit(request(p, 5))).collect();
    h.run();
    let outcomes: Vec<Outcome> = streams.iter_mut().map(outcome).collect();
    let cached: Vec<Option<usize>> = outcomes.iter().map(|o| o.cached).collect();
    assert_eq!(cached, [Some(0), Some(16), Some(16), Some(16)]);
    let mut decodes = 0;
    for (p, o) in prompts.iter().zip(&outcomes) {
        assert_eq!(o.tokens, reference(p, 5, &[EOG]));
        decodes += o.tokens.len() - 1;
    }
    // One whole prompt, the last token of each other one, and the decodes.
    assert_eq!(h.log.borrow().fed, 17 + 3 + decodes);
    assert_eq!(h.free_blocks(), 256 - h.stats.snapshot().cache_idle_blocks);
}

#[test]
fn a_request_filling_the_whole_kv_cache_runs_to_its_end() {
    // 6 blocks of 4: a prompt of 5 and 19 new tokens take every slot.
    let mut h = Harness::new(Setup {
        blocks: 6,
        ..Setup::default()
    });
    let prompt = [2, 9, 4, 11, 6];
    let mut rx = h.submit(GenerateRequest {
        ignore_eos: true,
        ..request(&prompt, 19)
    });
    h.run();
    let o = outcome(&mut rx);
    assert!(o.failed.is_none(), "{o:?}");
    assert_eq!(o.tokens, reference(&prompt, 19, &[]));
    assert_eq!(o.finish, Some(FinishReason::Length));
    assert_eq!(h.stats.snapshot().preemptions, 0);
    assert_eq!(h.free_blocks(), 6);
}

#[test]
fn stopping_a_request_early_leaves_the_others_unchanged() {
    let mut h = Harness::new(Setup::default());
    let prompts = [[1, 2, 3], [10, 11, 12], [20, 21, 22]];
    let mut streams: Vec<_> = prompts.iter().map(|p| h.submit(request(p, 16))).collect();
    // The harness numbers requests from 1: the second one.
    let stopped = SeqId(2);
    for _ in 0..4 {
        h.engine.turn();
    }
    // As a stop string matched in the second request's text.
    h.engine.handle(Command::Stop(stopped));
    assert_eq!(
        h.stats.snapshot().in_flight,
        2,
        "its admission slot is free"
    );
    let so_far = outcome(&mut streams[1]);
    assert_eq!(so_far.tokens, reference(&prompts[1], 4, &[]));
    h.run();
    let after = outcome(&mut streams[1]);
    assert!(
        after.tokens.is_empty() && after.finish.is_none() && after.failed.is_none(),
        "a stopped request gets no more events: {after:?}"
    );
    for k in [0, 2] {
        let o = outcome(&mut streams[k]);
        assert_eq!(o.tokens, reference(&prompts[k], 16, &[EOG]));
    }
    let s = h.stats.snapshot();
    assert_eq!((s.finished, s.aborted), (3, 0), "a stop is not an abort");
    assert_eq!(h.free_blocks(), 256);
}

#[test]
fn stop_token_ids_end_the_output_even_with_ignore_eos() {
    let mut h = Harness::new(Setup::default());
    let near_end = [41, 42];
    let full = reference(&near_end, 24, &[]);
    let eog_at = full
        .iter()
        .position(|&t| t == EOG)
        .expect("the prompt reaches EOG");
    // A stop id that first comes two tokens past the EOG.
    let stop = full[eog_at + 2];
    assert!(!full[..eog_at + 2].contains(&stop));
    let mut rx = h.submit(GenerateRequest {
        ignore_eos: true,
        stop_token_ids: vec![stop],
        ..request(&near_end, 24)
    });
    let mut plain = h.submit(request(&near_end, 24));
    h.run();
    let o = outcome(&mut rx);
    assert_eq!(o.tokens, full[..eog_at + 3]);
    assert_eq!(o.finish, Some(FinishReason::Stop));
    // Only the token that ends the output is a stop (its text is left out); the EOG it went
    // past is not.
    let mut stops = vec![false; eog_at + 2];
    stops.push(true);
    assert_eq!(o.stops, stops);
    let o = outcome(&mut plain);
    assert_eq!(o.tokens, full[..=eog_at]);
    assert_eq!(o.stops.last(), Some(&true));
    assert_eq!(o.stops.iter().filter(|&&s| s).count(), 1);
}

#[test]
fn requests_beyond_max_running_wait_and_start_as_others_finish() {
    let mut h = Harness::new(Setup {
        max_running: 2,
        ..Setup::default()
    });
    let prompts: Vec<Vec<u32>> = (0..5).map(|i| vec![3 * i + 1, 3 * i + 2, 30 - i]).collect();
    let mut streams: Vec<_> = (0..5)
        .map(|i| h.submit(request(&prompts[i], 3 + i)))
        .collect();
    h.engine.turn();
    let s = h.stats.snapshot();
    assert_eq!((s.running, s.queued, s.in_flight), (2, 3, 5), "{s:?}");
    assert_eq!(s.kv_used_blocks, 256 - h.free_blocks());
    h.run();
    assert_eq!(
        h.log.borrow().widest,
        2,
        "never more than max_running in a pass"
    );
    let mut generated = 0;
    for (i, rx) in streams.iter_mut().enumerate() {
        let o = outcome(rx);
        assert_eq!(o.tokens, reference(&prompts[i], 3 + i, &[EOG]));
        generated += o.tokens.len() as u64;
    }
    let s = h.stats.snapshot();
    assert_eq!(
        (s.running, s.queued, s.in_flight, s.kv_used_blocks),
        (0, 0, 0, 0)
    );
    assert_eq!(
        (s.finished, s.prompt_tokens, s.generation_tokens),
        (5, 15, generated)
    );
}

#[test]
fn flushing_the_prefix_cache_waits_for_idle_and_empties_it() {
    let mut h = Harness::new(Setup {
        prefix_cache: true,
        ..Setup::default()
    });
    let prompt: Vec<u32> = (0..9).map(|t| t * 4 + 1).collect();
    let mut rx = h.submit(request(&prompt, 4));
    h.engine.turn();
    assert_eq!(
        h.flush(),
        Err(FlushError::Busy(1)),
        "a running request keeps its prefix"
    );
    h.run();
    let first = outcome(&mut rx);
    let cached = h.stats.snapshot().cache_blocks;
    assert!(cached > 0);
    assert_eq!(h.flush(), Ok(cached));
    assert_eq!(
        h.stats.snapshot().cache_blocks,
        0,
        "the metrics see it at once"
    );
    assert_eq!(h.free_blocks(), 256);
    let mut again = h.submit(request(&prompt, 4));
    h.run();
    let o = outcome(&mut again);
    assert_eq!(o.cached, Some(0));
    assert_eq!(o.tokens, first.tokens);
    let mut off = Harness::new(Setup::default());
    assert_eq!(off.flush(), Err(FlushError::Disabled));
}

#[test]
fn acceptance_is_counted_per_pass_in_the_stats_and_the_finish_event() {
    let mut h = Harness::new(Setup {
        ngram_topk: Some(1),
        ..Setup::default()
    });
    let prompt = counting(10, 30);
    let mut rx = h.submit(request(&prompt, 24));
    h.run();
    let o = outcome(&mut rx);
    assert_eq!(o.tokens, reference(&prompt, 24, &[EOG]));
    let s = h.stats.snapshot();
    assert!(s.spec_verifications > 0 && s.spec_accepted > 0, "{s:?}");
    assert_eq!(s.accept_hist.iter().sum::<u64>(), s.spec_verifications);
    let by_bucket: u64 = (0..).zip(s.accept_hist).map(|(k, n)| k * n).sum();
    assert_eq!(by_bucket, s.spec_accepted);
    // A pass emits the drafts it accepts and one token of the model's own.
    let per_pass = (s.spec_accepted + s.spec_verifications) as f32 / s.spec_verifications as f32;
    assert_eq!(o.accept_length, Some(per_pass));
    assert!(per_pass > 1.5, "{per_pass}");
    assert_eq!(o.usage, Some((prompt.len(), o.tokens.len())));
    assert_eq!(s.generation_tokens, o.tokens.len() as u64);
    assert!(
        h.log.borrow().forwards < o.tokens.len(),
        "fewer passes than tokens"
    );
}

#[test]
fn a_draft_rejected_at_its_first_token_leaves_the_kv_right() {
    // Each `t` of the prompt is followed by `39 + t`: prompt lookup drafts that after every
    // output token up to 12, and the model, which counts on, rejects it at once.
    let mut prompt: Vec<u32> = (1..=12).flat_map(|t| [t, 39 + t]).collect();
    prompt.push(1);
    let mut h = Harness::new(Setup {
        ngram_topk: Some(1),
        ..Setup::default()
    });
    let mut rx = h.submit(request(&prompt, 8));
    h.run();
    let o = outcome(&mut rx);
    // The rejected drafts' KV slots hold their tokens until the next pass overwrites them.
    assert_eq!(o.tokens, reference(&prompt, 8, &[EOG]));
    let s = h.stats.snapshot();
    assert!(s.spec_verifications >= 4, "{s:?}");
    assert_eq!(s.spec_accepted, 0);
    assert_eq!(s.accept_hist[0], s.spec_verifications);
    assert_eq!(o.accept_length, Some(1.0));
    assert_eq!(h.free_blocks(), 256);
}

#[test]
fn speculation_stays_off_while_more_requests_run_than_the_threshold() {
    let mut h = Harness::new(Setup {
        ngram_topk: Some(1),
        spec_batch_threshold: Some(1),
        ..Setup::default()
    });
    // Prompts whose output prompt lookup can draft from: the short ones would draft too.
    let prompts = [
        counting(10, 30),
        counting(20, 30),
        (5..45).chain(5..7).collect(),
    ];
    let lengths = [6, 6, 24];
    let mut streams: Vec<_> = prompts
        .iter()
        .zip(lengths)
        .map(|(p, n)| h.submit(request(p, n)))
        .collect();
    h.run();
    let outcomes: Vec<Outcome> = streams.iter_mut().map(outcome).collect();
    for ((p, n), o) in prompts.iter().zip(lengths).zip(&outcomes) {
        assert_eq!(o.tokens, reference(p, n, &[EOG]));
    }
    // The short ones ran with three sequences running: never a draft.
    assert_eq!(outcomes[0].accept_length, None);
    assert_eq!(outcomes[1].accept_length, None);
    // The long one, alone once they finished, drafted.
    assert!(
        outcomes[2].accept_length.is_some_and(|a| a > 1.0),
        "{:?}",
        outcomes[2]
    );
    let s = h.stats.snapshot();
    assert!(s.spec_steps_off > 0 && s.spec_steps_on > 0, "{s:?}");
}

#[test]
fn logprobs_come_with_every_token_verified_drafts_included() {
    let mut h = Harness::new(Setup {
        ngram_topk: Some(1),
        ..Setup::default()
    });
    let prompt = counting(10, 30);
    let mut rx = h.submit(GenerateRequest {
        logprobs: Some(2),
        ..request(&prompt, 16)
    });
    h.run();
    let o = outcome(&mut rx);
    assert_eq!(o.tokens, reference(&prompt, 16, &[EOG]));
    assert!(h.stats.snapshot().spec_accepted > 0);
    // The fake's row puts 10 on the model's token and 0 on the 63 others.
    let chosen = 10.0 - (10f32.exp() + 63.0).ln();
    for (&t, (logprob, top)) in o.tokens.iter().zip(&o.logprobs) {
        let lp = logprob.expect("a log-probability for every token");
        assert!((lp - chosen).abs() < 1e-4, "{lp} vs {chosen}");
        assert_eq!(top.len(), 2);
        assert_eq!(top[0].0, t, "the chosen token is the most likely one");
    }
}

/// An engine handle over `config` with no engine thread: the admission checks alone, with the
/// inbox the commands go to.
fn bare_handle(config: EngineConfig) -> (EngineHandle, std::sync::mpsc::Receiver<Command>) {
    let (commands, inbox) = std::sync::mpsc::channel();
    let handle = EngineHandle {
        commands,
        stats: Arc::new(EngineStats::default()),
        config: Arc::new(config),
        next_id: Arc::new(AtomicU64::new(1)),
        closing: Arc::new(AtomicBool::new(false)),
        alive: Arc::new(AtomicBool::new(true)),
    };
    (handle, inbox)
}

#[test]
fn submissions_over_the_limits_are_refused_with_the_reason() {
    // A KV cache of 64 tokens under a context of 80; one running and one queued at most.
    let config = EngineConfig {
        context_length: 80,
        max_queued: 1,
        ..engine_config(&Setup {
            blocks: 16,
            max_running: 1,
            ..Setup::default()
        })
    };
    let (handle, inbox) = bare_handle(config);
    assert_eq!(handle.check(0, 1), Err(SubmitError::EmptyPrompt));
    assert_eq!(handle.check(1, 0), Err(SubmitError::NoTokens));
    assert_eq!(handle.check(60, 4), Ok(()), "exactly the KV cache fits");
    assert!(matches!(
        handle.check(60, 5),
        Err(SubmitError::OverKvCapacity {
            needed: 65,
            limit: 64,
            ..
        })
    ));
    assert!(matches!(
        handle.check(70, 11),
        Err(SubmitError::OverContext {
            needed: 81,
            limit: 80,
            ..
        })
    ));
    assert!(matches!(
        handle.check(usize::MAX, 1),
        Err(SubmitError::OverContext { .. })
    ));
    let a = handle.submit(request(&[1], 1)).unwrap();
    let b = handle.submit(request(&[2], 1)).unwrap();
    assert!(a.id < b.id);
    assert_eq!(
        handle.submit(request(&[3], 1)).unwrap_err(),
        SubmitError::Overloaded(2)
    );
    assert_eq!(handle.in_flight(), 2);
    assert_eq!(
        inbox.try_iter().count(),
        2,
        "only the admitted ones reach the engine"
    );
    handle.close();
    assert_eq!(
        handle.submit(request(&[4], 1)).unwrap_err(),
        SubmitError::ShuttingDown
    );
    // An engine that is gone refuses too, and gives the admission slot back.
    let (handle, inbox) = bare_handle(engine_config(&Setup::default()));
    drop(inbox);
    assert_eq!(
        handle.submit(request(&[5], 1)).unwrap_err(),
        SubmitError::Stopped
    );
    assert_eq!(handle.in_flight(), 0);
}
