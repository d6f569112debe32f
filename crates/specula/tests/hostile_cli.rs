//! Hostile input against the real server (issue 43): every request that once aborted the
//! process, answered 5xx, held memory for good or was silently half-read is replayed, and each
//! must get its 4xx naming what was wrong while `/health` keeps answering quickly and the
//! server's memory stays bounded.

mod common;

use common::server::{Server, chat_body, client, metric, post};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// A process's resident memory now and at its peak (`/proc/PID/status`), bytes.
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = |key: &str| -> u64 {
        let line = status.lines().find(|l| l.starts_with(key)).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            << 10
    };
    (kib("VmRSS:"), kib("VmHWM:"))
}

/// `/health` answers 200 within 100 ms.
async fn healthy(s: &Server) {
    let t = Instant::now();
    let r = client()
        .get(s.url("/health"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let took = t.elapsed();
    assert!(took < Duration::from_millis(100), "/health took {took:?}");
}

/// The error a request got: its status, `param` and message.
async fn refused(url: &str, body: &Value) -> (u16, Value, String) {
    let r = client()
        .post(url)
        .json(body)
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    let message = v["error"]["message"].as_str().unwrap_or("").to_string();
    (status, v["error"]["param"].clone(), message)
}

fn right_recursive_ebnf(rules: usize) -> String {
    let mut g = String::from("root ::= r0\n");
    for i in 0..rules {
        g.push_str(&format!("r{i} ::= \"a\" r{}\n", i + 1));
    }
    g.push_str(&format!("r{rules} ::= \"a\"\n"));
    g
}

fn ref_chain(defs: usize) -> Value {
    let mut d = serde_json::Map::new();
    for i in 0..defs {
        d.insert(
            format!("d{i}"),
            json!({"type": "object", "properties": {"x": {"$ref": format!("#/$defs/d{}", i + 1)}}}),
        );
    }
    d.insert(format!("d{defs}"), json!({"type": "string"}));
    json!({"$ref": "#/$defs/d0", "$defs": d})
}

fn wide_schema(properties: usize) -> Value {
    let props: serde_json::Map<String, Value> = (0..properties)
        .map(|i| (format!("p{i}"), json!({"type": "integer"})))
        .collect();
    json!({"type": "object", "properties": props})
}

fn schema_format(schema: Value) -> Value {
    json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}, "max_tokens": 8})
}

