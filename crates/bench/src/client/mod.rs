//! The HTTP client: one pooled `reqwest` client, requests built before the clock starts, and a
//! streaming reader that timestamps content chunks without allocating per token.

mod lean;
mod sse;

pub use sse::SseDecoder;

use crate::config::{BenchConfig, Endpoint};
use crate::record::{ErrorClass, RequestRecord};
use crate::workload::Prompt;
use bytes::Bytes;
use futures_util::StreamExt;
use lean::{LeanChunk, has_content};
use reqwest::header::{
    AUTHORIZATION, CONNECTION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue,
};
use serde_json::{Map, Value};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid header `{0}`: expected NAME:VALUE with a valid name and value")]
    BadHeader(String),
    #[error("cannot build the HTTP client: {0}")]
    Build(String),
    #[error("server {url} is unreachable: {message}")]
    Unreachable { url: String, message: String },
}

/// Whether a refused flush is the server saying it still has requests (SGLang answers 400 with
/// "When there are running or waiting requests, the operation will not be performed", specula
/// 409 or 400 naming the running requests): worth another try once they finish.
fn says_busy(status: u16, message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    matches!(status, 400 | 409 | 429 | 503)
        && ["running", "waiting", "busy", "in flight", "in progress"]
            .iter()
            .any(|w| message.contains(w))
}

/// What asking the server to empty its prefix cache did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlushOutcome {
    Flushed,
    /// The server has no route for it.
    Unsupported,
    /// The server still said it was busy after five seconds of tries.
    Busy(String),
    /// The server refused for another reason, or failed (the message says how).
    Refused(String),
}

#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base_url: String,
    url: String,
    stream: bool,
    timeout: Duration,
}

