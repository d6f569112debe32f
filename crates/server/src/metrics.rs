//! Prometheus metrics (prefix `specula:`): latency histograms observed by the HTTP side, token
//! and request counters, and the engine's live load.

use engine::StatsSnapshot;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A histogram with fixed upper bounds (seconds); sums kept in microseconds.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_us: AtomicU64,
    count: AtomicU64,
}

const LATENCY_BOUNDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];
const ITL_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56,
];

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, seconds: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| seconds <= b) {
            self.counts[i].fetch_add(1, Relaxed);
        }
        self.sum_us.fetch_add((seconds * 1e6) as u64, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(
            out,
            "# HELP specula:{name} {help}\n# TYPE specula:{name} histogram"
        );
        let mut cumulative = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cumulative += c.load(Relaxed);
            let _ = writeln!(out, "specula:{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        let count = self.count.load(Relaxed);
        let _ = writeln!(out, "specula:{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "specula:{name}_sum {}",
            self.sum_us.load(Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "specula:{name}_count {count}");
    }
}

/// How a request ended, for the request counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Stop,
    Length,
    Abort,
    Error,
}

#[derive(Debug)]
pub struct ServerMetrics {
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    finished: [AtomicU64; 4],
    pub rejected_overload: AtomicU64,
    pub rejected_invalid: AtomicU64,
    /// Tool calls parsed out of model output.
    pub tool_calls: AtomicU64,
    /// Tool-call markup whose body was not a call (returned as content).
    pub tool_call_errors: AtomicU64,
}

impl Default for ServerMetrics {
    fn default() -> Self {
        Self {
            ttft: Histogram::new(LATENCY_BOUNDS),
            itl: Histogram::new(ITL_BOUNDS),
            e2e: Histogram::new(LATENCY_BOUNDS),
            finished: Default::default(),
            rejected_overload: AtomicU64::new(0),
            rejected_invalid: AtomicU64::new(0),
            tool_calls: AtomicU64::new(0),
            tool_call_errors: AtomicU64::new(0),
        }
    }
}

