//! The effective `specula serve` settings: the stacked layers read as typed values, checked, and
//! what follows from them (the speculation, the host tier, the output parsers, the script).

use super::ServeArgs;
use super::args::LogLevel;
use super::layers::{self, named};
use crate::activations::KvCacheDtype;
use anyhow::{Context, anyhow, bail};
use engine::SchedulePolicy;
use model::ActMode;
use serde::{Deserialize, Serialize};
use server::parsers::{ReasoningFormat, ToolFormat};
use speculative::Algorithms;
use std::path::PathBuf;

/// How big the prefix cache's host tier is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HostTier {
    Ratio(f64),
    Gb(f64),
}

/// The effective settings: flags over the config file over the defaults. Read from the stacked
/// layers by key (the same names as `ServeArgs`); serialized, it is `/server_info`'s `config`
/// (the settings marked `skip_serializing` are reported elsewhere there, or not at all).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all(serialize = "snake_case", deserialize = "kebab-case"))]
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
    #[serde(skip_serializing)]
    pub api_key: Option<String>,
    #[serde(with = "named")]
    pub log_level: LogLevel,
    pub threads: Option<usize>,
    #[serde(with = "crate::activations::named")]
    pub activations: ActMode,
    #[serde(with = "named")]
    pub kv_cache_dtype: KvCacheDtype,
    pub header_read_timeout: f64,
    pub body_read_timeout: f64,
    pub timeout_keep_alive: f64,
    pub send_timeout: f64,
    pub max_connections: Option<usize>,
    pub shutdown_timeout: u64,
    pub watchdog_timeout: f64,
    pub max_request_memory_mb: Option<usize>,
    pub disable_radix_cache: bool,
    pub disable_grammar_forced_drafts: bool,
    pub grammar_compile_threads: Option<usize>,
    pub grammar_compile_timeout: Option<f64>,
    pub grammar_cache_mb: Option<usize>,
    #[serde(with = "named")]
    pub schedule_policy: SchedulePolicy,
    pub hicache_storage_dir: Option<PathBuf>,
    #[serde(skip_serializing)]
    enable_hierarchical_cache: bool,
    #[serde(skip_serializing)]
    hicache_ratio: f64,
    #[serde(skip_serializing)]
    hicache_size: Option<f64>,
    #[serde(skip_serializing, with = "super::layers::parsed")]
    speculative_algorithm: Algorithms,
    /// The draft model of STANDALONE speculation (`None` for the other algorithms).
    #[serde(skip_serializing)]
    pub speculative_draft_model_path: Option<PathBuf>,
    #[serde(skip_serializing)]
    speculative_num_draft_tokens: Option<usize>,
    #[serde(skip_serializing)]
    speculative_num_steps: usize,
    #[serde(skip_serializing)]
    speculative_eagle_topk: usize,
    #[serde(skip_serializing)]
    speculative_ngram_min_match_window: usize,
    #[serde(skip_serializing)]
    speculative_ngram_max_match_window: usize,
    #[serde(skip_serializing)]
    speculative_suffix_max_tree_depth: usize,
    #[serde(skip_serializing)]
    speculative_suffix_max_cached_requests: usize,
    #[serde(skip_serializing)]
    speculative_suffix_max_cached_tokens: usize,
    #[serde(skip_serializing)]
    speculative_suffix_max_spec_factor: f64,
    #[serde(skip_serializing)]
    speculative_suffix_min_token_prob: f64,
    #[serde(skip_serializing)]
    speculative_disable_batch_threshold: Option<usize>,
    #[serde(skip_serializing)]
    speculative_adaptive: Option<bool>,
    /// `--tool-call-parser`, checked.
    #[serde(skip_serializing, deserialize_with = "tool_format")]
    pub tool_call_parser: Option<ToolFormat>,
    /// `--reasoning-parser`, checked.
    #[serde(skip_serializing, deserialize_with = "reasoning_format")]
    pub reasoning_parser: Option<ReasoningFormat>,
    #[serde(skip_serializing)]
    scripted_output: Option<PathBuf>,
    #[serde(skip_serializing, default, deserialize_with = "test_fault")]
    pub test_engine_fault: Option<engine::TestFault>,
    /// The host tier's size: `Ratio(r)` of the KV pool or `Gb(size)`; `None` without one.
    #[serde(skip)]
    pub hicache: Option<HostTier>,
    /// Speculation, when on.
    #[serde(skip)]
    pub speculative: Option<speculative::SpecConfig>,
    /// `--scripted-output`, read.
    #[serde(skip)]
    pub script: Option<server::script::Script>,
}

