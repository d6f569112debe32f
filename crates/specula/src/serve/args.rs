//! Every `specula serve` setting, declared once: its flag, its `--config` key (the same name in
//! kebab-case), its type, its default (shown by `--help`) and its help text.

use super::layers::{opt_named, opt_parsed};
use crate::activations::{self, ActModeParser, KvCacheDtype};
use clap::{Args, ValueEnum};
use model::ActMode;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// One layer of settings: the flags, the config file, or the defaults (see `layers`). A field
/// left `None` (a switch left `false`) is not set by this layer; `resolve` stacks the layers and
/// checks the result. To add a setting, add a field here (with its `default_value` if it has one)
/// and read it where it is used through `ServeConfig`.
#[derive(Args, Debug, Default, Clone, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: Option<String>,
    /// Port to listen on; 0 picks a free one.
    #[arg(long, default_value = "30000")]
    pub port: Option<u16>,
    /// The GGUF model: a file, or a model name (`specula model list`; pulled if missing)
    /// [default: the default model, fetched if missing].
    #[arg(long, alias = "model")]
    pub model_path: Option<PathBuf>,
    /// The model name `/v1/models` lists and requests use [default: the model name given with
    /// --model-path, else the file name].
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Longest sequence (prompt + output) [default: the model's].
    #[arg(long)]
    pub context_length: Option<usize>,
    /// Requests decoded together at most.
    #[arg(long, default_value = "64")]
    pub max_running_requests: Option<usize>,
    /// Requests waiting beyond the running ones; more get 503.
    #[arg(long, default_value = "256")]
    pub max_queued_requests: Option<usize>,
    /// KV cache capacity in tokens (memory grows as it fills).
    #[arg(long, default_value = "32768")]
    pub max_total_tokens: Option<usize>,
    /// Prompt tokens one engine step processes at most.
    #[arg(long, default_value = "512")]
    pub chunked_prefill_size: Option<usize>,
    /// Require `Authorization: Bearer KEY` on /v1 routes.
    #[arg(long)]
    pub api_key: Option<String>,
    /// How much the server logs (`warn` and `critical` are accepted too).
    #[arg(long, value_enum, ignore_case = true, default_value = "info")]
    #[serde(with = "opt_named")]
    pub log_level: Option<LogLevel>,
    /// Kernel threads [default: all cores].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Activation quantisation of the model and the draft model: int16 (exact to f32 rounding)
    /// or int8 (half the integer work of prompts and batched decode, GGML-like rounding).
    #[arg(long, value_parser = ActModeParser, default_value = ActMode::default().name())]
    #[serde(with = "activations::opt_named")]
    pub activations: Option<ActMode>,
    /// What the KV cache holds: f32, or f16 (half its memory and of the bytes each decode
    /// step reads, as llama.cpp stores it; adds to int8's error: see docs/runtime.md).
    #[arg(long, value_enum, ignore_case = true, default_value = KvCacheDtype::default_name())]
    #[serde(with = "opt_named")]
    pub kv_cache_dtype: Option<KvCacheDtype>,
    /// Seconds a client may take to send a request's headers (from connecting, or from the end
    /// of the previous response on a kept-alive connection); then the connection is closed.
    #[arg(long, default_value = "10")]
    pub header_read_timeout: Option<f64>,
    /// Seconds a request's body may take to arrive; past them the request gets 408.
    #[arg(long, default_value = "30")]
    pub body_read_timeout: Option<f64>,
    /// Seconds a kept-alive connection may stay silent between requests (uvicorn's name).
    #[arg(long, default_value = "5")]
    pub timeout_keep_alive: Option<f64>,
    /// Seconds a response may wait on a client that reads nothing (nginx's `send_timeout`); then
    /// the connection is closed and its request ends.
    #[arg(long, default_value = "60")]
    pub send_timeout: Option<f64>,
    /// Open connections at most; at the cap a new one closes the longest-idle one, or gets 503
    /// when all are busy [default: the descriptor limit (raised to its hard limit at start-up)
    /// less 256, at most 16384].
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Seconds to finish in-flight requests after SIGTERM/SIGINT.
    #[arg(long, default_value = "30")]
    pub shutdown_timeout: Option<u64>,
    /// Seconds the engine may go without finishing a step while requests are in flight before
    /// the process exits non-zero (as it does at once if the engine thread dies), so that its
    /// supervisor restarts it.
    #[arg(long, default_value = "300")]
    pub watchdog_timeout: Option<f64>,
    /// Memory that requests being prepared (bodies, parsed JSON, rendered prompts, token ids)
    /// may hold together, in MiB; a request that finds it taken gets 503 with Retry-After
    /// [default: an eighth of the machine's memory, 256–4096].
    #[arg(long)]
    pub max_request_memory_mb: Option<usize>,
    /// Speculative decoding: NONE, NGRAM (prompt lookup), STANDALONE (a draft model, given by
    /// --speculative-draft-model-path), EAGLE3 (a head: the given one, or the built-in one) or
    /// SUFFIX (suffix decoding over the sequence's text and recent requests', vLLM's `suffix`);
    /// drafters combine with commas (`EAGLE3,SUFFIX`: each sequence takes, each step, the
    /// drafts that pay best).
    #[arg(long, default_value = "NONE")]
    #[serde(with = "opt_parsed")]
    pub speculative_algorithm: Option<speculative::Algorithms>,
    /// The draft model for STANDALONE: a GGUF file with the target's tokenizer, or a model by
    /// name (`specula model list`); the head for EAGLE3: a folder in SGLang's layout or a GGUF
    /// file in llama.cpp's.
    #[arg(long)]
    pub speculative_draft_model_path: Option<PathBuf>,
    /// Draft tokens a sequence verifies per step at most (the nodes of its draft tree)
    /// [default: 8 for NGRAM, 16 for SUFFIX; for STANDALONE and EAGLE3, num-steps × eagle-topk; with EAGLE3
    /// and eagle-topk > 1 it counts the root, as in SGLang].
    #[arg(long)]
    pub speculative_num_draft_tokens: Option<usize>,
    /// STANDALONE and EAGLE3: draft steps per speculative step, i.e. the depth of the drafted
    /// chain or tree.
    #[arg(long, default_value = "4")]
    pub speculative_num_steps: Option<usize>,
    /// Branching per draft step: 1 drafts a chain; k > 1 a tree (NGRAM: up to k different
    /// continuations a node; STANDALONE and EAGLE3: the k best candidates a level).
    #[arg(long, default_value = "1")]
    pub speculative_eagle_topk: Option<usize>,
    /// Shortest suffix an n-gram draft matches on.
    #[arg(long, default_value = "1")]
    pub speculative_ngram_min_match_window: Option<usize>,
    /// Longest suffix an n-gram draft tries first.
    #[arg(long, default_value = "12")]
    pub speculative_ngram_max_match_window: Option<usize>,
    /// SUFFIX: the longest suffix match looked for, in tokens (vLLM's
    /// suffix_decoding_max_tree_depth).
    #[arg(long, default_value = "24")]
    pub speculative_suffix_max_tree_depth: Option<usize>,
    /// SUFFIX: finished requests whose prompts and outputs are kept to draft from, newest first
    /// (vLLM's suffix_decoding_max_cached_requests); 0 drafts from the sequence's own text only.
    #[arg(long, default_value = "10000")]
    pub speculative_suffix_max_cached_requests: Option<usize>,
    /// SUFFIX: tokens those requests may hold in all (the oldest requests go first).
    #[arg(long, default_value = "4194304")]
    pub speculative_suffix_max_cached_tokens: Option<usize>,
    /// SUFFIX: drafts per matched token at most (vLLM's suffix_decoding_max_spec_factor).
    #[arg(long, default_value = "1.0")]
    pub speculative_suffix_max_spec_factor: Option<f64>,
    /// SUFFIX: the least share of the earlier continuations a drafted token must have (vLLM's
    /// suffix_decoding_min_token_prob).
    #[arg(long, default_value = "0.1")]
    pub speculative_suffix_min_token_prob: Option<f64>,
    /// No speculation while more than this many requests run [default: none, always].
    #[arg(long)]
    pub speculative_disable_batch_threshold: Option<usize>,
    /// Drafts per sequence and step chosen from the measured step cost and each request's
    /// acceptance, instead of always the most; `--speculative-adaptive false` for always the
    /// most [default: true].
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub speculative_adaptive: Option<bool>,
    /// Turn the radix prefix cache off: every prompt is computed in full.
    #[arg(long)]
    pub disable_radix_cache: bool,
    /// Structured outputs: threads that compile grammars (schemas, regexes, EBNF) [default: 2].
    #[arg(long)]
    pub grammar_compile_threads: Option<usize>,
    /// Structured outputs: seconds a grammar may wait for a compile thread, and then compile;
    /// past the first the request gets 503, past the second 400 [default: 10].
    #[arg(long)]
    pub grammar_compile_timeout: Option<f64>,
    /// Structured outputs: MiB of compiled grammars kept for reuse (estimated) [default: 256].
    #[arg(long)]
    pub grammar_cache_mb: Option<usize>,
    /// Structured outputs: do not verify the tokens a grammar forces (a schema's keys, JSON
    /// punctuation) as drafts of sequences that speculation does not draft.
    #[arg(long)]
    pub disable_grammar_forced_drafts: bool,
    /// Admission order of waiting requests: fcfs (arrival) or lpm (longest cached prefix
    /// first).
    #[arg(long, value_enum, ignore_case = true, default_value = "fcfs")]
    #[serde(with = "opt_named")]
    pub schedule_policy: Option<engine::SchedulePolicy>,
    /// Keep blocks evicted from the KV pool in a larger host tier instead of dropping them; a
    /// prefix hit brings them back instead of recomputing them.
    #[arg(long)]
    pub enable_hierarchical_cache: bool,
    /// Host tier size relative to the KV pool (--max-total-tokens).
    #[arg(long, default_value = "2.0")]
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
    // A name, not a value enum: the parser's names (and aliases) belong to the server crate.
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
    /// For tests only: the engine thread panics or hangs at the first request after the
    /// warm-up.
    #[arg(long, hide = true, value_enum)]
    #[serde(with = "opt_named")]
    pub test_engine_fault: Option<TestEngineFault>,
    /// A TOML file with any of these settings (flags win over it).
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
}

/// `--test-engine-fault`: what the engine thread does on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TestEngineFault {
    Panic,
    Hang,
}

impl TestEngineFault {
    pub fn fault(self) -> engine::TestFault {
        match self {
            Self::Panic => engine::TestFault::Panic,
            Self::Hang => engine::TestFault::Hang,
        }
    }
}

/// `--log-level`: SGLang's names, with `warn` and `critical` as aliases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    #[value(alias = "warn")]
    Warning,
    #[value(alias = "critical")]
    Error,
}

impl LogLevel {
    /// The tracing filter directive.
    pub fn filter(self) -> &'static str {
        match self {
            Self::Trace => "trace",
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Warning => "warn",
            Self::Error => "error",
        }
    }
}
