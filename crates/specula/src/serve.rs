//! `specula serve`: the OpenAI-compatible server. Flags use SGLang's names; `--config FILE.toml`
//! takes the same keys (flags win). Start-up binds the port, loads the model, starts the engine
//! and runs a warm-up generation before `/health` says ready; any failure exits non-zero with one
//! line. SIGTERM/SIGINT drain in-flight requests (new ones get 503) and exit 0.

use crate::Failure;
use anyhow::{Context, anyhow};
use clap::Args;
use kvcache::DEFAULT_BLOCK_SIZE as BLOCK_SIZE;
use model::Model;
use model::chat_template::ChatTemplate;
use model::tokenizer::Tokenizer;
use serde::Deserialize;
use server::{AppState, Loaded, Phase};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Flags; every one can also come from `--config` (same name, kebab-case key).
#[derive(Args, Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1].
    #[arg(long)]
    pub host: Option<String>,
    /// Port to listen on; 0 picks a free one [default: 30000].
    #[arg(long)]
    pub port: Option<u16>,
    /// The GGUF model [default: the default model, fetched if missing].
    #[arg(long, alias = "model")]
    pub model_path: Option<PathBuf>,
    /// The model name `/v1/models` lists and requests use [default: the file name].
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Longest sequence (prompt + output) [default: the model's].
    #[arg(long)]
    pub context_length: Option<usize>,
    /// Requests decoded together at most [default: 64].
    #[arg(long)]
    pub max_running_requests: Option<usize>,
    /// Requests waiting beyond the running ones; more get 503 [default: 256].
    #[arg(long)]
    pub max_queued_requests: Option<usize>,
    /// KV cache capacity in tokens [default: 32768; memory grows as it fills].
    #[arg(long)]
    pub max_total_tokens: Option<usize>,
    /// Prompt tokens one engine step processes at most [default: 512].
    #[arg(long)]
    pub chunked_prefill_size: Option<usize>,
    /// Require `Authorization: Bearer KEY` on /v1 routes.
    #[arg(long)]
    pub api_key: Option<String>,
    /// trace, debug, info, warning or error [default: info].
    #[arg(long)]
    pub log_level: Option<String>,
    /// Kernel threads [default: all cores].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Seconds to finish in-flight requests after SIGTERM/SIGINT [default: 30].
    #[arg(long)]
    pub shutdown_timeout: Option<u64>,
    /// Speculative decoding: NONE, NGRAM (prompt lookup) or STANDALONE (a draft model, given
    /// by --speculative-draft-model-path) [default: NONE].
    #[arg(long)]
    pub speculative_algorithm: Option<String>,
    /// The draft model for STANDALONE: a GGUF file with the target's tokenizer.
    #[arg(long)]
    pub speculative_draft_model_path: Option<PathBuf>,
    /// Draft tokens a sequence verifies per step at most (the nodes of its draft tree)
    /// [default: 8 for NGRAM; for STANDALONE, num-steps × eagle-topk].
    #[arg(long)]
    pub speculative_num_draft_tokens: Option<usize>,
    /// STANDALONE: draft-model steps per speculative step, i.e. the depth of the drafted chain
    /// or tree [default: 4].
    #[arg(long)]
    pub speculative_num_steps: Option<usize>,
    /// Branching per draft step: 1 drafts a chain; k > 1 a tree (NGRAM: up to k different
    /// continuations a node; STANDALONE: the draft's k best candidates a level) [default: 1].
    #[arg(long)]
    pub speculative_eagle_topk: Option<usize>,
    /// Shortest suffix an n-gram draft matches on [default: 1].
    #[arg(long)]
    pub speculative_ngram_min_match_window: Option<usize>,
    /// Longest suffix an n-gram draft tries first [default: 12].
    #[arg(long)]
    pub speculative_ngram_max_match_window: Option<usize>,
    /// No speculation while more than this many requests run [default: none, always].
    #[arg(long)]
    pub speculative_disable_batch_threshold: Option<usize>,
    /// Drafts per sequence and step chosen from the measured step cost and each request's
    /// acceptance, instead of always the most.
    #[arg(long)]
    pub speculative_adaptive: bool,
    /// Turn the radix prefix cache off: every prompt is computed in full.
    #[arg(long)]
    pub disable_radix_cache: bool,
    /// Admission order of waiting requests: fcfs (arrival) or lpm (longest cached prefix
    /// first) [default: fcfs].
    #[arg(long)]
    pub schedule_policy: Option<String>,
    /// Keep blocks evicted from the KV pool in a larger host tier instead of dropping them; a
    /// prefix hit brings them back instead of recomputing them.
    #[arg(long)]
    pub enable_hierarchical_cache: bool,
    /// Host tier size relative to the KV pool (--max-total-tokens) [default: 2.0].
    #[arg(long)]
    pub hicache_ratio: Option<f64>,
    /// Host tier size in GB; over --hicache-ratio when given.
    #[arg(long)]
    pub hicache_size: Option<f64>,
    /// A directory for a third tier: host blocks that would be dropped are written there, and
    /// every cached block on shutdown, so a restarted server starts warm (needs
    /// --enable-hierarchical-cache).
    #[arg(long)]
    pub hicache_storage_dir: Option<PathBuf>,
    /// Parse tool calls out of the output of requests with `tools`: hermes (alias qwen25,
    /// qwen), llama3, mistral, deepseekv3, kimi_k2 or pythonic [default: none, calls stay text].
    #[arg(long)]
    pub tool_call_parser: Option<String>,
    /// Separate the thought into `reasoning_content`: deepseek-r1, qwen3 or kimi [default: none].
    #[arg(long)]
    pub reasoning_parser: Option<String>,
    /// For tests only: a JSON file of rules `[{"when": "prompt text", "reply": "…"}]`; a
    /// request whose prompt matches a rule gets that reply as the model's output (the forward
    /// passes still run).
    #[arg(long, hide = true)]
    pub scripted_output: Option<PathBuf>,
    /// A TOML file with any of these settings.
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
}

