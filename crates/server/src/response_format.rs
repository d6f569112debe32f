//! What a request's output must be: OpenAI's `response_format` (`text`, `json_object`,
//! `json_schema`; SGLang's `structural_tag`) and SGLang's `regex` and `ebnf`, read into a grammar
//! spec and compiled against the model's vocabulary (a bad schema or grammar is a 400 naming the
//! problem, before anything is queued).

use crate::Shared;
use crate::error::ApiError;
use crate::request::blocking;
use axum::http::HeaderValue;
use axum::response::Response;
use grammar::{GrammarError, GrammarSpec, StructuralTag, TaggedStructure};
use model::sampler::TokenConstraint;
use protocol::request::{GenerationFields, ResponseFormat};
use serde_json::Value;

/// The output language a request asks for, if any (at most one of the three fields).
pub(crate) fn parse(g: &GenerationFields) -> Result<Option<GrammarSpec>, ApiError> {
    let mut specs = Vec::new();
    if let Some(spec) = g
        .response_format
        .as_ref()
        .map(response_format)
        .transpose()?
    {
        specs.extend(spec.map(|s| ("response_format", s)));
    }
    if let Some(rx) = &g.regex {
        specs.push(("regex", GrammarSpec::Regex(rx.clone())));
    }
    if let Some(g) = &g.ebnf {
        let lark =
            grammar::ebnf_to_lark(g).map_err(|e| ApiError::invalid("ebnf", e.to_string()))?;
        specs.push(("ebnf", GrammarSpec::Lark(lark)));
    }
    match specs.len() {
        0 | 1 => Ok(specs.pop().map(|(_, s)| s)),
        _ => {
            let names: Vec<&str> = specs.iter().map(|(n, _)| *n).collect();
            Err(ApiError::invalid(
                names[1],
                format!("give one of {} at most", names.join(", ")),
            ))
        }
    }
}

/// `response_format`: `None` for text.
fn response_format(format: &ResponseFormat) -> Result<Option<GrammarSpec>, ApiError> {
    const P: &str = "response_format";
    match format.kind.as_str() {
        "text" => Ok(None),
        "json_object" => Ok(Some(GrammarSpec::JsonObject)),
        "json_schema" => {
            let Some(spec) = &format.json_schema else {
                return Err(ApiError::invalid(
                    P,
                    "`response_format.json_schema` must be an object with a `schema`",
                ));
            };
            // OpenAI's strict mode allows no key the schema does not name.
            let strict = spec.strict == Some(true);
            schema(spec.schema.as_ref())
                .map(|mut s| {
                    if strict {
                        grammar::close_objects(&mut s);
                    }
                    Some(GrammarSpec::JsonSchema(s))
                })
                .ok_or_else(|| {
                    ApiError::invalid(P, "`json_schema.schema` must be a JSON Schema object")
                })
        }
        "structural_tag" => structural_tag(format).map(|t| Some(GrammarSpec::StructuralTag(t))),
        other => Err(ApiError::invalid(
            P,
            format!(
                "`response_format.type` {other:?} is not supported: use \"text\", \"json_object\", \"json_schema\" or \"structural_tag\""
            ),
        )),
    }
}

/// A schema as given: an object, or absent or `true` for any JSON; `None` for anything else.
fn schema(given: Option<&Value>) -> Option<Value> {
    match given {
        Some(schema @ Value::Object(_)) => Some(schema.clone()),
        Some(Value::Bool(true)) | None => Some(Value::Object(Default::default())),
        Some(_) => None,
    }
}

