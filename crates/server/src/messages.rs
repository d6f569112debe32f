//! Anthropic's Messages API: `POST /v1/messages` (whole, or streamed as Anthropic's named
//! events) and `POST /v1/messages/count_tokens`. A request is turned into the chat request it
//! means (`system` and the turns into chat messages, tool_use and tool_result blocks into tool
//! calls and tool messages, `thinking` into the template's `enable_thinking`), run as chat
//! completions are, and its output shaped back into content blocks: thinking (from the
//! reasoning parser), text and tool_use (from the tool-call parser). Errors have Anthropic's
//! shape (`{"type": "error", "error": {"type": "invalid_request_error", ...}}`).

use crate::Shared;
use crate::chat::{ChatRun, PreparedChat};
use crate::error::ApiError;
use crate::generate::TokenInfo;
use crate::parsers::Output;
use crate::request::{check_model, read_body};
use crate::respond::{Finish, SseChunk, StreamFormat, random_id, respond};
use crate::response_format::Compiled;
use crate::responses::ChoiceResult;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use protocol::anthropic::{
    Content, ContentBlock, InputMessage, MessageResponse, MessageUsage, MessagesRequest,
    OutputBlock, OutputFormat, SystemPrompt, Thinking, ToolChoice, ToolDefinition,
};
use protocol::request::{
    self as openai, ChatCompletionRequest, FunctionDefinition, GenerationFields, JsonSchemaFormat,
    ResponseFormat, Stop, StreamOptions, Tool,
};
use serde_json::{Map, Value, json};
use std::time::Instant;

/// An [`ApiError`] in Anthropic's shape.
pub(crate) struct AnthropicError(ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

/// Anthropic's error `type` for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        408 | 504 => "timeout_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

fn error_body(e: &ApiError) -> Value {
    let message = match &e.param {
        Some(p) if !e.message.contains(p.as_str()) => format!("{p}: {}", e.message),
        _ => e.message.clone(),
    };
    json!({"type": "error", "error": {"type": error_type(e.status), "message": message}})
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let mut response = (self.0.status, axum::Json(error_body(&self.0))).into_response();
        if let Some(secs) = self.0.retry_after {
            let value = axum::http::HeaderValue::from(secs);
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, value);
        }
        response
    }
}

