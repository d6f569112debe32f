//! `--activations int16|int8` end to end with the real default model: `generate` runs greedy in
//! int8, an unknown mode is refused in one line naming the modes, and `serve` reports int8 in
//! `/server_info`, runs both its model and its draft model in it, and computes other numbers
//! than an int16 one.

use serde_json::json;
use std::process::{Command, Output};

mod common;
use common::model_path;
use common::server::{Server, get_json, metric, post};

const BIN: &str = env!("CARGO_BIN_EXE_specula");
const PROMPT: &str = "The three primary colors are";
const TOKENS: usize = 64;

/// `specula generate` on the default model, greedy, `TOKENS` tokens past any end of generation.
fn generate(activations: &str) -> Output {
    Command::new(BIN)
        .args(["generate", "--prompt", PROMPT, "--temperature", "0"])
        .args([
            "--max-tokens",
            &TOKENS.to_string(),
            "--ignore-eos",
            "--show-ids",
        ])
        .args(["--activations", activations, "--model"])
        .arg(model_path())
        .output()
        .expect("run specula generate")
}

/// The generated text (what comes before the speed line) and the generated ids.
fn text_and_ids(out: &Output) -> (String, Vec<u32>) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let text = stdout[..stdout.rfind("\nprompt: ").expect("a speed line")].to_owned();
    let ids = stdout
        .lines()
        .find_map(|l| l.strip_prefix("ids: "))
        .expect("an ids line")
        .split_whitespace()
        .map(|id| id.parse().unwrap())
        .collect();
    (text, ids)
}

#[test]
fn generate_with_int8_activations_gives_greedy_output() {
    let (text, ids) = text_and_ids(&generate("int8"));
    assert_eq!(ids.len(), TOKENS);
    assert!(!text.trim().is_empty());
    // Greedy is deterministic in int8 as in int16 (whether the two agree is not asserted).
    assert_eq!(text_and_ids(&generate("int8")).1, ids);
}

#[test]
fn an_unknown_mode_is_refused_in_one_line_naming_the_modes() {
    for command in [
        &["generate", "--prompt", "x"][..],
        &["model", "bench"],
        &["serve", "--port", "0"],
        &["demo"],
    ] {
        let out = Command::new(BIN)
            .args(command)
            .args(["--activations", "fp8"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{command:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "{command:?}: {stderr}");
        let e = errors[0];
        assert!(
            e.contains("--activations") && e.contains("int16") && e.contains("int8"),
            "{command:?}: {e}"
        );
    }
}

#[tokio::test]
async fn serve_with_int8_reports_it_and_runs_the_model_and_its_draft_in_it() {
    let (generated, _) = text_and_ids(&generate("int8"));
    let model = model_path();
    // The model as its own draft: every greedy draft is accepted only if the draft computes
    // what the target does, i.e. both run in int8 (an int16 draft has drafts rejected here).
    let s = Server::start(&[
        "--activations",
        "int8",
        "--speculative-algorithm",
        "STANDALONE",
        "--speculative-adaptive",
        "false",
        "--speculative-draft-model-path",
        model.to_str().unwrap(),
        "--speculative-num-steps",
        "3",
    ]);
    let info = get_json(&s, "/server_info").await;
    assert_eq!(info["config"]["activations"], "int8", "{info}");
    let (status, c) = post(
        &s.url("/v1/completions"),
        json!({"prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": true}),
    )
    .await;
    assert_eq!(status, 200, "{c}");
    // The target runs in int8: the server's greedy text is `generate --activations int8`'s
    // (an int16 target's departs from it within these tokens).
    assert_eq!(c["choices"][0]["text"].as_str().unwrap(), generated);
    let drafted = metric(&s, "spec_draft_tokens_total").await;
    assert!(drafted > 0.0, "{drafted}");
    assert_eq!(metric(&s, "spec_accepted_tokens_total").await, drafted);
    let int8 = logprobs(&s).await;
    drop(s);
    // And the mode changes the numbers: an int16 server's log-probabilities are not int8's.
    let s = Server::start(&["--activations", "int16"]);
    let info = get_json(&s, "/server_info").await;
    assert_eq!(info["config"]["activations"], "int16", "{info}");
    assert_ne!(logprobs(&s).await, int8);
}

/// The log-probabilities of a short greedy completion.
async fn logprobs(s: &Server) -> serde_json::Value {
    let (status, c) = post(
        &s.url("/v1/completions"),
        json!({"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 1}),
    )
    .await;
    assert_eq!(status, 200, "{c}");
    c["choices"][0]["logprobs"]["token_logprobs"].clone()
}
