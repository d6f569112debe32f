//! `specula demo`: the README's main command. Serves the default model in this process on a free
//! loopback port, runs a short `specula bench` sweep against it, prints the table and shuts the
//! server down. `--mock` runs the sweep against the built-in mock server instead (no model).

use crate::Failure;
use crate::bench_cmd::{RunArgs, run_bench};
use anyhow::{Context, anyhow};
use bench::mock::MockConfig;
use clap::{Args, Parser};
use std::path::PathBuf;

#[derive(Args)]
pub struct DemoArgs {
    /// Benchmark the built-in mock server instead of the model.
    #[arg(long)]
    mock: bool,
    /// The GGUF model [default: the default model, fetched if missing].
    #[arg(long, alias = "model")]
    model_path: Option<PathBuf>,
    /// Kernel threads [default: all cores].
    #[arg(long)]
    threads: Option<usize>,
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
        let args = [
            "demo".to_string(),
            format!("--concurrency={}", self.concurrency),
            format!("--requests-per-level={}", self.requests_per_level),
            format!("--max-tokens={}", self.max_tokens),
            format!("--warmup-requests={}", self.warmup_requests),
        ];
        BenchFlags::try_parse_from(args)
            .map(|f| f.run)
            .map_err(|e| Failure {
                code: 2,
                error: anyhow!("{}", e.to_string().lines().next().unwrap_or("bad flags")),
            })
    }
}

pub async fn run(args: DemoArgs) -> Result<(), Failure> {
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
    let model_path = match args.model_path {
        Some(p) => Some(p),
        None => Some(
            tokio::task::spawn_blocking(crate::assets::default_model)
                .await
                .context("model fetch task failed")??,
        ),
    };
    let cfg = crate::serve::ServeConfig {
        host: "127.0.0.1".into(),
        port: 0,
        model_path,
        served_model_name: None,
        context_length: None,
        max_running_requests: 64,
        max_queued_requests: 256,
        max_total_tokens: 32768,
        chunked_prefill_size: 512,
        api_key: None,
        log_level: "warning".into(),
        threads: args.threads,
        shutdown_timeout: 10,
        speculative: None,
        speculative_draft_model_path: None,
    };
    let server = crate::serve::start(cfg).await?;
    let result = run_bench(&bench, Some(format!("http://{}", server.addr))).await;
    server.drain().await;
    result
}
