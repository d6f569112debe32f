//! `POST /tokenize` and `/detokenize` (also under `/v1/`): text to the served model's token ids
//! and back. One body answers every peer's client: llama-server's `tokens` (with `with_pieces`,
//! `{id, piece}` objects) and `content`, vLLM's `count`, `max_model_len`, `token_strs` and
//! `prompt`, SGLang's `count`, `char_count` and `text` (lists of each for a batch).

use crate::Shared;
use crate::error::ApiError;
use crate::fields::check_template_kwargs;
use crate::request::{blocking, check_batch, check_model, check_prompt_bytes, read_body};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use model::chat_template::ChatOptions;
use model::tokenizer::Tokenizer;
use protocol::request::{DetokenizeRequest, PromptInput, TokenizeRequest};
use serde_json::{Value, json};

/// The token ids of `content`, `prompt` (one text or several) or `messages` (rendered by the
/// chat template, the generation prompt added unless `add_generation_prompt` is false).
pub(crate) async fn tokenize(
    State(state): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let request: TokenizeRequest = read_body(&state, body)?;
    check_model(&state, request.model.as_deref())?;
    let source = Source::of(
        request.content.is_some(),
        request.prompt.is_some(),
        request.messages.is_some(),
    )?;
    // llama-server adds no BOS by default; vLLM and SGLang add it to a prompt, and a chat
    // template writes its own.
    let add_special = request
        .add_special
        .or(request.add_special_tokens)
        .unwrap_or(source == Source::Prompt);
    let parse_special = request.parse_special.unwrap_or(true);
    let pieces = Pieces {
        objects: request.with_pieces.unwrap_or(false),
        strings: request.return_token_strs.unwrap_or(false),
    };
    blocking(move || {
        let model = state.model();
        let tok = &model.tokenizer;
        let encode = |text: &str, param: &str| {
            tok.encode(text, add_special, parse_special)
                .map_err(|e| ApiError::invalid(param, format!("cannot tokenize: {e}")))
        };
        let (texts, batch) = match source {
            Source::Content => (vec![request.content.unwrap_or_default()], false),
            Source::Prompt => prompt_texts(request.prompt.map(|p| p.0).unwrap_or_default())?,
            Source::Messages => (vec![render(&state, &request)?], false),
        };
        let param = source.param();
        check_batch(texts.len(), param)?;
        // A text no context can hold is not tokenized (nor its pieces written out).
        for t in &texts {
            check_prompt_bytes(&state, t.len(), param)?;
        }
        let answers = texts
            .iter()
            .map(|t| Ok((encode(t, param)?, t.chars().count())))
            .collect::<Result<Vec<_>, ApiError>>()?;
        let max_model_len = model.engine.config().context_length;
        Ok(Json(tokenized(tok, &answers, batch, pieces, max_model_len)))
    })
    .await
}

/// Where the text to tokenize comes from: exactly one of the three fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Content,
    Prompt,
    Messages,
}

impl Source {
    fn of(content: bool, prompt: bool, messages: bool) -> Result<Self, ApiError> {
        match (content, prompt, messages) {
            (true, false, false) => Ok(Self::Content),
            (false, true, false) => Ok(Self::Prompt),
            (false, false, true) => Ok(Self::Messages),
            _ => Err(ApiError::bad_request(
                "give exactly one of `content` (llama-server), `prompt` or `messages`",
            )),
        }
    }

    fn param(self) -> &'static str {
        match self {
            Self::Content => "content",
            Self::Prompt => "prompt",
            Self::Messages => "messages",
        }
    }
}

/// A prompt's texts, and whether it was a list (a batch); token ids are refused.
fn prompt_texts(inputs: Vec<PromptInput>) -> Result<(Vec<String>, bool), ApiError> {
    let batch = inputs.len() > 1;
    let texts = inputs
        .into_iter()
        .map(|p| match p {
            PromptInput::Text(t) => Ok(t),
            PromptInput::Ids(_) => Err(ApiError::invalid(
                "prompt",
                "`prompt` must be text here: token ids are tokenized already",
            )),
        })
        .collect::<Result<_, _>>()?;
    Ok((texts, batch))
}

