//! Reports: the one-line-per-level text, the JSON run file (with every request) and the CSV table.

use crate::config::BenchConfig;
use crate::record::RequestRecord;
use crate::stats::{LevelStats, Summary};
use crate::workload::PromptPlan;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;

/// Where and on what a run was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    pub cpu_model: String,
    pub cores: usize,
    pub os: String,
    pub specula_version: String,
    pub server_url: String,
    pub model: String,
    /// Seconds since the Unix epoch at the start of the run.
    pub started_at_unix: u64,
}

impl Environment {
    pub fn detect(server_url: &str, model: &str) -> Self {
        Self {
            cpu_model: cpu_model().unwrap_or_else(|| "unknown".into()),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
            specula_version: env!("CARGO_PKG_VERSION").into(),
            server_url: server_url.into(),
            model: model.into(),
            started_at_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelReport {
    pub stats: LevelStats,
    pub requests: Vec<RequestRecord>,
}

/// A whole run, as `--output` writes it and `compare` reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    pub config: BenchConfig,
    pub environment: Environment,
    /// Remarks made during the run (dataset notes, token-counting warnings).
    pub notes: Vec<String>,
    pub levels: Vec<LevelReport>,
}

impl RunReport {
    pub fn save(&self, path: &Path) -> Result<(), ReportError> {
        let json = serde_json::to_vec_pretty(self).map_err(|e| ReportError::Json(e.to_string()))?;
        std::fs::write(path, json).map_err(|e| ReportError::io(path, e))
    }

    pub fn load(path: &Path) -> Result<Self, ReportError> {
        let bytes = std::fs::read(path).map_err(|e| ReportError::io(path, e))?;
        serde_json::from_slice(&bytes).map_err(|e| {
            ReportError::Json(format!(
                "{} is not a specula bench result: {e}",
                path.display()
            ))
        })
    }

    /// A short name for the run in comparisons and plots: the file stem, else the server URL.
    pub fn label(&self, path: Option<&Path>) -> String {
        path.and_then(|p| p.file_stem())
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.environment.server_url.clone())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    #[error("{0}")]
    Json(String),
    #[error("plot: {0}")]
    Plot(String),
}

impl ReportError {
    pub fn io(path: &Path, e: impl std::fmt::Display) -> Self {
        Self::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        }
    }
}

/// The header printed before the warm-up.
pub fn header(cfg: &BenchConfig, model: &str, dataset: &str) -> String {
    let levels: Vec<String> = cfg.concurrency.iter().map(usize::to_string).collect();
    let mut s = String::from("Parallel throughput benchmark\n");
    let _ = writeln!(s, "  Server: {}", cfg.base_url);
    let _ = writeln!(s, "  Model: {model}");
    let _ = writeln!(s, "  Max tokens: {}", cfg.max_tokens);
    let _ = writeln!(s, "  Concurrency levels: [{}]", levels.join(", "));
    let _ = writeln!(
        s,
        "  Requests per level: {} | dataset: {dataset} | endpoint: {} | stream: {} | ignore_eos: {}",
        cfg.requests_per_level,
        cfg.endpoint.path(),
        cfg.stream,
        cfg.ignore_eos
    );
    if let Some(rate) = cfg.request_rate {
        let _ = writeln!(
            s,
            "  Request rate: {rate} req/s (Poisson), capped by concurrency"
        );
    }
    if let Some(slo) = &cfg.goodput {
        let _ = writeln!(s, "  Goodput objectives: {slo}");
    }
    s
}

/// The header's line on which prompts each level sends, and the note to make when the dataset is
/// too small for a fresh slice per level (naming the levels that repeat prompts).
pub fn prompt_lines(plan: &PromptPlan, cfg: &BenchConfig) -> (String, Option<String>) {
    let levels = cfg.concurrency.len();
    if plan.reuse {
        let line = format!(
            "Prompts: the same {} at every level (--reuse-prompts); the warm-up sends {} others",
            plan.per_level, plan.warmup
        );
        let note = (plan.needed(1) > plan.dataset).then(|| {
            format!(
                "the dataset has {} prompts, fewer than the warm-up and one level need ({}): {} of each level's prompts repeat, some prompts are sent {} times",
                plan.dataset,
                plan.needed(1),
                plan.repeated(0),
                plan.max_sends(levels)
            )
        });
        return (line, note);
    }
    let from = if plan.first_slice > 0 {
        format!(", starting at slice {}", plan.first_slice)
    } else {
        String::new()
    };
    let line = format!(
        "Prompts: each level sends its own {} of the dataset's {} (consecutive slices of the seeded order{from}), the warm-up {} before them",
        plan.per_level, plan.dataset, plan.warmup
    );
    let needed = plan.needed(levels);
    if needed <= plan.dataset {
        return (line, None);
    }
    let repeating: Vec<String> = cfg
        .concurrency
        .iter()
        .enumerate()
        .filter_map(|(k, c)| {
            let n = plan.repeated(k);
            (n > 0).then(|| format!("C={c} ({n} of {})", plan.per_level))
        })
        .collect();
    let skipped = if plan.first_slice > 0 {
        format!(" + {} skipped slices", plan.first_slice)
    } else {
        String::new()
    };
    let note = format!(
        "the dataset has {} prompts and this sweep needs {needed} ({} warm-up{skipped} + {levels} levels x {}): levels {} repeat prompts sent earlier; none is sent more than {} times",
        plan.dataset,
        plan.warmup,
        plan.per_level,
        repeating.join(", "),
        plan.max_sends(levels)
    );
    (line, Some(note))
}

/// The result line of one level; `| accept X` follows when the server reported speculative
/// accept lengths, `| goodput R req/s (S%)` closes it when `--goodput` was given.
pub fn level_line(s: &LevelStats) -> String {
    let mut line = format!(
        "  C={:>3} | {} requests | throughput: {:>7.1} tok/s | per-req: {:>6.1} tok/s | latency avg/p50/p99: {:>6.1}/{:>6.1}/{:>6.1}s | ok: {}/{}",
        s.concurrency,
        s.requests,
        s.throughput_tok_s,
        s.per_request_tok_s,
        s.latency_s.avg,
        s.latency_s.p50,
        s.latency_s.p99,
        s.ok,
        s.requests
    );
    if let Some(accept) = s.spec_accept_length {
        let _ = write!(line, " | accept {accept:.2}");
    }
    if let Some(g) = &s.goodput {
        let _ = write!(
            line,
            " | goodput {:.2} req/s ({:.0}%)",
            g.request_rate,
            g.share * 100.0
        );
    }
    line
}

/// The `--verbose` lines under a level: streaming metrics in milliseconds.
pub fn verbose_lines(s: &LevelStats) -> String {
    let ms = |name: &str, m: &Summary| {
        format!(
            "      {name:<4} avg/p50/p90/p99: {:>8.1}/{:>8.1}/{:>8.1}/{:>8.1} ms\n",
            m.avg * 1e3,
            m.p50 * 1e3,
            m.p90 * 1e3,
            m.p99 * 1e3
        )
    };
    let mut out = String::new();
    out += &ms("TTFT", &s.ttft_s);
    out += &ms("TPOT", &s.tpot_s);
    out += &ms("ITL", &s.itl_s);
    out += &ms("E2E", &s.latency_s);
    let _ = writeln!(
        out,
        "      requests/s: {:.2} | effective concurrency: {:.1} | completion tokens: {} | client CPU: {:.2}s",
        s.request_rate, s.effective_concurrency, s.completion_tokens, s.client_cpu_s
    );
    if let Some(server) = s.server.as_ref().filter(|d| !d.summary().is_empty()) {
        let _ = writeln!(
            out,
            "      server ({}): {}",
            server.server,
            server.summary()
        );
    }
    if s.repeated_prompts > 0 {
        let _ = writeln!(
            out,
            "      {} of {} prompts were sent earlier in the run",
            s.repeated_prompts, s.requests
        );
    }
    out
}

const CSV_HEADER: [&str; 35] = [
    "concurrency",
    "requests",
    "ok",
    "duration_s",
    "completion_tokens",
    "throughput_tok_s",
    "per_request_tok_s",
    "request_rate",
    "effective_concurrency",
    "latency_avg_s",
    "latency_p50_s",
    "latency_p90_s",
    "latency_p99_s",
    "ttft_avg_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_avg_s",
    "tpot_p50_s",
    "tpot_p99_s",
    "itl_p50_s",
    "itl_p99_s",
    "errors",
    "spec_accept_length",
    "repeated_prompts",
    "goodput_req_s",
    "goodput_share",
    "server_prompt_tokens",
    "server_cached_tokens",
    "server_cache_hit_rate",
    "server_generation_tokens",
    "server_preemptions",
    "server_spec_verifications",
    "server_spec_draft_tokens",
    "server_spec_accepted_tokens",
    "server_rejected_requests",
];

/// The per-level table as CSV.
pub fn write_csv(report: &RunReport, path: &Path) -> Result<(), ReportError> {
    let mut w = csv::Writer::from_path(path).map_err(|e| ReportError::io(path, e))?;
    w.write_record(CSV_HEADER)
        .map_err(|e| ReportError::io(path, e))?;
    for level in &report.levels {
        let s = &level.stats;
        let errors: usize = s.errors.values().sum();
        let server = s.server.clone().unwrap_or_default();
        let count = |n: Option<u64>| n.map_or(String::new(), |n| n.to_string());
        let row = [
            s.concurrency.to_string(),
            s.requests.to_string(),
            s.ok.to_string(),
            format!("{:.4}", s.duration_s),
            s.completion_tokens.to_string(),
            format!("{:.2}", s.throughput_tok_s),
            format!("{:.2}", s.per_request_tok_s),
            format!("{:.3}", s.request_rate),
            format!("{:.2}", s.effective_concurrency),
            format!("{:.4}", s.latency_s.avg),
            format!("{:.4}", s.latency_s.p50),
            format!("{:.4}", s.latency_s.p90),
            format!("{:.4}", s.latency_s.p99),
            format!("{:.4}", s.ttft_s.avg),
            format!("{:.4}", s.ttft_s.p50),
            format!("{:.4}", s.ttft_s.p99),
            format!("{:.5}", s.tpot_s.avg),
            format!("{:.5}", s.tpot_s.p50),
            format!("{:.5}", s.tpot_s.p99),
            format!("{:.5}", s.itl_s.p50),
            format!("{:.5}", s.itl_s.p99),
            errors.to_string(),
            s.spec_accept_length
                .map_or(String::new(), |a| format!("{a:.3}")),
            s.repeated_prompts.to_string(),
            s.goodput
                .map_or(String::new(), |g| format!("{:.3}", g.request_rate)),
            s.goodput
                .map_or(String::new(), |g| format!("{:.4}", g.share)),
            count(server.prompt_tokens),
            count(server.cached_tokens),
            server
                .cache_hit_rate
                .map_or(String::new(), |r| format!("{r:.4}")),
            count(server.generation_tokens),
            count(server.preemptions),
            count(server.spec_verifications),
            count(server.spec_draft_tokens),
            count(server.spec_accepted_tokens),
            count(server.rejected_requests),
        ];
        w.write_record(&row).map_err(|e| ReportError::io(path, e))?;
    }
    w.flush().map_err(|e| ReportError::io(path, e))
}

/// A small report for the tests of this module and its neighbours.
#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;
    use crate::record::ErrorClass;

