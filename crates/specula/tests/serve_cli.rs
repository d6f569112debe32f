//! End-to-end tests of `specula serve`: the real binary with the real model, on loopback.

use futures_util::StreamExt;
use serde_json::{Value, json};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::model_path;
use common::server::*;
use common::stats::{same_distribution, sample_prefixes};

const BIN: &str = env!("CARGO_BIN_EXE_specula");

#[tokio::test]
async fn chat_and_completions_answer_with_usage_streamed_or_not() {
    let s = Server::start(&["--served-model-name", "smol"]);
    let (status, models) = {
        let r = client().get(s.url("/v1/models")).send().await.unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    assert_eq!(status, 200);
    assert_eq!(models["data"][0]["id"], "smol");

    let greedy = json!({"temperature": 0, "max_tokens": 24, "model": "smol"});
    let (status, full) = post(
        &s.url("/v1/chat/completions"),
        chat_body("Name the capital city of France.", greedy.clone()),
    )
    .await;
    assert_eq!(status, 200, "{full}");
    let text = full["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.contains("Paris"), "{text}");
    let usage = &full["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(
            usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
        )
    );

    // The same request streamed: the same text, a role chunk first, usage at the end.
    let mut body = chat_body("Name the capital city of France.", greedy);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let r = client()
        .post(s.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let events = sse_events(r).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, text);
    // The same usage, except that the repeated prompt's full blocks (all but its last token's)
    // now come from the prefix cache.
    let stream_usage = &chunks.last().unwrap()["usage"];
    for field in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(stream_usage[field], usage[field], "{field}");
    }
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    let prompt = usage["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        stream_usage["prompt_tokens_details"]["cached_tokens"],
        (prompt - 1) / 16 * 16
    );
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        full["choices"][0]["finish_reason"]
    );

    // A stop string ends the answer before it and is never sent.
    let (_, stopped) = post(
        &s.url("/v1/chat/completions"),
        chat_body(
            "Name the capital city of France.",
            json!({"temperature": 0, "max_tokens": 24, "stop": ["Paris"]}),
        ),
    )
    .await;
    let cut = stopped["choices"][0]["message"]["content"]
        .as_str()
        .unwrap();
    assert_eq!(cut, &text[..text.find("Paris").unwrap()]);
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");

    // Completions from token ids, n = 2 seeded samples, log-probabilities.
    let (status, c) = post(
        &s.url("/v1/completions"),
        json!({"prompt": [504, 3458, 282], "max_tokens": 5, "n": 2, "seed": 3,
               "temperature": 0.8, "logprobs": 3, "ignore_eos": true}),
    )
    .await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(c["choices"].as_array().unwrap().len(), 2);
    assert_eq!(c["usage"]["prompt_tokens"], 3);
    assert_eq!(c["usage"]["completion_tokens"], 10);
    let lp = &c["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 5);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 3);
    assert!(lp["token_logprobs"][0].as_f64().unwrap() <= 0.0);
}

