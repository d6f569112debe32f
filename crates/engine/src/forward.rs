//! The step's forward half: make the plan's copies between cache tiers, then run one batched
//! forward pass over the plan's entries (less those whose cached prefix could not be read).
//! Reads the plan and changes only the KV (through the target and the tiers); what happened goes
//! to the update as a [`Forward`].

use crate::target::Target;
use crate::tiers::Tiers;
use model::{Capture, Logits, LogitsFor, ModelError, SeqInput, Tree};
use scheduler::{Scheduler, SeqId, StepPlan};
use speculative::Speculator;
use std::time::Instant;

/// What the forward half did.
pub(crate) struct Forward {
    /// Device blocks a copy from storage could not fill.
    pub(crate) unreadable: Vec<u32>,
    /// Batch entries left out: they hold an unreadable block and are to be recomputed.
    pub(crate) lost: Vec<SeqId>,
    /// The logits (rows of the entries that ran, in batch order), or why there are none; `None`
    /// when nothing ran.
    pub(crate) logits: Option<Result<Logits, ModelError>>,
    pub(crate) seconds: f64,
}

/// Runs `plan` on `target`: the tier copies, then one batched pass (capturing the speculator's
/// layers for the sequences it drafts; the final hidden state, not logits, for the sequences
/// `embeds` names); `scheduler` names the entries a failed copy loses.
pub(crate) fn forward(
    target: &mut dyn Target,
    tiers: &mut Tiers,
    scheduler: &Scheduler,
    speculator: Option<&Speculator>,
    (plan, embeds): (&StepPlan, &dyn Fn(SeqId) -> bool),
) -> Forward {
    let unreadable = tiers.copy_all(target, &plan.copies);
    let lost = scheduler.holders(&unreadable);
    let inputs: Vec<SeqInput<'_>> = plan
        .batch
        .iter()
        .zip(&plan.inputs)
        .filter(|(b, _)| !lost.contains(&b.id))
        .map(|(b, input)| {
            let draft = plan.drafts.get(&b.id);
            SeqInput {
                tokens: &input.tokens,
                start_pos: b.start,
                blocks: &input.blocks,
                logits: if draft.is_some() {
                    LogitsFor::All
                } else if b.logits && embeds(b.id) {
                    LogitsFor::Hidden
                } else if b.logits {
                    LogitsFor::Last
                } else {
                    LogitsFor::None
                },
                // A chain needs no tree attention: its rows are consecutive positions.
                tree: draft.filter(|t| !t.is_chain()).map(|t| Tree {
                    root: b.start,
                    parents: t.parents(),
                }),
            }
        })
        .collect();
    if inputs.is_empty() {
        return Forward {
            unreadable,
            lost,
            logits: None,
            seconds: 0.0,
        };
    }
    // The drafter's streams, for the sequences that may speculate.
    let ran = plan.batch.iter().filter(|b| !lost.contains(&b.id));
    let spec = speculator;
    let marks: Vec<bool> = ran
        .map(|b| spec.is_some_and(|s| s.captures(b.id)))
        .collect();
    let layers = spec.and_then(|s| s.capture_layers());
    let capture = layers
        .as_ref()
        .filter(|_| marks.contains(&true))
        .map(|layers| Capture {
            layers,
            seqs: &marks,
        });
    let started = Instant::now();
    let logits = target.forward(&inputs, capture);
    Forward {
        unreadable,
        lost,
        logits: Some(logits),
        seconds: started.elapsed().as_secs_f64(),
    }
}
