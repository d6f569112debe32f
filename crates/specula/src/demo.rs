//! `specula demo`: the README's main command. Serves the default model in this process on a free
//! loopback port, runs a short `specula bench` sweep against it, prints the table and shuts the
//! server down. `--mock` runs the sweep against the built-in mock server instead (no model).
//! `--compare-spec` serves the model twice at once, without speculation (the baseline) and with it
//! (the candidate), runs the levels alternately (C=1 on the baseline, C=1 on the candidate, C=2 on
//! the baseline, ...) so slow drift of a shared machine hits both alike, and prints
//! `specula bench compare`'s table.

use crate::Failure;
use crate::bench_cmd::{RunArgs, load_dataset, run_bench};
use crate::serve::{LogLevel, Running, ServeArgs, ServeConfig};
use anyhow::{Context, anyhow, bail};
use bench::compare::{compare, render};
use bench::mock::MockConfig;
use bench::workload::Dataset;
use bench::{BenchConfig, BenchError, RunReport, Sweep};
use clap::{Args, Parser};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args)]
pub struct DemoArgs {
    /// Benchmark the built-in mock server instead of the model.
    #[arg(long)]
    mock: bool,
    /// The GGUF model: a file, or a model name (`specula model list`; pulled if missing)
    /// [default: the default model, fetched if missing].
    #[arg(long, alias = "model")]
    model_path: Option<PathBuf>,
    /// Kernel threads [default: all cores].
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    activations: crate::activations::ActivationsArg,
    /// Concurrency levels, comma-separated.
    #[arg(long, default_value = "1,2,4,8")]
    concurrency: String,
    /// Measured requests per level.
    #[arg(long, default_value_t = 10)]
    requests_per_level: usize,
    #[arg(long, default_value_t = 64)]
    max_tokens: u32,
    #[arg(long, default_value_t = 3)]
    warmup_requests: usize,
    /// synthetic | rewrite | random:INPUT_TOKENS | shared-prefix:PREFIX_TOKENS:GROUPS |
    /// sharegpt | a .jsonl file | a ShareGPT .json file [default: synthetic; rewrite with
    /// --compare-spec].
    #[arg(long)]
    dataset: Option<String>,
    /// Serve the model twice, without speculation and with it, run the levels alternately and
    /// compare the two.
    #[arg(long)]
    compare_spec: bool,
    /// The candidate's speculation (with --compare-spec): SUFFIX (suffix decoding), NGRAM
    /// (prompt lookup), STANDALONE (a draft model) or EAGLE3 (a head) [default: SUFFIX, the
    /// fastest measured on the default model].
    #[arg(long, alias = "speculative-algorithm")]
    spec_algorithm: Option<String>,
    /// The draft model of STANDALONE (a GGUF file with the target's tokenizer) or the head of
    /// EAGLE3 (a folder in SGLang's layout; default: the built-in one).
    #[arg(long, alias = "speculative-draft-model-path")]
    spec_draft_model_path: Option<PathBuf>,
    /// Draft tokens a sequence verifies per step at most [default: 16 for SUFFIX, 8 for NGRAM,
    /// 4 for STANDALONE and EAGLE3].
    #[arg(long, alias = "speculative-num-draft-tokens")]
    spec_num_draft_tokens: Option<usize>,
    /// The fixed policy (the most drafts every step) instead of the adaptive one.
    #[arg(long)]
    spec_fixed: bool,
    /// Pace of each mock stream (with --mock).
    #[arg(long, default_value_t = 500.0)]
    mock_tokens_per_second: f64,
    /// Mock time to first token, ms (with --mock).
    #[arg(long, default_value_t = 20.0)]
    mock_ttft_ms: f64,
}

/// `specula bench`'s flags, parsed from an argument list.
#[derive(Parser)]
struct BenchFlags {
    #[command(flatten)]
    run: RunArgs,
}

impl DemoArgs {
    fn bench_args(&self) -> Result<RunArgs, Failure> {
        // Prompt lookup pays where answers copy the prompt; a head is measured on chat.
        let ngram = self.spec_algorithm_name().eq_ignore_ascii_case("NGRAM");
        let dataset = match (&self.dataset, self.compare_spec && ngram) {
            (Some(d), _) => d.as_str(),
            (None, true) => "rewrite",
            (None, false) => "synthetic",
        };
        let args = [
            "demo".to_string(),
            format!("--concurrency={}", self.concurrency),
            format!("--requests-per-level={}", self.requests_per_level),
            format!("--max-tokens={}", self.max_tokens),
            format!("--warmup-requests={}", self.warmup_requests),
            format!("--dataset={dataset}"),
        ];
        BenchFlags::try_parse_from(args)
            .map(|f| f.run)
            .map_err(|e| Failure {
                code: 2,
                error: anyhow!("{}", e.to_string().lines().next().unwrap_or("bad flags")),
            })
    }

