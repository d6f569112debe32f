//! Fuzz targets, run as proptest tests in every `cargo test`: the request front end (the body
//! read, its fields normalised, the generation parameters, the output format and the tools) on
//! arbitrary bytes, on mutated seed bodies and on random JSON spelled with the API's field
//! names; and every tool-call and reasoning parser on marker soup cut into arbitrary chunks.
//! Each must return errors as values (a 400 for anything a client sends), never panic and never
//! take long. The seeds are the files under `testdata/fuzz/`; each target runs a few hundred to
//! a couple of thousand cases, and `SPECULA_FUZZ_CASES=N` runs N instead (a longer hunt).

use crate::error::ApiError;
use crate::fields::{self, Route};
use crate::params::{self, GenParams};
use crate::parsers::{
    Output, OutputParser, ReasoningFormat, ReasoningParser, ToolEvent, ToolFormat, ToolParser,
};
use crate::response_format;
use crate::tool_request::{self, ToolChoice, ToolRequest};
use fuzzing::{Bytes, replace_node};
use grammar::{GrammarLimits, GrammarSpec};
use model::chat_template::TemplateCaps;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;
use protocol::request::{
    ChatCompletionRequest, CompletionRequest, GenerationFields, field_names, parse,
};
use serde_json::{Map, Value, json};

// ---------------------------------------------------------------------------------------------
// The harness: cases, seeds, mutations, and a run that may neither panic nor hang.

/// Runs `test` on the cases of the strategy `make` builds (the shared harness).
fn fuzz<S, F, T>(default: u32, make: F, test: T)
where
    S: Strategy + 'static,
    F: FnOnce() -> S + Send + 'static,
    T: Fn(S::Value) -> Result<(), TestCaseError> + Send + 'static,
{
    fuzzing::DEFAULT.run(default, make, test)
}

/// The seed files of this target's folder, in name order.
fn seeds(dir: &str) -> Vec<Vec<u8>> {
    fuzzing::seeds(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/fuzz")
            .join(dir),
    )
}

/// A seed body with a few edits, `tokens` inserted among them.
fn mutated(seeds: Vec<Vec<u8>>, tokens: &'static [&'static str]) -> impl Strategy<Value = Bytes> {
    let with = fuzzing::Mutations {
        tokens,
        splice: true,
        huge: &[],
    };
    fuzzing::mutated(seeds, with)
}

// ---------------------------------------------------------------------------------------------
// Random JSON in the API's terms.

/// The top-level fields chat reads, as its typed request declares them.
fn chat_fields() -> Vec<&'static str> {
    let mut fields = field_names::<GenerationFields>().to_vec();
    fields.extend(field_names::<ChatCompletionRequest>());
    fields
}

/// Fields of completions only, bookkeeping, aliases, and fields that are refused.
const OTHER_FIELDS: &[&str] = &[
    "prompt",
    "echo",
    "best_of",
    "suffix",
    "user",
    "metadata",
    "store",
    "modalities",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "functions",
    "function_call",
    "chat_template",
    "min_tokens",
    "reasoning_effort",
];

/// Keys inside the fields' values.
const KEYS: &[&str] = &[
    "role",
    "content",
    "type",
    "text",
    "function",
    "name",
    "arguments",
    "parameters",
    "strict",
    "description",
    "tool_calls",
    "tool_call_id",
    "id",
    "json_schema",
    "schema",
    "structures",
    "triggers",
    "begin",
    "end",
    "include_usage",
    "enable_thinking",
    "messages",
    "tools",
    "properties",
    "items",
    "anyOf",
    "$ref",
    "$defs",
    "required",
    "enum",
    "pattern",
];

/// Strings the validation looks for, and some it should not like.
const WORDS: &[&str] = &[
    "function",
    "auto",
    "none",
    "required",
    "text",
    "json_object",
    "json_schema",
    "structural_tag",
    "user",
    "assistant",
    "system",
    "developer",
    "tool",
    "get_weather",
    "f",
    "call_1",
    "<tool_call>",
    "<function=",
    "object",
    "string",
    "integer",
    "array",
    "#",
    "#/$defs/a",
    "root ::= \"a\" | [0-9]+ x\nx ::= \"b\"*",
    "a{2,3}|(b*)+",
    "{\"type\": \"object\"}",
    "",
    " ",
    "é",
    "\u{0}",
    "a b",
    "-1",
    "17",
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
];

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::Bool),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => any::<f64>().prop_map(Value::from),
        2 => (-3i64..25).prop_map(Value::from),
        1 => (-3.0f64..3.0).prop_map(Value::from),
        4 => select(WORDS).prop_map(Value::from),
        2 => ".{0,12}".prop_map(Value::String),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(KEYS).prop_map(str::to_string),
        1 => ".{0,8}",
    ]
}

