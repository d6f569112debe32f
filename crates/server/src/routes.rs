//! The routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/flush_cache`,
//! `/health`, `/health_generate`, `/server_info`, `/metrics`; everything else is a 404 with an
//! error body.

use crate::body::Body;
use crate::chat::chat;
use crate::error::ApiError;
use crate::generate::{Generation, ParseSpec, TokenInfo, Update};
use crate::params::{self, GenParams};
use crate::parsers::Output;
use crate::responses::{self, ChoiceResult};
use crate::{AppState, Phase};
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use protocol::{ModelCard, ModelList};
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

pub(crate) type Shared = Arc<AppState>;

/// The application's routes over `state`.
pub fn router(state: Shared) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/flush_cache", post(flush_cache).get(flush_cache))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    Router::new()
        .merge(v1)
        .route("/health", get(health))
        .route("/health_generate", get(health_generate))
        .route("/server_info", get(server_info))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .with_state(state)
}

/// Empties the prefix cache (SGLang's `/flush_cache`); refused with a 400 while requests run.
async fn flush_cache(State(state): State<Shared>) -> Result<Response, ApiError> {
    if state.phase() != Phase::Ready {
        return Err(not_ready(&state));
    }
    match state.model().engine.flush_cache().await {
        Ok(blocks) => Ok(axum::Json(json!({
            "message": "Cache flushed.",
            "flushed_blocks": blocks,
        }))
        .into_response()),
        Err(engine::FlushCacheError::Refused(e)) => Err(ApiError::bad_request(format!(
            "cannot flush the cache: {e}"
        ))),
        Err(e) => Err(ApiError::internal(e.to_string())),
    }
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route for {} {}", req.method(), req.uri().path()),
    )
}

async fn require_api_key(State(state): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "a valid API key is required (Authorization: Bearer <key>)",
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// The request body as a JSON object; a body over the limit is a 413 with an error body.
pub(crate) fn read_body(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Body, ApiError> {
    if state.phase() != Phase::Ready {
        return Err(not_ready(state));
    }
    let bytes = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body is over {} bytes", state.max_body_bytes),
            )
        } else {
            ApiError::bad_request(format!("cannot read the request body: {e}"))
        }
    })?;
    let body = Body::parse(&bytes)?;
    if let Some(m) = body.str("model")?
        && !m.is_empty()
        && m != state.served_model_name
    {
        return Err(ApiError::invalid(
            "model",
            format!(
                "the model `{m}` does not exist; this server serves `{}`",
                state.served_model_name
            ),
        ));
    }
    Ok(body)
}

fn not_ready(state: &AppState) -> ApiError {
    match state.phase() {
        Phase::Draining => ApiError::unavailable("the server is shutting down"),
        _ => ApiError::unavailable("the server is loading"),
    }
}

/// Work that must not block the async threads (template rendering, tokenizing).
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("request preparation failed: {e}")))?
}

/// A prompt that leaves no room for even one token is refused before anything is queued.
pub(crate) fn check_length(
    state: &AppState,
    prompt: &[u32],
    params: &GenParams,
) -> Result<(), ApiError> {
    let engine = &state.model().engine;
    let max_tokens = params.max_tokens.unwrap_or(1);
    engine.check(prompt.len(), max_tokens).map_err(|e| match e {
        engine::SubmitError::OverContext { .. } | engine::SubmitError::OverKvCapacity { .. }
            if params.max_tokens.is_none() =>
        {
            ApiError::invalid("messages", e.to_string())
        }
        e => ApiError::from(e),
    })
}