impl ServeArgs {
    /// These settings (the flags) over the config file (if any) over the defaults, checked.
    pub fn resolve(self) -> anyhow::Result<ServeConfig> {
        let file = match &self.config {
            Some(path) => ServeArgs::from_file(path)?,
            None => ServeArgs::default(),
        };
        let merged = layers::stack(&[&self, &file, &ServeArgs::defaults()])?;
        // The only errors here are the parser names' (each names its flag).
        let cfg: ServeConfig = serde_json::from_value(merged).map_err(|e| anyhow!("{e}"))?;
        cfg.checked()
    }
}

impl ServeConfig {
    /// The checks the engine does not make (or not naming the flag), and what follows.
    fn checked(mut self) -> anyhow::Result<Self> {
        // The scheduler's own check, made now so a bad value fails before the model loads.
        engine::SchedulerConfig {
            max_running: self.max_running_requests,
            prefill_budget: self.chunked_prefill_size,
            ..engine::SchedulerConfig::default()
        }
        .validate()?;
        at_least_one("--threads", self.threads)?;
        at_least_one("--max-request-memory-mb", self.max_request_memory_mb)?;
        at_least_one("--grammar-compile-threads", self.grammar_compile_threads)?;
        if self
            .grammar_compile_timeout
            .is_some_and(|t| !(t.is_finite() && t > 0.0))
        {
            bail!("--grammar-compile-timeout must be a positive number of seconds");
        }
        at_least_one("--max-connections", self.max_connections)?;
        for (flag, secs) in [
            ("--watchdog-timeout", self.watchdog_timeout),
            ("--header-read-timeout", self.header_read_timeout),
            ("--body-read-timeout", self.body_read_timeout),
            ("--timeout-keep-alive", self.timeout_keep_alive),
            ("--send-timeout", self.send_timeout),
        ] {
            if !(secs.is_finite() && secs > 0.0) {
                bail!("{flag} must be a positive number of seconds");
            }
        }
        at_least_one("--context-length", self.context_length)?;
        self.hicache = self.host_tier()?;
        self.speculative = self.speculation()?;
        if !self.speculative.is_some_and(|c| c.needs_draft()) {
            self.speculative_draft_model_path = None;
        }
        if let Some(path) = &self.scripted_output {
            self.script = Some(read_script(path)?);
        }
        Ok(self)
    }

    /// What the listener holds connections to: these settings, the cap derived from the
    /// descriptor limit unless given (raise it first).
    pub fn connection_limits(&self) -> server::listener::ConnectionLimits {
        let secs = std::time::Duration::from_secs_f64;
        server::listener::ConnectionLimits {
            header_read_timeout: secs(self.header_read_timeout),
            body_read_timeout: secs(self.body_read_timeout),
            keep_alive_timeout: secs(self.timeout_keep_alive),
            send_timeout: secs(self.send_timeout),
            max_connections: self
                .max_connections
                .unwrap_or_else(server::listener::default_max_connections),
        }
    }

    /// How grammars are compiled and cached: the defaults, with the flags given.
    pub fn grammar_config(&self) -> grammar::GrammarConfig {
        let mut c = grammar::GrammarConfig::default();
        if let Some(n) = self.grammar_compile_threads {
            c.threads = n;
        }
        if let Some(t) = self.grammar_compile_timeout {
            c.deadline = std::time::Duration::from_secs_f64(t);
        }
        if let Some(mb) = self.grammar_cache_mb {
            c.cache_bytes = mb << 20;
        }
        c
    }

