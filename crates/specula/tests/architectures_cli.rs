//! The other architectures through the whole server, on the real files (`specula model pull`
//! puts them in the cache; scripts/test-heavy.sh does before it runs these, tier 2 of the tests:
//! they are ignored by the default run, docs/testing.md): Qwen2.5-Coder (qwen2) and
//! Gemma 3 (gemma3, its sliding window of 512 crossed by the prompts here). Speculation (n-gram
//! chains and trees, and an untrained EAGLE-3 head's chains) gives exactly the text of plain
//! greedy decoding, concurrent requests too, and a prefix served from the cache gives the text
//! its recomputation gives.

mod common;

use common::server::{Server, client, metric, post};
use serde_json::{Value, json};
use speculative::eagle3::{Eagle3Config, Eagle3Head, TargetShape, WeightDtype};
use std::path::Path;

/// Writes an untrained EAGLE-3 head for a target of `shape` into `dir` (heads of 64
/// dimensions, 2,048 draft tokens: the lowest ids).
fn write_head(dir: &Path, shape: TargetShape) {
    let config = Eagle3Config::parse(
        &format!(
            r#"{{"hidden_size": {h}, "intermediate_size": {f}, "num_attention_heads": {n},
                "num_key_value_heads": 2, "head_dim": 64, "vocab_size": {v},
                "draft_vocab_size": 2048}}"#,
            h = shape.hidden,
            f = 2 * shape.hidden,
            n = shape.hidden / 64,
            v = shape.vocab,
        ),
        shape,
    )
    .unwrap();
    Eagle3Head::random(config, (0..2048).collect(), 3)
        .save(dir, WeightDtype::F16)
        .unwrap();
}

/// Three greedy completions at once (`ignore_eos`, 40 tokens): their texts, in order.
async fn three_completions(s: &Server, prompts: &[String; 3]) -> Vec<String> {
    let url = s.url("/v1/completions");
    let tasks: Vec<_> = prompts
        .iter()
        .map(|p| {
            let (url, body) = (
                url.clone(),
                json!({"prompt": p, "max_tokens": 40, "temperature": 0, "ignore_eos": true}),
            );
            tokio::spawn(async move {
                let r: Value = client()
                    .post(&url)
                    .json(&body)
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                r["choices"][0]["text"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{r}"))
                    .to_string()
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Prompts that repeat themselves (prompt lookup finds drafts in them), one of them longer than
/// Gemma's window (about 700 tokens).
fn prompts() -> [String; 3] {
    let list: Vec<String> = (1..=120)
        .map(|i| format!("item {i}: value {}", i * 7))
        .collect();
    [
        format!("{}\nRepeat the list:\n", list.join("\n")),
        "def add(a, b):\n    return a + b\n\ndef add(a, b):\n".to_string(),
        "The cat sat on the mat. The cat sat on the mat. The cat".to_string(),
    ]
}

fn serve(name: &str, extra: &[&str]) -> Server {
    let mut command = Server::command();
    command.args(["--model", name]).args(extra);
    Server::spawn(command)
}

async fn speculation_is_lossless_and_the_cache_exact(name: &str, shape: TargetShape) {
    let prompts = prompts();
    let plain = serve(name, &[]);
    let want = three_completions(&plain, &prompts).await;
    assert!(want.iter().all(|t| !t.is_empty()), "{want:?}");
    // The same requests again: the prompts now come from the prefix cache.
    let (status, body) = post(
        &plain.url("/v1/completions"),
        json!({"prompt": prompts[0], "max_tokens": 40, "temperature": 0, "ignore_eos": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 512,
        "{body}"
    );
    assert_eq!(
        body["choices"][0]["text"],
        want[0].as_str(),
        "{name}: cached prefix"
    );
    drop(plain);
    let head = tempfile::tempdir().unwrap();
    write_head(head.path(), shape);
    let head = head.path().to_str().unwrap();
    for flags in [
        &[
            "--speculative-algorithm",
            "NGRAM",
            "--speculative-adaptive",
            "false",
        ][..],
        &[
            "--speculative-algorithm",
            "NGRAM",
            "--speculative-adaptive",
            "false",
            "--speculative-eagle-topk",
            "2",
        ][..],
        &[
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-adaptive",
            "false",
            "--speculative-draft-model-path",
            head,
        ][..],
    ] {
        let spec = serve(name, flags);
        let got = three_completions(&spec, &prompts).await;
        assert_eq!(got, want, "{name} with {flags:?}");
        let drafted = metric(&spec, "spec_draft_tokens_total").await;
        assert!(drafted > 0.0, "{name} with {flags:?}: no drafts");
    }
}

#[tokio::test]
#[ignore = "tier 2 (scripts/test-heavy.sh): needs `specula model pull qwen2.5-coder-0.5b`"]
async fn qwen2_5_coder_serves_exactly() {
    let shape = TargetShape {
        n_layers: 24,
        hidden: 896,
        vocab: 151_936,
    };
    speculation_is_lossless_and_the_cache_exact("qwen2.5-coder-0.5b", shape).await;
}

#[tokio::test]
#[ignore = "tier 2 (scripts/test-heavy.sh): needs `specula model pull gemma3-270m`"]
async fn gemma3_serves_exactly() {
    let shape = TargetShape {
        n_layers: 18,
        hidden: 640,
        vocab: 262_144,
    };
    speculation_is_lossless_and_the_cache_exact("gemma3-270m", shape).await;
}
