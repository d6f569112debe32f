//! The `specula` binary: a thin CLI over the library crates, one module per subcommand.

mod activations;
mod assets;
mod bench_cmd;
mod demo;
mod generate;
mod heads;
mod model_bench;
mod model_cmd;
mod models;
mod serve;
mod train_draft;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "specula",
    version,
    about = "LLM serving engine and parallel throughput benchmark"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmark an OpenAI-compatible server across concurrency levels.
    Bench(Box<bench_cmd::BenchArgs>),
    /// Serve the model in this process and benchmark it (--compare-spec: without and with
    /// speculation, side by side; --mock: the built-in mock server instead).
    Demo(demo::DemoArgs),
    /// Generate text from a prompt with the model runtime and report its speed.
    Generate(generate::GenerateArgs),
    /// Pull and list models by name, measure the runtime, or describe a GGUF file.
    Model(model_cmd::ModelArgs),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(Box<serve::ServeArgs>),
    /// Train an EAGLE-3 draft head for a model on this machine (SGLang's layout).
    TrainDraft(train_draft::TrainDraftArgs),
}

fn main() {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // `serve` settings are resolved first: its log level sets the default filter. Its flags are
    // read from the matches, which tell a flag given from a default clap filled in.
    let mut serve_config = None;
    let mut level = "warn";
    if let Some(flags) = matches.subcommand_matches("serve") {
        match serve::ServeArgs::from_command_line(flags).and_then(serve::ServeArgs::resolve) {
            Ok(cfg) => {
                level = cfg.log_level.filter();
                serve_config = Some(cfg);
            }
            Err(e) => exit_with(2, &format!("{e:#}")),
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => exit_with(1, &format!("cannot start the async runtime: {e}")),
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Bench(args) => bench_cmd::run(*args).await,
            Command::Demo(args) => demo::run(args).await,
            // The runtime's compute runs on its own (rayon) threads; nothing here is async.
            Command::Generate(args) => generate::run(args),
            Command::Model(args) => model_cmd::run(args),
            Command::Serve(_) => serve::run(serve_config.expect("resolved above")).await,
            Command::TrainDraft(args) => train_draft::run(args).await,
        }
    });
    // Leftover tasks (a mock server, hung requests) must not hold the process open.
    runtime.shutdown_background();
    if let Err(e) = result {
        exit_with(e.code, &format!("{:#}", e.error));
    }
}

fn exit_with(code: i32, message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(code)
}

/// An error with the process exit code it calls for.
pub struct Failure {
    pub code: i32,
    pub error: anyhow::Error,
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        Self {
            code: 1,
            error: e.into(),
        }
    }
}
