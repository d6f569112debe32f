//! Speculative decoding as one component. Planning asks it, through
//! [`scheduler::DraftPlanner`], how many draft slots each decoding sequence takes and then for
//! the drafts; after the forward pass [`Speculator::verify`] turns a sequence's rows of logits
//! into accepted tokens. In between it keeps what the policy needs: each sequence's acceptance,
//! acceptance by n-gram match length, and the step cost model with each drafter's own cost.
//!
//! Several drafters combine (`--speculative-algorithm EAGLE3,SUFFIX`): each step, each
//! sequence asks every drafter and takes the one whose drafts raise the step's tokens a second
//! the most under the cost model ([`adaptive::best_rate`]: its acceptance for that sequence or
//! match length, its own seconds a draft and catching up), so a repeating text takes suffix
//! drafts, fresh text the head's, and neither when neither pays. The drafters that did not
//! draft still see what was verified ([`Drafter::observed`]), so a head stays caught up.

use crate::adaptive::{self, Demand};
use crate::verify::{self, Verdict};
use crate::{
    Acceptance, Algorithm, Budget, CostModel, DraftRequest, DraftSampling, DraftTree, Drafter,
    Guess,
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
    /// Its acceptance of each drafter's drafts (in the drafters' order).
    acceptance: Vec<Acceptance>,
    /// How its chain drafts are drawn when it samples.
    sampling: Option<DraftSampling>,
}

/// A decoding sequence that may speculate this step.
#[derive(Debug)]
struct Candidate {
    id: SeqId,
    /// The drafter that drafts for it (an index into the drafters).
    drafter: usize,
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

impl std::ops::AddAssign for DrafterSpent {
    fn add_assign(&mut self, o: Self) {
        self.catch_up_rows += o.catch_up_rows;
        self.catch_up_seconds += o.catch_up_seconds;
        self.draft_seconds += o.draft_seconds;
    }
}

/// What one drafter's drafts did since start-up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrafterCounts {
    /// Verifications of its drafts (a sequence's step it drafted for), the draft tokens
    /// verified, and those accepted.
    pub chosen: u64,
    pub proposed: u64,
    pub accepted: u64,
}

/// One drafter's figures (`/metrics`, `/server_info`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrafterReport {
    pub algorithm: Algorithm,
    pub counts: DrafterCounts,
    pub spent: DrafterSpent,
}

/// One drafter with what the policy has learnt of it.
struct Entry {
    algorithm: Algorithm,
    drafter: Box<dyn Drafter>,
    /// Most drafts it proposes for a sequence in a step.
    num_draft_tokens: usize,
    /// Seconds it spends per draft token (a running average; zero for prompt lookup).
    draft_seconds: f64,
    /// Seconds it spends per row it catches up on (a running average; see
    /// [`Drafter::catch_up`]).
    catch_up_seconds: f64,
    spent: DrafterSpent,
    /// Acceptance by the length of the match its drafts continue (prompt lookup, suffixes).
    by_match: MatchAcceptance,
    counts: DrafterCounts,
}

/// Which drafter drafted for a sequence this step, and the match length its drafts continue.
#[derive(Debug, Clone, Copy)]
struct Chosen {
    drafter: usize,
    matched: Option<usize>,
}

/// What a step is priced at before drafts (see [`adaptive`]): each decoding sequence's weight,
/// the weighted tokens it emits, and its work.
struct StepPrice {
    weights: HashMap<SeqId, f64>,
    tokens: f64,
    work: f64,
}

/// Speculation's state: the policy, the drafters, acceptance statistics and the cost model.
pub struct Speculator {
    budget: Budget,
    drafters: Vec<Entry>,
    topk: usize,
    num_steps: usize,
    cost: CostModel,
    /// Work of a row that needs logits, relative to one that does not (1 + κ).
    logit_work: f64,
    seqs: HashMap<SeqId, SeqState>,
    /// This step's decoding sequences, the candidates granted slots may come from, and who
    /// drafted for each sequence that speculates.
    decoding: Vec<SeqId>,
    candidates: Vec<Candidate>,
    chosen: HashMap<SeqId, Chosen>,
}

