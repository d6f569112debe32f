//! The OpenAI-compatible HTTP server over the engine: routes, validation, SSE streaming, errors
//! with OpenAI's body, tool calls and reasoning output, health, server info and Prometheus
//! metrics.
//!
//! Requests are tokenized here (off the async threads) and handed to the engine through its
//! handle; each response follows the engine's token events. A client that goes away drops its
//! generation, which aborts the request in the engine within one step.

pub mod budget;
mod chat;
mod completions;
mod embeddings;
pub mod error;
mod fields;
#[cfg(test)]
mod fuzz_tests;
mod generate;
#[cfg(test)]
mod golden;
mod health;
mod info;
pub mod listener;
mod messages;
pub mod metrics;
mod params;
pub mod parsers;
mod request;
mod respond;
mod response_format;
mod response_store;
mod responses;
mod responses_api;
mod routes;
pub mod script;
pub mod stop;
mod tokenize;
mod tool_request;

pub use error::ApiError;
pub use health::probe;
pub use routes::router;

use engine::EngineHandle;
use metrics::ServerMetrics;
use model::chat_template::ChatTemplate;
use model::tokenizer::Tokenizer;
use parsers::{ReasoningFormat, ToolFormat};
use script::Script;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

/// The state as the handlers hold it.
pub(crate) type Shared = Arc<AppState>;

/// Where the server is in its life: `/health` is 200 only when `Ready`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Loading = 0,
    Ready = 1,
    Draining = 2,
}

/// What exists once the model is loaded.
pub struct Loaded {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    /// Structured outputs over the model's vocabulary (or why they are not available).
    pub grammars: Result<grammar::Grammars, String>,
    /// The most bytes of text one token stands for: a prompt of more bytes than the context
    /// holds tokens × this cannot fit, and is refused before it is tokenized.
    pub max_token_bytes: usize,
    /// The model's width: an embedding's values (0 where the loader does not say).
    pub hidden_size: usize,
}

impl Loaded {
    /// The loaded model, with its grammars built over `tokenizer`'s vocabulary (ending where the
    /// model's end-of-generation tokens are) and compiled as `grammars` says.
    pub fn new(
        engine: EngineHandle,
        tokenizer: Tokenizer,
        template: Option<ChatTemplate>,
        grammars: grammar::GrammarConfig,
    ) -> Self {
        let tokenizer = Arc::new(tokenizer);
        let grammars =
            grammar::Grammars::with_config(tokenizer.clone(), tokenizer.eog_ids(), grammars)
                .map_err(|e| e.to_string());
        if let Err(e) = &grammars {
            tracing::warn!("structured outputs are off: {e}");
        }
        let max_token_bytes = (0..tokenizer.vocab_size() as u32)
            .filter_map(|id| tokenizer.token_to_piece(id, true).map(<[u8]>::len))
            .max()
            .unwrap_or(1)
            .max(1);
        Self {
            engine,
            tokenizer,
            template,
            grammars,
            max_token_bytes,
            hidden_size: 0,
        }
    }
}

/// Everything the handlers share. The server answers (503 "loading") before the model is
/// loaded; `loaded` is set once, when it is.
pub struct AppState {
    loaded: OnceLock<Loaded>,
    /// The name `/v1/models` lists and requests may use.
    pub served_model_name: String,
    /// With `--api-key`: the bearer token `/v1/*` requires.
    pub api_key: Option<String>,
    /// The effective configuration, for `/server_info`.
    pub info: serde_json::Value,
    pub metrics: ServerMetrics,
    /// Largest request body accepted, bytes.
    pub max_body_bytes: usize,
    /// The memory requests in preparation may hold together (`--max-request-memory-mb`).
    pub budget: budget::RequestBudget,
    /// `--tool-call-parser`: requests with tools get their calls parsed out of the output.
    pub tool_parser: Option<ToolFormat>,
    /// `--reasoning-parser`: the thought goes to `reasoning_content`.
    pub reasoning_parser: Option<ReasoningFormat>,
    /// Test-only scripted model output (`--scripted-output`).
    pub script: Option<Script>,
    /// The Responses API's stored responses.
    pub responses: response_store::ResponseStore,
    phase: AtomicU8,
    created: u64,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("served_model_name", &self.served_model_name)
            .finish()
    }
}

impl AppState {
    pub fn new(
        served_model_name: String,
        api_key: Option<String>,
        info: serde_json::Value,
    ) -> Self {
        Self {
            loaded: OnceLock::new(),
            served_model_name,
            api_key,
            info,
            metrics: ServerMetrics::default(),
            max_body_bytes: 16 << 20,
            budget: budget::RequestBudget::new(budget::RequestBudget::default_limit()),
            tool_parser: None,
            reasoning_parser: None,
            script: None,
            responses: response_store::ResponseStore::default(),
            phase: AtomicU8::new(Phase::Loading as u8),
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }

    /// Installs the loaded model (once; later calls are ignored).
    pub fn set_loaded(&self, loaded: Loaded) {
        let _ = self.loaded.set(loaded);
    }

    pub fn loaded(&self) -> Option<&Loaded> {
        self.loaded.get()
    }

    /// The loaded model; handlers reach it only after checking the phase is `Ready`.
    fn model(&self) -> &Loaded {
        self.loaded
            .get()
            .expect("the phase is Ready only once the model is loaded")
    }

    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            1 => Phase::Ready,
            2 => Phase::Draining,
            _ => Phase::Loading,
        }
    }

    pub fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Release);
        if phase == Phase::Draining
            && let Some(l) = self.loaded.get()
        {
            l.engine.close();
        }
    }
}
