//! Every top-level field a generating route knows, and what becomes of it: read (the fields of
//! its typed request, `protocol::request`), rewritten into the field it is an alias of (vLLM's
//! `guided_*`, OpenAI's legacy `functions` / `function_call`), accepted as bookkeeping that does
//! not change the output (`user`, `metadata`, ...), or refused with a 400 naming it. Nothing a
//! client sends is dropped unseen: a field in none of these lists is a 400 too.

use crate::error::ApiError;
use protocol::request::{ChatCompletionRequest, CompletionRequest, GenerationFields, field_names};
use serde_json::{Map, Value, json};

/// Which route's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    Chat,
    Completions,
}

impl Route {
    /// The fields the route reads: both routes' and its own, as its typed request declares them.
    pub(crate) fn reads(self, field: &str) -> bool {
        let own = match self {
            Route::Chat => field_names::<ChatCompletionRequest>(),
            Route::Completions => field_names::<CompletionRequest>(),
        };
        field_names::<GenerationFields>().contains(&field) || own.contains(&field)
    }
}

/// Accepted, and without effect on what is generated: identifiers and bookkeeping a client or
/// proxy attaches (OpenAI's `user`, `metadata`, `store` — nothing is stored here, so nothing
/// can be retrieved either — `service_tier`, `prompt_cache_key`, `safety_identifier`).
const BOOKKEEPING: &[&str] = &[
    "user",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
];

/// Known fields this server does not implement, and why (the 400's message).
const REFUSED: &[(&str, &str)] = &[
    (
        "chat_template",
        "the server renders every chat with the model's own template",
    ),
    (
        "reasoning_effort",
        "use `chat_template_kwargs.enable_thinking` for models that think",
    ),
    ("prediction", "predicted outputs are not implemented"),
    ("audio", "this server generates text only"),
    ("web_search_options", "this server has no web search"),
    ("min_tokens", "a minimum output length is not implemented"),
    (
        "guided_decoding_backend",
        "grammars are always compiled by llguidance",
    ),
];

