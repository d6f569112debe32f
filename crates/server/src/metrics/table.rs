//! Every metric, declared once: its name, help, kind, where `/server_info` shows it, and how its
//! value is read. `/metrics` and `/server_info` are both written from [`METRICS`]; a new metric is
//! one more row.

use super::ServerMetrics;
use engine::StatsSnapshot;

/// What a metric's value is read from.
pub struct Sources<'a> {
    pub engine: &'a StatsSnapshot,
    pub server: &'a ServerMetrics,
    /// The host tier's capacity in blocks (configuration; 0 without the tier).
    pub host_blocks_total: usize,
}

/// The Prometheus type of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One number: counts stay integers (in `/server_info` too), ratios and seconds are floats.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    Int(u64),
    Float(f64),
}

impl std::fmt::Display for Num {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Num::Int(n) => write!(f, "{n}"),
            Num::Float(x) => write!(f, "{x}"),
        }
    }
}

impl Num {
    pub fn json(self) -> serde_json::Value {
        match self {
            Num::Int(n) => n.into(),
            Num::Float(x) => x.into(),
        }
    }
}

impl From<u64> for Num {
    fn from(n: u64) -> Self {
        Num::Int(n)
    }
}

impl From<usize> for Num {
    fn from(n: usize) -> Self {
        Num::Int(n as u64)
    }
}

impl From<f64> for Num {
    fn from(x: f64) -> Self {
        Num::Float(x)
    }
}

