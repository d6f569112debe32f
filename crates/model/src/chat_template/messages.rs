//! Chat messages as llama.cpp hands them to a template: checked, rebuilt in its own shape
//! (`common_chat_msgs_parse_oaicompat` then `common_chat_msg::to_json_oaicompat`), and adapted to
//! what the template can take (string or typed content, a system role or not).

use super::ChatTemplateError;
use serde_json::{Map, Value as Json, json};

fn invalid(msg: impl Into<String>) -> ChatTemplateError {
    ChatTemplateError::InvalidMessages(msg.into())
}

/// One message after parsing: the fields llama.cpp keeps.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
    /// Text parts (`{"type": "text", "text": …}`); never set together with `content`.
    pub parts: Vec<String>,
    pub reasoning_content: Option<String>,
    pub name: Option<String>,
    pub tool_call_id: Option<String>,
    pub tool_calls: Vec<Json>,
}

impl Message {
    /// The message as template input: `content` a string, or a list of parts when it has them.
    pub fn to_json(&self) -> Json {
        let mut m = Map::new();
        m.insert("role".into(), Json::String(self.role.clone()));
        let content = if !self.content.is_empty() || self.parts.is_empty() {
            Json::String(self.content.clone())
        } else {
            Json::Array(
                self.parts
                    .iter()
                    .map(|t| json!({"type": "text", "text": t}))
                    .collect(),
            )
        };
        m.insert("content".into(), content);
        let mut opt = |k: &str, v: &Option<String>| {
            if let Some(v) = v.as_ref().filter(|v| !v.is_empty()) {
                m.insert(k.into(), Json::String(v.clone()));
            }
        };
        opt("reasoning_content", &self.reasoning_content);
        opt("name", &self.name);
        opt("tool_call_id", &self.tool_call_id);
        if !self.tool_calls.is_empty() {
            m.insert("tool_calls".into(), Json::Array(self.tool_calls.clone()));
        }
        Json::Object(m)
    }

    /// The text a continued (prefilled) assistant message contributes: its content, or its text
    /// parts joined by a blank line (`common_chat_msg::render_content`).
    pub fn render_content(&self) -> String {
        if self.content.is_empty() {
            self.parts.join("\n\n")
        } else {
            self.content.clone()
        }
    }
}

/// Checks and parses OpenAI-style messages the way llama-server does.
pub fn parse(messages: &[Json]) -> Result<Vec<Message>, ChatTemplateError> {
    messages.iter().map(parse_one).collect()
}

fn opt_string(msg: &Map<String, Json>, key: &str) -> Result<Option<String>, ChatTemplateError> {
    match msg.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(invalid(format!("'{key}' must be a string, got {other}"))),
    }
}

fn parse_one(message: &Json) -> Result<Message, ChatTemplateError> {
    let msg = message
        .as_object()
        .ok_or_else(|| invalid(format!("Expected 'message' to be an object, got {message}")))?;
    let role = match msg.get("role") {
        Some(Json::String(r)) => r.clone(),
        Some(other) => return Err(invalid(format!("'role' must be a string, got {other}"))),
        None => return Err(invalid(format!("Missing 'role' in message: {message}"))),
    };
    let has_content = msg.contains_key("content");
    let has_tool_calls = msg.contains_key("tool_calls");
    if role != "assistant" && !has_content {
        return Err(invalid("All non-assistant messages must contain 'content'"));
    }
    if !has_content && !has_tool_calls {
        return Err(invalid(
            "Assistant message must contain either 'content' or 'tool_calls'!",
        ));
    }
    let mut out = Message {
        role,
        content: String::new(),
        parts: Vec::new(),
        reasoning_content: opt_string(msg, "reasoning_content")?,
        name: opt_string(msg, "name")?,
        tool_call_id: opt_string(msg, "tool_call_id")?,
        tool_calls: Vec::new(),
    };
    match msg.get("content") {
        None | Some(Json::Null) => {}
        Some(Json::String(s)) => out.content = s.clone(),
        Some(Json::Array(parts)) => {
            for part in parts {
                let kind = part
                    .get("type")
                    .ok_or_else(|| invalid(format!("Missing content part type: {part}")))?;
                if kind != "text" {
                    return Err(invalid(format!("Unsupported content part type: {kind}")));
                }
                match part.get("text") {
                    Some(Json::String(t)) => out.parts.push(t.clone()),
                    _ => {
                        return Err(invalid(format!(
                            "Content part without a 'text' string: {part}"
                        )));
                    }
                }
            }
        }
        Some(other) => {
            return Err(invalid(format!(
                "Invalid 'content' type: expected string or array, got {other}"
            )));
        }
    }
    if let Some(calls) = msg.get("tool_calls") {
        let calls = calls
            .as_array()
            .ok_or_else(|| invalid("'tool_calls' must be an array"))?;
        out.tool_calls = calls.iter().map(tool_call).collect::<Result<_, _>>()?;
    }
    Ok(out)
}

