//! Adaptive speculation's start-up calibration: a few measured steps seed the step-cost fit,
//! so drafts are priced from this machine from the first request.

use crate::step_loop::Engine;
use model::{LogitsFor, SeqInput};
use std::time::Instant;

/// Tokens of context the calibration decodes after, and the most rows in one of its steps.
const CONTEXT: usize = 64;
const MAX_ROWS: usize = 9;

/// Sequence `table`'s input: its context as a prefill (`rows` 0), or `rows` decode rows after it.
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

impl Engine {
    /// Adaptive speculation: seeds the step-cost fit with steps measured on this machine before
    /// the first request (decodes of 1, 5 and 9 rows with logits, for one sequence and for four
    /// after a 64-token context), so drafts are priced from the start; otherwise a server
    /// loaded at once would price them from a guess and might never try any. The KV written
    /// goes to free blocks, which a sequence always overwrites before reading.
    pub(crate) fn calibrate(&mut self) {
        let Some(spec) = self.speculator.as_mut().filter(|s| s.is_adaptive()) else {
            return;
        };
        let vocab = self.target.vocab_size() as u32;
        let tokens: Vec<u32> = (0..(CONTEXT + MAX_ROWS) as u32)
            .map(|i| (100 + i * 7919) % vocab)
            .collect();
        let per_seq = (CONTEXT + MAX_ROWS).div_ceil(self.scheduler.pool().block_size());
        let free = self.scheduler.pool().free_blocks();
        let seqs = (free / per_seq).min(4);
        if seqs == 0 || CONTEXT + MAX_ROWS > self.target.context_length() {
            return;
        }
        let tables: Vec<Vec<u32>> = (0..seqs)
            .map(|i| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect())
            .collect();
        let prefill: Vec<SeqInput<'_>> = tables.iter().map(|t| input(&tokens, t, 0)).collect();
        if self.target.forward(&prefill, None).is_err() {
            return;
        }
        let kappa = spec.kappa();
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
                if self.target.forward(&batch, None).is_err() {
                    return;
                }
                let work = (n * rows) as f64 * (1.0 + kappa);
                spec.observe_cost(work, started.elapsed().as_secs_f64());
            }
        }
        spec.anchor_cost();
        let (a, b) = spec.step_cost();
        tracing::info!(
            "adaptive speculation: a step costs {:.2} ms + {:.3} ms per row (calibrated)",
            a * 1e3,
            b * 1e3
        );
        self.stats.set_speculator(spec);
    }
}
