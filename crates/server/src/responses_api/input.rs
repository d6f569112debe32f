//! A Responses API request as the chat request it means: `instructions` and the input items
//! (messages, function calls, their outputs, reasoning) as chat messages after the stored
//! conversation of `previous_response_id`; function tools as chat's; `text.format` as
//! `response_format`; `reasoning.effort` as the template's `enable_thinking`.

use crate::error::ApiError;
use protocol::request::{
    ChatCompletionRequest, FunctionDefinition, GenerationFields, JsonSchemaFormat, ResponseFormat,
    StreamOptions, Tool, ToolChoice,
};
use protocol::responses_api::{ResponsesRequest, ResponsesTool, TextFormat};
use serde_json::{Map, Value, json};

/// The chat request, and the conversation's messages without the instructions (what a stored
/// response carries over).
pub(crate) struct ChatPlan {
    pub chat: ChatCompletionRequest,
    pub history: Vec<Value>,
}

/// Reads `r` after `previous` (the stored conversation it continues, if any).
pub(crate) fn chat_plan(r: &ResponsesRequest, previous: Vec<Value>) -> Result<ChatPlan, ApiError> {
    if r.background == Some(true) {
        return Err(ApiError::invalid(
            "background",
            "responses are not run in the background here",
        ));
    }
    if let Some(t) = r.truncation.as_deref().filter(|t| *t != "disabled") {
        return Err(ApiError::invalid(
            "truncation",
            format!(
                "`truncation` {t:?} is not supported: only \"disabled\" (a prompt over the context is an error)"
            ),
        ));
    }
    let input = r
        .input
        .as_ref()
        .ok_or_else(|| ApiError::invalid("input", "`input` is required"))?;
    let mut history = previous;
    history.extend(input_messages(input)?);
    let mut messages = Vec::with_capacity(history.len() + 1);
    if let Some(instructions) = &r.instructions {
        messages.push(json!({"role": "system", "content": instructions}));
    }
    messages.extend(history.iter().cloned());
    let tools = r.tools.as_deref().map(chat_tools).transpose()?;
    let tool_choice = r.tool_choice.as_ref().map(tool_choice).transpose()?;
    let response_format = r
        .text
        .as_ref()
        .and_then(|t| t.format.as_ref())
        .map(response_format)
        .transpose()?;
    let thinking = r.reasoning.as_ref().and_then(|c| c.effort.as_deref());
    let kwargs = thinking.map(|effort| {
        let on = effort != "none";
        Map::from_iter([("enable_thinking".to_string(), Value::Bool(on))])
    });
    let stream = r.stream;
    let chat = ChatCompletionRequest {
        generation: GenerationFields {
            max_tokens: r.max_output_tokens,
            temperature: r.temperature,
            top_p: r.top_p,
            top_k: r.top_k,
            seed: r.seed,
            stream,
            stream_options: stream.filter(|s| *s).map(|_| StreamOptions {
                include_usage: Some(true),
            }),
            response_format,
            ..GenerationFields::default()
        },
        messages: Some(messages),
        max_completion_tokens: None,
        logprobs: None,
        top_logprobs: None,
        tools,
        tool_choice,
        parallel_tool_calls: r.parallel_tool_calls,
        add_generation_prompt: None,
        chat_template_kwargs: kwargs,
        separate_reasoning: None,
    };
    Ok(ChatPlan { chat, history })
}

/// `input` as chat messages: text is one user message; items in order, a function call joining
/// the assistant message before it (or starting one), reasoning going to the next assistant
/// message.
pub(crate) fn input_messages(input: &Value) -> Result<Vec<Value>, ApiError> {
    let items = match input {
        Value::String(text) => return Ok(vec![json!({"role": "user", "content": text})]),
        Value::Array(items) => items,
        _ => {
            return Err(ApiError::invalid(
                "input",
                "`input` must be a string or a list of items",
            ));
        }
    };
    let mut out: Vec<Value> = Vec::new();
    let mut reasoning: Option<String> = None;
    for (i, item) in items.iter().enumerate() {
        let bad = |what: &str| ApiError::invalid("input", format!("`input[{i}]`: {what}"));
        let Some(item) = item.as_object() else {
            return Err(bad("an item must be an object"));
        };
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        match kind {
            "message" => {
                let role = match item.get("role").and_then(Value::as_str) {
                    Some("developer") => "system",
                    Some(r @ ("user" | "assistant" | "system")) => r,
                    _ => return Err(bad("`role` must be user, assistant, system or developer")),
                };
                let content = text_content(item.get("content")).map_err(|e| bad(&e))?;
                let mut message = json!({"role": role, "content": content});
                if role == "assistant"
                    && let Some(r) = reasoning.take()
                {
                    message["reasoning_content"] = Value::String(r);
                }
                out.push(message);
            }
            "function_call" => {
                let field = |k: &str| item.get(k).and_then(Value::as_str);
                let (Some(call_id), Some(name)) = (field("call_id"), field("name")) else {
                    return Err(bad("a function_call needs `call_id` and `name`"));
                };
                let call = json!({"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": field("arguments").unwrap_or("{}")}});
                let joins = out.last().is_some_and(|m| m["role"] == "assistant");
                if !joins {
                    out.push(json!({"role": "assistant", "content": ""}));
                }
                let last = out.last_mut().expect("an assistant message");
                if let Some(r) = reasoning.take() {
                    last["reasoning_content"] = Value::String(r);
                }
                match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                    Some(calls) => calls.push(call),
                    None => last["tool_calls"] = json!([call]),
                }
            }
            "function_call_output" => {
                let Some(call_id) = item.get("call_id").and_then(Value::as_str) else {
                    return Err(bad("a function_call_output needs `call_id`"));
                };
                let output = text_content(item.get("output")).map_err(|e| bad(&e))?;
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
            }
            "reasoning" => {
                let text = reasoning_text(item);
                reasoning = Some(match reasoning.take() {
                    Some(before) => format!("{before}\n\n{text}"),
                    None => text,
                });
            }
            other => {
                return Err(bad(&format!(
                    "items of type `{other}` are not supported (message, function_call, function_call_output, reasoning)"
                )));
            }
        }
    }
    Ok(out)
}

