//! The engine: one thread owns the model, the KV cache, the scheduler and the speculator, and
//! runs the step loop (plan → forward → update: see `step_loop`). The rest of the process talks to it
//! only through an [`EngineHandle`]: `submit` applies admission and returns a stream of
//! [`TokenEvent`]s; dropping that stream aborts the request within one step and frees its blocks.

mod active;
mod calibrate;
mod forward;
mod grammar_drafts;
mod kv_files;
mod stats;
mod step_loop;
mod target;
mod tiers;
mod update;
mod validate;
pub mod watchdog;

#[cfg(test)]
mod tests;

pub use speculative::{Algorithm, Draft, DrafterCounts};
pub use validate::ConfigError;

pub use scheduler::{FlushError, SchedulePolicy, SchedulerConfig};
pub use stats::{ACCEPT_BUCKETS, EngineStats, StatsSnapshot};

use model::Model;
use model::sampler::SamplingParams;
use scheduler::SeqId;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

/// Engine limits (SGLang's flag names in the comments).
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// `--max-running-requests`: sequences decoded together at most.
    pub max_running: usize,
    /// `--max-queued-requests`: requests waiting beyond the running ones; more get `Overloaded`.
    pub max_queued: usize,
    /// `--max-total-tokens`: KV cache capacity in tokens (all sequences together).
    pub max_total_tokens: usize,
    /// `--chunked-prefill-size`: prompt tokens one step processes at most.
    pub chunked_prefill_size: usize,
    /// `--context-length`: the longest sequence (prompt + output) accepted.
    pub context_length: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Speculation, when on (checked by `speculative`, which owns its settings).
    pub speculative: Option<speculative::SpecConfig>,
    /// The radix prefix cache (off: `--disable-radix-cache`).
    pub prefix_cache: bool,
    /// `--schedule-policy`: admission order.
    pub schedule_policy: scheduler::SchedulePolicy,
    /// `--enable-hierarchical-cache`: blocks of the prefix cache's host tier (0: none).
    pub host_cache_blocks: usize,
    /// `--hicache-storage-dir`: the storage tier's directory (needs the host tier).
    pub hicache_storage_dir: Option<std::path::PathBuf>,
    /// Names the model's weights (stored KV blocks of another model are never loaded).
    pub model_fingerprint: String,
    /// Sequences with a grammar that the speculator does not draft verify the tokens their
    /// grammar forces as drafts (off: `--disable-grammar-forced-drafts`).
    pub grammar_forced_drafts: bool,
    /// Tests only: a fault the engine thread makes on purpose (`--test-engine-fault`).
    pub test_fault: Option<TestFault>,
}

/// A fault the engine thread makes on purpose, at the first step that serves a request after
/// the first one (the server's warm-up): for tests of what the process does when its engine dies
/// or wedges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestFault {
    /// The engine thread panics.
    Panic,
    /// The engine thread stops making progress (sleeps for good).
    Hang,
}

impl EngineConfig {
    /// Blocks of KV storage.
    pub fn kv_blocks(&self) -> usize {
        self.max_total_tokens / self.block_size
    }

    /// The longest sequence the KV cache can hold.
    pub fn kv_capacity_tokens(&self) -> usize {
        self.kv_blocks() * self.block_size
    }
}