/// Any JSON, a few levels deep, its keys mostly ones the API reads.
fn value() -> BoxedStrategy<Value> {
    scalar()
        .prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..6).prop_map(Value::Array),
                vec((key(), inner), 0..6).prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
        .boxed()
}

/// An object of `entries`, `None` values left out.
fn object(entries: Vec<(&str, Option<Value>)>) -> Value {
    Value::Object(
        entries
            .into_iter()
            .filter_map(|(k, v)| Some((k.to_string(), v?)))
            .collect(),
    )
}

/// JSON schemas, small and recursive, with `$ref`s that resolve or not.
fn schema() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        select(
            &[
                "string", "integer", "number", "boolean", "null", "object", "array"
            ][..]
        )
        .prop_map(|t| json!({"type": t})),
        select(
            &[
                "#",
                "#/$defs/a",
                "#/$defs/b",
                "#/properties/x",
                "#/nope",
                "other.json"
            ][..]
        )
        .prop_map(|r| json!({"$ref": r})),
        vec(scalar(), 0..4).prop_map(|e| json!({"enum": e})),
        select(
            &[
                "^[a-z]{1,8}$",
                "a{100}",
                "((a{100}){100}){100}",
                "(",
                "[",
                "\\d+"
            ][..]
        )
        .prop_map(|p| json!({"type": "string", "pattern": p})),
        Just(json!(true)),
        value(),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        let named = vec((select(&["x", "a", "b", "é", ""][..]), inner.clone()), 0..4)
            .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.into(), v)).collect()));
        prop_oneof![
            (
                named.clone(),
                proptest::option::of(vec(select(&["x", "a"][..]), 0..3))
            )
                .prop_map(|(p, r)| object(vec![
                    ("type", Some(json!("object"))),
                    ("properties", Some(p)),
                    ("required", r.map(|r| json!(r))),
                ])),
            inner
                .clone()
                .prop_map(|i| json!({"type": "array", "items": i})),
            vec(inner.clone(), 0..4).prop_map(|a| json!({"anyOf": a})),
            (named, inner).prop_map(|(d, root)| {
                let mut root = if root.is_object() { root } else { json!({}) };
                root["$defs"] = d;
                root
            }),
        ]
    })
    .boxed()
}

fn tool() -> impl Strategy<Value = Value> {
    let name = prop_oneof![
        6 => select(&["get_weather", "now", "f", "a-b_c"][..]).prop_map(Value::from),
        1 => select(&["x y", "", "é", "f.g"][..]).prop_map(Value::from),
        1 => value(),
    ];
    // Mostly what a tool may hold, sometimes anything.
    let parameters = prop_oneof![
        4 => schema().prop_map(|s| if s.is_object() { s } else { json!({"items": s}) }),
        1 => value(),
    ];
    let strict = prop_oneof![4 => any::<bool>().prop_map(Value::Bool), 1 => value()];
    let description = prop_oneof![4 => ".{0,8}".prop_map(Value::String), 1 => value()];
    let function = (
        name,
        proptest::option::of(parameters),
        proptest::option::of(strict),
        proptest::option::of(description),
    )
        .prop_map(|(n, p, s, d)| {
            object(vec![
                ("name", Some(n)),
                ("parameters", p),
                ("strict", s),
                ("description", d),
            ])
        });
    prop_oneof![
        8 => function.prop_map(|f| json!({"type": "function", "function": f})),
        1 => value(),
    ]
}

