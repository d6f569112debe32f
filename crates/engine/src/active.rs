//! A request the engine is working on, as the engine thread keeps it: the client's channel, the
//! sampler (with its grammar), and what it has emitted.

use crate::{GenerateRequest, TokenEvent};
use model::sampler::Sampler;
use tokio::sync::mpsc::UnboundedSender;

/// A request the engine is working on: the client's side of it (the scheduler holds its
/// tokens and KV, the speculator its acceptance).
pub(crate) struct Active {
    pub(crate) request: GenerateRequest,
    pub(crate) events: UnboundedSender<TokenEvent>,
    pub(crate) sampler: Sampler,
    pub(crate) generated: usize,
    /// Speculative verifications of this request and the tokens they emitted.
    pub(crate) verifications: usize,
    pub(crate) verified_tokens: usize,
    /// Whether `TokenEvent::Admitted` went out.
    pub(crate) announced: bool,
}

impl Active {
    /// Tokens emitted per verification so far (with speculation).
    pub(crate) fn spec_accept_length(&self) -> Option<f32> {
        (self.verifications > 0).then(|| self.verified_tokens as f32 / self.verifications as f32)
    }
}
