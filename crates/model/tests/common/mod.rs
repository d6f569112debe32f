//! Helpers shared by the model crate's integration tests: where the real model and test data are.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The file name of the SmolLM2 model in specula's model cache.
pub const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The SmolLM2-135M-Instruct Q4_1 GGUF: `SPECULA_MODEL` if set, else
/// `${SPECULA_HOME:-$HOME/.cache/specula}/models/SmolLM2-135M-Instruct.Q4_1.gguf`. Panics with
/// the way to get it when the file is not there.
pub fn model_path() -> PathBuf {
    let path = match std::env::var_os("SPECULA_MODEL") {
        Some(p) => PathBuf::from(p),
        None => {
            let home = std::env::var_os("SPECULA_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/specula")))
                .unwrap_or_else(|| {
                    panic!("neither SPECULA_MODEL, SPECULA_HOME nor HOME is set; run scripts/fetch-model.sh")
                });
            home.join("models").join(MODEL_FILE)
        }
    };
    assert!(
        path.is_file(),
        "model file {} not found: run scripts/fetch-model.sh (or set SPECULA_MODEL)",
        path.display()
    );
    path
}

/// `crates/model/tests/data/<sub>`.
pub fn data_dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(sub)
}