/// How big the prefix cache's host tier is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HostTier {
    Ratio(f64),
    Gb(f64),
}

/// The effective settings: flags over the config file over the defaults.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServeConfig {
    pub host: String,
    pub port: u16,
    pub model_path: Option<PathBuf>,
    pub served_model_name: Option<String>,
    pub context_length: Option<usize>,
    pub max_running_requests: usize,
    pub max_queued_requests: usize,
    pub max_total_tokens: usize,
    pub chunked_prefill_size: usize,
    #[serde(skip)]
    pub api_key: Option<String>,
    pub log_level: String,
    pub threads: Option<usize>,
    pub shutdown_timeout: u64,
    pub disable_radix_cache: bool,
    pub schedule_policy: String,
    /// The host tier's size: `Ratio(r)` of the KV pool or `Gb(size)`; `None` without one.
    #[serde(skip)]
    pub hicache: Option<HostTier>,
    pub hicache_storage_dir: Option<PathBuf>,
    #[serde(skip)]
    pub policy: engine::SchedulePolicy,
    /// Speculation, when on.
    #[serde(skip)]
    pub speculative: Option<engine::SpecConfig>,
    /// The draft model of STANDALONE speculation.
    #[serde(skip)]
    pub speculative_draft_model_path: Option<PathBuf>,
    /// `--tool-call-parser`, checked.
    #[serde(skip)]
    pub tool_call_parser: Option<server::parsers::ToolFormat>,
    /// `--reasoning-parser`, checked.
    #[serde(skip)]
    pub reasoning_parser: Option<server::parsers::ReasoningFormat>,
    /// `--scripted-output`, read.
    #[serde(skip)]
    pub script: Option<server::script::Script>,
}

