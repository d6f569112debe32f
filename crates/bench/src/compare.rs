//! Baseline against candidate: per-level ratios, a bootstrap confidence interval for the
//! throughput ratio, and the crossover where the candidate stops winning.

use crate::goodput::Goodput;
use crate::record::RequestRecord;
use crate::report::RunReport;
use crate::server_metrics::ServerDeltas;
use crate::stats::LevelStats;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::fmt::Write as _;

/// Bootstrap resamples per level.
const RESAMPLES: usize = 2_000;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LevelComparison {
    pub concurrency: usize,
    pub base_throughput: f64,
    pub cand_throughput: f64,
    pub throughput_ratio: f64,
    /// 95% bootstrap interval of the throughput ratio (None when a side has no successful request).
    pub throughput_ci: Option<(f64, f64)>,
    pub per_request_ratio: f64,
    pub latency_p50_ratio: f64,
    pub latency_p99_ratio: f64,
    pub ttft_p50_ratio: f64,
    pub base_ok: (usize, usize),
    pub cand_ok: (usize, usize),
    /// Speculative accept length (tokens per verification pass) where the server reported it.
    pub base_accept_length: Option<f64>,
    pub cand_accept_length: Option<f64>,
    /// Goodput where the runs measured it (`--goodput`), and the ratio of their rates.
    pub base_goodput: Option<Goodput>,
    pub cand_goodput: Option<Goodput>,
    pub goodput_ratio: Option<f64>,
    /// The servers' counters over the level, where they export them.
    pub base_server: Option<ServerDeltas>,
    pub cand_server: Option<ServerDeltas>,
    /// Whether both runs sent the same prompts at this level (None: a run did not record them).
    pub same_prompts: Option<bool>,
}

/// Where the candidate stops being faster (throughput ratio above 1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Crossover {
    /// Faster at every common level.
    AlwaysWins,
    /// Faster at no common level.
    NeverWins,
    /// Faster at some lower level, and at no level from this one up.
    StopsWinningAt(usize),
    /// Faster at the highest level but not at every one (e.g. it only pays off under load).
    WinsAtTop,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub base: String,
    pub cand: String,
    pub levels: Vec<LevelComparison>,
    pub crossover: Option<Crossover>,
    /// What makes the pairing doubtful: different prompts at some level, different goodput
    /// objectives.
    pub notes: Vec<String>,
}

/// Compares the levels both runs have, in increasing concurrency.
pub fn compare(
    base: &RunReport,
    base_label: &str,
    cand: &RunReport,
    cand_label: &str,
) -> Comparison {
    let mut levels = Vec::new();
    for b in &base.levels {
        let Some(c) = cand
            .levels
            .iter()
            .find(|c| c.stats.concurrency == b.stats.concurrency)
        else {
            continue;
        };
        let seed = b.stats.concurrency as u64;
        levels.push(compare_level(
            &b.stats,
            &b.requests,
            &c.stats,
            &c.requests,
            seed,
        ));
    }
    levels.sort_by_key(|l| l.concurrency);
    let crossover = crossover(&levels);
    let mut notes = Vec::new();
    let unpaired: Vec<String> = levels
        .iter()
        .filter(|l| l.same_prompts == Some(false))
        .map(|l| format!("C={}", l.concurrency))
        .collect();
    if !unpaired.is_empty() {
        notes.push(format!(
            "the runs sent different prompts at {} (another seed, dataset, warm-up size or list of levels): those ratios compare different workloads",
            unpaired.join(", ")
        ));
    }
    if base.config.goodput != cand.config.goodput {
        notes.push(
            "the runs' goodput objectives differ: their goodput figures do not compare".into(),
        );
    }
    Comparison {
        base: base_label.to_string(),
        cand: cand_label.to_string(),
        levels,
        crossover,
        notes,
    }
}

fn ratio(cand: f64, base: f64) -> f64 {
    if base > 0.0 { cand / base } else { f64::NAN }
}

