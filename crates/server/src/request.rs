//! What every generating route does with its request: the body read as the route's typed
//! request (and the server's phase and model name checked), work moved off the async threads,
//! and the prompt's length checked before anything is queued.

use crate::error::ApiError;
use crate::fields::{self, Route};
use crate::params::GenParams;
use crate::{AppState, Phase};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use protocol::request::{ChatCompletionRequest, CompletionRequest, FromBody, GenerationFields};
use serde_json::{Map, Value};

/// A generating route's typed request.
pub(crate) trait RouteRequest: FromBody {
    /// The route whose fields it has.
    const ROUTE: Route;
    /// The fields every generating route has.
    fn generation(&self) -> &GenerationFields;
}

impl RouteRequest for ChatCompletionRequest {
    const ROUTE: Route = Route::Chat;
    fn generation(&self) -> &GenerationFields {
        &self.generation
    }
}

impl RouteRequest for CompletionRequest {
    const ROUTE: Route = Route::Completions;
    fn generation(&self) -> &GenerationFields {
        &self.generation
    }
}

/// The request body as the route's request: a JSON object, its aliases rewritten, any field the
/// route does not read refused, and every field of the wrong shape named.
pub(crate) fn read_request<R: RouteRequest>(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<R, ApiError> {
    let mut map = body_object(state, body)?;
    fields::normalise(&mut map, R::ROUTE)?;
    let request = protocol::request::parse::<R>(Value::Object(map)).map_err(ApiError::field)?;
    check_model(state, request.generation().model.as_deref())?;
    Ok(request)
}

/// The body of a route that does not generate (its request type refuses unknown fields itself).
pub(crate) fn read_body<R: FromBody>(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<R, ApiError> {
    let map = body_object(state, body)?;
    protocol::request::parse::<R>(Value::Object(map)).map_err(ApiError::field)
}

/// A request's `model`, when given, must be the served one.
pub(crate) fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(m) if !m.is_empty() && m != state.served_model_name => Err(ApiError::invalid(
            "model",
            format!(
                "the model `{m}` does not exist; this server serves `{}`",
                state.served_model_name
            ),
        )),
        _ => Ok(()),
    }
}

/// The body as a JSON object, read while the server is ready; a body over the limit is a 413
/// and one that stalls a 408, each with an error body.
fn body_object(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Map<String, Value>, ApiError> {
    if state.phase() != Phase::Ready {
        return Err(not_ready(state));
    }
    let bytes = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body is over {} bytes", state.max_body_bytes),
            )
        } else if let Some(t) = crate::listener::body_timeout(&e) {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s (--body-read-timeout)",
                    t.0.as_secs_f64()
                ),
            )
        } else {
            ApiError::bad_request(format!("cannot read the request body: {e}"))
        }
    })?;
    json_object(&bytes)
}

/// A request body as the JSON object it must be.
pub(crate) fn json_object(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::bad_request(
            "the request body must be a JSON object",
        )),
        Err(e) => Err(ApiError::bad_request(format!(
            "the request body is not valid JSON: {e}"
        ))),
    }
}

/// The 503 for a server that is loading or shutting down.
pub(crate) fn not_ready(state: &AppState) -> ApiError {
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

/// The most prompt bytes that can fit: the context's tokens at the tokenizer's most bytes a
/// token.
pub(crate) fn max_prompt_bytes(state: &AppState) -> usize {
    let model = state.model();
    let c = model.engine.config();
    c.context_length
        .min(c.kv_capacity_tokens())
        .saturating_mul(model.max_token_bytes)
}

/// A prompt of `bytes` bytes of text that could not fit the context even at the tokenizer's most
/// bytes per token is refused at once, before it is rendered or tokenized.
pub(crate) fn check_prompt_bytes(
    state: &AppState,
    bytes: usize,
    param: &str,
) -> Result<(), ApiError> {
    let most = max_prompt_bytes(state);
    if bytes > most {
        return Err(ApiError::invalid(
            param,
            format!(
                "the prompt's text is {bytes} bytes; no prompt over {most} bytes fits the context ({} tokens of at most {} bytes each)",
                most / state.model().max_token_bytes,
                state.model().max_token_bytes
            ),
        ));
    }
    Ok(())
}

/// The most inputs one request may hold in a batch (`/tokenize`'s prompts, `/detokenize`'s
/// lists, `/v1/embeddings`' inputs: OpenAI's limit for embeddings).
pub(crate) const MAX_BATCH_INPUTS: usize = 2048;

/// A batch of `count` inputs (in `param`) must hold 1 to [`MAX_BATCH_INPUTS`].
pub(crate) fn check_batch(count: usize, param: &str) -> Result<(), ApiError> {
    if count == 0 || count > MAX_BATCH_INPUTS {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must hold 1 to {MAX_BATCH_INPUTS} inputs, not {count}"),
        ));
    }
    Ok(())
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
