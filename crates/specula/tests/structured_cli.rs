//! Structured outputs end to end: the real binary and model on loopback, asked for JSON under a
//! table of schemas (streamed and not, greedy and sampled, chat and completions), for any JSON
//! object, a regex, a GBNF grammar and a structural tag. Every answer that ends by itself
//! validates; an answer cut by `max_tokens` says `length`; bad schemas, grammars and structural
//! tags are 400s before anything runs; and
//! with speculation (EAGLE-3 and n-gram) and grammar-forced drafts the greedy text under a
//! grammar is plain decoding's, eight requests at once, and sampled text has its distribution;
//! forced tool calls name an offered function with valid arguments, and under `tool_choice` auto
//! a strict function's calls are valid while text stays text.

mod common;

use common::server::*;
use common::stats::{same_distribution, sample_prefixes};
use serde_json::{Value, json};

/// Schemas of the shapes applications send: nested objects, bounded arrays, enums, patterns,
/// ranged numbers, anyOf and nullable fields. Strings are bounded so a sampled answer ends.
fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120}},
            "required": ["name", "age"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 20},
            "country": {"type": "object", "properties": {
                "name": {"type": "string", "maxLength": 20},
                "code": {"type": "string", "pattern": "^[A-Z]{2}$"}},
                "required": ["name", "code"], "additionalProperties": false}},
            "required": ["city", "country"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "colors": {"type": "array", "items": {"enum": ["red", "green", "blue", "yellow"]},
                "minItems": 2, "maxItems": 3}},
            "required": ["colors"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "temperature": {"type": "number", "minimum": -50, "maximum": 60},
            "unit": {"enum": ["C", "F"]},
            "note": {"anyOf": [{"type": "string", "maxLength": 15}, {"type": "null"}]}},
            "required": ["temperature", "unit", "note"], "additionalProperties": false}),
    ]
}

fn prompts() -> [&'static str; 4] {
    [
        "Describe a person called Ana who is 31, as JSON.",
        "Where is Paris? Answer as JSON.",
        "Name some colours of the rainbow, as JSON.",
        "What is the weather like in Madrid today? Answer as JSON.",
    ]
}

fn format(schema: &Value) -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": true}})
}

