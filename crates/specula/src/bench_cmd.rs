//! `specula bench`: the sweep, `bench compare` and `bench mock-server`.

use crate::Failure;
use anyhow::{Context, anyhow, bail};
use bench::compare::{compare, render};
use bench::goodput::Objectives;
use bench::mock::{Fault, MockConfig};
use bench::plot::{Series, plot_sweep};
use bench::report::write_csv;
use bench::workload::Dataset;
use bench::{BenchConfig, DatasetSpec, Display, Endpoint, RunReport, run_sweep};
use clap::{Args, Subcommand, ValueEnum};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    action: Option<BenchAction>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum BenchAction {
    /// Compare two saved runs (baseline, candidate) level by level.
    Compare(CompareArgs),
    /// Serve a mock OpenAI API that streams tokens at a set pace (for tests and client benchmarks).
    MockServer(MockArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum EndpointArg {
    Chat,
    Completions,
}

/// The sweep's flags (names follow SGLang's and vLLM's benchmarks where they have one).
#[derive(Args, Clone)]
pub struct RunArgs {
    /// Server base URL [default: http://HOST:PORT].
    #[arg(long)]
    base_url: Option<String>,
    #[arg(long, default_value = "localhost")]
    host: String,
    #[arg(long, default_value_t = 30000)]
    port: u16,
    /// Model name to request [default: the first id of GET /v1/models].
    #[arg(long)]
    model: Option<String>,
    #[arg(long, default_value_t = 200)]
    max_tokens: u32,
    /// Concurrency levels, comma-separated.
    #[arg(
        long,
        alias = "max-concurrency",
        value_delimiter = ',',
        default_value = "1,2,5,10,30,70,100,250"
    )]
    concurrency: Vec<usize>,
    /// Measured requests per level.
    #[arg(long, alias = "num-prompts", default_value_t = 30)]
    requests_per_level: usize,
    /// Requests sent (and not measured) before the first level.
    #[arg(long, default_value_t = 5)]
    warmup_requests: usize,
    #[arg(long, value_enum, default_value = "chat")]
    endpoint: EndpointArg,
    /// Ask for whole responses instead of streams (no TTFT, TPOT or ITL then).
    #[arg(long)]
    no_stream: bool,
    /// Ask the server to ignore EOS so every request runs to max tokens (the default).
    #[arg(long, overrides_with = "disable_ignore_eos")]
    ignore_eos: bool,
    /// Let requests stop at EOS.
    #[arg(long)]
    disable_ignore_eos: bool,
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Seed of the prompt order and of Poisson arrivals.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Poisson arrivals at this many requests per second, capped by each level's concurrency
    /// [default: all at once].
    #[arg(long)]
    request_rate: Option<f64>,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 600.0)]
    timeout: f64,
    /// synthetic | rewrite | code | edit | random:INPUT_TOKENS | shared-prefix:PREFIX_TOKENS:GROUPS |
    /// sharegpt | a .jsonl file | a ShareGPT .json file.
    #[arg(long, alias = "dataset-path", default_value = "synthetic")]
    dataset: String,
    /// A JSON object merged into every request body.
    #[arg(long, alias = "extra-request-body")]
    extra_body: Option<String>,
    /// An extra HTTP header, NAME:VALUE (repeatable).
    #[arg(long = "header", value_name = "NAME:VALUE")]
    headers: Vec<String>,
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Open a new connection per request (for servers that tie a thread to each connection).
    #[arg(long)]
    no_keep_alive: bool,
    /// Print TTFT, TPOT, ITL and E2E percentiles under each level.
    #[arg(long, short)]
    verbose: bool,
    /// Save the run (config, environment, levels, every request) as JSON.
    #[arg(long, alias = "output-file")]
    output: Option<PathBuf>,
    /// Save the per-level table as CSV.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Draw throughput and p99 latency against concurrency as SVG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Send the same prompts at every level (by default each level sends its own slice of the
    /// dataset, so no level finds its prompts in the server's prefix cache).
    #[arg(long)]
    reuse_prompts: bool,
    /// The prompt slice the first level takes: scripts that run one level per invocation pass
    /// the level's place in their sweep, so invocations do not repeat each other's prompts.
    #[arg(long, default_value_t = 0, value_name = "N")]
    first_slice: usize,
    /// Empty the server's prefix cache before each level (`POST /flush_cache`; vLLM's
    /// `/reset_prefix_cache`).
    #[arg(long)]
    flush_cache: bool,
    /// Latency objectives for goodput, in ms: ttft:MS tpot:MS e2e:MS (any of them).
    #[arg(long, num_args = 1.., value_name = "KEY:MS")]
    goodput: Vec<String>,
}