pub(crate) async fn messages(
    State(state): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AnthropicError> {
    let started = Instant::now();
    let request: MessagesRequest = read_body(&state, body)?;
    check_model(&state, request.model.as_deref())?;
    if request.max_tokens.is_none() {
        return Err(ApiError::invalid("max_tokens", "`max_tokens` is required").into());
    }
    let chat = chat_request(request)?;
    let run = ChatRun::start(&state, chat, started).await?;
    let id = format!("msg_{}", random_id());
    let format = MessagesStream {
        message: MessageStart {
            id: id.clone(),
            model: state.served_model_name.clone(),
            prompt_tokens: run.prompt_tokens,
        },
        open: None,
        blocks: 0,
        finish: None,
    };
    let model = state.served_model_name.clone();
    let response = respond(run.generation, &run.params, format, |mut results, usage| {
        message_response(id, model, results.swap_remove(0), usage)
    })
    .await?;
    Ok(Compiled::mark(&run.unenforced, response))
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as `/v1/messages` would render them.
pub(crate) async fn count_tokens(
    State(state): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AnthropicError> {
    let request: MessagesRequest = read_body(&state, body)?;
    check_model(&state, request.model.as_deref())?;
    if request.stream.is_some() {
        return Err(ApiError::invalid("stream", "`count_tokens` does not stream").into());
    }
    let prepared = PreparedChat::new(&state, chat_request(request)?).await?;
    Ok(axum::Json(json!({"input_tokens": prepared.prompt.len()})).into_response())
}

/// The chat request a Messages request means.
fn chat_request(r: MessagesRequest) -> Result<ChatCompletionRequest, ApiError> {
    let mut messages = Vec::new();
    if let Some(system) = r.system {
        let text = match system {
            SystemPrompt::Text(t) => t,
            SystemPrompt::Blocks(blocks) => {
                let mut texts = Vec::new();
                for block in blocks {
                    match block {
                        ContentBlock::Text(t) => texts.push(t.text),
                        other => {
                            return Err(ApiError::invalid(
                                "system",
                                format!(
                                    "`system` takes text blocks, not a {} block",
                                    block_name(&other)
                                ),
                            ));
                        }
                    }
                }
                join(texts.into_iter())
            }
        };
        messages.push(json!({"role": "system", "content": text}));
    }
    let turns = r
        .messages
        .ok_or_else(|| ApiError::invalid("messages", "`messages` is required"))?;
    for (i, turn) in turns.into_iter().enumerate() {
        chat_messages(i, turn, &mut messages)?;
    }
    let (tool_choice, parallel) = match r.tool_choice {
        None => (None, None),
        Some(choice) => tool_choice(choice),
    };
    let tools = r.tools.map(chat_tools).transpose()?;
    // Adaptive thinking is the template's default.
    let kwargs = r.thinking.and_then(|t| {
        let on = match t {
            Thinking::Enabled(_) => true,
            Thinking::Disabled(_) => false,
            Thinking::Adaptive(_) => return None,
        };
        Some(Map::from_iter([(
            "enable_thinking".to_string(),
            Value::Bool(on),
        )]))
    });
    let response_format = r.output_config.and_then(|c| c.format).map(response_format);
    Ok(ChatCompletionRequest {
        generation: GenerationFields {
            max_tokens: r.max_tokens,
            temperature: r.temperature,
            top_p: r.top_p,
            top_k: r.top_k,
            stop: r.stop_sequences.map(Stop),
            stream: r.stream,
            response_format,
            stream_options: r.stream.filter(|s| *s).map(|_| StreamOptions {
                include_usage: Some(true),
            }),
            ..GenerationFields::default()
        },
        messages: Some(messages),
        max_completion_tokens: None,
        logprobs: None,
        top_logprobs: None,
        tools,
        tool_choice,
        parallel_tool_calls: parallel,
        add_generation_prompt: None,
        chat_template_kwargs: kwargs,
        separate_reasoning: None,
    })
}

/// `output_config.format` as chat's `response_format`: Anthropic's structured outputs hold the
/// answer to the schema exactly (OpenAI's strict).
fn response_format(format: OutputFormat) -> ResponseFormat {
    match format {
        OutputFormat::JsonSchema(f) => ResponseFormat {
            kind: "json_schema".into(),
            json_schema: Some(JsonSchemaFormat {
                name: None,
                description: None,
                schema: Some(f.schema),
                strict: Some(true),
            }),
            structures: None,
            triggers: None,
        },
    }
}

/// Texts as one, a blank line between them.
fn join(texts: impl Iterator<Item = String>) -> String {
    texts.collect::<Vec<_>>().join("\n\n")
}

/// Turn `i` as chat messages: a user turn's tool results become tool messages (before its
/// text), an assistant turn's tool_use blocks its tool calls and its thinking its
/// `reasoning_content`.
fn chat_messages(i: usize, turn: InputMessage, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let bad = |what: String| ApiError::invalid("messages", format!("`messages[{i}]`: {what}"));
    let role = turn.role.as_str();
    if role != "user" && role != "assistant" {
        return Err(bad(format!(
            "`role` must be `user` or `assistant`, not `{role}` (the system prompt is the `system` field)"
        )));
    }
    let blocks = match turn.content {
        Content::Text(text) => {
            out.push(json!({"role": role, "content": text}));
            return Ok(());
        }
        Content::Blocks(blocks) => blocks,
    };
    let (mut texts, mut thinking, mut calls) = (Vec::new(), Vec::new(), Vec::new());
    for block in blocks {
        match (role, block) {
            (_, ContentBlock::Text(t)) => texts.push(t.text),
            (_, ContentBlock::Image(_) | ContentBlock::Document(_)) => {
                return Err(bad(
                    "image and document blocks are not supported: the served model reads text"
                        .into(),
                ));
            }
            ("user", ContentBlock::ToolResult(r)) => {
                let mut text = match r.content {
                    None => String::new(),
                    Some(Content::Text(t)) => t,
                    Some(Content::Blocks(blocks)) => {
                        join(blocks.into_iter().filter_map(|b| match b {
                            ContentBlock::Text(t) => Some(t.text),
                            _ => None,
                        }))
                    }
                };
                if r.is_error == Some(true) {
                    text = format!("Error: {text}");
                }
                out.push(json!({"role": "tool", "tool_call_id": r.tool_use_id, "content": text}));
            }
            ("assistant", ContentBlock::ToolUse(u)) => calls.push(json!({
                "id": u.id,
                "type": "function",
                "function": {"name": u.name, "arguments": u.input.to_string()},
            })),
            ("assistant", ContentBlock::Thinking(t)) => thinking.push(t.thinking),
            ("assistant", ContentBlock::RedactedThinking(_)) => {}
            (_, other) => {
                return Err(bad(format!(
                    "a {} block cannot be in a `{role}` turn",
                    block_name(&other)
                )));
            }
        }
    }
    if role == "user" && texts.is_empty() {
        return Ok(());
    }
    let mut message = json!({"role": role, "content": join(texts.into_iter())});
    if !thinking.is_empty() {
        message["reasoning_content"] = Value::String(join(thinking.into_iter()));
    }
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    out.push(message);
    Ok(())
}

fn block_name(block: &ContentBlock) -> &'static str {
    match block {
        ContentBlock::Text(_) => "text",
        ContentBlock::Image(_) => "image",
        ContentBlock::Document(_) => "document",
        ContentBlock::ToolUse(_) => "tool_use",
        ContentBlock::ToolResult(_) => "tool_result",
        ContentBlock::Thinking(_) => "thinking",
        ContentBlock::RedactedThinking(_) => "redacted_thinking",
    }
}

/// Client tools as chat functions; Anthropic's server tools are refused.
fn chat_tools(tools: Vec<ToolDefinition>) -> Result<Vec<Tool>, ApiError> {
    tools
        .into_iter()
        .enumerate()
        .map(|(i, t)| match t.kind.as_deref() {
            None | Some("custom") => Ok(Tool {
                kind: "function".into(),
                function: FunctionDefinition {
                    name: t.name,
                    description: t.description,
                    parameters: t.input_schema,
                    strict: None,
                },
            }),
            Some(kind) => Err(ApiError::invalid(
                "tools",
                format!("`tools[{i}]`: the server tool `{kind}` is not available here; give client tools (name, description, input_schema)"),
            )),
        })
        .collect()
}

/// `tool_choice` as chat's, and `parallel_tool_calls`.
fn tool_choice(choice: ToolChoice) -> (Option<openai::ToolChoice>, Option<bool>) {
    let parallel = |disable: Option<bool>| disable.map(|d| !d);
    match choice {
        ToolChoice::Auto(p) => (
            Some(openai::ToolChoice::Auto),
            parallel(p.disable_parallel_tool_use),
        ),
        ToolChoice::Any(p) => (
            Some(openai::ToolChoice::Required),
            parallel(p.disable_parallel_tool_use),
        ),
        ToolChoice::Tool(t) => (
            Some(openai::ToolChoice::Function(t.name)),
            parallel(t.disable_parallel_tool_use),
        ),
        ToolChoice::None(_) => (Some(openai::ToolChoice::None), None),
    }
}

/// Anthropic's `stop_reason` for a finish.
fn stop_reason(finish: Finish) -> &'static str {
    match finish.reason {
        "length" => "max_tokens",
        "tool_calls" => "tool_use",
        _ if finish.stop_sequence.is_some() => "stop_sequence",
        _ => "end_turn",
    }
}

/// A tool call's arguments as the `input` object (text that is not JSON stays text).
fn tool_input(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_string()))
}