/// Keys the chat template sets itself: `chat_template_kwargs` may not replace them (the
/// request's validated `messages` and `tools` would be replaced by unvalidated ones).
const RESERVED_TEMPLATE_KEYS: &[&str] = &[
    "messages",
    "tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// Rewrites aliases into the fields they stand for, then refuses any field the route does not
/// read (naming it).
pub(crate) fn normalise(body: &mut Map<String, Value>, route: Route) -> Result<(), ApiError> {
    guided_aliases(body)?;
    if route == Route::Chat {
        legacy_functions(body)?;
    }
    for (key, value) in body.iter() {
        let k = key.as_str();
        if route.reads(k) || BOOKKEEPING.contains(&k) {
            continue;
        }
        // `modalities: ["text"]` asks for what is generated anyway.
        if k == "modalities" && *value == json!(["text"]) {
            continue;
        }
        if value.is_null() {
            continue;
        }
        let why = REFUSED
            .iter()
            .find(|(name, _)| *name == k)
            .map(|(_, why)| *why)
            .unwrap_or(match route {
                Route::Chat => "it is not a field of /v1/chat/completions here",
                Route::Completions => "it is not a field of /v1/completions here",
            });
        return Err(ApiError::invalid(
            k,
            format!("`{k}` is not supported: {why}"),
        ));
    }
    match body.get("chat_template_kwargs") {
        Some(Value::Object(kw)) => check_template_kwargs(kw),
        _ => Ok(()),
    }
}

/// `chat_template_kwargs` may not replace what the server sets itself.
pub(crate) fn check_template_kwargs(kw: &Map<String, Value>) -> Result<(), ApiError> {
    match RESERVED_TEMPLATE_KEYS.iter().find(|k| kw.contains_key(**k)) {
        Some(k) => Err(ApiError::invalid(
            "chat_template_kwargs",
            format!("`chat_template_kwargs.{k}` is set by the server and cannot be replaced"),
        )),
        None => Ok(()),
    }
}

/// Moves `alias` to `to` (converted by `convert`); both given is a 400.
fn alias(
    map: &mut Map<String, Value>,
    from: &str,
    to: &str,
    convert: impl FnOnce(Value) -> Result<Value, ApiError>,
) -> Result<(), ApiError> {
    let Some(value) = map.remove(from).filter(|v| !v.is_null()) else {
        return Ok(());
    };
    if map.get(to).is_some_and(|v| !v.is_null()) {
        return Err(ApiError::invalid(
            from,
            format!("give `{from}` or `{to}`, not both"),
        ));
    }
    map.insert(to.to_string(), convert(value)?);
    Ok(())
}

/// vLLM's guided decoding fields as the structured-output fields: `guided_json` (a schema, or
/// its JSON text) is `response_format` json_schema, `guided_regex` is `regex`, `guided_choice`
/// (a list of strings) a regex of exactly those strings, `guided_grammar` is `ebnf`.
fn guided_aliases(map: &mut Map<String, Value>) -> Result<(), ApiError> {
    let given: Vec<&str> = [
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
    ]
    .into_iter()
    .filter(|k| map.get(*k).is_some_and(|v| !v.is_null()))
    .collect();
    if given.len() > 1 {
        return Err(ApiError::invalid(
            given[1],
            format!("give one of {} at most", given.join(", ")),
        ));
    }
    alias(map, "guided_json", "response_format", |v| {
        let schema = match v {
            Value::String(text) => serde_json::from_str(&text).map_err(|e| {
                ApiError::invalid("guided_json", format!("`guided_json` is not JSON: {e}"))
            })?,
            v => v,
        };
        if !schema.is_object() {
            return Err(ApiError::invalid(
                "guided_json",
                "`guided_json` must be a JSON Schema object",
            ));
        }
        Ok(json!({"type": "json_schema", "json_schema": {"name": "guided_json", "schema": schema}}))
    })?;
    alias(map, "guided_regex", "regex", Ok)?;
    alias(map, "guided_grammar", "ebnf", Ok)?;
    alias(map, "guided_choice", "regex", |v| {
        let choices: Option<Vec<String>> = v.as_array().and_then(|a| {
            a.iter()
                .map(|c| c.as_str().map(regex_literal))
                .collect::<Option<_>>()
        });
        match choices {
            Some(c) if !c.is_empty() => Ok(Value::String(format!("({})", c.join("|")))),
            _ => Err(ApiError::invalid(
                "guided_choice",
                "`guided_choice` must be a non-empty list of strings",
            )),
        }
    })
}

/// `text` as a regex that matches exactly it.
fn regex_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$/#&-~\"".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// OpenAI's legacy `functions` (a list of function definitions) and `function_call` (`"none"`,
/// `"auto"` or `{"name": ...}`) as `tools` and `tool_choice`.
fn legacy_functions(map: &mut Map<String, Value>) -> Result<(), ApiError> {
    alias(map, "functions", "tools", |v| match v {
        Value::Array(fs) => Ok(Value::Array(
            fs.into_iter()
                .map(|f| json!({"type": "function", "function": f}))
                .collect(),
        )),
        _ => Err(ApiError::invalid("functions", "`functions` must be a list")),
    })?;
    alias(map, "function_call", "tool_choice", |v| match v {
        Value::String(s) if s == "none" || s == "auto" => Ok(Value::String(s)),
        Value::Object(o) if o.get("name").is_some_and(Value::is_string) => {
            Ok(json!({"type": "function", "function": {"name": o["name"]}}))
        }
        _ => Err(ApiError::invalid(
            "function_call",
            "`function_call` must be \"none\", \"auto\" or {\"name\": ...}",
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normalised(json: Value, route: Route) -> Result<Map<String, Value>, ApiError> {
        let mut body = crate::request::json_object(json.to_string().as_bytes()).unwrap();
        normalise(&mut body, route).map(|()| body)
    }

    #[test]
    fn unknown_and_refused_fields_are_named() {
        for (json, route, param) in [
            (json!({"best_of": 2}), Route::Chat, "best_of"),
            (json!({"echo": true}), Route::Chat, "echo"),
            (
                json!({"messages": [], "chat_template": "x"}),
                Route::Chat,
                "chat_template",
            ),
            (
                json!({"prompt": "a", "temprature": 1}),
                Route::Completions,
                "temprature",
            ),
            (json!({"min_tokens": 3}), Route::Completions, "min_tokens"),
            (
                json!({"modalities": ["text", "audio"]}),
                Route::Chat,
                "modalities",
            ),
            (
                json!({"chat_template_kwargs": {"messages": []}}),
                Route::Chat,
                "chat_template_kwargs",
            ),
            (
                json!({"guided_regex": "a", "regex": "b"}),
                Route::Chat,
                "guided_regex",
            ),
            (
                json!({"guided_regex": "a", "guided_choice": ["b"]}),
                Route::Chat,
                "guided_choice",
            ),
            (json!({"guided_choice": []}), Route::Chat, "guided_choice"),
            (
                json!({"function_call": "always"}),
                Route::Chat,
                "function_call",
            ),
            (
                json!({"functions": [], "tools": []}),
                Route::Chat,
                "functions",
            ),
        ] {
            let e = normalised(json.clone(), route).unwrap_err();
            assert_eq!(
                (e.status.as_u16(), e.param.as_deref()),
                (400, Some(param)),
                "{json}"
            );
        }
    }

    #[test]
    fn aliases_become_the_fields_they_stand_for() {
        let m = normalised(
            json!({"guided_json": "{\"type\": \"object\"}", "user": "u", "modalities": ["text"]}),
            Route::Chat,
        )
        .unwrap();
        assert_eq!(
            m["response_format"]["json_schema"]["schema"],
            json!({"type": "object"})
        );
        let m = normalised(json!({"guided_choice": ["a.b", "c|d"]}), Route::Completions).unwrap();
        assert_eq!(m["regex"], json!("(a\\.b|c\\|d)"));
        let m = normalised(
            json!({"functions": [{"name": "f", "parameters": {}}], "function_call": {"name": "f"}}),
            Route::Chat,
        )
        .unwrap();
        assert_eq!(m["tools"][0]["function"]["name"], json!("f"));
        assert_eq!(
            m["tool_choice"],
            json!({"type": "function", "function": {"name": "f"}})
        );
        assert!(normalised(json!({"echo": true, "best_of": 2}), Route::Completions).is_ok());
    }
}