#[derive(Args)]
struct CompareArgs {
    /// The baseline run (a --output JSON file).
    base: PathBuf,
    /// The candidate run.
    cand: PathBuf,
    /// Draw both runs as SVG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Save the comparison as JSON.
    #[arg(long)]
    output: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum)]
enum FaultArg {
    None,
    Http500,
    Drop,
    BadJson,
    Hang,
}

#[derive(Args, Clone)]
pub struct MockArgs {
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed on the first line).
    #[arg(long, default_value_t = 30000)]
    port: u16,
    #[arg(long, default_value = "mock-model")]
    model_name: String,
    /// Pace of every stream.
    #[arg(long, default_value_t = 100.0)]
    pub tokens_per_second: f64,
    /// Time to first token, ms.
    #[arg(long, default_value_t = 20.0)]
    pub ttft_ms: f64,
    /// Spread TTFT evenly over [ttft, ttft + jitter] ms across each 100 requests.
    #[arg(long, default_value_t = 0.0)]
    ttft_jitter_ms: f64,
    /// Tokens per streamed chunk (more than one mimics speculative decoding).
    #[arg(long, default_value_t = 1)]
    tokens_per_chunk: usize,
    /// Never send `usage`.
    #[arg(long)]
    no_usage: bool,
    /// Misbehave on every --fault-every'th request.
    #[arg(long, value_enum, default_value = "none")]
    fault: FaultArg,
    #[arg(long, default_value_t = 1)]
    fault_every: u64,
    /// Without ignore_eos, stop after this many tokens.
    #[arg(long)]
    eos_after: Option<u32>,
    /// Answer 401 unless requests carry `Authorization: Bearer KEY`.
    #[arg(long, value_name = "KEY")]
    require_api_key: Option<String>,
    /// Report this `usage.spec_accept_length` (tokens per verification pass), as a speculating
    /// server does.
    #[arg(long, value_name = "TOKENS")]
    spec_accept_length: Option<f64>,
    /// Serve `/metrics` with counters in specula's names (a prompt seen since the last flush
    /// counts as cached).
    #[arg(long)]
    metrics: bool,
    /// Serve `POST /flush_cache`.
    #[arg(long)]
    flush_cache: bool,
}

impl MockArgs {
    pub fn config(&self) -> Result<MockConfig, anyhow::Error> {
        let cfg = MockConfig {
            model: self.model_name.clone(),
            tokens_per_second: self.tokens_per_second,
            ttft_ms: self.ttft_ms,
            ttft_jitter_ms: self.ttft_jitter_ms,
            tokens_per_chunk: self.tokens_per_chunk,
            usage: !self.no_usage,
            fault: match self.fault {
                FaultArg::None => Fault::None,
                FaultArg::Http500 => Fault::Http500,
                FaultArg::Drop => Fault::Drop,
                FaultArg::BadJson => Fault::BadJson,
                FaultArg::Hang => Fault::Hang,
            },
            fault_every: self.fault_every,
            eos_after: self.eos_after,
            default_max_tokens: 16,
            spec_accept_length: self.spec_accept_length,
            api_key: self.require_api_key.clone(),
            metrics: self.metrics,
            flush_cache: self.flush_cache,
        };
        cfg.validate().map_err(|e| anyhow!("mock server: {e}"))?;
        Ok(cfg)
    }
}