/// The chat template's text for the request's messages.
fn render(state: &Shared, request: &TokenizeRequest) -> Result<String, ApiError> {
    let template = state
        .model()
        .template
        .as_ref()
        .ok_or_else(|| ApiError::bad_request("this model has no chat template"))?;
    let mut opts = ChatOptions::default();
    if let Some(v) = request.add_generation_prompt {
        opts.add_generation_prompt = v;
    }
    if let Some(kw) = &request.chat_template_kwargs {
        check_template_kwargs(kw)?;
        opts.extra = kw.clone();
    }
    let messages = request.messages.as_deref().unwrap_or_default();
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "`messages` is empty"));
    }
    template
        .render(messages, &opts)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))
}

/// How tokens are shown besides their ids.
#[derive(Debug, Clone, Copy)]
struct Pieces {
    /// llama-server's `with_pieces`: each token an object `{id, piece}`.
    objects: bool,
    /// vLLM's `return_token_strs`: a `token_strs` list beside the ids.
    strings: bool,
}

/// One text's token ids and its length in characters.
type Tokenized = (Vec<u32>, usize);

/// The answer for each text's (ids, characters): single values, or lists for a batch.
fn tokenized(
    tok: &Tokenizer,
    answers: &[Tokenized],
    batch: bool,
    pieces: Pieces,
    max_model_len: usize,
) -> Value {
    let tokens = |ids: &[u32]| -> Value {
        if pieces.objects {
            ids.iter()
                .map(|&id| json!({"id": id, "piece": piece_value(tok, id)}))
                .collect()
        } else {
            json!(ids)
        }
    };
    let strs = |ids: &[u32]| -> Value {
        ids.iter()
            .map(|&id| Value::String(piece_text(tok, id)))
            .collect()
    };
    let one_or_all = |f: &dyn Fn(&Tokenized) -> Value| -> Value {
        if batch {
            answers.iter().map(f).collect()
        } else {
            f(&answers[0])
        }
    };
    let mut body = json!({
        "tokens": one_or_all(&|(ids, _)| tokens(ids)),
        "count": one_or_all(&|(ids, _)| json!(ids.len())),
        "char_count": one_or_all(&|(_, chars)| json!(chars)),
        "max_model_len": max_model_len,
    });
    if pieces.strings {
        body["token_strs"] = one_or_all(&|(ids, _)| strs(ids));
    }
    body
}

/// A token's text (bytes that are not UTF-8 as U+FFFD).
fn piece_text(tok: &Tokenizer, id: u32) -> String {
    String::from_utf8_lossy(tok.token_to_piece(id, true).unwrap_or_default()).into_owned()
}

/// llama-server's `piece`: the text, or the bytes as numbers where they are not UTF-8.
fn piece_value(tok: &Tokenizer, id: u32) -> Value {
    let bytes = tok.token_to_piece(id, true).unwrap_or_default();
    match std::str::from_utf8(bytes) {
        Ok(s) => json!(s),
        Err(_) => json!(bytes),
    }
}

/// The text of `tokens` (one list, or a list of lists), special tokens kept unless
/// `skip_special_tokens` (llama-server and vLLM keep them; SGLang skips them by default).
pub(crate) async fn detokenize(
    State(state): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let request: DetokenizeRequest = read_body(&state, body)?;
    check_model(&state, request.model.as_deref())?;
    let tokens = request
        .tokens
        .ok_or_else(|| ApiError::invalid("tokens", "`tokens` is required"))?;
    let skip = request.skip_special_tokens.unwrap_or(false);
    check_batch(tokens.lists.len(), "tokens")?;
    blocking(move || {
        let tok = &state.model().tokenizer;
        let vocab = tok.vocab_size();
        let texts = tokens
            .lists
            .iter()
            .map(|ids| {
                if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                    return Err(ApiError::invalid(
                        "tokens",
                        format!(
                            "token id {bad} is not in the vocabulary (0 to {})",
                            vocab - 1
                        ),
                    ));
                }
                tok.decode(ids, skip)
                    .map_err(|e| ApiError::invalid("tokens", format!("cannot detokenize: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let text = if tokens.batch {
            json!(texts)
        } else {
            json!(texts[0])
        };
        // llama-server reads `content`, vLLM `prompt`, SGLang `text`.
        Ok(Json(json!({"content": text, "prompt": text, "text": text})))
    })
    .await
}