impl Client {
    /// Builds the client; the connection pool keeps up to `pool_size` idle connections.
    pub fn new(cfg: &BenchConfig, pool_size: usize) -> Result<Self, ClientError> {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(key) = &cfg.api_key {
            let value = HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|_| ClientError::BadHeader("Authorization: Bearer <api key>".into()))?;
            headers.insert(AUTHORIZATION, value);
        }
        if !cfg.keep_alive {
            headers.insert(CONNECTION, HeaderValue::from_static("close"));
        }
        for (name, value) in &cfg.headers {
            let bad = || ClientError::BadHeader(format!("{name}:{value}"));
            headers.insert(
                HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| bad())?,
                HeaderValue::from_str(value.trim()).map_err(|_| bad())?,
            );
        }
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .pool_max_idle_per_host(if cfg.keep_alive { pool_size } else { 0 })
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(10).min(cfg.timeout))
            .build()
            .map_err(|e| ClientError::Build(e.to_string()))?;
        let base_url = cfg.base_url.trim_end_matches('/').to_string();
        Ok(Self {
            url: format!("{base_url}{}", cfg.endpoint.path()),
            base_url,
            http,
            stream: cfg.stream,
            timeout: cfg.timeout,
        })
    }

    /// `GET /v1/models`: the served model ids. A connection failure means the server is
    /// unreachable; an HTTP error yields an empty list (some servers do not list models).
    pub async fn list_models(&self) -> Result<Vec<String>, ClientError> {
        let url = format!("{}/v1/models", self.base_url);
        let unreachable = |e: reqwest::Error| ClientError::Unreachable {
            url: self.base_url.clone(),
            message: error_chain(&e),
        };
        let resp = self
            .http
            .get(&url)
            .timeout(Duration::from_secs(30).min(self.timeout))
            .send()
            .await
            .map_err(unreachable)?;
        if !resp.status().is_success() {
            return Ok(Vec::new());
        }
        let bytes = resp.bytes().await.unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok(body["data"]
            .as_array()
            .map(|models| {
                models
                    .iter()
                    .filter_map(|m| m["id"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// `GET /metrics` as text; None when the server has none or cannot answer within 10 s.
    pub async fn metrics_text(&self) -> Option<String> {
        let resp = self
            .http
            .get(format!("{}/metrics", self.base_url))
            .timeout(Duration::from_secs(10).min(self.timeout))
            .send()
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        // A metrics page is small; a body past 16 MiB is not one.
        let bytes = resp.bytes().await.ok()?;
        (bytes.len() <= 16 << 20).then(|| String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Empties the server's prefix cache: SGLang's and specula's `POST /flush_cache` (`GET` where
    /// only that is served, as in older SGLang), else vLLM's `POST /reset_prefix_cache` (served
    /// with `VLLM_SERVER_DEV_MODE=1`). A server still finishing the last requests says it is busy;
    /// that is retried for up to five seconds. Any other refusal is final.
    pub async fn flush_cache(&self) -> FlushOutcome {
        const ROUTES: [&str; 2] = ["/flush_cache", "/reset_prefix_cache"];
        const TRIES: usize = 25;
        for route in ROUTES {
            let url = format!("{}{route}", self.base_url);
            let mut method = reqwest::Method::POST;
            let mut attempt = 0;
            let refusal = loop {
                let sent = self
                    .http
                    .request(method.clone(), &url)
                    .timeout(Duration::from_secs(30).min(self.timeout))
                    .send()
                    .await;
                let resp = match sent {
                    Ok(r) => r,
                    Err(e) => return FlushOutcome::Refused(error_chain(&e)),
                };
                let status = resp.status().as_u16();
                if resp.status().is_success() {
                    return FlushOutcome::Flushed;
                }
                if status == 405 && method == reqwest::Method::POST {
                    method = reqwest::Method::GET;
                    continue;
                }
                // No such route here: try the next spelling.
                if matches!(status, 404 | 405 | 501) {
                    break None;
                }
                let text = error_message(&resp.text().await.unwrap_or_default());
                attempt += 1;
                let why = format!("{route}: HTTP {status}: {text}");
                if !says_busy(status, &text) {
                    break Some(FlushOutcome::Refused(why));
                }
                if attempt == TRIES {
                    break Some(FlushOutcome::Busy(why));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            if let Some(outcome) = refusal {
                return outcome;
            }
        }
        FlushOutcome::Unsupported
    }

    /// Sends one prepared request body and records what happened. Never fails: a failure is
    /// part of the record. `level_start` anchors `start_s`.
    pub async fn send(&self, index: usize, body: Bytes, level_start: Instant) -> RequestRecord {
        let t0 = Instant::now();
        let mut rec = RequestRecord::new(index, t0.duration_since(level_start).as_secs_f64());
        let outcome = tokio::time::timeout(self.timeout, self.exchange(body, t0, &mut rec)).await;
        if outcome.is_err() {
            rec.fail(
                ErrorClass::Timeout,
                format!(
                    "no complete response within {:.1}s",
                    self.timeout.as_secs_f64()
                ),
            );
        }
        rec.latency_s = t0.elapsed().as_secs_f64();
        if rec.error.is_none() && rec.finish_reason.is_none() {
            rec.fail(
                ErrorClass::BrokenStream,
                "response ended without a finish reason",
            );
        }
        if !rec.usage_reported {
            // Streamed: one content chunk is one token for most servers. Whole responses give no
            // count at all without usage (the runner says so).
            rec.completion_tokens = if self.stream { rec.content_chunks } else { 0 };
        }
        rec
    }

    async fn exchange(&self, body: Bytes, t0: Instant, rec: &mut RequestRecord) {
        let resp = match self.http.post(&self.url).body(body).send().await {
            Ok(r) => r,
            Err(e) => return rec.fail(classify(&e), error_chain(&e)),
        };
        let status = resp.status().as_u16();
        rec.http_status = Some(status);
        if status != 200 {
            let text = resp.text().await.unwrap_or_default();
            return rec.fail(
                ErrorClass::HttpStatus,
                format!("HTTP {status}: {}", error_message(&text)),
            );
        }
        if self.stream {
            read_stream(resp, t0, rec).await;
        } else {
            match resp.bytes().await {
                Ok(bytes) => {
                    if let Err((class, msg)) = apply_event(&bytes, rec) {
                        rec.fail(class, msg);
                    }
                }
                Err(e) => rec.fail(ErrorClass::BrokenStream, error_chain(&e)),
            }
        }
    }
}

async fn read_stream(resp: reqwest::Response, t0: Instant, rec: &mut RequestRecord) {
    let mut decoder = SseDecoder::default();
    let mut stream = resp.bytes_stream();
    let mut last_content: Option<f64> = None;
    rec.itl_s.reserve(256);
    while let Some(read) = stream.next().await {
        let bytes = match read {
            Ok(b) => b,
            Err(e) => return rec.fail(ErrorClass::BrokenStream, error_chain(&e)),
        };
        // Every event of one network read arrived at the same moment.
        let now = t0.elapsed().as_secs_f64();
        let mut on_event = |data: &[u8]| {
            if data == b"[DONE]" {
                return Ok(());
            }
            let got_content = apply_event(data, rec)?;
            if got_content {
                match last_content {
                    None => rec.ttft_s = Some(now),
                    Some(prev) => rec.itl_s.push(now - prev),
                }
                last_content = Some(now);
            }
            Ok(())
        };
        if let Err((class, msg)) = decoder.feed(&bytes, &mut on_event) {
            return rec.fail(class, msg);
        }
    }
    let mut on_event = |data: &[u8]| {
        if data == b"[DONE]" {
            return Ok(());
        }
        apply_event(data, rec).map(|_| ())
    };
    if let Err((class, msg)) = decoder.finish(&mut on_event) {
        rec.fail(class, msg);
    }
}

/// Applies one JSON event (a stream chunk, or a whole non-streamed response) to the record.
/// Returns whether it carried content.
fn apply_event(data: &[u8], rec: &mut RequestRecord) -> Result<bool, (ErrorClass, String)> {
    let chunk: LeanChunk = serde_json::from_slice(data).map_err(|e| {
        let shown = String::from_utf8_lossy(&data[..data.len().min(120)]);
        (ErrorClass::BadJson, format!("{e} in `{shown}`"))
    })?;
    if let Some(err) = chunk.error {
        return Err((
            ErrorClass::BrokenStream,
            format!("error in response: {}", error_message(err.get())),
        ));
    }
    if let Some(usage) = chunk.usage {
        rec.completion_tokens = usage.completion_tokens;
        rec.prompt_tokens = usage.prompt_tokens;
        rec.cached_tokens = usage.prompt_tokens_details.and_then(|d| d.cached_tokens);
        rec.usage_reported = true;
        if let Some(accept) = usage.spec_accept_length.filter(|a| a.is_finite()) {
            rec.spec_accept_length = Some(accept);
        }
    }
    let mut content = false;
    if let Some(choice) = chunk.choices.and_then(|c| c.0) {
        content = choice.delta.as_ref().is_some_and(|d| d.has_content())
            || choice.message.as_ref().is_some_and(|m| m.has_content())
            || choice.text.is_some_and(has_content);
        if let Some(reason) = choice.finish_reason {
            rec.finish_reason = Some(reason.into_owned());
        }
    }
    if content {
        rec.content_chunks += 1;
    }
    Ok(content)
}

/// The request body for one prompt, serialised once before the level starts.
pub fn request_body(cfg: &BenchConfig, model: &str, prompt: &Prompt) -> Bytes {
    let mut body = Map::new();
    body.insert("model".into(), model.into());
    match cfg.endpoint {
        Endpoint::Chat => {
            body.insert(
                "messages".into(),
                serde_json::to_value(prompt.messages()).expect("messages serialise"),
            );
        }
        Endpoint::Completions => {
            body.insert("prompt".into(), prompt.text().into());
        }
    }
    body.insert("max_tokens".into(), cfg.max_tokens.into());
    body.insert("temperature".into(), f64::from(cfg.temperature).into());
    body.insert("stream".into(), cfg.stream.into());
    if cfg.stream {
        body.insert(
            "stream_options".into(),
            serde_json::json!({ "include_usage": true }),
        );
    }
    if cfg.ignore_eos {
        body.insert("ignore_eos".into(), true.into());
    }
    for (k, v) in &cfg.extra_body {
        body.insert(k.clone(), v.clone());
    }
    Bytes::from(serde_json::to_vec(&body).expect("JSON body serialises"))
}

fn classify(e: &reqwest::Error) -> ErrorClass {
    if e.is_timeout() {
        ErrorClass::Timeout
    } else if e.is_body() || e.is_decode() {
        ErrorClass::BrokenStream
    } else {
        ErrorClass::Connect
    }
}

/// The error and its sources on one line ("error sending request: connection refused").
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !msg.contains(&s_text) {
            msg.push_str(": ");
            msg.push_str(&s_text);
        }
        source = s.source();
    }
    msg
}

/// The `message` of an OpenAI error body, or the text itself (shortened) when it is not one.
fn error_message(text: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(text).ok();
    let message = parsed.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("error"))
            .and_then(Value::as_str)
    });
    let text = message.unwrap_or(text).trim();
    match text.char_indices().nth(200) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(events: &[&str]) -> RequestRecord {
        let mut rec = RequestRecord::new(0, 0.0);
        for e in events {
            apply_event(e.as_bytes(), &mut rec).unwrap();
        }
        rec
    }

    #[test]
    fn chat_chunks_count_content_and_take_usage() {
        let rec = applied(&[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"lo \"x\""},"finish_reason":"length"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":9,"total_tokens":16,
                "prompt_tokens_details":{"cached_tokens":3}}}"#,
        ]);
        assert_eq!(rec.content_chunks, 3, "the role-only chunk is no token");
        assert_eq!(rec.completion_tokens, 9);
        assert_eq!(rec.prompt_tokens, Some(7));
        assert_eq!(rec.cached_tokens, Some(3));
        assert!(rec.usage_reported);
        assert_eq!(rec.finish_reason.as_deref(), Some("length"));
        assert_eq!(rec.spec_accept_length, None, "no speculation reported");
    }

    #[test]
    fn speculative_accept_length_comes_from_usage() {
        let rec = applied(&[
            r#"{"choices":[{"index":0,"delta":{"content":"a b c"},"finish_reason":"length"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":9,"total_tokens":16,
                "spec_accept_length":3.25}}"#,
        ]);
        assert_eq!(rec.spec_accept_length, Some(3.25));
        let rec = applied(&[
            r#"{"choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],
                "usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,
                "spec_accept_length":1.5}}"#,
        ]);
        assert_eq!(rec.spec_accept_length, Some(1.5), "whole responses too");
        let rec = applied(&[
            r#"{"choices":[],"usage":{"completion_tokens":2,"spec_accept_length":null}}"#,
        ]);
        assert_eq!(rec.spec_accept_length, None);
    }

    #[test]
    fn completions_and_whole_responses() {
        let rec = applied(&[r#"{"choices":[{"text":"abc","finish_reason":"stop","index":0}]}"#]);
        assert_eq!((rec.content_chunks, rec.usage_reported), (1, false));
        let rec = applied(&[
            r#"{"choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],
                "usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}"#,
        ]);
        assert_eq!((rec.content_chunks, rec.completion_tokens), (1, 2));
        let rec = applied(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}"#,
        ]);
        assert_eq!(rec.content_chunks, 1, "tool-call deltas are output too");
    }

    #[test]
    fn bad_json_and_error_objects_are_classified() {
        let mut rec = RequestRecord::new(0, 0.0);
        let err = apply_event(b"{not json", &mut rec).unwrap_err();
        assert_eq!(err.0, ErrorClass::BadJson);
        let err = apply_event(br#"{"error":{"message":"boom"}}"#, &mut rec).unwrap_err();
        assert_eq!(err.0, ErrorClass::BrokenStream);
        assert!(err.1.contains("boom"));
    }

    #[test]
    fn body_has_the_fields_servers_expect() {
        let mut cfg = BenchConfig::default();
        cfg.extra_body.insert("top_k".into(), 5.into());
        cfg.extra_body.insert("temperature".into(), 0.5.into());
        let body = request_body(&cfg, "m", &Prompt::Text("hi".into()));
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["model"], "m");
        assert_eq!(v["messages"][0]["content"], "hi");
        assert_eq!(v["max_tokens"], 200);
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["ignore_eos"], true);
        assert_eq!(v["top_k"], 5);
        assert_eq!(v["temperature"], 0.5, "extra body overrides");
        cfg.endpoint = Endpoint::Completions;
        cfg.ignore_eos = false;
        cfg.stream = false;
        let v: Value =
            serde_json::from_slice(&request_body(&cfg, "m", &Prompt::Text("hi".into()))).unwrap();
        assert_eq!(v["prompt"], "hi");
        assert!(v.get("ignore_eos").is_none() && v.get("stream_options").is_none());
    }

    #[test]
    fn error_messages_come_out_of_openai_bodies() {
        assert_eq!(
            error_message(r#"{"error":{"message":"queue full"}}"#),
            "queue full"
        );
        assert_eq!(error_message("plain text"), "plain text");
        assert!(error_message(&"x".repeat(500)).ends_with('…'));
    }

    /// A client for a test server made of `app`, on a free loopback port.
    async fn client_for(app: axum::Router) -> Client {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let cfg = BenchConfig {
            base_url: format!("http://{addr}"),
            ..BenchConfig::default()
        };
        Client::new(&cfg, 1).unwrap()
    }

    #[tokio::test]
    async fn flush_cache_retries_a_busy_server_and_not_a_refusal() {
        use axum::http::StatusCode;
        use axum::routing::{get, post};
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        // Busy twice (specula's words), then flushed.
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&calls);
        let busy = axum::Router::new().route(
            "/flush_cache",
            post(move || {
                let n = seen.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n < 2 {
                        let body = r#"{"error":{"message":"cannot flush the cache: 2 requests are running or waiting"}}"#;
                        (StatusCode::BAD_REQUEST, body)
                    } else {
                        (StatusCode::OK, "{}")
                    }
                }
            }),
        );
        assert_eq!(
            client_for(busy).await.flush_cache().await,
            FlushOutcome::Flushed
        );
        assert_eq!(calls.load(Ordering::SeqCst), 3);

        // A cache that is off: refused at once, no retries.
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&calls);
        let off = axum::Router::new().route(
            "/flush_cache",
            post(move || {
                seen.fetch_add(1, Ordering::SeqCst);
                async { (StatusCode::BAD_REQUEST, "the prefix cache is off") }
            }),
        );
        match client_for(off).await.flush_cache().await {
            FlushOutcome::Refused(why) => assert!(why.contains("HTTP 400"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        // vLLM's spelling; GET where only GET is served; nothing at all.
        let vllm = axum::Router::new().route("/reset_prefix_cache", post(|| async { "" }));
        assert_eq!(
            client_for(vllm).await.flush_cache().await,
            FlushOutcome::Flushed
        );
        let get_only = axum::Router::new().route("/flush_cache", get(|| async { "" }));
        assert_eq!(
            client_for(get_only).await.flush_cache().await,
            FlushOutcome::Flushed
        );
        let none = client_for(axum::Router::new()).await;
        assert_eq!(none.flush_cache().await, FlushOutcome::Unsupported);
        assert_eq!(none.metrics_text().await, None);
    }

    #[test]
    fn busy_is_read_from_the_status_and_the_words() {
        assert!(says_busy(
            400,
            "When there are running or waiting requests, the operation will not be performed"
        ));
        assert!(says_busy(409, "busy"));
        assert!(!says_busy(
            400,
            "the prefix cache is off (--disable-radix-cache)"
        ));
        assert!(!says_busy(401, "running"));
    }
}