pub async fn run(args: BenchArgs) -> Result<(), Failure> {
    match args.action {
        Some(BenchAction::Compare(c)) => run_compare(c),
        Some(BenchAction::MockServer(m)) => run_mock(m).await,
        None => run_bench(&args.run, None).await,
    }
}

impl RunArgs {
    /// The benchmark configuration these flags describe (`base_url` overrides host and port).
    pub fn config(&self, base_url: Option<String>) -> Result<BenchConfig, anyhow::Error> {
        let base_url = base_url
            .or_else(|| self.base_url.clone())
            .unwrap_or_else(|| format!("http://{}:{}", self.host, self.port));
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            bail!("--base-url must start with http:// or https:// (got `{base_url}`)");
        }
        if self.concurrency.is_empty() || self.concurrency.contains(&0) {
            bail!("--concurrency needs levels of at least 1, e.g. --concurrency 1,2,5");
        }
        if self.requests_per_level == 0 {
            bail!("--requests-per-level must be at least 1");
        }
        if self.max_tokens == 0 {
            bail!("--max-tokens must be at least 1");
        }
        if let Some(r) = self.request_rate
            && !(r >= 0.001 && r.is_finite())
        {
            bail!("--request-rate must be a number of requests per second, at least 0.001");
        }
        let timeout = Duration::try_from_secs_f64(self.timeout)
            .ok()
            .filter(|t| !t.is_zero())
            .ok_or_else(|| anyhow!("--timeout must be a positive number of seconds"))?;
        let extra_body = match &self.extra_body {
            None => Default::default(),
            Some(text) => match serde_json::from_str(text) {
                Ok(serde_json::Value::Object(map)) => map,
                _ => bail!("--extra-body must be a JSON object, e.g. '{{\"top_k\": 1}}'"),
            },
        };
        let headers = self
            .headers
            .iter()
            .map(|h| {
                h.split_once(':')
                    .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                    .filter(|(k, _)| !k.is_empty())
                    .ok_or_else(|| anyhow!("--header `{h}`: expected NAME:VALUE"))
            })
            .collect::<Result<_, _>>()?;
        let dataset = DatasetSpec::parse(&self.dataset).map_err(|e| anyhow!("--dataset {e}"))?;
        let goodput = if self.goodput.is_empty() {
            None
        } else {
            let slo = Objectives::parse(&self.goodput).map_err(|e| anyhow!("--goodput {e}"))?;
            if slo.needs_streaming() && self.no_stream {
                bail!("--goodput ttft and tpot are measured on streams: drop --no-stream");
            }
            Some(slo)
        };
        let cfg = BenchConfig {
            base_url: base_url.trim_end_matches('/').to_string(),
            model: self.model.clone(),
            max_tokens: self.max_tokens,
            concurrency: self.concurrency.clone(),
            requests_per_level: self.requests_per_level,
            warmup_requests: self.warmup_requests,
            endpoint: match self.endpoint {
                EndpointArg::Chat => Endpoint::Chat,
                EndpointArg::Completions => Endpoint::Completions,
            },
            stream: !self.no_stream,
            ignore_eos: !self.disable_ignore_eos,
            temperature: self.temperature,
            seed: self.seed,
            request_rate: self.request_rate,
            timeout,
            dataset,
            extra_body,
            headers,
            api_key: self.api_key.clone().filter(|k| !k.is_empty()),
            keep_alive: !self.no_keep_alive,
            reuse_prompts: self.reuse_prompts,
            first_slice: self.first_slice,
            flush_cache: self.flush_cache,
            goodput,
        };
        cfg.prompt_plan(0)
            .check(cfg.concurrency.len())
            .map_err(|e| anyhow!(e))?;
        Ok(cfg)
    }
}

