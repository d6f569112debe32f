//! Per-level aggregates computed from request records, with the definitions docs/bench.md states.

use crate::goodput::Goodput;
use crate::record::{ErrorClass, RequestRecord};
use crate::server_metrics::ServerDeltas;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// avg/p50/p90/p99 of a sample; percentiles interpolate linearly between order statistics
/// (NumPy's default, which SGLang's and vLLM's benchmarks use).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Summary {
    pub count: usize,
    pub avg: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    pub fn of(values: &mut [f64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        values.sort_by(f64::total_cmp);
        Self {
            count: values.len(),
            avg: values.iter().sum::<f64>() / values.len() as f64,
            p50: percentile_sorted(values, 50.0),
            p90: percentile_sorted(values, 90.0),
            p99: percentile_sorted(values, 99.0),
            max: values[values.len() - 1],
        }
    }
}

/// The `q`th percentile (0–100) of sorted values, by linear interpolation.
pub fn percentile_sorted(sorted: &[f64], q: f64) -> f64 {
    assert!(!sorted.is_empty(), "percentile of an empty sample");
    let rank = q.clamp(0.0, 100.0) / 100.0 * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

/// Everything the report says about one concurrency level.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LevelStats {
    pub concurrency: usize,
    pub requests: usize,
    pub ok: usize,
    /// First send to last byte of the level, seconds.
    pub duration_s: f64,
    /// Completion tokens of the successful requests.
    pub completion_tokens: u64,
    pub prompt_tokens: u64,
    /// completion_tokens / duration_s.
    pub throughput_tok_s: f64,
    /// Mean over successful requests of completion tokens / latency.
    pub per_request_tok_s: f64,
    /// Successful requests per second.
    pub request_rate: f64,
    /// Σ latency / duration: how many requests were in flight on average (SGLang's "concurrency").
    pub effective_concurrency: f64,
    pub latency_s: Summary,
    pub ttft_s: Summary,
    pub tpot_s: Summary,
    pub itl_s: Summary,
    /// Failures per class.
    pub errors: BTreeMap<ErrorClass, usize>,
    /// Successful requests whose token count came from chunk counting (no `usage`).
    pub without_usage: usize,
    /// Successful requests where `usage` and the content-chunk count differ by more than 10%.
    pub usage_chunk_mismatch: usize,
    /// CPU seconds the benchmark process itself used during the level.
    #[serde(default)]
    pub client_cpu_s: f64,
    /// Speculative decoding: the mean over successful requests that reported it of the server's
    /// `usage.spec_accept_length` (tokens per verification pass, bonus token included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_accept_length: Option<f64>,
    /// Successful requests that reported an accept length.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub spec_accept_reported: usize,
    /// Requests whose prompt the run had already sent (the dataset was too small for a fresh
    /// slice per level, or `--reuse-prompts`).
    #[serde(default)]
    pub repeated_prompts: usize,
    /// A digest of the prompts the level sent (in order), so that `compare` can tell whether two
    /// runs' levels sent the same ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompts_digest: Option<String>,
    /// Requests that met every `--goodput` objective, and their rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput: Option<Goodput>,
    /// What the server's `/metrics` counters say happened during the level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerDeltas>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl LevelStats {
    pub fn compute(concurrency: usize, records: &[RequestRecord]) -> Self {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok()).collect();
        let duration_s = wall_time(records);
        let completion_tokens: u64 = ok.iter().map(|r| r.completion_tokens).sum();
        let prompt_tokens: u64 = ok.iter().filter_map(|r| r.prompt_tokens).sum();
        let per_req: Vec<f64> = ok
            .iter()
            .filter(|r| r.latency_s > 0.0)
            .map(|r| r.completion_tokens as f64 / r.latency_s)
            .collect();
        let mut latency: Vec<f64> = ok.iter().map(|r| r.latency_s).collect();
        let mut ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft_s).collect();
        let mut tpot: Vec<f64> = ok.iter().filter_map(|r| r.tpot_s()).collect();
        let mut itl: Vec<f64> = ok.iter().flat_map(|r| r.itl_s.iter().copied()).collect();
        let accept: Vec<f64> = ok.iter().filter_map(|r| r.spec_accept_length).collect();
        let mut errors = BTreeMap::new();
        for r in records {
            if let Some(e) = &r.error {
                *errors.entry(e.class).or_insert(0) += 1;
            } else if !r.ok() {
                // Defensive: a record that is neither ok nor classified counts as a broken stream.
                *errors.entry(ErrorClass::BrokenStream).or_insert(0) += 1;
            }
        }
        let rate = |x: f64| {
            if duration_s > 0.0 {
                x / duration_s
            } else {
                0.0
            }
        };
        Self {
            concurrency,
            requests: records.len(),
            ok: ok.len(),
            duration_s,
            completion_tokens,
            prompt_tokens,
            throughput_tok_s: rate(completion_tokens as f64),
            per_request_tok_s: mean(&per_req),
            request_rate: rate(ok.len() as f64),
            effective_concurrency: rate(latency.iter().sum()),
            latency_s: Summary::of(&mut latency),
            ttft_s: Summary::of(&mut ttft),
            tpot_s: Summary::of(&mut tpot),
            itl_s: Summary::of(&mut itl),
            errors,
            without_usage: ok.iter().filter(|r| !r.usage_reported).count(),
            usage_chunk_mismatch: ok.iter().filter(|r| usage_differs_from_chunks(r)).count(),
            client_cpu_s: 0.0,
            spec_accept_length: (!accept.is_empty()).then(|| mean(&accept)),
            spec_accept_reported: accept.len(),
            repeated_prompts: 0,
            prompts_digest: None,
            goodput: None,
            server: None,
        }
    }
}

