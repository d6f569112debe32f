//! The tool side of a chat request: `tools`, `tool_choice` and `parallel_tool_calls` checked with
//! OpenAI's rules, and the conversation adapted to what the model's chat template can show.
//!
//! A template that takes `tools` gets them (in llama.cpp's shape). One that cannot show them
//! (SmolLM2's, for one) gets them described in the system message instead, with the call syntax
//! of the server's tool-call format. Likewise the history: assistant `tool_calls` a template
//! cannot show are written into the message's text in the same syntax, and `tool` results it
//! cannot show become user messages in `<tool_response>` tags. `tool_choice` `required` or a
//! named function is kept by ending the prompt with the opening of a call, and the rest of the
//! call is generated under a grammar: an offered function's name and arguments valid under its
//! parameter schema, then the call's closing markup. Under `auto`, a function with `"strict":
//! true` puts the whole answer under a grammar too: text that the parser will not read as a
//! call, or calls (after text, each opened by the format's marker) valid for their function.

use crate::error::ApiError;
use crate::parsers::ToolFormat;
use grammar::{BareCalls, CallShape, GrammarSpec, OptionalCalls};
use model::chat_template::TemplateCaps;
pub use protocol::request::ToolChoice;
use protocol::request::{ChatCompletionRequest, Tool};
use serde_json::{Value, json};

/// A request's tools.
#[derive(Debug, Clone)]
pub struct ToolRequest {
    /// The request's `tools`, checked.
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default true): false allows one call.
    pub parallel: bool,
}

