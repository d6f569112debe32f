//! Fuzz targets for chat template rendering, run as proptest tests in every `cargo test`: the
//! real templates of `testdata/fuzz/chat_template/templates` (SmolLM2's and Qwen2.5-Coder's from
//! their GGUF files, Llama 3.1's, Mistral Nemo's, Qwen 3's, DeepSeek-R1's, Gemma 2's and Kimi
//! K2's from llama.cpp's collection, and llama.cpp's ChatML) render arbitrary conversations —
//! any roles, content as a string, parts, a number, null or an object, tool calls with good and
//! bad arguments, extra keys, tools, options and template variables — and the seed
//! conversations of `testdata/fuzz/chat_template/messages` with parts replaced by random JSON.
//! A rendering may fail (as an error value), never panic or hang. Mutated templates must parse
//! or be refused the same way, and so must the nasty ones of `testdata/fuzz/chat_template/nasty`
//! (endless recursion, deep nesting, every filter). `SPECULA_FUZZ_CASES=N` runs N cases instead
//! of the default.

use super::{CHATML_TEMPLATE, ChatOptions, ChatTemplate, SpecialTokens};
use crate::gguf::fuzz_tests::{fuzz, mutated, seeds};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;
use serde_json::{Map, Value as Json, json};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// Keys of messages, tool calls and template variables.
const KEYS: &[&str] = &[
    "role",
    "content",
    "type",
    "text",
    "name",
    "tool_calls",
    "tool_call_id",
    "function",
    "arguments",
    "id",
    "reasoning_content",
    "thinking",
    "image_url",
];

/// Strings templates compare against.
const WORDS: &[&str] = &[
    "user",
    "assistant",
    "system",
    "tool",
    "ipython",
    "function",
    "text",
    "image",
    "<think>",
    "</think>",
    "{{ raise_exception('x') }}",
    "call_1",
    "abcdefghi",
    "",
    " ",
    "é",
    "\u{0}",
];

fn scalar() -> impl Strategy<Value = Json> {
    prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        any::<i64>().prop_map(Json::from),
        any::<u64>().prop_map(Json::from),
        any::<f64>().prop_map(Json::from),
        (-3i64..12).prop_map(Json::from),
        select(WORDS).prop_map(Json::from),
        ".{0,10}".prop_map(Json::String),
    ]
}

/// Any JSON, a few levels deep, its keys mostly ones the templates read.
fn value() -> BoxedStrategy<Json> {
    let key = prop_oneof![
        3 => select(KEYS).prop_map(str::to_string),
        1 => ".{0,6}",
    ];
    scalar()
        .prop_recursive(4, 32, 5, move |inner| {
            prop_oneof![
                vec(inner.clone(), 0..5).prop_map(Json::Array),
                vec((key.clone(), inner), 0..5)
                    .prop_map(|kv| Json::Object(kv.into_iter().collect())),
            ]
        })
        .boxed()
}

/// An object of `entries`, `None` values left out.
fn object(entries: Vec<(&str, Option<Json>)>) -> Json {
    Json::Object(
        entries
            .into_iter()
            .filter_map(|(k, v)| Some((k.to_string(), v?)))
            .collect(),
    )
}

fn tool_call() -> impl Strategy<Value = Json> {
    let arguments = prop_oneof![
        2 => value().prop_map(|v| Json::String(json!({"a": v}).to_string())),
        2 => value().prop_map(|v| json!({"a": v})),
        1 => select(&["{not json", "", "[1]", "null"][..]).prop_map(Json::from),
        1 => value(),
    ];
    let id = prop_oneof![
        select(&["call_1", "abcdefghi", ""][..]).prop_map(Json::from),
        value()
    ];
    let name = prop_oneof![
        3 => select(&["get_weather", "f", ""][..]).prop_map(Json::from),
        1 => value(),
    ];
    (id, name, arguments, any::<bool>()).prop_map(|(id, name, arguments, typed)| {
        let function = json!({"name": name, "arguments": arguments});
        object(vec![
            ("id", Some(id)),
            ("type", typed.then(|| json!("function"))),
            ("function", Some(function)),
        ])
    })
}

