//! The engine thread: take commands, drop requests whose client went away, plan a step, run one
//! batched forward pass, sample, send tokens, finish what is done. Blocks on its inbox when idle.

use crate::{Command, EngineConfig, EngineStats, FinishReason, GenerateRequest, TokenEvent};
use kvcache::BlockPool;
use model::sampler::Sampler;
use model::{LogitsFor, Model, Runner, SeqInput};
use scheduler::{Scheduler, SchedulerConfig, SeqId, StepPlan};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use tokio::sync::mpsc::UnboundedSender;

/// A request the engine is working on.
struct Active {
    request: GenerateRequest,
    events: UnboundedSender<TokenEvent>,
    sampler: Sampler,
    generated: usize,
}

pub(crate) struct Engine {
    model: Model,
    runner: Runner,
    scheduler: Scheduler,
    active: HashMap<SeqId, Active>,
    end_of_generation: Vec<u32>,
    stats: Arc<EngineStats>,
}

impl Engine {
    pub(crate) fn new(
        model: Model,
        config: &EngineConfig,
        sched: SchedulerConfig,
        end_of_generation: Vec<u32>,
        stats: Arc<EngineStats>,
    ) -> Self {
        let blocks = config.kv_blocks();
        let pool = BlockPool::with_blocks(config.block_size, blocks as u32)
            .expect("start() checked the block size and count");
        let scheduler = Scheduler::new(sched, pool).expect("start() validated the config");
        let runner = Runner::new(&model.config, config.block_size, blocks);
        Self {
            model,
            runner,
            scheduler,
            active: HashMap::new(),
            end_of_generation,
            stats,
        }
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
            let plan = self.scheduler.schedule();
            self.stats.add_preemptions(plan.preempted.len() as u64);
            self.publish_load();
            if plan.is_empty() {
                self.fail_unrunnable();
                continue;
            }
            self.step(&plan);
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
                let sampler = Sampler::new(request.sampling.clone(), &request.prompt);
                self.scheduler.add(id, request.prompt.clone());
                self.active.insert(
                    id,
                    Active {
                        request,
                        events,
                        sampler,
                        generated: 0,
                    },
                );
            }
            Command::Stop(id) => {
                if self.active.contains_key(&id) {
                    self.end(id);
                    self.stats.add_finished();
                }
            }
        }
    }

    /// Removes a request from the engine and frees its blocks and admission slot; the published
    /// load reflects it before the request's last event goes out.
    fn end(&mut self, id: SeqId) {
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

    fn publish_load(&self) {
        self.stats.set_load(
            self.scheduler.running_len(),
            self.scheduler.waiting_len(),
            self.scheduler.pool().used_blocks(),
        );
    }

    /// One forward pass over the plan, then sampling for the sequences that asked for logits.
    fn step(&mut self, plan: &StepPlan) {
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
                    logits: if b.logits {
                        LogitsFor::Last
                    } else {
                        LogitsFor::None
                    },
                }
            })
            .collect();
        let result = self.runner.forward(&self.model, &inputs);
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
            let Some(a) = self.active.get_mut(&b.id) else {
                continue;
            };
            let mut row = logits.last(i).to_vec();
            let sampled = a.sampler.sample(&mut row, a.request.logprobs);
            a.generated += 1;
            self.stats.add_generation_tokens(1);
            let token = sampled.token;
            let is_stop = (!a.request.ignore_eos && self.end_of_generation.contains(&token))
                || a.request.stop_token_ids.contains(&token);
            let _ = a.events.send(TokenEvent::Token {
                id: token,
                is_stop,
                logprob: sampled.logprob,
                top_logprobs: sampled.top,
            });
            let reason = if is_stop {
                Some(FinishReason::Stop)
            } else if a.generated >= a.request.max_tokens {
                Some(FinishReason::Length)
            } else {
                None
            };
            match reason {
                Some(reason) => {
                    let (events, prompt_tokens, completion_tokens) =
                        (a.events.clone(), a.request.prompt.len(), a.generated);
                    self.end(b.id);
                    self.stats.add_finished();
                    let _ = events.send(TokenEvent::Finished {
                        reason,
                        prompt_tokens,
                        completion_tokens,
                    });
                }
                None => self.scheduler.push_token(b.id, token),
            }
        }
    }
}