/// One generation request, already tokenized and validated by the caller.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    /// New tokens at most (≥ 1).
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Keep generating past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Token ids that end the generation (besides the model's end-of-generation tokens).
    pub stop_token_ids: Vec<u32>,
    /// Log-probabilities to report: `None`, or `Some(n)` for the chosen token's and the top `n`.
    pub logprobs: Option<usize>,
    /// Test-only scripted output (`specula serve --scripted-output`): these tokens are emitted
    /// in place of sampled ones while the forward passes run as usual; empty for real requests.
    pub scripted: Vec<u32>,
    /// Structured output: the grammar every token obeys, in its start state (each request and
    /// choice gets its own copy). The generation ends where the grammar does, `ignore_eos` or not.
    pub constraint: Option<Box<dyn model::sampler::TokenConstraint>>,
    /// An embedding, not a generation: the prompt runs (as any prefill, batched with the rest)
    /// and the request ends with one [`TokenEvent::Embedding`], the last token's final hidden
    /// state, L2-normalised; `max_tokens` is ignored and nothing is sampled.
    pub embed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation or stop token.
    Stop,
    /// `max_tokens` reached.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// What the engine sends about a request, in order: tokens, then one `Finished` or `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenEvent {
    Token {
        id: u32,
        /// Whether this token ended the generation (an end-of-generation or stop token: its text
        /// is not part of the output).
        is_stop: bool,
        /// The chosen token's log-probability and the top ones, when asked for.
        logprob: Option<f32>,
        top_logprobs: Vec<(u32, f32)>,
        /// With speculation: tokens emitted per verification pass so far (what `Finished`
        /// reports at the end; a request the caller stops early has it from here).
        spec_accept_length: Option<f32>,
    },
    /// The request was scheduled for the first time; `cached_tokens` of its prompt came from the
    /// prefix cache. Sent once, before any token.
    Admitted {
        cached_tokens: usize,
    },
    /// An embedding request's vector (then `Finished`).
    Embedding(Vec<f32>),
    Finished {
        reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
        /// With speculation: tokens emitted per verification pass, on average.
        spec_accept_length: Option<f32>,
    },
    Failed(RequestFailure),
}

/// Why the engine gave up on a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestFailure {
    #[error("the forward pass failed: {0}")]
    Forward(String),
    #[error("the request does not fit in the KV cache")]
    DoesNotFit,
    #[error("the output grammar failed: {0}")]
    Grammar(String),
}

/// Why the prefix cache was not flushed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlushCacheError {
    #[error("{0}")]
    Refused(scheduler::FlushError),
    #[error("the engine has stopped")]
    Stopped,
}

/// Why a request was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("max_tokens must be at least 1")]
    NoTokens,
    #[error(
        "this request needs {needed} tokens ({prompt} in the prompt + {max_tokens} to generate), more than the context length of {limit}"
    )]
    OverContext {
        needed: usize,
        prompt: usize,
        max_tokens: usize,
        limit: usize,
    },
    #[error(
        "this request needs {needed} tokens ({prompt} in the prompt + {max_tokens} to generate), more than the KV cache holds ({limit} tokens, --max-total-tokens)"
    )]
    OverKvCapacity {
        needed: usize,
        prompt: usize,
        max_tokens: usize,
        limit: usize,
    },
    #[error("the server is at capacity ({0} requests running or queued); retry later")]
    Overloaded(usize),
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("the engine has stopped")]
    Stopped,
}

/// Messages to the engine thread.
enum Command {
    Submit {
        id: SeqId,
        request: GenerateRequest,
        events: UnboundedSender<TokenEvent>,
    },
    /// End a request early (e.g. a stop string matched): not counted as an abort.
    Stop(SeqId),
    /// Empty the prefix cache; the reply says how many blocks went, or why not.
    FlushCache(tokio::sync::oneshot::Sender<Result<usize, scheduler::FlushError>>),
    /// Write every cached block the storage tier lacks; the reply counts the blocks written.
    PersistCache(tokio::sync::oneshot::Sender<usize>),
}

/// The rest of the process's way to the engine. Cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
    stats: Arc<EngineStats>,
    config: Arc<EngineConfig>,
    next_id: Arc<AtomicU64>,
    closing: Arc<AtomicBool>,
    alive: Arc<AtomicBool>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("config", &self.config)
            .finish()
    }
}

