//! `POST /v1/completions`: a text prompt, several, or token ids, each tokenized and generated
//! as it is (no template), answered as OpenAI's `text_completion`.

use crate::Shared;
use crate::body::Body;
use crate::error::ApiError;
use crate::generate::{Generation, ParseSpec, TokenInfo};
use crate::params;
use crate::parsers::Output;
use crate::request::{blocking, check_length, read_body};
use crate::respond::{StreamFormat, random_id, respond, to_json};
use crate::response_format;
use crate::responses;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use serde_json::Value;
use std::time::Instant;

/// Every prompt checked and tokenized before any is submitted; `n` choices each.
pub(crate) async fn completions(
    State(state): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let body = read_body(&state, body)?;
    let mut params = params::parse(&body, false)?;
    params.constraint = response_format::compile(&state, response_format::parse(&body)?).await?;
    let prompts = prompts(&body, state.model().tokenizer.vocab_size())?;
    let prompts = tokenize(&state, prompts).await?;
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

/// One prompt of a request: text is tokenized, token ids are taken as they are.
enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// `prompt`: a string, a list of strings, token ids, or a list of token-id lists (ids below
/// `vocab`).
fn prompts(body: &Body, vocab: usize) -> Result<Vec<Prompt>, ApiError> {
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
    let not_a_prompt = || {
        ApiError::invalid(
            "prompt",
            "`prompt` must be a string, a list of strings, or token ids",
        )
    };
    match body.get("prompt") {
        Some(Value::String(s)) => Ok(vec![Prompt::Text(s.clone())]),
        Some(Value::Array(items)) if !items.is_empty() => {
            if items.iter().all(Value::is_number) {
                return Ok(vec![Prompt::Ids(ids(items)?)]);
            }
            items
                .iter()
                .map(|item| match item {
                    Value::String(s) => Ok(Prompt::Text(s.clone())),
                    Value::Array(inner) => Ok(Prompt::Ids(ids(inner)?)),
                    _ => Err(not_a_prompt()),
                })
                .collect()
        }
        Some(_) => Err(not_a_prompt()),
        None => Err(ApiError::invalid("prompt", "`prompt` is required")),
    }
}

/// The prompts as token ids (tokenized off the async threads).
async fn tokenize(state: &Shared, prompts: Vec<Prompt>) -> Result<Vec<Vec<u32>>, ApiError> {
    let state = state.clone();
    blocking(move || {
        prompts
            .into_iter()
            .map(|p| match p {
                Prompt::Ids(ids) => Ok(ids),
                Prompt::Text(t) => state
                    .model()
                    .tokenizer
                    .encode(&t, true, true)
                    .map_err(|e| ApiError::invalid("prompt", format!("cannot tokenize: {e}"))),
            })
            .collect()
    })
    .await
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
