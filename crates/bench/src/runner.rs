//! The sweep: preflight, warm-up, then one level per concurrency value, each printed as it ends.

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
    let max_level = cfg.concurrency.iter().copied().max().unwrap_or(1);
    let client = Client::new(cfg, max_level.max(cfg.warmup_requests))?;
    let served = client.list_models().await?;
    let model = match (&cfg.model, served.first()) {
        (Some(m), _) => m.clone(),
        (None, Some(m)) => m.clone(),
        (None, None) => return Err(BenchError::NoModel(cfg.base_url.clone())),
    };
    let mut notes: Vec<String> = dataset.notes.clone();
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
    let mut levels = Vec::with_capacity(cfg.concurrency.len());
    let (mut told_no_usage, mut told_mismatch) = (false, false);
    for &c in &cfg.concurrency {
        let cpu_before = process_cpu_seconds();
        let records = run_level(&client, bodies.clone(), c, offsets.as_deref(), display, c).await;
        let mut stats = LevelStats::compute(c, &records);
        stats.client_cpu_s = process_cpu_seconds() - cpu_before;
        let mut text = level_line(&stats);
        text.push('\n');
        if display.verbose {
            text += &verbose_lines(&stats);
        }
        for (class, message) in first_errors(&records) {
            text += &format!("      first {class} error: {message}\n");
        }
        if stats.without_usage > 0 && !told_no_usage {
            told_no_usage = true;
            let note = if cfg.stream {
                format!(
                    "the server sent no usage (C={c}): completion tokens are counted as content chunks, which undercounts when a chunk holds several tokens"
                )
            } else {
                format!(
                    "the server sent no usage (C={c}): without streaming there is nothing to count, so completion tokens and throughput show 0; stream, or use a server that reports usage"
                )
            };
            text += &format!("      note: {note}\n");
            notes.push(note);
        }
        if stats.usage_chunk_mismatch > 0 && !told_mismatch {
            told_mismatch = true;
            let note = format!(
                "at C={c}, {} of {} requests have usage and content-chunk counts more than 10% apart (chunks hold several tokens, e.g. under speculation): ITL is per chunk, token counts come from usage",
                stats.usage_chunk_mismatch, stats.ok
            );
            text += &format!("      warning: {note}\n");
            notes.push(note);
        }
        say(out, &text)?;
        levels.push(LevelReport {
            stats,
            requests: records,
        });
    }
    Ok(RunReport {
        config: cfg.clone(),
        environment: Environment::detect(&cfg.base_url, &model),
        notes,
        levels,
    })
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