fn message() -> impl Strategy<Value = Value> {
    let role = prop_oneof![
        4 => select(&["user", "assistant", "system", "developer", "tool", ""][..]).prop_map(Value::from),
        1 => value(),
    ];
    let content = prop_oneof![
        3 => ".{0,16}".prop_map(Value::String),
        2 => vec(".{0,8}".prop_map(|t| json!({"type": "text", "text": t})), 0..3).prop_map(Value::Array),
        1 => value(),
    ];
    let call = (select(&["get_weather", "f"][..]), value(), any::<bool>()).prop_map(|(n, a, s)| {
        let arguments = if s { Value::String(a.to_string()) } else { a };
        json!({"id": "call_1", "type": "function", "function": {"name": n, "arguments": arguments}})
    });
    (
        role,
        proptest::option::of(content),
        proptest::option::of(vec(call, 0..3)),
        proptest::option::of(prop_oneof![Just(json!("call_1")), value()]),
    )
        .prop_map(|(r, c, calls, id)| {
            object(vec![
                ("role", Some(r)),
                ("content", c),
                ("tool_calls", calls.map(Value::Array)),
                ("tool_call_id", id),
            ])
        })
}

fn response_format_value() -> impl Strategy<Value = Value> {
    let structure = (
        select(&["<f>", "<function=a>", "x"][..]),
        schema(),
        ".{0,4}",
    )
        .prop_map(|(b, s, e)| json!({"begin": b, "schema": s, "end": e}));
    prop_oneof![
        select(
            &[
                "text",
                "json_object",
                "json_schema",
                "structural_tag",
                "xml"
            ][..]
        )
        .prop_map(|t| json!({"type": t})),
        (value(), schema()).prop_map(
            |(n, s)| json!({"type": "json_schema", "json_schema": {"name": n, "schema": s}})
        ),
        (
            vec(select(&["<f", "<function=", ""][..]), 0..3),
            vec(structure, 0..3)
        )
            .prop_map(|(t, s)| json!({"type": "structural_tag", "triggers": t, "structures": s})),
        value(),
    ]
}

/// A value for the top-level field `name`: shaped as that field wants it most of the time.
fn field(name: &'static str) -> BoxedStrategy<Value> {
    let shaped = match name {
        "messages" => vec(message(), 0..4).prop_map(Value::Array).boxed(),
        "tools" | "functions" => vec(tool(), 0..3).prop_map(Value::Array).boxed(),
        "tool_choice" | "function_call" => prop_oneof![
            select(&["none", "auto", "required", "any"][..]).prop_map(Value::from),
            select(&["get_weather", "f", "g"][..])
                .prop_map(|n| json!({"type": "function", "function": {"name": n}, "name": n})),
        ]
        .boxed(),
        "response_format" => response_format_value().boxed(),
        "stop" => prop_oneof![
            ".{0,4}".prop_map(Value::from),
            vec(scalar(), 0..18).prop_map(Value::Array)
        ]
        .boxed(),
        "logit_bias" => vec(("[ 0-9-]{0,6}", scalar()), 0..5)
            .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>()))
            .boxed(),
        "ebnf" | "guided_grammar" | "regex" | "guided_regex" => {
            grammar_text().prop_map(Value::from).boxed()
        }
        "guided_json" => (schema(), any::<bool>())
            .prop_map(|(s, text)| {
                if text {
                    Value::String(s.to_string())
                } else {
                    s
                }
            })
            .boxed(),
        _ => scalar().boxed(),
    };
    prop_oneof![5 => shaped, 1 => value()].boxed()
}

/// Grammar- and regex-like text: GBNF pieces in random order.
fn grammar_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        select(
            &[
                "root", " ::= ", "x", "\"a\"", "\"\\\"\"", "[a-z]", "[^\\]]", ".", "(", ")", "|",
                "*", "+", "?", "{2,3}", "{99999}", "\n", "# c\n", "%json {}", "/a+/", "start: ",
            ][..]
        )
        .prop_map(str::to_string),
        ".{0,3}",
    ];
    vec(piece, 0..12).prop_map(|p| p.concat())
}

/// A request body: its fields mostly chat's, their values mostly of their shape.
fn body_value() -> impl Strategy<Value = Value> {
    let named = |fields: Vec<&'static str>| {
        select(fields).prop_flat_map(|f| (Just(f.to_string()), field(f)))
    };
    let entry = prop_oneof![
        12 => named(chat_fields()),
        2 => named(OTHER_FIELDS.to_vec()),
        1 => (".{0,8}", value()),
    ];
    let fields = vec(entry, 0..8);
    // A chat request with tools, and whatever else.
    let chat = (
        field("messages"),
        field("tools"),
        proptest::option::of(field("tool_choice")),
        vec(named(chat_fields()), 0..6),
    )
        .prop_map(|(m, t, c, rest)| {
            let mut body = Map::from_iter(rest);
            body.insert("messages".into(), m);
            body.insert("tools".into(), t);
            if let Some(c) = c {
                body.insert("tool_choice".into(), c);
            }
            Value::Object(body)
        });
    let any = fields.prop_map(|kv| Value::Object(kv.into_iter().collect()));
    prop_oneof![any, chat]
}