/// First send to last byte over all records (failed ones included: they took the time too).
pub fn wall_time(records: &[RequestRecord]) -> f64 {
    let first = records
        .iter()
        .map(|r| r.start_s)
        .fold(f64::INFINITY, f64::min);
    let last = records.iter().map(|r| r.end_s()).fold(0.0, f64::max);
    if first.is_finite() {
        (last - first).max(0.0)
    } else {
        0.0
    }
}

fn usage_differs_from_chunks(r: &RequestRecord) -> bool {
    // A whole (non-streamed) response is one "chunk" whatever its length: nothing to compare.
    if !r.usage_reported || r.content_chunks == 0 || r.ttft_s.is_none() {
        return false;
    }
    let usage = r.completion_tokens as f64;
    let chunks = r.content_chunks as f64;
    (usage - chunks).abs() > 0.1 * usage.max(chunks)
}

pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::ErrorClass;

    fn ok_record(index: usize, start: f64, latency: f64, tokens: u64) -> RequestRecord {
        let mut r = RequestRecord::new(index, start);
        r.latency_s = latency;
        r.http_status = Some(200);
        r.finish_reason = Some("length".into());
        r.completion_tokens = tokens;
        r.content_chunks = tokens;
        r.usage_reported = true;
        r.ttft_s = Some(0.01);
        r
    }

    #[test]
    fn percentiles_match_numpy_linear() {
        // numpy.percentile(range(1, 101), [50, 90, 99]) == [50.5, 90.1, 99.01]
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Summary::of(&mut v);
        assert!((s.p50 - 50.5).abs() < 1e-9);
        assert!((s.p90 - 90.1).abs() < 1e-9);
        assert!((s.p99 - 99.01).abs() < 1e-9);
        assert!((s.avg - 50.5).abs() < 1e-9);
        assert_eq!(s.max, 100.0);
    }

    #[test]
    fn percentiles_of_a_known_skewed_distribution() {
        // 90 fast requests at 1 s and 10 slow ones at 10 s, shuffled.
        let mut v: Vec<f64> = (0..100)
            .map(|i| if i % 10 == 3 { 10.0 } else { 1.0 })
            .collect();
        let s = Summary::of(&mut v);
        assert_eq!(s.p50, 1.0);
        // rank 89.1 sits between the last fast (index 89) and the first slow one (index 90).
        assert!((s.p90 - 1.9).abs() < 1e-9);
        assert_eq!(s.p99, 10.0);
        assert!((s.avg - 1.9).abs() < 1e-9);
    }

    #[test]
    fn level_aggregates_follow_the_definitions() {
        let mut failed = RequestRecord::new(2, 0.5);
        failed.latency_s = 0.1;
        failed.fail(ErrorClass::HttpStatus, "HTTP 500");
        let records = vec![
            ok_record(0, 0.0, 2.0, 100),
            ok_record(1, 1.0, 3.0, 200),
            failed,
        ];
        let s = LevelStats::compute(2, &records);
        assert_eq!((s.requests, s.ok), (3, 2));
        assert_eq!(s.duration_s, 4.0);
        assert_eq!(s.completion_tokens, 300);
        assert!((s.throughput_tok_s - 75.0).abs() < 1e-9);
        // mean of 100/2 and 200/3
        assert!((s.per_request_tok_s - (50.0 + 200.0 / 3.0) / 2.0).abs() < 1e-9);
        assert!((s.effective_concurrency - 5.0 / 4.0).abs() < 1e-9);
        assert_eq!(s.errors.get(&ErrorClass::HttpStatus), Some(&1));
        assert_eq!(s.latency_s.count, 2);
    }

    #[test]
    fn usage_mismatch_is_flagged_beyond_ten_percent() {
        let mut a = ok_record(0, 0.0, 1.0, 100);
        a.content_chunks = 91;
        let mut b = ok_record(1, 0.0, 1.0, 100);
        b.content_chunks = 89;
        let mut whole = ok_record(2, 0.0, 1.0, 100);
        whole.ttft_s = None; // not streamed: one "chunk" whatever the length
        whole.content_chunks = 1;
        let s = LevelStats::compute(1, &[a, b, whole]);
        assert_eq!(s.usage_chunk_mismatch, 1);
    }

    #[test]
    fn accept_length_is_the_mean_over_the_requests_that_reported_it() {
        let mut a = ok_record(0, 0.0, 1.0, 10);
        a.spec_accept_length = Some(2.0);
        let mut b = ok_record(1, 0.0, 1.0, 10);
        b.spec_accept_length = Some(4.5);
        let silent = ok_record(2, 0.0, 1.0, 10);
        let mut failed = RequestRecord::new(3, 0.0);
        failed.spec_accept_length = Some(100.0);
        failed.fail(ErrorClass::BrokenStream, "cut");
        let s = LevelStats::compute(2, &[a, b, silent.clone(), failed]);
        assert_eq!(s.spec_accept_length, Some(3.25));
        assert_eq!(s.spec_accept_reported, 2);
        let s = LevelStats::compute(1, &[silent]);
        assert_eq!((s.spec_accept_length, s.spec_accept_reported), (None, 0));
    }

    #[test]
    fn empty_level_is_all_zero() {
        let s = LevelStats::compute(4, &[]);
        assert_eq!(s.duration_s, 0.0);
        assert_eq!(s.throughput_tok_s, 0.0);
        assert_eq!(s.latency_s.count, 0);
    }
}