    fn host_tier(&self) -> anyhow::Result<Option<HostTier>> {
        if !self.enable_hierarchical_cache {
            return Ok(None);
        }
        if self.disable_radix_cache {
            bail!("--enable-hierarchical-cache needs the radix cache (drop --disable-radix-cache)");
        }
        let tier = match self.hicache_size {
            Some(gb) => HostTier::Gb(gb),
            None => HostTier::Ratio(self.hicache_ratio),
        };
        let (HostTier::Gb(v) | HostTier::Ratio(v)) = tier;
        if !(v.is_finite() && v > 0.0) {
            bail!("--hicache-size and --hicache-ratio must be positive");
        }
        Ok(Some(tier))
    }

    /// Speculation's settings, checked (and each algorithm's draft-token count derived) by
    /// `speculative`, which owns them.
    fn speculation(&self) -> anyhow::Result<Option<speculative::SpecConfig>> {
        Ok(speculative::SpecConfig::from_flags(
            speculative::SpecFlags {
                algorithm: self.speculative_algorithm,
                num_draft_tokens: self.speculative_num_draft_tokens,
                num_steps: self.speculative_num_steps,
                eagle_topk: self.speculative_eagle_topk,
                ngram_min_match_window: self.speculative_ngram_min_match_window,
                ngram_max_match_window: self.speculative_ngram_max_match_window,
                disable_batch_threshold: self.speculative_disable_batch_threshold,
                adaptive: self.speculative_adaptive,
                draft_model_path: self.speculative_draft_model_path.is_some(),
                suffix: speculative::SuffixSettings {
                    max_tree_depth: self.speculative_suffix_max_tree_depth,
                    max_cached_requests: self.speculative_suffix_max_cached_requests,
                    max_cached_tokens: self.speculative_suffix_max_cached_tokens,
                    max_spec_factor: self.speculative_suffix_max_spec_factor,
                    min_token_prob: self.speculative_suffix_min_token_prob,
                },
            },
        )?)
    }
}

fn at_least_one(flag: &str, value: Option<usize>) -> anyhow::Result<()> {
    if value == Some(0) {
        bail!("{flag} must be at least 1");
    }
    Ok(())
}

fn read_script(path: &std::path::Path) -> anyhow::Result<server::script::Script> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    server::script::Script::parse(&text)
        .map_err(|e| anyhow!("--scripted-output {}: {e}", path.display()))
}

fn test_fault<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<engine::TestFault>, D::Error> {
    let fault: Option<super::args::TestEngineFault> = layers::opt_named::deserialize(d)?;
    Ok(fault.map(super::args::TestEngineFault::fault))
}

fn tool_format<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<ToolFormat>, D::Error> {
    let Some(name) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    ToolFormat::parse(&name).map(Some).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "--tool-call-parser {name}: use one of {}",
            ToolFormat::NAMES
        ))
    })
}

