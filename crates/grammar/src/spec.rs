//! What a request asks its output to be, in the API's terms (`response_format`, SGLang's `regex`
//! and `ebnf`), and the llguidance grammar for it.

use llguidance::JsonCompileOptions;
use llguidance::api::TopLevelGrammar;
use serde_json::{Value, json};

/// A request's output language.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// `response_format: {"type": "json_schema", "json_schema": {"schema": ...}}`.
    JsonSchema(Value),
    /// `response_format: {"type": "json_object"}`: any JSON object.
    JsonObject,
    /// SGLang's `regex`: the whole output matches it.
    Regex(String),
    /// SGLang's `ebnf`, or a Lark grammar (llguidance's syntax).
    Lark(String),
    /// A forced tool call: one of these, each the text that leads to the arguments, the
    /// arguments as a JSON object under the function's parameter schema, then the text that
    /// closes the call.
    ToolCall(Vec<CallShape>),
}

/// One function's call, as the tool-call format writes it around the arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct CallShape {
    pub before: String,
    pub parameters: Value,
    pub after: String,
}

impl GrammarSpec {
    /// The key compiled grammars are cached under.
    pub(crate) fn cache_key(&self) -> String {
        match self {
            GrammarSpec::JsonSchema(schema) => format!("json_schema\u{0}{schema}"),
            GrammarSpec::JsonObject => "json_object".into(),
            GrammarSpec::Regex(rx) => format!("regex\u{0}{rx}"),
            GrammarSpec::Lark(g) => format!("lark\u{0}{g}"),
            GrammarSpec::ToolCall(_) => format!("tool_call\u{0}{}", self.tool_call_lark()),
        }
    }

    /// llguidance's grammar. JSON may put whitespace between its tokens as models like to
    /// (a newline and indentation), but at most [`JSON_MAX_WHITESPACE`] characters per gap: a
    /// small model left free there can fill its whole budget with blank lines.
    pub(crate) fn to_grammar(&self) -> TopLevelGrammar {
        match self {
            GrammarSpec::JsonSchema(schema) => json_grammar(schema.clone()),
            GrammarSpec::JsonObject => json_grammar(json!({"type": "object"})),
            GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
            GrammarSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            GrammarSpec::ToolCall(_) => TopLevelGrammar::from_lark(self.tool_call_lark()),
        }
    }

    /// A tool call's grammar in Lark: one rule per function, its arguments under `%json`.
    fn tool_call_lark(&self) -> String {
        let GrammarSpec::ToolCall(calls) = self else {
            return String::new();
        };
        let literal = |s: &str| {
            if s.is_empty() {
                String::new()
            } else {
                Value::from(s).to_string()
            }
        };
        let names: Vec<String> = (0..calls.len()).map(|i| format!("call_{i}")).collect();
        let mut lark = format!("start: {}\n", names.join(" | "));
        for (name, call) in names.iter().zip(calls) {
            let mut schema = call.parameters.clone();
            with_json_options(&mut schema);
            let (before, after) = (literal(&call.before), literal(&call.after));
            lark.push_str(&format!("{name}: {before} %json {schema} {after}\n"));
        }
        lark
    }
}

fn json_grammar(mut schema: Value) -> TopLevelGrammar {
    with_json_options(&mut schema);
    TopLevelGrammar::from_json_schema(schema)
}

/// Our JSON options, written into the schema (a schema that sets llguidance's own keeps them).
fn with_json_options(schema: &mut Value) {
    if schema.is_object() && schema.get("x-guidance").is_none() {
        json_options().apply_to(schema);
    }
}

/// The longest run of whitespace between two JSON tokens: a newline and 15 spaces of
/// indentation.
pub const JSON_MAX_WHITESPACE: usize = 16;

fn json_options() -> JsonCompileOptions {
    JsonCompileOptions {
        item_separator: ",".into(),
        key_separator: ":".into(),
        whitespace_flexible: false,
        whitespace_pattern: Some(format!("[\\x20\\x0A\\x0D\\x09]{{1,{JSON_MAX_WHITESPACE}}}")),
        ..JsonCompileOptions::default()
    }
}