/// A submitted request: its id and the events the engine sends. Dropping it aborts the request.
#[derive(Debug)]
pub struct RequestStream {
    pub id: u64,
    pub events: UnboundedReceiver<TokenEvent>,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot start the engine thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// Starts the engine thread on `model`; `end_of_generation` are the tokens that end a generation
/// (unless a request ignores them).
pub fn start(
    model: Model,
    draft: Option<Draft>,
    config: EngineConfig,
    end_of_generation: Vec<u32>,
) -> Result<EngineHandle, StartError> {
    let (sched, files) = validate::validate(&config, &model, draft.as_ref())?;
    let stats = Arc::new(EngineStats::default());
    stats.set_kv_total(config.kv_blocks());
    let (commands, inbox) = mpsc::channel();
    let loop_stats = stats.clone();
    let loop_config = config.clone();
    let alive = Arc::new(AtomicBool::new(true));
    let guard = AliveGuard(alive.clone());
    std::thread::Builder::new()
        .name("specula-engine".into())
        .spawn(move || {
            // Cleared however the loop ends, a panic included.
            let _guard = guard;
            let blocks = loop_config.kv_blocks();
            let runner = model::Runner::new(&model, loop_config.block_size, blocks);
            // Built here: a draft model's KV pool stays on the thread that made it.
            let speculator = loop_config.speculative.map(|c| {
                c.build(&model, draft, loop_config.block_size, blocks)
                    .expect("validate() checked the draft against the algorithm")
            });
            let target = target::ModelTarget { model, runner };
            let engine = step_loop::Engine::new(
                Box::new(target),
                speculator,
                &loop_config,
                sched,
                end_of_generation,
                loop_stats,
                files,
            );
            engine.run(inbox);
        })?;
    Ok(EngineHandle {
        commands,
        stats,
        config: Arc::new(config),
        next_id: Arc::new(AtomicU64::new(1)),
        closing: Arc::new(AtomicBool::new(false)),
        alive,
    })
}

/// Marks the engine as stopped when the engine thread ends.
struct AliveGuard(Arc<AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
        if std::thread::panicking() {
            tracing::error!("the engine thread panicked; every request now fails");
        }
    }
}

impl EngineHandle {
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Writes the prefix cache's blocks to the storage tier (a shutdown); the blocks written (0
    /// without a storage tier).
    pub async fn persist_cache(&self) -> usize {
        let (reply, answer) = tokio::sync::oneshot::channel();
        if self.commands.send(Command::PersistCache(reply)).is_err() {
            return 0;
        }
        answer.await.unwrap_or(0)
    }

    /// Empties the prefix cache (refused while requests run or wait, or with the cache off).
    /// Returns the blocks dropped.
    pub async fn flush_cache(&self) -> Result<usize, FlushCacheError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.commands
            .send(Command::FlushCache(reply))
            .map_err(|_| FlushCacheError::Stopped)?;
        answer
            .await
            .map_err(|_| FlushCacheError::Stopped)?
            .map_err(FlushCacheError::Refused)
    }

    /// Checks the limits a request must meet whatever the load.
    pub fn check(&self, prompt: usize, max_tokens: usize) -> Result<(), SubmitError> {
        if prompt == 0 {
            return Err(SubmitError::EmptyPrompt);
        }
        if max_tokens == 0 {
            return Err(SubmitError::NoTokens);
        }
        let needed = prompt.saturating_add(max_tokens);
        let c = &self.config;
        if needed > c.context_length {
            return Err(SubmitError::OverContext {
                needed,
                prompt,
                max_tokens,
                limit: c.context_length,
            });
        }
        if needed > c.kv_capacity_tokens() {
            return Err(SubmitError::OverKvCapacity {
                needed,
                prompt,
                max_tokens,
                limit: c.kv_capacity_tokens(),
            });
        }
        Ok(())
    }

    /// Admits a request: checks its size and the load, then queues it.
    pub fn submit(&self, request: GenerateRequest) -> Result<RequestStream, SubmitError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(SubmitError::ShuttingDown);
        }
        self.check(request.prompt.len(), request.max_tokens)?;
        let capacity = self.config.max_running + self.config.max_queued;
        if !self.stats.try_admit(capacity) {
            return Err(SubmitError::Overloaded(capacity));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (events, rx) = tokio::sync::mpsc::unbounded_channel();
        let cmd = Command::Submit {
            id: SeqId(id),
            request,
            events,
        };
        if self.commands.send(cmd).is_err() {
            self.stats.release_admission();
            return Err(SubmitError::Stopped);
        }
        Ok(RequestStream { id, events: rx })
    }

    /// Ends a request early without counting it as aborted (its stream gets no more events).
    pub fn stop(&self, id: u64) {
        let _ = self.commands.send(Command::Stop(SeqId(id)));
    }

    /// Refuses new requests from now on (shutdown); requests already admitted carry on.
    pub fn close(&self) {
        self.closing.store(true, Ordering::Release);
    }

    /// False once the engine thread has stopped (it only stops on a bug).
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Requests admitted and not yet finished.
    pub fn in_flight(&self) -> usize {
        self.stats.snapshot().in_flight
    }
}
