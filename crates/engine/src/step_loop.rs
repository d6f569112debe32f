//! The engine thread: take commands, drop requests whose client went away, then run one step in
//! one direction: plan (the scheduler, with speculation drafting for its decodes) → forward (the
//! tier copies, one batched pass) → update (verify and sample, report to the scheduler, send
//! tokens, finish what is done). Blocks on its inbox when idle.

use crate::active::Active;
use crate::forward::forward;
use crate::grammar_drafts::GrammarGuard;
use crate::kv_files::KvFiles;
use crate::target::Target;
use crate::tiers::Tiers;
use crate::{Command, EngineConfig, EngineStats, RequestFailure, TokenEvent};
use kvcache::BlockPool;
use model::sampler::Sampler;
use scheduler::{DraftPlanner, Scheduler, SchedulerConfig, SeqId, StepPlan};
use speculative::Speculator;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::Instant;

pub(crate) struct Engine {
    pub(crate) target: Box<dyn Target>,
    pub(crate) scheduler: Scheduler,
    pub(crate) active: HashMap<SeqId, Active>,
    pub(crate) end_of_generation: Vec<u32>,
    pub(crate) stats: Arc<EngineStats>,
    pub(crate) speculator: Option<Speculator>,
    /// Whether sequences the speculator does not draft draft what their grammar forces.
    pub(crate) grammar_forced_drafts: bool,
    /// `--test-engine-fault` (tests only).
    test_fault: Option<crate::TestFault>,
    /// The sequences whose drafts this step are grammar-forced ones.
    pub(crate) forced: HashSet<SeqId>,
    pub(crate) tiers: Tiers,
}

impl Engine {
    /// The engine over `target`, with `speculator` when speculation is on; calibrates the
    /// adaptive policy's step costs before it returns.
    pub(crate) fn new(
        target: Box<dyn Target>,
        speculator: Option<Speculator>,
        config: &EngineConfig,
        sched: SchedulerConfig,
        end_of_generation: Vec<u32>,
        stats: Arc<EngineStats>,
        files: Option<KvFiles>,
    ) -> Self {
        let pool = BlockPool::with_blocks(config.block_size, config.kv_blocks() as u32)
            .expect("start() checked the block size and count");
        let mut scheduler = Scheduler::new(sched, pool).expect("start() validated the config");
        if let Some(f) = &files {
            scheduler.enable_storage();
            let paths = f.list();
            let restored = paths.iter().filter(|p| scheduler.restore_stored(p)).count();
            tracing::info!(restored, "prefix cache: stored blocks found");
        }
        let tiers = Tiers::new(sched.host_blocks as usize * target.block_bytes(), files);
        let mut engine = Self {
            target,
            scheduler,
            active: HashMap::new(),
            end_of_generation,
            stats,
            speculator,
            grammar_forced_drafts: config.grammar_forced_drafts,
            test_fault: config.test_fault,
            forced: HashSet::new(),
            tiers,
        };
        engine.restore_drafter_memory();
        engine.calibrate();
        engine
    }

    /// With a storage tier, what the drafter remembered before a restart (SUFFIX's cache) is
    /// taken back; a file that cannot be read is left out, with a warning.
    fn restore_drafter_memory(&mut self) {
        let (Some(files), Some(spec)) = (self.tiers.files(), self.speculator.as_mut()) else {
            return;
        };
        match files.restore_drafter(spec, self.target.vocab_size()) {
            Ok(true) => {
                let m = spec.memory();
                tracing::info!(
                    requests = m.requests,
                    tokens = m.tokens,
                    "drafter memory restored"
                );
                self.stats.set_speculator(spec);
            }
            Ok(false) => {}
            Err(e) => tracing::warn!("the drafter's memory could not be read: {e}"),
        }
    }

    /// With a storage tier, what the drafter remembers is written out (a shutdown).
    fn save_drafter_memory(&self) {
        let (Some(files), Some(spec)) = (self.tiers.files(), self.speculator.as_ref()) else {
            return;
        };
        if let Err(e) = files.save_drafter(spec) {
            tracing::warn!("the drafter's memory could not be written: {e}");
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
            self.turn();
        }
    }

    /// What the loop does once its commands are in: drop what was abandoned, then one step.
    pub(crate) fn turn(&mut self) {
        self.drop_abandoned();
        self.make_test_fault();
        self.step();
    }

