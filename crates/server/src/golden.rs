//! Golden tests: `/metrics` and the counters of `/server_info` for fixed statistics, against
//! files in `testdata/` (`SPECULA_BLESS=1 cargo test -p server golden` rewrites them after a
//! deliberate change).

use crate::metrics::{Outcome, ServerMetrics};
use engine::StatsSnapshot;
use serde_json::Value;

/// A drafter's figures: verifications, draft tokens verified and accepted.
fn drafted(chosen: u64, proposed: u64, accepted: u64) -> engine::DrafterCounts {
    engine::DrafterCounts {
        chosen,
        proposed,
        accepted,
    }
}

/// Statistics with a different value in every field.
pub(crate) fn sample() -> (StatsSnapshot, ServerMetrics) {
    let mut accept_hist = [0; engine::ACCEPT_BUCKETS];
    for (i, n) in accept_hist.iter_mut().enumerate() {
        *n = (i as u64 * 7) % 5 + 1;
    }
    let engine = StatsSnapshot {
        in_flight: 9,
        running: 3,
        queued: 5,
        kv_used_blocks: 37,
        kv_total_blocks: 128,
        preemptions: 2,
        aborted: 4,
        prompt_tokens: 12_345,
        generation_tokens: 6_789,
        steps: 1_011,
        finished: 17,
        spec_proposed: 800,
        spec_accepted: 333,
        spec_verifications: 210,
        spec_tree_verifications: 55,
        spec_steps_on: 190,
        spec_steps_off: 23,
        grammar_masks: 640,
        grammar_mask_seconds: 0.032,
        grammar_forced_drafts: 96,
        grammar_forced_accepted: 90,
        accept_hist,
        step_cost_a: 0.0125,
        step_cost_b: 0.000_375,
        draft_cost: 0.000_8,
        catch_up_cost: 0.000_15,
        spec_catch_up_rows: 4_096,
        spec_catch_up_seconds: 0.75,
        spec_draft_seconds: 1.25,
        spec_cache_requests: 12,
        spec_cache_tokens: 5_400,
        spec_cache_bytes: 64_000,
        spec_drafters: [
            Some((engine::Algorithm::Eagle3, drafted(90, 320, 110))),
            Some((engine::Algorithm::Suffix, drafted(120, 480, 223))),
            None,
            None,
        ],
        step_phases_ms: [[0.5, 9.5, 0.25], [1.5, 14.0, 0.75]],
        step_phase_counts: [700, 190],
        cache_blocks: 61,
        cache_idle_blocks: 19,
        cache_evicted_blocks: 71,
        cache_prompt_tokens: 11_000,
        cache_hit_tokens: 4_400,
        cache_host_hit_tokens: 900,
        cache_host_blocks: 44,
        cache_demoted_blocks: 83,
        cache_promoted_blocks: 29,
        cache_storage_hit_tokens: 320,
        cache_stored_blocks: 47,
    };
    let server = ServerMetrics::default();
    for s in [0.003, 0.02, 0.3, 0.3, 7.0, 1000.0] {
        server.ttft.observe(s);
    }
    for s in [0.0005, 0.004, 0.004, 0.05, 3.0] {
        server.itl.observe(s);
    }
    for s in [0.4, 2.0, 45.0] {
        server.e2e.observe(s);
    }
    for (outcome, n) in [
        (Outcome::Stop, 6),
        (Outcome::Length, 3),
        (Outcome::Abort, 2),
        (Outcome::Error, 1),
    ] {
        for _ in 0..n {
            server.finished(outcome);
        }
    }
    server
        .rejected_overload
        .store(8, std::sync::atomic::Ordering::Relaxed);
    server
        .tool_calls
        .store(13, std::sync::atomic::Ordering::Relaxed);
    server
        .tool_call_errors
        .store(1, std::sync::atomic::Ordering::Relaxed);
    (engine, server)
}

/// `text` against `testdata/{file}`, or written there with `SPECULA_BLESS` set.
fn golden(file: &str, text: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(file);
    if std::env::var_os("SPECULA_BLESS").is_some() {
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap();
    assert!(text == want, "{file} differs:\n{text}");
}

/// The counter sections of `/server_info`.
fn counters(sources: &crate::metrics::table::Sources<'_>, prefix_cache: bool) -> Value {
    let mut map = serde_json::Map::new();
    crate::info::counters(&mut map, sources, prefix_cache);
    Value::Object(map)
}

/// `json` against `testdata/{file}` as JSON values (fields in any order), or written there.
fn golden_json(file: &str, json: &Value) {
    let text = serde_json::to_string_pretty(json).unwrap();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(file);
    if std::env::var_os("SPECULA_BLESS").is_some() {
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(*json == want, "{file} differs:\n{text}");
}

#[test]
fn metrics_text_is_unchanged() {
    let (engine, server) = sample();
    golden("metrics.txt", &server.render(&engine));
    let idle = ServerMetrics::default();
    golden("metrics_idle.txt", &idle.render(&StatsSnapshot::default()));
}

#[test]
fn server_info_counters_are_unchanged() {
    let (engine, server) = sample();
    golden_json(
        "server_info.json",
        &counters(&server.sources(&engine, 64), true),
    );
    let idle = ServerMetrics::default();
    golden_json(
        "server_info_idle.json",
        &counters(&idle.sources(&StatsSnapshot::default(), 0), false),
    );
}