/// SGLang's `structural_tag`: `{"structures": [{"begin", "schema", "end"}], "triggers": [...]}`,
/// each structure's `begin` starting with one of the triggers.
fn structural_tag(format: &ResponseFormat) -> Result<StructuralTag, ApiError> {
    let bad = |what: String| ApiError::invalid("response_format", what);
    let triggers = format
        .triggers
        .clone()
        .filter(|t| !t.is_empty() && t.iter().all(|t| !t.is_empty()))
        .ok_or_else(|| bad("`structural_tag` needs `triggers`, a list of non-empty strings (only the structures/triggers form is supported)".into()))?;
    let list = format
        .structures
        .as_ref()
        .filter(|l| !l.is_empty())
        .ok_or_else(|| bad("`structural_tag` needs `structures`, a non-empty list".into()))?;
    let mut structures = Vec::with_capacity(list.len());
    for (i, s) in list.iter().enumerate() {
        let (Some(begin), Some(end)) = (s.begin.clone(), s.end.clone()) else {
            return Err(bad(format!(
                "`structures[{i}]` needs `begin` and `end` strings"
            )));
        };
        if !triggers.iter().any(|t| begin.starts_with(t.as_str())) {
            return Err(bad(format!(
                "`structures[{i}].begin` {begin:?} starts with none of the `triggers`"
            )));
        }
        let schema = schema(s.schema.as_ref()).ok_or_else(|| {
            bad(format!(
                "`structures[{i}].schema` must be a JSON Schema object"
            ))
        })?;
        structures.push(TaggedStructure { begin, schema, end });
    }
    Ok(StructuralTag {
        triggers,
        structures,
    })
}

/// The compiled grammar for `spec`, in its start state. Compiled on the grammar crate's own
/// threads (with the stack and deadline it needs); this request waits for it on a blocking
/// thread, never on the async ones. A spec that is invalid, past a limit, or too costly to
/// compile is a 400 naming its parameter; a busy compiler is a 503 to retry.
pub(crate) async fn compile(
    state: &Shared,
    spec: Option<GrammarSpec>,
) -> Result<Compiled, ApiError> {
    // Scripted output (a test mode) writes its tokens whatever a grammar says.
    let Some(spec) = spec.filter(|_| state.script.is_none()) else {
        return Ok(Compiled::default());
    };
    let state = state.clone();
    blocking(move || {
        let grammars = state.model().grammars.as_ref().map_err(|e| {
            ApiError::bad_request(format!("structured outputs are not available: {e}"))
        })?;
        match grammars.compile(&spec) {
            Ok(g) => Ok(Compiled {
                constraint: Some(Box::new(g)),
                unenforced: spec.unenforced(),
            }),
            Err(e) => Err(grammar_error(param_of(&spec), e)),
        }
    })
    .await
}

/// A request's compiled output language, and what of it the grammar does not enforce.
#[derive(Default)]
pub(crate) struct Compiled {
    pub constraint: Option<Box<dyn TokenConstraint>>,
    /// Keywords accepted best-effort (`uniqueItems at /properties/tags`): the response says so
    /// in [`UNENFORCED_HEADER`].
    pub unenforced: Vec<String>,
}

/// The response header that names what of a schema the output was not held to.
pub(crate) const UNENFORCED_HEADER: &str = "x-specula-unenforced";

impl Compiled {
    /// `response` with [`UNENFORCED_HEADER`] when something is not enforced (non-ASCII in a
    /// property's name escaped, as a header allows only ASCII).
    pub(crate) fn mark(notes: &[String], mut response: Response) -> Response {
        if notes.is_empty() {
            return response;
        }
        let text: String = notes
            .join("; ")
            .chars()
            .flat_map(char::escape_default)
            .collect();
        if let Ok(value) = HeaderValue::from_str(&text) {
            response.headers_mut().insert(UNENFORCED_HEADER, value);
        }
        response
    }
}

/// The request parameter a spec comes from.
fn param_of(spec: &GrammarSpec) -> &'static str {
    match spec {
        GrammarSpec::Regex(_) => "regex",
        GrammarSpec::Lark(_) => "ebnf",
        GrammarSpec::ToolCall(_) | GrammarSpec::OptionalToolCalls(_) => "tools",
        GrammarSpec::JsonSchema(_) | GrammarSpec::JsonObject | GrammarSpec::StructuralTag(_) => {
            "response_format"
        }
    }
}