fn message() -> impl Strategy<Value = Json> {
    let role = prop_oneof![
        8 => select(&["user", "assistant", "system", "tool"][..]).prop_map(Json::from),
        2 => select(&["developer", "ipython", ""][..]).prop_map(Json::from),
        1 => value(),
    ];
    let part = prop_oneof![
        6 => ".{0,8}".prop_map(|t| json!({"type": "text", "text": t})),
        1 => Just(json!({"type": "image_url", "image_url": {"url": "x"}})),
        1 => value(),
    ];
    let content = prop_oneof![
        8 => ".{0,12}".prop_map(Json::String),
        3 => vec(part, 0..3).prop_map(Json::Array),
        1 => Just(Json::Null),
        1 => value(),
    ];
    // Mostly what a message holds; now and then a call, or a key with anything in it.
    let calls = prop_oneof![3 => Just(None), 1 => vec(tool_call(), 0..3).prop_map(Some)];
    let extra = prop_oneof![
        3 => Just(Vec::new()),
        1 => vec((select(KEYS), value()), 0..2),
    ];
    let call_id = prop_oneof![
        3 => Just(json!("call_1")),
        1 => value(),
    ];
    (
        role,
        prop_oneof![8 => content.prop_map(Some), 1 => Just(None)],
        calls,
        call_id,
        extra,
    )
        .prop_map(|(role, content, calls, call_id, extra)| {
            let tool = role == "tool";
            let mut m = object(vec![
                ("role", Some(role)),
                ("content", content),
                ("tool_calls", calls.map(Json::Array)),
                ("tool_call_id", tool.then_some(call_id)),
            ]);
            for (k, v) in extra {
                m[k] = v;
            }
            m
        })
}

fn tools() -> impl Strategy<Value = Json> {
    let function = (
        select(&["get_weather", "f", ""][..]),
        value(),
        any::<bool>(),
    )
        .prop_map(|(name, params, described)| {
            let mut f = json!({"name": name, "parameters": {"type": "object", "properties": {"a": params}}});
            if described {
                f["description"] = json!("Does things.");
            }
            json!({"type": "function", "function": f})
        });
    vec(prop_oneof![4 => function, 1 => value()], 0..3).prop_map(Json::Array)
}

/// Template variables a request may set (`chat_template_kwargs`), the server's own among them.
fn extra() -> impl Strategy<Value = Map<String, Json>> {
    let name = select(
        &[
            "enable_thinking",
            "__specula_now",
            "tools_in_user_message",
            "builtin_tools",
            "date_string",
            "strftime_now",
            "messages",
            "bos_token",
            "custom",
        ][..],
    );
    let now = prop_oneof![
        Just(Json::from(i64::MIN)),
        Just(Json::from(i64::MAX)),
        any::<i64>().prop_map(Json::from)
    ];
    vec(
        prop_oneof![
            (name, value()).prop_map(|(k, v)| (k.to_string(), v)),
            now.prop_map(|v| ("__specula_now".to_string(), v)),
        ],
        0..3,
    )
    .prop_map(|kv| kv.into_iter().collect())
}

/// Rendering options: the flags, tools, variables and (mostly a fixed) time.
fn options() -> impl Strategy<Value = ChatOptions> {
    (
        any::<(bool, bool)>(),
        proptest::option::of(any::<bool>()),
        proptest::option::of(tools()),
        extra(),
        proptest::option::of(0u64..8_000_000_000),
    )
        .prop_map(
            |((gen_prompt, prefill), thinking, tools, extra, secs)| ChatOptions {
                add_generation_prompt: gen_prompt,
                prefill_assistant: prefill,
                enable_thinking: thinking,
                tools,
                extra,
                now: Some(UNIX_EPOCH + Duration::from_secs(secs.unwrap_or(1_715_949_296))),
            },
        )
}

