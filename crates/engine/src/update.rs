//! The step's update half: sample each sequence that asked for logits (verifying its drafts
//! through the speculator), move accepted draft KV into place, report the step to the
//! scheduler once, then send the tokens and finish what is done.

use crate::active::Active;
use crate::forward::Forward;
use crate::step_loop::Engine;
use crate::{FinishReason, RequestFailure, TokenEvent};
use model::Logits;
use model::sampler::{Sampled, Sampler};
use rayon::prelude::*;
use scheduler::{SeqId, StepOutcome, StepPlan};
use speculative::Verdict;
use std::collections::HashMap;

/// One sequence's result of the step.
struct Row {
    id: SeqId,
    /// The tokens it emits now (up to and including the one that finishes it).
    emitted: Vec<Sampled>,
    finish: Option<FinishReason>,
    failed: Option<RequestFailure>,
}

impl Engine {
    pub(crate) fn update(&mut self, plan: &StepPlan, forward: Forward) {
        let Forward {
            unreadable,
            lost,
            logits,
            seconds,
        } = forward;
        let mut outcome = StepOutcome {
            unreadable,
            ..StepOutcome::default()
        };
        let logits = match logits {
            Some(Ok(logits)) => logits,
            None => {
                self.report(plan, &outcome);
                return;
            }
            Some(Err(e)) => {
                tracing::error!("forward pass failed: {e}");
                self.report(plan, &outcome);
                for b in plan.batch.iter().filter(|b| !lost.contains(&b.id)) {
                    self.fail(b.id, RequestFailure::Forward(e.to_string()));
                }
                return;
            }
        };
        outcome.ran = true;
        if let Some(spec) = self.speculator.as_mut().filter(|_| lost.is_empty()) {
            spec.observe_step(plan, seconds);
            self.stats.set_speculator(spec);
        }
        self.stats.add_step();
        let mut premasked = self.premask(plan, &lost, &logits);
        let mut rows = Vec::new();
        let mut embedded = Vec::new();
        // Entry `j` of the batch is row `i` of the logits (lost entries did not run).
        let mut i = 0;
        for (j, b) in plan.batch.iter().enumerate() {
            if lost.contains(&b.id) {
                continue;
            }
            if let Some(spec) = self.speculator.as_mut() {
                let rows = logits.features(i);
                if !rows.is_empty() {
                    spec.features(b.id, b.start, rows, plan.drafts.contains_key(&b.id));
                }
            }
            if b.logits
                && let Some(hidden) = logits.hidden(i)
            {
                embedded.push((b.id, normalised(hidden)));
            } else if b.logits
                && let Some(row) =
                    self.sample(plan, (j, i), &logits, premasked.remove(&b.id), &mut outcome)
            {
                rows.push(row);
            }
            i += 1;
        }
        self.report(plan, &outcome);
        for row in rows {
            self.deliver(row);
        }
        for (id, vector) in embedded {
            self.deliver_embedding(id, vector);
        }
    }

    /// Ends an embedding request with its vector.
    fn deliver_embedding(&mut self, id: SeqId, vector: Vec<f32>) {
        let Some(a) = self.active.get(&id) else {
            return;
        };
        let events = a.events.clone();
        let prompt_tokens = a.request.prompt.len();
        self.end(id);
        self.stats.add_finished();
        let _ = events.send(TokenEvent::Embedding(vector));
        let _ = events.send(TokenEvent::Finished {
            reason: FinishReason::Stop,
            prompt_tokens,
            completion_tokens: 0,
            spec_accept_length: None,
        });
    }

    /// Tells the scheduler what happened; sequences it sends back lose their draft KV.
    fn report(&mut self, plan: &StepPlan, outcome: &StepOutcome) {
        let requeued = self.scheduler.update(plan, outcome);
        if let Some(spec) = self.speculator.as_mut() {
            for id in requeued {
                spec.lost_kv(id);
            }
        }
    }

    /// The rows of the sequences with a grammar that sample one token this step (no drafts),
    /// masked, all at once on the thread pool: each mask is the grammar's work alone, and at
    /// large batches they would otherwise add up on this thread.
    fn premask(
        &mut self,
        plan: &StepPlan,
        lost: &[SeqId],
        logits: &Logits,
    ) -> HashMap<SeqId, Vec<f32>> {
        let constrained = self.active.values().filter(|a| a.sampler.is_constrained());
        if constrained.take(2).count() < 2 {
            return HashMap::new();
        }
        // Logits row `i` belongs to the `i`-th batch entry that was not lost.
        let rows: HashMap<SeqId, usize> = plan
            .batch
            .iter()
            .filter(|b| !lost.contains(&b.id))
            .enumerate()
            .filter(|(_, b)| b.logits && !plan.drafts.contains_key(&b.id))
            .map(|(i, b)| (b.id, i))
            .collect();
        let mut work: Vec<(SeqId, &mut Sampler, Vec<f32>)> = self
            .active
            .iter_mut()
            .filter(|(id, a)| a.sampler.is_constrained() && rows.contains_key(id))
            .map(|(&id, a)| (id, &mut a.sampler, logits.row(rows[&id], 0).to_vec()))
            .collect();
        if work.len() < 2 {
            return HashMap::new();
        }
        work.par_iter_mut()
            .for_each(|(_, sampler, row)| sampler.premask(row));
        work.into_iter().map(|(id, _, row)| (id, row)).collect()
    }

