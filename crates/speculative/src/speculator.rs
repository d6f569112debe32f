//! Speculative decoding as one component. Planning asks it, through
//! [`scheduler::DraftPlanner`], how many draft slots each decoding sequence takes and then for
//! the drafts; after the forward pass [`Speculator::verify`] turns a sequence's rows of logits
//! into accepted tokens. In between it keeps what the policy needs: each sequence's acceptance,
//! acceptance by n-gram match length, and the step cost model with the drafter's own cost.

use crate::adaptive::{self, Demand};
use crate::verify::{self, Verdict};
use crate::{
    Acceptance, Budget, CostModel, DraftRequest, DraftSampling, DraftTree, Drafter, Guess,
};
use crate::{MatchAcceptance, SpecConfig};
use model::sampler::Sampler;
use scheduler::{DraftPlanner, Granted, Load, SeqId, Sequence, StepPlan};
use std::collections::HashMap;
use std::time::Instant;

/// One sequence's state across steps.
#[derive(Debug, Clone)]
struct SeqState {
    max_tokens: usize,
    acceptance: Acceptance,
    /// How its chain drafts are drawn when it samples.
    sampling: Option<DraftSampling>,
}

/// A decoding sequence that may speculate this step.
#[derive(Debug)]
struct Candidate {
    id: SeqId,
    /// Drafts it may take (prompt lookup: the drafts themselves, guessed up front).
    max: usize,
    drafts: DraftTree,
    alpha: f64,
    /// Drafts come after its slots are reserved (a draft model).
    later: bool,
}

/// What a drafter has spent since start-up (where a speculative step's time goes).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DrafterSpent {
    /// Rows caught up on before drafting (an EAGLE-3 head's rows for positions decoded while
    /// the sequence did not draft), and the seconds they took.
    pub catch_up_rows: u64,
    pub catch_up_seconds: f64,
    /// Seconds spent proposing drafts (after catching up).
    pub draft_seconds: f64,
}

/// Speculation's state: the policy, the drafter, acceptance statistics and the cost model.
pub struct Speculator {
    budget: Budget,
    drafter: Box<dyn Drafter>,
    topk: usize,
    num_steps: usize,
    cost: CostModel,
    /// Work of a row that needs logits, relative to one that does not (1 + κ).
    logit_work: f64,
    /// Seconds the drafter spends per draft token (a running average; zero for prompt lookup).
    draft_seconds: f64,
    /// Seconds the drafter spends per row it catches up on (a running average; see
    /// [`Drafter::catch_up`]).
    catch_up_seconds: f64,
    /// What the drafter has spent since start-up.
    spent: DrafterSpent,
    by_match: MatchAcceptance,
    seqs: HashMap<SeqId, SeqState>,
    /// This step's decoding sequences, the candidates granted slots may come from, and the
    /// match length of each sequence's prompt-lookup drafts.
    decoding: Vec<SeqId>,
    candidates: Vec<Candidate>,
    matched: HashMap<SeqId, usize>,
}

impl Speculator {
    /// The component for `config`, pricing a row's logits at `kappa` (κ: the output head's
    /// work per row relative to all layers', see [`adaptive`]; [`crate::config::logits_weight`]),
    /// drafting with `drafter`.
    pub fn new(config: &SpecConfig, kappa: f64, drafter: Box<dyn Drafter>) -> Self {
        let num_draft_tokens = config.num_draft_tokens();
        let budget = if config.adaptive() {
            Budget::Adaptive { num_draft_tokens }
        } else {
            Budget::Fixed(crate::Policy::new(
                num_draft_tokens,
                config.disable_batch_threshold(),
            ))
        };
        Self {
            budget,
            drafter,
            topk: config.topk(),
            num_steps: config.num_steps(),
            cost: CostModel::default(),
            logit_work: 1.0 + kappa,
            draft_seconds: 0.0,
            catch_up_seconds: 0.0,
            spent: DrafterSpent::default(),
            by_match: MatchAcceptance::new(config.longest_match()),
            seqs: HashMap::new(),
            decoding: Vec::new(),
            candidates: Vec::new(),
            matched: HashMap::new(),
        }
    }

    /// A new request that may speculate, with its `max_tokens` and, when it samples, how its
    /// drafts are drawn.
    pub fn add(&mut self, id: SeqId, max_tokens: usize, sampling: Option<DraftSampling>) {
        self.seqs.insert(
            id,
            SeqState {
                max_tokens,
                acceptance: Acceptance::default(),
                sampling,
            },
        );
    }