/// The real templates, parsed (each must parse), with a BOS and EOS to strip.
fn templates() -> Vec<ChatTemplate> {
    let tokens = SpecialTokens {
        bos_token: "<s>".into(),
        eos_token: "</s>".into(),
        add_bos: true,
        add_eos: false,
    };
    let mut sources: Vec<String> = seeds("chat_template/templates")
        .into_iter()
        .map(|s| String::from_utf8(s).expect("a template is UTF-8"))
        .collect();
    sources.push(CHATML_TEMPLATE.to_string());
    sources
        .iter()
        .map(|s| ChatTemplate::new(s, tokens.clone()).unwrap_or_else(|e| panic!("{e}: {s}")))
        .collect()
}

/// The seed conversations: their messages and their options.
fn conversations() -> Vec<(Vec<Json>, ChatOptions)> {
    seeds("chat_template/messages")
        .iter()
        .map(|s| {
            let v: Json = serde_json::from_slice(s).expect("a seed conversation is JSON");
            let opts = ChatOptions {
                add_generation_prompt: v["add_generation_prompt"].as_bool().unwrap_or(true),
                tools: v.get("tools").cloned(),
                extra: v["chat_template_kwargs"]
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
                now: Some(UNIX_EPOCH),
                ..ChatOptions::default()
            };
            (v["messages"].as_array().cloned().unwrap_or_default(), opts)
        })
        .collect()
}

/// Every template renders `messages` (an error is fine; it must say something).
fn render_all(
    templates: &[ChatTemplate],
    messages: &[Json],
    opts: &ChatOptions,
) -> Result<(), TestCaseError> {
    for t in templates {
        if let Err(e) = t.render(messages, opts) {
            prop_assert!(!e.to_string().is_empty());
        }
    }
    Ok(())
}

#[test]
fn fuzz_chat_templates_random_conversations() {
    let templates = templates();
    fuzz(
        2000,
        || (vec(message(), 0..6), options()),
        move |(messages, opts)| render_all(&templates, &messages, &opts),
    );
}

#[test]
fn fuzz_chat_templates_edited_seed_conversations() {
    let templates = Arc::new(templates());
    let seeds = conversations();
    fuzz(
        2000,
        move || {
            let n = seeds.len();
            (0..n, vec((any::<usize>(), any::<usize>(), message()), 0..3)).prop_map(
                move |(i, edits)| {
                    let (mut messages, opts) = seeds[i].clone();
                    for (at, key, new) in edits {
                        // Replace a message, or one of its keys, or add one.
                        match messages.len() {
                            0 => messages.push(new),
                            len if key % 3 == 0 => messages[at % len] = new,
                            len if key % 3 == 1 => messages.insert(at % (len + 1), new),
                            len => {
                                let k = KEYS[key % KEYS.len()];
                                let m = &mut messages[at % len];
                                if m.is_object() {
                                    m[k] = new[k].clone();
                                }
                            }
                        }
                    }
                    (messages, opts)
                },
            )
        },
        move |(messages, opts)| render_all(&templates, &messages, &opts),
    );
}

/// Pieces of Jinja a mutation inserts. None multiplies the template's own work (`* 99999`,
/// `range(100000)`): a template that writes gigabytes is slow by its author's choice, and the
/// template comes with the model, not with the request.
const JINJA: &[&str] = &[
    "{{",
    "}}",
    "{%",
    "%}",
    "{#",
    "#}",
    "{% for m in messages %}",
    "{% endfor %}",
    "{% if",
    "{% endif %}",
    "{{ messages[0].content }}",
    "|tojson",
    "|tojson(indent=-1)",
    "raise_exception('x')",
    "strftime_now('%Y %Q %')",
    "loop.index",
    "[::-1]",
    "* 2",
    "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}",
    "range(3)",
];

#[test]
fn fuzz_mutated_templates() {
    let conversations = conversations();
    fuzz(
        1000,
        || {
            let mut sources = seeds("chat_template/templates");
            sources.extend(seeds("chat_template/nasty"));
            mutated(sources, JINJA)
        },
        move |source| {
            let source = String::from_utf8_lossy(&source.0);
            let Ok(t) = ChatTemplate::new(&source, SpecialTokens::default()) else {
                return Ok(());
            };
            for (messages, opts) in &conversations {
                let _ = t.render(messages, opts);
            }
            Ok(())
        },
    );
}
