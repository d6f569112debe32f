//! Tool-call grammars in Lark: a forced call (`tool_choice` `required` or a named function), and
//! calls the model may make or not (`tool_choice` `auto` with strict functions), each call's
//! arguments under its function's parameter schema (`%json`).

use crate::spec::with_json_options;
use serde_json::{Value, json};

/// One function's call, as the tool-call format writes it around the arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct CallShape {
    pub before: String,
    pub parameters: Value,
    pub after: String,
}

/// Calls the model may make or not: the answer is text (or JSON under `answer`) without the
/// format's call marker, or calls, each valid for one function.
#[derive(Debug, Clone, PartialEq)]
pub struct OptionalCalls {
    /// The marker that opens calls after the answer's text (`<tool_call>`), if the format has
    /// one; each call after it is one of `calls`.
    pub trigger: Option<String>,
    pub calls: Vec<CallShape>,
    /// Formats that read a JSON call object at the answer's start as a call (Llama 3's, Hermes'
    /// bare form): such objects, and then no text may start with `{`.
    pub bare: Option<BareCalls>,
    /// Several calls may follow each other (`parallel_tool_calls`).
    pub parallel: bool,
    /// The answer's schema when it is not calls (`response_format`); any text when `None`.
    pub answer: Option<Value>,
}

/// Calls written as JSON objects `{"name": …, key: {…}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct BareCalls {
    /// The arguments' key (`arguments`, `parameters`).
    pub key: String,
    /// Between several calls (Llama 3's `;`); `None`: the answer is one call.
    pub separator: Option<String>,
    /// (name, parameter schema) of each function.
    pub functions: Vec<(String, Value)>,
}

/// A Lark string literal.
fn literal(s: &str) -> String {
    Value::from(s).to_string()
}

/// A literal in a sequence: nothing for the empty string.
fn piece(s: &str) -> String {
    if s.is_empty() {
        String::new()
    } else {
        literal(s)
    }
}

/// The `TEXT` lexeme: any text without the `triggers` in it, and not starting with a JSON
/// object if `no_object` (with `ANY`, which it is made of).
fn text_lexeme<'a>(triggers: impl Iterator<Item = &'a String>, no_object: bool) -> String {
    let mut text = String::from("ANY");
    for t in triggers {
        text.push_str(&format!(" & ~(ANY {} ANY)", literal(t)));
    }
    if no_object {
        text.push_str(" & ~(/[ \\t\\n]*/ \"{\" ANY)");
    }
    format!("ANY: /(.|\\n)*/\nTEXT: {text}\n")
}

/// One rule per call shape (`{prefix}_{i}`) and their alternatives as `{prefix}`.
fn call_rules(prefix: &str, calls: &[CallShape]) -> String {
    let names: Vec<String> = (0..calls.len()).map(|i| format!("{prefix}_{i}")).collect();
    let mut lark = format!("{prefix}: {}\n", names.join(" | "));
    for (name, call) in names.iter().zip(calls) {
        let mut schema = call.parameters.clone();
        with_json_options(&mut schema);
        let (before, after) = (piece(&call.before), piece(&call.after));
        lark.push_str(&format!("{name}: {before} %json {schema} {after}\n"));
    }
    lark
}

/// A forced call: one of `calls`.
pub(crate) fn forced_call_lark(calls: &[CallShape]) -> String {
    format!("start: call\n{}", call_rules("call", calls))
}