impl ToolRequest {
    pub fn parse(r: &ChatCompletionRequest) -> Result<Self, ApiError> {
        let tools = r.tools.clone().unwrap_or_default();
        for (i, t) in tools.iter().enumerate() {
            check_tool(i, t)?;
        }
        let names: Vec<&str> = tools.iter().map(tool_name).collect();
        if let Some(dup) = names
            .iter()
            .enumerate()
            .find_map(|(i, n)| names[..i].contains(n).then_some(n))
        {
            return Err(ApiError::invalid(
                "tools",
                format!("the function name `{dup}` is in `tools` twice"),
            ));
        }
        let choice = match &r.tool_choice {
            None if tools.is_empty() => ToolChoice::None,
            None => ToolChoice::Auto,
            Some(ToolChoice::Function(name)) if !names.contains(&name.as_str()) => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("`tool_choice` names `{name}`, which is not in `tools`"),
                ));
            }
            Some(choice) => choice.clone(),
        };
        if tools.is_empty() && choice == ToolChoice::Required {
            return Err(ApiError::invalid(
                "tool_choice",
                "`tool_choice` is `required` but the request has no `tools`",
            ));
        }
        Ok(Self {
            tools,
            choice,
            parallel: r.parallel_tool_calls.unwrap_or(true),
        })
    }

    /// The functions offered.
    pub fn names(&self) -> Vec<String> {
        self.tools
            .iter()
            .map(|t| tool_name(t).to_string())
            .collect()
    }

    /// The answer's grammar, for a server that parses calls in `parser`'s format (one whose
    /// arguments are JSON): with `required` or a named function, what follows the forced
    /// opening (`format.forced_opening`) up to the end of the call; under `auto` with a strict
    /// function, text (or the `answer` JSON) or calls each valid for its function; otherwise
    /// `answer`.
    pub fn grammar(
        &self,
        parser: Option<ToolFormat>,
        answer: Option<GrammarSpec>,
    ) -> Result<Option<GrammarSpec>, ApiError> {
        let Some((format, after)) = parser.and_then(|f| Some((f, f.call_closing()?))) else {
            return Ok(answer);
        };
        if let Some(forced) = self.forced() {
            let opening = format.forced_opening(forced);
            let calls = self.shapes(format, &opening, forced, &after);
            return Ok(Some(GrammarSpec::ToolCall(calls)));
        }
        let strict = |t: &Tool| t.function.strict == Some(true);
        if self.choice != ToolChoice::Auto || !self.tools.iter().any(strict) {
            return Ok(answer);
        }
        let answer = match answer {
            None => None,
            Some(GrammarSpec::JsonSchema(schema)) => Some(schema),
            Some(GrammarSpec::JsonObject) => Some(json!({"type": "object"})),
            Some(_) => {
                return Err(ApiError::invalid(
                    "tools",
                    "strict tools under `tool_choice` auto go with a JSON `response_format`, not with `regex`, `ebnf` or `structural_tag`",
                ));
            }
        };
        let trigger = format.call_trigger();
        Ok(Some(GrammarSpec::OptionalToolCalls(OptionalCalls {
            trigger: trigger.map(str::to_string),
            calls: trigger
                .map(|t| self.shapes(format, t, None, &after))
                .unwrap_or_default(),
            bare: format.bare_call().map(|(key, separator)| BareCalls {
                key: key.into(),
                separator: separator.map(str::to_string),
                functions: self
                    .tools
                    .iter()
                    .map(|t| (tool_name(t).to_string(), parameters(t)))
                    .collect(),
            }),
            parallel: self.parallel,
            answer,
        })))
    }

    /// Each function's call (only `forced`'s when it names one) after `opening`, then `after`.
    fn shapes(
        &self,
        format: ToolFormat,
        opening: &str,
        forced: Option<&str>,
        after: &str,
    ) -> Vec<CallShape> {
        self.tools
            .iter()
            .map(|t| (tool_name(t), t))
            .filter(|(name, _)| forced.is_none_or(|f| f == *name))
            .map(|(name, tool)| {
                let full = format.forced_opening(Some(name));
                CallShape {
                    before: full.strip_prefix(opening).unwrap_or(&full).to_string(),
                    parameters: parameters(tool),
                    after: after.to_string(),
                }
            })
            .collect()
    }

    /// Whether the model is offered tools (and its output parsed for calls).
    pub fn offered(&self) -> bool {
        !self.tools.is_empty() && self.choice != ToolChoice::None
    }

    /// With `required` or a named function: the call the prompt opens (`Some(None)`: any
    /// function).
    pub fn forced(&self) -> Option<Option<&str>> {
        match &self.choice {
            ToolChoice::Required => Some(None),
            ToolChoice::Function(name) => Some(Some(name)),
            ToolChoice::None | ToolChoice::Auto => None,
        }
    }

    /// Adapts `messages` to the template (see the module docs) and returns the tools to hand
    /// it, if it takes them. `format` writes calls for templates that cannot show them.
    pub fn adapt(
        &self,
        messages: &mut Vec<Value>,
        caps: &TemplateCaps,
        format: ToolFormat,
    ) -> Option<Value> {
        if !caps.supports_tool_calls {
            for m in messages.iter_mut() {
                write_calls_into_content(m, format);
            }
        }
        if !caps.supports_tool_responses {
            for m in messages.iter_mut() {
                if m.get("role").and_then(Value::as_str) == Some("tool") {
                    let text = text_of(m.get("content"));
                    *m = json!({"role": "user", "content": format!("<tool_response>\n{text}\n</tool_response>")});
                }
            }
        }
        if !self.offered() {
            return None;
        }
        if caps.supports_tools {
            return Some(json!(self.tools));
        }
        let prompt = self.system_prompt(format);
        let role = |m: &Value| m.get("role").and_then(Value::as_str).map(str::to_string);
        match messages.first_mut() {
            Some(first) if matches!(role(first).as_deref(), Some("system" | "developer")) => {
                let text = text_of(first.get("content"));
                first["content"] = Value::String(format!("{text}\n\n{prompt}"));
            }
            _ => messages.insert(0, json!({"role": "system", "content": prompt})),
        }
        None
    }

    /// The tools described for a template that cannot take them.
    fn system_prompt(&self, format: ToolFormat) -> String {
        let listed: Vec<String> = self
            .tools
            .iter()
            .map(|t| json!(t.function).to_string())
            .collect();
        let example = format.write_calls(&[("function_name", &json!({"argument_name": "value"}))]);
        let rule = match &self.choice {
            ToolChoice::Required => "You must call at least one tool now.".to_string(),
            ToolChoice::Function(name) => format!("Call the tool `{name}` now."),
            _ => "Call a tool only when it helps to answer.".to_string(),
        };
        let one = if self.parallel {
            ""
        } else {
            " Call one tool at a time."
        };
        format!(
            "# Tools\n\nYou can call these tools (functions), each described by a JSON object:\n{}\n\nTo call a tool, write the call exactly in this form:\n{example}\n\n{rule}{one} A tool's result comes back to you in a message from the tool.",
            listed.join("\n")
        )
    }
}

/// OpenAI's rule for the history: a `tool` message answers a call, so it names the call's id.
pub fn check_history(messages: &[Value]) -> Result<(), ApiError> {
    for (i, m) in messages.iter().enumerate() {
        if m.get("role").and_then(Value::as_str) == Some("tool")
            && !m.get("tool_call_id").is_some_and(Value::is_string)
        {
            return Err(ApiError::invalid(
                "messages",
                format!("`messages[{i}]` has role `tool` but no `tool_call_id` string"),
            ));
        }
    }
    Ok(())
}

/// OpenAI's rule for function names.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn tool_name(tool: &Tool) -> &str {
    &tool.function.name
}