impl Speculator {
    /// The component for `config`, pricing a row's logits at `kappa` (κ: the output head's
    /// work per row relative to all layers', see [`adaptive`]; [`crate::config::logits_weight`]),
    /// drafting with `drafter` (the config's first algorithm).
    pub fn new(config: &SpecConfig, kappa: f64, drafter: Box<dyn Drafter>) -> Self {
        let first = config.algorithm().iter().next().unwrap_or(Algorithm::Ngram);
        Self::with_drafters(config, kappa, vec![(first, drafter)])
    }

    /// [`Speculator::new`] with several drafters, each named by its algorithm (one of the
    /// config's), the first preferred where two are worth the same.
    pub fn with_drafters(
        config: &SpecConfig,
        kappa: f64,
        drafters: Vec<(Algorithm, Box<dyn Drafter>)>,
    ) -> Self {
        let num_draft_tokens = config.num_draft_tokens();
        let budget = if config.adaptive() {
            Budget::Adaptive { num_draft_tokens }
        } else {
            Budget::Fixed(crate::Policy::new(
                num_draft_tokens,
                config.disable_batch_threshold(),
            ))
        };
        let drafters = drafters
            .into_iter()
            .map(|(algorithm, drafter)| Entry {
                algorithm,
                drafter,
                num_draft_tokens: match config.num_draft_tokens_of(algorithm) {
                    0 => num_draft_tokens,
                    n => n,
                },
                draft_seconds: 0.0,
                catch_up_seconds: 0.0,
                spent: DrafterSpent::default(),
                by_match: MatchAcceptance::new(config.longest_match(algorithm)),
                counts: DrafterCounts::default(),
            })
            .collect();
        Self {
            budget,
            drafters,
            topk: config.topk(),
            num_steps: config.num_steps(),
            cost: CostModel::default(),
            logit_work: 1.0 + kappa,
            seqs: HashMap::new(),
            decoding: Vec::new(),
            candidates: Vec::new(),
            chosen: HashMap::new(),
        }
    }

    /// A new request that may speculate, with its `max_tokens` and, when it samples, how its
    /// drafts are drawn.
    pub fn add(&mut self, id: SeqId, max_tokens: usize, sampling: Option<DraftSampling>) {
        self.seqs.insert(
            id,
            SeqState {
                max_tokens,
                acceptance: vec![Acceptance::default(); self.drafters.len()],
                sampling,
            },
        );
    }

    /// What the drafters remember of earlier requests.
    pub fn memory(&self) -> crate::DrafterMemory {
        let mut m = crate::DrafterMemory::default();
        for e in &self.drafters {
            let d = e.drafter.memory();
            m.requests += d.requests;
            m.tokens += d.tokens;
            m.bytes += d.bytes;
        }
        m
    }

    /// The drafter that remembers earlier requests, if one does (`SUFFIX`).
    fn remembering(&self) -> Option<&Entry> {
        self.drafters
            .iter()
            .find(|e| e.algorithm == Algorithm::Suffix)
    }

    /// Writes what the drafter that remembers holds (see [`Drafter::save`]).
    pub fn save(&self, out: &mut dyn std::io::Write) -> std::io::Result<bool> {
        self.remembering()
            .map_or(Ok(false), |e| e.drafter.save(out))
    }

    /// Restores what [`Speculator::save`] wrote (see [`Drafter::restore`]).
    pub fn restore(&mut self, input: &mut dyn std::io::Read, vocab: usize) -> std::io::Result<()> {
        match self
            .drafters
            .iter_mut()
            .find(|e| e.algorithm == Algorithm::Suffix)
        {
            Some(e) => e.drafter.restore(input, vocab),
            None => Ok(()),
        }
    }

    /// The request ended with `tokens` (its prompt and output; `None` when they are gone).
    pub fn finish(&mut self, id: SeqId, tokens: Option<&[u32]>) {
        if let Some(tokens) = tokens {
            for e in &mut self.drafters {
                e.drafter.finished(tokens);
            }
        }
        self.remove(id);
    }

    /// The request ended.
    pub fn remove(&mut self, id: SeqId) {
        self.seqs.remove(&id);
        self.lost_kv(id);
    }

