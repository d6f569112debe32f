//! A mock OpenAI server: streams real SSE chunks (with `usage`) at a set pace, and on request
//! misbehaves in the ways real servers do, so the benchmark can be tested and measured alone.
//! It records what it receives ([`ledger`]): `GET /mock/log` lists it, and with the options on it
//! serves `/metrics` and `/flush_cache` as specula does.

pub mod ledger;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use ledger::{Ledger, MockCounters, MockEvent};
use protocol::{
    AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionChunk, ChunkChoice, Completion,
    CompletionChoice, Delta, ErrorResponse, ModelCard, ModelList, Usage,
};
use serde::Serialize;
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::{Instant, sleep_until};

/// How a faulty request misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    #[default]
    None,
    /// Answer 500 with an OpenAI error body.
    Http500,
    /// Stream half the tokens, then cut the connection.
    Drop,
    /// Send an event that is not JSON after the first token.
    BadJson,
    /// Never answer (until the client gives up).
    Hang,
}

#[derive(Debug, Clone, Serialize)]
pub struct MockConfig {
    pub model: String,
    /// Pace of each stream (every request streams at this rate, whatever the load).
    pub tokens_per_second: f64,
    pub ttft_ms: f64,
    /// Spreads TTFT evenly over [ttft, ttft + jitter]: request k waits
    /// ttft + jitter × ((37k mod 100) / 99), so every 100 requests cover the range exactly.
    pub ttft_jitter_ms: f64,
    /// Tokens per content chunk (more than one mimics speculative decoding).
    pub tokens_per_chunk: usize,
    /// Send `usage` when the client asks for it.
    pub usage: bool,
    pub fault: Fault,
    /// The fault hits every Nth request (1: all of them).
    pub fault_every: u64,
    /// Without `ignore_eos`, stop with "stop" after this many tokens.
    pub eos_after: Option<u32>,
    pub default_max_tokens: u32,
    /// Reported as `usage.spec_accept_length` (a speculating server's tokens per verification
    /// pass), when set.
    pub spec_accept_length: Option<f64>,
    /// When set, generation requests must carry `Authorization: Bearer <key>` (else 401).
    #[serde(skip)]
    pub api_key: Option<String>,
    /// Serve `/metrics` with the ledger's counters in specula's names.
    pub metrics: bool,
    /// Serve `POST /flush_cache` (empties the simulated prefix cache).
    pub flush_cache: bool,
}

impl Default for MockConfig {
    fn default() -> Self {
        Self {
            model: "mock-model".into(),
            tokens_per_second: 100.0,
            ttft_ms: 20.0,
            ttft_jitter_ms: 0.0,
            tokens_per_chunk: 1,
            usage: true,
            fault: Fault::None,
            fault_every: 1,
            eos_after: None,
            default_max_tokens: 16,
            spec_accept_length: None,
            api_key: None,
            metrics: false,
            flush_cache: false,
        }
    }
}

impl MockConfig {
    /// Rejects settings the mock cannot serve (a clear message for the CLI).
    pub fn validate(&self) -> Result<(), String> {
        if !(self.tokens_per_second.is_finite() && self.tokens_per_second > 0.0) {
            return Err("tokens per second must be a positive number".into());
        }
        let sane_ms = |v: f64| v.is_finite() && (0.0..=3_600_000.0).contains(&v);
        if !(sane_ms(self.ttft_ms) && sane_ms(self.ttft_jitter_ms)) {
            return Err("TTFT and its jitter must be between 0 and 3,600,000 ms".into());
        }
        if self.tokens_per_chunk == 0 || self.fault_every == 0 {
            return Err("tokens per chunk and fault-every must be at least 1".into());
        }
        if let Some(a) = self.spec_accept_length
            && !(a.is_finite() && (1.0..=1e6).contains(&a))
        {
            return Err("the accept length must be a number of at least 1".into());
        }
        Ok(())
    }
}

struct Shared {
    cfg: MockConfig,
    requests: AtomicU64,
    ledger: Mutex<Ledger>,
}

impl Shared {
    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        // A panic while recording leaves the ledger as consistent as any other moment.
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A mock started in this process: its address, and what it has seen so far.
#[derive(Clone)]
pub struct MockHandle {
    pub addr: SocketAddr,
    state: Arc<Shared>,
}

impl MockHandle {
    pub fn events(&self) -> Vec<MockEvent> {
        self.state.ledger().events.clone()
    }

