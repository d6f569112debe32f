//! `GET /health` (the phase and the engine thread) and `GET /health_generate` (one token through
//! the engine), and the probe serve runs before it says it is ready.

use crate::error::ApiError;
use crate::request::not_ready;
use crate::{Phase, Shared};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use std::time::Duration;

/// 200 while ready and the engine thread runs; 503 otherwise.
pub(crate) async fn health(State(state): State<Shared>) -> Response {
    match state.phase() {
        Phase::Ready if state.model().engine.is_alive() => StatusCode::OK.into_response(),
        Phase::Ready => ApiError::unavailable("the engine has stopped").into_response(),
        _ => not_ready(&state).into_response(),
    }
}

/// Runs a one-token generation through the engine: 200 when it completes.
pub(crate) async fn health_generate(State(state): State<Shared>) -> Response {
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
        constraint: None,
        embed: false,
    };
    let mut stream = engine.submit(request).map_err(|e| e.to_string())?;
    let wait = async {
        while let Some(event) = stream.events.recv().await {
            match event {
                engine::TokenEvent::Finished { .. } => return Ok(()),
                engine::TokenEvent::Failed(m) => return Err(m.to_string()),
                engine::TokenEvent::Token { .. }
                | engine::TokenEvent::Admitted { .. }
                | engine::TokenEvent::Embedding(_) => {}
            }
        }
        Err("the engine stopped".to_string())
    };
    tokio::time::timeout(timeout, wait)
        .await
        .map_err(|_| format!("no token within {} s", timeout.as_secs()))?
}
