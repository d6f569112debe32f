//! `POST /v1/embeddings`: each input's embedding from the served model, the last token's final
//! hidden state (after the output norm), L2-normalised: the pooling decoder embedding models use.
//! Each input runs in the engine as a prefill of its own, batched with whatever else runs (and
//! using the prefix cache), at most 16 of one request at a time; `dimensions` keeps the leading values and normalises again;
//! `encoding_format: base64` sends the little-endian f32 bytes. A client that goes away drops
//! the requests, which ends them in the engine.

use crate::Shared;
use crate::error::ApiError;
use crate::request::{blocking, check_batch, check_model, read_body};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use base64::Engine as _;
use engine::{GenerateRequest, RequestStream, TokenEvent};
use model::sampler::SamplingParams;
use protocol::embeddings::{
    Embedding, EmbeddingInput, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage,
};
use serde_json::Value;

/// Inputs of one request in the engine at a time: a request of many inputs takes a share of
/// the queue, not all of it.
const IN_FLIGHT: usize = 16;
/// How the hidden states are pooled.
pub const POOLING: &str = "last";

pub(crate) async fn embeddings(
    State(state): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<EmbeddingResponse>, ApiError> {
    let request: EmbeddingRequest = read_body(&state, body)?;
    check_model(&state, request.model.as_deref())?;
    let base64 = match request.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!(
                    "`encoding_format` {other:?} is not supported: use \"float\" or \"base64\""
                ),
            ));
        }
    };
    let hidden = state.model().hidden_size;
    let dimensions = match request.dimensions {
        None => hidden,
        Some(d) if d >= 1 && d as usize <= hidden => d as usize,
        Some(d) => {
            return Err(ApiError::invalid(
                "dimensions",
                format!("`dimensions` must be from 1 to {hidden} (the model's width), not {d}"),
            ));
        }
    };
    let input = request
        .input
        .ok_or_else(|| ApiError::invalid("input", "`input` is required"))?;
    let prompts = prompts(&state, input).await?;
    let mut vectors = Vec::with_capacity(prompts.len());
    for window in prompts.chunks(IN_FLIGHT) {
        let streams = window
            .iter()
            .map(|p| submit(&state, p.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        for stream in streams {
            vectors.push(truncated(wait(stream).await?, dimensions));
        }
    }
    let mut data = Vec::with_capacity(vectors.len());
    for (index, vector) in vectors.into_iter().enumerate() {
        data.push(Embedding {
            object: "embedding".into(),
            index,
            embedding: if base64 {
                Value::String(encode(&vector))
            } else {
                serde_json::json!(vector)
            },
        });
    }
    let tokens = prompts.iter().map(Vec::len).sum::<usize>() as u64;
    Ok(Json(EmbeddingResponse {
        object: "list".into(),
        data,
        model: state.served_model_name.clone(),
        usage: EmbeddingUsage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
        pooling: POOLING.into(),
        normalized: true,
    }))
}

/// The inputs as token ids (texts tokenized off the async threads, with the model's BOS).
async fn prompts(state: &Shared, input: EmbeddingInput) -> Result<Vec<Vec<u32>>, ApiError> {
    let count = match &input {
        EmbeddingInput::Texts(t) => t.len(),
        EmbeddingInput::Tokens(t) => t.len(),
    };
    check_batch(count, "input")?;
    let vocab = state.model().tokenizer.vocab_size() as u32;
    match input {
        EmbeddingInput::Tokens(lists) => {
            for (i, ids) in lists.iter().enumerate() {
                if ids.is_empty() {
                    return Err(ApiError::invalid("input", format!("`input[{i}]` is empty")));
                }
                if let Some(t) = ids.iter().find(|&&t| t >= vocab) {
                    return Err(ApiError::invalid(
                        "input",
                        format!("`input[{i}]`: token id {t} is not in the vocabulary (0..{vocab})"),
                    ));
                }
            }
            Ok(lists)
        }
        EmbeddingInput::Texts(texts) => {
            let state = state.clone();
            blocking(move || {
                let most = crate::request::max_prompt_bytes(&state);
                texts
                    .iter()
                    .enumerate()
                    .map(|(i, text)| {
                        if text.is_empty() || text.len() > most {
                            return Err(ApiError::invalid(
                                "input",
                                format!("`input[{i}]` must be 1 to {most} bytes of text"),
                            ));
                        }
                        state
                            .model()
                            .tokenizer
                            .encode(text, true, true)
                            .map_err(|e| {
                                ApiError::invalid(
                                    "input",
                                    format!("cannot tokenize `input[{i}]`: {e}"),
                                )
                            })
                    })
                    .collect()
            })
            .await
        }
    }
}

fn submit(state: &Shared, prompt: Vec<u32>) -> Result<RequestStream, ApiError> {
    let engine = &state.model().engine;
    engine
        .check(prompt.len(), 1)
        .map_err(|e| ApiError::invalid("input", e.to_string()))?;
    let request = GenerateRequest {
        prompt,
        max_tokens: 1,
        sampling: SamplingParams::greedy(),
        ignore_eos: false,
        stop_token_ids: Vec::new(),
        logprobs: None,
        scripted: Vec::new(),
        constraint: None,
        embed: true,
    };
    Ok(engine.submit(request)?)
}

/// The vector a request's events end with.
async fn wait(mut stream: RequestStream) -> Result<Vec<f32>, ApiError> {
    let mut vector = None;
    while let Some(event) = stream.events.recv().await {
        match event {
            TokenEvent::Embedding(v) => vector = Some(v),
            TokenEvent::Failed(f) => return Err(ApiError::internal(f.to_string())),
            TokenEvent::Finished { .. } => break,
            TokenEvent::Token { .. } | TokenEvent::Admitted { .. } => {}
        }
    }
    vector.ok_or_else(|| ApiError::internal("the engine stopped before the embedding was made"))
}

/// The leading `dimensions` values, normalised again (all of them: the vector as it is).
fn truncated(mut v: Vec<f32>, dimensions: usize) -> Vec<f32> {
    if dimensions >= v.len() {
        return v;
    }
    v.truncate(dimensions);
    let norm = v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut()
            .for_each(|x| *x = (f64::from(*x) / norm) as f32);
    }
    v
}

/// OpenAI's base64 form: the little-endian f32 bytes.
fn encode(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_renormalises_and_base64_is_little_endian_f32() {
        let v = truncated(vec![0.6, 0.0, 0.8], 2);
        assert_eq!(v, [1.0, 0.0]);
        assert_eq!(truncated(vec![0.6, 0.8], 5), [0.6, 0.8]);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encode(&[1.0, -2.5]))
            .unwrap();
        assert_eq!(
            bytes,
            [1.0f32.to_le_bytes(), (-2.5f32).to_le_bytes()].concat()
        );
    }
}