    /// What the drafter remembers of earlier requests.
    pub fn memory(&self) -> crate::DrafterMemory {
        self.drafter.memory()
    }

    /// Writes what the drafter remembers (see [`Drafter::save`]).
    pub fn save(&self, out: &mut dyn std::io::Write) -> std::io::Result<bool> {
        self.drafter.save(out)
    }

    /// Restores what [`Speculator::save`] wrote (see [`Drafter::restore`]).
    pub fn restore(&mut self, input: &mut dyn std::io::Read, vocab: usize) -> std::io::Result<()> {
        self.drafter.restore(input, vocab)
    }

    /// The request ended with `tokens` (its prompt and output; `None` when they are gone).
    pub fn finish(&mut self, id: SeqId, tokens: Option<&[u32]>) {
        if let Some(tokens) = tokens {
            self.drafter.finished(tokens);
        }
        self.remove(id);
    }

    /// The request ended.
    pub fn remove(&mut self, id: SeqId) {
        self.seqs.remove(&id);
        self.drafter.forget(id.0);
    }

    /// The sequence lost its KV (preempted, or sent back to be recomputed); it keeps its
    /// acceptance statistics.
    pub fn lost_kv(&mut self, id: SeqId) {
        self.drafter.forget(id.0);
    }

    /// The target layers whose residual streams the drafter reads (see
    /// [`Drafter::capture_layers`]).
    pub fn capture_layers(&self) -> Option<[usize; 3]> {
        self.drafter.capture_layers()
    }

    /// Whether the forward pass captures sequence `id`'s streams: it may speculate and the
    /// drafter reads them.
    pub fn captures(&self, id: SeqId) -> bool {
        self.seqs.contains_key(&id) && self.drafter.capture_layers().is_some()
    }

    /// Hands sequence `id`'s captured streams from position `start` on to the drafter
    /// (`verified`: the rows of the draft tree about to be verified).
    pub fn features(&mut self, id: SeqId, start: usize, rows: &[f32], verified: bool) {
        self.drafter.features(id.0, start, rows, verified);
    }

    pub fn is_adaptive(&self) -> bool {
        self.budget.is_adaptive()
    }

    /// κ (see [`Speculator::new`]).
    pub fn kappa(&self) -> f64 {
        self.logit_work - 1.0
    }

    /// A step of `work` (rows plus κ per row with logits) took `seconds`.
    pub fn observe_cost(&mut self, work: f64, seconds: f64) {
        self.cost.observe(work, seconds);
    }

    /// The steps observed so far are the start-up calibration: the cost fit's slope stays
    /// anchored to theirs (see [`CostModel::anchor`]).
    pub fn anchor_cost(&mut self) {
        self.cost.anchor();
    }

    /// Seconds proposing one draft token takes (a moving average of the drafters' calls; 0
    /// before any).
    pub fn draft_seconds(&self) -> f64 {
        self.draft_seconds
    }

    /// Seconds the drafter takes per row it catches up on (a moving average; 0 before any).
    pub fn catch_up_seconds(&self) -> f64 {
        self.catch_up_seconds
    }

    /// What the drafter has spent since start-up, catching up and drafting.
    pub fn spent(&self) -> DrafterSpent {
        self.spent
    }

    /// `(a, b)` of the step cost `a + b·work`.
    pub fn step_cost(&self) -> (f64, f64) {
        self.cost.coefficients()
    }

    /// After the forward pass over `plan` took `seconds`: the cost model learns what a decode
    /// row costs (steps with prompt chunks, rows much cheaper each and without logits, would
    /// bend it, so they are left out).
    pub fn observe_step(&mut self, plan: &StepPlan, seconds: f64) {
        if plan.is_decode_only() {
            let work = plan_work(plan, self.kappa());
            self.cost.observe(work, seconds);
        }
    }