#[tokio::test]
async fn models_retrieve_tokenize_and_detokenize_answer_in_the_peers_shapes() {
    let s = Server::start(&["--served-model-name", "org/smol"]);
    // `models.retrieve`, a name with a slash included; another name is a 404.
    let card = get_json(&s, "/v1/models/org/smol").await;
    assert_eq!(
        (card["id"].as_str(), card["object"].as_str()),
        (Some("org/smol"), Some("model"))
    );
    let r = client()
        .get(s.url("/v1/models/gpt-4o"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["param"], "model", "{body}");

    // Hostile sizes: a batch past the cap, a text no context could hold; 400s naming the field.
    let many = vec!["a"; 2049];
    for (body, param) in [
        (json!({"prompt": many}), "prompt"),
        (
            json!({"content": "word ".repeat(2_000_000), "with_pieces": true}),
            "content",
        ),
        (json!({"tokens": vec![vec![1]; 2049]}), "tokens"),
    ] {
        let route = if param == "tokens" {
            "/detokenize"
        } else {
            "/tokenize"
        };
        let (status, e) = post(&s.url(route), body).await;
        assert_eq!(
            (status, e["error"]["param"].as_str()),
            (400, Some(param)),
            "{e}"
        );
    }

    // llama-server's shape: `content`, no BOS added, `with_pieces`; then back to the text.
    let text = "Hello world, héllo wörld!";
    let (status, plain) = post(&s.url("/tokenize"), json!({"content": text})).await;
    assert_eq!(status, 200, "{plain}");
    let ids = plain["tokens"].as_array().unwrap().clone();
    assert!(ids.len() > 4 && ids.iter().all(Value::is_u64), "{plain}");
    assert_eq!(plain["count"], ids.len());
    assert_eq!(plain["char_count"], text.chars().count());
    assert!(plain["max_model_len"].as_u64().unwrap() >= 2048, "{plain}");
    let (_, pieces) = post(
        &s.url("/tokenize"),
        json!({"content": text, "with_pieces": true}),
    )
    .await;
    let pieces = pieces["tokens"].as_array().unwrap();
    let joined: String = pieces.iter().filter_map(|p| p["piece"].as_str()).collect();
    assert_eq!(joined, text, "{pieces:?}");
    assert_eq!(
        pieces.iter().map(|p| p["id"].clone()).collect::<Vec<_>>(),
        ids
    );
    for route in ["/detokenize", "/v1/detokenize"] {
        let (status, back) = post(&s.url(route), json!({"tokens": ids, "model": "org/smol"})).await;
        assert_eq!(status, 200, "{back}");
        for field in ["content", "prompt", "text"] {
            assert_eq!(back[field], text, "{field}: {back}");
        }
    }

    // SGLang's batch: lists in, lists out, each the same as alone.
    let (_, batch) = post(&s.url("/v1/tokenize"), json!({"prompt": [text, "two"]})).await;
    assert_eq!(batch["tokens"][0], json!(ids), "{batch}");
    assert_eq!(batch["count"].as_array().unwrap().len(), 2);
    let (_, back) = post(&s.url("/v1/detokenize"), json!({"tokens": batch["tokens"]})).await;
    assert_eq!(back["text"], json!([text, "two"]));

    // vLLM's messages: as many tokens as the chat route counts for its prompt.
    let messages = json!([{"role": "user", "content": "Name the capital city of France."}]);
    let (_, counted) = post(&s.url("/tokenize"), json!({"messages": messages})).await;
    let (_, chat) = post(
        &s.url("/v1/chat/completions"),
        json!({"messages": messages, "max_tokens": 1}),
    )
    .await;
    assert_eq!(
        counted["count"], chat["usage"]["prompt_tokens"],
        "{counted}"
    );

    // Mistakes are 400s naming the field.
    for (route, body, param) in [
        ("/detokenize", json!({"tokens": [999_999]}), json!("tokens")),
        ("/detokenize", json!({}), json!("tokens")),
        (
            "/tokenize",
            json!({"content": "a", "prompt": "b"}),
            Value::Null,
        ),
        ("/tokenize", json!({"prompt": [1, 2]}), json!("prompt")),
        (
            "/tokenize",
            json!({"content": "a", "model": "other"}),
            json!("model"),
        ),
    ] {
        let (status, e) = post(&s.url(route), body.clone()).await;
        assert_eq!(status, 400, "{body}: {e}");
        assert_eq!(e["error"]["param"], param, "{body}: {e}");
    }
    let (status, e) = post(&s.url("/tokenize"), json!({"content": "a", "colour": 1})).await;
    assert_eq!(status, 400);
    assert!(
        e["error"]["message"].as_str().unwrap().contains("colour"),
        "{e}"
    );
}

#[tokio::test]
async fn greedy_text_through_the_server_equals_generate() {
    let prompt = "The three primary colors are";
    let out = Command::new(BIN)
        .args([
            "generate",
            "--prompt",
            prompt,
            "--max-tokens",
            "40",
            "--temperature",
            "0",
        ])
        .args(["--ignore-eos", "--model"])
        .arg(model_path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let generated = &stdout[..stdout.rfind("\nprompt: ").unwrap()];
    let s = Server::start(&[]);
    let (status, c) = post(
        &s.url("/v1/completions"),
        json!({"prompt": prompt, "max_tokens": 40, "temperature": 0, "ignore_eos": true}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(c["choices"][0]["text"].as_str().unwrap(), generated);
}

#[tokio::test]
async fn sixty_four_simultaneous_streams_complete_with_correct_usage() {
    let s = Server::start(&[]);
    let url = s.url("/v1/chat/completions");
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move {
                let mut body = chat_body(
                    &format!("Tell me fact number {i} about the sea."),
                    json!({"max_tokens": 12, "ignore_eos": true, "stream": true,
                           "stream_options": {"include_usage": true}}),
                );
                body["seed"] = json!(i);
                let r = client().post(&url).json(&body).send().await.unwrap();
                assert_eq!(r.status().as_u16(), 200);
                let events = sse_events(r).await;
                assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
                let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
                usage["usage"]["completion_tokens"].as_u64().unwrap()
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 12);
    }
    assert_eq!(metric(&s, "kv_blocks_used").await, 0.0);
}

#[tokio::test]
async fn dropped_streams_free_their_kv_blocks() {
    let model = model_path();
    let model = model.to_str().unwrap();
    // Without speculation, with prompt-lookup trees, with a draft model or an EAGLE-3 head
    // (their KV too): clients
    // that go away mid-generation (mid-verification, with speculation) leave nothing behind.
    for flags in [
        &[][..],
        &[
            "--speculative-algorithm",
            "NGRAM",
            "--speculative-adaptive",
            "false",
            "--speculative-eagle-topk",
            "2",
        ][..],
        &[
            "--speculative-algorithm",
            "STANDALONE",
            "--speculative-adaptive",
            "false",
            "--speculative-draft-model-path",
            model,
        ][..],
        // The built-in EAGLE-3 head keeps its KV on the target's blocks.
        &[
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-adaptive",
            "false",
        ][..],
    ] {
        let s = Server::start(flags);
        abandon_requests_and_check_blocks(&s).await;
    }
}

/// 50 streams read once then dropped and 10 impatient non-streaming clients: every request
/// is aborted and every KV block freed.
async fn abandon_requests_and_check_blocks(s: &Server) {
    let url = s.url("/v1/completions");
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move {
                let body = json!({"prompt": format!("Story {i}: once upon a time"),
                                  "max_tokens": 2000, "ignore_eos": true, "stream": true});
                let r = client().post(&url).json(&body).send().await.unwrap();
                let mut stream = r.bytes_stream();
                // Read the first event, then go away mid-stream.
                let first = stream.next().await.unwrap().unwrap();
                assert!(first.starts_with(b"data: "));
            })
        })
        .collect();
    // Non-streaming clients that give up (a timeout) abort too.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let waits: Vec<_> = (0..10)
        .map(|i| {
            let (url, impatient) = (url.clone(), impatient.clone());
            tokio::spawn(async move {
                let body =
                    json!({"prompt": format!("List {i}:"), "max_tokens": 2000, "ignore_eos": true});
                assert!(impatient.post(&url).json(&body).send().await.is_err());
            })
        })
        .collect();
    for t in tasks.into_iter().chain(waits) {
        t.await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let used = metric(s, "kv_blocks_used").await;
        let running = metric(s, "num_running_reqs").await;
        if used == 0.0 && running == 0.0 {
            break;
        }
        assert!(Instant::now() < deadline, "{used} KV blocks still used");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(metric(s, "aborted_requests_total").await, 60.0);
}

#[tokio::test]
async fn overload_gives_503_at_once_while_accepted_requests_complete() {
    let s = Server::start(&["--max-running-requests", "2", "--max-queued-requests", "2"]);
    let url = s.url("/v1/completions");
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move {
                let body =
                    json!({"prompt": format!("Item {i}:"), "max_tokens": 32, "ignore_eos": true});
                let r = client().post(&url).json(&body).send().await.unwrap();
                let status = r.status().as_u16();
                let retry = r.headers().get("retry-after").is_some();
                let v: Value = r.json().await.unwrap();
                (status, retry, v)
            })
        })
        .collect();
    let (mut ok, mut refused) = (0, 0);
    for t in tasks {
        let (status, retry, v) = t.await.unwrap();
        match status {
            200 => {
                ok += 1;
                assert_eq!(v["usage"]["completion_tokens"], 32);
            }
            503 => {
                refused += 1;
                assert!(retry, "503 without Retry-After");
                assert!(v["error"]["message"].as_str().unwrap().contains("capacity"));
            }
            other => panic!("unexpected status {other}: {v}"),
        }
    }
    assert!(ok >= 4, "{ok} accepted");
    assert!(refused >= 1, "nothing refused");
    assert_eq!(ok + refused, 16);
}