/// A function's parameter schema (any object when it has none).
/// The arguments' schema the grammar holds them to; a strict function's objects are closed
/// (OpenAI's strict mode).
fn parameters(tool: &Tool) -> Value {
    let mut schema = tool
        .function
        .parameters
        .clone()
        .map(Value::Object)
        .unwrap_or_else(|| json!({"type": "object"}));
    if tool.function.strict == Some(true) {
        grammar::close_objects(&mut schema);
    }
    schema
}

/// OpenAI's rules for a tool the JSON shape of which is right.
fn check_tool(i: usize, tool: &Tool) -> Result<(), ApiError> {
    let bad = |what: &str| ApiError::invalid("tools", format!("`tools[{i}]`: {what}"));
    if tool.kind != "function" {
        return Err(bad("`type` must be `function`"));
    }
    let name = tool_name(tool);
    if !valid_name(name) {
        return Err(bad(&format!(
            "the name `{name}` must be 1 to 64 letters, digits, `_` or `-`"
        )));
    }
    Ok(())
}

/// A message's text (string content, or its text parts a line each).
fn text_of(content: Option<&Value>) -> String {
    protocol::content_text(content, "\n")
}

/// An assistant message's `tool_calls` written after its text, the way the model writes them.
/// Calls that are not well formed are left for the template's validation to report.
fn write_calls_into_content(message: &mut Value, format: ToolFormat) {
    let Some(list) = message.get("tool_calls").and_then(Value::as_array) else {
        return;
    };
    let calls: Option<Vec<(String, Value)>> = list
        .iter()
        .map(|c| {
            let f = c.get("function")?;
            let name = f.get("name")?.as_str()?.to_string();
            let args = match f.get("arguments")? {
                Value::String(s) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
                other => other.clone(),
            };
            Some((name, args))
        })
        .collect();
    let Some(calls) = calls.filter(|c| !c.is_empty()) else {
        return;
    };
    let refs: Vec<(&str, &Value)> = calls.iter().map(|(n, a)| (n.as_str(), a)).collect();
    let text = text_of(message.get("content"));
    let written = format.write_calls(&refs);
    message["content"] = Value::String(if text.is_empty() {
        written
    } else {
        format!("{text}\n{written}")
    });
    if let Some(m) = message.as_object_mut() {
        m.remove("tool_calls");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(json: Value) -> Result<ToolRequest, ApiError> {
        ToolRequest::parse(&protocol::request::parse(json).map_err(ApiError::field)?)
    }

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "description": "Weather.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
    }

    #[test]
    fn tool_choice_forms_and_their_errors() {
        let r = request(json!({"tools": [weather()]})).unwrap();
        assert_eq!(
            (r.choice.clone(), r.parallel, r.offered()),
            (ToolChoice::Auto, true, true)
        );
        assert_eq!(r.forced(), None);
        let r = request(json!({"tools": [weather()], "tool_choice": "none"})).unwrap();
        assert!(!r.offered());
        let r = request(
            json!({"tools": [weather()], "tool_choice": "required", "parallel_tool_calls": false}),
        )
        .unwrap();
        assert_eq!((r.forced(), r.parallel), (Some(None), false));
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let r = request(json!({"tools": [weather()], "tool_choice": named})).unwrap();
        assert_eq!(r.forced(), Some(Some("get_weather")));
        assert!(!request(json!({})).unwrap().offered());
        for (body, param) in [
            (json!({"tools": {}}), "tools"),
            (json!({"tools": [{"type": "function"}]}), "tools"),
            (
                json!({"tools": [{"type": "code", "function": {"name": "x"}}]}),
                "tools",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a", "parameters": 3}}]}),
                "tools",
            ),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (
                json!({"tools": [weather()], "tool_choice": "always"}),
                "tool_choice",
            ),
            (
                json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "other"}}}),
                "tool_choice",
            ),
            (
                json!({"tools": [weather()], "tool_choice": 1}),
                "tool_choice",
            ),
            (
                json!({"tools": [weather()], "parallel_tool_calls": "no"}),
                "parallel_tool_calls",
            ),
        ] {
            let e = request(body.clone()).unwrap_err();
            assert_eq!(
                (e.status.as_u16(), e.param.as_deref()),
                (400, Some(param)),
                "{body}"
            );
        }
    }

    #[test]
    fn strict_functions_under_auto_put_the_answer_under_a_grammar_of_text_or_calls() {
        let strict = json!({"type": "function", "function": {"name": "get_time", "strict": true}});
        let answer = || Some(GrammarSpec::JsonObject);
        // Without a strict function, or without a parser, the answer keeps its own format.
        let plain = request(json!({"tools": [weather()]})).unwrap();
        assert_eq!(
            plain.grammar(Some(ToolFormat::Hermes), answer()),
            Ok(answer())
        );
        let r = request(json!({"tools": [weather(), strict]})).unwrap();
        assert_eq!(r.grammar(None, None), Ok(None));
        assert_eq!(r.grammar(Some(ToolFormat::Pythonic), None), Ok(None));
        let Ok(Some(GrammarSpec::OptionalToolCalls(g))) =
            r.grammar(Some(ToolFormat::Hermes), answer())
        else {
            panic!("no grammar of optional calls");
        };
        assert_eq!(g.trigger.as_deref(), Some("<tool_call>"));
        assert_eq!(g.answer, Some(json!({"type": "object"})));
        let names: Vec<&str> = g.calls.iter().map(|c| c.before.as_str()).collect();
        assert_eq!(
            names,
            [
                "\n{\"name\": \"get_weather\", \"arguments\": ",
                "\n{\"name\": \"get_time\", \"arguments\": "
            ]
        );
        // A strict function's objects are closed (OpenAI's strict mode); the others are not.
        assert_eq!(
            g.calls[1].parameters,
            json!({"type": "object", "additionalProperties": false})
        );
        assert!(g.calls[0].parameters.get("additionalProperties").is_none());
        assert_eq!(g.bare.map(|b| b.functions.len()), Some(2));
        let e = r
            .grammar(
                Some(ToolFormat::Hermes),
                Some(GrammarSpec::Regex("a".into())),
            )
            .unwrap_err();
        assert_eq!(
            (e.status.as_u16(), e.param.as_deref()),
            (400, Some("tools"))
        );
        let bad = json!({"type": "function", "function": {"name": "f", "strict": "yes"}});
        assert!(request(json!({"tools": [bad]})).is_err());
    }

    #[test]
    fn tool_results_name_their_call() {
        let ok = [json!({"role": "tool", "tool_call_id": "call_1", "content": "1"})];
        assert!(check_history(&ok).is_ok());
        let e = check_history(&[
            json!({"role": "user", "content": "x"}),
            json!({"role": "tool", "content": "1"}),
        ])
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert!(e.message.contains("messages[1]"), "{}", e.message);
    }

    fn caps(tools: bool) -> TemplateCaps {
        TemplateCaps {
            supports_string_content: true,
            supports_typed_content: false,
            supports_system_role: true,
            supports_tools: tools,
            supports_tool_calls: tools,
            supports_tool_responses: tools,
            requires_object_arguments: false,
        }
    }

    #[test]
    fn a_template_without_tools_gets_them_in_the_system_message_and_calls_as_text() {
        let r = request(json!({"tools": [weather()]})).unwrap();
        let history = vec![
            json!({"role": "user", "content": "Weather in Paris?"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}),
            json!({"role": "tool", "tool_call_id": "call_1", "content": "22 C"}),
        ];
        let mut m = history.clone();
        assert_eq!(r.adapt(&mut m, &caps(false), ToolFormat::Hermes), None);
        assert_eq!(m.len(), 4);
        let system = m[0]["content"].as_str().unwrap();
        assert!(
            system.contains(r#"{"name":"get_weather","description":"Weather.""#),
            "{system}"
        );
        assert!(
            system.contains("<tool_call>\n{\"name\":\"function_name\""),
            "{system}"
        );
        assert_eq!(
            m[2],
            json!({"role": "assistant", "content": "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>"})
        );
        assert_eq!(
            m[3],
            json!({"role": "user", "content": "<tool_response>\n22 C\n</tool_response>"})
        );
        // A system message of the request's own keeps its text first.
        let mut m = vec![
            json!({"role": "system", "content": "Be brief."}),
            history[0].clone(),
        ];
        r.adapt(&mut m, &caps(false), ToolFormat::Pythonic);
        let system = m[0]["content"].as_str().unwrap();
        assert!(
            system.starts_with("Be brief.\n\n# Tools")
                && system.contains("[function_name(argument_name=\"value\")]"),
            "{system}"
        );
        // Calls that are not well formed stay for the template's validation to name.
        let broken = vec![json!({"role": "assistant", "tool_calls": [{"type": "function"}]})];
        let mut m = broken.clone();
        request(json!({}))
            .unwrap()
            .adapt(&mut m, &caps(false), ToolFormat::Hermes);
        assert_eq!(m, broken);
        // A template that takes tools gets them and the history as it is.
        let mut m = history.clone();
        assert_eq!(
            r.adapt(&mut m, &caps(true), ToolFormat::Hermes),
            Some(json!([weather()]))
        );
        assert_eq!(m, history);
    }
}