async fn completions(
    State(state): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let body = read_body(&state, body)?;
    let params = params::parse(&body, false)?;
    let vocab = state.model().tokenizer.vocab_size();
    // Text prompts are tokenized below; token-id prompts are taken as they are.
    enum P {
        Text(String),
        Ids(Vec<u32>),
    }
    let ids = |v: &Vec<Value>| -> Result<Vec<u32>, ApiError> {
        v.iter()
            .map(|t| {
                t.as_u64()
                    .filter(|&id| (id as usize) < vocab)
                    .map(|id| id as u32)
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "prompt",
                            format!("token ids must be integers below {vocab}"),
                        )
                    })
            })
            .collect()
    };
    let prompts: Vec<P> = match body.get("prompt") {
        Some(Value::String(s)) => vec![P::Text(s.clone())],
        Some(Value::Array(items)) if !items.is_empty() => {
            if items.iter().all(Value::is_number) {
                vec![P::Ids(ids(items)?)]
            } else {
                items
                    .iter()
                    .map(|item| match item {
                        Value::String(s) => Ok(P::Text(s.clone())),
                        Value::Array(inner) => Ok(P::Ids(ids(inner)?)),
                        _ => Err(ApiError::invalid(
                            "prompt",
                            "`prompt` must be a string, a list of strings, or token ids",
                        )),
                    })
                    .collect::<Result<_, _>>()?
            }
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "prompt",
                "`prompt` must be a string, a list of strings, or token ids",
            ));
        }
        None => return Err(ApiError::invalid("prompt", "`prompt` is required")),
    };
    let st = state.clone();
    let prompts: Vec<Vec<u32>> = blocking(move || {
        prompts
            .into_iter()
            .map(|p| match p {
                P::Ids(ids) => Ok(ids),
                P::Text(t) => st
                    .model()
                    .tokenizer
                    .encode(&t, true, true)
                    .map_err(|e| ApiError::invalid("prompt", format!("cannot tokenize: {e}"))),
            })
            .collect()
    })
    .await?;
    for p in &prompts {
        if p.is_empty() {
            return Err(ApiError::invalid("prompt", "the prompt is empty"));
        }
        check_length(&state, p, &params).map_err(|mut e| {
            if e.param.as_deref() == Some("messages") {
                e.param = Some("prompt".into());
            }
            e
        })?;
    }
    let generation = Generation::start(
        state.clone(),
        prompts,
        &params,
        &ParseSpec::default(),
        started,
    )?;
    let id = format!("cmpl-{}", random_id());
    let format = CompletionStream {
        state: state.clone(),
        id: id.clone(),
        logprobs: params.logprobs.is_some(),
        offsets: Vec::new(),
    };
    respond(generation, &params, format, |results, usage| {
        responses::completion(
            &id,
            &state.served_model_name,
            &state.model().tokenizer,
            results,
            usage,
            params.logprobs.is_some(),
        )
    })
    .await
}

/// The response to a generation: streamed in `format`, or collected whole and shaped by
/// `whole`.
pub(crate) async fn respond<B: serde::Serialize>(
    generation: Generation,
    params: &GenParams,
    format: impl StreamFormat,
    whole: impl FnOnce(Vec<ChoiceResult>, protocol::Usage) -> B,
) -> Result<Response, ApiError> {
    if params.stream {
        return Ok(stream(generation, params.include_usage, format));
    }
    let n = generation.choices();
    let (results, usage) = collect(generation, n).await?;
    Ok(axum::Json(whole(results, usage)).into_response())
}

pub(crate) fn random_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Runs a generation to its end (non-streaming responses).
async fn collect(
    mut generation: Generation,
    n: usize,
) -> Result<(Vec<ChoiceResult>, protocol::Usage), ApiError> {
    let mut results: Vec<ChoiceResult> = (0..n).map(|_| ChoiceResult::default()).collect();
    while let Some(update) = generation.next().await {
        match update {
            Update::Output {
                index,
                pieces,
                tokens,
            } => {
                for piece in pieces {
                    results[index].add(piece);
                }
                results[index].tokens.extend(tokens);
            }
            Update::Done { index, finish } => results[index].finish = Some(finish),
            Update::Failed(e) => return Err(e),
        }
    }
    Ok((results, generation.usage()))
}

/// An SSE response whose events come from `rx`; when the client goes away the body is dropped,
/// `rx` with it, and the producer sees its channel closed.
fn sse(rx: mpsc::Receiver<String>) -> Response {
    let events = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|data| (Ok::<_, Infallible>(Event::default().data(data)), rx))
    });
    Sse::new(events).into_response()
}

pub(crate) fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("response types serialise")
}

/// How an endpoint renders a streamed generation's events as `data:` payloads.
pub(crate) trait StreamFormat: Send + 'static {
    /// Chunks before any text (chat: each choice's assistant role).
    fn opening(&mut self, choices: usize) -> Vec<String>;
    /// Chunks for new output of choice `index` and the tokens that made it.
    fn output(&mut self, index: usize, pieces: Vec<Output>, tokens: &[TokenInfo]) -> Vec<String>;
    fn done(&mut self, index: usize, finish: &str) -> String;
    /// The final chunk with `usage` and no choices.
    fn usage(&self, usage: protocol::Usage) -> String;
}