/// Text, or text then calls, or bare calls (see [`OptionalCalls`]). `marker`: the trigger is
/// this control token (named by id; its text, spelled in ordinary tokens, stays out of text).
pub(crate) fn optional_calls_lark(spec: &OptionalCalls, marker: Option<u32>) -> String {
    // Text the parser would not read as a call: no trigger inside, no object at the start.
    let mut lark = text_lexeme(spec.trigger.iter(), spec.bare.is_some());
    let mut starts = Vec::new();
    match &spec.answer {
        None => starts.push("TEXT".to_string()),
        Some(schema) => {
            let mut schema = schema.clone();
            with_json_options(&mut schema);
            starts.push("answer".into());
            lark.push_str(&format!("answer: %json {schema}\n"));
        }
    }
    if let Some(trigger) = &spec.trigger {
        let opens = match marker {
            Some(id) => format!("<[{id}]>"),
            None => literal(trigger),
        };
        let more = if spec.parallel {
            format!(" (/[ \\t\\n]{{0,2}}/ {opens} call)*")
        } else {
            String::new()
        };
        lark.push_str(&format!("calls: call{more}\n"));
        lark.push_str(&call_rules("call", &spec.calls));
        starts.push(match (&spec.answer, marker) {
            (Some(_), _) => format!("{opens} calls"),
            // A control token ends the text lexeme by itself.
            (None, Some(_)) => format!("TEXT {opens} calls"),
            // Text up to the first trigger, which it ends with.
            (None, None) => {
                lark.push_str(&format!("lead[suffix={opens}]: TEXT\n"));
                "lead calls".into()
            }
        });
    }
    if let Some(bare) = &spec.bare {
        starts.push("bare_calls".into());
        lark.push_str(&bare_rules(bare, spec.parallel));
    }
    format!("start: {}\n{lark}", starts.join(" | "))
}

/// `bare_calls`: one JSON call object, or several between separators.
fn bare_rules(bare: &BareCalls, parallel: bool) -> String {
    let objects: Vec<Value> = bare
        .functions
        .iter()
        .map(|(name, parameters)| {
            json!({"type": "object",
                "properties": {"name": {"const": name}, bare.key.as_str(): parameters},
                "required": ["name", bare.key.as_str()], "additionalProperties": false})
        })
        .collect();
    let mut schema = json!({"anyOf": objects});
    with_json_options(&mut schema);
    let more = match (&bare.separator, parallel) {
        (Some(sep), true) => format!(" (/[ \\t]?/ {} /[ \\t]?/ bare)*", literal(sep)),
        _ => String::new(),
    };
    format!("bare_calls: bare{more}\nbare: %json {schema}\n")
}

/// SGLang's `structural_tag`: free text in which each trigger opens one of its structures
/// (`begin`, JSON under `schema`, `end`), after which text goes on.
#[derive(Debug, Clone, PartialEq)]
pub struct StructuralTag {
    pub triggers: Vec<String>,
    pub structures: Vec<TaggedStructure>,
}

/// One structure of a [`StructuralTag`]; `begin` starts with one of the triggers.
#[derive(Debug, Clone, PartialEq)]
pub struct TaggedStructure {
    pub begin: String,
    pub schema: Value,
    pub end: String,
}

/// Text without triggers, and segments of such text ended by a trigger and its structure.
pub(crate) fn structural_tag_lark(tag: &StructuralTag) -> String {
    let mut lark = text_lexeme(tag.triggers.iter(), false);
    let mut segments = Vec::new();
    for (k, trigger) in tag.triggers.iter().enumerate() {
        let shapes: Vec<CallShape> = tag
            .structures
            .iter()
            .filter_map(|s| {
                Some(CallShape {
                    before: s.begin.strip_prefix(trigger.as_str())?.to_string(),
                    parameters: s.schema.clone(),
                    after: s.end.clone(),
                })
            })
            .collect();
        if shapes.is_empty() {
            continue;
        }
        segments.push(format!("lead_{k} tag_{k}"));
        lark.push_str(&format!("lead_{k}[suffix={}]: TEXT\n", literal(trigger)));
        lark.push_str(&call_rules(&format!("tag_{k}"), &shapes));
    }
    if segments.is_empty() {
        return format!("start: TEXT\n{lark}");
    }
    format!(
        "start: segment* TEXT\nsegment: {}\n{lark}",
        segments.join(" | ")
    )
}
