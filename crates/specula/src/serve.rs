//! `specula serve`: the OpenAI-compatible server. Flags use SGLang's names; `--config FILE.toml`
//! takes the same keys (flags win). Start-up binds the port, loads the model, starts the engine
//! and runs a warm-up generation before `/health` says ready; any failure exits non-zero with one
//! line. SIGTERM/SIGINT drain in-flight requests (new ones get 503) and exit 0.
//!
//! The settings: declared in `args` (one field each), stacked in `layers` (flags over file over
//! defaults), checked in `config`; `load` builds the engine from them.

mod args;
mod config;
mod layers;
mod load;

pub use args::{LogLevel, ServeArgs};
pub use config::{HostTier, ServeConfig};

use crate::Failure;
use anyhow::{Context, anyhow};
use server::{AppState, Phase};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The exit status when the engine died or stalled (sysexits' EX_SOFTWARE).
pub const EXIT_ENGINE_FAILED: i32 = 70;

pub async fn run(cfg: ServeConfig) -> Result<(), Failure> {
    let running = start(cfg).await?;
    wait_for_signal().await;
    running.drain().await;
    println!("specula serve: stopped");
    Ok(())
}

/// A server that has finished starting: ready, answering on `addr`.
pub struct Running {
    pub addr: std::net::SocketAddr,
    state: Arc<AppState>,
    engine: engine::EngineHandle,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    shutdown_timeout: Duration,
}

/// Binds, loads, warms up; returns once `/health` says ready. Any failure is an error (the
/// listener and engine go away with it).
pub async fn start(cfg: ServeConfig) -> Result<Running, Failure> {
    if let Some(n) = cfg.threads {
        kernels::threads::set_count(n);
    }
    let (fd_before, fd_after) = server::listener::raise_fd_limit();
    tracing::debug!(fd_before, fd_after, "open-file limit");
    // 1. The port first: a taken port fails before the model loads.
    let addr = format!("{}:{}", cfg.host, cfg.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr().context("no local address")?;
    // What --model-path names: a file or a registered model (pulled while loading, below).
    let choice = crate::models::choose(cfg.model_path.as_deref())?;
    let model_path = choice.planned_path()?;
    let served = match (&cfg.served_model_name, choice.name()) {
        (Some(name), _) => name.clone(),
        (None, Some(name)) => name.to_string(),
        (None, None) => model_path
            .file_stem()
            .map_or("model".into(), |s| s.to_string_lossy().into_owned()),
    };
    let mut info = server_info(&cfg)?;
    if choice.name().is_some() {
        // A model given by name: the file it is.
        info["model_path"] = model_path.display().to_string().into();
    }
    let mut state = AppState::new(served.clone(), cfg.api_key.clone(), info);
    state.tool_parser = cfg.tool_call_parser;
    state.reasoning_parser = cfg.reasoning_parser;
    state.script = cfg.script.clone();
    if let Some(mb) = cfg.max_request_memory_mb {
        state.budget = server::budget::RequestBudget::new(mb << 20);
    }
    if state.script.is_some() {
        tracing::warn!("--scripted-output: replies come from the script, not the model");
    }
    let state = Arc::new(state);
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let app = server::router(state.clone());
    let server = tokio::spawn(server::listener::serve(
        listener,
        app,
        cfg.connection_limits(),
        state.metrics.connections.clone(),
        async {
            let _ = stop_rx.await;
        },
    ));
    // The address (port 0 picks one) on stdout, for scripts and tests.
    println!(
        "specula serve: listening on http://{local} (loading {})",
        model_path.display()
    );

    // 2. Model (pulled first if it is a registered one not cached yet), tokenizer, template,
    // engine, warm-up: all or nothing.
    let t0 = Instant::now();
    let settings = cfg.clone();
    let loaded = tokio::task::spawn_blocking(move || load::load(&choice.path()?, &settings))
        .await
        .map_err(|e| anyhow!("loading failed: {e}"))??;
    let engine = loaded.engine.clone();
    state.set_loaded(loaded);
    // Crash-only: an engine that dies or stalls ends the process, for its supervisor to restart.
    engine::watchdog::spawn(
        engine.clone(),
        Duration::from_secs_f64(cfg.watchdog_timeout),
        |failure| {
            tracing::error!("{failure}; exiting so that the server is restarted");
            eprintln!("specula serve: {failure}; exiting");
            std::process::exit(EXIT_ENGINE_FAILED);
        },
    )
    .context("cannot start the watchdog")?;
    server::probe(&engine, Duration::from_secs(300))
        .await
        .map_err(|e| anyhow!("the warm-up generation failed: {e}"))?;
    state.set_phase(Phase::Ready);
    tracing::info!(
        model = served,
        load_s = format!("{:.1}", t0.elapsed().as_secs_f64()),
        "ready on http://{local}"
    );
    println!("specula serve: ready on http://{local} (model {served})");
    Ok(Running {
        addr: local,
        state,
        engine,
        stop,
        server,
        shutdown_timeout: Duration::from_secs(cfg.shutdown_timeout),
    })
}

/// `/server_info`'s settings: the config as serialized, with speculation and the parsers by name.
fn server_info(cfg: &ServeConfig) -> anyhow::Result<serde_json::Value> {
    let mut info = serde_json::to_value(cfg).context("config")?;
    info["speculative"] = match &cfg.speculative {
        None => "NONE".into(),
        Some(spec) => serde_json::json!({
            "algorithm": spec.algorithm().to_string(),
            "draft_model_path": cfg.speculative_draft_model_path,
            "num_draft_tokens": spec.num_draft_tokens(),
            "ngram_match_window": spec.ngram_windows(),
            "disable_batch_threshold": spec.disable_batch_threshold(),
            "adaptive": spec.adaptive(),
        }),
    };
    info["tool_call_parser"] = cfg.tool_call_parser.map(|f| f.name()).into();
    info["reasoning_parser"] = cfg.reasoning_parser.map(|f| f.name()).into();
    Ok(info)
}

impl Running {
    /// Refuses new requests (503), lets in-flight ones finish within the shutdown timeout, then
    /// stops the listener.
    pub async fn drain(self) {
        self.state.set_phase(Phase::Draining);
        let deadline = Instant::now() + self.shutdown_timeout;
        tracing::info!(
            in_flight = self.engine.in_flight(),
            "shutting down: draining requests"
        );
        while self.engine.in_flight() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let left = self.engine.in_flight();
        if left > 0 {
            tracing::warn!(left, "shutdown timeout: requests still running are dropped");
        }
        let written = self.engine.persist_cache().await;
        if written > 0 {
            tracing::info!(written, "prefix cache stored for the next start");
        }
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(2), self.server).await;
    }
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_parses_and_flags_win() {
        let example: ServeArgs =
            toml::from_str(include_str!("../../../deploy/specula.toml")).unwrap();
        assert_eq!(example.port, Some(30000));
        assert_eq!(example.max_running_requests, Some(64));
        assert_eq!(example.served_model_name.as_deref(), Some("smollm2-135m"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "port = 31000\nmax-queued-requests = 5\n").unwrap();
        let flags = ServeArgs {
            port: Some(32000),
            config: Some(path),
            ..ServeArgs::default()
        };
        let cfg = flags.resolve().unwrap();
        assert_eq!((cfg.port, cfg.max_queued_requests), (32000, 5));
        assert_eq!(cfg.max_running_requests, 64);
        assert!(toml::from_str::<ServeArgs>("no-such-key = 1").is_err());
    }

    #[test]
    fn parser_flags_are_checked() {
        let args = |tool: &str, reasoning: &str| ServeArgs {
            tool_call_parser: Some(tool.into()),
            reasoning_parser: Some(reasoning.into()),
            ..ServeArgs::default()
        };
        let cfg = args("qwen25", "deepseek-r1").resolve().unwrap();
        assert_eq!(
            cfg.tool_call_parser,
            Some(server::parsers::ToolFormat::Hermes)
        );
        assert_eq!(
            cfg.reasoning_parser,
            Some(server::parsers::ReasoningFormat::DeepseekR1)
        );
        let e = args("xml", "qwen3").resolve().unwrap_err().to_string();
        assert!(
            e.contains("--tool-call-parser xml") && e.contains("pythonic"),
            "{e}"
        );
        let e = args("hermes", "o1").resolve().unwrap_err().to_string();
        assert!(e.contains("--reasoning-parser o1"), "{e}");
        let bad = ServeArgs {
            scripted_output: Some("/nonexistent/script.json".into()),
            ..ServeArgs::default()
        };
        assert!(bad.resolve().is_err());
    }
}