#[tokio::test]
async fn bad_requests_get_openai_errors_with_the_right_status() {
    let s = Server::start(&["--api-key", "sekrit"]);
    let auth = |r: reqwest::RequestBuilder| r.bearer_auth("sekrit");
    let chat = s.url("/v1/chat/completions");
    let cases = [
        (json!({"messages": []}), "messages"),
        (json!({"messages": "hi"}), "messages"),
        (json!({}), "messages"),
        (chat_body("hi", json!({"temperature": 2.5})), "temperature"),
        (chat_body("hi", json!({"top_p": 0})), "top_p"),
        (chat_body("hi", json!({"max_tokens": -1})), "max_tokens"),
        (chat_body("hi", json!({"max_tokens": 100000})), "max_tokens"),
        (chat_body("hi", json!({"model": "gpt-4"})), "model"),
        (chat_body("hi", json!({"n": "two"})), "n"),
        (
            json!({"messages": [{"role": "user", "content": 5}]}),
            "messages",
        ),
        // Forcing a tool call needs --tool-call-parser.
        (
            chat_body(
                "hi",
                json!({"tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f"}}]}),
            ),
            "tool_choice",
        ),
    ];
    for (body, param) in cases {
        let r = auth(client().post(&chat)).json(&body).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 400, "{body}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    }
    let r = auth(client().post(&chat))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let long_prompt = "word ".repeat(9000);
    let r = auth(client().post(s.url("/v1/completions")))
        .json(&json!({"prompt": long_prompt, "max_tokens": 10}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let r = auth(client().get(s.url("/v1/nothing")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], 404);
    let huge = vec![b'a'; 17 << 20];
    let r = auth(client().post(&chat)).body(huge).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 413);
    // Without the key: 401; health stays open.
    let r = client()
        .post(&chat)
        .json(&chat_body("hi", json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    // The new routes under hostile input: a prompt no context holds, JSON nested past serde's
    // limit, a batch past the cap; each a 400 naming the field, never a crash.
    let huge = "word ".repeat(2_000_000);
    let deep = format!("{}1{}", "[".repeat(5000), "]".repeat(5000));
    let inputs = vec!["a"; 2049];
    for (route, body, param) in [
        ("/v1/responses", json!({"input": huge}), Some("messages")),
        ("/v1/embeddings", json!({"input": huge}), Some("input")),
        ("/v1/embeddings", json!({"input": inputs}), Some("input")),
    ] {
        let r = auth(client().post(s.url(route)))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400, "{route}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["param"].as_str(), param, "{route}: {v}");
    }
    for route in ["/v1/responses", "/v1/messages", "/v1/embeddings"] {
        let body = format!("{{\"input\": {deep}, \"messages\": {deep}}}");
        let r = auth(client().post(s.url(route)))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400, "{route}");
    }
    let r = auth(client().post(s.url("/v1/messages")))
        .json(&json!({"max_tokens": 8, "messages": [{"role": "user", "content": huge}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    // Anthropic's clients send the key as `x-api-key`, and get Anthropic's error shapes.
    let count = s.url("/v1/messages/count_tokens");
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let r = client().post(&count).json(&body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = client()
        .post(&count)
        .header("x-api-key", "sekrit")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.unwrap();
    assert!(v["input_tokens"].as_u64().unwrap() > 1, "{v}");
    let r = client()
        .post(s.url("/v1/messages"))
        .header("x-api-key", "sekrit")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_tokens")
    );
    let r = client().get(s.url("/health")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = client()
        .get(s.url("/health_generate"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let info = get_json(&s, "/server_info").await;
    assert_eq!(info["config"]["max_running_requests"], 64);
    assert_eq!(info["phase"], "ready");
    assert!(
        info["config"].get("api_key").is_none(),
        "the key must not leak"
    );
}

#[test]
fn start_up_failures_exit_non_zero_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let corrupt = dir.path().join("corrupt.gguf");
    std::fs::write(&corrupt, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let model = model_path();
    let model = model.to_str().unwrap();
    let bad_config = dir.path().join("bad.toml");
    std::fs::write(&bad_config, "max-running-requests = \"lots\"\n").unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--port", "0", "--model-path", "/nonexistent/model.gguf"],
            "does not exist",
        ),
        (
            vec!["--port", "0", "--model-path", corrupt.to_str().unwrap()],
            "cannot load",
        ),
        (
            vec![
                "--port",
                "0",
                "--model-path",
                model,
                "--max-total-tokens",
                "8",
            ],
            "KV cache",
        ),
        (
            vec!["--model-path", model, "--port", &port],
            "cannot listen",
        ),
        (
            vec![
                "--port",
                "0",
                "--model-path",
                model,
                "--config",
                bad_config.to_str().unwrap(),
            ],
            "bad.toml",
        ),
        (
            vec!["--port", "0", "--model-path", model, "--log-level", "loud"],
            "--log-level",
        ),
        (
            vec![
                "--port",
                "0",
                "--model-path",
                model,
                "--speculative-algorithm",
                "STANDALONE",
                "--speculative-adaptive",
                "false",
            ],
            "needs --speculative-draft-model-path",
        ),
        (
            vec![
                "--port",
                "0",
                "--model-path",
                model,
                "--speculative-algorithm",
                "STANDALONE",
                "--speculative-adaptive",
                "false",
                "--speculative-draft-model-path",
                corrupt.to_str().unwrap(),
            ],
            "cannot load the draft model",
        ),
        (
            vec![
                "--port",
                "0",
                "--model-path",
                model,
                "--speculative-algorithm",
                "STANDALONE",
                "--speculative-adaptive",
                "false",
                "--speculative-draft-model-path",
                model,
                "--speculative-eagle-topk",
                "0",
            ],
            "--speculative-eagle-topk must be at least 1",
        ),
    ];
    for (args, expect) in cases {
        let out = Command::new(BIN).arg("serve").args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(!stdout.contains("ready on"), "{args:?} reported ready");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "{args:?}: {stderr}");
        assert!(errors[0].contains(expect), "{args:?}: {}", errors[0]);
    }
}

#[tokio::test]
async fn sigterm_finishes_in_flight_requests_then_exits_zero() {
    let mut s = Server::start(&[]);
    let body =
        json!({"prompt": "Count: one, two,", "max_tokens": 48, "ignore_eos": true, "stream": true});
    let r = client()
        .post(s.url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = r.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    s.terminate();
    // New work is refused while the stream finishes.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let refused = client()
        .post(s.url("/v1/completions"))
        .json(&json!({"prompt": "x", "max_tokens": 2}))
        .send()
        .await;
    if let Ok(r) = refused {
        assert_eq!(r.status().as_u16(), 503);
    }
    let mut rest = Vec::new();
    while let Some(chunk) = stream.next().await {
        rest.extend_from_slice(&chunk.unwrap());
    }
    let rest = String::from_utf8(rest).unwrap();
    assert!(rest.trim_end().ends_with("data: [DONE]"), "{rest}");
    assert!(rest.contains("\"finish_reason\":\"length\""));
    let status = s.wait(Duration::from_secs(30));
    assert!(status.success(), "{status}");
    let lines: Vec<String> = s.lines.try_iter().collect();
    assert!(lines.iter().any(|l| l.contains("stopped")), "{lines:?}");
}

#[tokio::test]
async fn preempted_requests_are_recomputed_to_the_same_greedy_text() {
    // 16 blocks of 16 tokens: eight ~45-token sequences cannot all hold their KV at once.
    let s = Server::start(&["--max-total-tokens", "256", "--max-running-requests", "8"]);
    let url = s.url("/v1/completions");
    let body = |i: usize| {
        json!({"prompt": format!("Here is a short story about a robot named Unit {i}. It begins"),
               "max_tokens": 28, "temperature": 0, "ignore_eos": true})
    };
    let mut alone = Vec::new();
    for i in 0..8 {
        let (status, c) = post(&url, body(i)).await;
        assert_eq!(status, 200, "{c}");
        alone.push(c["choices"][0]["text"].as_str().unwrap().to_string());
    }
    assert_eq!(metric(&s, "preemptions_total").await, 0.0);
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (url, body) = (url.clone(), body(i));
            tokio::spawn(async move { post(&url, body).await })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let (status, c) = t.await.unwrap();
        assert_eq!(status, 200, "{c}");
        assert_eq!(
            c["choices"][0]["text"].as_str().unwrap(),
            alone[i],
            "request {i}"
        );
    }
    assert!(
        metric(&s, "preemptions_total").await > 0.0,
        "the KV cache was meant to run short"
    );
    assert_eq!(metric(&s, "kv_blocks_used").await, 0.0);
}

#[test]
fn demo_serves_the_model_and_benchmarks_it() {
    let out = Command::new(BIN)
        .args([
            "demo",
            "--concurrency",
            "1,2",
            "--requests-per-level",
            "2",
            "--max-tokens",
            "8",
        ])
        .args(["--warmup-requests", "1", "--threads", "2", "--model-path"])
        .arg(model_path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let levels: Vec<&str> = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("C="))
        .collect();
    assert_eq!(levels.len(), 2, "{stdout}");
    assert!(levels.iter().all(|l| l.contains("ok: 2/2")), "{stdout}");
}

/// A prompt whose answer repeats much of it: n-gram drafts get accepted.
fn rewrite_prompt(i: usize) -> String {
    format!(
        "Copy this list exactly, one item per line: apple {i}, banana, cherry, dates, elderberry, \
         figs, grapes, honeydew, kiwi, lemon, mango, nectarine."
    )
}

/// Eight greedy rewrite requests joining 40 ms apart, request i asking for `max_tokens(i)`
/// tokens; their texts in order.
async fn staggered(url: String, max_tokens: fn(usize) -> usize) -> Vec<Value> {
    let mut tasks = Vec::new();
    for i in 0..8 {
        let body = json!({"messages": [{"role": "user", "content": rewrite_prompt(i)}],
                          "max_tokens": max_tokens(i), "temperature": 0, "ignore_eos": true});
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(40 * i as u64)).await;
            post(&url, body).await.1["choices"][0]["message"]["content"].clone()
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test]
async fn ngram_speculation_gives_token_for_token_the_same_greedy_output() {
    let plain = Server::start(&[]);
    let spec = Server::start(&[
        "--speculative-algorithm",
        "NGRAM",
        "--speculative-adaptive",
        "false",
        "--speculative-num-draft-tokens",
        "6",
    ]);
    let body = |i: usize, max_tokens: usize| {
        json!({"messages": [{"role": "user", "content": rewrite_prompt(i)}],
               "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true})
    };
    // One at a time, then eight together with requests joining mid-way.
    for (i, max_tokens) in [(0, 40), (1, 7)] {
        let (_, a) = post(&plain.url("/v1/chat/completions"), body(i, max_tokens)).await;
        let (_, b) = post(&spec.url("/v1/chat/completions"), body(i, max_tokens)).await;
        assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);
        // max_tokens is exact even when it lands inside an accepted run.
        assert_eq!(b["usage"]["completion_tokens"], max_tokens);
        let per_pass = b["usage"]["spec_accept_length"].as_f64().unwrap();
        assert!(per_pass > 1.0, "{b}");
    }
    let run = |url: String| staggered(url, |i| 32 + i);
    let a = run(plain.url("/v1/chat/completions")).await;
    let b = run(spec.url("/v1/chat/completions")).await;
    assert_eq!(a, b);
    // The adaptive policy changes how many drafts are verified, never the output.
    let adaptive = Server::start(&["--speculative-algorithm", "NGRAM", "--speculative-adaptive"]);
    let c = run(adaptive.url("/v1/chat/completions")).await;
    assert_eq!(a, c);
    drop(adaptive);
    // Draft trees (several continuations a node, tree attention, the accepted branch's KV
    // moved into place) change nothing either, alone or batched.
    let tree = Server::start(&[
        "--speculative-algorithm",
        "NGRAM",
        "--speculative-adaptive",
        "false",
        "--speculative-eagle-topk",
        "3",
        "--speculative-num-draft-tokens",
        "10",
    ]);
    for (i, max_tokens) in [(0, 40), (2, 25)] {
        let (_, x) = post(&plain.url("/v1/chat/completions"), body(i, max_tokens)).await;
        let (_, y) = post(&tree.url("/v1/chat/completions"), body(i, max_tokens)).await;
        assert_eq!(x["choices"][0]["message"], y["choices"][0]["message"]);
    }
    let d = run(tree.url("/v1/chat/completions")).await;
    assert_eq!(a, d);
    let branched = metric(&tree, "spec_tree_verifications_total").await;
    assert!(branched > 5.0, "only {branched} verifications had branches");
    assert!(metric(&tree, "spec_accepted_tokens_total").await > 20.0);
    assert_eq!(metric(&tree, "kv_blocks_used").await, 0.0);
    drop(tree);
    let accepted = metric(&spec, "spec_accepted_tokens_total").await;
    assert!(accepted > 20.0, "only {accepted} drafts accepted");
    assert_eq!(metric(&spec, "kv_blocks_used").await, 0.0);
    // A stop string inside an accepted run still cuts the text there.
    let mut stop = body(0, 40);
    stop["stop"] = json!(["cherry"]);
    let (_, a) = post(&plain.url("/v1/chat/completions"), stop.clone()).await;
    let (_, b) = post(&spec.url("/v1/chat/completions"), stop).await;
    assert_eq!(a["choices"][0], b["choices"][0]);
    assert_eq!(b["choices"][0]["finish_reason"], "stop");
    let per_pass = b["usage"]["spec_accept_length"].as_f64();
    assert!(per_pass.is_some_and(|x| x > 1.0), "{b}");
}

#[tokio::test]
async fn suffix_decoding_drafts_an_earlier_requests_answer_and_changes_no_output() {
    let plain = Server::start(&[]);
    let spec = Server::start(&["--speculative-algorithm", "SUFFIX"]);
    let question = |q: &str| {
        json!({"messages": [{"role": "user", "content": q}],
               "max_tokens": 48, "temperature": 0, "ignore_eos": true})
    };
    let story = question("Write a short story about a robot who learns to paint.");
    let (_, a) = post(&plain.url("/v1/chat/completions"), story.clone()).await;
    let (_, first) = post(&spec.url("/v1/chat/completions"), story.clone()).await;
    assert_eq!(a["choices"][0]["message"], first["choices"][0]["message"]);
    // Asked again, the answer is in the cache of finished requests: drafted far ahead, and
    // still exactly the model's.
    let (_, again) = post(&spec.url("/v1/chat/completions"), story).await;
    assert_eq!(a["choices"][0]["message"], again["choices"][0]["message"]);
    let per_pass = again["usage"]["spec_accept_length"].as_f64().unwrap_or(1.0);
    assert!(per_pass > 3.0, "{again}");
    // Questions it has not seen, one at a time and eight together, change nothing either.
    let other = question("Name three rivers in Europe and say where they flow.");
    let (_, x) = post(&plain.url("/v1/chat/completions"), other.clone()).await;
    let (_, y) = post(&spec.url("/v1/chat/completions"), other).await;
    assert_eq!(x["choices"][0]["message"], y["choices"][0]["message"]);
    let run = |url: String| staggered(url, |i| 24 + i);
    assert_eq!(
        run(plain.url("/v1/chat/completions")).await,
        run(spec.url("/v1/chat/completions")).await
    );
    assert!(metric(&spec, "spec_accepted_tokens_total").await > 40.0);
    assert_eq!(metric(&spec, "kv_blocks_used").await, 0.0);
    // The cache holds every finished request (the warm-up's too) and says how big it is.
    assert!(metric(&spec, "spec_cache_requests").await >= 12.0);
    assert!(metric(&spec, "spec_cache_tokens").await > 12.0 * 24.0);
    assert!(metric(&spec, "spec_cache_bytes").await > 0.0);
}

#[tokio::test]
async fn a_draft_model_gives_the_same_greedy_output_and_drafts_for_itself_perfectly() {
    let model = model_path();
    let model = model.to_str().unwrap();
    let plain = Server::start(&[]);
    // The target as its own draft: every greedy draft must be accepted (the kernels are
    // batch-invariant, so the draft's forward gives the target's logits exactly).
    let spec = Server::start(&[
        "--speculative-algorithm",
        "STANDALONE",
        "--speculative-adaptive",
        "false",
        "--speculative-draft-model-path",
        model,
        "--speculative-num-steps",
        "3",
    ]);
    let body = |i: usize, max_tokens: usize| {
        json!({"messages": [{"role": "user", "content": rewrite_prompt(i)}],
               "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true})
    };
    let (_, a) = post(&plain.url("/v1/chat/completions"), body(0, 30)).await;
    let (_, b) = post(&spec.url("/v1/chat/completions"), body(0, 30)).await;
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);
    assert_eq!(b["usage"]["completion_tokens"], 30);
    // 3 drafts + the bonus token per pass, but the last passes run short of max_tokens.
    let per_pass = b["usage"]["spec_accept_length"].as_f64().unwrap();
    assert!(per_pass > 3.5, "{b}");
    // Eight at once, joining mid-way, with different lengths.
    let run = |url: String| staggered(url, |i| 20 + 3 * i);
    assert_eq!(
        run(plain.url("/v1/chat/completions")).await,
        run(spec.url("/v1/chat/completions")).await
    );
    let drafted = metric(&spec, "spec_draft_tokens_total").await;
    assert!(drafted > 100.0, "{drafted}");
    assert_eq!(metric(&spec, "spec_accepted_tokens_total").await, drafted);
    assert_eq!(metric(&spec, "kv_blocks_used").await, 0.0);
    // Sampling works with a draft model too (the distribution test covers the verifier).
    let (status, v) = post(
        &spec.url("/v1/completions"),
        json!({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.8, "seed": 3}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 16);
    drop(spec);
    // A tree of the draft's two best candidates a level, three levels, six verified.
    let tree = Server::start(&[
        "--speculative-algorithm",
        "STANDALONE",
        "--speculative-adaptive",
        "false",
        "--speculative-draft-model-path",
        model,
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "2",
    ]);
    let (_, c) = post(&tree.url("/v1/chat/completions"), body(0, 30)).await;
    assert_eq!(a["choices"][0]["message"], c["choices"][0]["message"]);
    assert_eq!(
        run(plain.url("/v1/chat/completions")).await,
        run(tree.url("/v1/chat/completions")).await
    );
    let verifications = metric(&tree, "spec_verifications_total").await;
    assert!(verifications > 20.0, "{verifications}");
    // Branching everywhere but near max_tokens, where a pass may verify only one or two.
    let branched = metric(&tree, "spec_tree_verifications_total").await;
    assert!(
        branched > 0.8 * verifications,
        "{branched} / {verifications}"
    );
    // The draft's most likely path is usually the target's: most passes accept a lot.
    let accepted = metric(&tree, "spec_accepted_tokens_total").await;
    assert!(
        accepted > 2.0 * verifications,
        "{accepted} / {verifications}"
    );
    assert_eq!(metric(&tree, "kv_blocks_used").await, 0.0);
}

#[tokio::test]
async fn sampled_output_with_speculation_has_the_same_distribution() {
    let plain = Server::start(&[]);
    // Prompt lookup with trees: "5 1 " was followed by "7" and by "8" (digits and spaces are
    // separate tokens), so after a sampled " " a verification with two drafts has both as
    // candidates for the next token (multi-candidate rejection sampling); with one draft it
    // is a chain.
    let spec = Server::start(&[
        "--speculative-algorithm",
        "NGRAM",
        "--speculative-adaptive",
        "false",
        "--speculative-eagle-topk",
        "3",
    ]);
    let prompt = "9 5 1 7 5 1 8 5 1";
    // 2,080 samples of the first 3 tokens from each server. Four tokens each, so that two
    // drafts (a branching tree) can be verified before the last.
    let body = json!({"prompt": prompt, "max_tokens": 4, "n": 16, "temperature": 1.0,
                      "ignore_eos": true, "logprobs": 0});
    let sample = |url: String| {
        let body = body.clone();
        async move { sample_prefixes(&url, &body, 13, 3).await }
    };
    let a = sample(plain.url("/v1/completions")).await;
    let b = sample(spec.url("/v1/completions")).await;
    let accepted = metric(&spec, "spec_accepted_tokens_total").await;
    assert!(accepted > 100.0, "{accepted} accepted");
    assert!(
        accepted < metric(&spec, "spec_draft_tokens_total").await,
        "rejections must happen too"
    );
    let branched = metric(&spec, "spec_tree_verifications_total").await;
    assert!(branched > 100.0, "{branched} verifications had branches");
    same_distribution(&a, &b);
    drop(spec);
    // Suffix decoding's trees (its own text's and earlier requests' votes, every continuation
    // kept, always drafted) are verified the same way: the same distribution again.
    let suffix = Server::start(&[
        "--speculative-algorithm",
        "SUFFIX",
        "--speculative-eagle-topk",
        "3",
        "--speculative-suffix-min-token-prob",
        "0",
        "--speculative-suffix-max-spec-factor",
        "2",
        "--speculative-adaptive",
        "false",
    ]);
    let c = sample(suffix.url("/v1/completions")).await;
    let accepted = metric(&suffix, "spec_accepted_tokens_total").await;
    let drafted = metric(&suffix, "spec_draft_tokens_total").await;
    assert!(accepted > 100.0, "{accepted} of {drafted} accepted");
    assert!(metric(&suffix, "spec_tree_verifications_total").await > 100.0);
    same_distribution(&a, &c);
}

/// A system prompt of about `words` tokens (common words are one token each).
fn long_system_prompt(words: usize) -> String {
    const WORDS: [&str; 12] = [
        "the", "river", "stone", "light", "city", "over", "garden", "small", "north", "after",
        "window", "green",
    ];
    (0..words)
        .map(|i| WORDS[(i * 7 + i / 12) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

fn with_system(system: &str, question: &str, max_tokens: usize) -> Value {
    json!({"messages": [{"role": "system", "content": system},
                        {"role": "user", "content": question}],
           "max_tokens": max_tokens, "temperature": 0})
}

fn cached_tokens(response: &Value) -> u64 {
    response["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens in {response}"))
}

#[tokio::test]
async fn a_shared_system_prompt_is_prefilled_once_and_changes_no_output() {
    let system = long_system_prompt(1000);
    let question = |i: usize| format!("Question {i}: which word comes first in the text?");
    let s = Server::start(&[]);
    let url = s.url("/v1/chat/completions");
    // 50 requests at once: the first computes the shared prompt, the others wait for its blocks.
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let (url, body) = (url.clone(), with_system(&system, &question(i), 4));
            tokio::spawn(async move { post(&url, body).await })
        })
        .collect();
    let mut responses = Vec::new();
    for t in tasks {
        let (status, r) = t.await.unwrap();
        assert_eq!(status, 200, "{r}");
        responses.push(r);
    }
    let prompt = responses[0]["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt > 1000, "{prompt} prompt tokens");
    let computed: u64 = responses
        .iter()
        .map(|r| r["usage"]["prompt_tokens"].as_u64().unwrap() - cached_tokens(r))
        .sum();
    let reusing = responses
        .iter()
        .filter(|r| cached_tokens(r) >= prompt - 64)
        .count();
    assert!(
        reusing >= 49,
        "only {reusing} of 50 reused the system prompt"
    );
    // Once in full, then each request's own question and the block it starts in.
    assert!(
        computed < prompt + 50 * 64,
        "{computed} prompt tokens computed for 50 × {prompt}"
    );
    let hits = metric(&s, "cached_tokens_total{tier=\"device\"}").await;
    let total_cached: u64 = responses.iter().map(cached_tokens).sum();
    assert_eq!(hits, total_cached as f64);
    assert!(metric(&s, "cache_hit_rate").await > 0.9);
    assert_eq!(
        metric(&s, "kv_blocks_used").await,
        0.0,
        "idle cache counts as free"
    );
    // The same answers from a server without the cache (a sample of them).
    let plain = Server::start(&["--disable-radix-cache"]);
    for i in [0, 1, 17, 49] {
        let (status, r) = post(
            &plain.url("/v1/chat/completions"),
            with_system(&system, &question(i), 4),
        )
        .await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(cached_tokens(&r), 0);
        assert_eq!(
            r["choices"][0]["message"]["content"], responses[i]["choices"][0]["message"]["content"],
            "request {i}"
        );
    }
}

#[tokio::test]
async fn flush_cache_empties_the_cache_and_is_refused_while_requests_run() {
    let s = Server::start(&[]);
    let url = s.url("/v1/chat/completions");
    let body = with_system(&long_system_prompt(200), "Say hello.", 3);
    let (_, first) = post(&url, body.clone()).await;
    let (_, again) = post(&url, body.clone()).await;
    assert!(cached_tokens(&again) >= 192, "{again}");
    assert_eq!(
        again["choices"][0]["message"]["content"],
        first["choices"][0]["message"]["content"]
    );
    // A request in flight: refused with an OpenAI error.
    let running = client()
        .post(&url)
        .json(&chat_body(
            "Count to one thousand.",
            json!({"max_tokens": 400, "ignore_eos": true, "stream": true}),
        ))
        .send()
        .await
        .unwrap();
    let mut stream = running.bytes_stream();
    stream.next().await.unwrap().unwrap();
    let r = client().post(s.url("/flush_cache")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let err: Value = r.json().await.unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("running"),
        "{err}"
    );
    drop(stream);
    // Idle (the abort lands within a step): flushed, and the prompt is computed afresh.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = client().post(s.url("/flush_cache")).send().await.unwrap();
        if r.status().as_u16() == 200 {
            let v: Value = r.json().await.unwrap();
            assert!(v["flushed_blocks"].as_u64().unwrap() > 0, "{v}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "flush refused for 30 s after the abort"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, after) = post(&url, body).await;
    assert_eq!(cached_tokens(&after), 0);
    assert_eq!(
        after["choices"][0]["message"]["content"],
        first["choices"][0]["message"]["content"]
    );
}

#[tokio::test]
async fn prefixes_evicted_to_the_host_tier_come_back_with_the_same_output() {
    // 32 device blocks: three ~340-token prompts do not fit at once, so the first one's blocks
    // are demoted to the host tier (64 blocks) and promoted when it comes back.
    let s = Server::start(&["--max-total-tokens", "512", "--enable-hierarchical-cache"]);
    let url = s.url("/v1/chat/completions");
    let prompt = |name: &str| format!("Text {name}. {}", long_system_prompt(300));
    let (status, first) = post(&url, with_system(&prompt("A"), "Go on.", 8)).await;
    assert_eq!(status, 200, "{first}");
    for other in ["B", "C"] {
        let (status, r) = post(&url, with_system(&prompt(other), "Go on.", 8)).await;
        assert_eq!(status, 200, "{r}");
    }
    assert!(metric(&s, "cache_demoted_blocks_total").await > 0.0);
    let (_, again) = post(&url, with_system(&prompt("A"), "Go on.", 8)).await;
    let prompt_tokens = again["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        cached_tokens(&again) >= prompt_tokens - 32,
        "{again} reused too little"
    );
    assert!(metric(&s, "cache_promoted_blocks_total").await > 0.0);
    assert!(metric(&s, "cached_tokens_total{tier=\"host\"}").await > 0.0);
    assert_eq!(
        again["choices"][0]["message"]["content"], first["choices"][0]["message"]["content"],
        "demotion and promotion must not change the output"
    );
    let info = get_json(&s, "/server_info").await;
    assert_eq!(info["prefix_cache"]["host_blocks_total"], 64);
}

#[tokio::test]
async fn the_host_tier_holds_the_bytes_it_is_given_in_either_kv_dtype() {
    // SmolLM2-135M: 30 layers × 3 KV heads × 64 dims × 16 tokens, keys and values: 184,320
    // values a block, 4 bytes each in f32 and 2 in f16. `--hicache-size` is in GB, so the same
    // size holds twice the blocks in f16.
    for (dtype, value_bytes) in [("f32", 4), ("f16", 2)] {
        let s = Server::start(&[
            "--enable-hierarchical-cache",
            "--hicache-size",
            "0.1",
            "--kv-cache-dtype",
            dtype,
        ]);
        let info = get_json(&s, "/server_info").await;
        let blocks = info["prefix_cache"]["host_blocks_total"].as_u64().unwrap();
        assert_eq!(blocks, 100_000_000 / (184_320 * value_bytes), "{dtype}");
    }
}

#[tokio::test]
async fn a_restarted_suffix_server_with_a_storage_dir_drafts_what_it_saw_before() {
    let dir = std::env::temp_dir().join(format!("specula-suffix-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dir_arg = dir.to_str().unwrap().to_string();
    let args = [
        "--speculative-algorithm",
        "SUFFIX",
        "--enable-hierarchical-cache",
        "--hicache-storage-dir",
        dir_arg.as_str(),
    ];
    let body = json!({"messages": [{"role": "user", "content": "Describe a lighthouse at night."}],
                      "max_tokens": 48, "temperature": 0, "ignore_eos": true});
    let first = {
        let mut s = Server::start(&args);
        let (_, r) = post(&s.url("/v1/chat/completions"), body.clone()).await;
        s.terminate();
        assert!(s.wait(Duration::from_secs(60)).success());
        r
    };
    assert!(dir.join("drafter.mem").exists());
    let s = Server::start(&args);
    // Its warm-up's request, and the first server's requests.
    let restored = metric(&s, "spec_cache_requests").await;
    let (_, again) = post(&s.url("/v1/chat/completions"), body).await;
    assert_eq!(
        again["choices"][0]["message"],
        first["choices"][0]["message"]
    );
    let per_pass = again["usage"]["spec_accept_length"].as_f64().unwrap_or(1.0);
    assert!(per_pass > 3.0, "{again}");
    drop(s);
    // A damaged file is left out (with a warning): the server starts and answers the same.
    let path = dir.join("drafter.mem");
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let s = Server::start(&args);
    let fresh = metric(&s, "spec_cache_requests").await;
    assert!(fresh >= 1.0 && fresh < restored, "{fresh} of {restored}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_restarted_server_with_a_storage_dir_reuses_its_prefixes() {
    let dir = std::env::temp_dir().join(format!("specula-hicache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dir_arg = dir.to_str().unwrap().to_string();
    let args = [
        "--enable-hierarchical-cache",
        "--hicache-storage-dir",
        dir_arg.as_str(),
    ];
    let body = with_system(&long_system_prompt(200), "Go on.", 8);
    let first = {
        let mut s = Server::start(&args);
        let (status, r) = post(&s.url("/v1/chat/completions"), body.clone()).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(cached_tokens(&r), 0);
        // A graceful stop writes the cache out.
        s.terminate();
        assert!(s.wait(Duration::from_secs(60)).success());
        r
    };
    let stored = std::fs::read_dir(&dir).unwrap().count();
    assert!(stored >= 12, "{stored} blocks stored");
    let s = Server::start(&args);
    let (status, again) = post(&s.url("/v1/chat/completions"), body).await;
    assert_eq!(status, 200, "{again}");
    let prompt = again["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cached_tokens(&again) >= prompt - 16, "{again}");
    assert!(metric(&s, "cached_tokens_total{tier=\"storage\"}").await > 0.0);
    assert_eq!(
        again["choices"][0]["message"]["content"], first["choices"][0]["message"]["content"],
        "KV read back from storage must give the same output"
    );
    drop(s);
    // Files whose data is cut short: the prefix is recomputed, the answer is the same.
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let len = std::fs::metadata(&path).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(len - 64).unwrap();
    }
    let s = Server::start(&args);
    let (status, damaged) = post(
        &s.url("/v1/chat/completions"),
        with_system(&long_system_prompt(200), "Go on.", 8),
    )
    .await;
    assert_eq!(status, 200, "{damaged}");
    assert_eq!(
        damaged["choices"][0]["message"]["content"], first["choices"][0]["message"]["content"],
        "an unreadable stored block must be recomputed"
    );
    drop(s);
    // An f16 cache finds none of the f32 blocks (another store, another fingerprint), writes its
    // own, and a restart reads them back to the same output.
    let args = [&args[..], &["--kv-cache-dtype", "f16"]].concat();
    let body = with_system(&long_system_prompt(200), "Go on.", 8);
    let first = {
        let mut s = Server::start(&args);
        let info = get_json(&s, "/server_info").await;
        assert_eq!(info["config"]["kv_cache_dtype"], "f16", "{info}");
        let (status, r) = post(&s.url("/v1/chat/completions"), body.clone()).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(cached_tokens(&r), 0, "f32 blocks read into an f16 cache");
        s.terminate();
        assert!(s.wait(Duration::from_secs(60)).success());
        r
    };
    let s = Server::start(&args);
    let (status, again) = post(&s.url("/v1/chat/completions"), body).await;
    assert_eq!(status, 200, "{again}");
    let prompt = again["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cached_tokens(&again) >= prompt - 16, "{again}");
    assert_eq!(
        again["choices"][0]["message"]["content"], first["choices"][0]["message"]["content"],
        "f16 KV read back from storage must give the same output"
    );
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
