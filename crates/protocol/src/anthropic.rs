//! Anthropic's Messages API on the wire (`POST /v1/messages`, `/v1/messages/count_tokens`): the
//! request, read as strictly as the OpenAI routes' (a field or block type it does not know is
//! refused by name), and the response. The stream's events are written by the server.

use crate::request::{FieldError, FromBody};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `POST /v1/messages` (and `count_tokens`, which has no `max_tokens`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessagesRequest {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub messages: Option<Vec<InputMessage>>,
    pub system: Option<SystemPrompt>,
    pub stop_sequences: Option<Vec<String>>,
    pub stream: Option<bool>,
    /// The sampling fields the API had before (and older clients and llama-server's send).
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub tools: Option<Vec<ToolDefinition>>,
    pub tool_choice: Option<ToolChoice>,
    pub thinking: Option<Thinking>,
    /// `format`: structured outputs (a JSON schema); `effort` is accepted and not used.
    pub output_config: Option<OutputConfig>,
    /// Prompt caching's marker: accepted, as the prefix cache keeps every prefix anyway.
    pub cache_control: Option<Value>,
    /// `user_id`: accepted (a router may send it) and not used.
    pub metadata: Option<Map<String, Value>>,
    /// Accepted and not used: one server has one tier.
    pub service_tier: Option<String>,
}

/// `output_config`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputConfig {
    pub effort: Option<String>,
    pub format: Option<OutputFormat>,
}

/// `output_config.format`: `{"type": "json_schema", "schema": {...}}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputFormat {
    JsonSchema(JsonOutputFormat),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonOutputFormat {
    pub schema: Value,
}

impl FromBody for MessagesRequest {
    fn from_body(body: Value) -> Result<Self, FieldError> {
        crate::request::read(body)
    }
}

/// `system`: text, or text blocks.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "Value")]
pub enum SystemPrompt {
    Text(String),
    /// Text blocks (another kind is the server's to refuse).
    Blocks(Vec<ContentBlock>),
}

impl TryFrom<Value> for SystemPrompt {
    type Error = String;

    fn try_from(v: Value) -> Result<Self, String> {
        match v {
            Value::String(s) => Ok(Self::Text(s)),
            v @ Value::Array(_) => serde_json::from_value(v)
                .map(Self::Blocks)
                .map_err(|e| format!("a system text block: {e}")),
            _ => Err("expected a string or a list of text blocks".into()),
        }
    }
}

/// One turn of the conversation.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputMessage {
    pub role: String,
    pub content: Content,
}

/// A turn's content: text, or blocks.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "Value")]
pub enum Content {
    Text(String),
    Blocks(Vec<ContentBlock>),
}

impl TryFrom<Value> for Content {
    type Error = String;

    fn try_from(v: Value) -> Result<Self, String> {
        match v {
            Value::String(s) => Ok(Self::Text(s)),
            v @ Value::Array(_) => serde_json::from_value(v)
                .map(Self::Blocks)
                .map_err(|e| format!("a content block: {e}")),
            _ => Err("expected a string or a list of content blocks".into()),
        }
    }
}

/// A block of a turn, by its `type`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text(TextBlock),
    Image(MediaBlock),
    Document(MediaBlock),
    ToolUse(ToolUseBlock),
    ToolResult(ToolResultBlock),
    Thinking(ThinkingBlock),
    RedactedThinking(RedactedThinkingBlock),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextBlock {
    pub text: String,
    /// Prompt caching's marker: accepted, as the prefix cache keeps every prefix anyway.
    pub cache_control: Option<Value>,
    pub citations: Option<Value>,
}

/// An image or a document: refused (the served model reads text), but named in the error.
#[derive(Debug, Clone, Deserialize)]
pub struct MediaBlock {
    pub source: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolUseBlock {
    pub id: String,
    pub name: String,
    pub input: Value,
    pub cache_control: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolResultBlock {
    pub tool_use_id: String,
    pub content: Option<Content>,
    pub is_error: Option<bool>,
    pub cache_control: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThinkingBlock {
    pub thinking: String,
    pub signature: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedactedThinkingBlock {
    pub data: String,
}

/// A tool: a client tool has a `name`, a `description` and an `input_schema`; Anthropic's own
/// server tools carry a dated `type` (`web_search_20250305`) and are refused by the server.
#[derive(Debug, Clone, Deserialize)]
pub struct ToolDefinition {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub description: Option<String>,
    pub input_schema: Option<Map<String, Value>>,
    pub cache_control: Option<Value>,
}

/// `tool_choice`, by its `type`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolChoice {
    Auto(Parallel),
    Any(Parallel),
    Tool(NamedTool),
    None(NoFields),
}

/// A variant that has only its `type`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoFields {}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parallel {
    pub disable_parallel_tool_use: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedTool {
    pub name: String,
    pub disable_parallel_tool_use: Option<bool>,
}

/// `thinking`: extended thinking on (with a budget), off, or as the model decides.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Thinking {
    Enabled(ThinkingBudget),
    Disabled(NoFields),
    Adaptive(ThinkingDisplay),
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThinkingBudget {
    pub budget_tokens: Option<i64>,
    pub display: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThinkingDisplay {
    pub display: Option<String>,
}

/// The response to `POST /v1/messages`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageResponse {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub role: String,
    pub model: String,
    pub content: Vec<OutputBlock>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use`.
    pub stop_reason: Option<String>,
    pub stop_sequence: Option<String>,
    pub usage: MessageUsage,
}

/// A block of the answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputBlock {
    Thinking {
        thinking: String,
        signature: String,
    },
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

/// Anthropic's usage: `input_tokens` are the prompt's tokens the prefix cache did not hold,
/// `cache_read_input_tokens` those it did (nothing is ever written to a cache for a price, so
/// `cache_creation_input_tokens` is 0).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct MessageUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub cache_read_input_tokens: u64,
}

impl From<crate::Usage> for MessageUsage {
    fn from(u: crate::Usage) -> Self {
        let cached = u.prompt_tokens_details.map_or(0, |d| d.cached_tokens);
        Self {
            input_tokens: u.prompt_tokens.saturating_sub(cached),
            output_tokens: u.completion_tokens,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: cached,
        }
    }
}
