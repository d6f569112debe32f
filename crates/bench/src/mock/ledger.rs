//! What the mock server saw, for tests: every prompt received, every cache flush and metrics
//! read, in order (the first 100,000); and the counters its `/metrics` page shows, in specula's
//! names (a counter that has not moved is declared with no sample), moved by known
//! amounts per request (a prefix cache is simulated: a prompt seen since the last flush counts
//! all of its tokens as cached).

use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::fmt::Write as _;

/// One thing the mock was asked for, in arrival order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MockEvent {
    /// A generation request, by its prompt text (chat: the messages' contents joined by
    /// newlines).
    Prompt {
        text: String,
    },
    Flush,
    Metrics,
}

/// The counters of the mock's `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MockCounters {
    /// Words of each prompt (the mock's tokens).
    pub prompt_tokens: u64,
    /// Words of prompts already seen since the last flush.
    pub cached_tokens: u64,
    pub generation_tokens: u64,
    /// With `spec_accept_length` set, each request adds one verification and two draft tokens
    /// per output token, one of them accepted.
    pub spec_verifications: u64,
    pub spec_draft_tokens: u64,
    pub spec_accepted_tokens: u64,
    /// Requests answered with an injected HTTP 500.
    pub rejected_requests: u64,
}

/// The most events and distinct prompts kept, so a long benchmark of the client against the
/// mock stays bounded in memory (later ones are counted, not kept).
const MAX_KEPT: usize = 100_000;

#[derive(Debug, Default)]
pub struct Ledger {
    pub events: Vec<MockEvent>,
    pub counters: MockCounters,
    cached: HashSet<String>,
}

impl Ledger {
    /// Records a generation request; `tokens` is what will be generated, None when it is refused.
    pub fn request(&mut self, text: String, tokens: Option<u32>, speculating: bool) {
        let words = text.split_whitespace().count() as u64;
        let c = &mut self.counters;
        match tokens {
            None => c.rejected_requests += 1,
            Some(tokens) => {
                let tokens = u64::from(tokens);
                c.prompt_tokens += words;
                if self.cached.contains(&text) {
                    c.cached_tokens += words;
                } else if self.cached.len() < MAX_KEPT {
                    self.cached.insert(text.clone());
                }
                c.generation_tokens += tokens;
                if speculating {
                    c.spec_verifications += tokens;
                    c.spec_draft_tokens += 2 * tokens;
                    c.spec_accepted_tokens += tokens;
                }
            }
        }
        self.record(MockEvent::Prompt { text });
    }

    pub fn flush(&mut self) {
        self.cached.clear();
        self.record(MockEvent::Flush);
    }

    fn record(&mut self, event: MockEvent) {
        if self.events.len() < MAX_KEPT {
            self.events.push(event);
        }
    }

    /// The `/metrics` page (and the read is recorded).
    pub fn metrics(&mut self) -> String {
        self.record(MockEvent::Metrics);
        let c = self.counters;
        let mut out = String::new();
        let rows = [
            ("prompt_tokens_total", c.prompt_tokens),
            ("generation_tokens_total", c.generation_tokens),
            ("preemptions_total", 0),
            ("rejected_requests_total", c.rejected_requests),
            ("spec_verifications_total", c.spec_verifications),
            ("spec_draft_tokens_total", c.spec_draft_tokens),
            ("spec_accepted_tokens_total", c.spec_accepted_tokens),
        ];
        // As a Python client shows a labelled counter: declared always, sampled once it moved.
        for (name, value) in rows {
            let _ = writeln!(out, "# TYPE specula:{name} counter");
            if value > 0 {
                let _ = writeln!(out, "specula:{name} {value}");
            }
        }
        let _ = writeln!(
            out,
            "# TYPE specula:cached_tokens_total counter\nspecula:cached_tokens_total{{tier=\"device\"}} {}\nspecula:cached_tokens_total{{tier=\"host\"}} 0",
            c.cached_tokens
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server_metrics::{ServerDeltas, parse};

    #[test]
    fn counters_move_by_the_documented_amounts_and_read_back_as_specula() {
        let mut l = Ledger::default();
        let before = parse(&l.metrics());
        l.request("a b c".into(), Some(10), true);
        l.request("a b c".into(), Some(10), true);
        l.request("d".into(), None, true);
        let d = ServerDeltas::between(&before, &parse(&l.metrics())).unwrap();
        assert_eq!(d.server, "specula");
        assert_eq!((d.prompt_tokens, d.cached_tokens), (Some(6), Some(3)));
        assert_eq!(d.cache_hit_rate, Some(0.5));
        assert_eq!(d.generation_tokens, Some(20));
        assert_eq!(d.spec_acceptance(), Some(0.5));
        assert_eq!((d.preemptions, d.rejected_requests), (Some(0), Some(1)));
        l.flush();
        l.request("a b c".into(), Some(1), false);
        assert_eq!(l.counters.cached_tokens, 3, "a flushed cache misses");
        assert_eq!(l.events.len(), 7);
        assert_eq!(l.events[5], MockEvent::Flush);
    }
}