/// Streams a generation as SSE in `format`, then the usage chunk (if asked) and `[DONE]`. A client
/// that goes away closes the channel, which drops the generation and aborts it.
fn stream(
    mut generation: Generation,
    include_usage: bool,
    mut format: impl StreamFormat,
) -> Response {
    let (tx, rx) = mpsc::channel::<String>(64);
    tokio::spawn(async move {
        for chunk in format.opening(generation.choices()) {
            if tx.send(chunk).await.is_err() {
                return;
            }
        }
        loop {
            let update = tokio::select! {
                _ = tx.closed() => return,
                u = generation.next() => u,
            };
            let chunks = match update {
                None => break,
                Some(Update::Output {
                    index,
                    pieces,
                    tokens,
                }) => format.output(index, pieces, &tokens),
                Some(Update::Done { index, finish }) => vec![format.done(index, finish)],
                Some(Update::Failed(e)) => {
                    let _ = tx.send(to_json(&e.body())).await;
                    return;
                }
            };
            for data in chunks {
                if tx.send(data).await.is_err() {
                    return;
                }
            }
        }
        if include_usage {
            let _ = tx.send(format.usage(generation.usage())).await;
        }
        let _ = tx.send("[DONE]".into()).await;
    });
    sse(rx)
}

struct CompletionStream {
    state: Shared,
    id: String,
    logprobs: bool,
    /// Text offset of each choice so far (completions' `text_offset`).
    offsets: Vec<usize>,
}

impl StreamFormat for CompletionStream {
    fn opening(&mut self, choices: usize) -> Vec<String> {
        self.offsets = vec![0; choices];
        Vec::new()
    }

    fn output(&mut self, index: usize, pieces: Vec<Output>, tokens: &[TokenInfo]) -> Vec<String> {
        let text: String = pieces
            .into_iter()
            .filter_map(|p| match p {
                Output::Content(c) => Some(c),
                _ => None,
            })
            .collect();
        if text.is_empty() && tokens.is_empty() {
            return Vec::new();
        }
        let tok = &self.state.model().tokenizer;
        let logprobs = self
            .logprobs
            .then(|| responses::completion_logprobs(tok, tokens, self.offsets[index]));
        self.offsets[index] += text.len();
        let model = &self.state.served_model_name;
        vec![to_json(&responses::completion_chunk(
            &self.id, model, index, text, None, logprobs,
        ))]
    }

    fn done(&mut self, index: usize, finish: &str) -> String {
        let model = &self.state.served_model_name;
        to_json(&responses::completion_chunk(
            &self.id,
            model,
            index,
            String::new(),
            Some(finish),
            None,
        ))
    }

    fn usage(&self, usage: protocol::Usage) -> String {
        to_json(&protocol::Completion {
            id: self.id.clone(),
            object: "text_completion".into(),
            created: responses::now_secs(),
            model: self.state.served_model_name.clone(),
            choices: Vec::new(),
            usage: Some(usage),
        })
    }
}

async fn models(State(state): State<Shared>) -> axum::Json<ModelList> {
    axum::Json(ModelList {
        object: "list".into(),
        data: vec![ModelCard {
            id: state.served_model_name.clone(),
            object: "model".into(),
            created: state.created,
            owned_by: "specula".into(),
        }],
    })
}

async fn health(State(state): State<Shared>) -> Response {
    match state.phase() {
        Phase::Ready if state.model().engine.is_alive() => StatusCode::OK.into_response(),
        Phase::Ready => ApiError::unavailable("the engine has stopped").into_response(),
        _ => not_ready(&state).into_response(),
    }
}

/// Runs a one-token generation through the engine: 200 when it completes.
async fn health_generate(State(state): State<Shared>) -> Response {
    if state.phase() != Phase::Ready {
        return not_ready(&state).into_response();
    }
    match probe(&state.model().engine, Duration::from_secs(60)).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(message) => ApiError::unavailable(message).into_response(),
    }
}

