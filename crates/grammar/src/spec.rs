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
}

impl GrammarSpec {
    /// The key compiled grammars are cached under.
    pub(crate) fn cache_key(&self) -> String {
        match self {
            GrammarSpec::JsonSchema(schema) => format!("json_schema\u{0}{schema}"),
            GrammarSpec::JsonObject => "json_object".into(),
            GrammarSpec::Regex(rx) => format!("regex\u{0}{rx}"),
            GrammarSpec::Lark(g) => format!("lark\u{0}{g}"),
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
        }
    }
}

fn json_grammar(mut schema: Value) -> TopLevelGrammar {
    // A schema that sets llguidance's own options keeps them.
    if schema.is_object() && schema.get("x-guidance").is_none() {
        json_options().apply_to(&mut schema);
    }
    TopLevelGrammar::from_json_schema(schema)
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
