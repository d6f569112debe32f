//! The engine's settings checked once, where they are used, with errors that name the flag.

use crate::kv_files::KvFiles;
use crate::{Draft, EngineConfig};
use model::Model;
use scheduler::SchedulerConfig;
use speculative::{Algorithm, DraftError, WindowError};
use std::path::PathBuf;

/// Why the engine cannot start with these settings.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("the KV block size must be at least 1")]
    BlockSize,
    #[error(
        "a KV cache of {tokens} tokens (--max-total-tokens) cannot hold a request: give it at least {min}"
    )]
    KvTooSmall { tokens: usize, min: usize },
    #[error("a host cache of {0} blocks is too large")]
    HostCacheTooLarge(usize),
    #[error(transparent)]
    Scheduler(#[from] scheduler::ConfigError),
    #[error(transparent)]
    Windows(#[from] WindowError),
    #[error(
        "--speculative-num-draft-tokens, --speculative-eagle-topk and --speculative-num-steps must be at least 1"
    )]
    NoDrafts,
    #[error(transparent)]
    Vocabulary(#[from] DraftError),
    #[error("STANDALONE speculation needs a draft model (--speculative-draft-model-path)")]
    NoDraftModel,
    #[error("EAGLE3 speculation needs an EAGLE-3 head (--speculative-draft-model-path)")]
    NoHead,
    #[error(
        "--speculative-draft-model-path gives {given}, which {algorithm} speculation does not use"
    )]
    WrongDraft {
        given: &'static str,
        algorithm: Algorithm,
    },
    #[error("speculative settings with algorithm NONE")]
    AlgorithmNone,
    #[error("--hicache-storage-dir needs --enable-hierarchical-cache")]
    StorageNeedsHostTier,
    #[error("cannot use the storage directory {}: {source}", dir.display())]
    StorageDir {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// Checks `config` (and the draft model against the target) and derives the scheduler's
/// settings and the storage tier's files.
pub(crate) fn validate(
    config: &EngineConfig,
    model: &Model,
    draft: Option<&Draft>,
) -> Result<(SchedulerConfig, Option<KvFiles>), ConfigError> {
    if config.block_size == 0 {
        return Err(ConfigError::BlockSize);
    }
    if config.kv_blocks() < 2 {
        return Err(ConfigError::KvTooSmall {
            tokens: config.max_total_tokens,
            min: 2 * config.block_size,
        });
    }
    let sched = SchedulerConfig {
        max_running: config.max_running,
        prefill_budget: config.chunked_prefill_size,
        prefix_cache: config.prefix_cache,
        host_blocks: u32::try_from(config.host_cache_blocks)
            .map_err(|_| ConfigError::HostCacheTooLarge(config.host_cache_blocks))?,
        policy: config.schedule_policy,
    };
    sched.validate()?;
    if let Some(spec) = &config.speculative {
        speculative::NgramProposer::new(spec.ngram_min_window, spec.ngram_max_window)?;
        if spec.num_draft_tokens == 0 || spec.topk == 0 || spec.num_steps == 0 {
            return Err(ConfigError::NoDrafts);
        }
        match (spec.algorithm, draft) {
            (Algorithm::None, _) => return Err(ConfigError::AlgorithmNone),
            (Algorithm::Standalone, Some(Draft::Model(d))) => {
                speculative::check_vocabulary(&d.file, &model.file)?;
            }
            (Algorithm::Standalone, None) => return Err(ConfigError::NoDraftModel),
            (Algorithm::Eagle3, Some(Draft::Eagle3(_))) => {}
            (Algorithm::Eagle3, None) => return Err(ConfigError::NoHead),
            (Algorithm::Ngram, None) => {}
            (algorithm, Some(d)) => {
                let given = match d {
                    Draft::Model(_) => "a draft model",
                    Draft::Eagle3(_) => "an EAGLE-3 head",
                };
                return Err(ConfigError::WrongDraft { given, algorithm });
            }
        }
    }
    let files = match &config.hicache_storage_dir {
        None => None,
        Some(_) if config.host_cache_blocks == 0 || !config.prefix_cache => {
            return Err(ConfigError::StorageNeedsHostTier);
        }
        Some(dir) => {
            let bytes = model::Runner::block_bytes_for(model, config.block_size);
            // A block's bytes are the model's and the store's: another dtype is another file.
            let fingerprint = format!("{} kv {}", config.model_fingerprint, model.kv_cache_dtype);
            Some(KvFiles::open(dir, &fingerprint, bytes).map_err(|source| {
                ConfigError::StorageDir {
                    dir: dir.clone(),
                    source,
                }
            })?)
        }
    };
    Ok((sched, files))
}