fn compare_level(
    b: &LevelStats,
    b_req: &[RequestRecord],
    c: &LevelStats,
    c_req: &[RequestRecord],
    seed: u64,
) -> LevelComparison {
    LevelComparison {
        concurrency: b.concurrency,
        base_throughput: b.throughput_tok_s,
        cand_throughput: c.throughput_tok_s,
        throughput_ratio: ratio(c.throughput_tok_s, b.throughput_tok_s),
        throughput_ci: throughput_ratio_ci(b, b_req, c, c_req, seed),
        per_request_ratio: ratio(c.per_request_tok_s, b.per_request_tok_s),
        latency_p50_ratio: ratio(c.latency_s.p50, b.latency_s.p50),
        latency_p99_ratio: ratio(c.latency_s.p99, b.latency_s.p99),
        ttft_p50_ratio: ratio(c.ttft_s.p50, b.ttft_s.p50),
        base_ok: (b.ok, b.requests),
        cand_ok: (c.ok, c.requests),
        base_accept_length: b.spec_accept_length,
        cand_accept_length: c.spec_accept_length,
        base_goodput: b.goodput,
        cand_goodput: c.goodput,
        goodput_ratio: b
            .goodput
            .zip(c.goodput)
            .map(|(b, c)| ratio(c.request_rate, b.request_rate)),
        base_server: b.server.clone(),
        cand_server: c.server.clone(),
        same_prompts: b
            .prompts_digest
            .as_ref()
            .zip(c.prompts_digest.as_ref())
            .map(|(b, c)| b == c),
    }
}

/// (tokens, latency) of the successful requests.
fn samples(records: &[RequestRecord]) -> Vec<(f64, f64)> {
    records
        .iter()
        .filter(|r| r.ok())
        .map(|r| (r.completion_tokens as f64, r.latency_s))
        .collect()
}

/// Throughput of a resample. A level's throughput is Σtokens / duration
/// = (Σlatency / duration) × (Σtokens / Σlatency): its effective concurrency, fixed by how the
/// level was run, times the token rate per request-second, which resampling requests varies.
fn resampled_throughput(effective_concurrency: f64, s: &[(f64, f64)], rng: &mut StdRng) -> f64 {
    let (mut tokens, mut latency) = (0.0, 0.0);
    for _ in 0..s.len() {
        let (t, l) = s[rng.random_range(0..s.len())];
        tokens += t;
        latency += l;
    }
    if latency > 0.0 {
        effective_concurrency * tokens / latency
    } else {
        0.0
    }
}

