//! Helpers shared by the binary's end-to-end tests.
#![allow(dead_code)]

pub mod server;
pub mod stats;

use std::path::PathBuf;

/// The default model, as scripts/fetch-model.sh caches it (or `SPECULA_MODEL`).
pub fn model_path() -> PathBuf {
    let path = std::env::var_os("SPECULA_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("SPECULA_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/specula")
                });
            home.join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        path.is_file(),
        "{} missing: run scripts/fetch-model.sh",
        path.display()
    );
    path
}
