//! The prefix cache's host and storage tiers as data: the host tier's bytes (blocks as the
//! runner saves them, in its KV store's dtype) and the storage tier's files, and the copies
//! between them and the device KV that planning asks for.

use crate::kv_files::KvFiles;
use crate::target::Target;
use kvcache::{BlockId, KvCopy, ToPersist};
use model::ModelError;
use std::io;

/// The host tier's KV and the storage tier's files.
pub(crate) struct Tiers {
    /// `Runner::block_bytes` bytes per host slot (pages are touched only as blocks are demoted
    /// into them).
    host_kv: Vec<u8>,
    files: Option<KvFiles>,
}

/// Why a copy between tiers failed.
#[derive(Debug, thiserror::Error)]
enum TierError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("cannot write a stored block: {0}")]
    Write(io::Error),
    #[error(transparent)]
    Io(io::Error),
    #[error("no storage tier")]
    NoStorage,
}

impl Tiers {
    pub(crate) fn new(host_bytes: usize, files: Option<KvFiles>) -> Self {
        Self {
            host_kv: vec![0; host_bytes],
            files,
        }
    }

    /// Whether there is a storage tier.
    /// The storage tier's files, if there is one.
    pub(crate) fn files(&self) -> Option<&KvFiles> {
        self.files.as_ref()
    }

    pub(crate) fn has_storage(&self) -> bool {
        self.files.is_some()
    }

    /// Makes the plan's copies between the prefix cache's tiers and `target`'s device KV, in
    /// order, before the forward pass can overwrite a demoted block. Returns the device blocks
    /// that could not be read back from storage.
    pub(crate) fn copy_all(&mut self, target: &mut dyn Target, copies: &[KvCopy]) -> Vec<u32> {
        let mut unreadable = Vec::new();
        for copy in copies {
            let done = self.copy(target, copy);
            if let Err(e) = done {
                tracing::error!("KV copy between cache tiers failed: {e}");
                if let KvCopy::StorageToDevice { device, .. } = copy {
                    unreadable.push(device.0);
                }
            }
        }
        unreadable
    }

    fn copy(&mut self, target: &mut dyn Target, copy: &KvCopy) -> Result<(), TierError> {
        let bytes = target.block_bytes();
        let slot = |h: BlockId| h.index() * bytes..(h.index() + 1) * bytes;
        let tiers = self;
        match copy {
            KvCopy::ToHost { device, host } => {
                target.save_block(device.0, &mut tiers.host_kv[slot(*host)])?;
            }
            KvCopy::ToDevice { host, device } => {
                target.load_block(device.0, &tiers.host_kv[slot(*host)])?;
            }
            KvCopy::HostToStorage { host, key, tokens } => {
                if let Some(f) = &tiers.files {
                    f.write(*key, tokens, &tiers.host_kv[slot(*host)])
                        .map_err(TierError::Write)?;
                }
            }
            KvCopy::StorageToDevice {
                key,
                device,
                tokens,
            } => {
                let mut data = vec![0; bytes];
                let files = tiers.files.as_ref().ok_or(TierError::NoStorage)?;
                files
                    .read(*key, Some(tokens), &mut data)
                    .map_err(TierError::Io)?;
                target.load_block(device.0, &data)?;
            }
        }
        Ok(())
    }

    /// Writes `blocks` (every cached block the storage tier lacks: a shutdown) from `target`'s
    /// device KV or the host tier to storage; returns how many were written.
    pub(crate) fn persist(&self, target: &dyn Target, blocks: Vec<ToPersist>) -> usize {
        let Some(files) = &self.files else {
            return 0;
        };
        let bytes = target.block_bytes();
        let mut data = vec![0; bytes];
        let mut written = 0;
        for block in blocks {
            let read: Result<(), TierError> = match block.from {
                Ok(device) => target
                    .save_block(device.0, &mut data)
                    .map_err(TierError::from),
                Err(host) => {
                    let at = host.index() * bytes;
                    data.copy_from_slice(&self.host_kv[at..at + bytes]);
                    Ok(())
                }
            };
            let stored = read.and_then(|()| {
                files
                    .write(block.key, &block.tokens, &data)
                    .map_err(TierError::Io)
            });
            match stored {
                Ok(()) => written += 1,
                Err(e) => tracing::error!("cannot store a cached block: {e}"),
            }
        }
        tracing::info!(written, "prefix cache written to the storage tier");
        written
    }
}
