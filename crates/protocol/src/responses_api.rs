//! OpenAI's Responses API request (`POST /v1/responses`), read as strictly as the other routes'
//! (a field it does not know is refused by name). `input` stays JSON: its items (messages,
//! function calls and their outputs, reasoning) are read by the server, which knows what each
//! becomes in the chat it runs.

use crate::request::{FieldError, FromBody};
use serde::Deserialize;
use serde_json::{Map, Value};

/// `POST /v1/responses`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    /// Text (one user message) or a list of items.
    pub input: Option<Value>,
    /// A system message before the input (not carried over by `previous_response_id`).
    pub instructions: Option<String>,
    pub tools: Option<Vec<ResponsesTool>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub text: Option<TextConfig>,
    pub max_output_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Sampling fields vLLM's Responses route also reads.
    pub top_k: Option<i64>,
    pub seed: Option<i64>,
    pub stream: Option<bool>,
    /// Whether the response is kept for `previous_response_id` and `GET` (default true).
    pub store: Option<bool>,
    pub previous_response_id: Option<String>,
    pub reasoning: Option<ReasoningConfig>,
    pub metadata: Option<Map<String, Value>>,
    pub truncation: Option<String>,
    /// Extra output to include: accepted and not used (nothing here is encrypted or searched).
    pub include: Option<Vec<String>>,
    /// Accepted and not used.
    pub user: Option<String>,
    pub service_tier: Option<String>,
    pub prompt_cache_key: Option<String>,
    pub safety_identifier: Option<String>,
    pub stream_options: Option<Map<String, Value>>,
    /// Refused when true: responses are not run in the background.
    pub background: Option<bool>,
}

impl FromBody for ResponsesRequest {
    fn from_body(body: Value) -> Result<Self, FieldError> {
        crate::request::read(body)
    }
}

/// A tool: a function (`name`, `description`, `parameters`, `strict`, default true as OpenAI's
/// Responses API has it), or one of OpenAI's built-in tools (refused by the server: its other
/// fields are not read).
#[derive(Debug, Clone, Deserialize)]
pub struct ResponsesTool {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: Option<String>,
    pub description: Option<String>,
    pub parameters: Option<Map<String, Value>>,
    pub strict: Option<bool>,
}

/// `text`: the answer's format, and `verbosity` (accepted and not used).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextConfig {
    pub format: Option<TextFormat>,
    pub verbosity: Option<String>,
}

/// `text.format`: `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema",
/// "name", "schema", "strict", "description"}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextFormat {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: Option<String>,
    pub schema: Option<Value>,
    pub strict: Option<bool>,
    pub description: Option<String>,
}

/// `reasoning`: `effort` (`none` turns the template's thinking off, any other on) and `summary`
/// (accepted and not used: the reasoning comes back whole).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReasoningConfig {
    pub effort: Option<String>,
    pub summary: Option<String>,
    pub generate_summary: Option<String>,
}
