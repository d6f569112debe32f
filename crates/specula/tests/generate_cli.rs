//! End-to-end tests of `specula generate` and `specula model` with the real default model.

use std::process::{Command, Output};

mod common;
use common::model_path;

const BIN: &str = env!("CARGO_BIN_EXE_specula");

fn generate(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("generate")
        .arg("--model")
        .arg(model_path())
        .args(args)
        .output()
        .expect("run specula generate")
}

#[test]
fn chat_generation_answers_and_reports_speed() {
    let out = generate(&[
        "--chat",
        "--prompt",
        "Name the capital city of France.",
        "--max-tokens",
        "24",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Paris"), "{text}");
    let last = text.lines().last().unwrap();
    let re = regex::Regex::new(
        r"^prompt: \d+ tokens, [\d.]+ tok/s \| generated: \d+ tokens, [\d.]+ tok/s$",
    )
    .unwrap();
    assert!(re.is_match(last), "{last}");
}

#[test]
fn greedy_output_is_deterministic_and_seeds_reproduce_sampling() {
    let run = |args: &[&str]| {
        String::from_utf8_lossy(&generate(args).stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_string()
    };
    let greedy = ["--prompt", "Once upon a time", "--max-tokens", "16"];
    assert_eq!(run(&greedy), run(&greedy));
    let sampled = [
        "--prompt",
        "Once upon a time",
        "--max-tokens",
        "16",
        "--temperature",
        "0.9",
        "--seed",
        "5",
    ];
    assert_eq!(run(&sampled), run(&sampled));
}

#[test]
fn bad_input_is_one_line_and_non_zero() {
    for args in [
        &["--prompt", "x", "--top-p", "0"][..],
        &["--prompt", "x", "--max-tokens", "0"],
        &["--prompt", "", "--max-tokens", "3"],
    ] {
        let out = generate(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
    let missing = Command::new(BIN)
        .args([
            "generate",
            "--prompt",
            "x",
            "--model",
            "/nonexistent/m.gguf",
        ])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/m.gguf"));
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let corrupt = Command::new(BIN)
        .args(["generate", "--prompt", "x", "--model"])
        .arg(&junk)
        .output()
        .unwrap();
    assert_eq!(corrupt.status.code(), Some(1));
    let err = String::from_utf8_lossy(&corrupt.stderr);
    assert!(
        err.starts_with("error: cannot load") && err.trim().lines().count() == 1,
        "{err}"
    );
}

#[test]
fn model_info_describes_the_file() {
    let out = Command::new(BIN)
        .args(["model", "info", "--model"])
        .arg(model_path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("architecture: llama, 30 layers") && text.contains("Q4_1"),
        "{text}"
    );
}