    /// Rejects flag combinations that do not go together.
    fn check(&self) -> Result<(), Failure> {
        let usage = |error: anyhow::Error| Failure { code: 2, error };
        if self.compare_spec && self.mock {
            return Err(usage(anyhow!(
                "--compare-spec serves the model twice; it does not run with --mock"
            )));
        }
        let spec_flags = self.spec_algorithm.is_some()
            || self.spec_draft_model_path.is_some()
            || self.spec_num_draft_tokens.is_some()
            || self.spec_fixed;
        if spec_flags && !self.compare_spec {
            return Err(usage(anyhow!(
                "--spec-algorithm, --spec-draft-model-path, --spec-num-draft-tokens and --spec-fixed go with --compare-spec"
            )));
        }
        Ok(())
    }

    /// The candidate's algorithm as named, or the default: SUFFIX, which ran fastest against
    /// plain decoding of the drafters measured (BENCHMARKS, 2026-12-07) and needs no draft.
    fn spec_algorithm_name(&self) -> &str {
        self.spec_algorithm.as_deref().unwrap_or("SUFFIX")
    }

    /// The candidate's algorithm.
    fn algorithm(&self) -> Result<speculative::Algorithms, anyhow::Error> {
        let name = self.spec_algorithm_name();
        let algorithm: speculative::Algorithms = name
            .parse()
            .map_err(|e: String| anyhow!("--spec-algorithm: {e}"))?;
        if self.spec_num_draft_tokens == Some(0) {
            bail!("--spec-num-draft-tokens must be at least 1");
        }
        let path = self.spec_draft_model_path.is_some();
        if !algorithm.speculates() {
            bail!("--spec-algorithm {name}: the candidate speculates; use NGRAM or STANDALONE")
        }
        if algorithm.needs_draft_model() && !path {
            bail!("--spec-algorithm {algorithm} needs --spec-draft-model-path")
        }
        if !algorithm.needs_draft() && path {
            bail!("--spec-draft-model-path goes with --spec-algorithm STANDALONE or EAGLE3")
        }
        Ok(algorithm)
    }

    /// The in-process server's settings: `specula serve`'s defaults on a free loopback port,
    /// serving `model`, with speculation as `algorithm` says.
    fn serve_config(
        &self,
        model: &Model,
        algorithm: Option<speculative::Algorithms>,
    ) -> Result<ServeConfig, Failure> {
        let mut args = ServeArgs {
            host: Some("127.0.0.1".into()),
            port: Some(0),
            model_path: Some(model.path.clone()),
            served_model_name: model.name.map(str::to_string),
            log_level: Some(LogLevel::Warning),
            threads: self.threads,
            activations: Some(self.activations.mode),
            kv_cache_dtype: Some(self.activations.kv_cache_dtype),
            shutdown_timeout: Some(10),
            ..ServeArgs::default()
        };
        if let Some(algorithm) = algorithm {
            args.speculative_algorithm = Some(algorithm);
            args.speculative_adaptive = Some(!self.spec_fixed);
            args.speculative_num_draft_tokens = self.spec_num_draft_tokens;
            if algorithm.needs_draft() {
                // The drafted chain is as long as the drafts verified.
                args.speculative_num_steps = self.spec_num_draft_tokens;
                args.speculative_draft_model_path = self.spec_draft_model_path.clone();
            }
        }
        args.resolve().map_err(|error| Failure { code: 2, error })
    }

    /// The model to serve, pulled first if it is a registered one not cached yet (once, before
    /// any server starts).
    async fn model(&self) -> Result<Model, Failure> {
        let choice = crate::models::choose(self.model_path.as_deref())?;
        let name = choice.name();
        let path = tokio::task::spawn_blocking(move || choice.path())
            .await
            .context("model fetch task failed")??;
        Ok(Model { path, name })
    }
}

/// The served model: its file, and the registered name it was given by (served under it).
struct Model {
    path: PathBuf,
    name: Option<&'static str>,
}

pub async fn run(args: DemoArgs) -> Result<(), Failure> {
    args.check()?;
    let bench = args.bench_args()?;
    if args.mock {
        let mock = MockConfig {
            tokens_per_second: args.mock_tokens_per_second,
            ttft_ms: args.mock_ttft_ms,
            ..MockConfig::default()
        };
        mock.validate().map_err(|e| anyhow!("mock server: {e}"))?;
        let addr = bench::mock::spawn(mock)
            .await
            .context("cannot start the mock server")?;
        return run_bench(&bench, Some(format!("http://{addr}"))).await;
    }
    if args.compare_spec {
        return compare_spec(&args, &bench).await;
    }
    let cfg = args.serve_config(&args.model().await?, None)?;
    let server = crate::serve::start(cfg).await?;
    let result = run_bench(&bench, Some(format!("http://{}", server.addr))).await;
    server.drain().await;
    result
}