fn message_response(
    id: String,
    model: String,
    result: ChoiceResult,
    usage: protocol::Usage,
) -> MessageResponse {
    let mut content = Vec::new();
    if !result.reasoning.is_empty() {
        content.push(OutputBlock::Thinking {
            thinking: result.reasoning,
            signature: String::new(),
        });
    }
    if !result.content.is_empty() || result.tool_calls.is_empty() {
        content.push(OutputBlock::Text {
            text: result.content,
        });
    }
    content.extend(result.tool_calls.into_iter().map(|c| OutputBlock::ToolUse {
        input: tool_input(&c.function.arguments),
        id: c.id,
        name: c.function.name,
    }));
    let finish = Finish {
        reason: result.finish.unwrap_or("stop"),
        stop_sequence: result.stop_sequence.as_deref(),
    };
    MessageResponse {
        id,
        kind: "message".into(),
        role: "assistant".into(),
        model,
        content,
        stop_reason: Some(stop_reason(finish).into()),
        stop_sequence: result.stop_sequence,
        usage: usage.into(),
    }
}

/// What `message_start` says of the message.
struct MessageStart {
    id: String,
    model: String,
    prompt_tokens: usize,
}

/// The kind of content block open in a stream.
#[derive(Clone, Copy, PartialEq)]
enum Open {
    Thinking,
    Text,
    ToolUse,
}

