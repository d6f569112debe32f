//! `specula train-draft` end to end on a tiny set: the target answers a dozen prompts, its
//! streams are captured, the trainer (in its own environment) lowers the loss over a few epochs,
//! and the head it writes loads as the server loads one; a rerun resumes from the checkpoint; a
//! run can start from a head; bad settings are one-line errors. The training run is tier 2
//! (`#[ignore]`d: it makes the trainer's environment; scripts/test-heavy.sh runs it,
//! docs/testing.md).

mod common;

use speculative::eagle3::{Eagle3Head, TargetShape};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_specula");

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sharegpt_small.json")
}

fn train(output: &Path, epochs: &str) -> std::process::Output {
    train_with(output, epochs, &[])
}

fn train_with(output: &Path, epochs: &str, extra: &[&OsStr]) -> std::process::Output {
    Command::new(BIN)
        .args(["train-draft", "--model"])
        .arg(common::model_path())
        .arg("--output")
        .arg(output)
        .arg("--dataset")
        .arg(fixture())
        .args([
            "--num-prompts",
            "10",
            "--held-out",
            "2",
            "--max-new-tokens",
            "32",
            "--draft-vocab-size",
            "1024",
            "--batch-tokens",
            "512",
            "--ttt-length",
            "3",
            "--num-epochs",
            epochs,
        ])
        .args(extra)
        .output()
        .unwrap()
}

fn train_losses(work: &Path) -> Vec<f64> {
    let metrics: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(work.join("metrics.json")).unwrap()).unwrap();
    metrics
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["train_loss"].as_f64().unwrap())
        .collect()
}

const TARGET: TargetShape = TargetShape {
    n_layers: 30,
    hidden: 576,
    vocab: 49_152,
};

#[test]
#[ignore = "tier 2 (scripts/test-heavy.sh): makes the trainer's JAX environment and trains"]
fn a_tiny_training_run_lowers_the_loss_and_writes_a_head_that_loads() {
    let dir = tempfile::tempdir().unwrap();
    let out = train(dir.path(), "4");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let losses = train_losses(dir.path());
    assert_eq!(losses.len(), 4, "{losses:?}");
    assert!(losses[3] < losses[0], "the loss did not fall: {losses:?}");
    assert!(dir.path().join("training.svg").is_file());
    let lines = std::fs::read_to_string(dir.path().join("held_out.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 2);
    let head = Eagle3Head::load(&dir.path().join("head"), TARGET).unwrap();
    assert_eq!(head.config.draft_vocab, 1024);
    assert_eq!(head.config.capture_layers, [2, 15, 27]);
    // A rerun resumes from the checkpoint instead of training again.
    let again = train(dir.path(), "4");
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    assert!(stderr.contains("resuming from"), "{stderr}");
    assert!(stderr.contains("epoch 4:"), "{stderr}");
    // A run that starts from that head begins where it ended: its first epoch's loss is below
    // the first run's, and it keeps the head's draft vocabulary.
    let warm = tempfile::tempdir().unwrap();
    let init = dir.path().join("head");
    let out = train_with(
        warm.path(),
        "1",
        &[OsStr::new("--init-head"), init.as_os_str()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("starting from the head"), "{stderr}");
    let warm_losses = train_losses(warm.path());
    assert!(warm_losses[0] < losses[0], "{warm_losses:?} {losses:?}");
    let again = Eagle3Head::load(&warm.path().join("head"), TARGET).unwrap();
    assert_eq!(again.draft_to_target, head.draft_to_target);
}

#[test]
fn a_head_to_start_from_is_checked_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let shipped =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../heads/smollm2-135m-instruct");
    for (head, says) in [
        (dir.path().join("no-such-head"), "is not a head folder"),
        // The tiny run asks for 1,024 draft tokens; the shipped head drafts 8,192.
        (
            shipped,
            "--draft-vocab-size 1024 differs from --init-head's 8192",
        ),
    ] {
        let out = train_with(
            &dir.path().join("work"),
            "1",
            &[OsStr::new("--init-head"), head.as_os_str()],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains(says), "{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(!dir.path().join("work/sequences.jsonl").exists());
    }
}

#[test]
fn bad_settings_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    for (flag, value, says) in [
        ("--num-prompts", "0", "--num-prompts must be at least 1"),
        ("--ttt-length", "0", "--ttt-length must be at least 1"),
        ("--learning-rate", "0", "--learning-rate must be positive"),
        ("--num-prompts", "100", "has 12 prompts"),
    ] {
        let out = Command::new(BIN)
            .args(["train-draft", "--model"])
            .arg(common::model_path())
            .arg("--output")
            .arg(dir.path())
            .arg("--dataset")
            .arg(fixture())
            .args([flag, value])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains(says), "{flag} {value}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
}

#[test]
fn dataset_answers_need_a_file_with_answers() {
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("prompts.jsonl");
    std::fs::write(&prompts, "{\"prompt\": \"a\"}\n{\"prompt\": \"b\"}\n").unwrap();
    let out = Command::new(BIN)
        .args(["train-draft", "--model"])
        .arg(common::model_path())
        .arg("--output")
        .arg(dir.path().join("work"))
        .arg("--dataset")
        .arg(&prompts)
        .args(["--answers", "dataset", "--num-prompts", "2"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("has no answers to learn from"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}