/// `--compare-spec`: two servers, the levels alternated, then the comparison.
async fn compare_spec(args: &DemoArgs, flags: &RunArgs) -> Result<(), Failure> {
    // Every flag is checked, and the prompts loaded, before a model loads.
    let algorithm = args
        .algorithm()
        .map_err(|error| Failure { code: 2, error })?;
    let cfg = flags.config(Some("http://127.0.0.1".into()))?;
    let dataset = Arc::new(load_dataset(&cfg).await?);
    let model = args.model().await?;
    let base_serve = args.serve_config(&model, None)?;
    let cand_serve = args.serve_config(&model, Some(algorithm))?;
    let spec = cand_serve
        .speculative
        .ok_or_else(|| anyhow!("the candidate's settings lost speculation"))?;
    let policy = if spec.adaptive() { "adaptive" } else { "fixed" };
    let cand_label = format!("{algorithm}-{policy}").to_lowercase();
    let cand_about = format!(
        "{algorithm}, up to {} draft tokens, {policy} policy",
        spec.num_draft_tokens()
    );

    let base = crate::serve::start(base_serve).await?;
    let cand = match crate::serve::start(cand_serve).await {
        Ok(c) => c,
        Err(e) => {
            base.drain().await;
            return Err(e);
        }
    };
    let result = alternate(
        flags,
        &cfg,
        dataset,
        [&base, &cand],
        &cand_label,
        &cand_about,
    )
    .await;
    tokio::join!(base.drain(), cand.drain());
    let (base_run, cand_run) = result?;
    println!();
    print!(
        "{}",
        render(&compare(&base_run, "baseline", &cand_run, &cand_label))
    );
    let all_failed = |r: &RunReport| r.levels.iter().all(|l| l.stats.ok == 0);
    if all_failed(&base_run) || all_failed(&cand_run) {
        return Err(anyhow!(
            "no request succeeded on one of the servers; see the first error of each class above"
        )
        .into());
    }
    Ok(())
}

/// Warms both servers up, then runs each level on the baseline and at once on the candidate.
async fn alternate(
    flags: &RunArgs,
    cfg: &BenchConfig,
    dataset: Arc<Dataset>,
    [base, cand]: [&Running; 2],
    cand_label: &str,
    cand_about: &str,
) -> Result<(RunReport, RunReport), Failure> {
    let display = flags.display();
    let mut out = std::io::stdout();
    let side = |server: &Running| BenchConfig {
        base_url: format!("http://{}", server.addr),
        ..cfg.clone()
    };
    println!("\n== baseline: no speculation");
    let mut base = Sweep::start(&side(base), Arc::clone(&dataset), &mut out, display)
        .await
        .map_err(bench_failure)?;
    println!("== {cand_label}: {cand_about}");
    let mut cand = Sweep::start(&side(cand), dataset, &mut out, display)
        .await
        .map_err(bench_failure)?;
    println!("== levels, alternately on each server");
    let width = cand_label.len().max("baseline".len());
    for &c in &cfg.concurrency {
        for (label, sweep) in [("baseline", &mut base), (cand_label, &mut cand)] {
            let text = sweep.level(c).await;
            // The result line, named by its server; any lines under it as they are.
            let (first, rest) = text.split_once('\n').unwrap_or((&text, ""));
            print!("  {label:<width$} {}\n{rest}", first.trim_start());
            out.flush().ok();
        }
    }
    Ok((base.finish(), cand.finish()))
}

fn bench_failure(e: BenchError) -> Failure {
    Failure {
        code: e.exit_code(),
        error: e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        demo: DemoArgs,
    }

    fn algorithm(args: &[&str]) -> Result<String, String> {
        let words = ["demo", "--compare-spec"]
            .into_iter()
            .chain(args.iter().copied());
        let cli = Cli::try_parse_from(words).unwrap();
        cli.demo
            .algorithm()
            .map(|a| a.to_string())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_candidates_algorithm_and_its_draft_go_together() {
        assert_eq!(algorithm(&[]), Ok("SUFFIX".into()));
        assert_eq!(algorithm(&["--model", "m.gguf"]), Ok("SUFFIX".into()));
        assert_eq!(
            algorithm(&["--spec-algorithm", "eagle3", "--spec-draft-model-path", "h"]),
            Ok("EAGLE3".into())
        );
        for (args, says) in [
            (
                &["--spec-algorithm", "NONE"][..],
                "the candidate speculates",
            ),
            (
                &["--spec-algorithm", "STANDALONE"][..],
                "STANDALONE needs --spec-draft-model-path",
            ),
            (
                &[
                    "--spec-algorithm",
                    "NGRAM",
                    "--spec-draft-model-path",
                    "d.gguf",
                ][..],
                "goes with --spec-algorithm STANDALONE or EAGLE3",
            ),
        ] {
            let e = algorithm(args).unwrap_err();
            assert!(e.contains(says), "{args:?}: {e}");
        }
    }
}