/// One greedy token from the engine (warm-up and `/health_generate`).
pub async fn probe(engine: &engine::EngineHandle, timeout: Duration) -> Result<(), String> {
    let request = engine::GenerateRequest {
        prompt: vec![0],
        max_tokens: 1,
        sampling: model::sampler::SamplingParams::greedy(),
        ignore_eos: true,
        stop_token_ids: Vec::new(),
        logprobs: None,
        scripted: Vec::new(),
    };
    let mut stream = engine.submit(request).map_err(|e| e.to_string())?;
    let wait = async {
        while let Some(event) = stream.events.recv().await {
            match event {
                engine::TokenEvent::Finished { .. } => return Ok(()),
                engine::TokenEvent::Failed(m) => return Err(m),
                engine::TokenEvent::Token { .. } | engine::TokenEvent::Admitted { .. } => {}
            }
        }
        Err("the engine stopped".to_string())
    };
    tokio::time::timeout(timeout, wait)
        .await
        .map_err(|_| format!("no token within {} s", timeout.as_secs()))?
}

async fn server_info(State(state): State<Shared>) -> axum::Json<Value> {
    let s = state
        .loaded()
        .map(|l| l.engine.stats().snapshot())
        .unwrap_or_default();
    let phase = match state.phase() {
        Phase::Loading => "loading",
        Phase::Ready => "ready",
        Phase::Draining => "draining",
    };
    let (enabled, host_total) = state.loaded().map_or((false, 0), |l| {
        (
            l.engine.config().prefix_cache,
            l.engine.config().host_cache_blocks,
        )
    });
    let mut info = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "served_model_name": state.served_model_name,
        "phase": phase,
        "config": state.info,
    });
    if let (Value::Object(info), Value::Object(counters)) =
        (&mut info, counters_json(&s, enabled, host_total))
    {
        info.extend(counters);
    }
    axum::Json(info)
}

/// The statistics sections of `/server_info`.
pub(crate) fn counters_json(s: &engine::StatsSnapshot, enabled: bool, host_total: usize) -> Value {
    json!({
        "stats": {
            "in_flight": s.in_flight,
            "running": s.running,
            "queued": s.queued,
            "kv_blocks_used": s.kv_used_blocks,
            "kv_blocks_total": s.kv_total_blocks,
            "preemptions": s.preemptions,
            "aborted": s.aborted,
            "prompt_tokens": s.prompt_tokens,
            "generation_tokens": s.generation_tokens,
            "steps": s.steps,
            "finished": s.finished,
        },
        "prefix_cache": {
            "enabled": enabled,
            "hit_rate": s.cache_hit_rate(),
            "prompt_tokens": s.cache_prompt_tokens,
            "cached_tokens": s.cache_hit_tokens,
            "device_blocks": s.cache_blocks,
            "device_idle_blocks": s.cache_idle_blocks,
            "host_blocks": s.cache_host_blocks,
            "host_blocks_total": host_total,
            "host_cached_tokens": s.cache_host_hit_tokens,
            "demoted_blocks": s.cache_demoted_blocks,
            "promoted_blocks": s.cache_promoted_blocks,
            "storage_cached_tokens": s.cache_storage_hit_tokens,
            "stored_blocks": s.cache_stored_blocks,
            "evicted_blocks": s.cache_evicted_blocks,
        },
        "speculative": {
            "draft_tokens": s.spec_proposed,
            "accepted_tokens": s.spec_accepted,
            "verifications": s.spec_verifications,
            "tree_verifications": s.spec_tree_verifications,
            "acceptance_rate": if s.spec_proposed > 0 { s.spec_accepted as f64 / s.spec_proposed as f64 } else { 0.0 },
            "accept_length": if s.spec_verifications > 0 { 1.0 + s.spec_accepted as f64 / s.spec_verifications as f64 } else { 0.0 },
            "steps_on": s.spec_steps_on,
            "steps_off": s.spec_steps_off,
            "step_cost_ms": {"a": s.step_cost_a * 1e3, "b_per_row": s.step_cost_b * 1e3},
        }
    })
}

async fn metrics(State(state): State<Shared>) -> Response {
    let text = state.metrics.render(
        &state
            .loaded()
            .map(|l| l.engine.stats().snapshot())
            .unwrap_or_default(),
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
