//! Compiling specs into grammars, once per spec: llguidance's parser factory for the model's
//! vocabulary, and a bounded cache of compiled grammars that each new sequence clones.

use crate::constraint::Grammar;
use crate::spec::GrammarSpec;
use crate::vocab::{control_token, token_env};
use crate::{GrammarError, first_line};
use llguidance::{Matcher, ParserFactory};
use model::tokenizer::Tokenizer;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Compiled grammars kept for reuse (the least recently compiled go first).
pub const CACHED_GRAMMARS: usize = 64;

/// The grammars of one model: its token environment, and the cache.
pub struct Grammars {
    factory: ParserFactory,
    tokenizer: Arc<Tokenizer>,
    eos: Vec<u32>,
    cache: Mutex<Cache>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").field("eos", &self.eos).finish()
    }
}

#[derive(Default)]
struct Cache {
    compiled: HashMap<String, Matcher>,
    order: VecDeque<String>,
}

impl Grammars {
    /// Grammars over `tokenizer`'s vocabulary; `eos` are the tokens that end a generation.
    pub fn new(tokenizer: Arc<Tokenizer>, eos: &[u32]) -> Result<Self, GrammarError> {
        let env = token_env(tokenizer.clone(), eos).map_err(GrammarError::Vocabulary)?;
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        Ok(Self {
            factory,
            tokenizer,
            eos: eos.to_vec(),
            cache: Mutex::new(Cache::default()),
        })
    }

    /// A fresh grammar for `spec`: compiled (within llguidance's limits) the first time, cloned
    /// from the cache after. An invalid or unsupported spec is an error naming the problem.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Grammar, GrammarError> {
        let (key, source) = spec.source(&|text| control_token(&self.tokenizer, text));
        if let Some(m) = self.lock().compiled.get(&key) {
            return Ok(Grammar::new(m.clone(), &self.eos));
        }
        let parser = self
            .factory
            .create_parser(source.into_grammar())
            .map_err(|e| GrammarError::Invalid(first_line(&e.to_string())))?;
        let mut matcher = Matcher::new(Ok(parser));
        // The first mask builds the lexer's start: a grammar that cannot produce one fails here,
        // before the request is accepted.
        if let Err(e) = matcher.compute_mask() {
            return Err(GrammarError::Invalid(first_line(&e.to_string())));
        }
        let mut cache = self.lock();
        if cache.compiled.len() >= CACHED_GRAMMARS
            && let Some(oldest) = cache.order.pop_front()
        {
            cache.compiled.remove(&oldest);
        }
        if cache
            .compiled
            .insert(key.clone(), matcher.clone())
            .is_none()
        {
            cache.order.push_back(key);
        }
        Ok(Grammar::new(matcher, &self.eos))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        // A panic while holding the lock leaves a cache that is still consistent.
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}