/// Runs the sweep and writes the requested files. `base_url` overrides the flags (the demo).
pub async fn run_bench(args: &RunArgs, base_url: Option<String>) -> Result<(), Failure> {
    let cfg = args.config(base_url)?;
    for path in [&args.output, &args.csv, &args.plot].into_iter().flatten() {
        check_writable(path)?;
    }
    let dataset = Arc::new(load_dataset(&cfg).await?);
    let display = args.display();
    let mut stdout = std::io::stdout();
    let report = match run_sweep(&cfg, dataset, &mut stdout, display).await {
        Ok(r) => r,
        Err(e) => {
            return Err(Failure {
                code: e.exit_code(),
                error: e.into(),
            });
        }
    };
    if let Some(path) = &args.output {
        report.save(path)?;
        println!("\n  Saved the run to {}", path.display());
    }
    if let Some(path) = &args.csv {
        write_csv(&report, path)?;
        println!("  Saved the per-level table to {}", path.display());
    }
    if let Some(path) = &args.plot {
        let label = report.label(args.output.as_deref());
        plot_sweep(
            &[Series {
                label,
                run: &report,
            }],
            path,
        )?;
        println!("  Saved the plot to {}", path.display());
    }
    if report.levels.iter().all(|l| l.stats.ok == 0) {
        return Err(
            anyhow!("no request succeeded; see the first error of each class above").into(),
        );
    }
    Ok(())
}

impl RunArgs {
    /// How the sweep shows itself: a progress bar on a terminal, `--verbose` lines.
    pub fn display(&self) -> Display {
        Display {
            progress: std::io::stderr().is_terminal(),
            verbose: self.verbose,
        }
    }
}

/// The prompts of `cfg.dataset` (ShareGPT fetched on first use).
pub async fn load_dataset(cfg: &BenchConfig) -> Result<Dataset, Failure> {
    let spec = match &cfg.dataset {
        DatasetSpec::ShareGpt => DatasetSpec::File(
            tokio::task::spawn_blocking(crate::assets::sharegpt_path)
                .await
                .context("dataset fetch task failed")??,
        ),
        other => other.clone(),
    };
    // Generated sets are made large enough that no prompt repeats.
    let needed = cfg
        .prompt_plan(0)
        .needed(cfg.concurrency.len())
        .max(cfg.warmup_requests);
    Ok(Dataset::load(&spec, cfg.seed, needed)?)
}

/// Fails early (before a long sweep) when an output file could not be written.
fn check_writable(path: &Path) -> Result<(), anyhow::Error> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        bail!(
            "cannot write {}: folder {} does not exist",
            path.display(),
            dir.display()
        );
    }
    Ok(())
}

fn run_compare(args: CompareArgs) -> Result<(), Failure> {
    let base = RunReport::load(&args.base)?;
    let cand = RunReport::load(&args.cand)?;
    let (base_label, cand_label) = (base.label(Some(&args.base)), cand.label(Some(&args.cand)));
    let cmp = compare(&base, &base_label, &cand, &cand_label);
    print!("{}", render(&cmp));
    if let Some(path) = &args.output {
        let json = serde_json::to_vec_pretty(&cmp).context("serialising the comparison")?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
        println!("  Saved the comparison to {}", path.display());
    }
    if let Some(path) = &args.plot {
        let series = [
            Series {
                label: base_label,
                run: &base,
            },
            Series {
                label: cand_label,
                run: &cand,
            },
        ];
        plot_sweep(&series, path)?;
        println!("  Saved the plot to {}", path.display());
    }
    Ok(())
}

async fn run_mock(args: MockArgs) -> Result<(), Failure> {
    let cfg = args.config()?;
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    // Tests read this line to learn the port.
    println!("mock server listening on http://{addr}");
    use std::io::Write;
    std::io::stdout().flush().ok();
    bench::mock::serve(listener, cfg)
        .await
        .context("mock server failed")?;
    Ok(())
}