    /// Verifies sequence `id`'s drafts on its rows of logits (`row(n)`: after draft node `n`),
    /// with its sampler; records how many were accepted.
    pub fn verify<'a>(
        &mut self,
        id: SeqId,
        tree: &DraftTree,
        row: impl Fn(usize) -> &'a [f32],
        sampler: &mut Sampler,
        logprobs: Option<usize>,
    ) -> Verdict {
        let verdict = verify::walk(tree, row, sampler, logprobs);
        let accepted = verdict.path.len();
        if let Some(s) = self.seqs.get_mut(&id) {
            s.acceptance.record(tree.len(), accepted);
        }
        if let Some(&n) = self.matched.get(&id) {
            self.by_match.record(n, tree.len(), accepted);
        }
        let tokens: Vec<u32> = verdict.path.iter().map(|&n| tree.token(n)).collect();
        if let Err(e) = self.drafter.accepted(id.0, &verdict.path, &tokens) {
            tracing::error!("the draft model failed: {e}");
            self.drafter.forget(id.0);
        }
        verdict
    }

    /// Levels of a proposal of `max` drafts: a chain is `max` deep, a tree `num_steps`.
    fn depth(&self, max: usize) -> usize {
        if self.topk == 1 {
            max
        } else {
            self.num_steps.min(max)
        }
    }

    /// This step's candidates: each decoding sequence with room under its `max_tokens` and a
    /// guess (or a drafter that drafts after the slots), with its acceptance estimate.
    fn candidates(&mut self, decoding: &[&Sequence], ceiling: usize) -> Vec<Candidate> {
        let mut out = Vec::new();
        for seq in decoding {
            let Some(state) = self.seqs.get(&seq.id) else {
                continue;
            };
            // Never past max_tokens: the bonus token comes on top of the drafts.
            let room = state.max_tokens.saturating_sub(seq.generated().len() + 1);
            let max = ceiling.min(room);
            if max == 0 {
                continue;
            }
            let (drafts, alpha, later) = match self.drafter.guess(seq.tokens(), max, self.topk) {
                Guess::Drafts { tree, matched } => {
                    self.matched.insert(seq.id, matched);
                    (tree, self.by_match.alpha(matched), false)
                }
                Guess::Nothing => continue,
                Guess::AfterSlots => (DraftTree::default(), state.acceptance.alpha(), true),
            };
            out.push(Candidate {
                id: seq.id,
                max: if later { max } else { drafts.len() },
                drafts,
                alpha,
                later,
            });
        }
        out
    }

    /// Adaptive: each candidate's drafts from the cost model (see [`adaptive::allocate`]).
    fn allocate(&self, plan: &StepPlan, decoding: &[&Sequence], load: Load, c: &mut [Candidate]) {
        let remaining = |seq: &Sequence| {
            self.seqs
                .get(&seq.id)
                .map_or(0, |s| s.max_tokens.saturating_sub(seq.generated().len()))
        };
        // Tokens weigh by how far their sequence is from done unless requests wait (see
        // `adaptive`).
        let weights: HashMap<SeqId, f64> = if load.waiting > 0 {
            decoding.iter().map(|s| (s.id, 1.0)).collect()
        } else {
            let left: Vec<usize> = decoding.iter().map(|s| remaining(s)).collect();
            decoding
                .iter()
                .map(|s| s.id)
                .zip(adaptive::urgency(&left))
                .collect()
        };
        let seqs: HashMap<SeqId, &Sequence> = decoding.iter().map(|s| (s.id, *s)).collect();
        let demands: Vec<Demand> = c
            .iter()
            .map(|c| {
                let seq = seqs[&c.id];
                let backlog = self.drafter.backlog(c.id.0, seq.tokens().len());
                let steps_left = remaining(seq) as f64 / (1.0 + c.alpha);
                Demand {
                    alpha: c.alpha,
                    max: c.max,
                    weight: weights[&c.id],
                    once: self.catch_up_seconds * adaptive::catch_up_rows(backlog, steps_left),
                }
            })
            .collect();
        // Time is priced at what this batch earns once every sequence in it decodes: the
        // entries not offered here (prompt chunks, mostly) count as decoding rows of weight 1
        // (a prompt has spent nothing of its budget). A step carrying prompt chunks takes far
        // longer without emitting more: priced at its own rate (its prompt rows at a decode
        // row's cost), drafts would look nearly free, and a batch would draft at a loss while
        // its prompts go in.
        let prefilling = plan
            .batch
            .iter()
            .filter(|b| !weights.contains_key(&b.id))
            .count();
        let tokens: f64 = decoding.iter().map(|s| weights[&s.id]).sum::<f64>() + prefilling as f64;
        let ks = adaptive::allocate(
            &self.cost,
            plan.batch.len() as f64 * self.logit_work,
            self.logit_work,
            self.draft_seconds,
            tokens,
            &demands,
        );
        for (c, k) in c.iter_mut().zip(ks) {
            c.max = k;
            c.drafts.truncate(k);
        }
    }

    /// Drafts the candidates that draft after their slots, in one batched call; a failure
    /// leaves them without drafts.
    fn draft_later(&mut self, granted: &[Granted<'_>], picked: &mut [Candidate]) {
        let who: Vec<usize> = (0..picked.len()).filter(|&i| picked[i].later).collect();
        if who.is_empty() {
            return;
        }
        let requests: Vec<DraftRequest<'_>> = who
            .iter()
            .map(|&i| DraftRequest {
                key: picked[i].id.0,
                tokens: granted[i].seq.tokens(),
                blocks: &granted[i].blocks,
                depth: self.depth(picked[i].max),
                width: self.topk,
                nodes: picked[i].max,
                // Trees keep the most likely candidates, verified as point masses.
                sampling: self
                    .seqs
                    .get(&picked[i].id)
                    .and_then(|s| s.sampling)
                    .filter(|_| self.topk == 1),
            })
            .collect();
        let started = Instant::now();
        let caught_up = self.drafter.catch_up(&requests);
        let took = started.elapsed().as_secs_f64();
        self.spent.catch_up_seconds += took;
        if let Ok(rows) = caught_up
            && rows > 0
        {
            self.spent.catch_up_rows += rows as u64;
            moving_average(&mut self.catch_up_seconds, took / rows as f64);
        }
        let started = Instant::now();
        let drafted = caught_up.and_then(|_| self.drafter.draft(&requests));
        let took = started.elapsed().as_secs_f64();
        self.spent.draft_seconds += took;
        match drafted {
            Ok(trees) => {
                let n: usize = trees.iter().map(DraftTree::len).sum();
                if n > 0 {
                    moving_average(&mut self.draft_seconds, took / n as f64);
                }
                for (&i, tree) in who.iter().zip(trees) {
                    picked[i].drafts = tree;
                }
            }
            Err(e) => {
                tracing::error!("the draft model failed: {e}");
                for &i in &who {
                    self.drafter.forget(picked[i].id.0);
                }
            }
        }
    }
}