/// The API's answer to a grammar that cannot be had: the request's fault (invalid, past a
/// limit, too costly, or one the compiler broke on) is a 400 naming `param`; a busy compiler a
/// 503 with `Retry-After`; a model or server that cannot compile grammars a 400 or 503.
fn grammar_error(param: &str, e: GrammarError) -> ApiError {
    match e {
        GrammarError::Invalid(_)
        | GrammarError::Limit { .. }
        | GrammarError::Deadline(_)
        | GrammarError::Panicked(_) => ApiError::invalid(
            param,
            format!("the requested output format cannot be used: {e}"),
        ),
        GrammarError::Overloaded(_) => ApiError::overloaded(e.to_string()),
        GrammarError::Vocabulary(_) => ApiError::bad_request(e.to_string()),
        GrammarError::Unavailable(_) => ApiError::unavailable(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn format(value: Value) -> Result<Option<GrammarSpec>, ApiError> {
        let body = json!({"response_format": value, "messages": []});
        let request: protocol::request::ChatCompletionRequest =
            protocol::request::parse(body).map_err(ApiError::field)?;
        parse(&request.generation)
    }

    #[test]
    fn grammar_errors_are_400s_naming_the_parameter_or_503s_to_retry() {
        let limit = GrammarError::Limit {
            what: "properties of one object",
            limit: 1000,
            got: 7000,
        };
        let e = grammar_error(param_of(&GrammarSpec::Regex("a".into())), limit);
        assert_eq!(
            (e.status.as_u16(), e.param.as_deref()),
            (400, Some("regex"))
        );
        assert!(
            e.message
                .contains("properties of one object: 7000, over the limit of 1000"),
            "{}",
            e.message
        );
        for (error, status) in [
            (GrammarError::Invalid("bad".into()), 400),
            (
                GrammarError::Deadline(std::time::Duration::from_secs(10)),
                400,
            ),
            (GrammarError::Panicked("boom".into()), 400),
            (GrammarError::Overloaded(16), 503),
            (GrammarError::Unavailable("gone".into()), 503),
        ] {
            let e = grammar_error("tools", error.clone());
            assert_eq!(e.status.as_u16(), status, "{error:?}");
            assert_eq!(
                e.retry_after.is_some(),
                matches!(error, GrammarError::Overloaded(_))
            );
        }
        let ebnf = grammar_error(
            param_of(&GrammarSpec::Lark("x".into())),
            GrammarError::Invalid("x".into()),
        );
        assert_eq!(ebnf.param.as_deref(), Some("ebnf"));
    }

    #[test]
    fn a_structural_tag_is_read_and_its_mistakes_named() {
        let structure =
            json!({"begin": "<function=f>", "schema": {"type": "object"}, "end": "</function>"});
        let spec = format(json!({"type": "structural_tag", "structures": [structure],
            "triggers": ["<function="]}))
        .unwrap();
        let Some(GrammarSpec::StructuralTag(tag)) = spec else {
            panic!("{spec:?}");
        };
        assert_eq!(
            (tag.triggers, tag.structures[0].end.as_str()),
            (vec!["<function=".to_string()], "</function>")
        );
        for (value, says) in [
            (
                json!({"type": "structural_tag", "structures": [structure]}),
                "triggers",
            ),
            (
                json!({"type": "structural_tag", "triggers": ["<f"], "structures": []}),
                "structures",
            ),
            (
                json!({"type": "structural_tag", "triggers": ["<tool>"], "structures": [structure]}),
                "none of the `triggers`",
            ),
            (
                json!({"type": "structural_tag", "triggers": ["<f"], "structures": [{"begin": "<f"}]}),
                "`begin` and `end`",
            ),
            (
                json!({"type": "structural_tag", "triggers": ["<f"],
                    "structures": [{"begin": "<f", "end": "", "schema": 3}]}),
                "schema",
            ),
        ] {
            let e = format(value.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("response_format"), "{value}");
            assert!(e.message.contains(says), "{value}: {}", e.message);
        }
    }
}