    pub fn counters(&self) -> MockCounters {
        self.state.ledger().counters
    }
}

/// Serves until the process ends.
pub async fn serve(listener: TcpListener, cfg: MockConfig) -> std::io::Result<()> {
    serve_state(listener, shared(cfg)).await
}

fn shared(cfg: MockConfig) -> Arc<Shared> {
    Arc::new(Shared {
        cfg,
        requests: AtomicU64::new(0),
        ledger: Mutex::new(Ledger::default()),
    })
}

async fn serve_state(listener: TcpListener, state: Arc<Shared>) -> std::io::Result<()> {
    let mut app = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/mock/log", get(log));
    if state.cfg.metrics {
        app = app.route("/metrics", get(metrics));
    }
    if state.cfg.flush_cache {
        app = app.route("/flush_cache", post(flush_cache));
    }
    let app = app.with_state(state);
    // Without TCP_NODELAY, Nagle's algorithm holds the first token behind the role chunk until
    // the client's delayed ACK (~40 ms), which would distort every TTFT measured against the mock.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!("cannot set TCP_NODELAY: {e}");
        }
    });
    axum::serve(listener, app).await
}

/// Starts a mock on a free loopback port in this process; returns its address.
pub async fn spawn(cfg: MockConfig) -> std::io::Result<SocketAddr> {
    Ok(spawn_handle(cfg).await?.addr)
}

/// Starts a mock on a free loopback port in this process; returns its handle.
pub async fn spawn_handle(cfg: MockConfig) -> std::io::Result<MockHandle> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let state = shared(cfg);
    let served = Arc::clone(&state);
    tokio::spawn(async move {
        if let Err(e) = serve_state(listener, served).await {
            tracing::error!("mock server stopped: {e}");
        }
    });
    Ok(MockHandle { addr, state })
}

async fn log(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    axum::Json(s.ledger().events.clone())
}

async fn metrics(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    s.ledger().metrics()
}

async fn flush_cache(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    s.ledger().flush();
    axum::Json(serde_json::json!({ "message": "Cache flushed." }))
}

async fn models(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    axum::Json(ModelList {
        object: "list".into(),
        data: vec![ModelCard {
            id: s.cfg.model.clone(),
            object: "model".into(),
            created: 0,
            owned_by: "specula-mock".into(),
        }],
    })
}

async fn chat(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    generate(s, &headers, body, Kind::Chat).await
}

async fn completions(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    generate(s, &headers, body, Kind::Completions).await
}

fn authorised(cfg: &MockConfig, headers: &HeaderMap) -> bool {
    let Some(key) = &cfg.api_key else {
        return true;
    };
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        == Some(key.as_str())
}

#[derive(Clone, Copy)]
enum Kind {
    Chat,
    Completions,
}

/// What one request asked for, and how it will be answered.
struct Plan {
    kind: Kind,
    model: String,
    stream: bool,
    include_usage: bool,
    tokens: u32,
    finish: &'static str,
    prompt_tokens: u64,
    fault: Fault,
    /// When the first token is due.
    first_at: Instant,
    /// Seconds between tokens.
    gap: f64,
    spec_accept_length: Option<f64>,
}

impl Plan {
    fn token_due(&self, i: u32) -> Instant {
        self.first_at + Duration::from_secs_f64(self.gap * f64::from(i))
    }

    fn usage(&self, completion_tokens: u32) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens: u64::from(completion_tokens),
            total_tokens: self.prompt_tokens + u64::from(completion_tokens),
            prompt_tokens_details: None,
            spec_accept_length: self.spec_accept_length,
        }
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    let kind = if status.is_server_error() {
        "server_error"
    } else {
        "invalid_request_error"
    };
    (
        status,
        axum::Json(ErrorResponse::new(message, kind, status.as_u16())),
    )
        .into_response()
}

