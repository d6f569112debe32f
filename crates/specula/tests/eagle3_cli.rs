//! `--speculative-algorithm EAGLE3` end to end: a head in SGLang's layout (an untrained one,
//! written here for the default model) drafts chains and trees, and the greedy output is token
//! for token plain decoding's, one request at a time and eight joining mid-way; the built-in head
//! serves the default model with no path given; a head that does not fit the target, or none for
//! a model without a built-in one, is a one-line start-up error; sampled output has plain
//! decoding's distribution.

mod common;

use common::server::{Server, get_json, metric, post};
use common::stats::{same_distribution, sample_prefixes};
use serde_json::{Value, json};
use speculative::eagle3::{Eagle3Config, Eagle3Head, TargetShape, WeightDtype};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// SmolLM2-135M's shape.
const TARGET: TargetShape = TargetShape {
    n_layers: 30,
    hidden: 576,
    vocab: 49_152,
};

/// Writes an untrained head for the default model into `dir`: 4,096 draft tokens, the most
/// common ones first (ids below 4,096, where the tokenizer keeps its merges of common text).
fn write_head(dir: &Path) {
    let config = Eagle3Config::parse(
        r#"{"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
            "num_key_value_heads": 3, "vocab_size": 49152, "draft_vocab_size": 4096,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0}"#,
        TARGET,
    )
    .unwrap();
    let head = Eagle3Head::random(config, (0..4096).collect(), 7);
    head.save(dir, WeightDtype::F16).unwrap();
}

fn prompt(i: usize) -> String {
    [
        "Write a short poem about the sea.",
        "What is the capital of France? Answer in one sentence.",
        "List three fruits and say what colour each is.",
        "Explain what a binary search does.",
    ][i % 4]
        .to_string()
}