    /// `--test-engine-fault`: once a request after the warm-up (ids from 2) is active.
    fn make_test_fault(&self) {
        let Some(fault) = self.test_fault else {
            return;
        };
        if self.active.keys().any(|id| id.0 >= 2) {
            match fault {
                crate::TestFault::Panic => panic!("--test-engine-fault panic"),
                crate::TestFault::Hang => loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                },
            }
        }
    }

    /// One step: plan → forward → update (each timed, for speculation's step breakdown).
    fn step(&mut self) {
        let started = Instant::now();
        let plan = self.plan();
        let planned = Instant::now();
        let active = &self.active;
        let embeds = |id: SeqId| active.get(&id).is_some_and(|a| a.request.embed);
        let forward = forward(
            self.target.as_mut(),
            &mut self.tiers,
            &self.scheduler,
            self.speculator.as_ref(),
            (&plan, &embeds),
        );
        let ran = Instant::now();
        self.update(&plan, forward);
        if self.speculator.is_some() && plan.decodes > 0 && plan.is_decode_only() {
            let phases = [planned - started, ran - planned, ran.elapsed()];
            self.stats.add_step_phases(self.speculated(&plan), phases);
        }
        if plan.is_empty() {
            self.fail_unrunnable();
        }
    }

    /// The scheduler's plan for this step, speculation drafting for its decodes.
    fn plan(&mut self) -> StepPlan {
        let constrained = self.active.values().any(|a| a.sampler.is_constrained());
        let mut guard = (self.speculator.is_some() || constrained).then(|| {
            GrammarGuard::new(
                self.speculator.as_mut(),
                &mut self.active,
                self.grammar_forced_drafts,
            )
        });
        let plan = self
            .scheduler
            .plan(guard.as_mut().map(|g| g as &mut dyn DraftPlanner));
        self.forced = guard.map(GrammarGuard::into_forced).unwrap_or_default();
        self.stats.add_preemptions(plan.preempted.len() as u64);
        let speculated = self.speculated(&plan);
        if let Some(spec) = self.speculator.as_mut() {
            for &id in &plan.preempted {
                spec.lost_kv(id);
            }
            if plan.decodes > 0 {
                self.stats.add_spec_step(speculated);
            }
        }
        self.announce_admissions(&plan);
        self.publish_load();
        plan
    }

    /// Whether a sequence of `plan` verifies the speculator's drafts (grammar-forced ones are
    /// not speculation's).
    fn speculated(&self, plan: &StepPlan) -> bool {
        plan.drafts.keys().any(|id| !self.forced.contains(id))
    }

    pub(crate) fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Submit {
                id,
                mut request,
                events,
            } => {
                self.stats.add_prompt_tokens(request.prompt.len());
                let sampler = Sampler::new(request.sampling.clone(), &request.prompt)
                    .with_script(request.scripted.clone())
                    .with_constraint(request.constraint.take());
                self.scheduler.add(id, request.prompt.clone());
                if let Some(spec) = self.speculator.as_mut() {
                    let sampling = (!request.sampling.is_greedy() && request.scripted.is_empty())
                        .then_some(speculative::DraftSampling {
                            temperature: request.sampling.temperature,
                            seed: request.sampling.seed,
                        });
                    spec.add(id, request.max_tokens, sampling);
                }
                self.active.insert(
                    id,
                    Active {
                        request,
                        events,
                        sampler,
                        generated: 0,
                        verifications: 0,
                        verified_tokens: 0,
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
                let written = if self.tiers.has_storage() {
                    let blocks = self.scheduler.persist_cache();
                    self.tiers.persist(self.target.as_ref(), blocks)
                } else {
                    0
                };
                self.save_drafter_memory();
                let _ = reply.send(written);
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
    pub(crate) fn end(&mut self, id: SeqId) {
        let seq = self.scheduler.finish(id);
        if let Some(spec) = self.speculator.as_mut() {
            spec.finish(id, seq.as_ref().map(|s| s.tokens()));
            // What the drafter remembers has changed (SUFFIX's cache), and no step may follow.
            self.stats.set_speculator(spec);
        }
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
            self.fail(id, RequestFailure::DoesNotFit);
        }
    }

    pub(crate) fn fail(&mut self, id: SeqId, failure: RequestFailure) {
        let events = self.active.get(&id).map(|a| a.events.clone());
        self.end(id);
        if let Some(events) = events {
            let _ = events.send(TokenEvent::Failed(failure));
        }
    }

    /// Tells newly scheduled requests how much of their prompt the prefix cache supplied.
    fn announce_admissions(&mut self, plan: &StepPlan) {
        for (b, input) in plan.batch.iter().zip(&plan.inputs) {
            let Some(a) = self.active.get_mut(&b.id).filter(|a| !a.announced) else {
                continue;
            };
            let Some(cached) = input.cached_prompt_tokens else {
                continue;
            };
            a.announced = true;
            let _ = a.events.send(TokenEvent::Admitted {
                cached_tokens: cached,
            });
        }
    }

    pub(crate) fn publish_load(&self) {
        // Idle cached blocks are free for any request (evicted on demand), as SGLang counts.
        let cache = self.scheduler.cache_stats();
        self.stats.set_load(
            self.scheduler.running_len(),
            self.scheduler.waiting_len(),
            self.scheduler.pool().used_blocks() - cache.idle_blocks,
        );
        self.stats.set_cache(cache);
    }
}