impl ServeArgs {
    /// Merges the config file (if any) under the flags.
    pub fn resolve(self) -> anyhow::Result<ServeConfig> {
        let file = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                toml::from_str::<ServeArgs>(&text)
                    .map_err(|e| anyhow!("{}: {}", path.display(), e.message()))?
            }
            None => ServeArgs::default(),
        };
        let cfg = ServeConfig {
            host: self
                .host
                .or(file.host)
                .unwrap_or_else(|| "127.0.0.1".into()),
            port: self.port.or(file.port).unwrap_or(30000),
            model_path: self.model_path.or(file.model_path),
            served_model_name: self.served_model_name.or(file.served_model_name),
            context_length: self.context_length.or(file.context_length),
            max_running_requests: self
                .max_running_requests
                .or(file.max_running_requests)
                .unwrap_or(64),
            max_queued_requests: self
                .max_queued_requests
                .or(file.max_queued_requests)
                .unwrap_or(256),
            max_total_tokens: self
                .max_total_tokens
                .or(file.max_total_tokens)
                .unwrap_or(32768),
            chunked_prefill_size: self
                .chunked_prefill_size
                .or(file.chunked_prefill_size)
                .unwrap_or(512),
            api_key: self.api_key.or(file.api_key),
            log_level: self
                .log_level
                .or(file.log_level)
                .unwrap_or_else(|| "info".into()),
            threads: self.threads.or(file.threads),
            shutdown_timeout: self
                .shutdown_timeout
                .or(file.shutdown_timeout)
                .unwrap_or(30),
            disable_radix_cache: self.disable_radix_cache || file.disable_radix_cache,
            schedule_policy: self
                .schedule_policy
                .or(file.schedule_policy)
                .unwrap_or_else(|| "fcfs".into())
                .to_ascii_lowercase(),
            policy: engine::SchedulePolicy::Fcfs,
            hicache: None,
            hicache_storage_dir: self.hicache_storage_dir.or(file.hicache_storage_dir),
            speculative: None,
            speculative_draft_model_path: None,
            tool_call_parser: None,
            reasoning_parser: None,
            script: None,
        };
        let mut cfg = cfg;
        if let Some(name) = self.tool_call_parser.or(file.tool_call_parser) {
            cfg.tool_call_parser =
                Some(server::parsers::ToolFormat::parse(&name).ok_or_else(|| {
                    anyhow!(
                        "--tool-call-parser {name}: use one of {}",
                        server::parsers::ToolFormat::NAMES
                    )
                })?);
        }
        if let Some(name) = self.reasoning_parser.or(file.reasoning_parser) {
            cfg.reasoning_parser = Some(
                server::parsers::ReasoningFormat::parse(&name).ok_or_else(|| {
                    anyhow!("--reasoning-parser {name}: use deepseek-r1, qwen3 or kimi")
                })?,
            );
        }
        if let Some(path) = self.scripted_output.or(file.scripted_output) {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            cfg.script = Some(
                server::script::Script::parse(&text)
                    .map_err(|e| anyhow!("--scripted-output {}: {e}", path.display()))?,
            );
        }
        if self.enable_hierarchical_cache || file.enable_hierarchical_cache {
            if cfg.disable_radix_cache {
                anyhow::bail!(
                    "--enable-hierarchical-cache needs the radix cache (drop --disable-radix-cache)"
                );
            }
            let tier = match (
                self.hicache_size.or(file.hicache_size),
                self.hicache_ratio.or(file.hicache_ratio),
            ) {
                (Some(gb), _) => HostTier::Gb(gb),
                (None, r) => HostTier::Ratio(r.unwrap_or(2.0)),
            };
            let (HostTier::Gb(v) | HostTier::Ratio(v)) = tier;
            if !(v.is_finite() && v > 0.0) {
                anyhow::bail!("--hicache-size and --hicache-ratio must be positive");
            }
            cfg.hicache = Some(tier);
        }
        if cfg.hicache_storage_dir.is_some() && cfg.hicache.is_none() {
            anyhow::bail!("--hicache-storage-dir needs --enable-hierarchical-cache");
        }
        cfg.policy = match cfg.schedule_policy.as_str() {
            "fcfs" => engine::SchedulePolicy::Fcfs,
            "lpm" => engine::SchedulePolicy::Lpm,
            other => anyhow::bail!("--schedule-policy {other}: use fcfs or lpm"),
        };
        let algorithm: speculative::Algorithm = self
            .speculative_algorithm
            .or(file.speculative_algorithm)
            .as_deref()
            .unwrap_or("NONE")
            .parse()
            .map_err(|e: String| anyhow!("--speculative-algorithm: {e}"))?;
        let topk = self
            .speculative_eagle_topk
            .or(file.speculative_eagle_topk)
            .unwrap_or(1);
        if topk == 0 {
            anyhow::bail!("--speculative-eagle-topk must be at least 1 (1 drafts a chain)");
        }
        let draft_path = self
            .speculative_draft_model_path
            .or(file.speculative_draft_model_path);
        let num_steps = self.speculative_num_steps.or(file.speculative_num_steps);
        let num_draft_tokens = self
            .speculative_num_draft_tokens
            .or(file.speculative_num_draft_tokens);
        match algorithm {
            speculative::Algorithm::None => {}
            speculative::Algorithm::Ngram | speculative::Algorithm::Standalone => {
                let steps = num_steps.unwrap_or(4);
                let num_draft_tokens = match algorithm {
                    // A chain of num_steps drafts, capped by num_draft_tokens if given; a tree's
                    // num_steps levels of topk, of which num_draft_tokens are verified.
                    speculative::Algorithm::Standalone if topk == 1 => {
                        num_draft_tokens.map_or(steps, |n| n.min(steps))
                    }
                    speculative::Algorithm::Standalone => num_draft_tokens.unwrap_or(steps * topk),
                    _ => num_draft_tokens.unwrap_or(8),
                };
                let spec = engine::SpecConfig {
                    algorithm,
                    num_draft_tokens,
                    topk,
                    num_steps: steps,
                    ngram_min_window: self
                        .speculative_ngram_min_match_window
                        .or(file.speculative_ngram_min_match_window)
                        .unwrap_or(1),
                    ngram_max_window: self
                        .speculative_ngram_max_match_window
                        .or(file.speculative_ngram_max_match_window)
                        .unwrap_or(12),
                    disable_batch_threshold: self
                        .speculative_disable_batch_threshold
                        .or(file.speculative_disable_batch_threshold),
                    adaptive: self.speculative_adaptive || file.speculative_adaptive,
                };
                if spec.num_draft_tokens == 0 {
                    anyhow::bail!(
                        "--speculative-num-draft-tokens and --speculative-num-steps must be at least 1"
                    );
                }
                speculative::NgramProposer::new(spec.ngram_min_window, spec.ngram_max_window)
                    .map_err(|e| anyhow!("{e}"))?;
                if algorithm == speculative::Algorithm::Standalone {
                    let Some(path) = draft_path else {
                        anyhow::bail!(
                            "--speculative-algorithm STANDALONE needs --speculative-draft-model-path"
                        );
                    };
                    cfg.speculative_draft_model_path = Some(path);
                }
                cfg.speculative = Some(spec);
            }
        }
        if cfg.max_running_requests == 0 {
            anyhow::bail!("--max-running-requests must be at least 1");
        }
        if cfg.chunked_prefill_size == 0 {
            anyhow::bail!("--chunked-prefill-size must be at least 1");
        }
        if cfg.threads == Some(0) {
            anyhow::bail!("--threads must be at least 1");
        }
        if cfg.context_length == Some(0) {
            anyhow::bail!("--context-length must be at least 1");
        }
        log_filter(&cfg.log_level)?;
        Ok(cfg)
    }
}

