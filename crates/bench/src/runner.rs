//! The sweep: preflight, warm-up, then one level per concurrency value, each printed as it ends.
//! [`Sweep`] runs it a level at a time, for callers that interleave two servers.

use crate::BenchError;
use crate::client::{Client, request_body};
use crate::config::BenchConfig;
use crate::cpu::process_cpu_seconds;
use crate::record::{ErrorClass, RequestRecord};
use crate::report::{Environment, LevelReport, RunReport, header, level_line, verbose_lines};
use crate::stats::LevelStats;
use crate::workload::{Dataset, poisson_offsets};
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
    dataset: &Dataset,
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
    bodies: Vec<Bytes>,
    offsets: Option<Vec<f64>>,
    display: Display,
    notes: Vec<String>,
    levels: Vec<LevelReport>,
    told_no_usage: bool,
    told_mismatch: bool,
}

impl Sweep {
    /// Finds the model (`GET /v1/models`), prints the header and runs the warm-up, writing to
    /// `out` as it goes.
    pub async fn start(
        cfg: &BenchConfig,
        dataset: &Dataset,
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
        say(out, &header(cfg, &model, &dataset.name))?;
        for note in &dataset.notes {
            say(out, &format!("  Dataset: {note}\n"))?;
        }
        say(out, "\n")?;

        if cfg.warmup_requests > 0 {
            say(
                out,
                &format!("  Warming up with {} requests...\n", cfg.warmup_requests),
            )?;
            let bodies: Vec<Bytes> = (0..cfg.warmup_requests)
                .map(|i| request_body(cfg, &model, dataset.warmup_prompt(i)))
                .collect();
            let records = run_level(&client, bodies, cfg.warmup_requests, None, display, 0).await;
            let failed: Vec<&RequestRecord> = records.iter().filter(|r| !r.ok()).collect();
            match failed.first().and_then(|r| r.error.as_ref()) {
                None => say(out, "  Warmup done.\n\n")?,
                Some(e) => say(
                    out,
                    &format!(
                        "  Warmup done ({}/{} failed; first: {}: {}).\n\n",
                        failed.len(),
                        records.len(),
                        e.class,
                        e.message
                    ),
                )?,
            }
        }

        let bodies: Vec<Bytes> = (0..cfg.requests_per_level)
            .map(|i| request_body(cfg, &model, dataset.request_prompt(i)))
            .collect();
        let offsets = cfg
            .request_rate
            .map(|rate| poisson_offsets(rate, cfg.requests_per_level, cfg.seed));
        Ok(Self {
            cfg: cfg.clone(),
            client,
            model,
            bodies,
            offsets,
            display,
            notes: dataset.notes.clone(),
            levels: Vec::with_capacity(cfg.concurrency.len()),
            told_no_usage: false,
            told_mismatch: false,
        })
    }

    /// Runs one level at concurrency `c` and returns its text: the result line, the verbose
    /// lines if asked for, the first error of each class and any note said for the first time.
    pub async fn level(&mut self, c: usize) -> String {
        let c = c.max(1);
        let cpu_before = process_cpu_seconds();
        let records = run_level(
            &self.client,
            self.bodies.clone(),
            c,
            self.offsets.as_deref(),
            self.display,
            c,
        )
        .await;
        let mut stats = LevelStats::compute(c, &records);
        stats.client_cpu_s = process_cpu_seconds() - cpu_before;
        let mut text = level_line(&stats);
        text.push('\n');
        if self.display.verbose {
            text += &verbose_lines(&stats);
        }
        for (class, message) in first_errors(&records) {
            text += &format!("      first {class} error: {message}\n");
        }
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
        self.levels.push(LevelReport {
            stats,
            requests: records,
        });
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
        let dataset = Dataset::load(&cfg.dataset, 1, 4).unwrap();
        for (stream, endpoint) in [(true, Endpoint::Chat), (false, Endpoint::Completions)] {
            cfg.stream = stream;
            cfg.endpoint = endpoint;
            let mut out = Vec::new();
            let run = run_sweep(&cfg, &dataset, &mut out, Display::default())
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
        let dataset = Dataset::load(&base_cfg.dataset, 1, 4).unwrap();
        let mut out = Vec::new();
        let mut base = Sweep::start(&base_cfg, &dataset, &mut out, Display::default())
            .await
            .unwrap();
        let mut cand = Sweep::start(&cand_cfg, &dataset, &mut out, Display::default())
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
}