    pub(crate) fn sample_report() -> RunReport {
        let mut rec = RequestRecord::new(0, 0.0);
        rec.latency_s = 1.5;
        rec.ttft_s = Some(0.1);
        rec.itl_s = vec![0.01, 0.02];
        rec.http_status = Some(200);
        rec.finish_reason = Some("length".into());
        rec.completion_tokens = 3;
        rec.content_chunks = 3;
        rec.usage_reported = true;
        let mut bad = RequestRecord::new(1, 0.2);
        bad.fail(ErrorClass::Timeout, "slow");
        let records = vec![rec, bad];
        RunReport {
            config: BenchConfig::default(),
            environment: Environment::detect("http://x", "m"),
            notes: vec!["note".into()],
            levels: vec![LevelReport {
                stats: LevelStats::compute(2, &records),
                requests: records,
            }],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::sample_report;
    use super::*;

    #[test]
    fn json_round_trip_is_lossless() {
        let report = sample_report();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.json");
        report.save(&path).unwrap();
        assert_eq!(RunReport::load(&path).unwrap(), report);
        assert_eq!(report.label(Some(&path)), "run");
    }

    #[test]
    fn loading_a_foreign_file_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.json");
        std::fs::write(&path, "{}").unwrap();
        let err = RunReport::load(&path).unwrap_err().to_string();
        assert!(err.contains("not a specula bench result"), "{err}");
    }

    #[test]
    fn csv_has_a_row_per_level() {
        let report = sample_report();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.csv");
        write_csv(&report, &path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("concurrency,requests,ok,"));
        assert!(lines[1].starts_with("2,2,1,"));
        assert!(lines[0].contains(",errors,spec_accept_length,repeated_prompts,goodput_req_s,"));
        assert!(lines[0].ends_with(",server_rejected_requests"));
        assert!(
            lines[1].ends_with(",1,,0,,,,,,,,,,,"),
            "one error, no accept length, no repeats, goodput or server figures: {}",
            lines[1]
        );
    }

    #[test]
    fn level_line_has_the_documented_shape() {
        let report = sample_report();
        let line = level_line(&report.levels[0].stats);
        assert!(
            line.starts_with("  C=  2 | 2 requests | throughput:"),
            "{line}"
        );
        assert!(line.ends_with("| ok: 1/2"), "{line}");
    }

    #[test]
    fn level_line_shows_the_accept_length_only_when_reported() {
        let mut report = sample_report();
        let stats = &mut report.levels[0].stats;
        assert!(!level_line(stats).contains("accept"));
        stats.spec_accept_length = Some(3.214);
        assert!(
            level_line(stats).ends_with("| ok: 1/2 | accept 3.21"),
            "{}",
            level_line(stats)
        );
    }

    #[test]
    fn accept_lengths_round_trip_and_old_files_still_load() {
        let mut report = sample_report();
        report.levels[0].requests[0].spec_accept_length = Some(2.5);
        report.levels[0].stats = LevelStats::compute(2, &report.levels[0].requests);
        assert_eq!(report.levels[0].stats.spec_accept_length, Some(2.5));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.json");
        report.save(&path).unwrap();
        assert_eq!(RunReport::load(&path).unwrap(), report);

        // A file written before the field existed: no accept length anywhere.
        let mut old: serde_json::Value = serde_json::to_value(sample_report()).unwrap();
        for level in old["levels"].as_array_mut().unwrap() {
            level["stats"]
                .as_object_mut()
                .unwrap()
                .retain(|k, _| !k.starts_with("spec_"));
            for r in level["requests"].as_array_mut().unwrap() {
                r.as_object_mut().unwrap().remove("spec_accept_length");
            }
        }
        assert!(!old.to_string().contains("spec_accept"));
        std::fs::write(&path, old.to_string()).unwrap();
        let loaded = RunReport::load(&path).unwrap();
        assert_eq!(loaded.levels[0].stats.spec_accept_length, None);
        assert_eq!(loaded.levels[0].requests[0].spec_accept_length, None);
    }
}
