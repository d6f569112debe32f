//! `specula demo`: the default benchmark sweep against the built-in mock server, in one process.

use crate::Failure;
use crate::bench_cmd::{RunArgs, run_bench};
use anyhow::{Context, anyhow};
use bench::mock::MockConfig;
use clap::Args;

#[derive(Args)]
pub struct DemoArgs {
    /// Pace of each mock stream.
    #[arg(long, default_value_t = 500.0)]
    mock_tokens_per_second: f64,
    /// Mock time to first token, ms.
    #[arg(long, default_value_t = 20.0)]
    mock_ttft_ms: f64,
    #[command(flatten)]
    run: RunArgs,
}

pub async fn run(args: DemoArgs) -> Result<(), Failure> {
    let mock = MockConfig {
        tokens_per_second: args.mock_tokens_per_second,
        ttft_ms: args.mock_ttft_ms,
        ..MockConfig::default()
    };
    mock.validate().map_err(|e| anyhow!("mock server: {e}"))?;
    let addr = bench::mock::spawn(mock)
        .await
        .context("cannot start the mock server")?;
    run_bench(&args.run, Some(format!("http://{addr}"))).await
}