/// A message's content (or a tool output) as text: a string, or parts whose text is joined
/// (`input_text`, `output_text`, `refusal`); an image or a file is refused.
fn text_content(content: Option<&Value>) -> Result<String, String> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::new();
            for part in parts {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
                let field = match kind {
                    "input_text" | "output_text" | "text" => "text",
                    "refusal" => "refusal",
                    "input_image" | "input_file" | "input_audio" => {
                        return Err(format!(
                            "`{kind}` parts are not supported: the served model reads text"
                        ));
                    }
                    other => return Err(format!("unknown content part type `{other}`")),
                };
                match part.get(field).and_then(Value::as_str) {
                    Some(t) => texts.push(t),
                    None => return Err(format!("a `{kind}` part needs `{field}`")),
                }
            }
            Ok(texts.concat())
        }
        Some(_) => Err("content must be a string or a list of parts".into()),
    }
}

/// A reasoning item's text: its `content` (reasoning_text parts), else its `summary`.
fn reasoning_text(item: &Map<String, Value>) -> String {
    let texts = |key: &str| -> Vec<String> {
        item.get(key)
            .and_then(Value::as_array)
            .map(|parts| {
                parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let content = texts("content");
    if content.is_empty() {
        texts("summary").join("\n\n")
    } else {
        content.concat()
    }
}

/// Function tools as chat's (`strict` defaults to true, as OpenAI's Responses API has it);
/// built-in tools are refused.
fn chat_tools(tools: &[ResponsesTool]) -> Result<Vec<Tool>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let bad = |what: String| ApiError::invalid("tools", format!("`tools[{i}]`: {what}"));
            if t.kind != "function" {
                return Err(bad(format!(
                    "the built-in tool `{}` is not available here; give function tools",
                    t.kind
                )));
            }
            let name = t
                .name
                .clone()
                .ok_or_else(|| bad("a function needs a `name`".into()))?;
            Ok(Tool {
                kind: "function".into(),
                function: FunctionDefinition {
                    name,
                    description: t.description.clone(),
                    parameters: t.parameters.clone(),
                    strict: Some(t.strict.unwrap_or(true)),
                },
            })
        })
        .collect()
}

/// `tool_choice`: `auto`, `none`, `required`, or `{"type": "function", "name": ...}`.
fn tool_choice(v: &Value) -> Result<ToolChoice, ApiError> {
    let bad = || {
        ApiError::invalid(
            "tool_choice",
            "`tool_choice` must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}",
        )
    };
    match v {
        Value::String(s) => match s.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            _ => Err(bad()),
        },
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => o
            .get("name")
            .and_then(Value::as_str)
            .map(|n| ToolChoice::Function(n.to_string()))
            .ok_or_else(bad),
        _ => Err(bad()),
    }
}

/// `text.format` as chat's `response_format`.
fn response_format(f: &TextFormat) -> Result<ResponseFormat, ApiError> {
    let json_schema = match f.kind.as_str() {
        "text" | "json_object" => None,
        "json_schema" => Some(JsonSchemaFormat {
            name: f.name.clone(),
            description: f.description.clone(),
            schema: f.schema.clone(),
            strict: f.strict,
        }),
        other => {
            return Err(ApiError::invalid(
                "text",
                format!(
                    "`text.format.type` {other:?} is not supported: use \"text\", \"json_object\" or \"json_schema\""
                ),
            ));
        }
    };
    Ok(ResponseFormat {
        kind: f.kind.clone(),
        json_schema,
        structures: None,
        triggers: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_become_the_chat_they_mean() {
        let m = input_messages(&json!([
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Use the tool."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "It is 18 C."}]}
        ]))
        .unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(m[1], json!({"role": "user", "content": "Weather?"}));
        assert_eq!(m[2]["role"], "assistant");
        assert_eq!(m[2]["reasoning_content"], "Use the tool.");
        let calls = m[2]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1]["function"]["name"], "get_time");
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "call_1", "content": "18 C"})
        );
        assert_eq!(m[4], json!({"role": "assistant", "content": "It is 18 C."}));
        assert_eq!(
            input_messages(&json!("hi")).unwrap(),
            [json!({"role": "user", "content": "hi"})]
        );
    }

    #[test]
    fn what_cannot_be_served_is_refused_by_name() {
        let err = |input: Value| input_messages(&input).unwrap_err().message;
        assert!(
            err(json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]))
                .contains("input_image")
        );
        assert!(err(json!([{"type": "item_reference", "id": "x"}])).contains("item_reference"));
        assert!(err(json!([{"role": "tool", "content": "x"}])).contains("role"));
        assert!(err(json!(5)).contains("string or a list"));
        let tools = [ResponsesTool {
            kind: "web_search".into(),
            name: None,
            description: None,
            parameters: None,
            strict: None,
        }];
        assert!(
            chat_tools(&tools)
                .unwrap_err()
                .message
                .contains("web_search")
        );
        assert!(tool_choice(&json!({"type": "mcp"})).is_err());
        assert_eq!(
            tool_choice(&json!({"type": "function", "name": "f"})).unwrap(),
            ToolChoice::Function("f".into())
        );
    }
}
