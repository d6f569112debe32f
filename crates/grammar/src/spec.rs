//! What a request asks its output to be, in the API's terms (`response_format`, SGLang's `regex`
//! and `ebnf`), and the llguidance grammar for it.

use crate::tools::{
    CallShape, OptionalCalls, StructuralTag, forced_call_lark, optional_calls_lark,
    structural_tag_lark,
};
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
    /// Calls the model may make or not (`tool_choice` `auto` with strict functions).
    OptionalToolCalls(OptionalCalls),
    /// `response_format: {"type": "structural_tag", ...}`: text with tagged JSON inside.
    StructuralTag(StructuralTag),
}

impl GrammarSpec {
    /// Every JSON schema in the spec (the answer's, each function's parameters, each tagged
    /// structure's).
    pub fn schemas(&self) -> Vec<&Value> {
        match self {
            GrammarSpec::JsonSchema(schema) => vec![schema],
            GrammarSpec::JsonObject | GrammarSpec::Regex(_) | GrammarSpec::Lark(_) => Vec::new(),
            GrammarSpec::ToolCall(calls) => calls.iter().map(|c| &c.parameters).collect(),
            GrammarSpec::OptionalToolCalls(spec) => {
                let mut all: Vec<&Value> = spec.calls.iter().map(|c| &c.parameters).collect();
                if let Some(bare) = &spec.bare {
                    all.extend(bare.functions.iter().map(|(_, p)| p));
                }
                all.extend(&spec.answer);
                all
            }
            GrammarSpec::StructuralTag(tag) => tag.structures.iter().map(|s| &s.schema).collect(),
        }
    }

    /// What the spec asks for that its grammar does not enforce: the JSON pointers of the
    /// arrays under `uniqueItems` (see [`crate::schema_pass`]), at most [`MAX_UNENFORCED`].
    pub fn unenforced(&self) -> Vec<String> {
        let mut all = Vec::new();
        for schema in self.schemas() {
            let most = MAX_UNENFORCED - all.len();
            all.extend(
                crate::schema_pass::unique_items_paths(schema, most)
                    .into_iter()
                    .map(|path| format!("uniqueItems at {path}")),
            );
        }
        all
    }
    /// The key compiled grammars are cached under, and what llguidance's grammar is made from
    /// (only on a miss). `control` gives the id of a control token spelled by a text (a
    /// tool-call marker may be one).
    pub(crate) fn source(&self, control: &dyn Fn(&str) -> Option<u32>) -> (String, Source) {
        let lark = |kind: &str, lark: String| (format!("{kind}\u{0}{lark}"), Source::Lark(lark));
        match self {
            GrammarSpec::JsonSchema(schema) => (
                format!("json_schema\u{0}{schema}"),
                Source::Json(Some(schema.clone())),
            ),
            GrammarSpec::JsonObject => ("json_object".into(), Source::Json(None)),
            GrammarSpec::Regex(rx) => (format!("regex\u{0}{rx}"), Source::Regex(rx.clone())),
            GrammarSpec::Lark(g) => lark("lark", g.clone()),
            GrammarSpec::ToolCall(calls) => lark("tool_call", forced_call_lark(calls)),
            GrammarSpec::OptionalToolCalls(spec) => {
                let marker = spec.trigger.as_deref().and_then(control);
                lark("optional_tool_calls", optional_calls_lark(spec, marker))
            }
            GrammarSpec::StructuralTag(tag) => lark("structural_tag", structural_tag_lark(tag)),
        }
    }
}

/// What a grammar is made from: a JSON schema (`None`: any object), a regex or Lark.
pub(crate) enum Source {
    Json(Option<Value>),
    Regex(String),
    Lark(String),
}

impl Source {
    /// llguidance's grammar. JSON may put whitespace between its tokens as models like to (a
    /// newline and indentation), but at most [`JSON_MAX_WHITESPACE`] characters per gap: a
    /// small model left free there can fill its whole budget with blank lines.
    pub(crate) fn into_grammar(self) -> TopLevelGrammar {
        match self {
            Source::Json(schema) => {
                json_grammar(schema.unwrap_or_else(|| json!({"type": "object"})))
            }
            Source::Regex(rx) => TopLevelGrammar::from_regex(&rx),
            Source::Lark(lark) => TopLevelGrammar::from_lark(lark),
        }
    }
}

fn json_grammar(mut schema: Value) -> TopLevelGrammar {
    with_json_options(&mut schema);
    TopLevelGrammar::from_json_schema(schema)
}

/// Our JSON options, written into the schema (a schema that sets llguidance's own keeps them).
/// `uniqueItems` is dropped and the formats validators check tightened here, where every schema passes before
/// compiling (see [`crate::schema_pass`]).
pub(crate) fn with_json_options(schema: &mut Value) {
    crate::schema_pass::drop_unique_items(schema);
    crate::schema_pass::validated_formats(schema);
    if schema.is_object() && schema.get("x-guidance").is_none() {
        json_options().apply_to(schema);
    }
}

/// The most unenforced keywords [`GrammarSpec::unenforced`] names (a response header lists them).
pub const MAX_UNENFORCED: usize = 8;

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