impl DraftPlanner for Speculator {
    fn slots(&mut self, plan: &StepPlan, decoding: &[&Sequence], load: Load) -> Vec<usize> {
        self.matched.clear();
        self.decoding = decoding.iter().map(|s| s.id).collect();
        let ceiling = self.budget.ceiling(load.running);
        let mut candidates = self.candidates(decoding, ceiling);
        if self.budget.is_adaptive() {
            self.allocate(plan, decoding, load, &mut candidates);
        }
        candidates.retain(|c| c.max > 0);
        let slots = decoding
            .iter()
            .map(|s| {
                candidates.iter().find(|c| c.id == s.id).map_or(0, |c| {
                    if c.later {
                        self.drafter.slots(self.depth(c.max), self.topk, c.max)
                    } else {
                        c.drafts.len()
                    }
                })
            })
            .collect();
        self.candidates = candidates;
        slots
    }

    fn draft(&mut self, granted: &[Granted<'_>]) -> Vec<DraftTree> {
        let mut candidates = std::mem::take(&mut self.candidates);
        let mut picked: Vec<Candidate> = granted
            .iter()
            .map(|g| {
                let i = candidates
                    .iter()
                    .position(|c| c.id == g.seq.id)
                    .expect("slots are granted to candidates only");
                candidates.swap_remove(i)
            })
            .collect();
        self.draft_later(granted, &mut picked);
        let trees: Vec<DraftTree> = picked.into_iter().map(|c| c.drafts).collect();
        // Sequences that did not speculate drift back towards trying again.
        for id in std::mem::take(&mut self.decoding) {
            let drafted = granted
                .iter()
                .zip(&trees)
                .any(|(g, t)| g.seq.id == id && !t.is_empty());
            if !drafted && let Some(s) = self.seqs.get_mut(&id) {
                s.acceptance.decay();
            }
        }
        trees
    }
}

/// Folds `x` into the running average `avg` (which starts at the first value).
fn moving_average(avg: &mut f64, x: f64) {
    *avg = if *avg == 0.0 { x } else { 0.9 * *avg + 0.1 * x };
}

/// A plan's work: rows, plus κ for each row that needs logits (every row of a sequence with
/// drafts; the last row of the others that want logits).
fn plan_work(plan: &StepPlan, kappa: f64) -> f64 {
    plan.batch
        .iter()
        .map(|b| {
            let logit_rows = if plan.drafts.contains_key(&b.id) {
                b.len
            } else {
                usize::from(b.logits)
            };
            b.len as f64 + kappa * logit_rows as f64
        })
        .sum()
}

#[cfg(test)]
mod tests;