    /// Samples batch entry `j` (logits entry `i`; `premasked`: its row, masked ahead),
    /// verifying its drafts if it has any; records the kept drafts and its next token in
    /// `outcome`.
    fn sample(
        &mut self,
        plan: &StepPlan,
        (j, i): (usize, usize),
        logits: &Logits,
        premasked: Option<Vec<f32>>,
        outcome: &mut StepOutcome,
    ) -> Option<Row> {
        let (id, start) = (plan.batch[j].id, plan.batch[j].start);
        let a = self.active.get_mut(&id)?;
        let verdict = match (plan.drafts.get(&id), self.speculator.as_mut()) {
            (Some(tree), _) if self.forced.contains(&id) => {
                // Grammar-forced drafts: verified alone (no drafter made them), and not
                // speculation's (its acceptance figures leave them out).
                let v = speculative::verify::walk(
                    tree,
                    |n| logits.row(i, n),
                    &mut a.sampler,
                    a.request.logprobs,
                );
                self.stats.add_forced_drafts(tree.len(), v.path.len());
                v
            }
            (Some(tree), Some(spec)) => {
                let v = spec.verify(
                    id,
                    tree,
                    |n| logits.row(i, n),
                    &mut a.sampler,
                    a.request.logprobs,
                );
                a.verifications += 1;
                a.verified_tokens += v.emitted.len();
                self.stats
                    .add_verification(tree.len(), v.path.len(), !tree.is_chain());
                v
            }
            _ => {
                let mut row = premasked.unwrap_or_else(|| logits.row(i, 0).to_vec());
                Verdict {
                    emitted: vec![a.sampler.sample(&mut row, a.request.logprobs)],
                    path: Vec::new(),
                }
            }
        };
        let (count, finish) = finish_point(a, &self.end_of_generation, &verdict.emitted);
        let mut row = Row {
            id,
            emitted: verdict.emitted,
            finish,
            failed: None,
        };
        row.emitted.truncate(count);
        let (masks, seconds) = a.sampler.take_mask_time();
        if masks > 0 {
            self.stats.add_grammar_masks(masks, seconds);
        }
        if let Some(reason) = a.sampler.constraint_failure() {
            // Its last tokens were forced to an end; what came before stands.
            row.failed = Some(RequestFailure::Grammar(reason));
            return Some(row);
        }
        if plan.drafts.contains_key(&id) {
            // The accepted branch's KV moves to consecutive slots after the root.
            let blocks = &plan.inputs[j].blocks;
            let moved = verdict
                .path
                .iter()
                .enumerate()
                .filter(|&(k, &n)| n != k + 1)
                .try_for_each(|(k, &n)| self.target.move_kv(blocks, start + n, start + k + 1));
            if let Err(e) = moved {
                tracing::error!("moving verified KV failed: {e}");
                row.failed = Some(RequestFailure::Forward(e.to_string()));
                return Some(row);
            }
            outcome
                .kept
                .insert(id, verdict.path.iter().map(|n| n - 1).collect());
        }
        if row.finish.is_none()
            && let Some(last) = row.emitted.last()
        {
            outcome.next.push((id, last.token));
        }
        Some(row)
    }

    /// Sends a row's tokens, then finishes the request if it ended (or failed).
    fn deliver(&mut self, row: Row) {
        if let Some(failure) = row.failed {
            self.fail(row.id, failure);
            return;
        }
        let Some(a) = self.active.get_mut(&row.id) else {
            return;
        };
        for s in row.emitted {
            a.generated += 1;
            self.stats.add_generation_tokens(1);
            let is_stop = is_stop(a, &self.end_of_generation, s.token);
            let _ = a.events.send(TokenEvent::Token {
                id: s.token,
                is_stop,
                logprob: s.logprob,
                top_logprobs: s.top,
                spec_accept_length: a.spec_accept_length(),
            });
        }
        let Some(reason) = row.finish else {
            return;
        };
        let finished = TokenEvent::Finished {
            reason,
            prompt_tokens: a.request.prompt.len(),
            completion_tokens: a.generated,
            spec_accept_length: a.spec_accept_length(),
        };
        let events = a.events.clone();
        self.end(row.id);
        self.stats.add_finished();
        let _ = events.send(finished);
    }
}

/// `v` scaled to unit length (a zero vector stays zero), summed in f64 so the length does not
/// depend on the order of additions' rounding more than f32 would allow.
fn normalised(v: &[f32]) -> Vec<f32> {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm == 0.0 {
        return v.to_vec();
    }
    v.iter().map(|&x| (f64::from(x) / norm) as f32).collect()
}

/// Whether `token` ends the request's generation.
fn is_stop(a: &Active, end_of_generation: &[u32], token: u32) -> bool {
    let eos_ends = !a.request.ignore_eos || a.sampler.is_constrained();
    (eos_ends && end_of_generation.contains(&token)) || a.request.stop_token_ids.contains(&token)
}

/// How many of `emitted` the request takes, and why it finishes there if it does: at the first
/// stop token, or at `max_tokens`.
fn finish_point(
    a: &Active,
    end_of_generation: &[u32],
    emitted: &[Sampled],
) -> (usize, Option<FinishReason>) {
    for (k, s) in emitted.iter().enumerate() {
        if is_stop(a, end_of_generation, s.token) {
            return (k + 1, Some(FinishReason::Stop));
        }
        if a.generated + k + 1 >= a.request.max_tokens {
            return (k + 1, Some(FinishReason::Length));
        }
    }
    (emitted.len(), None)
}