/// A tool call in llama.cpp's shape: `{"type": "function", "function": {"name", "arguments"}}`
/// with the arguments as a JSON string, and the id when there is one.
fn tool_call(call: &Json) -> Result<Json, ChatTemplateError> {
    if call.get("type").and_then(Json::as_str) != Some("function") {
        return Err(invalid(format!("Unsupported tool call type: {call}")));
    }
    let f = call
        .get("function")
        .ok_or_else(|| invalid(format!("Missing tool call function: {call}")))?;
    let name = f
        .get("name")
        .and_then(Json::as_str)
        .ok_or_else(|| invalid(format!("Missing tool call name: {call}")))?;
    let arguments = match f.get("arguments") {
        Some(Json::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => return Err(invalid(format!("Missing tool call arguments: {call}"))),
    };
    let mut tc = json!({"type": "function", "function": {"name": name, "arguments": arguments}});
    if let Some(id) = call
        .get("id")
        .and_then(Json::as_str)
        .filter(|s| !s.is_empty())
    {
        tc["id"] = Json::String(id.to_string());
    }
    Ok(tc)
}

/// Tools in llama.cpp's shape (`common_chat_tools_parse_oaicompat`, then back to JSON):
/// `{"type": "function", "function": {"name", "description", "parameters"}}`, with an empty
/// description and `{}` parameters where they are missing. `None` for no tools.
pub fn normalize_tools(tools: &Json) -> Result<Option<Json>, ChatTemplateError> {
    let list = match tools {
        Json::Null => return Ok(None),
        Json::Array(a) => a,
        other => {
            return Err(invalid(format!(
                "Expected 'tools' to be an array, got {other}"
            )));
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for tool in list {
        match tool.get("type") {
            None => return Err(invalid(format!("Missing tool type: {tool}"))),
            Some(t) if t != "function" => {
                return Err(invalid(format!("Unsupported tool type: {tool}")));
            }
            Some(_) => {}
        }
        let f = tool
            .get("function")
            .ok_or_else(|| invalid(format!("Missing tool function: {tool}")))?;
        let name = f
            .get("name")
            .and_then(Json::as_str)
            .ok_or_else(|| invalid(format!("Missing tool name: {tool}")))?;
        let description = f
            .get("description")
            .and_then(Json::as_str)
            .unwrap_or_default();
        let parameters = f.get("parameters").cloned().unwrap_or_else(|| json!({}));
        out.push(json!({
            "type": "function",
            "function": {"name": name, "description": description, "parameters": parameters},
        }));
    }
    Ok((!out.is_empty()).then_some(Json::Array(out)))
}

/// What a template accepts, found by rendering probes (see `ChatTemplate::caps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateCaps {
    pub supports_string_content: bool,
    pub supports_typed_content: bool,
    pub supports_system_role: bool,
    /// The template shows the `tools` it is given.
    pub supports_tools: bool,
    /// It shows an assistant message's `tool_calls`.
    pub supports_tool_calls: bool,
    /// It shows `tool` messages (tool results).
    pub supports_tool_responses: bool,
    /// It writes a call's `arguments` as JSON itself (`| tojson`), so they must reach it as an
    /// object, not as the JSON text OpenAI sends.
    pub requires_object_arguments: bool,
}

/// Tool calls' `arguments` as objects, for templates that serialise them (llama.cpp does the
/// same); arguments that are not JSON stay as they are.
pub fn object_arguments(messages: &mut [Json]) {
    let calls = messages
        .iter_mut()
        .filter_map(|m| m.get_mut("tool_calls").and_then(Json::as_array_mut))
        .flatten();
    for call in calls {
        if let Some(args) = call.pointer_mut("/function/arguments")
            && let Some(parsed) = args.as_str().and_then(|s| serde_json::from_str(s).ok())
        {
            *args = parsed;
        }
    }
}

/// llama.cpp's `messages_inp_normalizer`: a template that takes only strings gets text parts
/// joined by newlines, one that takes only parts gets strings wrapped as a text part.
pub fn normalize_content(messages: &mut [Json], caps: &TemplateCaps) {
    let only_string = caps.supports_string_content && !caps.supports_typed_content;
    let only_typed = !caps.supports_string_content && caps.supports_typed_content;
    for m in messages {
        let Some(content) = m.get_mut("content") else {
            continue;
        };
        match content {
            Json::String(s) if only_typed => {
                *content = json!([{"type": "text", "text": s}]);
            }
            Json::Array(parts) if only_string => {
                let texts: Vec<&str> = parts
                    .iter()
                    .filter(|p| p.get("type").and_then(Json::as_str) == Some("text"))
                    .map(|p| p.get("text").and_then(Json::as_str).unwrap_or_default())
                    .collect();
                *content = Json::String(texts.join("\n"));
            }
            _ => {}
        }
    }
}

/// llama.cpp's workarounds, in its order: `developer` becomes `system` (except for gpt-oss
/// templates, which know `<|channel|>`), and a leading system message merges into the next one
/// when the template has no system role.
pub fn apply_workarounds(
    messages: &mut Vec<Json>,
    source: &str,
    caps: &TemplateCaps,
) -> Result<(), ChatTemplateError> {
    if !source.contains("<|channel|>") {
        for m in messages.iter_mut() {
            if m.get("role").and_then(Json::as_str) == Some("developer") {
                m["role"] = Json::String("system".into());
            }
        }
    }
    if !caps.supports_system_role
        && messages
            .first()
            .and_then(|m| m.get("role"))
            .and_then(Json::as_str)
            == Some("system")
    {
        let system = messages.remove(0);
        if let Some(next) = messages.first_mut() {
            let text = |m: &Json| -> Result<String, ChatTemplateError> {
                m.get("content")
                    .and_then(Json::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| {
                        invalid("cannot merge a system message whose content is not a string")
                    })
            };
            next["content"] = Json::String(format!("{}\n{}", text(&system)?, text(next)?));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rebuilds_like_llama_cpp() {
        let msgs = parse(&[
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "extra": 1}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"type": "function", "id": "c1", "function": {"name": "f", "arguments": {"x": 1}}}]}),
            json!({"role": "tool", "content": "42", "tool_call_id": "c1"}),
        ])
        .unwrap();
        assert_eq!(
            msgs[0].to_json(),
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
        );
        assert_eq!(msgs[0].render_content(), "a\n\nb");
        assert_eq!(
            msgs[1].to_json(),
            json!({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}, "id": "c1"}]})
        );
        assert_eq!(
            msgs[2].to_json(),
            json!({"role": "tool", "content": "42", "tool_call_id": "c1"})
        );
    }

    #[test]
    fn bad_messages_are_named() {
        let err = |m: Json| parse(&[m]).unwrap_err().to_string();
        assert!(err(json!("hi")).contains("object"));
        assert!(err(json!({"content": "x"})).contains("Missing 'role'"));
        assert!(err(json!({"role": "user"})).contains("must contain 'content'"));
        assert!(err(json!({"role": "assistant"})).contains("either 'content' or 'tool_calls'"));
        assert!(err(json!({"role": "user", "content": 3})).contains("Invalid 'content' type"));
        assert!(
            err(json!({"role": "user", "content": [{"type": "image_url"}]}))
                .contains("Unsupported content part type")
        );
    }

    #[test]
    fn content_and_system_workarounds() {
        let caps = TemplateCaps {
            supports_string_content: true,
            supports_typed_content: false,
            supports_system_role: false,
            supports_tools: false,
            supports_tool_calls: false,
            supports_tool_responses: false,
            requires_object_arguments: false,
        };
        let mut m = vec![
            json!({"role": "developer", "content": "sys"}),
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
        ];
        normalize_content(&mut m, &caps);
        apply_workarounds(&mut m, "", &caps).unwrap();
        assert_eq!(m, vec![json!({"role": "user", "content": "sys\na\nb"})]);
    }
}