fn reasoning_format<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<ReasoningFormat>, D::Error> {
    let Some(name) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    ReasoningFormat::parse(&name).map(Some).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "--reasoning-parser {name}: use deepseek-r1, qwen3 or kimi"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Args;
    use speculative::Algorithm;

    fn command_line(args: &[&str]) -> ServeArgs {
        let command = ServeArgs::augment_args(clap::Command::new("serve"));
        let matches = command.try_get_matches_from(args).unwrap();
        ServeArgs::from_command_line(&matches).unwrap()
    }

    #[test]
    fn the_defaults_are_the_declared_ones() {
        let cfg = ServeArgs::default().resolve().unwrap();
        assert_eq!((cfg.host.as_str(), cfg.port), ("127.0.0.1", 30000));
        assert_eq!(cfg.max_total_tokens, 32768);
        assert_eq!(cfg.chunked_prefill_size, 512);
        assert_eq!(cfg.shutdown_timeout, 30);
        assert_eq!(cfg.log_level, LogLevel::Info);
        assert_eq!(cfg.schedule_policy, SchedulePolicy::Fcfs);
        assert_eq!(cfg.hicache_ratio, 2.0);
        assert_eq!(cfg.speculative_algorithm, Algorithms::NONE);
        assert!(cfg.speculative.is_none() && cfg.hicache.is_none());
        assert!(!cfg.disable_radix_cache && cfg.model_path.is_none());
    }

    #[test]
    fn suffix_decoding_defaults_to_the_settings_speculative_declares() {
        let a = ServeArgs {
            speculative_algorithm: Some(Algorithm::Suffix.into()),
            ..ServeArgs::default()
        };
        let spec = a.resolve().unwrap().speculative.unwrap();
        assert_eq!(spec.suffix(), speculative::suffix::DEFAULT_SETTINGS);
        assert_eq!(
            spec.num_draft_tokens(),
            speculative::config::SUFFIX_DRAFT_TOKENS
        );
        // Every algorithm runs under the adaptive policy unless told otherwise.
        let adaptive = |args: &[&str]| {
            let spec = command_line(args).resolve().unwrap().speculative.unwrap();
            spec.adaptive()
        };
        assert!(spec.adaptive());
        let suffix = ["serve", "--speculative-algorithm", "SUFFIX"];
        assert!(!adaptive(
            &[&suffix[..], &["--speculative-adaptive", "false"]].concat()
        ));
        assert!(!adaptive(
            &[&suffix[..], &["--speculative-adaptive=false"]].concat()
        ));
        let ngram = ["serve", "--speculative-algorithm", "NGRAM"];
        assert!(adaptive(
            &[&ngram[..], &["--speculative-adaptive"]].concat()
        ));
        assert!(adaptive(&ngram));
        assert!(!adaptive(
            &[&ngram[..], &["--speculative-adaptive", "false"]].concat()
        ));
        // Drafters combined on the command line, and in a config file's spelling.
        let both = command_line(&["serve", "--speculative-algorithm", "eagle3,suffix"]);
        let spec = both.resolve().unwrap().speculative.unwrap();
        assert_eq!(spec.algorithm().to_string(), "EAGLE3,SUFFIX");
        let e = ServeArgs::augment_args(clap::Command::new("serve"))
            .try_get_matches_from(["serve", "--speculative-algorithm", "SUFFIX,SUFFIX"])
            .unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
        let a = ServeArgs {
            speculative_algorithm: Some(Algorithm::Suffix.into()),
            speculative_suffix_min_token_prob: Some(1.5),
            ..ServeArgs::default()
        };
        let e = a.resolve().unwrap_err().to_string();
        assert!(e.contains("--speculative-suffix-min-token-prob"), "{e}");
    }

    #[test]
    fn only_the_flags_given_come_from_the_command_line() {
        let flags = command_line(&["serve", "--port", "30000", "--schedule-policy", "LPM"]);
        assert_eq!(flags.port, Some(30000));
        assert_eq!(flags.schedule_policy, Some(SchedulePolicy::Lpm));
        assert_eq!((flags.host, flags.max_running_requests), (None, None));
        assert_eq!((flags.log_level, flags.activations), (None, None));
        assert!(!flags.disable_radix_cache);
    }

    #[test]
    fn flags_win_over_the_file_and_the_file_over_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "port = 31000\nlog-level = \"debug\"\ndisable-radix-cache = true\n\
             speculative-algorithm = \"ngram\"\nspeculative-eagle-topk = 2\n",
        )
        .unwrap();
        let path = path.to_str().unwrap();
        let cfg = command_line(&["serve", "--config", path, "--log-level", "WARN"])
            .resolve()
            .unwrap();
        assert_eq!(cfg.port, 31000);
        assert_eq!(cfg.log_level, LogLevel::Warning);
        // A switch the command line leaves off does not turn the file's off.
        assert!(cfg.disable_radix_cache);
        let spec = cfg.speculative.unwrap();
        assert_eq!(
            (spec.algorithm(), spec.topk()),
            (Algorithm::Ngram.into(), 2)
        );
        assert_eq!(spec.num_draft_tokens(), speculative::NGRAM_DRAFT_TOKENS);
        let cfg = command_line(&["serve", "--config", path, "--port", "30000"])
            .resolve()
            .unwrap();
        assert_eq!(
            cfg.port, 30000,
            "a flag given with the default's value still wins"
        );
    }

    #[test]
    fn bad_values_name_their_flag_or_key() {
        let error = |args: ServeArgs| args.resolve().unwrap_err().to_string();
        let zero = |f: fn(&mut ServeArgs)| {
            let mut args = ServeArgs::default();
            f(&mut args);
            error(args)
        };
        let e = zero(|a| a.max_running_requests = Some(0));
        assert!(
            e.contains("--max-running-requests must be at least 1"),
            "{e}"
        );
        let e = zero(|a| a.chunked_prefill_size = Some(0));
        assert!(e.contains("--chunked-prefill-size"), "{e}");
        let e = zero(|a| {
            a.speculative_algorithm = Some(Algorithm::Ngram.into());
            a.speculative_ngram_min_match_window = Some(3);
            a.speculative_ngram_max_match_window = Some(2);
        });
        assert!(e.contains("--speculative-ngram-max-match-window"), "{e}");
        let e = zero(|a| {
            a.enable_hierarchical_cache = true;
            a.hicache_size = Some(-1.0);
        });
        assert!(e.contains("--hicache-size"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, "port = 1\nschedule-policy = \"lifo\"\n").unwrap();
        let e = error(ServeArgs {
            config: Some(path),
            ..ServeArgs::default()
        });
        assert!(
            e.contains("bad.toml") && e.contains("schedule-policy"),
            "{e}"
        );
        assert!(e.contains("fcfs, lpm"), "{e}");
    }

    #[test]
    fn the_server_info_config_has_the_settings_it_had() {
        let cfg = ServeArgs::default().resolve().unwrap();
        let info = serde_json::to_value(&cfg).unwrap();
        let keys: Vec<&str> = info
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        let mut want = vec![
            "host",
            "port",
            "model_path",
            "served_model_name",
            "context_length",
            "max_running_requests",
            "max_queued_requests",
            "max_total_tokens",
            "chunked_prefill_size",
            "log_level",
            "threads",
            "activations",
            "kv_cache_dtype",
            "shutdown_timeout",
            "watchdog_timeout",
            "header_read_timeout",
            "body_read_timeout",
            "timeout_keep_alive",
            "send_timeout",
            "max_connections",
            "max_request_memory_mb",
            "disable_radix_cache",
            "disable_grammar_forced_drafts",
            "grammar_compile_threads",
            "grammar_compile_timeout",
            "grammar_cache_mb",
            "schedule_policy",
            "hicache_storage_dir",
        ];
        let mut keys = keys;
        keys.sort_unstable();
        want.sort_unstable();
        assert_eq!(keys, want);
        assert_eq!(info["schedule_policy"], "fcfs");
        assert_eq!(info["log_level"], "info");
        assert_eq!(info["activations"], ActMode::default().name());
        assert_eq!(info["kv_cache_dtype"], "f32");
    }

    #[test]
    fn activations_come_from_the_flag_or_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "activations = \"int8\"\n").unwrap();
        let path = path.to_str().unwrap();
        let cfg = command_line(&["serve", "--config", path])
            .resolve()
            .unwrap();
        assert_eq!(cfg.activations, ActMode::Int8);
        let info = serde_json::to_value(&cfg).unwrap();
        assert_eq!(info["activations"], "int8");
        let cfg = command_line(&["serve", "--config", path, "--activations", "int16"])
            .resolve()
            .unwrap();
        assert_eq!(cfg.activations, ActMode::Int16);
        let cfg = ServeArgs::default().resolve().unwrap();
        assert_eq!(cfg.activations, ActMode::default());
        std::fs::write(path, "activations = \"fp8\"\n").unwrap();
        let e = command_line(&["serve", "--config", path])
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("c.toml") && e.contains("activations") && e.contains("int16 or int8"),
            "{e}"
        );
    }
}
