//! Metrics: the HTTP side's latency histograms and counters here, the engine's in its
//! statistics, every one declared once in [`table::METRICS`] and written from there as Prometheus
//! text (`/metrics`, prefix `specula:`) and as `/server_info`'s counters.

mod render;
pub mod table;

pub(crate) use render::server_info;
use table::{Samples, Sources};

use engine::StatsSnapshot;
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

    /// The cumulative buckets, sum and count.
    fn samples(&self) -> Samples {
        let mut cumulative = 0;
        let mut buckets: Vec<(String, u64)> = (self.bounds.iter().zip(&self.counts))
            .map(|(b, c)| {
                cumulative += c.load(Relaxed);
                (b.to_string(), cumulative)
            })
            .collect();
        let count = self.count.load(Relaxed);
        buckets.push(("+Inf".into(), count));
        Samples::Histogram {
            buckets,
            sum: (self.sum_us.load(Relaxed) as f64 / 1e6).into(),
            count,
        }
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
    /// Requests refused because requests in preparation held the memory budget.
    pub rejected_memory: AtomicU64,
    /// Requests whose handler panicked (answered 500; the server went on).
    pub panics: AtomicU64,
    /// The listener's connection counters (it is handed this to count into).
    pub connections: std::sync::Arc<crate::listener::ConnectionStats>,
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
            rejected_memory: AtomicU64::new(0),
            panics: AtomicU64::new(0),
            connections: Default::default(),
            tool_calls: AtomicU64::new(0),
            tool_call_errors: AtomicU64::new(0),
        }
    }
}

impl ServerMetrics {
    pub fn finished(&self, outcome: Outcome) {
        self.finished[outcome as usize].fetch_add(1, Relaxed);
    }

    /// Finished requests by outcome.
    fn requests(&self) -> Samples {
        let labels = ["stop", "length", "abort", "error"];
        Samples::Labelled {
            label: "finish_reason",
            values: labels
                .iter()
                .zip(&self.finished)
                .map(|(l, n)| (*l, n.load(Relaxed).into()))
                .collect(),
        }
    }

    /// The Prometheus text exposition of every metric in [`table::METRICS`].
    pub fn render(&self, engine: &StatsSnapshot) -> String {
        render::prometheus(&self.sources(engine, 0))
    }

    /// What the metrics are read from: the engine's `snapshot` and these.
    pub(crate) fn sources<'a>(
        &'a self,
        engine: &'a StatsSnapshot,
        host_blocks_total: usize,
    ) -> Sources<'a> {
        Sources {
            engine,
            server: self,
            host_blocks_total,
        }
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
