//! OpenAI's Responses API: `POST /v1/responses` (whole, or streamed as its typed events),
//! `GET /v1/responses/{id}` and `DELETE /v1/responses/{id}`. A request is the chat it means
//! (`input.rs`), run as chat completions are, and its output is items (`output.rs`):
//! reasoning from the reasoning parser, the message, function calls from the tool-call parser.
//! A response is stored (bounded, `response_store.rs`) unless `store: false`, so that a later
//! request's `previous_response_id` continues its conversation.

mod input;
mod output;

use crate::Shared;
use crate::chat::ChatRun;
use crate::error::ApiError;
use crate::request::{check_model, read_body};
use crate::respond::respond;
use crate::response_format::Compiled;
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use output::{Meta, ResponsesStream, items_of};
use protocol::responses_api::ResponsesRequest;
use serde_json::{Map, Value, json};
use std::time::Instant;

pub(crate) async fn create(
    State(state): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let request: ResponsesRequest = read_body(&state, body)?;
    check_model(&state, request.model.as_deref())?;
    let previous = match &request.previous_response_id {
        None => Vec::new(),
        Some(id) => state.responses.get(id).map(|s| s.history).ok_or_else(|| {
            not_found(
                id,
                "previous_response_id",
                "(responses made with `store: false` are not kept, and the oldest are dropped past the store's bounds)",
            )
        })?,
    };
    let plan = input::chat_plan(&request, previous)?;
    let echo = echo(&request);
    let store = request.store.unwrap_or(true);
    drop(request);
    let run = ChatRun::start(&state, plan.chat, started).await?;
    let meta = Meta::new(state.clone(), echo, store, plan.history);
    // One of the two shapes the answer: the stream, or the whole response.
    let format = ResponsesStream::new(meta.clone());
    let response = respond(run.generation, &run.params, format, |mut results, usage| {
        let result = results.swap_remove(0);
        let items = items_of(&result);
        meta.finish(&items, result.finish.unwrap_or("stop"), usage)
    })
    .await?;
    Ok(Compiled::mark(&run.unenforced, response))
}

/// `GET /v1/responses/{id}`: a stored response's body.
pub(crate) async fn retrieve(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    state
        .responses
        .get(&id)
        .map(|s| Json(s.body))
        .ok_or_else(|| not_found(&id, "response_id", ""))
}

/// `DELETE /v1/responses/{id}`.
pub(crate) async fn delete(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if !state.responses.remove(&id) {
        return Err(not_found(&id, "response_id", ""));
    }
    Ok(Json(
        json!({"id": id, "object": "response", "deleted": true}),
    ))
}

fn not_found(id: &str, param: &str, why: &str) -> ApiError {
    ApiError {
        param: Some(param.into()),
        ..ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no stored response has the id `{id}` {why}")
                .trim_end()
                .to_string(),
        )
    }
}

/// The request's fields a response echoes, with OpenAI's defaults where they were not given.
fn echo(r: &ResponsesRequest) -> Map<String, Value> {
    let tools: Vec<Value> = r
        .tools
        .iter()
        .flatten()
        .map(|t| {
            json!({"type": t.kind, "name": t.name, "description": t.description,
                "parameters": t.parameters, "strict": t.strict.unwrap_or(true)})
        })
        .collect();
    let text = r
        .text
        .as_ref()
        .and_then(|t| t.format.as_ref())
        .map(|f| {
            let mut format = json!({"type": f.kind});
            for (k, v) in [
                ("name", json!(f.name)),
                ("schema", json!(f.schema)),
                ("strict", json!(f.strict)),
                ("description", json!(f.description)),
            ] {
                if !v.is_null() {
                    format[k] = v;
                }
            }
            format
        })
        .unwrap_or_else(|| json!({"type": "text"}));
    let reasoning = r.reasoning.as_ref().map_or_else(
        || json!({"effort": null, "summary": null}),
        |c| json!({"effort": c.effort, "summary": c.summary}),
    );
    let fields = [
        ("instructions", json!(r.instructions)),
        ("max_output_tokens", json!(r.max_output_tokens)),
        ("temperature", json!(r.temperature.unwrap_or(1.0))),
        ("top_p", json!(r.top_p.unwrap_or(1.0))),
        ("tools", Value::Array(tools)),
        (
            "tool_choice",
            r.tool_choice.clone().unwrap_or_else(|| json!("auto")),
        ),
        (
            "parallel_tool_calls",
            json!(r.parallel_tool_calls.unwrap_or(true)),
        ),
        ("text", json!({"format": text})),
        ("reasoning", reasoning),
        ("previous_response_id", json!(r.previous_response_id)),
        ("store", json!(r.store.unwrap_or(true))),
        ("metadata", json!(r.metadata.clone().unwrap_or_default())),
        ("truncation", json!("disabled")),
        ("background", json!(false)),
        ("user", json!(r.user)),
    ];
    fields
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}
