//! What one request did: timings, token counts, finish reason or the class of its failure.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Why a request failed. Each class is reported once per level with its first message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// No connection could be made, or it failed before a response came.
    Connect,
    /// The request did not finish within `--timeout`.
    Timeout,
    /// The server answered with a status other than 200.
    HttpStatus,
    /// The response stream broke off, carried an error object, or ended without a finish reason.
    BrokenStream,
    /// A response body or stream event was not the JSON we expect.
    BadJson,
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorClass::Connect => "connect",
            ErrorClass::Timeout => "timeout",
            ErrorClass::HttpStatus => "http status",
            ErrorClass::BrokenStream => "broken stream",
            ErrorClass::BadJson => "bad json",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestError {
    pub class: ErrorClass,
    pub message: String,
}

/// One request's record. Times are seconds; `start_s` counts from the start of its level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    pub index: usize,
    pub start_s: f64,
    /// End-to-end latency: send to last byte.
    pub latency_s: f64,
    /// Time to the first chunk with content (streaming only).
    pub ttft_s: Option<f64>,
    /// Gaps between consecutive content chunks (one per chunk, not per token).
    #[serde(default)]
    pub itl_s: Vec<f64>,
    pub http_status: Option<u16>,
    pub finish_reason: Option<String>,
    /// Completion tokens as counted for throughput: `usage` when the server sent it, else chunks.
    pub completion_tokens: u64,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    /// Chunks that carried content (text, reasoning or tool calls).
    pub content_chunks: u64,
    /// Whether `completion_tokens` came from the server's `usage`.
    pub usage_reported: bool,
    /// Speculative decoding: tokens emitted per verification pass (bonus token included), as the
    /// server's `usage.spec_accept_length` said (SGLang's extension); None when not reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_accept_length: Option<f64>,
    pub error: Option<RequestError>,
}

impl RequestRecord {
    pub fn new(index: usize, start_s: f64) -> Self {
        Self {
            index,
            start_s,
            latency_s: 0.0,
            ttft_s: None,
            itl_s: Vec::new(),
            http_status: None,
            finish_reason: None,
            completion_tokens: 0,
            prompt_tokens: None,
            cached_tokens: None,
            content_chunks: 0,
            usage_reported: false,
            spec_accept_length: None,
            error: None,
        }
    }

    /// A request counts as ok when it got HTTP 200 and a finish reason, and nothing failed.
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.http_status == Some(200) && self.finish_reason.is_some()
    }

    /// Seconds from the level's start to this request's last byte.
    pub fn end_s(&self) -> f64 {
        self.start_s + self.latency_s
    }

    /// Time per output token after the first: (latency − TTFT) / (tokens − 1).
    pub fn tpot_s(&self) -> Option<f64> {
        let ttft = self.ttft_s?;
        (self.completion_tokens > 1)
            .then(|| (self.latency_s - ttft) / (self.completion_tokens - 1) as f64)
    }

    pub fn fail(&mut self, class: ErrorClass, message: impl Into<String>) {
        if self.error.is_none() {
            self.error = Some(RequestError {
                class,
                message: message.into(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ok_needs_status_finish_and_no_error() {
        let mut r = RequestRecord::new(0, 0.0);
        assert!(!r.ok());
        r.http_status = Some(200);
        assert!(!r.ok(), "no finish reason yet");
        r.finish_reason = Some("length".into());
        assert!(r.ok());
        r.fail(ErrorClass::BrokenStream, "x");
        assert!(!r.ok());
    }

    #[test]
    fn tpot_excludes_first_token() {
        let mut r = RequestRecord::new(0, 0.0);
        r.latency_s = 2.0;
        r.ttft_s = Some(0.2);
        r.completion_tokens = 10;
        assert!((r.tpot_s().unwrap() - 0.2).abs() < 1e-12);
        r.completion_tokens = 1;
        assert_eq!(r.tpot_s(), None);
    }

    #[test]
    fn first_failure_wins() {
        let mut r = RequestRecord::new(0, 0.0);
        r.fail(ErrorClass::Timeout, "first");
        r.fail(ErrorClass::Connect, "second");
        assert_eq!(r.error.unwrap().class, ErrorClass::Timeout);
    }
}
