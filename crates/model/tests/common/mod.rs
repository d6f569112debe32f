//! Helpers shared by the model crate's integration tests: where the real model and test data are.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The file name of the SmolLM2 model in specula's model cache.
pub const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// `${SPECULA_HOME:-$HOME/.cache/specula}`, or a panic that says `hint`.
fn specula_home(hint: &str) -> PathBuf {
    std::env::var_os("SPECULA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/specula")))
        .unwrap_or_else(|| panic!("neither SPECULA_HOME nor HOME is set; {hint}"))
}

/// The SmolLM2-135M-Instruct Q4_1 GGUF: `SPECULA_MODEL` if set, else
/// `${SPECULA_HOME:-$HOME/.cache/specula}/models/SmolLM2-135M-Instruct.Q4_1.gguf`. Panics with
/// the way to get it when the file is not there.
pub fn model_path() -> PathBuf {
    let path = match std::env::var_os("SPECULA_MODEL") {
        Some(p) => PathBuf::from(p),
        None => specula_home("set SPECULA_MODEL or run scripts/fetch-model.sh")
            .join("models")
            .join(MODEL_FILE),
    };
    assert!(
        path.is_file(),
        "model file {} not found: run scripts/fetch-model.sh (or set SPECULA_MODEL)",
        path.display()
    );
    path
}

/// The default model in `format` (a llama-quantize preset name such as `Q4_K_M`), as
/// scripts/requantize.sh makes it: `${SPECULA_HOME:-$HOME/.cache/specula}/models/
/// SmolLM2-135M-Instruct.FORMAT.gguf`. `Q4_1` is the shipped file ([`model_path`]). Panics with
/// "run scripts/requantize.sh FORMAT" when the file is not there.
pub fn requantized_model_path(format: &str) -> PathBuf {
    if format == "Q4_1" {
        return model_path();
    }
    let hint = format!("run scripts/requantize.sh {format}");
    let path = specula_home(&hint)
        .join("models")
        .join(format!("SmolLM2-135M-Instruct.{format}.gguf"));
    assert!(
        path.is_file(),
        "model file {} not found: {hint}",
        path.display()
    );
    path
}

/// Model `name`'s file (`file`, as its fixtures record it) in specula's model cache, where
/// `specula model pull NAME` puts it. Panics with that command when the file is not there.
pub fn named_model_path(name: &str, file: &str) -> PathBuf {
    let hint = format!("run `specula model pull {name}`");
    let path = specula_home(&hint).join("models").join(file);
    assert!(
        path.is_file(),
        "model file {} not found: {hint}",
        path.display()
    );
    path
}

/// The file named on the `model:` line of a fixture folder's SOURCE file.
pub fn source_model_file(dir: &Path) -> String {
    let source = std::fs::read_to_string(dir.join("SOURCE"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    source
        .lines()
        .find_map(|l| l.strip_prefix("model: "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("{}/SOURCE has no `model:` line", dir.display()))
        .to_string()
}

/// The SHA-256 of a file, as lowercase hex.
pub fn sha256_hex(path: &Path) -> String {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `crates/model/tests/data/<sub>`.
pub fn data_dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(sub)
}