// ---------------------------------------------------------------------------------------------
// Target 1: the request front end.

/// The vocabulary `logit_bias` ids are checked against.
const VOCAB: usize = 49_152;

const FORMATS: [ToolFormat; 6] = [
    ToolFormat::Hermes,
    ToolFormat::Llama3,
    ToolFormat::Mistral,
    ToolFormat::DeepseekV3,
    ToolFormat::KimiK2,
    ToolFormat::Pythonic,
];

/// What a client sends is never a 5xx: a refusal is a 400 with a message.
fn client_error(e: &ApiError) -> Result<(), TestCaseError> {
    prop_assert_eq!(e.status.as_u16(), 400, "{:?}", e);
    prop_assert!(!e.message.is_empty());
    Ok(())
}

/// What `params::parse` documents of the parameters it accepts.
fn check_params(p: &GenParams) -> Result<(), TestCaseError> {
    prop_assert!((1..=params::MAX_N as usize).contains(&p.n));
    prop_assert!(p.stop.len() <= params::MAX_STOPS && p.stop.iter().all(|s| !s.is_empty()));
    prop_assert!(
        p.logprobs
            .is_none_or(|k| k <= params::MAX_TOP_LOGPROBS as usize)
    );
    prop_assert!(
        p.max_tokens
            .is_none_or(|m| (1..=u32::MAX as usize).contains(&m))
    );
    prop_assert!(p.sampling.validate().is_ok());
    let bias = &p.sampling.logit_bias;
    prop_assert!(bias.len() <= params::MAX_LOGIT_BIAS);
    prop_assert!(bias.windows(2).all(|w| w[0].0 <= w[1].0));
    prop_assert!(
        bias.iter()
            .all(|&(id, b)| (id as usize) < VOCAB && f64::from(b.abs()) <= params::LOGIT_BIAS_RANGE)
    );
    Ok(())
}

/// A spec's limits are checked (any answer but a panic will do).
fn check_limits(spec: &Option<GrammarSpec>) {
    if let Some(spec) = spec {
        let _ = GrammarLimits::default().check(spec);
    }
}

/// Every step of the front end a body goes through before anything is compiled or rendered,
/// for both routes.
fn front_end(bytes: &[u8]) -> Result<(), TestCaseError> {
    let parsed = match crate::request::json_object(bytes) {
        Ok(b) => b,
        Err(e) => return client_error(&e),
    };
    for route in [Route::Chat, Route::Completions] {
        let mut body = parsed.clone();
        if let Err(e) = fields::normalise(&mut body, route) {
            client_error(&e)?;
            continue;
        }
        let body = Value::Object(body);
        let (params, generation, chat) = if route == Route::Chat {
            match parse::<ChatCompletionRequest>(body) {
                Ok(r) => (params::for_chat(&r, VOCAB), r.generation.clone(), Some(r)),
                Err(e) => {
                    client_error(&ApiError::field(e))?;
                    continue;
                }
            }
        } else {
            match parse::<CompletionRequest>(body) {
                Ok(r) => (params::for_completion(&r, VOCAB), r.generation, None),
                Err(e) => {
                    client_error(&ApiError::field(e))?;
                    continue;
                }
            }
        };
        match params {
            Ok(p) => check_params(&p)?,
            Err(e) => client_error(&e)?,
        }
        let output = match response_format::parse(&generation) {
            Ok(spec) => spec,
            Err(e) => {
                client_error(&e)?;
                None
            }
        };
        check_limits(&output);
        if let Some(chat) = chat {
            tools(&chat, output)?;
        }
    }
    Ok(())
}

