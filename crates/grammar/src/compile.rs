//! Compiling specs into grammars, once per spec: a spec is checked against the limits, looked
//! up in the cache, and only then compiled, by llguidance's parser factory for the model's
//! vocabulary, on the compile pool (see [`GrammarConfig`]).

use crate::cache::{Cache, estimated_bytes};
use crate::constraint::Grammar;
use crate::limits::GrammarLimits;
use crate::pool::{Abandoned, Pool};
use crate::spec::{GrammarSpec, Source};
use crate::vocab::{control_token, token_env};
use crate::{GrammarError, first_line};
use llguidance::{Matcher, ParserFactory};
use model::tokenizer::Tokenizer;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Compiled grammars kept for reuse at most (the least recently used go first).
pub const CACHED_GRAMMARS: usize = 64;

/// How grammars are compiled and kept; [`Default`] gives what is documented on each field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrammarConfig {
    /// Threads that compile (default 2: a compilation takes a core while it runs).
    pub threads: usize,
    /// Stack of each compile thread (default 256 MiB, reserved address space: llguidance
    /// compiles by recursion, and the deepest spec the limits allow needs ~10 MiB).
    pub stack_bytes: usize,
    /// Compilations that may wait for a thread (default 16); past them a request is refused as
    /// overloaded.
    pub queue: usize,
    /// How long a compilation may wait for a thread, and then run (default 10 s each): past the
    /// first the request is refused as overloaded, past the second as too costly.
    pub deadline: Duration,
    /// Compiled grammars kept, at most (default [`CACHED_GRAMMARS`]).
    pub cache_entries: usize,
    /// Estimated bytes of the compiled grammars kept, at most (default 256 MiB; see
    /// [`estimated_bytes`](crate::estimated_bytes)).
    pub cache_bytes: usize,
    /// Specs longer than this (bytes of their key) are compiled for each request, never kept
    /// (default 256 KiB).
    pub max_cached_spec_bytes: usize,
    /// What a spec may ask.
    pub limits: GrammarLimits,
}

impl Default for GrammarConfig {
    fn default() -> Self {
        Self {
            threads: 2,
            stack_bytes: 256 << 20,
            queue: 16,
            deadline: Duration::from_secs(10),
            cache_entries: CACHED_GRAMMARS,
            cache_bytes: 256 << 20,
            max_cached_spec_bytes: 256 << 10,
            limits: GrammarLimits::default(),
        }
    }
}

/// The grammars of one model: its token environment, the compile pool, and the cache.
pub struct Grammars {
    inner: Arc<Inner>,
    pool: Pool,
}

struct Inner {
    factory: ParserFactory,
    tokenizer: Arc<Tokenizer>,
    eos: Vec<u32>,
    cache: Mutex<Cache<Matcher>>,
    config: GrammarConfig,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("eos", &self.inner.eos)
            .field("config", &self.inner.config)
            .finish()
    }
}

impl Grammars {
    /// Grammars over `tokenizer`'s vocabulary, with the default [`GrammarConfig`]; `eos` are the
    /// tokens that end a generation.
    pub fn new(tokenizer: Arc<Tokenizer>, eos: &[u32]) -> Result<Self, GrammarError> {
        Self::with_config(tokenizer, eos, GrammarConfig::default())
    }

    /// Grammars compiled and kept as `config` says.
    pub fn with_config(
        tokenizer: Arc<Tokenizer>,
        eos: &[u32],
        config: GrammarConfig,
    ) -> Result<Self, GrammarError> {
        let env = token_env(tokenizer.clone(), eos).map_err(GrammarError::Vocabulary)?;
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = config.limits.parser_limits();
        let pool = Pool::new(
            config.threads,
            config.stack_bytes,
            config.queue,
            config.deadline,
        )?;
        let inner = Inner {
            factory,
            tokenizer,
            eos: eos.to_vec(),
            cache: Mutex::new(Cache::new(config.cache_entries, config.cache_bytes)),
            config,
        };
        Ok(Self {
            inner: Arc::new(inner),
            pool,
        })
    }

    /// How these grammars are compiled and kept.
    pub fn config(&self) -> &GrammarConfig {
        &self.inner.config
    }

    /// Grammars in the cache, and their estimated bytes.
    pub fn cached(&self) -> (usize, usize) {
        self.inner.lock().usage()
    }

    /// A fresh grammar for `spec`: checked against the limits, then cloned from the cache, or
    /// compiled on the pool (blocking the caller until it is done, up to twice the deadline:
    /// call it from a thread that may block). An invalid, unsupported or too large spec is an
    /// error naming the problem; so is a busy pool or a compilation past its deadline.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Grammar, GrammarError> {
        let inner = &self.inner;
        inner.config.limits.check(spec)?;
        let (key, source) = spec.source(&|text| control_token(&inner.tokenizer, text));
        if let Some(m) = inner.lock().get(&key) {
            return Ok(Grammar::new(m, &inner.eos));
        }
        let job = inner.clone();
        let matcher = self
            .pool
            .run(move |abandoned| job.build(key, source, abandoned))??;
        Ok(Grammar::new(matcher, &inner.eos))
    }
}

impl Inner {
    /// Compiles `source` (on a pool thread), keeping it under `key` unless its caller gave up.
    fn build(
        &self,
        key: String,
        source: Source,
        abandoned: &Abandoned,
    ) -> Result<Matcher, GrammarError> {
        let parser = self
            .factory
            .create_parser(source.into_grammar())
            .map_err(|e| GrammarError::Invalid(first_line(&e.to_string())))?;
        if abandoned.get() {
            return Err(GrammarError::Deadline(self.config.deadline));
        }
        let mut matcher = Matcher::new(Ok(parser));
        // The first mask builds the lexer's start: a grammar that cannot produce one fails here,
        // before the request is accepted.
        if let Err(e) = matcher.compute_mask() {
            return Err(GrammarError::Invalid(first_line(&e.to_string())));
        }
        if !abandoned.get() && key.len() <= self.config.max_cached_spec_bytes {
            let bytes = estimated_bytes(key.len());
            self.lock().insert(key, matcher.clone(), bytes);
        }
        Ok(matcher)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache<Matcher>> {
        // A panic while holding the lock leaves a cache that is still consistent.
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}