async fn generate(s: Arc<Shared>, headers: &HeaderMap, body: Bytes, kind: Kind) -> Response {
    let start = Instant::now();
    let cfg = &s.cfg;
    if !authorised(cfg, headers) {
        return error(StatusCode::UNAUTHORIZED, "mock: missing or wrong API key");
    }
    let k = s.requests.fetch_add(1, Ordering::Relaxed);
    let req: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("invalid JSON body: {e}")),
    };
    let fault = if cfg.fault != Fault::None && (k + 1).is_multiple_of(cfg.fault_every.max(1)) {
        cfg.fault
    } else {
        Fault::None
    };
    let (tokens, finish) = answer_length(cfg, &req);
    s.ledger().request(
        prompt_text(&req),
        (fault != Fault::Http500).then_some(tokens),
        cfg.spec_accept_length.is_some(),
    );
    match fault {
        Fault::Http500 => {
            return error(StatusCode::INTERNAL_SERVER_ERROR, "mock: injected failure");
        }
        Fault::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            return error(StatusCode::GATEWAY_TIMEOUT, "mock: hung");
        }
        _ => {}
    }
    let spread = f64::from(((k * 37) % 100) as u32) / 99.0;
    let ttft = (cfg.ttft_ms + cfg.ttft_jitter_ms * spread) / 1000.0;
    let plan = Plan {
        kind,
        model: req["model"].as_str().unwrap_or(&cfg.model).to_string(),
        stream: req["stream"].as_bool().unwrap_or(false),
        include_usage: cfg.usage && req["stream_options"]["include_usage"].as_bool() == Some(true),
        tokens,
        finish,
        prompt_tokens: prompt_words(&req),
        fault,
        first_at: start + Duration::from_secs_f64(ttft),
        gap: 1.0 / cfg.tokens_per_second.max(1e-3),
        spec_accept_length: cfg.spec_accept_length,
    };
    if plan.stream {
        stream_response(plan, cfg.tokens_per_chunk.max(1))
    } else {
        sleep_until(plan.token_due(plan.tokens.saturating_sub(1))).await;
        whole_response(&plan, cfg.usage)
    }
}

/// How many tokens the answer has, and why it ends: `max_tokens`, or `eos_after` unless the
/// request ignores EOS.
fn answer_length(cfg: &MockConfig, req: &Value) -> (u32, &'static str) {
    let max_tokens = req["max_tokens"]
        .as_u64()
        .or_else(|| req["max_completion_tokens"].as_u64())
        .map_or(cfg.default_max_tokens, |n| {
            n.min(u64::from(u32::MAX)) as u32
        });
    let ignore_eos = req["ignore_eos"].as_bool().unwrap_or(false);
    match cfg.eos_after {
        Some(n) if !ignore_eos && n < max_tokens => (n, "stop"),
        _ => (max_tokens, "length"),
    }
}