/// The grammar attacks: each a small request that once aborted the process or answered 500,
/// and the parameter its 400 names (`None`: it is within the limits and is served).
fn grammar_attacks() -> Vec<(&'static str, Value, Option<&'static str>)> {
    let alternatives: Vec<String> = (0..10_000).map(|i| format!("\"w{i}\"")).collect();
    let structures: Vec<Value> = (0..10_000)
        .map(|i| json!({"begin": format!("<f{i}>"), "schema": {"type": "object"}, "end": "</f>"}))
        .collect();
    let strict_tool = json!({"type": "function", "function": {"name": "f", "strict": true,
        "parameters": wide_schema(7_000)}});
    vec![
        (
            "800-rule right-recursive EBNF",
            json!({"ebnf": right_recursive_ebnf(800), "max_tokens": 8}),
            None,
        ),
        (
            "10k-alternative EBNF",
            json!({"ebnf": format!("root ::= {}\n", alternatives.join(" | ")), "max_tokens": 8}),
            Some("ebnf"),
        ),
        (
            "300-deep $ref chain",
            schema_format(ref_chain(300)),
            Some("response_format"),
        ),
        (
            "7,000 properties",
            schema_format(wide_schema(7_000)),
            Some("response_format"),
        ),
        (
            "5 MB schema",
            schema_format(json!({"type": "object", "description": "d".repeat(5 << 20)})),
            Some("response_format"),
        ),
        (
            "10k structural tags",
            json!({"response_format": {"type": "structural_tag", "structures": structures,
                "triggers": ["<f"]}, "max_tokens": 8}),
            Some("response_format"),
        ),
        (
            "1 MB regex",
            json!({"regex": format!("({})", "ab|".repeat(350_000)), "max_tokens": 8}),
            Some("regex"),
        ),
        (
            "strict tool of 7,000 properties",
            json!({"tools": [strict_tool], "tool_choice": "required", "max_tokens": 8}),
            Some("tools"),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn grammar_attacks_are_400s_and_the_server_stays_up() {
    let s = Server::start(&["--tool-call-parser", "hermes"]);
    let pid = s.child.id();
    let chat = s.url("/v1/chat/completions");
    let (rss_before, _) = memory(pid);
    for round in 0..2 {
        for (what, extra, param) in grammar_attacks() {
            for stream in [false, true] {
                let mut body = chat_body("hi", extra.clone());
                body["stream"] = json!(stream);
                let (status, got, message) = refused(&chat, &body).await;
                let Some(param) = param else {
                    assert_eq!(status, 200, "{what} (stream {stream}): {message}");
                    continue;
                };
                assert_eq!(status, 400, "{what} (stream {stream}): {message}");
                assert_eq!(got, param, "{what}: {message}");
                assert!(!message.is_empty(), "{what}");
                if round == 0 && !stream {
                    eprintln!("{what}: {message}");
                }
            }
            healthy(&s).await;
        }
    }
    // Eight concurrent different big regexes within the limits are compiled or refused, and
    // leave no memory behind beyond the bounded cache.
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let url = chat.clone();
            let rx = format!("({})", format!("x{i}|").repeat(2_000)) + "y";
            tokio::spawn(async move {
                refused(
                    &url,
                    &chat_body("hi", json!({"regex": rx, "max_tokens": 4})),
                )
                .await
            })
        })
        .collect();
    for t in tasks {
        let (status, _, message) = t.await.unwrap();
        assert!(status == 200 || status == 400, "{status}: {message}");
    }
    healthy(&s).await;
    let (rss_after, _) = memory(pid);
    assert!(
        rss_after < rss_before + (300 << 20),
        "RSS grew from {rss_before} to {rss_after}"
    );
    // A realistic schema still works.
    let (status, v) = post(
        &chat,
        chat_body("Describe Ana, 31.", schema_format(wide_schema(40))),
    )
    .await;
    assert_eq!(status, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn huge_prompts_are_refused_at_once_without_memory_blowing_up() {
    let s = Server::start(&[]);
    let pid = s.child.id();
    let big = "word ".repeat(3 << 20); // 15 MB
    let t = Instant::now();
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let url = s.url(if i % 2 == 0 {
                "/v1/chat/completions"
            } else {
                "/v1/completions"
            });
            let body = if i % 2 == 0 {
                chat_body(&big, json!({"max_tokens": 4}))
            } else {
                json!({"prompt": big, "max_tokens": 4})
            };
            tokio::spawn(async move {
                let t = Instant::now();
                let got = refused(&url, &body).await;
                (got, t.elapsed())
            })
        })
        .collect();
    for task in tasks {
        let ((status, param, message), took) = task.await.unwrap();
        // 503 is the memory budget refusing a concurrent one; 400 the prompt's length.
        assert!(status == 400 || status == 503, "{status}: {message}");
        if status == 400 {
            assert!(param == "messages" || param == "prompt", "{param}");
            assert!(message.contains("bytes"), "{message}");
        }
        assert!(took < Duration::from_secs(2), "refused after {took:?}");
    }
    eprintln!("six 15 MB prompts refused in {:?}", t.elapsed());
    let (_, peak) = memory(pid);
    assert!(peak < 1_500 << 20, "peak RSS {peak}");
    healthy(&s).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_that_can_never_fit_is_a_400_before_anything_runs() {
    let s = Server::start(&["--max-running-requests", "4", "--max-queued-requests", "8"]);
    let before = metric(&s, "prompt_tokens_total").await;
    let prompts: Vec<String> = (0..1_000).map(|i| format!("prompt {i}")).collect();
    let (status, param, message) = refused(
        &s.url("/v1/completions"),
        &json!({"prompt": prompts, "max_tokens": 2}),
    )
    .await;
    assert_eq!((status, param.as_str()), (400, Some("prompt")), "{message}");
    let (status, param, _) = refused(
        &s.url("/v1/chat/completions"),
        &chat_body("hi", json!({"n": 16})),
    )
    .await;
    assert_eq!((status, param.as_str()), (400, Some("n")));
    assert_eq!(metric(&s, "prompt_tokens_total").await, before);
    healthy(&s).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn no_field_is_silently_ignored() {
    let s = Server::start(&[]);
    let chat = s.url("/v1/chat/completions");
    let completions = s.url("/v1/completions");
    for (url, extra, param) in [
        (
            &chat,
            json!({"chat_template": "{{ messages }}"}),
            "chat_template",
        ),
        (
            &chat,
            json!({"chat_template_kwargs": {"messages": []}}),
            "chat_template_kwargs",
        ),
        (&chat, json!({"best_of": 2}), "best_of"),
        (
            &chat,
            json!({"reasoning_effort": "low"}),
            "reasoning_effort",
        ),
        (&chat, json!({"no_such_field": 1}), "no_such_field"),
        (&chat, json!({"logit_bias": {"999999999": 5}}), "logit_bias"),
        (&completions, json!({"suffix": "end"}), "suffix"),
        (&completions, json!({"best_of": 1, "n": 2}), "best_of"),
        (&completions, json!({"echo": true, "logprobs": 1}), "echo"),
    ] {
        let mut body = if url == &chat {
            chat_body("hi", json!({"max_tokens": 2}))
        } else {
            json!({"prompt": "hi", "max_tokens": 2})
        };
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (status, got, message) = refused(url, &body).await;
        assert_eq!(
            (status, got.as_str()),
            (400, Some(param)),
            "{extra}: {message}"
        );
        assert!(message.contains(param), "{message}");
    }
    // logit_bias: +100 on one token makes it the whole greedy output.
    let (_, v) = post(
        &completions,
        json!({"prompt": "Hello", "max_tokens": 3, "temperature": 0,
        "logit_bias": {"1000": 100}, "logprobs": 0}),
    )
    .await;
    let tokens = &v["choices"][0]["logprobs"]["tokens"];
    assert_eq!(tokens.as_array().unwrap().len(), 3, "{v}");
    assert!(
        tokens.as_array().unwrap().iter().all(|t| *t == tokens[0]),
        "{v}"
    );
    // echo: the prompt comes back in front of the completion, streamed or not.
    let (_, v) = post(
        &completions,
        json!({"prompt": "Once upon", "max_tokens": 3, "echo": true}),
    )
    .await;
    assert!(
        v["choices"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("Once upon"),
        "{v}"
    );
    // best_of: n of best_of choices come back.
    let (status, v) = post(
        &completions,
        json!({"prompt": "Once upon", "max_tokens": 3,
        "best_of": 3, "n": 2, "temperature": 1}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["choices"][0]["logprobs"], Value::Null, "{v}");
    // vLLM's guided_choice: the output is one of the choices.
    let (status, v) = post(
        &chat,
        chat_body(
            "Pick a colour.",
            json!({"max_tokens": 8,
        "guided_choice": ["red", "green", "blue"]}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(["red", "green", "blue"].contains(&text), "{text}");
    // Bookkeeping fields are accepted.
    let (status, _) = post(
        &chat,
        chat_body(
            "hi",
            json!({"max_tokens": 2, "user": "u",
        "metadata": {"k": "v"}, "store": false}),
        ),
    )
    .await;
    assert_eq!(status, 200);
    healthy(&s).await;
}

#[test]
fn an_engine_that_dies_or_hangs_ends_the_process_non_zero() {
    for (fault, extra) in [("panic", vec![]), ("hang", vec!["--watchdog-timeout", "1"])] {
        let mut args = vec!["--test-engine-fault", fault];
        args.extend(extra);
        let mut s = Server::start(&args);
        let addr = s.url.trim_start_matches("http://").to_string();
        let body = r#"{"prompt": "hi", "max_tokens": 4}"#;
        let mut conn = std::net::TcpStream::connect(&addr).unwrap();
        let request = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        std::io::Write::write_all(&mut conn, request.as_bytes()).unwrap();
        let t = Instant::now();
        let status = s.wait(Duration::from_secs(10));
        let took = t.elapsed();
        assert_eq!(status.code(), Some(70), "{fault}: {status:?}");
        eprintln!("{fault}: exited {status:?} {took:?} after the request");
        // Within a second of the death, or of the watchdog's timeout.
        let allowed = Duration::from_secs(if fault == "hang" { 2 } else { 1 });
        assert!(
            took < allowed + Duration::from_millis(500),
            "{fault}: {took:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_and_slow_connections_cannot_starve_health() {
    let s = Server::start(&[
        "--max-connections",
        "32",
        "--body-read-timeout",
        "0.5",
        "--header-read-timeout",
        "2",
    ]);
    let addr = s.url.trim_start_matches("http://").to_string();
    // Ten times the cap of connections that never send a byte, and some that stop mid-header.
    let mut idle = Vec::new();
    for i in 0..320 {
        let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
        if i % 4 == 0 {
            use tokio::io::AsyncWriteExt;
            let _ = c
                .write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")
                .await;
        }
        idle.push(c);
    }
    for _ in 0..5 {
        healthy(&s).await;
    }
    // A body that stops arriving is a 408 once its deadline passes.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
    c.write_all(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"prompt\":",
    )
    .await
    .unwrap();
    let t = Instant::now();
    let mut reply = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut reply))
        .await
        .expect("no answer to a stalled body")
        .unwrap();
    let head = String::from_utf8_lossy(&reply[..n]);
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    eprintln!("stalled body answered after {:?}", t.elapsed());
    assert!(metric(&s, "connections_evicted_total").await > 0.0);
    assert!(metric(&s, "body_read_timeouts_total").await >= 1.0);
    drop(idle);
    healthy(&s).await;
}
