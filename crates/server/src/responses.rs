//! OpenAI response and stream-chunk bodies, and log-probabilities in chat and completion shapes.

use crate::generate::TokenInfo;
use crate::parsers::Output;
use model::tokenizer::Tokenizer;
use protocol::{
    AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionChunk, ChunkChoice, Completion,
    CompletionChoice, Delta, FunctionCall, ToolCall, Usage,
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

/// One choice's whole output.
#[derive(Debug, Default)]
pub struct ChoiceResult {
    pub content: String,
    pub reasoning: String,
    pub tool_calls: Vec<ToolCall>,
    pub finish: Option<&'static str>,
    /// The stop string that ended it, if one did.
    pub stop_sequence: Option<String>,
    pub tokens: Vec<TokenInfo>,
}

impl ChoiceResult {
    pub fn add(&mut self, piece: Output) {
        match piece {
            Output::Content(c) => self.content.push_str(&c),
            Output::Reasoning(r) => self.reasoning.push_str(&r),
            Output::ToolCall { id, name, .. } => self.tool_calls.push(ToolCall {
                id,
                kind: "function".into(),
                function: FunctionCall {
                    name,
                    arguments: String::new(),
                },
            }),
            Output::ToolArguments { index, fragment } => {
                if let Some(call) = self.tool_calls.get_mut(index) {
                    call.function.arguments.push_str(&fragment);
                }
            }
            Output::MalformedToolCall => {}
        }
    }

    /// The assistant message: `content` is `null` when the message is only tool calls.
    fn message(self) -> AssistantMessage {
        let calls = !self.tool_calls.is_empty();
        AssistantMessage {
            role: "assistant".into(),
            content: (!calls || !self.content.trim().is_empty()).then_some(self.content),
            reasoning_content: (!self.reasoning.is_empty()).then_some(self.reasoning),
            tool_calls: calls.then_some(self.tool_calls),
        }
    }
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
                finish_reason: c.finish.map(str::to_string),
                logprobs: logprobs.then(|| json!({"content": chat_logprobs(tok, &c.tokens)})),
                message: c.message(),
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
                text: c.content,
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