/// The tracing filter for a `--log-level`.
pub fn log_filter(level: &str) -> anyhow::Result<&'static str> {
    Ok(match level.to_ascii_lowercase().as_str() {
        "trace" => "trace",
        "debug" => "debug",
        "info" => "info",
        "warn" | "warning" => "warn",
        "error" | "critical" => "error",
        other => anyhow::bail!("--log-level {other}: use trace, debug, info, warning or error"),
    })
}

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
    // 1. The port first: a taken port fails before the model loads.
    let addr = format!("{}:{}", cfg.host, cfg.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr().context("no local address")?;
    let model_path = crate::model_cmd::resolve(cfg.model_path.clone())?;
    let served = cfg.served_model_name.clone().unwrap_or_else(|| {
        model_path
            .file_stem()
            .map_or("model".into(), |s| s.to_string_lossy().into_owned())
    });
    let mut info = serde_json::to_value(&cfg).context("config")?;
    info["speculative"] = match &cfg.speculative {
        None => "NONE".into(),
        Some(spec) => serde_json::json!({
            "algorithm": spec.algorithm.to_string(),
            "draft_model_path": cfg.speculative_draft_model_path,
            "num_draft_tokens": spec.num_draft_tokens,
            "ngram_match_window": [spec.ngram_min_window, spec.ngram_max_window],
            "disable_batch_threshold": spec.disable_batch_threshold,
            "adaptive": spec.adaptive,
        }),
    };
    info["tool_call_parser"] = cfg.tool_call_parser.map(|f| f.name()).into();
    info["reasoning_parser"] = cfg.reasoning_parser.map(|f| f.name()).into();
    let mut state = AppState::new(served.clone(), cfg.api_key.clone(), info);
    state.tool_parser = cfg.tool_call_parser;
    state.reasoning_parser = cfg.reasoning_parser;
    state.script = cfg.script.clone();
    if state.script.is_some() {
        tracing::warn!("--scripted-output: replies come from the script, not the model");
    }
    let state = Arc::new(state);
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let app = server::router(state.clone());
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stop_rx.await;
            })
            .await
    });
    // The address (port 0 picks one) on stdout, for scripts and tests.
    println!(
        "specula serve: listening on http://{local} (loading {})",
        model_path.display()
    );

    // 2. Model, tokenizer, template, engine, warm-up: all or nothing.
    let t0 = Instant::now();
    let settings = cfg.clone();
    let loaded = tokio::task::spawn_blocking(move || load(&model_path, &settings))
        .await
        .map_err(|e| anyhow!("loading failed: {e}"))??;
    let engine = loaded.engine.clone();
    state.set_loaded(loaded);
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