/// A stream of Anthropic's events: `message_start`, then per block `content_block_start`,
/// its deltas and `content_block_stop`, then `message_delta` (the stop reason and usage) and
/// `message_stop`.
struct MessagesStream {
    message: MessageStart,
    open: Option<Open>,
    /// Blocks started so far (the next block's index).
    blocks: usize,
    finish: Option<(&'static str, Option<String>)>,
}

impl MessagesStream {
    /// The events that make `kind` the open block (closing the one before).
    fn open(&mut self, kind: Open, block: Value, out: &mut Vec<SseChunk>) {
        if self.open == Some(kind) && kind != Open::ToolUse {
            return;
        }
        self.close(out);
        let index = self.blocks;
        self.blocks += 1;
        self.open = Some(kind);
        out.push(SseChunk::named(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
    }

    fn close(&mut self, out: &mut Vec<SseChunk>) {
        if self.open.take().is_some() {
            let index = self.blocks - 1;
            out.push(SseChunk::named(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }

    fn delta(&self, delta: Value) -> SseChunk {
        let index = self.blocks - 1;
        SseChunk::named(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    }
}

impl StreamFormat for MessagesStream {
    const USAGE_ALWAYS: bool = true;

    fn opening(&mut self, _choices: usize) -> Vec<SseChunk> {
        let m = &self.message;
        let message = json!({
            "id": m.id, "type": "message", "role": "assistant", "model": m.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": m.prompt_tokens, "output_tokens": 0},
        });
        vec![
            SseChunk::named(
                "message_start",
                &json!({"type": "message_start", "message": message}),
            ),
            SseChunk::named("ping", &json!({"type": "ping"})),
        ]
    }

    fn output(&mut self, _: usize, pieces: Vec<Output>, _: &[TokenInfo]) -> Vec<SseChunk> {
        let mut out = Vec::new();
        for piece in pieces {
            match piece {
                Output::Reasoning(r) if !r.is_empty() => {
                    let block = json!({"type": "thinking", "thinking": "", "signature": ""});
                    self.open(Open::Thinking, block, &mut out);
                    out.push(self.delta(json!({"type": "thinking_delta", "thinking": r})));
                }
                Output::Content(c) if !c.is_empty() => {
                    self.open(Open::Text, json!({"type": "text", "text": ""}), &mut out);
                    out.push(self.delta(json!({"type": "text_delta", "text": c})));
                }
                Output::ToolCall { id, name, .. } => {
                    let block = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
                    self.open(Open::ToolUse, block, &mut out);
                }
                Output::ToolArguments { fragment, .. } if self.open == Some(Open::ToolUse) => {
                    let delta = json!({"type": "input_json_delta", "partial_json": fragment});
                    out.push(self.delta(delta));
                }
                _ => {}
            }
        }
        out
    }

    fn done(&mut self, _: usize, finish: Finish) -> Vec<SseChunk> {
        let mut out = Vec::new();
        if self.blocks == 0 {
            // An empty answer is still one (empty) text block, as the whole response has.
            self.open(Open::Text, json!({"type": "text", "text": ""}), &mut out);
        }
        self.close(&mut out);
        self.finish = Some((
            stop_reason(finish),
            finish.stop_sequence.map(str::to_string),
        ));
        out
    }

    fn usage(&mut self, usage: protocol::Usage) -> Vec<SseChunk> {
        let (reason, sequence) = self.finish.take().unwrap_or(("end_turn", None));
        let usage = MessageUsage::from(usage);
        vec![
            SseChunk::named(
                "message_delta",
                &json!({
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": usage,
                }),
            ),
            SseChunk::named("message_stop", &json!({"type": "message_stop"})),
        ]
    }

    fn error(&self, e: &ApiError) -> SseChunk {
        SseChunk::named("error", &error_body(e))
    }

    fn end(&self) -> Option<SseChunk> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Result<ChatCompletionRequest, ApiError> {
        let r: MessagesRequest = openai::parse(body).map_err(ApiError::field)?;
        chat_request(r)
    }

    #[test]
    fn a_conversation_with_tools_becomes_the_chat_it_means() {
        let r = chat(json!({
            "model": "m", "max_tokens": 64,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Call the tool.", "signature": "s"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 C"}]},
                    {"type": "text", "text": "Thanks."}]}
            ],
            "tools": [{"name": "get_weather", "description": "Weather.", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "stop_sequences": ["END"], "top_k": 5
        }))
        .unwrap();
        let m = r.messages.unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(
            m[1],
            json!({"role": "user", "content": "Weather in Paris?"})
        );
        assert_eq!(m[2]["reasoning_content"], "Call the tool.");
        assert_eq!(m[2]["content"], "Let me look.");
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"],
            r#"{"city":"Paris"}"#
        );
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"})
        );
        assert_eq!(m[4], json!({"role": "user", "content": "Thanks."}));
        assert_eq!(r.tool_choice, Some(openai::ToolChoice::Required));
        assert_eq!(r.parallel_tool_calls, Some(false));
        assert_eq!(r.tools.unwrap()[0].function.name, "get_weather");
        assert_eq!(r.chat_template_kwargs.unwrap()["enable_thinking"], true);
        assert_eq!(r.generation.stop, Some(Stop(vec!["END".into()])));
        assert_eq!(r.generation.top_k, Some(5));
    }

