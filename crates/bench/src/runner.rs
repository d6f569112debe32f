//! The sweep: preflight, warm-up, then one level per concurrency value, each printed as it ends:
//! each level sends its own prompts, optionally after flushing the server's cache, and reads the
//! server's counters before and after.
//! [`Sweep`] runs it a level at a time, for callers that interleave two servers.

use crate::BenchError;
use crate::client::{Client, FlushOutcome, request_body};
use crate::config::BenchConfig;
use crate::cpu::process_cpu_seconds;
use crate::goodput::Goodput;
use crate::record::{ErrorClass, RequestRecord};
use crate::report::{
    Environment, LevelReport, RunReport, header, level_line, prompt_lines, verbose_lines,
};
use crate::server_metrics::{Scrape, ServerDeltas, parse as parse_metrics, server_of};
use crate::stats::LevelStats;
use crate::workload::{Dataset, PromptPlan, poisson_offsets};
use bytes::Bytes;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, mpsc};

/// How the sweep shows itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct Display {
    /// A progress bar per level on stderr (only drawn on a terminal).
    pub progress: bool,
    /// TTFT/TPOT/ITL/E2E lines under each level.
    pub verbose: bool,
}

/// Runs the whole sweep, writing the report lines to `out` as each level finishes.
pub async fn run_sweep(
    cfg: &BenchConfig,
    dataset: Arc<Dataset>,
    out: &mut dyn Write,
    display: Display,
) -> Result<RunReport, BenchError> {
    let mut sweep = Sweep::start(cfg, dataset, out, display).await?;
    for &c in &cfg.concurrency {
        let text = sweep.level(c).await;
        say(out, &text)?;
    }
    Ok(sweep.finish())
}

/// A sweep run a level at a time, so that two servers can take turns (`specula demo
/// --compare-spec`): [`Sweep::start`] checks the server and warms it up, [`Sweep::level`] runs one
/// level, [`Sweep::finish`] gives the run.
pub struct Sweep {
    cfg: BenchConfig,
    client: Client,
    model: String,
    dataset: Arc<Dataset>,
    plan: PromptPlan,
    offsets: Option<Vec<f64>>,
    display: Display,
    /// Whether the server answers `/metrics` (probed at start).
    server_metrics: bool,
    notes: Vec<String>,
    levels: Vec<LevelReport>,
    told_no_usage: bool,
    told_mismatch: bool,
    /// `--flush-cache` met a server that cannot flush: not asked again.
    flush_given_up: bool,
}

impl Sweep {
    /// Finds the model (`GET /v1/models`), prints the header and runs the warm-up, writing to
    /// `out` as it goes.
    pub async fn start(
        cfg: &BenchConfig,
        dataset: Arc<Dataset>,
        out: &mut dyn Write,
        display: Display,
    ) -> Result<Self, BenchError> {
        let max_level = cfg.concurrency.iter().copied().max().unwrap_or(1);
        let client = Client::new(cfg, max_level.max(cfg.warmup_requests))?;
        let served = client.list_models().await?;
        let model = match (&cfg.model, served.first()) {
            (Some(m), _) => m.clone(),
            (None, Some(m)) => m.clone(),
            (None, None) => return Err(BenchError::NoModel(cfg.base_url.clone())),
        };
        let plan = cfg.prompt_plan(dataset.prompts.len());
        let mut notes = dataset.notes.clone();
        let (prompts_line, reuse_note) = prompt_lines(&plan, cfg);
        // Any `/metrics` page is read around every level: the names it speaks may only show up
        // once requests have run.
        let metrics_page = client.metrics_text().await;
        let speaks = metrics_page
            .as_deref()
            .and_then(|text| server_of(&parse_metrics(text)));
        say(out, &header(cfg, &model, &dataset.name))?;
        say(out, &format!("  {prompts_line}\n"))?;
        if let Some(server) = speaks {
            say(
                out,
                &format!(
                    "  Server metrics: /metrics ({server} names), read before and after each level\n"
                ),
            )?;
        }
        for note in &dataset.notes {
            say(out, &format!("  Dataset: {note}\n"))?;
        }
        if let Some(note) = reuse_note {
            say(out, &format!("  Note: {note}\n"))?;
            notes.push(note);
        }
        say(out, "\n")?;

        if cfg.warmup_requests > 0 {
            warm_up(cfg, &client, &model, &dataset, &plan, display, out).await?;
        }
        let offsets = cfg
            .request_rate
            .map(|rate| poisson_offsets(rate, cfg.requests_per_level, cfg.seed));
        Ok(Self {
            cfg: cfg.clone(),
            client,
            model,
            dataset,
            plan,
            offsets,
            display,
            server_metrics: metrics_page.is_some(),
            notes,
            levels: Vec::with_capacity(cfg.concurrency.len()),
            told_no_usage: false,
            told_mismatch: false,
            flush_given_up: false,
        })
    }