/// The prompt as the ledger records it: the messages' contents joined by newlines, or the
/// completion prompt.
fn prompt_text(req: &Value) -> String {
    match req.get("messages").and_then(Value::as_array) {
        Some(msgs) => msgs
            .iter()
            .filter_map(|m| m["content"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        None => req["prompt"].as_str().unwrap_or_default().to_string(),
    }
}

/// A stand-in for prompt tokens: the words of the prompt or messages.
fn prompt_words(req: &Value) -> u64 {
    let words = |v: &Value| {
        v.as_str()
            .map_or(0, |s| s.split_whitespace().count() as u64)
    };
    match req.get("messages").and_then(Value::as_array) {
        Some(msgs) => msgs.iter().map(|m| words(&m["content"])).sum(),
        None => words(&req["prompt"]),
    }
}

const WORDS: [&str; 8] = [
    " the", " quick", " brown", " fox", " jumps", " over", " a", " dog",
];

fn text_of(from: u32, to: u32) -> String {
    (from..to)
        .map(|i| WORDS[i as usize % WORDS.len()])
        .collect()
}

fn whole_response(plan: &Plan, usage: bool) -> Response {
    let usage = usage.then(|| plan.usage(plan.tokens));
    let text = text_of(0, plan.tokens);
    match plan.kind {
        Kind::Chat => axum::Json(ChatCompletion {
            id: "chatcmpl-mock".into(),
            object: "chat.completion".into(),
            created: 0,
            model: plan.model.clone(),
            choices: vec![ChatChoice {
                index: 0,
                message: AssistantMessage {
                    role: "assistant".into(),
                    content: Some(text),
                    reasoning_content: None,
                    tool_calls: None,
                },
                finish_reason: Some(plan.finish.into()),
                logprobs: None,
            }],
            usage,
        })
        .into_response(),
        Kind::Completions => axum::Json(Completion {
            id: "cmpl-mock".into(),
            object: "text_completion".into(),
            created: 0,
            model: plan.model.clone(),
            choices: vec![CompletionChoice {
                index: 0,
                text,
                finish_reason: Some(plan.finish.into()),
                logprobs: None,
            }],
            usage,
        })
        .into_response(),
    }
}

/// What one streamed chunk carries.
enum Chunk {
    /// The opening chunk: the assistant role and no content.
    Role,
    Text(String),
    /// An empty delta with the finish reason, as OpenAI sends it.
    Finish,
    /// No choices, only `usage`.
    Usage,
}

/// The SSE event for one chunk.
fn event(plan: &Plan, chunk: Chunk) -> Bytes {
    let finish_reason = matches!(chunk, Chunk::Finish).then(|| plan.finish.to_string());
    let usage = matches!(chunk, Chunk::Usage).then(|| plan.usage(plan.tokens));
    let with_choice = usage.is_none();
    let json = match plan.kind {
        Kind::Chat => serde_json::to_vec(&ChatCompletionChunk {
            id: "chatcmpl-mock".into(),
            object: "chat.completion.chunk".into(),
            created: 0,
            model: plan.model.clone(),
            choices: with_choice
                .then(|| ChunkChoice {
                    index: 0,
                    delta: match chunk {
                        Chunk::Role => Delta {
                            role: Some("assistant".into()),
                            content: Some(String::new()),
                            ..Delta::default()
                        },
                        Chunk::Text(text) => Delta {
                            content: Some(text),
                            ..Delta::default()
                        },
                        Chunk::Finish | Chunk::Usage => Delta::default(),
                    },
                    finish_reason,
                    logprobs: None,
                })
                .into_iter()
                .collect(),
            usage,
        }),
        Kind::Completions => serde_json::to_vec(&Completion {
            id: "cmpl-mock".into(),
            object: "text_completion".into(),
            created: 0,
            model: plan.model.clone(),
            choices: with_choice
                .then(|| CompletionChoice {
                    index: 0,
                    text: match chunk {
                        Chunk::Text(text) => text,
                        _ => String::new(),
                    },
                    finish_reason,
                    logprobs: None,
                })
                .into_iter()
                .collect(),
            usage,
        }),
    }
    .expect("chunk serialises");
    let mut out = Vec::with_capacity(json.len() + 8);
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(&json);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// What the stream sends next: the role chunk, content chunks, then (after `Finish` was sent)
/// usage and `[DONE]`.
enum Step {
    Role,
    Content(u32),
    Finish,
    Usage,
    /// `[DONE]` went out, or the stream was cut.
    Done,
}

fn stream_response(plan: Plan, per_chunk: usize) -> Response {
    let per_chunk = per_chunk as u32;
    let stream = futures_util::stream::unfold((plan, Step::Role), move |(plan, step)| async move {
        let (item, next) = match step {
            Step::Role => (Ok(event(&plan, Chunk::Role)), Step::Content(0)),
            Step::Content(from) if from >= plan.tokens => {
                (Ok(event(&plan, Chunk::Finish)), Step::Finish)
            }
            Step::Content(from) => {
                let to = (from + per_chunk).min(plan.tokens);
                if plan.fault == Fault::Drop && from >= plan.tokens / 2 {
                    let cut = std::io::Error::other("mock: connection dropped");
                    return Some((Err(cut), (plan, Step::Done)));
                }
                sleep_until(plan.token_due(to - 1)).await;
                if plan.fault == Fault::BadJson && from > 0 {
                    let bad = Bytes::from_static(b"data: {\"choices\": [oops\n\n");
                    return Some((Ok(bad), (plan, Step::Done)));
                }
                (
                    Ok(event(&plan, Chunk::Text(text_of(from, to)))),
                    Step::Content(to),
                )
            }
            // The finish chunk went out: usage next, if asked for.
            Step::Finish if plan.include_usage => (Ok(event(&plan, Chunk::Usage)), Step::Usage),
            Step::Finish | Step::Usage => (Ok(Bytes::from_static(b"data: [DONE]\n\n")), Step::Done),
            Step::Done => return None,
        };
        Some((item, (plan, next)))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .expect("static response parts are valid")
}
