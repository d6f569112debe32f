//! What the engine needs of the target model, as one trait: a batched forward pass over paged
//! KV, and the block copies the cache tiers and verified drafts make. [`ModelTarget`] is the
//! real one (a `Model` and the `Runner` owning its KV); the engine's tests drive the step loop
//! with a fake that answers made-up logits, as vLLM tests its scheduler without a model.

use model::{Capture, Logits, Model, ModelError, Runner, SeqInput};

pub(crate) trait Target {
    /// Tokens of the vocabulary (rows of logits are this wide).
    fn vocab_size(&self) -> usize;
    /// The longest sequence the model takes.
    fn context_length(&self) -> usize;
    /// Bytes of one KV block over all layers (what `save_block` writes).
    fn block_bytes(&self) -> usize;
    /// One batched pass over `seqs` (their new tokens' KV written into their blocks), the
    /// residual streams `capture` names kept for a drafter.
    fn forward(
        &mut self,
        seqs: &[SeqInput<'_>],
        capture: Option<Capture<'_>>,
    ) -> Result<Logits, ModelError>;
    /// Copies block `block`'s KV out (a demotion to the host tier or storage).
    fn save_block(&self, block: u32, out: &mut [u8]) -> Result<(), ModelError>;
    /// Fills block `block`'s KV from `data` (a promotion).
    fn load_block(&mut self, block: u32, data: &[u8]) -> Result<(), ModelError>;
    /// Moves one token's KV from slot `from` to slot `to` of the sequence with `blocks` (a
    /// verified tree branch made consecutive).
    fn move_kv(&mut self, blocks: &[u32], from: usize, to: usize) -> Result<(), ModelError>;
}

/// The real target: the model and the runner holding its KV.
pub(crate) struct ModelTarget {
    pub(crate) model: Model,
    pub(crate) runner: Runner,
}

impl Target for ModelTarget {
    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    fn context_length(&self) -> usize {
        self.model.config.context_length
    }

    fn block_bytes(&self) -> usize {
        self.runner.block_bytes()
    }

    fn forward(
        &mut self,
        seqs: &[SeqInput<'_>],
        capture: Option<Capture<'_>>,
    ) -> Result<Logits, ModelError> {
        self.runner.forward_capturing(&self.model, seqs, capture)
    }

    fn save_block(&self, block: u32, out: &mut [u8]) -> Result<(), ModelError> {
        self.runner.save_block(block, out)
    }

    fn load_block(&mut self, block: u32, data: &[u8]) -> Result<(), ModelError> {
        self.runner.load_block(block, data)
    }

    fn move_kv(&mut self, blocks: &[u32], from: usize, to: usize) -> Result<(), ModelError> {
        self.runner.move_kv(blocks, from, to)
    }
}
