//! The route table: `/v1/chat/completions` (`chat.rs`), `/v1/completions` (`completions.rs`),
//! Anthropic's `/v1/messages` and `/v1/messages/count_tokens` (`messages.rs`), the Responses
//! API's `/v1/responses` and `/v1/responses/{id}` (`responses_api/`), `/v1/embeddings`
//! (`embeddings.rs`),
//! `/v1/models` and `/v1/models/{id}`, `/tokenize` and `/detokenize` (`tokenize.rs`, also under
//! `/v1/`), `/flush_cache`, `/health` and `/health_generate` (`health.rs`), `/server_info`
//! and `/metrics` (`info.rs`); `/v1/*` behind the API key when there is one, and everything else
//! a 404 with an error body.

use crate::budget;
use crate::chat::chat;
use crate::completions::completions;
use crate::embeddings::embeddings;
use crate::error::ApiError;
use crate::health::{health, health_generate};
use crate::info::{metrics, server_info};
use crate::messages::{count_tokens, messages};
use crate::request::not_ready;
use crate::responses_api;
use crate::tokenize::{detokenize, tokenize};
use crate::{Phase, Shared};
use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::FutureExt;
use protocol::{ModelCard, ModelList};
use serde_json::json;

/// The application's routes over `state`.
pub fn router(state: Shared) -> Router {
    // The generating routes reserve their share of the request memory budget before their
    // bodies are read.
    let generating = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/messages", post(messages))
        .route("/v1/responses", post(responses_api::create))
        .route("/v1/embeddings", post(embeddings))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            budget::reserve_memory,
        ));
    let v1 = Router::new()
        .merge(generating)
        .route("/v1/models", get(models))
        // A catch-all: served names may hold slashes (`org/model`).
        .route("/v1/models/{*id}", get(model))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route(
            "/v1/responses/{id}",
            get(responses_api::retrieve).delete(responses_api::delete),
        )
        .route("/tokenize", post(tokenize))
        .route("/v1/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/v1/detokenize", post(detokenize))
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
        .layer(middleware::from_fn_with_state(state.clone(), catch_panic))
        .with_state(state)
}

/// A panic while handling a request is a 500 for that request alone (the connection and the
/// server go on); it is logged and counted.
async fn catch_panic(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let route = req.uri().path().to_string();
    match std::panic::AssertUnwindSafe(next.run(req))
        .catch_unwind()
        .await
    {
        Ok(response) => response,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            state
                .metrics
                .panics
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::error!(route, panic = what, "a request's handler panicked");
            ApiError::internal(format!("the server failed on this request: {what}")).into_response()
        }
    }
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

/// Anthropic's API key header.
const X_API_KEY: header::HeaderName = header::HeaderName::from_static("x-api-key");

async fn require_api_key(State(state): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        // OpenAI's clients send a bearer token, Anthropic's an `x-api-key` header.
        let header = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
        let bearer = header(header::AUTHORIZATION).and_then(|v| v.strip_prefix("Bearer "));
        let given = bearer.or_else(|| header(X_API_KEY));
        if given != Some(key.as_str()) {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "a valid API key is required (Authorization: Bearer <key>, or x-api-key: <key>)",
            )
            .into_response();
        }
    }
    next.run(req).await
}

async fn models(State(state): State<Shared>) -> axum::Json<ModelList> {
    axum::Json(ModelList {
        object: "list".into(),
        data: vec![model_card(&state)],
    })
}

/// `GET /v1/models/{id}` (the SDK's `models.retrieve`): the served model, or a 404.
async fn model(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<axum::Json<ModelCard>, ApiError> {
    if id != state.served_model_name {
        return Err(ApiError {
            param: Some("model".into()),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "the model `{id}` does not exist; this server serves `{}`",
                    state.served_model_name
                ),
            )
        });
    }
    Ok(axum::Json(model_card(&state)))
}

fn model_card(state: &Shared) -> ModelCard {
    ModelCard {
        id: state.served_model_name.clone(),
        object: "model".into(),
        created: state.created,
        owned_by: "specula".into(),
    }
}
