//! What a request's output must be: OpenAI's `response_format` (`text`, `json_object`,
//! `json_schema`) and SGLang's `regex` and `ebnf`, read into a grammar spec and compiled against
//! the model's vocabulary (a bad schema or grammar is a 400 naming the problem, before anything
//! is queued).

use crate::Shared;
use crate::body::Body;
use crate::error::ApiError;
use crate::request::blocking;
use grammar::{GrammarError, GrammarSpec};
use model::sampler::TokenConstraint;
use serde_json::Value;

/// The output language a request asks for, if any (at most one of the three fields).
pub(crate) fn parse(body: &Body) -> Result<Option<GrammarSpec>, ApiError> {
    let mut specs = Vec::new();
    if let Some(spec) = response_format(body)? {
        specs.push(("response_format", spec));
    }
    if let Some(rx) = body.str("regex")? {
        specs.push(("regex", GrammarSpec::Regex(rx.to_string())));
    }
    if let Some(g) = body.str("ebnf")? {
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
fn response_format(body: &Body) -> Result<Option<GrammarSpec>, ApiError> {
    const P: &str = "response_format";
    let Some(format) = body.get(P) else {
        return Ok(None);
    };
    let Some(kind) = format.get("type").and_then(Value::as_str) else {
        return Err(ApiError::invalid(
            P,
            "`response_format` must be an object with a `type`",
        ));
    };
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(GrammarSpec::JsonObject)),
        "json_schema" => {
            let Some(spec) = format.get("json_schema").filter(|v| v.is_object()) else {
                return Err(ApiError::invalid(
                    P,
                    "`response_format.json_schema` must be an object with a `schema`",
                ));
            };
            if let Some(name) = spec.get("name")
                && !name.is_string()
            {
                return Err(ApiError::invalid(P, "`json_schema.name` must be a string"));
            }
            match spec.get("schema") {
                Some(schema @ Value::Object(_)) => {
                    Ok(Some(GrammarSpec::JsonSchema(schema.clone())))
                }
                Some(Value::Bool(true)) | None => Ok(Some(GrammarSpec::JsonSchema(Value::Object(
                    Default::default(),
                )))),
                Some(_) => Err(ApiError::invalid(
                    P,
                    "`json_schema.schema` must be a JSON Schema object",
                )),
            }
        }
        other => Err(ApiError::invalid(
            P,
            format!(
                "`response_format.type` {other:?} is not supported: use \"text\", \"json_object\" or \"json_schema\""
            ),
        )),
    }
}

/// The compiled grammar for `spec` (off the async threads: a large schema takes a while), in
/// its start state.
pub(crate) async fn compile(
    state: &Shared,
    spec: Option<GrammarSpec>,
) -> Result<Option<Box<dyn TokenConstraint>>, ApiError> {
    // Scripted output (a test mode) writes its tokens whatever a grammar says.
    let Some(spec) = spec.filter(|_| state.script.is_none()) else {
        return Ok(None);
    };
    let state = state.clone();
    blocking(move || {
        let grammars = state.model().grammars.as_ref().map_err(|e| {
            ApiError::bad_request(format!("structured outputs are not available: {e}"))
        })?;
        match grammars.compile(&spec) {
            Ok(g) => Ok(Some(Box::new(g) as Box<dyn TokenConstraint>)),
            Err(GrammarError::Invalid(m)) => Err(ApiError::bad_request(format!(
                "the requested output format cannot be used: {m}"
            ))),
            Err(e) => Err(ApiError::bad_request(e.to_string())),
        }
    })
    .await
}