    /// Runs the next level at concurrency `c` and returns its text: the result line, the
    /// verbose lines if asked for, the first error of each class and any note said for the
    /// first time. The level sends its own slice of the dataset (see [`PromptPlan`]).
    pub async fn level(&mut self, c: usize) -> String {
        let c = c.max(1);
        let index = self.levels.len();
        let mut notes = String::new();
        if self.cfg.flush_cache {
            notes += &self.flush(c).await;
        }
        let bodies: Vec<Bytes> = self
            .plan
            .level_positions(index)
            .map(|p| request_body(&self.cfg, &self.model, self.dataset.prompt(p)))
            .collect();
        let before = self.scrape().await;
        let cpu_before = process_cpu_seconds();
        let records = run_level(
            &self.client,
            bodies,
            c,
            self.offsets.as_deref(),
            self.display,
            c,
        )
        .await;
        let client_cpu_s = process_cpu_seconds() - cpu_before;
        let after = self.scrape().await;
        let mut stats = LevelStats::compute(c, &records);
        stats.client_cpu_s = client_cpu_s;
        stats.repeated_prompts = self.plan.repeated(index);
        stats.prompts_digest = Some(self.dataset.digest(self.plan.level_positions(index)));
        stats.goodput = self
            .cfg
            .goodput
            .map(|slo| Goodput::of(&slo, &records, stats.duration_s));
        stats.server = before
            .zip(after)
            .and_then(|(b, a)| ServerDeltas::between(&b, &a));
        let mut text = level_line(&stats);
        text.push('\n');
        if self.display.verbose {
            text += &verbose_lines(&stats);
        }
        for (class, message) in first_errors(&records) {
            text += &format!("      first {class} error: {message}\n");
        }
        text += &notes;
        text += &self.token_count_notes(&stats);
        self.levels.push(LevelReport {
            stats,
            requests: records,
        });
        text
    }

    /// Asks the server to empty its prefix cache; returns the note to print, if any. A server
    /// without the route, or one that refuses for good (its cache is off, the key lacks the
    /// rights), is told once and not asked again.
    async fn flush(&mut self, c: usize) -> String {
        if self.flush_given_up {
            return String::new();
        }
        let (kind, note) = match self.client.flush_cache().await {
            FlushOutcome::Flushed => return String::new(),
            FlushOutcome::Unsupported => {
                self.flush_given_up = true;
                (
                    "note",
                    "the server has no /flush_cache (nor vLLM's /reset_prefix_cache, served with VLLM_SERVER_DEV_MODE=1): --flush-cache cannot empty its cache, levels run without it".to_string(),
                )
            }
            FlushOutcome::Refused(why) => {
                self.flush_given_up = true;
                (
                    "warning",
                    format!(
                        "the server refused to flush its cache ({why}): levels run without flushing"
                    ),
                )
            }
            FlushOutcome::Busy(why) => (
                "warning",
                format!("C={c}: the server was still busy, its cache was not flushed: {why}"),
            ),
        };
        self.notes.push(note.clone());
        format!("      {kind}: {note}\n")
    }