impl ServerMetrics {
    pub fn finished(&self, outcome: Outcome) {
        self.finished[outcome as usize].fetch_add(1, Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn render(&self, engine: &StatsSnapshot) -> String {
        let mut out = String::new();
        let mut gauge = |name: &str, help: &str, kind: &str, value: f64| {
            let _ = writeln!(
                out,
                "# HELP specula:{name} {help}\n# TYPE specula:{name} {kind}\nspecula:{name} {value}"
            );
        };
        gauge(
            "num_running_reqs",
            "Requests being decoded or prefilled.",
            "gauge",
            engine.running as f64,
        );
        gauge(
            "num_queue_reqs",
            "Requests waiting for the engine.",
            "gauge",
            engine.queued as f64,
        );
        gauge(
            "kv_blocks_used",
            "KV cache blocks in use by requests (idle prefix-cache blocks count as free: they are evicted on demand).",
            "gauge",
            engine.kv_used_blocks as f64,
        );
        gauge(
            "kv_blocks_total",
            "KV cache blocks.",
            "gauge",
            engine.kv_total_blocks as f64,
        );
        let usage = if engine.kv_total_blocks > 0 {
            engine.kv_used_blocks as f64 / engine.kv_total_blocks as f64
        } else {
            0.0
        };
        gauge(
            "kv_cache_usage_ratio",
            "Fraction of KV cache blocks in use.",
            "gauge",
            usage,
        );
        gauge(
            "prompt_tokens_total",
            "Prompt tokens received by the engine.",
            "counter",
            engine.prompt_tokens as f64,
        );
        gauge(
            "generation_tokens_total",
            "Tokens generated.",
            "counter",
            engine.generation_tokens as f64,
        );
        gauge(
            "preemptions_total",
            "Requests preempted to free KV blocks (recomputed later).",
            "counter",
            engine.preemptions as f64,
        );
        gauge(
            "aborted_requests_total",
            "Requests aborted because the client went away.",
            "counter",
            engine.aborted as f64,
        );
        gauge(
            "engine_steps_total",
            "Forward passes run.",
            "counter",
            engine.steps as f64,
        );
        gauge(
            "rejected_requests_total",
            "Requests refused at capacity (503).",
            "counter",
            self.rejected_overload.load(Relaxed) as f64,
        );
        gauge(
            "tool_calls_total",
            "Tool calls parsed out of model output (--tool-call-parser).",
            "counter",
            self.tool_calls.load(Relaxed) as f64,
        );
        gauge(
            "tool_call_parse_errors_total",
            "Tool-call markup whose body was not a valid call; its text went out as content.",
            "counter",
            self.tool_call_errors.load(Relaxed) as f64,
        );
        gauge(
            "spec_draft_tokens_total",
            "Speculative draft tokens proposed.",
            "counter",
            engine.spec_proposed as f64,
        );
        gauge(
            "spec_accepted_tokens_total",
            "Speculative draft tokens accepted.",
            "counter",
            engine.spec_accepted as f64,
        );
        gauge(
            "spec_verifications_total",
            "Speculative verifications (one per speculating sequence and step).",
            "counter",
            engine.spec_verifications as f64,
        );
        gauge(
            "spec_tree_verifications_total",
            "Verifications of a draft tree with branches (--speculative-eagle-topk > 1).",
            "counter",
            engine.spec_tree_verifications as f64,
        );
        let rate = if engine.spec_proposed > 0 {
            engine.spec_accepted as f64 / engine.spec_proposed as f64
        } else {
            0.0
        };
        gauge(
            "spec_acceptance_rate",
            "Accepted / proposed draft tokens.",
            "gauge",
            rate,
        );
        gauge(
            "spec_steps_on_total",
            "Decode steps in which some sequence speculated.",
            "counter",
            engine.spec_steps_on as f64,
        );
        gauge(
            "spec_steps_off_total",
            "Decode steps with speculation enabled in which none did.",
            "counter",
            engine.spec_steps_off as f64,
        );
        gauge(
            "cache_hit_rate",
            "Share of admitted prompt tokens whose KV came from the prefix cache.",
            "gauge",
            engine.cache_hit_rate(),
        );
        gauge(
            "cache_blocks",
            "KV blocks held by the prefix cache (in use by requests or idle).",
            "gauge",
            engine.cache_blocks as f64,
        );
        gauge(
            "cache_host_blocks",
            "KV blocks in the prefix cache's host tier.",
            "gauge",
            engine.cache_host_blocks as f64,
        );
        gauge(
            "cache_demoted_blocks_total",
            "Prefix-cache blocks moved from the device pool to the host tier.",
            "counter",
            engine.cache_demoted_blocks as f64,
        );
        gauge(
            "cache_promoted_blocks_total",
            "Prefix-cache blocks brought back from the host tier instead of recomputed.",
            "counter",
            engine.cache_promoted_blocks as f64,
        );
        gauge(
            "cache_stored_blocks_total",
            "Prefix-cache blocks written to the storage tier.",
            "counter",
            engine.cache_stored_blocks as f64,
        );
        gauge(
            "cache_evicted_blocks_total",
            "Prefix-cache blocks dropped (from the host tier when there is one).",
            "counter",
            engine.cache_evicted_blocks as f64,
        );
        let _ = writeln!(
            out,
            "# HELP specula:spec_accept_length Draft tokens accepted per verification.\n# TYPE specula:spec_accept_length histogram"
        );
        let mut cumulative = 0;
        for (i, n) in engine.accept_hist.iter().enumerate() {
            cumulative += n;
            if i + 1 < engine.accept_hist.len() {
                let _ = writeln!(
                    out,
                    "specula:spec_accept_length_bucket{{le=\"{i}\"}} {cumulative}"
                );
            }
        }
        let _ = writeln!(
            out,
            "specula:spec_accept_length_bucket{{le=\"+Inf\"}} {cumulative}\nspecula:spec_accept_length_sum {}\nspecula:spec_accept_length_count {}",
            engine.spec_accepted, engine.spec_verifications
        );
        let _ = writeln!(
            out,
            "# HELP specula:cached_tokens_total Prompt tokens served from the prefix cache, by the tier they were in.\n# TYPE specula:cached_tokens_total counter\nspecula:cached_tokens_total{{tier=\"device\"}} {}\nspecula:cached_tokens_total{{tier=\"host\"}} {}\nspecula:cached_tokens_total{{tier=\"storage\"}} {}",
            engine.cache_hit_tokens
                - engine.cache_host_hit_tokens
                - engine.cache_storage_hit_tokens,
            engine.cache_host_hit_tokens,
            engine.cache_storage_hit_tokens
        );
        let _ = writeln!(
            out,
            "# HELP specula:requests_total Finished requests by outcome.\n# TYPE specula:requests_total counter"
        );
        for (i, label) in ["stop", "length", "abort", "error"].iter().enumerate() {
            let _ = writeln!(
                out,
                "specula:requests_total{{finish_reason=\"{label}\"}} {}",
                self.finished[i].load(Relaxed)
            );
        }
        self.ttft.render(
            &mut out,
            "time_to_first_token_seconds",
            "Time to first token.",
        );
        self.itl.render(
            &mut out,
            "inter_token_latency_seconds",
            "Time between tokens of a stream.",
        );
        self.e2e.render(
            &mut out,
            "e2e_request_latency_seconds",
            "Request latency, arrival to last token.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_counters_render() {
        let m = ServerMetrics::default();
        m.ttft.observe(0.02);
        m.ttft.observe(0.3);
        m.ttft.observe(1000.0);
        m.finished(Outcome::Length);
        let text = m.render(&StatsSnapshot {
            kv_used_blocks: 3,
            kv_total_blocks: 12,
            ..StatsSnapshot::default()
        });
        assert!(text.contains("specula:time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"));
        assert!(text.contains("specula:time_to_first_token_seconds_bucket{le=\"0.5\"} 2\n"));
        assert!(text.contains("specula:time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("specula:time_to_first_token_seconds_count 3\n"));
        assert!(text.contains("specula:kv_cache_usage_ratio 0.25\n"));
        assert!(text.contains("specula:requests_total{finish_reason=\"length\"} 1\n"));
    }
}
