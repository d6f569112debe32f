//! One sequence's grammar: llguidance's matcher behind the sampler's constraint interface.

use llguidance::Matcher;
use llguidance::toktrie::SimpleVob;
use model::sampler::TokenConstraint;

/// A grammar in one sequence's state.
#[derive(Clone)]
pub struct Grammar {
    matcher: Matcher,
    /// Tokens that end the generation: all a failed grammar allows.
    eos: Vec<u32>,
    failure: Option<String>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("failure", &self.failure)
            .finish()
    }
}

impl Grammar {
    pub(crate) fn new(matcher: Matcher, eos: &[u32]) -> Self {
        Self {
            matcher,
            eos: eos.to_vec(),
            failure: None,
        }
    }

    /// Records the first failure (its reason; the full message goes to the log).
    fn fail(&mut self, reason: String) {
        tracing::warn!("grammar failed: {reason}");
        self.failure.get_or_insert(crate::first_line(&reason));
    }
}

impl TokenConstraint for Grammar {
    fn mask(&mut self, logits: &mut [f32]) {
        let allowed = match self.failure {
            Some(_) => None,
            None => match self.matcher.compute_mask_or_eos() {
                Ok(set) => Some(set),
                Err(e) => {
                    self.fail(e.to_string());
                    None
                }
            },
        };
        match allowed {
            Some(set) if !set.is_zero() => apply(&set, logits),
            _ => {
                if self.failure.is_none() {
                    self.fail("the grammar allows no token here".into());
                }
                for (t, l) in logits.iter_mut().enumerate() {
                    if !self.eos.contains(&(t as u32)) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }

    fn advance(&mut self, token: u32) {
        if self.failure.is_some() {
            return;
        }
        // A grammar that has ended allows only the end tokens, and has nothing to consume.
        if self.matcher.is_stopped() {
            if !self.eos.contains(&token) {
                self.fail(format!("token {token} after the end of the grammar"));
            }
            return;
        }
        if let Err(e) = self.matcher.consume_token(token) {
            self.fail(e.to_string());
        }
    }

    fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        if self.failure.is_some() {
            return 0;
        }
        self.matcher.validate_tokens(tokens).unwrap_or(0)
    }

    fn forced(&mut self) -> Vec<u32> {
        if self.failure.is_some() || self.matcher.is_stopped() {
            return Vec::new();
        }
        self.matcher.compute_ff_tokens()
    }

    fn failure(&self) -> Option<String> {
        self.failure.clone()
    }

    fn boxed_clone(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.clone())
    }
}

/// Sets the logits of the tokens `set` leaves out to −∞, 32 at a time (most positions of a
/// JSON grammar allow a handful of tokens: whole words of the set are zero). Logits past the
/// vocabulary (padded embeddings) are never allowed.
fn apply(set: &SimpleVob, logits: &mut [f32]) {
    let words = set.as_slice();
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        let bits = words.get(w).copied().unwrap_or(0);
        if bits == u32::MAX && (w + 1) * 32 <= set.len() {
            continue;
        }
        for (b, l) in chunk.iter_mut().enumerate() {
            if bits >> b & 1 == 0 || w * 32 + b >= set.len() {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}