/// The tool side of a chat body: `tools` and `tool_choice`, the history, the grammar of each
/// format, and the messages adapted to templates that can and cannot show tools.
fn tools(
    request: &ChatCompletionRequest,
    output: Option<GrammarSpec>,
) -> Result<(), TestCaseError> {
    let messages = request.messages.clone().unwrap_or_default();
    if let Err(e) = tool_request::check_history(&messages) {
        client_error(&e)?;
    }
    let tools = match ToolRequest::parse(request) {
        Ok(t) => t,
        Err(e) => return client_error(&e),
    };
    let names = tools.names();
    prop_assert_eq!(names.len(), tools.tools.len());
    if let ToolChoice::Function(name) = &tools.choice {
        prop_assert!(names.contains(name));
    }
    prop_assert!(tools.choice != ToolChoice::Required || !tools.tools.is_empty());
    match tools.grammar(None, output.clone()) {
        Ok(spec) => prop_assert_eq!(spec, output.clone()),
        Err(e) => client_error(&e)?,
    }
    for format in FORMATS {
        match tools.grammar(Some(format), output.clone()) {
            Ok(spec) => check_limits(&spec),
            Err(e) => client_error(&e)?,
        }
        for shows in [false, true] {
            let caps = TemplateCaps {
                supports_string_content: true,
                supports_typed_content: shows,
                supports_system_role: true,
                supports_tools: shows,
                supports_tool_calls: shows,
                supports_tool_responses: shows,
                requires_object_arguments: shows,
            };
            let mut adapted = messages.clone();
            let handed = tools.adapt(&mut adapted, &caps, format);
            prop_assert_eq!(handed.is_some(), shows && tools.offered());
            if tools.offered() && !shows {
                prop_assert!(adapted[0]["content"].is_string(), "{:?}", adapted[0]);
            }
        }
    }
    Ok(())
}

/// Tokens a mutation of a body inserts.
const JSON_TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "\"",
    ",",
    ":",
    "null",
    "true",
    "1e999",
    "-0",
    "\\u0000",
    "\\ud800",
    "\"messages\"",
    "\"tools\"",
    "\"tool_choice\"",
    "\"response_format\"",
    "\"stop\"",
    "\"logit_bias\"",
    "\"n\"",
    "\"ebnf\"",
    "\"type\"",
    "\"function\"",
    "[[[[[[[[",
];

#[test]
fn fuzz_body_bytes() {
    fuzz(
        2000,
        || {
            prop_oneof![
                1 => vec(any::<u8>(), 0..128).prop_map(Bytes),
                3 => mutated(seeds("body"), JSON_TOKENS),
            ]
        },
        |b| front_end(&b.0),
    );
}

#[test]
fn fuzz_body_json() {
    fuzz(
        2000,
        || {
            let seeds: Vec<Value> = seeds("body")
                .iter()
                .filter_map(|s| serde_json::from_slice(s).ok())
                .collect();
            let n = seeds.len();
            let edited =
                (0..n, vec((any::<usize>(), value()), 1..4)).prop_map(move |(i, edits)| {
                    let mut v = seeds[i].clone();
                    for (k, new) in edits {
                        replace_node(&mut v, k, new);
                    }
                    v
                });
            prop_oneof![2 => body_value(), 1 => edited]
        },
        |v| front_end(v.to_string().as_bytes()),
    );
}

// ---------------------------------------------------------------------------------------------
// Target 2: the output parsers.

/// Every format's markup, whole and cut short, and the text around calls.
const MARKERS: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "<tool_ca",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[TOOL_CA",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_end|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call",
    "<|python_start|>",
    "<|python_end|>",
    "<think>",
    "</think>",
    "<thi",
    "</thin",
    "◁think▷",
    "◁/think▷",
    "◁",
    "◁/thi",
    "function",
    "functions.f:0",
    "```json\n",
    "```",
    "{\"name\": \"f\", \"arguments\": {",
    "{\"name\": \"get_weather\"",
    "\"parameters\": {}",
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    "\"",
    "'",
    "\\",
    ";",
    ",",
    ":",
    "=",
    "f(",
    "get_weather(city='x')",
    "None",
    "1.5",
    "é",
    " ",
    "\n",
    "\t",
];

/// The openers and wrappers of a format: text without them (and no call found) goes out whole.
fn markup(format: ToolFormat) -> &'static [&'static str] {
    match format {
        ToolFormat::Hermes => &["<tool_call>"],
        ToolFormat::Llama3 => &["<|python_tag|>"],
        ToolFormat::Mistral => &["[TOOL_CALLS]"],
        ToolFormat::DeepseekV3 => &[
            "<｜tool▁call▁begin｜>",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
        ],
        ToolFormat::KimiK2 => &[
            "<|tool_call_begin|>",
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
        ],
        ToolFormat::Pythonic => &["<|python_start|>", "<|python_end|>"],
    }
}