    /// The server's counters now, where it has a metrics page.
    async fn scrape(&self) -> Option<Scrape> {
        if !self.server_metrics {
            return None;
        }
        self.client
            .metrics_text()
            .await
            .map(|text| parse_metrics(&text))
    }

    /// The once-a-run notes about how completion tokens were counted.
    fn token_count_notes(&mut self, stats: &LevelStats) -> String {
        let c = stats.concurrency;
        let mut text = String::new();
        if stats.without_usage > 0 && !self.told_no_usage {
            self.told_no_usage = true;
            let note = if self.cfg.stream {
                format!(
                    "the server sent no usage (C={c}): completion tokens are counted as content chunks, which undercounts when a chunk holds several tokens"
                )
            } else {
                format!(
                    "the server sent no usage (C={c}): without streaming there is nothing to count, so completion tokens and throughput show 0; stream, or use a server that reports usage"
                )
            };
            text += &format!("      note: {note}\n");
            self.notes.push(note);
        }
        if stats.usage_chunk_mismatch > 0 && !self.told_mismatch {
            self.told_mismatch = true;
            let note = format!(
                "at C={c}, {} of {} requests have usage and content-chunk counts more than 10% apart (chunks hold several tokens, e.g. under speculation): ITL is per chunk, token counts come from usage",
                stats.usage_chunk_mismatch, stats.ok
            );
            text += &format!("      warning: {note}\n");
            self.notes.push(note);
        }
        text
    }

    /// The run so far: the config (its levels those that ran, in order), environment, notes and
    /// levels.
    pub fn finish(self) -> RunReport {
        let mut config = self.cfg;
        config.concurrency = self.levels.iter().map(|l| l.stats.concurrency).collect();
        RunReport {
            environment: Environment::detect(&config.base_url, &self.model),
            config,
            notes: self.notes,
            levels: self.levels,
        }
    }
}

/// The unmeasured requests before the first level, from the plan's warm-up positions.
async fn warm_up(
    cfg: &BenchConfig,
    client: &Client,
    model: &str,
    dataset: &Dataset,
    plan: &PromptPlan,
    display: Display,
    out: &mut dyn Write,
) -> Result<(), BenchError> {
    say(
        out,
        &format!("  Warming up with {} requests...\n", cfg.warmup_requests),
    )?;
    let bodies: Vec<Bytes> = plan
        .warmup_positions()
        .map(|p| request_body(cfg, model, dataset.prompt(p)))
        .collect();
    let records = run_level(client, bodies, cfg.warmup_requests, None, display, 0).await;
    let failed: Vec<&RequestRecord> = records.iter().filter(|r| !r.ok()).collect();
    match failed.first().and_then(|r| r.error.as_ref()) {
        None => say(out, "  Warmup done.\n\n"),
        Some(e) => say(
            out,
            &format!(
                "  Warmup done ({}/{} failed; first: {}: {}).\n\n",
                failed.len(),
                records.len(),
                e.class,
                e.message
            ),
        ),
    }
}