/// 95% percentile-bootstrap interval of cand/base throughput, resampling requests.
pub fn throughput_ratio_ci(
    b: &LevelStats,
    b_req: &[RequestRecord],
    c: &LevelStats,
    c_req: &[RequestRecord],
    seed: u64,
) -> Option<(f64, f64)> {
    let (bs, cs) = (samples(b_req), samples(c_req));
    if bs.is_empty() || cs.is_empty() {
        return None;
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ratios: Vec<f64> = (0..RESAMPLES)
        .filter_map(|_| {
            let base = resampled_throughput(b.effective_concurrency, &bs, &mut rng);
            let cand = resampled_throughput(c.effective_concurrency, &cs, &mut rng);
            (base > 0.0).then(|| cand / base)
        })
        .collect();
    if ratios.is_empty() {
        return None;
    }
    ratios.sort_by(f64::total_cmp);
    let at = |q: f64| crate::stats::percentile_sorted(&ratios, q);
    Some((at(2.5), at(97.5)))
}

fn crossover(levels: &[LevelComparison]) -> Option<Crossover> {
    let wins: Vec<bool> = levels.iter().map(|l| l.throughput_ratio > 1.0).collect();
    if wins.is_empty() {
        return None;
    }
    Some(if wins.iter().all(|&w| w) {
        Crossover::AlwaysWins
    } else if !wins.iter().any(|&w| w) {
        Crossover::NeverWins
    } else if *wins.last().expect("not empty") {
        Crossover::WinsAtTop
    } else {
        // The lowest level from which every level up loses.
        let last_win = wins.iter().rposition(|&w| w).expect("some level wins");
        Crossover::StopsWinningAt(levels[last_win + 1].concurrency)
    })
}

/// The line under a level with the servers' own figures, where either side exported them:
/// `        server: cache hit 0.0% -> 95.2% | preemptions 0 -> 0 | ...`.
fn server_line(base: Option<&ServerDeltas>, cand: Option<&ServerDeltas>) -> Option<String> {
    fn pct(r: Option<f64>) -> Option<String> {
        r.map(|r| format!("{:.1}%", r * 100.0))
    }
    fn count(n: Option<u64>) -> Option<String> {
        n.map(|n| n.to_string())
    }
    type Figure = fn(&ServerDeltas) -> Option<String>;
    let figures: [(&str, Figure); 4] = [
        ("cache hit", |d| pct(d.cache_hit_rate)),
        ("preemptions", |d| count(d.preemptions)),
        ("draft acceptance", |d| pct(d.spec_acceptance())),
        ("rejected", |d| count(d.rejected_requests)),
    ];
    let parts: Vec<String> = figures
        .iter()
        .filter_map(|(name, get)| {
            let (b, c) = (base.and_then(get), cand.and_then(get));
            if b.is_none() && c.is_none() {
                return None;
            }
            let shown = |v: Option<String>| v.unwrap_or_else(|| "n/a".into());
            Some(format!("{name} {} -> {}", shown(b), shown(c)))
        })
        .collect();
    (!parts.is_empty()).then(|| format!("        server: {}", parts.join(" | ")))
}

/// The comparison as text, a line per level (and the servers' figures under it) and the
/// crossover line.
pub fn render(cmp: &Comparison) -> String {
    let mut s = format!(
        "Comparison: candidate `{}` against baseline `{}` (ratios are candidate / baseline)\n\n",
        cmp.cand, cmp.base
    );
    for l in &cmp.levels {
        let ci = l.throughput_ci.map_or_else(
            || "[  n/a ]".to_string(),
            |(lo, hi)| format!("[{lo:.2}, {hi:.2}]"),
        );
        // The accept column closes the line when either side reported speculation.
        let accept = match (l.base_accept_length, l.cand_accept_length) {
            (None, None) => String::new(),
            (b, c) => {
                let shown = |a: Option<f64>| a.map_or_else(|| "n/a".into(), |a| format!("{a:.2}"));
                format!(" | accept {} -> {}", shown(b), shown(c))
            }
        };
        let goodput = match (l.base_goodput, l.cand_goodput, l.goodput_ratio) {
            (Some(b), Some(c), Some(r)) => {
                let r = if r.is_finite() {
                    format!("x{r:.2}")
                } else {
                    "n/a".into()
                };
                format!(
                    " | goodput {r} ({:.0}% -> {:.0}%)",
                    b.share * 100.0,
                    c.share * 100.0
                )
            }
            _ => String::new(),
        };
        let _ = writeln!(
            s,
            "  C={:>3} | throughput: {:>7.1} -> {:>7.1} tok/s  x{:.2} {ci} | per-req x{:.2} | latency p50 x{:.2} p99 x{:.2} | TTFT p50 x{:.2} | ok: {}/{} -> {}/{}{accept}{goodput}",
            l.concurrency,
            l.base_throughput,
            l.cand_throughput,
            l.throughput_ratio,
            l.per_request_ratio,
            l.latency_p50_ratio,
            l.latency_p99_ratio,
            l.ttft_p50_ratio,
            l.base_ok.0,
            l.base_ok.1,
            l.cand_ok.0,
            l.cand_ok.1,
        );
        if let Some(line) = server_line(l.base_server.as_ref(), l.cand_server.as_ref()) {
            let _ = writeln!(s, "{line}");
        }
    }
    s.push('\n');
    for note in &cmp.notes {
        let _ = writeln!(s, "  Note: {note}");
    }
    let line = match cmp.crossover {
        None => "  Crossover: the runs share no concurrency level.".to_string(),
        Some(Crossover::AlwaysWins) => {
            "  Crossover: none; the candidate has the higher throughput at every level.".to_string()
        }
        Some(Crossover::NeverWins) => {
            "  Crossover: none; the candidate has the higher throughput at no level.".to_string()
        }
        Some(Crossover::WinsAtTop) => {
            let top = cmp.levels.last().map_or(0, |l| l.concurrency);
            format!(
                "  Crossover: none at the top; the candidate loses at some levels but wins at the highest, C={top}."
            )
        }
        Some(Crossover::StopsWinningAt(c)) => {
            let l = cmp
                .levels
                .iter()
                .find(|l| l.concurrency == c)
                .expect("level exists");
            format!(
                "  Crossover: the candidate stops winning from C={c} (throughput x{:.2} there, and no win above).",
                l.throughput_ratio
            )
        }
    };
    s + &line + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BenchConfig;
    use crate::report::{Environment, LevelReport};

    /// A level whose requests all ran back to back with `latency` each.
    fn level(c: usize, tokens: &[u64], latency: f64) -> LevelReport {
        let records: Vec<RequestRecord> = tokens
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                let mut r = RequestRecord::new(i, (i / c) as f64 * latency);
                r.latency_s = latency;
                r.http_status = Some(200);
                r.finish_reason = Some("length".into());
                r.completion_tokens = t;
                r.usage_reported = true;
                r
            })
            .collect();
        LevelReport {
            stats: LevelStats::compute(c, &records),
            requests: records,
        }
    }

    fn run(levels: Vec<LevelReport>) -> RunReport {
        RunReport {
            config: BenchConfig::default(),
            environment: Environment::detect("http://x", "m"),
            notes: vec![],
            levels,
        }
    }

    #[test]
    fn identical_per_request_rates_give_a_point_interval() {
        let base = run(vec![level(2, &[100; 10], 1.0)]);
        let cand = run(vec![level(2, &[200; 10], 1.0)]);
        let cmp = compare(&base, "b", &cand, "c");
        let l = &cmp.levels[0];
        assert!((l.throughput_ratio - 2.0).abs() < 1e-12);
        let (lo, hi) = l.throughput_ci.unwrap();
        assert!((lo - 2.0).abs() < 1e-9 && (hi - 2.0).abs() < 1e-9);
        assert!((l.per_request_ratio - 2.0).abs() < 1e-12);
        assert!((l.latency_p50_ratio - 1.0).abs() < 1e-12);
        assert_eq!(cmp.crossover, Some(Crossover::AlwaysWins));
    }

    #[test]
    fn noisy_levels_give_an_interval_around_the_ratio_that_narrows_with_more_requests() {
        let noisy = |n: usize, scale: u64| -> Vec<u64> {
            (0..n as u64)
                .map(|i| scale * (80 + (i * 37) % 41))
                .collect()
        };
        let width = |n: usize| {
            let base = run(vec![level(5, &noisy(n, 1), 1.0)]);
            let cand = run(vec![level(5, &noisy(n, 1), 0.8)]);
            let l = compare(&base, "b", &cand, "c").levels[0].clone();
            let (lo, hi) = l.throughput_ci.unwrap();
            assert!(lo < l.throughput_ratio && l.throughput_ratio < hi, "{l:?}");
            assert!(lo > 1.0, "a 25% gain on 20% noise is significant: {l:?}");
            hi - lo
        };
        assert!(width(400) < width(40) / 2.0);
    }

    #[test]
    fn crossover_names_the_lowest_level_from_which_the_candidate_loses() {
        let base = run(vec![
            level(1, &[100; 6], 1.0),
            level(2, &[100; 6], 1.0),
            level(5, &[100; 6], 1.0),
            level(10, &[100; 10], 1.0),
        ]);
        // Wins at C=1, loses at 2, wins at 5, then loses from 10 up: the crossover is 10.
        let cand = run(vec![
            level(1, &[150; 6], 1.0),
            level(2, &[90; 6], 1.0),
            level(5, &[120; 6], 1.0),
            level(10, &[80; 10], 1.0),
        ]);
        let cmp = compare(&base, "b", &cand, "c");
        assert_eq!(cmp.crossover, Some(Crossover::StopsWinningAt(10)));
        let text = render(&cmp);
        assert!(text.contains("stops winning from C=10"), "{text}");
        assert_eq!(text.lines().filter(|l| l.starts_with("  C=")).count(), 4);
    }

    #[test]
    fn other_crossover_shapes() {
        let lv = |r: &[f64]| -> Vec<LevelComparison> {
            r.iter()
                .enumerate()
                .map(|(i, &x)| LevelComparison {
                    concurrency: i + 1,
                    base_throughput: 1.0,
                    cand_throughput: x,
                    throughput_ratio: x,
                    throughput_ci: None,
                    per_request_ratio: x,
                    latency_p50_ratio: 1.0,
                    latency_p99_ratio: 1.0,
                    ttft_p50_ratio: 1.0,
                    base_ok: (1, 1),
                    cand_ok: (1, 1),
                    base_accept_length: None,
                    cand_accept_length: None,
                    base_goodput: None,
                    cand_goodput: None,
                    goodput_ratio: None,
                    base_server: None,
                    cand_server: None,
                    same_prompts: None,
                })
                .collect()
        };
        assert_eq!(crossover(&lv(&[0.9, 0.8])), Some(Crossover::NeverWins));
        assert_eq!(crossover(&lv(&[0.9, 1.2])), Some(Crossover::WinsAtTop));
        assert_eq!(
            crossover(&lv(&[1.3, 1.1, 1.0])),
            Some(Crossover::StopsWinningAt(3))
        );
        assert_eq!(crossover(&[]), None);
    }

    #[test]
    fn accept_lengths_show_for_either_side_when_reported() {
        let base = run(vec![level(1, &[100; 4], 1.0), level(2, &[100; 4], 1.0)]);
        let mut cand = run(vec![level(1, &[150; 4], 1.0), level(2, &[120; 4], 1.0)]);
        let text = render(&compare(&base, "b", &cand, "c"));
        assert!(!text.contains("accept"), "nobody reported one: {text}");
        cand.levels[0].stats.spec_accept_length = Some(3.456);
        let cmp = compare(&base, "b", &cand, "c");
        assert_eq!(cmp.levels[0].cand_accept_length, Some(3.456));
        assert_eq!(cmp.levels[0].base_accept_length, None);
        let text = render(&cmp);
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("  C=")).collect();
        assert!(rows[0].ends_with("| accept n/a -> 3.46"), "{text}");
        assert!(!rows[1].contains("accept"), "{text}");
    }

    #[test]
    fn goodput_and_server_figures_compare_when_measured() {
        let base = run(vec![level(1, &[100; 4], 1.0)]);
        let mut cand = run(vec![level(1, &[100; 4], 1.0)]);
        let text = render(&compare(&base, "b", &cand, "c"));
        assert!(
            !text.contains("goodput") && !text.contains("server:"),
            "{text}"
        );

        let mut base = base;
        base.levels[0].stats.goodput = Some(Goodput {
            good: 2,
            request_rate: 0.5,
            share: 0.5,
        });
        cand.levels[0].stats.goodput = Some(Goodput {
            good: 4,
            request_rate: 1.0,
            share: 1.0,
        });
        cand.levels[0].stats.server = Some(ServerDeltas {
            server: "specula".into(),
            cache_hit_rate: Some(0.25),
            preemptions: Some(3),
            ..ServerDeltas::default()
        });
        let cmp = compare(&base, "b", &cand, "c");
        assert_eq!(cmp.levels[0].goodput_ratio, Some(2.0));
        let text = render(&cmp);
        let lines: Vec<&str> = text.lines().collect();
        let row = lines.iter().position(|l| l.starts_with("  C=")).unwrap();
        assert!(
            lines[row].ends_with("| goodput x2.00 (50% -> 100%)"),
            "{text}"
        );
        assert_eq!(
            lines[row + 1],
            "        server: cache hit n/a -> 25.0% | preemptions n/a -> 3"
        );
    }

    #[test]
    fn levels_that_sent_different_prompts_are_named() {
        let mut base = run(vec![level(1, &[100; 4], 1.0), level(2, &[100; 4], 1.0)]);
        let mut cand = base.clone();
        let text = render(&compare(&base, "b", &cand, "c"));
        assert!(!text.contains("Note:"), "{text}");
        for (run, digests) in [(&mut base, ["a", "b"]), (&mut cand, ["a", "x"])] {
            for (level, d) in run.levels.iter_mut().zip(digests) {
                level.stats.prompts_digest = Some(d.into());
            }
        }
        let cmp = compare(&base, "b", &cand, "c");
        assert_eq!(
            cmp.levels
                .iter()
                .map(|l| l.same_prompts)
                .collect::<Vec<_>>(),
            [Some(true), Some(false)]
        );
        let text = render(&cmp);
        assert!(
            text.contains("  Note: the runs sent different prompts at C=2 ("),
            "{text}"
        );
        cand.config.goodput = Some(crate::goodput::Objectives::parse(&["ttft:5"]).unwrap());
        let text = render(&compare(&base, "b", &cand, "c"));
        assert!(text.contains("goodput objectives differ"), "{text}");
    }

    #[test]
    fn levels_missing_from_one_run_are_skipped() {
        let base = run(vec![level(1, &[10; 3], 1.0), level(4, &[10; 4], 1.0)]);
        let cand = run(vec![level(4, &[10; 4], 1.0), level(8, &[10; 8], 1.0)]);
        let cmp = compare(&base, "b", &cand, "c");
        assert_eq!(cmp.levels.len(), 1);
        assert_eq!(cmp.levels[0].concurrency, 4);
    }
}