/// Model output: markers, text, whitespace and whole calls of any format, in any order; or a
/// mutated seed output.
fn output_text() -> impl Strategy<Value = String> {
    let calls = (
        select(&FORMATS[..]),
        vec((select(&["get_weather", "now", "f"][..]), value()), 1..3),
    )
        .prop_map(|(f, calls)| {
            let calls: Vec<(&str, Value)> = calls
                .into_iter()
                .map(|(n, a)| (n, if a.is_object() { a } else { json!({ "a": a }) }))
                .collect();
            let refs: Vec<(&str, &Value)> = calls.iter().map(|(n, a)| (*n, a)).collect();
            f.write_calls(&refs)
        });
    let piece = prop_oneof![
        6 => select(MARKERS).prop_map(str::to_string),
        2 => "\\PC{0,6}",
        1 => "[ \n\t]{1,3}",
        1 => calls,
    ];
    let soup = vec(piece, 0..16).prop_map(|p| p.concat());
    let seeded =
        mutated(seeds("parsers"), MARKERS).prop_map(|b| String::from_utf8_lossy(&b.0).into_owned());
    prop_oneof![3 => soup, 2 => seeded]
}

/// `text` cut at `cuts` (each moved back to a char boundary).
fn chunks<'a>(text: &'a str, cuts: &[usize]) -> Vec<&'a str> {
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|&c| {
            let mut c = c % (text.len() + 1);
            while !text.is_char_boundary(c) {
                c -= 1;
            }
            c
        })
        .collect();
    at.push(0);
    at.push(text.len());
    at.sort_unstable();
    at.dedup();
    at.windows(2).map(|w| &text[w[0]..w[1]]).collect()
}

/// Content, calls (name, arguments) and malformed calls of a parse.
type Parsed = (String, Vec<(String, String)>, usize);

/// Collects tool events, checking what the parser promises of them: calls numbered from 0,
/// each started before its arguments come, arguments a JSON object, names of offered tools.
fn collect(events: Vec<ToolEvent>, names: &[String]) -> Result<Parsed, TestCaseError> {
    let mut parsed = Parsed::default();
    for e in events {
        match e {
            ToolEvent::Content(c) => {
                prop_assert!(!c.is_empty());
                parsed.0.push_str(&c);
            }
            ToolEvent::Start { index, name, id } => {
                prop_assert_eq!(index, parsed.1.len());
                prop_assert!(!id.is_empty());
                prop_assert!(!name.is_empty() && !name.contains(char::is_whitespace));
                prop_assert!(names.is_empty() || names.contains(&name), "{}", name);
                parsed.1.push((name, String::new()));
            }
            ToolEvent::Arguments { index, fragment } => {
                prop_assert_eq!(index + 1, parsed.1.len());
                let args: Value = serde_json::from_str(&fragment)
                    .map_err(|e| TestCaseError::fail(format!("{fragment}: {e}")))?;
                prop_assert!(args.is_object(), "{}", fragment);
                parsed.1[index].1.push_str(&fragment);
            }
            ToolEvent::Malformed => parsed.2 += 1,
        }
    }
    Ok(parsed)
}

/// `pieces` through a tool parser of `format`.
fn tool_parse(
    format: ToolFormat,
    pieces: &[&str],
    names: &[String],
    max: Option<usize>,
) -> Result<Parsed, TestCaseError> {
    let mut p = ToolParser::new(format, 7).with_names(names.to_vec());
    if let Some(m) = max {
        p = p.with_max_calls(m);
    }
    let mut events: Vec<ToolEvent> = pieces.iter().flat_map(|s| p.push(s)).collect();
    events.extend(p.finish());
    let parsed = collect(events, names)?;
    prop_assert_eq!(p.calls(), parsed.1.len());
    prop_assert!(max.is_none_or(|m| parsed.1.len() <= m.max(1)));
    Ok(parsed)
}

/// Whether `small`'s chars appear in `big` in order.
fn subsequence(small: &str, big: &str) -> bool {
    let mut big = big.chars();
    small.chars().all(|c| big.any(|b| b == c))
}