    /// The sequence lost its KV (preempted, or sent back to be recomputed); it keeps its
    /// acceptance statistics.
    pub fn lost_kv(&mut self, id: SeqId) {
        for e in &mut self.drafters {
            e.drafter.forget(id.0);
        }
    }

    /// The target layers whose residual streams a drafter reads (see
    /// [`Drafter::capture_layers`]; one drafter at most reads them).
    pub fn capture_layers(&self) -> Option<[usize; 3]> {
        self.drafters
            .iter()
            .find_map(|e| e.drafter.capture_layers())
    }

    /// Whether the forward pass captures sequence `id`'s streams: it may speculate and a
    /// drafter reads them.
    pub fn captures(&self, id: SeqId) -> bool {
        self.seqs.contains_key(&id) && self.capture_layers().is_some()
    }

    /// Hands sequence `id`'s captured streams from position `start` on to the drafter that
    /// reads them (`verified`: the rows of the draft tree about to be verified).
    pub fn features(&mut self, id: SeqId, start: usize, rows: &[f32], verified: bool) {
        for e in &mut self.drafters {
            if e.drafter.capture_layers().is_some() {
                e.drafter.features(id.0, start, rows, verified);
            }
        }
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

    /// Seconds proposing one draft token takes (a moving average of the dearest drafter's
    /// calls; 0 before any).
    pub fn draft_seconds(&self) -> f64 {
        self.drafters
            .iter()
            .map(|e| e.draft_seconds)
            .fold(0.0, f64::max)
    }

    /// Seconds a drafter takes per row it catches up on (a moving average; 0 before any).
    pub fn catch_up_seconds(&self) -> f64 {
        self.drafters
            .iter()
            .map(|e| e.catch_up_seconds)
            .fold(0.0, f64::max)
    }

    /// What the drafters have spent since start-up, catching up and drafting.
    pub fn spent(&self) -> DrafterSpent {
        let mut all = DrafterSpent::default();
        for e in &self.drafters {
            all += e.spent;
        }
        all
    }

    /// Each drafter's figures, in the order given.
    pub fn drafters(&self) -> impl Iterator<Item = DrafterReport> + '_ {
        self.drafters.iter().map(|e| DrafterReport {
            algorithm: e.algorithm,
            counts: e.counts,
            spent: e.spent,
        })
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
    /// with its sampler; records how many were accepted, for the drafter that drafted them.
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
        let chosen = self.chosen.get(&id).copied().unwrap_or(Chosen {
            drafter: 0,
            matched: None,
        });
        if let Some(s) = self.seqs.get_mut(&id) {
            s.acceptance[chosen.drafter].record(tree.len(), accepted);
        }
        let entry = &mut self.drafters[chosen.drafter];
        if let Some(n) = chosen.matched {
            entry.by_match.record(n, tree.len(), accepted);
        }
        entry.counts.chosen += 1;
        entry.counts.proposed += tree.len() as u64;
        entry.counts.accepted += accepted as u64;
        let tokens: Vec<u32> = verdict.path.iter().map(|&n| tree.token(n)).collect();
        for (i, e) in self.drafters.iter_mut().enumerate() {
            let told = if i == chosen.drafter {
                e.drafter.accepted(id.0, &verdict.path, &tokens)
            } else {
                e.drafter.observed(id.0, &verdict.path, &tokens)
            };
            if let Err(err) = told {
                tracing::error!("the draft model failed: {err}");
                e.drafter.forget(id.0);
            }
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

    /// Tokens sequence `seq` may still emit under its `max_tokens`.
    fn remaining(&self, seq: &Sequence) -> usize {
        self.seqs
            .get(&seq.id)
            .map_or(0, |s| s.max_tokens.saturating_sub(seq.generated().len()))
    }

    /// The step's price before drafts (see [`Speculator::allocate`] for why it is so).
    fn price(&self, plan: &StepPlan, decoding: &[&Sequence], load: Load) -> StepPrice {
        // Tokens weigh by how far their sequence is from done unless requests wait (see
        // `adaptive`).
        let weights: HashMap<SeqId, f64> = if load.waiting > 0 {
            decoding.iter().map(|s| (s.id, 1.0)).collect()
        } else {
            let left: Vec<usize> = decoding.iter().map(|s| self.remaining(s)).collect();
            decoding
                .iter()
                .map(|s| s.id)
                .zip(adaptive::urgency(&left))
                .collect()
        };
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
        let tokens = decoding.iter().map(|s| weights[&s.id]).sum::<f64>() + prefilling as f64;
        StepPrice {
            weights,
            tokens,
            work: plan.batch.len() as f64 * self.logit_work,
        }
    }

    /// What candidate `c` of sequence `seq` asks of the policy.
    fn demand(&self, c: &Candidate, seq: &Sequence, weight: f64) -> Demand {
        let e = &self.drafters[c.drafter];
        let backlog = e.drafter.backlog(c.id.0, seq.tokens().len());
        let steps_left = self.remaining(seq) as f64 / (1.0 + c.alpha);
        Demand {
            alpha: c.alpha,
            max: c.max,
            weight,
            once: e.catch_up_seconds * adaptive::catch_up_rows(backlog, steps_left),
            draft_seconds: e.draft_seconds,
        }
    }

    /// Drafter `i`'s offer for `seq`, at most `max` drafts: `None` when it has nothing.
    fn offer(
        &mut self,
        i: usize,
        seq: &Sequence,
        max: usize,
    ) -> Option<(Candidate, Option<usize>)> {
        let (topk, acceptance) = (self.topk, self.seqs.get(&seq.id)?.acceptance[i].alpha());
        let e = &mut self.drafters[i];
        let max = max.min(e.num_draft_tokens);
        if max == 0 {
            return None;
        }
        let (drafts, alpha, later, matched) = match e.drafter.guess(seq.tokens(), max, topk) {
            Guess::Drafts { tree, matched } => {
                let alpha = e.by_match.alpha(matched);
                (tree, alpha, false, Some(matched))
            }
            Guess::Nothing => return None,
            Guess::AfterSlots => (DraftTree::default(), acceptance, true, None),
        };
        let c = Candidate {
            id: seq.id,
            drafter: i,
            max: if later { max } else { drafts.len() },
            drafts,
            alpha,
            later,
        };
        Some((c, matched))
    }

    /// This step's candidates: each decoding sequence with room under its `max_tokens` and a
    /// drafter with something to offer, with its acceptance estimate. Where several drafters
    /// offer, the one whose drafts would raise the step's rate most is taken.
    fn candidates(
        &mut self,
        plan: &StepPlan,
        decoding: &[&Sequence],
        load: Load,
        ceiling: usize,
    ) -> Vec<Candidate> {
        // With several drafters, the step's tokens and seconds before drafts and a draft row's
        // price, once for the step: what each offer's rate is measured against.
        let pricing = (self.drafters.len() > 1).then(|| {
            let p = self.price(plan, decoding, load);
            let row = self.cost.coefficients().1 * self.logit_work;
            (p.tokens, self.cost.predict(p.work), row)
        });
        let mut out = Vec::new();
        for seq in decoding {
            let Some(max_tokens) = self.seqs.get(&seq.id).map(|s| s.max_tokens) else {
                continue;
            };
            // Never past max_tokens: the bonus token comes on top of the drafts.
            let room = max_tokens.saturating_sub(seq.generated().len() + 1);
            let max = ceiling.min(room);
            if max == 0 {
                continue;
            }
            let mut best: Option<(f64, Candidate, Option<usize>)> = None;
            for i in 0..self.drafters.len() {
                let Some((c, matched)) = self.offer(i, seq, max) else {
                    continue;
                };
                let rate = pricing.map_or(0.0, |(tokens, seconds, row)| {
                    adaptive::best_rate(tokens, seconds, row, &self.demand(&c, seq, 1.0))
                });
                if best.as_ref().is_none_or(|(r, ..)| rate > *r) {
                    best = Some((rate, c, matched));
                }
            }
            if let Some((_, c, matched)) = best {
                self.chosen.insert(
                    seq.id,
                    Chosen {
                        drafter: c.drafter,
                        matched,
                    },
                );
                out.push(c);
            }
        }
        out
    }

    /// Adaptive: each candidate's drafts from the cost model (see [`adaptive::allocate`]).
    fn allocate(&self, plan: &StepPlan, decoding: &[&Sequence], load: Load, c: &mut [Candidate]) {
        let price = self.price(plan, decoding, load);
        let seqs: HashMap<SeqId, &Sequence> = decoding.iter().map(|s| (s.id, *s)).collect();
        let demands: Vec<Demand> = c
            .iter()
            .map(|c| self.demand(c, seqs[&c.id], price.weights[&c.id]))
            .collect();
        let ks = adaptive::allocate(
            &self.cost,
            price.work,
            self.logit_work,
            price.tokens,
            &demands,
        );
        for (c, k) in c.iter_mut().zip(ks) {
            c.max = k;
            c.drafts.truncate(k);
        }
    }

    /// Drafts the candidates that draft after their slots, a batched call per drafter; a
    /// failure leaves that drafter's candidates without drafts.
    fn draft_later(&mut self, granted: &[Granted<'_>], picked: &mut [Candidate]) {
        for d in 0..self.drafters.len() {
            let who: Vec<usize> = (0..picked.len())
                .filter(|&i| picked[i].later && picked[i].drafter == d)
                .collect();
            if !who.is_empty() {
                self.draft_with(d, &who, granted, picked);
            }
        }
    }

    /// Drafter `d`'s drafts for candidates `who` of `picked` (granted `granted`).
    fn draft_with(
        &mut self,
        d: usize,
        who: &[usize],
        granted: &[Granted<'_>],
        picked: &mut [Candidate],
    ) {
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
        let e = &mut self.drafters[d];
        let started = Instant::now();
        let caught_up = e.drafter.catch_up(&requests);
        let took = started.elapsed().as_secs_f64();
        e.spent.catch_up_seconds += took;
        if let Ok(rows) = caught_up
            && rows > 0
        {
            e.spent.catch_up_rows += rows as u64;
            moving_average(&mut e.catch_up_seconds, took / rows as f64);
        }
        let started = Instant::now();
        let drafted = caught_up.and_then(|_| e.drafter.draft(&requests));
        let took = started.elapsed().as_secs_f64();
        e.spent.draft_seconds += took;
        match drafted {
            Ok(trees) => {
                let n: usize = trees.iter().map(DraftTree::len).sum();
                if n > 0 {
                    moving_average(&mut e.draft_seconds, took / n as f64);
                }
                for (&i, tree) in who.iter().zip(trees) {
                    picked[i].drafts = tree;
                }
            }
            Err(err) => {
                tracing::error!("the draft model failed: {err}");
                for &i in who {
                    e.drafter.forget(picked[i].id.0);
                }
            }
        }
    }
}

impl DraftPlanner for Speculator {
    fn slots(&mut self, plan: &StepPlan, decoding: &[&Sequence], load: Load) -> Vec<usize> {
        self.chosen.clear();
        self.decoding = decoding.iter().map(|s| s.id).collect();
        let ceiling = self.budget.ceiling(load.running);
        let mut candidates = self.candidates(plan, decoding, load, ceiling);
        if self.budget.is_adaptive() {
            self.allocate(plan, decoding, load, &mut candidates);
        }
        candidates.retain(|c| c.max > 0);
        let slots = decoding
            .iter()
            .map(|s| {
                candidates.iter().find(|c| c.id == s.id).map_or(0, |c| {
                    if c.later {
                        let d = &self.drafters[c.drafter].drafter;
                        d.slots(self.depth(c.max), self.topk, c.max)
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
        // A sequence's estimates of the drafters that did not draft for it drift back towards
        // trying again.
        for id in std::mem::take(&mut self.decoding) {
            let drafted = granted
                .iter()
                .zip(&trees)
                .any(|(g, t)| g.seq.id == id && !t.is_empty());
            let by = self.chosen.get(&id).filter(|_| drafted).map(|c| c.drafter);
            if let Some(s) = self.seqs.get_mut(&id) {
                for (i, a) in s.acceptance.iter_mut().enumerate() {
                    if by != Some(i) {
                        a.decay();
                    }
                }
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