    #[test]
    fn what_the_server_cannot_do_is_refused_by_name() {
        let err = |body: Value| chat(body).err().map(|e| e.message).unwrap_or_default();
        let turn = |content: Value| json!({"max_tokens": 8, "messages": [{"role": "user", "content": content}]});
        let image = json!([{"type": "image", "source": {"type": "base64", "data": ""}}]);
        assert!(err(turn(image)).contains("image"));
        assert!(err(turn(json!([{"type": "video"}]))).contains("unknown variant `video`"));
        assert!(err(turn(json!([{"type": "text", "text": "a", "x": 1}]))).contains("`x`"));
        let server_tool = json!({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "web_search_20250305", "name": "web_search"}]});
        assert!(err(server_tool).contains("web_search_20250305"));
        let system_turn =
            json!({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]});
        assert!(err(system_turn).contains("`system` field"));
        let unknown = json!({"max_tokens": 8, "messages": [], "n": 2});
        assert!(err(unknown).contains("`n`"));
        let misplaced = turn(json!([{"type": "tool_use", "id": "a", "name": "f", "input": {}}]));
        assert!(err(misplaced).contains("tool_use block cannot be in a `user` turn"));
    }

    #[test]
    fn finishes_and_errors_read_as_anthropic_writes_them() {
        let f = |reason, stop_sequence| {
            stop_reason(Finish {
                reason,
                stop_sequence,
            })
        };
        assert_eq!(f("stop", None), "end_turn");
        assert_eq!(f("stop", Some("END")), "stop_sequence");
        assert_eq!(f("length", None), "max_tokens");
        assert_eq!(f("tool_calls", None), "tool_use");
        let e = error_body(&ApiError::invalid("max_tokens", "`max_tokens` is required"));
        assert_eq!(e["type"], "error");
        assert_eq!(e["error"]["type"], "invalid_request_error");
        assert_eq!(
            error_type(StatusCode::SERVICE_UNAVAILABLE),
            "overloaded_error"
        );
    }
}