/// Writes and flushes at once, so `tail -f` on a redirected log shows each line live.
fn say(out: &mut dyn Write, text: &str) -> Result<(), BenchError> {
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// Sends `bodies` with at most `concurrency` in flight (and, given `offsets`, not before each
/// request's arrival time). Returns the records in request order.
async fn run_level(
    client: &Client,
    bodies: Vec<Bytes>,
    concurrency: usize,
    offsets: Option<&[f64]>,
    display: Display,
    label: usize,
) -> Vec<RequestRecord> {
    let n = bodies.len();
    let bar = progress_bar(display.progress, n, label);
    let level_start = Instant::now();
    let slots = Arc::new(Semaphore::new(concurrency.max(1)));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let offsets = offsets.map(<[f64]>::to_vec);
    let client = client.clone();
    let dispatcher = tokio::spawn(async move {
        for (i, body) in bodies.into_iter().enumerate() {
            if let Some(at) = offsets.as_ref().and_then(|o| o.get(i)) {
                tokio::time::sleep_until((level_start + Duration::from_secs_f64(*at)).into()).await;
            }
            let slot = Arc::clone(&slots)
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            let (client, tx) = (client.clone(), tx.clone());
            tokio::spawn(async move {
                let record = client.send(i, body, level_start).await;
                drop(slot);
                // The receiver lives until every sender is gone.
                let _ = tx.send(record);
            });
        }
    });
    let mut records = Vec::with_capacity(n);
    while let Some(record) = rx.recv().await {
        bar.inc(1);
        records.push(record);
    }
    // All senders are gone, so the dispatcher has finished; a panic there is a bug worth seeing.
    dispatcher.await.expect("dispatcher task panicked");
    bar.finish_and_clear();
    records.sort_by_key(|r| r.index);
    records
}

fn progress_bar(enabled: bool, n: usize, level: usize) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(n as u64);
    let label = if level == 0 {
        "warm-up".to_string()
    } else {
        format!("C={level:>3}")
    };
    bar.set_style(
        ProgressStyle::with_template("  {prefix} [{bar:30}] {pos}/{len} {elapsed}")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_prefix(label);
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// The first message of each error class, in class order.
fn first_errors(records: &[RequestRecord]) -> BTreeMap<ErrorClass, &str> {
    let mut first = BTreeMap::new();
    for e in records.iter().filter_map(|r| r.error.as_ref()) {
        first.entry(e.class).or_insert(e.message.as_str());
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DatasetSpec, Endpoint};
    use crate::mock::MockConfig;
    use crate::mock::ledger::MockEvent;

    async fn mock_cfg(mock: MockConfig) -> BenchConfig {
        let addr = crate::mock::spawn(mock).await.unwrap();
        BenchConfig {
            base_url: format!("http://{addr}"),
            max_tokens: 6,
            concurrency: vec![1, 2],
            requests_per_level: 4,
            warmup_requests: 1,
            dataset: DatasetSpec::Rewrite,
            ..BenchConfig::default()
        }
    }

    #[tokio::test]
    async fn a_mock_that_reports_accept_lengths_gets_them_on_every_level() {
        let mock = MockConfig {
            tokens_per_second: 2000.0,
            ttft_ms: 1.0,
            spec_accept_length: Some(3.5),
            ..MockConfig::default()
        };
        let mut cfg = mock_cfg(mock).await;
        let dataset = Arc::new(Dataset::load(&cfg.dataset, 1, 4).unwrap());
        for (stream, endpoint) in [(true, Endpoint::Chat), (false, Endpoint::Completions)] {
            cfg.stream = stream;
            cfg.endpoint = endpoint;
            let mut out = Vec::new();
            let run = run_sweep(&cfg, Arc::clone(&dataset), &mut out, Display::default())
                .await
                .unwrap();
            let text = String::from_utf8(out).unwrap();
            for level in &run.levels {
                assert_eq!(level.stats.ok, 4, "{text}");
                assert_eq!(level.stats.spec_accept_length, Some(3.5));
                assert_eq!(level.stats.spec_accept_reported, 4);
                assert!(
                    level
                        .requests
                        .iter()
                        .all(|r| r.spec_accept_length == Some(3.5))
                );
            }
            let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("  C=")).collect();
            assert_eq!(lines.len(), 2, "{text}");
            assert!(lines.iter().all(|l| l.ends_with("| accept 3.50")), "{text}");
        }
    }

    #[tokio::test]
    async fn levels_can_alternate_between_two_servers() {
        let fast = MockConfig {
            tokens_per_second: 2000.0,
            ttft_ms: 1.0,
            ..MockConfig::default()
        };
        let base_cfg = mock_cfg(fast.clone()).await;
        let cand_cfg = mock_cfg(MockConfig {
            spec_accept_length: Some(2.0),
            ..fast
        })
        .await;
        let dataset = Arc::new(Dataset::load(&base_cfg.dataset, 1, 4).unwrap());
        let mut out = Vec::new();
        let mut base = Sweep::start(
            &base_cfg,
            Arc::clone(&dataset),
            &mut out,
            Display::default(),
        )
        .await
        .unwrap();
        let mut cand = Sweep::start(&cand_cfg, dataset, &mut out, Display::default())
            .await
            .unwrap();
        for c in [2, 1] {
            assert!(!base.level(c).await.contains("accept"));
            assert!(cand.level(c).await.contains("| accept 2.00"));
        }
        let (base, cand) = (base.finish(), cand.finish());
        assert_eq!(base.config.concurrency, vec![2, 1]);
        assert_eq!(cand.levels.len(), 2);
        assert_eq!(cand.levels[1].stats.spec_accept_length, Some(2.0));
        assert_eq!(base.levels[0].stats.spec_accept_length, None);
    }

    /// A fast mock that records what it receives, and a 3-level sweep of 5 requests against it.
    async fn recording_mock(mock: MockConfig) -> (crate::mock::MockHandle, BenchConfig) {
        let handle = crate::mock::spawn_handle(MockConfig {
            tokens_per_second: 5000.0,
            ttft_ms: 1.0,
            ..mock
        })
        .await
        .unwrap();
        let cfg = BenchConfig {
            base_url: format!("http://{}", handle.addr),
            max_tokens: 4,
            concurrency: vec![1, 3, 2],
            requests_per_level: 5,
            warmup_requests: 2,
            dataset: DatasetSpec::Synthetic,
            ..BenchConfig::default()
        };
        (handle, cfg)
    }

    async fn sweep(cfg: &BenchConfig) -> (RunReport, String) {
        let dataset = Arc::new(Dataset::load(&cfg.dataset, cfg.seed, 0).unwrap());
        let mut out = Vec::new();
        let run = run_sweep(
            cfg,
            dataset,
            &mut out,
            Display {
                progress: false,
                verbose: true,
            },
        )
        .await
        .unwrap();
        (run, String::from_utf8(out).unwrap())
    }

    /// The prompts received, cut into the warm-up and each level (levels run one after another,
    /// so arrival order separates them), each level's as a sorted list.
    fn prompts_by_part(events: &[MockEvent], cfg: &BenchConfig) -> Vec<Vec<String>> {
        let prompts: Vec<String> = events
            .iter()
            .filter_map(|e| match e {
                MockEvent::Prompt { text } => Some(text.clone()),
                _ => None,
            })
            .collect();
        let mut sizes = vec![cfg.warmup_requests];
        sizes.extend(cfg.concurrency.iter().map(|_| cfg.requests_per_level));
        assert_eq!(prompts.len(), sizes.iter().sum::<usize>());
        let mut rest = prompts.as_slice();
        sizes
            .iter()
            .map(|&n| {
                let (part, tail) = rest.split_at(n);
                rest = tail;
                let mut part = part.to_vec();
                part.sort();
                part
            })
            .collect()
    }

    #[tokio::test]
    async fn no_prompt_repeats_across_levels_and_the_seed_fixes_each_levels_prompts() {
        let (first, cfg) = recording_mock(MockConfig::default()).await;
        let (run, text) = sweep(&cfg).await;
        assert!(
            text.contains("Prompts: each level sends its own 5"),
            "{text}"
        );
        let parts = prompts_by_part(&first.events(), &cfg);
        let all: std::collections::HashSet<&String> = parts.iter().flatten().collect();
        assert_eq!(all.len(), 2 + 3 * 5, "every prompt of the run is new");
        assert!(run.levels.iter().all(|l| l.stats.repeated_prompts == 0));

        // A second run with the same seed, against a fresh server: the same prompts level by
        // level; another seed: others.
        let (second, cfg2) = recording_mock(MockConfig::default()).await;
        sweep(&cfg2).await;
        assert_eq!(prompts_by_part(&second.events(), &cfg2), parts);
        let (third, cfg3) = recording_mock(MockConfig::default()).await;
        let cfg3 = BenchConfig { seed: 2, ..cfg3 };
        sweep(&cfg3).await;
        assert_ne!(prompts_by_part(&third.events(), &cfg3)[1], parts[1]);
    }

    #[tokio::test]
    async fn reuse_prompts_sends_the_same_prompts_at_every_level() {
        let (mock, cfg) = recording_mock(MockConfig::default()).await;
        let cfg = BenchConfig {
            reuse_prompts: true,
            ..cfg
        };
        let (run, text) = sweep(&cfg).await;
        assert!(text.contains("the same 5 at every level"), "{text}");
        let parts = prompts_by_part(&mock.events(), &cfg);
        assert_eq!(parts[1], parts[2]);
        assert_eq!(parts[1], parts[3]);
        assert!(
            parts[1].iter().all(|p| !parts[0].contains(p)),
            "warm-up apart"
        );
        let repeated: Vec<usize> = run
            .levels
            .iter()
            .map(|l| l.stats.repeated_prompts)
            .collect();
        assert_eq!(repeated, [0, 5, 5]);
    }

    #[tokio::test]
    async fn a_dataset_too_small_for_the_sweep_is_named_with_the_levels_that_repeat() {
        // rewrite has 36 prompts; 2 warm-up + 3 levels x 14 = 44 positions: the last level
        // sends 8 prompts again, and no prompt goes out more than twice.
        let (mock, cfg) = recording_mock(MockConfig::default()).await;
        let cfg = BenchConfig {
            requests_per_level: 14,
            dataset: DatasetSpec::Rewrite,
            ..cfg
        };
        let (run, text) = sweep(&cfg).await;
        assert!(
            text.contains("the dataset has 36 prompts and this sweep needs 44"),
            "{text}"
        );
        assert!(
            text.contains("levels C=2 (8 of 14) repeat prompts"),
            "{text}"
        );
        assert!(text.contains("none is sent more than 2 times"), "{text}");
        let repeated: Vec<usize> = run
            .levels
            .iter()
            .map(|l| l.stats.repeated_prompts)
            .collect();
        assert_eq!(repeated, [0, 0, 8]);
        assert!(run.notes.iter().any(|n| n.contains("needs 44")));
        let mut sends = std::collections::HashMap::new();
        for p in prompts_by_part(&mock.events(), &cfg).into_iter().flatten() {
            *sends.entry(p).or_insert(0) += 1;
        }
        assert_eq!(sends.len(), 36);
        assert_eq!(sends.values().filter(|&&n| n == 2).count(), 8);
    }

    #[tokio::test]
    async fn flush_cache_calls_the_route_once_before_each_level() {
        let (mock, cfg) = recording_mock(MockConfig {
            flush_cache: true,
            ..MockConfig::default()
        })
        .await;
        let cfg = BenchConfig {
            flush_cache: true,
            ..cfg
        };
        let (_, text) = sweep(&cfg).await;
        assert!(!text.contains("flush"), "{text}");
        // Events: the warm-up's prompts, then per level a flush and its 5 prompts.
        let shape: String = mock
            .events()
            .iter()
            .map(|e| match e {
                MockEvent::Prompt { .. } => 'p',
                MockEvent::Flush => 'F',
                MockEvent::Metrics => 'm',
            })
            .collect();
        assert_eq!(shape, "ppFpppppFpppppFppppp");
    }

    #[tokio::test]
    async fn flush_cache_against_a_server_without_it_warns_once() {
        let (mock, cfg) = recording_mock(MockConfig::default()).await;
        let cfg = BenchConfig {
            flush_cache: true,
            ..cfg
        };
        let (run, text) = sweep(&cfg).await;
        assert_eq!(text.matches("has no /flush_cache").count(), 1, "{text}");
        assert!(run.notes.iter().any(|n| n.contains("has no /flush_cache")));
        assert!(run.levels.iter().all(|l| l.stats.ok == 5), "{text}");
        assert!(!mock.events().contains(&MockEvent::Flush));
    }

    #[tokio::test]
    async fn server_counters_are_read_around_each_level() {
        let words = |p: &str| p.split_whitespace().count() as u64;
        for (reuse, flush) in [(false, false), (true, false), (true, true)] {
            let (mock, cfg) = recording_mock(MockConfig {
                metrics: true,
                flush_cache: true,
                spec_accept_length: Some(2.0),
                ..MockConfig::default()
            })
            .await;
            let cfg = BenchConfig {
                reuse_prompts: reuse,
                flush_cache: flush,
                ..cfg
            };
            let (run, text) = sweep(&cfg).await;
            assert!(
                text.contains("Server metrics: /metrics (specula names)"),
                "{text}"
            );
            let parts = prompts_by_part(&mock.events(), &cfg);
            for (k, level) in run.levels.iter().enumerate() {
                let d = level.stats.server.as_ref().expect("deltas");
                let prompt: u64 = parts[k + 1].iter().map(|p| words(p)).sum();
                assert_eq!(d.prompt_tokens, Some(prompt), "level {k}");
                assert_eq!(d.generation_tokens, Some(5 * 4));
                assert_eq!(
                    (d.spec_draft_tokens, d.spec_accepted_tokens),
                    (Some(40), Some(20))
                );
                assert_eq!((d.preemptions, d.rejected_requests), (Some(0), Some(0)));
                // Cached: only what an earlier level sent, and only if no flush came between.
                let hit = if reuse && !flush && k > 0 { 1.0 } else { 0.0 };
                assert_eq!(
                    d.cache_hit_rate,
                    Some(hit),
                    "reuse {reuse} flush {flush} level {k}"
                );
            }
            assert!(
                text.contains("      server (specula): cache hit "),
                "{text}"
            );
        }
    }

    #[tokio::test]
    async fn a_server_without_metrics_has_no_server_figures() {
        let (_, cfg) = recording_mock(MockConfig::default()).await;
        let (run, text) = sweep(&cfg).await;
        assert!(run.levels.iter().all(|l| l.stats.server.is_none()));
        assert!(
            !text.contains("Server metrics") && !text.contains("server ("),
            "{text}"
        );
    }

    #[tokio::test]
    async fn goodput_is_reported_per_level() {
        let (_, cfg) = recording_mock(MockConfig::default()).await;
        let generous = BenchConfig {
            goodput: Some(crate::goodput::Objectives::parse(&["ttft:10000", "e2e:60000"]).unwrap()),
            ..cfg.clone()
        };
        let (run, text) = sweep(&generous).await;
        for level in &run.levels {
            let g = level.stats.goodput.expect("goodput");
            assert_eq!((g.good, g.share), (5, 1.0));
            assert!((g.request_rate - 5.0 / level.stats.duration_s).abs() < 1e-9);
        }
        assert_eq!(text.matches("(100%)").count(), 3, "{text}");
        // No answer of 4 tokens at 5,000 tok/s after 1 ms comes back within 1 microsecond.
        let strict = BenchConfig {
            goodput: Some(crate::goodput::Objectives::parse(&["e2e:0.001"]).unwrap()),
            ..cfg
        };
        let (run, text) = sweep(&strict).await;
        assert!(
            run.levels
                .iter()
                .all(|l| l.stats.goodput.unwrap().good == 0)
        );
        assert!(text.contains("| goodput 0.00 req/s (0%)"), "{text}");
    }
}
