//! End-to-end tests of models by name: `specula model list`, `--model NAME` resolution (a fresh
//! or a prepared `SPECULA_HOME`), and unknown names. Nothing here downloads: pip is told to use
//! no index, so a resolution that wrongly tried to pull would fail instead.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::model_path;
use common::server::{Server, client};

const BIN: &str = env!("CARGO_BIN_EXE_specula");
const NAMES: [&str; 3] = ["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"];

/// `specula ARGS` with `home` as SPECULA_HOME and no package index.
fn specula(home: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("SPECULA_HOME", home)
        .env("PIP_NO_INDEX", "1")
        .output()
        .expect("run specula")
}

/// A sparse file of `size` bytes at `home/models/file`.
fn fake_model(home: &Path, file: &str, size: u64) -> std::path::PathBuf {
    std::fs::create_dir_all(home.join("models")).unwrap();
    let path = home.join("models").join(file);
    std::fs::File::create(&path).unwrap().set_len(size).unwrap();
    path
}

#[test]
fn list_names_every_model_and_a_fresh_home_has_none_cached() {
    let home = tempfile::tempdir().unwrap();
    let out = specula(home.path(), &["model", "list"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for name in NAMES {
        assert!(
            text.lines().any(|l| l.starts_with(name)),
            "{name} missing: {text}"
        );
    }
    assert_eq!(text.matches("not cached").count(), 3, "{text}");
    assert!(text.contains("MiB") && !text.contains("cached:"), "{text}");
    // Listing creates nothing.
    assert_eq!(std::fs::read_dir(home.path()).unwrap().count(), 0);
}

#[test]
fn list_shows_a_cached_file_with_its_path_without_hashing_it() {
    let home = tempfile::tempdir().unwrap();
    // Zeros of the right size count as cached: `list` checks sizes only.
    let gemma = fake_model(home.path(), "gemma-3-270m.Q4_K_M.gguf", 253_113_024);
    let qwen = fake_model(home.path(), "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf", 10);
    let out = specula(home.path(), &["model", "list"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("cached: {}", gemma.display())),
        "{text}"
    );
    assert!(
        text.contains(&format!("another size is at {}", qwen.display())),
        "{text}"
    );
    assert_eq!(text.matches("not cached").count(), 2, "{text}");
}

#[test]
fn an_unknown_model_name_is_one_line_and_non_zero() {
    let home = tempfile::tempdir().unwrap();
    for args in [
        &["generate", "--prompt", "x", "--model", "no-such-model"][..],
        &["model", "info", "--model", "no-such-model"],
        &["model", "bench", "--model", "no-such-model"],
        &["model", "pull", "no-such-model"],
        &["serve", "--port", "0", "--model", "no-such-model"],
        &["demo", "--model", "no-such-model"],
    ] {
        let out = specula(home.path(), args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("error: ")
                && err.contains("no-such-model")
                && NAMES.iter().all(|n| err.contains(n)),
            "{args:?}: {err}"
        );
    }
    assert_eq!(std::fs::read_dir(home.path()).unwrap().count(), 0);
}

#[test]
fn a_name_resolves_to_the_cached_file_without_pulling() {
    let home = tempfile::tempdir().unwrap();
    let fake = fake_model(home.path(), "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432);
    let out = specula(home.path(), &["model", "info", "--model", "smollm2-135m"]);
    // The zeros are no GGUF file: the error names the cached file, and nothing was pulled.
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&fake.display().to_string()) && !err.contains("pulling"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // A file of that name in the working folder is a file, not the registered model.
    let here = tempfile::tempdir().unwrap();
    std::fs::write(here.path().join("smollm2-135m"), b"junk").unwrap();
    let out = Command::new(BIN)
        .args(["model", "info", "--model", "smollm2-135m"])
        .current_dir(here.path())
        .env("SPECULA_HOME", home.path())
        .env("PIP_NO_INDEX", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && !err.contains(&fake.display().to_string()),
        "{err}"
    );
}

#[tokio::test]
async fn a_model_served_by_name_is_listed_under_that_name() {
    // The real default model, linked into a fresh cache; the name comes from the config file.
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("models")).unwrap();
    std::os::unix::fs::symlink(
        model_path(),
        home.path().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    )
    .unwrap();
    let config = home.path().join("specula.toml");
    std::fs::write(&config, "model-path = \"smollm2-135m\"\n").unwrap();
    let mut command = Server::command();
    command
        .arg("--config")
        .arg(&config)
        .env("SPECULA_HOME", home.path())
        .env("PIP_NO_INDEX", "1");
    let server = Server::spawn(command);
    let r = client().get(server.url("/v1/models")).send().await.unwrap();
    let models: Value = r.json().await.unwrap();
    assert_eq!(models["data"][0]["id"], "smollm2-135m", "{models}");
    let r = client()
        .get(server.url("/server_info"))
        .send()
        .await
        .unwrap();
    let info: Value = r.json().await.unwrap();
    let shown = info.to_string();
    assert!(shown.contains("SmolLM2-135M-Instruct.Q4_1.gguf"), "{shown}");
}
