//! A rule on which tokens may come next (structured outputs: a grammar), as the sampler sees it:
//! it masks the logits of each position before the sampler chooses and advances past the chosen
//! token. The grammar itself lives in the `grammar` crate, which implements this trait.

/// One sequence's constraint. `mask` and `advance` alternate, one pair per emitted token.
pub trait TokenConstraint: Send + Sync + std::fmt::Debug {
    /// Sets the logits of the tokens not allowed next to −∞. A constraint that fails here (a
    /// grammar past its limits) allows only the end-of-generation tokens and reports the
    /// failure through [`failure`](Self::failure).
    fn mask(&mut self, logits: &mut [f32]);
    /// Moves past `token`, the one chosen under the last mask.
    fn advance(&mut self, token: u32);
    /// How many of `tokens`, in order, it would accept from here (nothing is consumed): drafts
    /// after that are rejected for sure.
    fn valid_prefix(&mut self, tokens: &[u32]) -> usize;
    /// The tokens it forces from here, in order, if any (nothing is consumed): where only one
    /// continuation is allowed (a schema's keys, JSON punctuation), spelled as the tokenizer
    /// would. Other spellings of the same text may be allowed too, so these are drafts to
    /// verify, not tokens to emit.
    fn forced(&mut self) -> Vec<u32>;
    /// Why the constraint cannot go on, once it has failed.
    fn failure(&self) -> Option<String>;
    /// A copy in the same state (each choice of a request gets its own).
    fn boxed_clone(&self) -> Box<dyn TokenConstraint>;
}

impl Clone for Box<dyn TokenConstraint> {
    fn clone(&self) -> Self {
        self.boxed_clone()
    }
}
