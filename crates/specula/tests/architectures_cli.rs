//! The other architectures through the whole server, on the real files (`specula model pull`
//! puts them in the cache; scripts/test.sh does before the tests): Qwen2.5-Coder (qwen2) and
//! Gemma 3 (gemma3, its sliding window of 512 crossed by the prompts here). Speculation (n-gram
//! chains and trees) gives exactly the text of plain greedy decoding, concurrent requests too, and
//! a prefix served from the cache gives the text its recomputation gives.

mod common;

use common::server::{Server, client, post};
use serde_json::{Value, json};

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

async fn speculation_is_lossless_and_the_cache_exact(name: &str) {
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
    for flags in [
        &["--speculative-algorithm", "NGRAM"][..],
        &[
            "--speculative-algorithm",
            "NGRAM",
            "--speculative-eagle-topk",
            "2",
        ][..],
    ] {
        let spec = serve(name, flags);
        let got = three_completions(&spec, &prompts).await;
        assert_eq!(got, want, "{name} with {flags:?}");
    }
}

#[tokio::test]
async fn qwen2_5_coder_serves_exactly() {
    speculation_is_lossless_and_the_cache_exact("qwen2.5-coder-0.5b").await;
}

#[tokio::test]
async fn gemma3_serves_exactly() {
    speculation_is_lossless_and_the_cache_exact("gemma3-270m").await;
}
