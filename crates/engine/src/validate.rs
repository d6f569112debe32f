//! The engine's settings checked once, where they are used, with errors that name the flag.

use crate::kv_files::KvFiles;
use crate::{Draft, EngineConfig};
use model::Model;
use scheduler::SchedulerConfig;
use speculative::SpecError;
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
    Speculation(#[from] SpecError),
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
        spec.check_draft(model, draft)?;
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
