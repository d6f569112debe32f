//! End-to-end tests of tool calls and reasoning output: the real binary with the real model on
//! loopback, its output scripted (`--scripted-output`, tests/fixtures/tool_script.json) so that
//! what the parsers see is known, and once unscripted to show the real model's output passes
//! through them unharmed.

use serde_json::{Value, json};
use std::path::PathBuf;

mod common;
use common::server::*;

fn script() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tool_script.json")
        .display()
        .to_string()
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time", "description": "The time now."}}
    ])
}

fn ask(content: &str, extra: Value) -> Value {
    let mut body = chat_body(content, json!({"tools": tools(), "max_tokens": 120}));
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// A streamed choice: reasoning, content, calls as (id, name, arguments), finish_reason.
type Replayed = (String, String, Vec<(String, String, String)>, String);

/// One choice's output rebuilt from stream deltas, checking the deltas' shape on the way; with
/// `no_markup`, that no content delta carries any piece of call or thought markup.
fn replay(events: &[String], no_markup: bool) -> Replayed {
    let (mut reasoning, mut content, mut calls, mut finish) = (
        String::new(),
        String::new(),
        Vec::<(String, String, String)>::new(),
        String::new(),
    );
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        let choice = &v["choices"][0];
        let delta = &choice["delta"];
        if let Some(t) = delta["content"].as_str() {
            for markup in ["<tool_call>", "</tool_call>", "<think>", "</think>", "{\""] {
                assert!(
                    !(no_markup && t.contains(markup)),
                    "markup in a content delta: {e}"
                );
            }
            content.push_str(t);
        }
        if let Some(t) = delta["reasoning_content"].as_str() {
            reasoning.push_str(t);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap() as usize;
            if let Some(id) = call["id"].as_str() {
                // A call's first delta: a new index, its id, type and name, no arguments yet.
                assert_eq!(index, calls.len(), "{e}");
                assert_eq!(call["type"], "function", "{e}");
                assert_eq!(call["function"]["arguments"], "", "{e}");
                let name = call["function"]["name"].as_str().unwrap().to_string();
                calls.push((id.to_string(), name, String::new()));
            } else {
                assert!(call["function"].get("name").is_none(), "{e}");
                calls[index]
                    .2
                    .push_str(call["function"]["arguments"].as_str().unwrap());
            }
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (reasoning, content, calls, finish)
}

async fn stream_chat(s: &Server, body: Value) -> Vec<String> {
    let mut body = body;
    body["stream"] = json!(true);
    let r = client()
        .post(s.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    sse_events(r).await
}

#[tokio::test]
async fn scripted_tool_calls_and_reasoning_streamed_or_not() {
    // N-gram speculation on: drafts are verified against the scripted tokens too.
    let s = Server::start(&[
        "--tool-call-parser",
        "hermes",
        "--reasoning-parser",
        "qwen3",
        "--scripted-output",
        &script(),
        "--speculative-algorithm",
        "NGRAM",
        "--speculative-adaptive",
        "false",
    ]);
    let url = s.url("/v1/chat/completions");
    let (status, r) = post(&url, ask("What is the weather in Zürich?", json!({}))).await;
    assert_eq!(status, 200, "{r}");
    let choice = &r["choices"][0];
    let message = &choice["message"];
    assert_eq!(choice["finish_reason"], "tool_calls");
    // The call written while thinking stays in the thought.
    assert_eq!(
        message["reasoning_content"],
        "Maybe <tool_call>{\"name\": \"draft\"}</tool_call> first."
    );
    assert_eq!(message["content"], "Let me check.");
    let calls = message["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{message}");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(calls[0]["function"]["arguments"], r#"{"city":"Zürich"}"#);
    assert_eq!(calls[1]["function"]["name"], "get_time");
    assert_eq!(calls[1]["function"]["arguments"], "{}");
    let ids: Vec<&str> = calls.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert!(ids.iter().all(|id| id.starts_with("call_")) && ids[0] != ids[1]);

    // Streamed: the same message, from deltas that never carry markup.
    let events = stream_chat(&s, ask("What is the weather in Zürich?", json!({}))).await;
    let (reasoning, content, streamed, finish) = replay(&events, true);
    assert_eq!(reasoning, message["reasoning_content"].as_str().unwrap());
    assert_eq!(content, "Let me check.");
    assert_eq!(finish, "tool_calls");
    let names: Vec<(&str, &str)> = streamed
        .iter()
        .map(|(_, n, a)| (n.as_str(), a.as_str()))
        .collect();
    assert_eq!(
        names,
        [("get_weather", r#"{"city":"Zürich"}"#), ("get_time", "{}")]
    );

    // One call at most.
    let (_, r) = post(
        &url,
        ask(
            "What is the weather in Zürich?",
            json!({"parallel_tool_calls": false}),
        ),
    )
    .await;
    assert_eq!(
        r["choices"][0]["message"]["tool_calls"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(r["choices"][0]["finish_reason"], "tool_calls");

    // A named tool_choice: the prompt opens that call, the model writes its arguments.
    let named = json!({"type": "function", "function": {"name": "get_time"}});
    let (_, r) = post(&url, ask("What time is it?", json!({"tool_choice": named}))).await;
    let calls = &r["choices"][0]["message"]["tool_calls"];
    assert_eq!(calls[0]["function"]["name"], "get_time", "{r}");
    assert_eq!(calls[0]["function"]["arguments"], "{}");

    // A malformed call is content, counted; never an error.
    let before = metric(&s, "tool_call_parse_errors_total").await;
    let (status, r) = post(&url, ask("MALFORMED please", json!({}))).await;
    assert_eq!(status, 200);
    assert_eq!(
        r["choices"][0]["message"]["content"],
        "<tool_call>{\"name\": get_weather}</tool_call>"
    );
    assert!(r["choices"][0]["message"].get("tool_calls").is_none());
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        metric(&s, "tool_call_parse_errors_total").await,
        before + 1.0
    );

    // tool_choice none: no tools in the prompt, and the output is not parsed for calls.
    let (_, r) = post(&url, ask("RAW", json!({"tool_choice": "none"}))).await;
    let m = &r["choices"][0]["message"];
    assert!(
        m["content"].as_str().unwrap().contains("<tool_call>"),
        "{m}"
    );
    assert_eq!(m["reasoning_content"], "hmm");
    // separate_reasoning false: the thought stays in the content.
    let (_, r) = post(&url, ask("RAW", json!({"separate_reasoning": false}))).await;
    let m = &r["choices"][0]["message"];
    assert_eq!(m["content"], "<think>hmm</think>Sure:", "{m}");
    assert_eq!(
        m["tool_calls"][0]["function"]["arguments"],
        r#"{"city":"Paris"}"#
    );

    // The tool's result in the history: the final answer.
    let history = json!([
        {"role": "user", "content": "What is the weather in Zürich?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature_c\": 22}"}
    ]);
    let (_, r) = post(&url, json!({"messages": history, "tools": tools()})).await;
    assert_eq!(
        r["choices"][0]["message"]["content"],
        "It is 22 °C and sunny in Zürich."
    );
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    assert!(metric(&s, "tool_calls_total").await >= 6.0);

    // Bad tool requests are 400s naming the parameter.
    for (extra, param) in [
        (
            json!({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "1"}]}),
            "messages",
        ),
        (json!({"tools": "get_weather"}), "tools"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "bad name"}}]}),
            "tools",
        ),
        (json!({"tool_choice": "sometimes"}), "tool_choice"),
        (
            json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
    ] {
        let (status, r) = post(&url, ask("hi", extra.clone())).await;
        assert_eq!(status, 400, "{extra}: {r}");
        assert_eq!(r["error"]["param"], param, "{extra}: {r}");
    }
}

#[tokio::test]
async fn the_real_model_with_tools_and_both_parsers_answers_streamed_or_not() {
    let s = Server::start(&[
        "--tool-call-parser",
        "hermes",
        "--reasoning-parser",
        "qwen3",
    ]);
    let url = s.url("/v1/chat/completions");
    let body = ask(
        "What is the weather in Paris?",
        json!({"temperature": 0, "max_tokens": 48}),
    );
    let (status, r) = post(&url, body.clone()).await;
    assert_eq!(status, 200, "{r}");
    let choice = &r["choices"][0];
    let finish = choice["finish_reason"].as_str().unwrap();
    assert!(["stop", "length", "tool_calls"].contains(&finish), "{r}");
    let calls = choice["message"]["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    // tool_calls means calls; calls can also end with `length` (max_tokens after a call).
    assert!(finish != "tool_calls" || !calls.is_empty(), "{r}");
    for c in &calls {
        assert!(["get_weather", "get_time"].contains(&c["function"]["name"].as_str().unwrap()));
        let args: Value =
            serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(args.is_object(), "{c}");
    }
    // Greedy: the stream rebuilds the same message.
    let (reasoning, content, streamed, stream_finish) = replay(&stream_chat(&s, body).await, false);
    assert_eq!(stream_finish, finish);
    assert_eq!(content, choice["message"]["content"].as_str().unwrap_or(""));
    assert_eq!(
        reasoning,
        choice["message"]["reasoning_content"]
            .as_str()
            .unwrap_or("")
    );
    assert_eq!(streamed.len(), calls.len());

    // `required` opens a call for the model to complete; the request succeeds either way.
    let (status, r) = post(
        &url,
        ask(
            "Weather in Rome?",
            json!({"temperature": 0, "max_tokens": 32, "tool_choice": "required"}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    // Without tools the parsers change nothing: the plain answer is the content.
    let (_, plain) = post(
        &url,
        chat_body(
            "Name the capital city of France.",
            json!({"temperature": 0, "max_tokens": 16}),
        ),
    )
    .await;
    assert!(
        plain["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .contains("Paris"),
        "{plain}"
    );
}
