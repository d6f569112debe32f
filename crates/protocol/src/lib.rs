//! OpenAI wire types, shared by the server, the benchmark client and the mock server: the
//! generating routes' typed requests (`request`), Anthropic's Messages API (`anthropic`),
//! embeddings (`embeddings`), the Responses API's request (`responses_api`), and chat messages,
//! responses and stream chunks, usage, models and the error body.
//!
//! Only serde types live here (no I/O). Clients write requests as JSON, their messages as
//! [`ChatMessage`], which keeps its other fields (`tool_calls`, `name`, ...) in `extra`.

pub mod anthropic;
pub mod embeddings;
pub mod request;
pub mod responses_api;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A chat message. `content` stays a JSON value: OpenAI allows a string or an array of parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Value>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ChatMessage {
    /// A message of `role` with plain text content.
    pub fn new(role: &str, text: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: Some(Value::String(text.into())),
            extra: Map::new(),
        }
    }

    pub fn user(text: impl Into<String>) -> Self {
        Self::new("user", text)
    }

    pub fn system(text: impl Into<String>) -> Self {
        Self::new("system", text)
    }

    /// The text of the message: the string content, or its text parts joined.
    pub fn text(&self) -> String {
        content_text(self.content.as_ref(), "")
    }
}

/// A message's `content` as text: the string, or its text parts joined by `separator`.
pub fn content_text(content: Option<&Value>, separator: &str) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(separator),
        _ => String::new(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    #[serde(default)]
    pub cached_tokens: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    /// Speculative decoding (SGLang's extension): tokens emitted per verification pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_accept_length: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Delta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// A function call the model made: `arguments` is a JSON object as text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// A tool call of an assistant message (`type` is `function`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FunctionCallDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// A streamed piece of tool call `index`: its first delta has the id, type and name, later ones
/// argument text to append.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionCallDelta>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub finish_reason: Option<String>,
    /// Log-probabilities when asked for (`null` otherwise, as OpenAI sends it).
    #[serde(default)]
    pub logprobs: Option<Value>,
}

/// One `data:` event of a streamed chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    pub role: String,
    /// `null` when the message holds only tool calls.
    pub content: Option<String>,
    /// The thought, with a reasoning parser on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub finish_reason: Option<String>,
    /// Log-probabilities when asked for (`null` otherwise, as OpenAI sends it).
    #[serde(default)]
    pub logprobs: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Option<Usage>,
}

/// A choice of a legacy completion, streamed or not (the shape is the same).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub finish_reason: Option<String>,
    /// Log-probabilities when asked for (`null` otherwise, as OpenAI sends it).
    #[serde(default)]
    pub logprobs: Option<Value>,
}

/// A legacy completion response, or one streamed chunk of it (`object` says which).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub owned_by: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
    pub object: String,
    pub data: Vec<ModelCard>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub param: Option<String>,
    #[serde(default)]
    pub code: Option<Value>,
}

/// The OpenAI error envelope: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorResponse {
    pub error: ErrorBody,
}

impl ErrorResponse {
    pub fn new(message: impl Into<String>, kind: impl Into<String>, code: u16) -> Self {
        Self {
            error: ErrorBody {
                message: message.into(),
                kind: kind.into(),
                param: None,
                code: Some(Value::from(code)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_text_joins_parts() {
        let msg: ChatMessage = serde_json::from_str(
            r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}"#,
        )
        .unwrap();
        assert_eq!(msg.text(), "ab");
    }

    #[test]
    fn error_envelope_shape() {
        let v =
            serde_json::to_value(ErrorResponse::new("bad", "invalid_request_error", 400)).unwrap();
        assert_eq!(v["error"]["message"], "bad");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], 400);
    }
}
