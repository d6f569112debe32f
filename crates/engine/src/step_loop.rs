//! The engine thread: take commands, drop requests whose client went away, plan a step, run one
//! batched forward pass, sample, send tokens, finish what is done. Blocks on its inbox when idle.

use crate::kv_files::KvFiles;
use crate::{Command, EngineConfig, EngineStats, FinishReason, GenerateRequest, TokenEvent};
use kvcache::{BlockPool, KvCopy};
use model::sampler::Sampled;
use model::sampler::Sampler;
use model::{LogitsFor, Model, Runner, SeqInput, Tree};
use scheduler::{Scheduler, SchedulerConfig, SeqId, StepPlan};
use speculative::adaptive::Demand;
use speculative::{
    Acceptance, Algorithm, CostModel, DraftModel, DraftRequest, DraftTree, MatchAcceptance,
    NgramProposer, Policy, PolicyConfig,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// A request the engine is working on.
struct Active {
    request: GenerateRequest,
    events: UnboundedSender<TokenEvent>,
    sampler: Sampler,
    generated: usize,
    /// Speculative verifications of this request and the tokens they emitted.
    verifications: usize,
    verified_tokens: usize,
    acceptance: Acceptance,
    /// Whether `TokenEvent::Admitted` went out.
    announced: bool,
}

/// Where drafts come from.
enum Drafter {
    /// Prompt lookup (`NGRAM`).
    Ngram(NgramProposer),
    /// A draft model (`STANDALONE`).
    Model(Box<DraftModel>),
}

/// Speculation's state: the policy, the drafter, and (adaptive) the step cost model.
struct Speculation {
    policy: Policy,
    drafter: Drafter,
    /// Draft-tree shape: candidates per node (1 = chains) and, for a draft model, levels.
    topk: usize,
    num_steps: usize,
    adaptive: bool,
    cost: CostModel,
    /// Work of a row that needs logits, relative to one that does not (1 + κ).
    logit_work: f64,
    /// Seconds the drafter spends per draft token (a running average; zero for prompt lookup).
    draft_seconds: f64,
    /// Prompt lookup: acceptance by match length, and this step's match length per sequence.
    by_match: MatchAcceptance,
    matched: HashMap<SeqId, usize>,
}

/// A decoding sequence that may speculate this step.
struct Candidate {
    id: SeqId,
    /// Drafts it may take (prompt lookup: the drafts themselves, proposed up front).
    max: usize,
    drafts: DraftTree,
    alpha: f64,
}

/// κ: the output head's multiply-adds per row relative to all layers' (see `speculative::adaptive`).
fn logits_weight(c: &model::ModelConfig) -> f64 {
    let q = c.n_heads * c.head_dim;
    let per_layer = c.hidden * (q + 2 * c.kv_dim()) + q * c.hidden + 3 * c.hidden * c.ffn_hidden;
    (c.vocab_size * c.hidden) as f64 / (c.n_layers * per_layer) as f64
}

/// A plan's work: rows, plus κ for each row that needs logits (every row of a sequence with
/// drafts; the last row of others that want logits).
fn plan_work(plan: &StepPlan, kappa: f64, drafted: &HashMap<SeqId, DraftTree>) -> f64 {
    plan.batch
        .iter()
        .map(|b| {
            let logit_rows = if drafted.contains_key(&b.id) {
                b.len
            } else {
                usize::from(b.logits)
            };
            b.len as f64 + kappa * logit_rows as f64
        })
        .sum()
}

pub(crate) struct Engine {
    model: Model,
    runner: Runner,
    scheduler: Scheduler,
    active: HashMap<SeqId, Active>,
    end_of_generation: Vec<u32>,
    stats: Arc<EngineStats>,
    speculation: Option<Speculation>,
    /// The prefix cache's host tier: `Runner::block_floats` floats per slot (pages are touched
    /// only as blocks are demoted into them).
    host_kv: Vec<f32>,
    /// The storage tier's files.
    files: Option<KvFiles>,
}

impl Engine {
    pub(crate) fn new(
        model: Model,
        draft: Option<Model>,
        config: &EngineConfig,
        sched: SchedulerConfig,
        end_of_generation: Vec<u32>,
        stats: Arc<EngineStats>,
        files: Option<KvFiles>,
    ) -> Self {
        let blocks = config.kv_blocks();
        let pool = BlockPool::with_blocks(config.block_size, blocks as u32)
            .expect("start() checked the block size and count");
        let mut scheduler = Scheduler::new(sched, pool).expect("start() validated the config");
        if let Some(f) = &files {
            scheduler.enable_storage();
            let paths = f.list();
            let restored = paths.iter().filter(|p| scheduler.restore_stored(p)).count();
            tracing::info!(restored, "prefix cache: stored blocks found");
        }
        let runner = Runner::new(&model.config, config.block_size, blocks);
        let host_kv = vec![0.0; sched.host_blocks as usize * runner.block_floats()];
        let speculation = config.speculative.map(|c| Speculation {
            policy: Policy::new(PolicyConfig {
                num_draft_tokens: c.num_draft_tokens,
                disable_batch_threshold: c.disable_batch_threshold,
            }),
            drafter: match (c.algorithm, draft) {
                (Algorithm::Standalone, Some(d)) => {
                    Drafter::Model(Box::new(DraftModel::new(d, config.block_size, blocks)))
                }
                _ => Drafter::Ngram(
                    NgramProposer::new(c.ngram_min_window, c.ngram_max_window)
                        .expect("start() validated the windows"),
                ),
            },
            topk: c.topk,
            num_steps: c.num_steps,
            adaptive: c.adaptive,
            cost: CostModel::default(),
            logit_work: 1.0 + logits_weight(&model.config),
            draft_seconds: 0.0,
            by_match: MatchAcceptance::new(c.ngram_max_window),
            matched: HashMap::new(),
        });
        let mut engine = Self {
            model,
            runner,
            scheduler,
            active: HashMap::new(),
            end_of_generation,
            stats,
            speculation,
            host_kv,
            files,
        };
        engine.calibrate();
        engine
    }

    /// Adaptive speculation: seeds the step-cost fit with steps measured on this machine before
    /// the first request (decodes of 1, 5 and 9 rows with logits, for one sequence and for four
    /// after a 64-token context), so drafts are priced from the start; otherwise a server
    /// loaded at once would price them from a guess and might never try any. The KV written
    /// goes to free blocks, which a sequence always overwrites before reading.
    fn calibrate(&mut self) {
        let Some(spec) = self.speculation.as_mut().filter(|s| s.adaptive) else {
            return;
        };
        const CONTEXT: usize = 64;
        const MAX_ROWS: usize = 9;
        let vocab = self.model.config.vocab_size as u32;
        let tokens: Vec<u32> = (0..(CONTEXT + MAX_ROWS) as u32)
            .map(|i| (100 + i * 7919) % vocab)
            .collect();
        let per_seq = (CONTEXT + MAX_ROWS).div_ceil(self.runner.block_size());
        let free = self.scheduler.pool().free_blocks();
        let seqs = (free / per_seq).min(4);
        if seqs == 0 || CONTEXT + MAX_ROWS > self.model.config.context_length {
            return;
        }
        let tables: Vec<Vec<u32>> = (0..seqs)
            .map(|i| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect())
            .collect();
        fn input<'a>(tokens: &'a [u32], table: &'a [u32], rows: usize) -> SeqInput<'a> {
            let prefill = rows == 0;
            SeqInput {
                tokens: if prefill {
                    &tokens[..CONTEXT]
                } else {
                    &tokens[CONTEXT..CONTEXT + rows]
                },
                start_pos: if prefill { 0 } else { CONTEXT },
                blocks: table,
                logits: if prefill {
                    LogitsFor::None
                } else {
                    LogitsFor::All
                },
                tree: None,
            }
        }
        let prefill: Vec<SeqInput<'_>> = tables.iter().map(|t| input(&tokens, t, 0)).collect();
        if self.runner.forward(&self.model, &prefill).is_err() {
            return;
        }
        let kappa = spec.logit_work - 1.0;
        for _ in 0..3 {
            for (n, rows) in [
                (1, 1),
                (1, 5),
                (1, MAX_ROWS),
                (seqs, 1),
                (seqs, 3),
                (seqs, 5),
            ] {
                let batch: Vec<SeqInput<'_>> = tables[..n]
                    .iter()
                    .map(|t| input(&tokens, t, rows))
                    .collect();
                let started = Instant::now();
                if self.runner.forward(&self.model, &batch).is_err() {
                    return;
                }
                let work = (n * rows) as f64 * (1.0 + kappa);
                spec.cost.observe(work, started.elapsed().as_secs_f64());
            }
        }
        let (a, b) = spec.cost.coefficients();
        tracing::info!(
            "adaptive speculation: a step costs {:.2} ms + {:.3} ms per row (calibrated)",
            a * 1e3,
            b * 1e3
        );
        self.stats.set_step_cost(a, b);
    }

    /// Runs until every handle is gone.
    pub(crate) fn run(mut self, inbox: Receiver<Command>) {
        loop {
            if self.scheduler.is_idle() {
                self.publish_load();
                match inbox.recv() {
                    Ok(cmd) => self.handle(cmd),
                    Err(_) => return,
                }
            }
            while let Ok(cmd) = inbox.try_recv() {
                self.handle(cmd);
            }
            self.drop_abandoned();
            let mut plan = self.scheduler.schedule();
            self.stats.add_preemptions(plan.preempted.len() as u64);
            for &id in &plan.preempted {
                self.forget_drafts(id);
            }
            self.announce_admissions(&plan);
            self.publish_load();
            if plan.is_empty() {
                for id in self.copy_between_tiers() {
                    self.forget_drafts(id);
                    self.scheduler.requeue(id);
                }
                self.fail_unrunnable();
                continue;
            }
            let mut drafts = self.propose(&mut plan);
            let lost = self.copy_between_tiers();
            if !lost.is_empty() {
                // Their cached prefix was unreadable (and is forgotten): recompute them.
                plan.batch.retain(|b| !lost.contains(&b.id));
                for id in lost {
                    drafts.remove(&id);
                    self.forget_drafts(id);
                    self.scheduler.requeue(id);
                }
                if plan.is_empty() {
                    continue;
                }
            }
            self.step(&plan, drafts);
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Submit {
                id,
                request,
                events,
            } => {
                self.stats.add_prompt_tokens(request.prompt.len());
                let sampler = Sampler::new(request.sampling.clone(), &request.prompt)
                    .with_script(request.scripted.clone());
                self.scheduler.add(id, request.prompt.clone());
                self.active.insert(
                    id,
                    Active {
                        request,
                        events,
                        sampler,
                        generated: 0,
                        verifications: 0,
                        verified_tokens: 0,
                        acceptance: Acceptance::default(),
                        announced: false,
                    },
                );
            }
            Command::Stop(id) => {
                if self.active.contains_key(&id) {
                    self.end(id);
                    self.stats.add_finished();
                }
            }
            Command::PersistCache(reply) => {
                self.copy_between_tiers();
                let _ = reply.send(self.persist_cache());
            }
            Command::FlushCache(reply) => {
                let flushed = self.scheduler.flush_cache();
                if let Ok(blocks) = flushed {
                    tracing::info!(blocks, "prefix cache flushed");
                }
                self.publish_load();
                let _ = reply.send(flushed);
            }
        }
    }

    /// Removes a request from the engine and frees its blocks and admission slot; the published
    /// load reflects it before the request's last event goes out.
    fn end(&mut self, id: SeqId) {
        self.forget_drafts(id);
        self.scheduler.finish(id);
        self.active.remove(&id);
        self.stats.release_admission();
        self.publish_load();
    }

    /// Requests whose receiver was dropped (the client disconnected) end now.
    fn drop_abandoned(&mut self) {
        let gone: Vec<SeqId> = self
            .active
            .iter()
            .filter(|(_, a)| a.events.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            tracing::debug!(request = id.0, "client gone: request aborted");
            self.end(id);
            self.stats.add_aborted();
        }
    }

    /// With nothing running, a waiting request that still cannot be scheduled never will be
    /// (admission checks make this unreachable); fail it rather than spin.
    fn fail_unrunnable(&mut self) {
        if self.scheduler.running_len() > 0 || self.scheduler.is_idle() {
            return;
        }
        for id in self.scheduler.ids() {
            self.fail(id, "the request does not fit in the KV cache");
        }
    }

    fn fail(&mut self, id: SeqId, message: &str) {
        let events = self.active.get(&id).map(|a| a.events.clone());
        self.end(id);
        if let Some(events) = events {
            let _ = events.send(TokenEvent::Failed(message.to_string()));
        }
    }

    /// Makes the copies between the prefix cache's tiers that planning queued, in order, before
    /// the forward pass can overwrite a demoted block. Returns the requests whose reused
    /// prefix could not be read back from storage.
    fn copy_between_tiers(&mut self) -> Vec<SeqId> {
        let floats = self.runner.block_floats();
        let slot = |h: kvcache::BlockId| h.index() * floats..(h.index() + 1) * floats;
        let mut unreadable = Vec::new();
        for copy in self.scheduler.take_copies() {
            let done = match copy {
                KvCopy::ToHost { device, host } => self
                    .runner
                    .save_block(device.0, &mut self.host_kv[slot(host)])
                    .map_err(|e| e.to_string()),
                KvCopy::ToDevice { host, device } => self
                    .runner
                    .load_block(device.0, &self.host_kv[slot(host)])
                    .map_err(|e| e.to_string()),
                KvCopy::HostToStorage { host, key, tokens } => match &self.files {
                    Some(f) => f
                        .write(key, &tokens, &self.host_kv[slot(host)])
                        .map_err(|e| format!("cannot write a stored block: {e}")),
                    None => Ok(()),
                },
                KvCopy::StorageToDevice {
                    key,
                    device,
                    tokens,
                } => {
                    let mut data = vec![0.0; floats];
                    let read = match &self.files {
                        Some(f) => f
                            .read(key, Some(&tokens), &mut data)
                            .map_err(|e| e.to_string()),
                        None => Err("no storage tier".into()),
                    };
                    let done = read.and_then(|()| {
                        self.runner
                            .load_block(device.0, &data)
                            .map_err(|e| e.to_string())
                    });
                    if done.is_err() {
                        unreadable.push(device.0);
                    }
                    done
                }
            };
            if let Err(e) = done {
                tracing::error!("KV copy between cache tiers failed: {e}");
            }
        }
        // A block that could not be read back holds nothing valid. It is still pinned, so the
        // requests holding it are the ones that took the prefix: the cache forgets it, and the
        // caller sends them back to be recomputed.
        let mut lost = Vec::new();
        for &block in &unreadable {
            self.scheduler.forget_cached_block(block);
            lost.extend(self.active.keys().copied().filter(|&id| {
                self.scheduler
                    .get(id)
                    .is_some_and(|s| s.block_ids().contains(&block))
            }));
        }
        self.scheduler.unpin_cache_blocks();
        lost.sort();
        lost.dedup();
        lost
    }

    /// Writes every cached block the storage tier lacks (a shutdown); returns how many.
    fn persist_cache(&mut self) -> usize {
        let Some(files) = &self.files else {
            return 0;
        };
        let floats = self.runner.block_floats();
        let mut data = vec![0.0; floats];
        let mut written = 0;
        for block in self.scheduler.persist_cache() {
            let read = match block.from {
                Ok(device) => self
                    .runner
                    .save_block(device.0, &mut data)
                    .map_err(|e| e.to_string()),
                Err(host) => {
                    let at = host.index() * floats;
                    data.copy_from_slice(&self.host_kv[at..at + floats]);
                    Ok(())
                }
            };
            match read.and_then(|()| {
                files
                    .write(block.key, &block.tokens, &data)
                    .map_err(|e| e.to_string())
            }) {
                Ok(()) => written += 1,
                Err(e) => tracing::error!("cannot store a cached block: {e}"),
            }
        }
        tracing::info!(written, "prefix cache written to the storage tier");
        written
    }

    /// Tells newly scheduled requests how much of their prompt the prefix cache supplied.
    fn announce_admissions(&mut self, plan: &StepPlan) {
        for b in &plan.batch {
            let Some(a) = self.active.get_mut(&b.id).filter(|a| !a.announced) else {
                continue;
            };
            let Some(cached) = self
                .scheduler
                .get(b.id)
                .and_then(|s| s.cached_prompt_tokens())
            else {
                continue;
            };
            a.announced = true;
            let _ = a.events.send(TokenEvent::Admitted {
                cached_tokens: cached,
            });
        }
    }

    fn publish_load(&self) {
        // Idle cached blocks are free for any request (evicted on demand), as SGLang counts.
        let cache = self.scheduler.cache_stats();
        self.stats.set_load(
            self.scheduler.running_len(),
            self.scheduler.waiting_len(),
            self.scheduler.pool().used_blocks() - cache.idle_blocks,
        );
        self.stats.set_cache(cache);
    }

    /// A sequence's draft-model KV is gone (it ended or lost its blocks).
    fn forget_drafts(&mut self, id: SeqId) {
        if let Some(Speculation {
            drafter: Drafter::Model(d),
            ..
        }) = self.speculation.as_mut()
        {
            d.forget(id.0);
        }
    }

    /// Drafts for the plan's decoding sequences, as the policy allows; each accepted into the
    /// plan by the scheduler (KV slots reserved) is returned with its sequence.
    fn propose(&mut self, plan: &mut StepPlan) -> HashMap<SeqId, DraftTree> {
        let mut out = HashMap::new();
        let Some(spec) = self.speculation.as_mut() else {
            return out;
        };
        spec.matched.clear();
        let per_sequence = if spec.adaptive {
            spec.policy.config().num_draft_tokens
        } else {
            spec.policy
                .drafts_per_sequence(self.scheduler.running_len())
        };
        let decoding: Vec<SeqId> = plan
            .batch
            .iter()
            .filter(|b| b.len == 1 && b.logits && b.start > 0)
            .map(|b| b.id)
            .collect();
        if decoding.is_empty() {
            return out;
        }
        let mut candidates: Vec<Candidate> = Vec::new();
        for &id in &decoding {
            let Some(a) = self.active.get(&id) else {
                continue;
            };
            // Never past max_tokens: the bonus token comes on top of the drafts.
            let room = a.request.max_tokens.saturating_sub(a.generated + 1);
            let max = per_sequence.min(room);
            if max == 0 {
                continue;
            }
            let (drafts, alpha) = match &mut spec.drafter {
                Drafter::Ngram(p) => {
                    let tokens = self.scheduler.get(id).expect("scheduled").tokens();
                    let found = if spec.topk == 1 {
                        p.lookup(tokens, max).map(|(d, n)| (DraftTree::chain(d), n))
                    } else {
                        p.lookup_tree(tokens, max, spec.topk)
                    };
                    let Some((d, matched)) = found else {
                        continue;
                    };
                    spec.matched.insert(id, matched);
                    (d, spec.by_match.alpha(matched))
                }
                Drafter::Model(_) => (DraftTree::default(), a.acceptance.alpha()),
            };
            candidates.push(Candidate {
                id,
                max: if drafts.is_empty() { max } else { drafts.len() },
                drafts,
                alpha,
            });
        }
        if spec.adaptive {
            // Tokens weigh by how far their sequence is from done unless requests wait (see
            // `speculative::adaptive`).
            let weights: HashMap<SeqId, f64> = if self.scheduler.waiting_len() > 0 {
                decoding.iter().map(|&id| (id, 1.0)).collect()
            } else {
                let remaining: Vec<usize> = decoding
                    .iter()
                    .map(|id| {
                        self.active
                            .get(id)
                            .map_or(0, |a| a.request.max_tokens.saturating_sub(a.generated))
                    })
                    .collect();
                decoding
                    .iter()
                    .copied()
                    .zip(speculative::adaptive::urgency(&remaining))
                    .collect()
            };
            let demands: Vec<Demand> = candidates
                .iter()
                .map(|c| Demand {
                    alpha: c.alpha,
                    max: c.max,
                    weight: weights[&c.id],
                })
                .collect();
            let work = plan_work(plan, spec.logit_work - 1.0, &HashMap::new());
            let ks = speculative::adaptive::allocate(
                &spec.cost,
                work,
                spec.logit_work,
                spec.draft_seconds,
                decoding.iter().map(|id| weights[id]).sum(),
                &demands,
            );
            for (c, k) in candidates.iter_mut().zip(ks) {
                c.max = k;
                c.drafts.truncate(k);
            }
        }
        candidates.retain(|c| c.max > 0);
        if let Drafter::Model(draft) = &mut spec.drafter {
            // The draft model writes KV for its drafts into the sequence's blocks: reserve
            // them first, then draft for every sequence in one batched pass per round. A chain
            // is `max` levels deep; a tree `num_steps`, its best `max` nodes verified.
            let (topk, num_steps) = (spec.topk, spec.num_steps);
            let depth = |max: usize| if topk == 1 { max } else { num_steps.min(max) };
            candidates.retain(|c| {
                let slots = DraftRequest::slots(depth(c.max), topk, c.max);
                self.scheduler.reserve_drafts(plan, c.id, slots)
            });
            let tables: Vec<Vec<u32>> = candidates
                .iter()
                .map(|c| self.scheduler.get(c.id).expect("running").block_ids())
                .collect();
            let requests: Vec<DraftRequest<'_>> = candidates
                .iter()
                .zip(&tables)
                .map(|(c, blocks)| DraftRequest {
                    key: c.id.0,
                    tokens: self.scheduler.get(c.id).expect("running").tokens(),
                    blocks,
                    depth: depth(c.max),
                    width: topk,
                    nodes: c.max,
                })
                .collect();
            let started = Instant::now();
            match draft.propose(&requests) {
                Ok(drafts) => {
                    let n: usize = drafts.iter().map(DraftTree::len).sum();
                    if n > 0 {
                        let per_token = started.elapsed().as_secs_f64() / n as f64;
                        spec.draft_seconds = if spec.draft_seconds == 0.0 {
                            per_token
                        } else {
                            0.9 * spec.draft_seconds + 0.1 * per_token
                        };
                    }
                    for (c, d) in candidates.iter_mut().zip(drafts) {
                        c.drafts = d;
                    }
                }
                Err(e) => {
                    tracing::error!("the draft model failed: {e}");
                    for c in &mut candidates {
                        draft.forget(c.id.0);
                        c.drafts = DraftTree::default();
                    }
                }
            }
        }
        for c in candidates {
            if c.drafts.is_empty() {
                continue;
            }
            if self.scheduler.add_drafts(plan, c.id, c.drafts.tokens()) {
                out.insert(c.id, c.drafts);
            } else if let Drafter::Model(d) = &mut spec.drafter
                && let Err(e) = d.resolve(c.id.0, &[])
            {
                tracing::error!("the draft model failed: {e}");
                d.forget(c.id.0);
            }
        }
        // Sequences that did not speculate drift back towards trying again.
        for id in decoding.iter().filter(|id| !out.contains_key(id)) {
            if let Some(a) = self.active.get_mut(id) {
                a.acceptance.decay();
            }
        }
        self.stats.add_spec_step(!out.is_empty());
        out
    }

    /// One forward pass over the plan, then sampling (or verifying drafts) for the sequences
    /// that asked for logits.
    fn step(&mut self, plan: &StepPlan, mut drafts: HashMap<SeqId, DraftTree>) {
        let blocks: Vec<Vec<u32>> = plan
            .batch
            .iter()
            .map(|b| self.scheduler.get(b.id).expect("scheduled").block_ids())
            .collect();
        let inputs: Vec<SeqInput<'_>> = plan
            .batch
            .iter()
            .zip(&blocks)
            .map(|(b, blocks)| {
                let seq = self.scheduler.get(b.id).expect("scheduled");
                SeqInput {
                    tokens: &seq.tokens()[b.start..b.start + b.len],
                    start_pos: b.start,
                    blocks,
                    logits: if drafts.contains_key(&b.id) {
                        LogitsFor::All
                    } else if b.logits {
                        LogitsFor::Last
                    } else {
                        LogitsFor::None
                    },
                    // A chain needs no tree attention: its rows are consecutive positions.
                    tree: drafts.get(&b.id).filter(|t| !t.is_chain()).map(|t| Tree {
                        root: b.start,
                        parents: t.parents(),
                    }),
                }
            })
            .collect();
        let started = Instant::now();
        let result = self.runner.forward(&self.model, &inputs);
        // The fit learns what a decode row costs: steps with prompt chunks (rows much cheaper
        // each, and no logits) would bend it.
        let decode_only = plan
            .batch
            .iter()
            .all(|b| b.start > 0 && (b.len == 1 || drafts.contains_key(&b.id)));
        if let Some(spec) = self.speculation.as_mut().filter(|_| decode_only) {
            let work = plan_work(plan, spec.logit_work - 1.0, &drafts);
            spec.cost.observe(work, started.elapsed().as_secs_f64());
            if spec.adaptive {
                let (a, b) = spec.cost.coefficients();
                self.stats.set_step_cost(a, b);
            }
        }
        drop(inputs);
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("forward pass failed: {e}");
                for b in &plan.batch {
                    self.fail(b.id, &format!("the forward pass failed: {e}"));
                }
                return;
            }
        };
        self.scheduler.commit(plan);
        self.stats.add_step();
        for (i, b) in plan.batch.iter().enumerate() {
            if !b.logits {
                continue;
            }
            let draft = drafts.remove(&b.id).unwrap_or_default();
            let Some(a) = self.active.get_mut(&b.id) else {
                continue;
            };
            // Row n is draft node n (row 0 the sequence's last token): walk down from the root,
            // verifying each node's children on its row and following the one the target
            // chose; the row where the walk stops gives one more token of the model's own.
            let mut emitted: Vec<Sampled> = Vec::with_capacity(draft.len() + 1);
            let mut path: Vec<usize> = Vec::new();
            let mut node = 0;
            loop {
                let mut row = logits.row(i, node).to_vec();
                let children = draft.children(node);
                if children.is_empty() {
                    emitted.push(a.sampler.sample(&mut row, a.request.logprobs));
                    break;
                }
                let tokens: Vec<u32> = children.iter().map(|&c| draft.token(c)).collect();
                let (s, which) = a.sampler.verify(&mut row, &tokens, a.request.logprobs);
                emitted.push(s);
                match which {
                    Some(w) => {
                        node = children[w];
                        path.push(node);
                    }
                    None => break,
                }
            }
            if !draft.is_empty() {
                let accepted = path.len();
                a.verifications += 1;
                a.verified_tokens += emitted.len();
                a.acceptance.record(draft.len(), accepted);
                self.stats
                    .add_verification(draft.len(), accepted, !draft.is_chain());
                // The accepted branch's KV moves to consecutive slots after the root.
                let moved = path
                    .iter()
                    .enumerate()
                    .filter(|&(k, &n)| n != k + 1)
                    .try_for_each(|(k, &n)| {
                        self.runner
                            .move_kv(&blocks[i], b.start + n, b.start + k + 1)
                    });
                if let Err(e) = moved {
                    tracing::error!("moving verified KV failed: {e}");
                    self.fail(b.id, &format!("the forward pass failed: {e}"));
                    continue;
                }
                let kept: Vec<usize> = path.iter().map(|n| n - 1).collect();
                self.scheduler.resolve_drafts(b.id, &kept);
                if let Some(spec) = self.speculation.as_mut() {
                    match &mut spec.drafter {
                        Drafter::Model(d) => {
                            let tokens: Vec<u32> = path.iter().map(|&n| draft.token(n)).collect();
                            if let Err(e) = d.resolve(b.id.0, &tokens) {
                                tracing::error!("the draft model failed: {e}");
                                d.forget(b.id.0);
                            }
                        }
                        Drafter::Ngram(_) => {
                            if let Some(n) = spec.matched.get(&b.id) {
                                spec.by_match.record(*n, draft.len(), accepted);
                            }
                        }
                    }
                }
            }
            let last = emitted.last().map(|s| s.token);
            let mut finished = false;
            for s in emitted {
                if self.emit(b.id, s) {
                    finished = true;
                    break;
                }
            }
            if !finished && let Some(token) = last {
                self.scheduler.push_token(b.id, token);
            }
        }
    }

    /// Sends one generated token; finishes the request if it ends there. True if it did.
    fn emit(&mut self, id: SeqId, sampled: Sampled) -> bool {
        let Some(a) = self.active.get_mut(&id) else {
            return true;
        };
        a.generated += 1;
        self.stats.add_generation_tokens(1);
        let token = sampled.token;
        let is_stop = (!a.request.ignore_eos && self.end_of_generation.contains(&token))
            || a.request.stop_token_ids.contains(&token);
        let spec_accept_length =
            (a.verifications > 0).then(|| a.verified_tokens as f32 / a.verifications as f32);
        let _ = a.events.send(TokenEvent::Token {
            id: token,
            is_stop,
            logprob: sampled.logprob,
            top_logprobs: sampled.top,
            spec_accept_length,
        });
        let reason = if is_stop {
            FinishReason::Stop
        } else if a.generated >= a.request.max_tokens {
            FinishReason::Length
        } else {
            return false;
        };
        let finished = TokenEvent::Finished {
            reason,
            prompt_tokens: a.request.prompt.len(),
            completion_tokens: a.generated,
            spec_accept_length,
        };
        let events = a.events.clone();
        self.end(id);
        self.stats.add_finished();
        let _ = events.send(finished);
        true
    }
}