fn without_whitespace(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

/// The reasoning parser's promise, written plainly: a thought opens only at the start (after
/// whitespace), ends at the first end tag, and the answer after it loses its leading whitespace.
fn reference_split(format: ReasoningFormat, inside: bool, text: &str) -> (String, String) {
    let (start, end) = match format {
        ReasoningFormat::Kimi => ("◁think▷", "◁/think▷"),
        ReasoningFormat::DeepseekR1 | ReasoningFormat::Qwen3 => ("<think>", "</think>"),
    };
    let rest = match text.trim_start().strip_prefix(start) {
        _ if inside => text,
        Some(rest) => rest,
        None => return (String::new(), text.to_string()),
    };
    match rest.find(end) {
        Some(at) => (
            rest[..at].to_string(),
            rest[at + end.len()..].trim_start().to_string(),
        ),
        None => (rest.to_string(), String::new()),
    }
}

fn reasoning_parse(format: ReasoningFormat, inside: bool, pieces: &[&str]) -> (String, String) {
    let mut p = ReasoningParser::new(format, inside);
    let mut out = (String::new(), String::new());
    let mut splits: Vec<_> = pieces.iter().map(|s| p.push(s)).collect();
    splits.push(p.finish());
    for s in splits {
        out.0.push_str(&s.reasoning);
        out.1.push_str(&s.content);
    }
    out
}

#[test]
fn fuzz_tool_parsers() {
    let names = prop_oneof![
        Just(vec![]),
        Just(vec!["get_weather".to_string(), "f".to_string()])
    ];
    let max = proptest::option::of(0usize..3);
    fuzz(
        2000,
        move || (output_text(), vec(any::<usize>(), 0..8), names, max),
        |(text, cuts, names, max)| {
            let pieces = chunks(&text, &cuts);
            for format in FORMATS {
                let whole = tool_parse(format, &[&text], &names, max)?;
                let chunked = tool_parse(format, &pieces, &names, max)?;
                prop_assert_eq!(&chunked, &whole, "{:?} in {:?}", format, pieces);
                prop_assert!(subsequence(&whole.0, &text), "{:?}: {:?}", format, whole.0);
                let marked = markup(format).iter().any(|m| text.contains(m));
                if whole.1.is_empty() && whole.2 == 0 && !marked {
                    prop_assert_eq!(without_whitespace(&whole.0), without_whitespace(&text));
                }
            }
            Ok(())
        },
    );
}

#[test]
fn fuzz_reasoning_parsers() {
    let formats = [
        ReasoningFormat::DeepseekR1,
        ReasoningFormat::Qwen3,
        ReasoningFormat::Kimi,
    ];
    fuzz(
        2000,
        || (output_text(), vec(any::<usize>(), 0..8), any::<bool>()),
        move |(text, cuts, inside)| {
            let pieces = chunks(&text, &cuts);
            for format in formats {
                let want = reference_split(format, inside, &text);
                prop_assert_eq!(
                    reasoning_parse(format, inside, &pieces),
                    want,
                    "{:?}",
                    format
                );
                let _ = format.starts_inside(&text, Some(inside));
            }
            Ok(())
        },
    );
}

#[test]
fn fuzz_chained_parsers() {
    fuzz(
        2000,
        || (output_text(), vec(any::<usize>(), 0..8), any::<bool>()),
        |(text, cuts, inside)| {
            let pieces = chunks(&text, &cuts);
            for (format, reasoning) in FORMATS.into_iter().zip(
                [
                    ReasoningFormat::Qwen3,
                    ReasoningFormat::Kimi,
                    ReasoningFormat::DeepseekR1,
                ]
                .into_iter()
                .cycle(),
            ) {
                let mut p = OutputParser::new(
                    Some(ReasoningParser::new(reasoning, inside)),
                    Some(ToolParser::new(format, 1)),
                );
                let mut outputs: Vec<Output> = pieces.iter().flat_map(|s| p.push(s)).collect();
                outputs.extend(p.finish());
                let (thought, answer) = reference_split(reasoning, inside, &text);
                let mut got = (String::new(), String::new(), Vec::new());
                for o in outputs {
                    match o {
                        Output::Reasoning(r) => got.0.push_str(&r),
                        Output::Content(c) => got.1.push_str(&c),
                        Output::ToolCall { name, .. } => got.2.push(name),
                        Output::ToolArguments { .. } | Output::MalformedToolCall => {}
                    }
                }
                prop_assert_eq!(&got.0, &thought);
                prop_assert!(subsequence(&got.1, &answer));
                prop_assert_eq!(got.2.len(), p.tool_calls());
            }
            Ok(())
        },
    );
}
