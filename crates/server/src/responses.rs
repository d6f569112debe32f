//! OpenAI response and stream-chunk bodies, and log-probabilities in chat and completion shapes.

use crate::generate::TokenInfo;
use model::tokenizer::Tokenizer;
use protocol::{
    AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionChunk, ChunkChoice, Completion,
    CompletionChoice, Delta, Usage,
};
use serde_json::{Value, json};

pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn piece(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.token_to_piece(id, true).unwrap_or_default().to_vec();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Chat's `logprobs.content` entries.
pub fn chat_logprobs(tok: &Tokenizer, tokens: &[TokenInfo]) -> Vec<Value> {
    tokens
        .iter()
        .map(|t| {
            let (text, bytes) = piece(tok, t.id);
            let top: Vec<Value> = t
                .top
                .iter()
                .map(|&(id, lp)| {
                    let (text, bytes) = piece(tok, id);
                    json!({"token": text, "logprob": lp, "bytes": bytes})
                })
                .collect();
            json!({"token": text, "logprob": t.logprob, "bytes": bytes, "top_logprobs": top})
        })
        .collect()
}

/// Completions' `logprobs` object (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).
pub fn completion_logprobs(tok: &Tokenizer, tokens: &[TokenInfo], offset: usize) -> Value {
    let mut texts = Vec::new();
    let mut lps = Vec::new();
    let mut tops = Vec::new();
    let mut offsets = Vec::new();
    let mut at = offset;
    for t in tokens {
        let (text, _) = piece(tok, t.id);
        offsets.push(at);
        at += text.len();
        texts.push(text);
        lps.push(t.logprob);
        let top: serde_json::Map<String, Value> = t
            .top
            .iter()
            .map(|&(id, lp)| (piece(tok, id).0, json!(lp)))
            .collect();
        tops.push(Value::Object(top));
    }
    json!({"tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

pub struct ChoiceResult {
    pub text: String,
    pub finish: Option<&'static str>,
    pub tokens: Vec<TokenInfo>,
}

pub fn chat_completion(
    id: &str,
    model: &str,
    tok: &Tokenizer,
    choices: Vec<ChoiceResult>,
    usage: Usage,
    logprobs: bool,
) -> ChatCompletion {
    ChatCompletion {
        id: id.to_string(),
        object: "chat.completion".into(),
        created: now_secs(),
        model: model.to_string(),
        choices: choices
            .into_iter()
            .enumerate()
            .map(|(i, c)| ChatChoice {
                index: i as u32,
                message: AssistantMessage {
                    role: "assistant".into(),
                    content: Some(c.text),
                },
                finish_reason: c.finish.map(str::to_string),
                logprobs: logprobs.then(|| json!({"content": chat_logprobs(tok, &c.tokens)})),
            })
            .collect(),
        usage: Some(usage),
    }
}

pub fn completion(
    id: &str,
    model: &str,
    tok: &Tokenizer,
    choices: Vec<ChoiceResult>,
    usage: Usage,
    logprobs: bool,
) -> Completion {
    Completion {
        id: id.to_string(),
        object: "text_completion".into(),
        created: now_secs(),
        model: model.to_string(),
        choices: choices
            .into_iter()
            .enumerate()
            .map(|(i, c)| CompletionChoice {
                index: i as u32,
                logprobs: logprobs.then(|| completion_logprobs(tok, &c.tokens, 0)),
                text: c.text,
                finish_reason: c.finish.map(str::to_string),
            })
            .collect(),
        usage: Some(usage),
    }
}

/// One streamed chat chunk for choice `index`.
pub fn chat_chunk(
    id: &str,
    model: &str,
    index: usize,
    delta: Delta,
    finish: Option<&str>,
    logprobs: Option<Value>,
) -> ChatCompletionChunk {
    ChatCompletionChunk {
        id: id.to_string(),
        object: "chat.completion.chunk".into(),
        created: now_secs(),
        model: model.to_string(),
        choices: vec![ChunkChoice {
            index: index as u32,
            delta,
            finish_reason: finish.map(str::to_string),
            logprobs,
        }],
        usage: None,
    }
}

/// One streamed completion chunk for choice `index`.
pub fn completion_chunk(
    id: &str,
    model: &str,
    index: usize,
    text: String,
    finish: Option<&str>,
    logprobs: Option<Value>,
) -> Completion {
    Completion {
        id: id.to_string(),
        object: "text_completion".into(),
        created: now_secs(),
        model: model.to_string(),
        choices: vec![CompletionChoice {
            index: index as u32,
            text,
            finish_reason: finish.map(str::to_string),
            logprobs,
        }],
        usage: None,
    }
}