/// Names a model file's weights for the storage tier: its size and a hash of its first and last
/// MiB (the metadata and the last tensors), so stored KV of another model is never reused.
fn fingerprint(path: &std::path::Path) -> anyhow::Result<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let len = f.metadata()?.len();
    let mut buf = Vec::with_capacity(1 << 20);
    (&mut f).take(1 << 20).read_to_end(&mut buf)?;
    let mut h = kvcache::fnv1a(kvcache::FNV_OFFSET, &buf);
    f.seek(SeekFrom::Start(len.saturating_sub(1 << 20)))?;
    buf.clear();
    (&mut f).take(1 << 20).read_to_end(&mut buf)?;
    h = kvcache::fnv1a(h, &buf);
    Ok(format!("{len}-{h:016x}-bs{BLOCK_SIZE}"))
}

fn load(path: &std::path::Path, s: &ServeConfig) -> anyhow::Result<Loaded> {
    let model = Model::load(path).with_context(|| format!("cannot load {}", path.display()))?;
    let tokenizer = Tokenizer::from_gguf(&model.file)
        .with_context(|| format!("{}: cannot build the tokenizer", path.display()))?;
    let template = match ChatTemplate::from_gguf(&model.file, &tokenizer) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!("no usable chat template ({e}): /v1/chat/completions will refuse");
            None
        }
    };
    let model_context = model.config.context_length;
    let context_length = match s.context_length {
        Some(c) if c > model_context => {
            tracing::warn!(
                "--context-length {c} is over the model's {model_context}; using it anyway"
            );
            c
        }
        Some(c) => c,
        None => model_context,
    };
    let config = engine::EngineConfig {
        max_running: s.max_running_requests,
        max_queued: s.max_queued_requests,
        max_total_tokens: s.max_total_tokens,
        chunked_prefill_size: s.chunked_prefill_size,
        context_length,
        block_size: BLOCK_SIZE,
        speculative: s.speculative,
        prefix_cache: !s.disable_radix_cache,
        schedule_policy: s.policy,
        host_cache_blocks: 0,
        hicache_storage_dir: s.hicache_storage_dir.clone(),
        model_fingerprint: fingerprint(path)?,
    };
    let mut config = config;
    if let Some(tier) = s.hicache {
        let c = &model.config;
        // The KV store holds f32 keys and values.
        let block_bytes =
            kvcache::KvLayout::new(c.n_layers as u32, c.n_kv_heads as u32, c.head_dim as u32, 4)
                .bytes_per_block(BLOCK_SIZE);
        let blocks = match tier {
            HostTier::Ratio(r) => (config.kv_blocks() as f64 * r) as usize,
            HostTier::Gb(gb) => (gb * 1e9 / block_bytes as f64) as usize,
        };
        if blocks == 0 {
            anyhow::bail!("the host cache tier holds no block ({block_bytes} bytes each)");
        }
        tracing::info!(
            blocks,
            gb = blocks as f64 * block_bytes as f64 / 1e9,
            "prefix cache host tier"
        );
        config.host_cache_blocks = blocks;
    }
    let draft = s
        .speculative_draft_model_path
        .as_deref()
        .map(|p| {
            Model::load(p).with_context(|| format!("cannot load the draft model {}", p.display()))
        })
        .transpose()?;
    let eog = tokenizer.eog_ids().to_vec();
    let engine = engine::start(model, draft, config, eog).context("cannot start the engine")?;
    Ok(Loaded {
        engine,
        tokenizer,
        template,
    })
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