/// A metric's samples at one moment.
#[derive(Debug, Clone, PartialEq)]
pub enum Samples {
    One(Num),
    /// One sample per value of the label `label`.
    Labelled {
        label: &'static str,
        values: Vec<(&'static str, Num)>,
    },
    /// Cumulative counts by upper bound (the last one `+Inf`), the sum and the count.
    Histogram {
        buckets: Vec<(String, u64)>,
        sum: Num,
        count: u64,
    },
}

impl<T: Into<Num>> From<T> for Samples {
    fn from(v: T) -> Self {
        Samples::One(v.into())
    }
}

/// One row of the table.
pub struct Metric {
    /// The name in `/metrics`, after the `specula:` prefix; `None`: only in `/server_info`.
    pub name: Option<&'static str>,
    pub help: &'static str,
    pub kind: Kind,
    /// Where `/server_info` puts the value (section, field, ...); `None`: only in `/metrics`.
    pub info: Option<&'static [&'static str]>,
    pub value: fn(&Sources<'_>) -> Samples,
}

impl Metric {
    const fn new(
        name: &'static str,
        kind: Kind,
        help: &'static str,
        value: fn(&Sources<'_>) -> Samples,
    ) -> Self {
        Self {
            name: Some(name),
            help,
            kind,
            info: None,
            value,
        }
    }

    const fn counter(
        name: &'static str,
        help: &'static str,
        value: fn(&Sources<'_>) -> Samples,
    ) -> Self {
        Self::new(name, Kind::Counter, help, value)
    }

    const fn gauge(
        name: &'static str,
        help: &'static str,
        value: fn(&Sources<'_>) -> Samples,
    ) -> Self {
        Self::new(name, Kind::Gauge, help, value)
    }

    const fn histogram(
        name: &'static str,
        help: &'static str,
        value: fn(&Sources<'_>) -> Samples,
    ) -> Self {
        Self::new(name, Kind::Histogram, help, value)
    }

    /// A value `/server_info` shows at `path` and `/metrics` does not.
    const fn info_only(
        path: &'static [&'static str],
        help: &'static str,
        value: fn(&Sources<'_>) -> Samples,
    ) -> Self {
        Self {
            name: None,
            help,
            kind: Kind::Gauge,
            info: Some(path),
            value,
        }
    }

    /// Also shown by `/server_info`, at `path`.
    const fn info(mut self, path: &'static [&'static str]) -> Self {
        self.info = Some(path);
        self
    }
}

fn ratio(num: u64, den: u64) -> f64 {
    if den > 0 {
        num as f64 / den as f64
    } else {
        0.0
    }
}

/// The accepted-drafts histogram: buckets 0..=15, the last bucket (16 or more) only in `+Inf`.
fn accept_length(e: &StatsSnapshot) -> Samples {
    let mut cumulative = 0;
    let mut buckets = Vec::new();
    for (i, n) in e.accept_hist.iter().enumerate() {
        cumulative += n;
        if i + 1 < e.accept_hist.len() {
            buckets.push((i.to_string(), cumulative));
        }
    }
    buckets.push(("+Inf".into(), cumulative));
    Samples::Histogram {
        buckets,
        sum: e.spec_accepted.into(),
        count: e.spec_verifications,
    }
}

/// Prompt tokens the prefix cache supplied, by the tier they were in.
fn cached_tokens(e: &StatsSnapshot) -> Samples {
    let device = e.cache_hit_tokens - e.cache_host_hit_tokens - e.cache_storage_hit_tokens;
    Samples::Labelled {
        label: "tier",
        values: vec![
            ("device", device.into()),
            ("host", e.cache_host_hit_tokens.into()),
            ("storage", e.cache_storage_hit_tokens.into()),
        ],
    }
}

/// One figure of each drafter of the combination (`pick`: from its counts), labelled by it.
fn by_drafter(e: &StatsSnapshot, pick: fn(&engine::DrafterCounts) -> u64) -> Samples {
    Samples::Labelled {
        label: "drafter",
        values: e
            .spec_drafters
            .iter()
            .flatten()
            .map(|(a, c)| (a.label(), pick(c).into()))
            .collect(),
    }
}

/// Every metric, in the order `/metrics` lists them (and `/server_info` its fields).
pub static METRICS: &[Metric] = &[
    Metric::info_only(
        &["stats", "in_flight"],
        "Requests admitted and not yet finished (running, queued, or on their way to the engine).",
        |s| s.engine.in_flight.into(),
    ),
    Metric::gauge(
        "num_running_reqs",
        "Requests being decoded or prefilled.",
        |s| s.engine.running.into(),
    )
    .info(&["stats", "running"]),
    Metric::gauge(
        "num_queue_reqs",
        "Requests waiting for the engine.",
        |s| s.engine.queued.into(),
    )
    .info(&["stats", "queued"]),
    Metric::gauge(
        "kv_blocks_used",
        "KV cache blocks in use by requests (idle prefix-cache blocks count as free: they are evicted on demand).",
        |s| s.engine.kv_used_blocks.into(),
    )
    .info(&["stats", "kv_blocks_used"]),
    Metric::gauge("kv_blocks_total", "KV cache blocks.", |s| {
        s.engine.kv_total_blocks.into()
    })
    .info(&["stats", "kv_blocks_total"]),
    Metric::gauge(
        "kv_cache_usage_ratio",
        "Fraction of KV cache blocks in use.",
        |s| ratio(s.engine.kv_used_blocks as u64, s.engine.kv_total_blocks as u64).into(),
    ),
    Metric::counter(
        "prompt_tokens_total",
        "Prompt tokens received by the engine.",
        |s| s.engine.prompt_tokens.into(),
    )
    .info(&["stats", "prompt_tokens"]),
    Metric::counter("generation_tokens_total", "Tokens generated.", |s| {
        s.engine.generation_tokens.into()
    })
    .info(&["stats", "generation_tokens"]),
    Metric::counter(
        "preemptions_total",
        "Requests preempted to free KV blocks (recomputed later).",
        |s| s.engine.preemptions.into(),
    )
    .info(&["stats", "preemptions"]),
    Metric::counter(
        "aborted_requests_total",
        "Requests aborted because the client went away.",
        |s| s.engine.aborted.into(),
    )
    .info(&["stats", "aborted"]),
    Metric::counter("engine_steps_total", "Forward passes run.", |s| {
        s.engine.steps.into()
    })
    .info(&["stats", "steps"]),
    Metric::info_only(
        &["stats", "finished"],
        "Requests the engine finished.",
        |s| s.engine.finished.into(),
    ),
    Metric::counter(
        "rejected_requests_total",
        "Requests refused at capacity (503).",
        |s| s.server.rejected_overload.load(super::Relaxed).into(),
    ),
    Metric::gauge(
        "open_connections",
        "HTTP connections open now.",
        |s| s.server.connections.open.load(super::Relaxed).into(),
    ),
    Metric::counter(
        "connections_evicted_total",
        "Idle connections closed to make room for a new one at --max-connections.",
        |s| s.server.connections.evicted_total.load(super::Relaxed).into(),
    ),
    Metric::counter(
        "connections_refused_total",
        "Connections answered 503 at --max-connections with every one busy.",
        |s| s.server.connections.refused_total.load(super::Relaxed).into(),
    ),
    Metric::counter(
        "header_read_timeouts_total",
        "Connections closed because request headers did not arrive within --header-read-timeout.",
        |s| s.server.connections.header_timeouts_total.load(super::Relaxed).into(),
    ),
    Metric::counter(
        "body_read_timeouts_total",
        "Request bodies that did not arrive within --body-read-timeout (408).",
        |s| s.server.connections.body_timeouts_total.load(super::Relaxed).into(),
    ),
    Metric::counter(
        "keep_alive_timeouts_total",
        "Keep-alive connections closed after --timeout-keep-alive without a request.",
        |s| s.server.connections.keep_alive_timeouts_total.load(super::Relaxed).into(),
    ),
    Metric::counter(
        "send_timeouts_total",
        "Connections closed after a response waited --send-timeout on a client that read nothing.",
        |s| s.server.connections.send_timeouts_total.load(super::Relaxed).into(),
    ),
    Metric::counter(
        "rejected_memory_requests_total",
        "Requests refused (503) while requests in preparation held the request memory budget.",
        |s| s.server.rejected_memory.load(super::Relaxed).into(),
    ),
    Metric::counter(
        "request_panics_total",
        "Requests whose handling panicked: each answered 500, the server went on.",
        |s| s.server.panics.load(super::Relaxed).into(),
    ),
    Metric::counter(
        "tool_calls_total",
        "Tool calls parsed out of model output (--tool-call-parser).",
        |s| s.server.tool_calls.load(super::Relaxed).into(),
    ),
    Metric::counter(
        "tool_call_parse_errors_total",
        "Tool-call markup whose body was not a valid call; its text went out as content.",
        |s| s.server.tool_call_errors.load(super::Relaxed).into(),
    ),
    Metric::counter(
        "grammar_masks_total",
        "Token masks computed for structured outputs (one per constrained position).",
        |s| s.engine.grammar_masks.into(),
    ),
    Metric::counter(
        "grammar_mask_seconds_total",
        "Seconds spent computing structured outputs' token masks.",
        |s| s.engine.grammar_mask_seconds.into(),
    ),
    Metric::counter(
        "grammar_forced_draft_tokens_total",
        "Drafts of tokens a grammar forced, verified by sequences the speculator did not draft.",
        |s| s.engine.grammar_forced_drafts.into(),
    ),
    Metric::counter(
        "grammar_forced_accepted_tokens_total",
        "Grammar-forced drafts accepted.",
        |s| s.engine.grammar_forced_accepted.into(),
    ),
    Metric::counter(
        "spec_draft_tokens_total",
        "Speculative draft tokens proposed.",
        |s| s.engine.spec_proposed.into(),
    )
    .info(&["speculative", "draft_tokens"]),
    Metric::counter(
        "spec_accepted_tokens_total",
        "Speculative draft tokens accepted.",
        |s| s.engine.spec_accepted.into(),
    )
    .info(&["speculative", "accepted_tokens"]),
    Metric::counter(
        "spec_verifications_total",
        "Speculative verifications (one per speculating sequence and step).",
        |s| s.engine.spec_verifications.into(),
    )
    .info(&["speculative", "verifications"]),
    Metric::counter(
        "spec_tree_verifications_total",
        "Verifications of a draft tree with branches (--speculative-eagle-topk > 1).",
        |s| s.engine.spec_tree_verifications.into(),
    )
    .info(&["speculative", "tree_verifications"]),
    Metric::gauge(
        "spec_acceptance_rate",
        "Accepted / proposed draft tokens.",
        |s| ratio(s.engine.spec_accepted, s.engine.spec_proposed).into(),
    )
    .info(&["speculative", "acceptance_rate"]),
    Metric::info_only(
        &["speculative", "accept_length"],
        "Tokens emitted per verification: 1 + accepted drafts / verifications (0 before any).",
        |s| {
            let e = s.engine;
            let rate = ratio(e.spec_accepted, e.spec_verifications);
            if e.spec_verifications > 0 { 1.0 + rate } else { 0.0 }.into()
        },
    ),
    Metric::counter(
        "spec_steps_on_total",
        "Decode steps in which some sequence speculated.",
        |s| s.engine.spec_steps_on.into(),
    )
    .info(&["speculative", "steps_on"]),
    Metric::counter(
        "spec_steps_off_total",
        "Decode steps with speculation enabled in which none did.",
        |s| s.engine.spec_steps_off.into(),
    )
    .info(&["speculative", "steps_off"]),
    Metric::info_only(
        &["speculative", "step_cost_ms", "a"],
        "The adaptive policy's fit of step time: milliseconds per step.",
        |s| (s.engine.step_cost_a * 1e3).into(),
    ),
    Metric::info_only(
        &["speculative", "step_cost_ms", "b_per_row"],
        "The adaptive policy's fit of step time: milliseconds per unit of work.",
        |s| (s.engine.step_cost_b * 1e3).into(),
    ),
    Metric::info_only(
        &["speculative", "draft_ms_per_token"],
        "Milliseconds the drafter takes per draft token (draft models and EAGLE-3 heads).",
        |s| (s.engine.draft_cost * 1e3).into(),
    ),
    Metric::info_only(
        &["speculative", "step_ms", "plain", "plan"],
        "Mean milliseconds a decode-only step without drafts spends in planning (drafting included).",
        |s| s.engine.step_phases_ms[0][0].into(),
    ),
    Metric::info_only(
        &["speculative", "step_ms", "plain", "forward"],
        "Mean milliseconds a decode-only step without drafts spends in the forward pass.",
        |s| s.engine.step_phases_ms[0][1].into(),
    ),
    Metric::info_only(
        &["speculative", "step_ms", "plain", "update"],
        "Mean milliseconds a decode-only step without drafts spends in sampling and verification.",
        |s| s.engine.step_phases_ms[0][2].into(),
    ),
    Metric::info_only(
        &["speculative", "step_ms", "plain", "steps"],
        "Decode-only steps without drafts that the step breakdown averages.",
        |s| s.engine.step_phase_counts[0].into(),
    ),
    Metric::info_only(
        &["speculative", "step_ms", "drafted", "plan"],
        "Mean milliseconds a decode-only step with drafts spends in planning (drafting included).",
        |s| s.engine.step_phases_ms[1][0].into(),
    ),
    Metric::info_only(
        &["speculative", "step_ms", "drafted", "forward"],
        "Mean milliseconds a decode-only step with drafts spends in the forward pass.",
        |s| s.engine.step_phases_ms[1][1].into(),
    ),
    Metric::info_only(
        &["speculative", "step_ms", "drafted", "update"],
        "Mean milliseconds a decode-only step with drafts spends in sampling and verification.",
        |s| s.engine.step_phases_ms[1][2].into(),
    ),
    Metric::info_only(
        &["speculative", "step_ms", "drafted", "steps"],
        "Decode-only steps with drafts that the step breakdown averages.",
        |s| s.engine.step_phase_counts[1].into(),
    ),
    Metric::info_only(
        &["speculative", "catch_up_ms_per_row"],
        "Milliseconds an EAGLE-3 head takes per row it catches up on before drafting (rows of \
         positions decoded while the sequence did not draft).",
        |s| (s.engine.catch_up_cost * 1e3).into(),
    ),
    Metric::counter(
        "spec_catch_up_rows_total",
        "Rows an EAGLE-3 head caught up on before drafting (positions decoded while their \
         sequence did not draft).",
        |s| s.engine.spec_catch_up_rows.into(),
    )
    .info(&["speculative", "catch_up_rows"]),
    Metric::counter(
        "spec_catch_up_seconds_total",
        "Seconds the drafter spent catching up before drafting.",
        |s| s.engine.spec_catch_up_seconds.into(),
    )
    .info(&["speculative", "catch_up_seconds"]),
    Metric::counter(
        "spec_draft_seconds_total",
        "Seconds the drafter spent proposing drafts (after catching up).",
        |s| s.engine.spec_draft_seconds.into(),
    )
    .info(&["speculative", "draft_seconds"]),
    Metric::counter(
        "spec_drafter_verifications_total",
        "Verifications of each drafter's drafts (a sequence's step it drafted for; with drafters \
         combined, the one chosen).",
        |s| by_drafter(s.engine, |c| c.chosen),
    ),
    Metric::counter(
        "spec_drafter_proposed_total",
        "Draft tokens of each drafter verified.",
        |s| by_drafter(s.engine, |c| c.proposed),
    ),
    Metric::counter(
        "spec_drafter_accepted_total",
        "Draft tokens of each drafter accepted.",
        |s| by_drafter(s.engine, |c| c.accepted),
    ),
    Metric::gauge(
        "spec_cache_requests",
        "Finished requests the SUFFIX drafter keeps to draft from.",
        |s| s.engine.spec_cache_requests.into(),
    )
    .info(&["speculative", "suffix_cache", "requests"]),
    Metric::gauge(
        "spec_cache_tokens",
        "Tokens of those requests (prompts and outputs) the SUFFIX drafter keeps.",
        |s| s.engine.spec_cache_tokens.into(),
    )
    .info(&["speculative", "suffix_cache", "tokens"]),
    Metric::gauge(
        "spec_cache_bytes",
        "Bytes the SUFFIX drafter's cache of earlier requests holds, about.",
        |s| s.engine.spec_cache_bytes.into(),
    )
    .info(&["speculative", "suffix_cache", "bytes"]),
    Metric::gauge(
        "cache_hit_rate",
        "Share of admitted prompt tokens whose KV came from the prefix cache.",
        |s| s.engine.cache_hit_rate().into(),
    )
    .info(&["prefix_cache", "hit_rate"]),
    Metric::info_only(
        &["prefix_cache", "prompt_tokens"],
        "Prompt tokens of admitted requests.",
        |s| s.engine.cache_prompt_tokens.into(),
    ),
    Metric::info_only(
        &["prefix_cache", "cached_tokens"],
        "Prompt tokens of admitted requests the prefix cache supplied.",
        |s| s.engine.cache_hit_tokens.into(),
    ),
    Metric::gauge(
        "cache_blocks",
        "KV blocks held by the prefix cache (in use by requests or idle).",
        |s| s.engine.cache_blocks.into(),
    )
    .info(&["prefix_cache", "device_blocks"]),
    Metric::info_only(
        &["prefix_cache", "device_idle_blocks"],
        "KV blocks held by the prefix cache and by no request.",
        |s| s.engine.cache_idle_blocks.into(),
    ),
    Metric::gauge(
        "cache_host_blocks",
        "KV blocks in the prefix cache's host tier.",
        |s| s.engine.cache_host_blocks.into(),
    )
    .info(&["prefix_cache", "host_blocks"]),
    Metric::info_only(
        &["prefix_cache", "host_blocks_total"],
        "KV blocks the host tier can hold (0 without one).",
        |s| s.host_blocks_total.into(),
    ),
    Metric::info_only(
        &["prefix_cache", "host_cached_tokens"],
        "Cached prompt tokens promoted from the host tier.",
        |s| s.engine.cache_host_hit_tokens.into(),
    ),
    Metric::counter(
        "cache_demoted_blocks_total",
        "Prefix-cache blocks moved from the device pool to the host tier.",
        |s| s.engine.cache_demoted_blocks.into(),
    )
    .info(&["prefix_cache", "demoted_blocks"]),
    Metric::counter(
        "cache_promoted_blocks_total",
        "Prefix-cache blocks brought back from the host tier instead of recomputed.",
        |s| s.engine.cache_promoted_blocks.into(),
    )
    .info(&["prefix_cache", "promoted_blocks"]),
    Metric::info_only(
        &["prefix_cache", "storage_cached_tokens"],
        "Cached prompt tokens read from the storage tier.",
        |s| s.engine.cache_storage_hit_tokens.into(),
    ),
    Metric::counter(
        "cache_stored_blocks_total",
        "Prefix-cache blocks written to the storage tier.",
        |s| s.engine.cache_stored_blocks.into(),
    )
    .info(&["prefix_cache", "stored_blocks"]),
    Metric::counter(
        "cache_evicted_blocks_total",
        "Prefix-cache blocks dropped (from the host tier when there is one).",
        |s| s.engine.cache_evicted_blocks.into(),
    )
    .info(&["prefix_cache", "evicted_blocks"]),
    Metric::histogram(
        "spec_accept_length",
        "Draft tokens accepted per verification.",
        |s| accept_length(s.engine),
    ),
    Metric::counter(
        "cached_tokens_total",
        "Prompt tokens served from the prefix cache, by the tier they were in.",
        |s| cached_tokens(s.engine),
    ),
    Metric::counter(
        "requests_total",
        "Finished requests by outcome.",
        |s| s.server.requests(),
    ),
    Metric::histogram(
        "time_to_first_token_seconds",
        "Time to first token.",
        |s| s.server.ttft.samples(),
    ),
    Metric::histogram(
        "inter_token_latency_seconds",
        "Time between tokens of a stream.",
        |s| s.server.itl.samples(),
    ),
    Metric::histogram(
        "e2e_request_latency_seconds",
        "Request latency, arrival to last token.",
        |s| s.server.e2e.samples(),
    ),
];