/// A chat answer's content and finish reason from the chat route at `url`, streamed or not.
async fn answer(url: &str, body: Value) -> (String, String) {
    if body["stream"] != json!(true) {
        let (status, v) = post(url, body).await;
        assert_eq!(status, 200, "{v}");
        let choice = &v["choices"][0];
        let content = choice["message"]["content"].as_str().unwrap_or_default();
        eprintln!("DEBUG {v}");
        return (
            content.to_string(),
            choice["finish_reason"].as_str().unwrap().into(),
        );
    }
    let r = client().post(url).json(&body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let (mut content, mut finish) = (String::new(), String::new());
    for e in sse_events(r).await.iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap();
        let choice = &v["choices"][0];
        content.push_str(choice["delta"]["content"].as_str().unwrap_or_default());
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (content, finish)
}

fn assert_valid(schema: &Value, content: &str) {
    let value: Value =
        serde_json::from_str(content).unwrap_or_else(|e| panic!("{content:?} is not JSON: {e}"));
    let validator = jsonschema::validator_for(schema).unwrap();
    assert!(
        validator.is_valid(&value),
        "{content} does not satisfy {schema}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_validates_streamed_or_not_greedy_or_sampled() {
    let server = Server::start(&[]);
    for (schema, prompt) in schemas().iter().zip(prompts()) {
        for stream in [false, true] {
            for temperature in [0.0, 1.0] {
                let body = chat_body(
                    prompt,
                    json!({"response_format": format(schema), "max_tokens": 200,
                           "temperature": temperature, "seed": 7, "stream": stream}),
                );
                let (content, finish) = answer(&server.url("/v1/chat/completions"), body).await;
                assert_eq!(finish, "stop", "{content}");
                assert_valid(schema, &content);
            }
        }
    }
    // Two sampled choices of one request, each under its own copy of the grammar.
    let body = chat_body(
        prompts()[0],
        json!({"response_format": format(&schemas()[0]), "max_tokens": 200, "n": 2, "seed": 3}),
    );
    let (status, v) = post(&server.url("/v1/chat/completions"), body).await;
    assert_eq!(status, 200, "{v}");
    for c in v["choices"].as_array().unwrap() {
        assert_valid(&schemas()[0], c["message"]["content"].as_str().unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_object_regex_ebnf_and_completions_follow_their_format() {
    let server = Server::start(&[]);
    let body = chat_body(
        "Return a JSON object with the keys city and country for Paris.",
        json!({"response_format": {"type": "json_object"}, "max_tokens": 200, "temperature": 0}),
    );
    let (content, finish) = answer(&server.url("/v1/chat/completions"), body).await;
    let value: Value = serde_json::from_str(&content).unwrap_or_else(|e| panic!("{content}: {e}"));
    assert!(value.is_object() && finish == "stop", "{content}");

    let body = chat_body(
        "Is the sky blue? Answer and rate your confidence.",
        json!({"regex": "(yes|no), [0-9]{1,2}%", "max_tokens": 20, "temperature": 0}),
    );
    let (content, _) = answer(&server.url("/v1/chat/completions"), body).await;
    let re = regex::Regex::new("^(yes|no), [0-9]{1,2}%$").unwrap();
    assert!(re.is_match(&content), "{content:?}");

    let gbnf =
        "root ::= animal \" \" count\nanimal ::= \"cat\" | \"dog\"\ncount ::= [1-9] [0-9]?\n";
    let body = chat_body(
        "Name a pet and how many legs it has.",
        json!({"ebnf": gbnf, "max_tokens": 20, "temperature": 1, "seed": 1}),
    );
    let (content, _) = answer(&server.url("/v1/chat/completions"), body).await;
    let re = regex::Regex::new("^(cat|dog) [1-9][0-9]?$").unwrap();
    assert!(re.is_match(&content), "{content:?}");

    // SGLang's structural tag: free text, and JSON under its schema inside each tag.
    let city = json!({"type": "object", "properties": {"city": {"enum": ["Rome", "Oslo"]}},
        "required": ["city"], "additionalProperties": false});
    let tag = json!({"type": "structural_tag", "triggers": ["<lookup>"], "structures": [
        {"begin": "<lookup>", "schema": city, "end": "</lookup>"}]});
    let prompt = "Example: <lookup>{\"city\": \"Rome\"}</lookup>\nExample: <lookup>{\"city\": \"Oslo\"}</lookup>\nExample:";
    let body =
        json!({"prompt": prompt, "max_tokens": 40, "temperature": 0, "response_format": tag});
    let (status, v) = post(&server.url("/v1/completions"), body).await;
    assert_eq!(status, 200, "{v}");
    let text = v["choices"][0]["text"].as_str().unwrap();
    let tagged: Vec<&str> = text.split("<lookup>").skip(1).collect();
    assert!(!tagged.is_empty(), "{text:?}");
    for part in tagged {
        // The last may be cut by max_tokens.
        if let Some((json, _)) = part.split_once("</lookup>") {
            assert_valid(&city, json);
        }
    }

    let body = json!({"prompt": "The capital of France, as JSON:", "max_tokens": 100,
        "temperature": 0, "response_format": format(&schemas()[1])});
    let (status, v) = post(&server.url("/v1/completions"), body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_valid(&schemas()[1], v["choices"][0]["text"].as_str().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_formats_are_400s_and_cut_answers_say_length() {
    let server = Server::start(&[]);
    let url = server.url("/v1/chat/completions");
    let cases = [
        (json!({"response_format": {"type": "xml"}}), "not supported"),
        (
            json!({"response_format": {"type": "json_schema"}}),
            "json_schema",
        ),
        (
            json!({"response_format": format(&json!({"type": "integr"}))}),
            "cannot be used",
        ),
        (
            json!({"response_format": format(&json!({"type": "integer", "minimum": 5, "maximum": 1}))}),
            "cannot be used",
        ),
        (
            json!({"response_format": format(&json!({"type": "string", "pattern": "(open"}))}),
            "cannot be used",
        ),
        (json!({"regex": "(a"}), "cannot be used"),
        (json!({"ebnf": "root ::= \"open"}), "GBNF"),
        (json!({"regex": "a", "ebnf": "root ::= \"a\""}), "one of"),
        (
            json!({"response_format": {"type": "structural_tag", "triggers": ["<a>"],
                "structures": [{"begin": "<b>", "schema": {}, "end": "</b>"}]}}),
            "none of the `triggers`",
        ),
    ];
    for (extra, expect) in cases {
        let (status, v) = post(&url, chat_body("Hi", extra.clone())).await;
        assert_eq!(status, 400, "{extra} gave {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(expect), "{extra}: {message}");
    }
    // A cut answer is not passed off as complete.
    let body = chat_body(
        prompts()[0],
        json!({"response_format": format(&schemas()[0]), "max_tokens": 4, "temperature": 0}),
    );
    let (content, finish) = answer(&server.url("/v1/chat/completions"), body).await;
    assert_eq!(finish, "length", "{content}");
    // The server still serves.
    let (status, _) = post(&url, chat_body("Hi", json!({"max_tokens": 2}))).await;
    assert_eq!(status, 200);
}

/// The greedy answers to every schema of the table, streamed and not, all eight requests at
/// once (batched together, their masks computed together).
async fn greedy_answers(server: &Server) -> Vec<String> {
    let mut tasks = Vec::new();
    for stream in [false, true] {
        for (schema, prompt) in schemas().iter().zip(prompts()) {
            let body = chat_body(
                prompt,
                json!({"response_format": format(schema), "max_tokens": 120, "temperature": 0,
                       "stream": stream}),
            );
            let url = server.url("/v1/chat/completions");
            tasks.push(tokio::spawn(async move { answer(&url, body).await.0 }));
        }
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculation_and_forced_drafts_keep_the_greedy_text_under_a_grammar() {
    let plain = greedy_answers(&Server::start(&["--disable-grammar-forced-drafts"])).await;
    for args in [
        &[][..],
        &[
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-adaptive",
            "false",
        ][..],
        &[
            "--speculative-algorithm",
            "NGRAM",
            "--speculative-adaptive",
            "false",
            "--speculative-num-draft-tokens",
            "4",
        ][..],
    ] {
        let server = Server::start(args);
        assert_eq!(greedy_answers(&server).await, plain, "{args:?}");
        let verified = metric(&server, "spec_verifications_total").await;
        let forced = metric(&server, "grammar_forced_accepted_tokens_total").await;
        match args.get(1) {
            // Every sequence has the head's drafts.
            Some(&"EAGLE3") => assert!(verified > 0.0 && forced == 0.0, "{verified} {forced}"),
            // Sequences without an n-gram match draft what their grammar forces.
            _ => assert!(forced > 0.0, "{args:?}: no forced draft accepted"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_output_under_a_grammar_keeps_its_distribution_with_drafts() {
    // "Answer:" is forced (a forced draft, then the sampled choice on the row after it; with
    // EAGLE-3 the head's chains cut by the grammar and verified by speculative sampling): the
    // first four tokens at temperature 1, 1,280 samples each, against plain sampling's by χ².
    let body = json!({"prompt": "Is the sea salty? Reply in one word.\n",
                      "regex": "Answer: (yes|no|maybe|perhaps|never|always)[.!,]",
                      "max_tokens": 8, "n": 16, "temperature": 1.0, "logprobs": 0});
    let plain = Server::start(&["--disable-grammar-forced-drafts"]);
    let a = sample_prefixes(&plain.url("/v1/completions"), &body, 8, 4).await;
    drop(plain);
    for args in [
        &[][..],
        &[
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-adaptive",
            "false",
        ][..],
    ] {
        let server = Server::start(args);
        let b = sample_prefixes(&server.url("/v1/completions"), &body, 8, 4).await;
        let drafted = metric(&server, "grammar_forced_accepted_tokens_total").await
            + metric(&server, "spec_accepted_tokens_total").await;
        assert!(drafted > 100.0, "{args:?}: {drafted} drafts accepted");
        same_distribution(&a, &b);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_and_strict_tool_calls_have_arguments_valid_for_their_function() {
    let server = Server::start(&["--tool-call-parser", "hermes"]);
    let weather = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": false});
    let time = json!({"type": "object", "properties": {
        "timezone": {"type": "string", "pattern": "^[A-Z][a-z]{2,12}/[A-Z][a-z]{2,12}$"}},
        "required": ["timezone"], "additionalProperties": false});
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": weather, "strict": true}},
        {"type": "function", "function": {"name": "get_time", "parameters": time}}
    ]);
    let choices = [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_time"}}),
    ];
    for (k, choice) in choices.iter().enumerate() {
        for seed in 0..3 {
            let body = chat_body(
                "What is the weather in Paris, and what time is it there?",
                json!({"tools": tools, "tool_choice": choice, "max_tokens": 100,
                       "temperature": 1, "seed": seed}),
            );
            let (status, v) = post(&server.url("/v1/chat/completions"), body).await;
            assert_eq!(status, 200, "{v}");
            let choice = &v["choices"][0];
            assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
            let call = &choice["message"]["tool_calls"][0]["function"];
            let name = call["name"].as_str().unwrap();
            let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
            let schema = if name == "get_weather" {
                &weather
            } else {
                &time
            };
            assert!(k == 0 || name == "get_time", "{v}");
            assert!(
                jsonschema::validator_for(schema).unwrap().is_valid(&args),
                "{v}"
            );
        }
    }
    // `auto` with a strict function: text stays text; calls are valid, one at most here. A
    // first call in the history shows the small model how (unconstrained, it also writes
    // calls that do not parse).
    let strict = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Current weather in a city", "parameters": weather, "strict": true}}]);
    let history = json!([
        {"role": "user", "content": "What is the weather in Rome?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "20 C, sunny"},
        {"role": "assistant", "content": "It is 20 C and sunny in Rome."}]);
    let mut calls = 0;
    let asks = (0..9).map(|seed| ("What is the weather in Paris?", seed));
    for (prompt, seed) in asks.chain([("Say hello to me.", 0)]) {
        let mut messages = history.as_array().unwrap().clone();
        messages.push(json!({"role": "user", "content": prompt}));
        let temperature = if seed == 0 { 0 } else { 1 };
        let body = json!({"messages": messages, "tools": strict, "parallel_tool_calls": false,
            "max_tokens": 80, "temperature": temperature, "seed": seed});
        let (status, v) = post(&server.url("/v1/chat/completions"), body).await;
        assert_eq!(status, 200, "{v}");
        let choice = &v["choices"][0];
        let content = choice["message"]["content"].as_str().unwrap_or_default();
        assert!(!content.contains("<tool_call>"), "{v}");
        let Some(list) = choice["message"]["tool_calls"].as_array() else {
            continue;
        };
        assert_eq!(
            (list.len(), &choice["finish_reason"]),
            (1, &json!("tool_calls")),
            "{v}"
        );
        let args: Value =
            serde_json::from_str(list[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(
            jsonschema::validator_for(&weather).unwrap().is_valid(&args),
            "{v}"
        );
        calls += 1;
    }
    assert!((1..10).contains(&calls), "{calls} calls of 10 answers");
}