fn body(i: usize, max_tokens: usize) -> Value {
    json!({"messages": [{"role": "user", "content": prompt(i)}],
           "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true})
}

/// Eight greedy requests joining 40 ms apart, with different lengths; their texts in order.
async fn staggered(url: String) -> Vec<Value> {
    let mut tasks = Vec::new();
    for i in 0..8 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(40 * i as u64)).await;
            post(&url, body(i, 16 + 3 * i)).await.1["choices"][0]["message"]["content"].clone()
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test]
async fn the_built_in_head_serves_the_default_model_with_its_greedy_output() {
    let plain = Server::start(&[]);
    let (_, want) = post(&plain.url("/v1/chat/completions"), body(2, 40)).await;
    drop(plain);
    let spec = Server::start(&[
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-adaptive",
        "false",
    ]);
    let (_, got) = post(&spec.url("/v1/chat/completions"), body(2, 40)).await;
    assert_eq!(got["choices"][0]["message"], want["choices"][0]["message"]);
    assert!(metric(&spec, "spec_draft_tokens_total").await > 0.0);
}

#[tokio::test]
async fn an_eagle3_head_gives_the_same_greedy_output_in_chains_and_trees() {
    let dir = tempfile::tempdir().unwrap();
    write_head(dir.path());
    let head = dir.path().to_str().unwrap();
    let plain = Server::start(&[]);
    let chat = plain.url("/v1/chat/completions");
    let mut expected = Vec::new();
    for i in 0..2 {
        expected.push(post(&chat, body(i, 24)).await.1);
    }
    let together = staggered(chat).await;
    drop(plain);
    for extra in [
        &["--speculative-num-steps", "4"][..],
        &[
            "--speculative-eagle-topk",
            "2",
            "--speculative-num-steps",
            "3",
            "--speculative-num-draft-tokens",
            "6",
        ],
    ] {
        let mut args = vec![
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-adaptive",
            "false",
            "--speculative-draft-model-path",
            head,
        ];
        args.extend_from_slice(extra);
        let spec = Server::start(&args);
        let chat = spec.url("/v1/chat/completions");
        for (i, want) in expected.iter().enumerate() {
            let (_, got) = post(&chat, body(i, 24)).await;
            assert_eq!(
                got["choices"][0]["message"], want["choices"][0]["message"],
                "{extra:?}"
            );
            assert_eq!(got["usage"]["completion_tokens"], 24);
        }
        assert_eq!(staggered(chat).await, together, "{extra:?}");
        let drafted = metric(&spec, "spec_draft_tokens_total").await;
        assert!(drafted > 100.0, "{extra:?}: {drafted} drafts");
        assert_eq!(metric(&spec, "kv_blocks_used").await, 0.0);
    }
}

/// Greedy completions of four prompts, two of them running at once.
async fn completions(url: &str) -> Vec<Value> {
    let body = |i: usize| {
        let prompt = ["the sea", "one two three", "a b c d e", "eat nine hats"][i];
        json!({"prompt": prompt, "max_tokens": 20 + 4 * i, "temperature": 0, "ignore_eos": true})
    };
    let mut tasks = Vec::new();
    for i in 0..4 {
        let url = url.to_string();
        tasks.push(tokio::spawn(async move {
            post(&url, body(i)).await.1["choices"][0]["text"].clone()
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test]
async fn eagle3_serves_a_qwen3_target_with_its_greedy_output() {
    // An untrained head over the synthetic Qwen 3 model (random weights, two layers:
    // `scripts/reference/synthetic.sh`; Qwen 2 and Gemma 3 are in architectures_cli.rs on
    // their real files): the target captures its streams, the head drafts chains, and the
    // output is plain decoding's.
    let target = TargetShape {
        n_layers: 2,
        hidden: 64,
        vocab: 320,
    };
    let config = Eagle3Config::parse(
        r#"{"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 320, "draft_vocab_size": 320,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 0, 0]}}"#,
        target,
    )
    .unwrap();
    let head = tempfile::tempdir().unwrap();
    Eagle3Head::random(config, (0..320).collect(), 5)
        .save(head.path(), WeightDtype::F32)
        .unwrap();
    let model = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/data/reference/synthetic/qwen3.gguf");
    let start = |spec: bool| {
        let mut cmd = Server::command();
        cmd.arg("--model-path").arg(&model);
        if spec {
            cmd.args([
                "--speculative-algorithm",
                "EAGLE3",
                "--speculative-adaptive",
                "false",
            ]);
            cmd.arg("--speculative-draft-model-path").arg(head.path());
        }
        Server::spawn(cmd)
    };
    let plain = start(false);
    let want = completions(&plain.url("/v1/completions")).await;
    drop(plain);
    let spec = start(true);
    assert_eq!(completions(&spec.url("/v1/completions")).await, want);
    let drafted = metric(&spec, "spec_draft_tokens_total").await;
    assert!(drafted > 20.0, "{drafted} drafts");
    assert_eq!(metric(&spec, "kv_blocks_used").await, 0.0);
}

#[tokio::test]
async fn sampled_output_with_eagle3_chains_and_trees_has_the_same_distribution() {
    // The built-in head's trees (two candidates a node, verified as point masses) and chains
    // (drafts drawn from the head's own distribution, verified by speculative sampling): the
    // first three tokens at temperature 1, 2,080 samples from each server, the same
    // distribution as plain sampling's by a χ² test.
    let body = json!({"prompt": "The three most useful things to know about the sea are",
                      "max_tokens": 4, "n": 16, "temperature": 1.0, "ignore_eos": true,
                      "logprobs": 0});
    let plain = Server::start(&[]);
    let a = sample_prefixes(&plain.url("/v1/completions"), &body, 13, 3).await;
    drop(plain);
    // The head's chains combined with suffix decoding too: the prompt, asked again and again,
    // is soon in the cache of finished requests, so both drafters draft.
    for (algorithm, topk, steps) in [
        ("EAGLE3", "2", "2"),
        ("EAGLE3", "1", "4"),
        ("EAGLE3,SUFFIX", "1", "4"),
    ] {
        let spec = Server::start(&[
            "--speculative-algorithm",
            algorithm,
            "--speculative-adaptive",
            "false",
            "--speculative-eagle-topk",
            topk,
            "--speculative-num-steps",
            steps,
            "--speculative-num-draft-tokens",
            "4",
        ]);
        let b = sample_prefixes(&spec.url("/v1/completions"), &body, 13, 3).await;
        let accepted = metric(&spec, "spec_accepted_tokens_total").await;
        assert!(
            accepted > 100.0,
            "{algorithm} topk {topk}: {accepted} accepted"
        );
        assert!(accepted < metric(&spec, "spec_draft_tokens_total").await);
        if algorithm.contains(',') {
            let chosen = drafter_verifications(&spec).await;
            assert!(chosen.iter().all(|&(_, n)| n > 10), "{chosen:?}");
        }
        same_distribution(&a, &b);
    }
}

/// Each drafter's verifications (`/server_info`'s `speculative.drafters`), in the order given.
async fn drafter_verifications(server: &Server) -> Vec<(String, u64)> {
    let info = get_json(server, "/server_info").await;
    let drafters = info["speculative"]["drafters"].as_object().cloned();
    drafters
        .unwrap_or_default()
        .into_iter()
        .map(|(name, d)| (name, d["verifications"].as_u64().unwrap_or(0)))
        .collect()
}

#[tokio::test]
async fn the_head_and_suffix_decoding_combined_keep_the_greedy_output_and_both_draft() {
    // EAGLE3,SUFFIX under the fixed policy, so every step drafts: fresh text takes the head's
    // drafts, an answer asked for again the cache's, and the output is plain decoding's.
    let story = json!({"messages": [{"role": "user",
                        "content": "Write a short story about a robot who learns to paint."}],
                       "max_tokens": 48, "temperature": 0, "ignore_eos": true});
    let plain = Server::start(&[]);
    let chat = plain.url("/v1/chat/completions");
    let (_, want) = post(&chat, story.clone()).await;
    let together = staggered(chat).await;
    drop(plain);
    let spec = Server::start(&[
        "--speculative-algorithm",
        "EAGLE3,SUFFIX",
        "--speculative-adaptive",
        "false",
    ]);
    let chat = spec.url("/v1/chat/completions");
    let (_, first) = post(&chat, story.clone()).await;
    assert_eq!(
        first["choices"][0]["message"],
        want["choices"][0]["message"]
    );
    let head_only = drafter_verifications(&spec).await;
    let (_, again) = post(&chat, story).await;
    assert_eq!(
        again["choices"][0]["message"],
        want["choices"][0]["message"]
    );
    let per_pass = again["usage"]["spec_accept_length"].as_f64().unwrap_or(1.0);
    assert!(
        per_pass > 3.0,
        "the repeat is drafted from the cache: {again}"
    );
    assert_eq!(staggered(chat).await, together);
    let both = drafter_verifications(&spec).await;
    let names: Vec<&str> = both.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["eagle3", "suffix"]);
    assert!(
        head_only[0].1 > 5,
        "the head drafts fresh text: {head_only:?}"
    );
    assert!(
        both[1].1 > head_only[1].1 + 5,
        "the cache drafts the repeat: {both:?}"
    );
    assert_eq!(metric(&spec, "kv_blocks_used").await, 0.0);
}

/// Runs `specula serve` with `args` until it exits; its stderr.
fn refused(args: &[&str]) -> String {
    let mut cmd = Server::command();
    cmd.arg("--model-path").arg(common::model_path());
    cmd.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
    let out = cmd.output().unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn a_head_that_does_not_fit_or_is_missing_is_a_start_up_error() {
    let dir = tempfile::tempdir().unwrap();
    let wrong = TargetShape {
        hidden: 64,
        ..TARGET
    };
    let config = Eagle3Config::parse(
        r#"{"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
            "vocab_size": 49152, "draft_vocab_size": 32}"#,
        wrong,
    )
    .unwrap();
    Eagle3Head::random(config, (0..32).collect(), 1)
        .save(dir.path(), WeightDtype::F32)
        .unwrap();
    let head = dir.path().to_str().unwrap();
    let err = refused(&[
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-adaptive",
        "false",
        "--speculative-draft-model-path",
        head,
    ]);
    assert!(err.contains("does not fit the target"), "{err}");
    // Another model has no built-in head.
    let other = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/data/reference/synthetic/llama3.gguf");
    let mut cmd = Server::command();
    cmd.arg("--model-path").arg(&other);
    cmd.args([
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-adaptive",
        "false",
    ]);
    let out = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no EAGLE-3 head ships for this model"),
        "{err}"
    );
}
