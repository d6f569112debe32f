//! The chat templates against llama.cpp: for every conversation rendered by llama-server's
//! `/apply-template` (`scripts/tokenizer/make_chat_template_reference.py`), the same prompt, on
//! SmolLM2, Qwen2.5-Coder (its tools, calls and results too) and Gemma 3 (no template in the
//! file: ChatML, as llama-server falls back to). Qwen's and Gemma's tests are tier 2 (`#[ignore]`d;
//! scripts/test-heavy.sh pulls the models and runs them, docs/testing.md).

mod common;

use model::chat_template::{ChatOptions, ChatTemplate, TemplateCaps};
use model::gguf::GgufFile;
use model::tokenizer::Tokenizer;
use serde_json::Value as Json;

#[derive(serde::Deserialize)]
struct Case {
    name: String,
    request: Json,
    prompt: String,
}

fn template() -> (ChatTemplate, Tokenizer) {
    template_of(&common::model_path())
}

fn template_of(path: &std::path::Path) -> (ChatTemplate, Tokenizer) {
    let gguf = GgufFile::open(path).expect("open the model");
    let tok = Tokenizer::from_gguf(&gguf).expect("tokenizer");
    let tmpl = ChatTemplate::from_gguf(&gguf, &tok).expect("chat template");
    (tmpl, tok)
}

fn cases() -> Vec<Case> {
    cases_in("smollm2")
}

/// The renderings in `data/chat_template/STEM.jsonl`.
fn cases_in(stem: &str) -> Vec<Case> {
    let path = common::data_dir("chat_template").join(format!("{stem}.jsonl"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| serde_json::from_str(l).expect("reference line"))
        .collect()
}

#[test]
fn every_conversation_renders_as_llama_cpp_renders_it() {
    renders_as_llama_cpp(&template().0, &cases());
}

/// Model `name`'s template (its file as its tokenizer corpus's SOURCE names it) against its
/// renderings.
fn named_renders_as_llama_cpp(name: &str) {
    let dir = common::data_dir("tokenizer").join(name);
    let path = common::named_model_path(name, &common::source_model_file(&dir));
    let cases = cases_in(name);
    renders_as_llama_cpp(&template_of(&path).0, &cases);
}

#[test]
#[ignore = "tier 2 (scripts/test-heavy.sh): needs `specula model pull qwen2.5-coder-0.5b`"]
fn qwen_conversations_and_tool_calls_render_as_llama_cpp_renders_them() {
    named_renders_as_llama_cpp("qwen2.5-coder-0.5b");
}

#[test]
#[ignore = "tier 2 (scripts/test-heavy.sh): needs `specula model pull gemma3-270m`"]
fn gemma_conversations_render_as_llama_cpp_renders_them() {
    named_renders_as_llama_cpp("gemma3-270m");
}

fn renders_as_llama_cpp(tmpl: &ChatTemplate, cases: &[Case]) {
    assert!(
        cases.len() >= 10,
        "only {} reference renderings",
        cases.len()
    );
    let mut failures = Vec::new();
    for c in cases {
        let messages = c.request["messages"].as_array().expect("messages").clone();
        let opts = ChatOptions {
            add_generation_prompt: c.request["add_generation_prompt"].as_bool().unwrap_or(true),
            tools: c.request.get("tools").cloned(),
            ..ChatOptions::default()
        };
        match tmpl.render(&messages, &opts) {
            Ok(p) if p == c.prompt => {}
            Ok(p) => failures.push(format!(
                "{}:\n  llama.cpp {:?}\n  ours      {p:?}",
                c.name, c.prompt
            )),
            Err(e) => failures.push(format!("{}: {e}", c.name)),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn the_model_template_and_its_tokens() {
    let (tmpl, tok) = template();
    assert!(tmpl.source().contains("<|im_start|>"));
    let t = tmpl.special_tokens();
    // SmolLM2's BOS is <|im_start|> (id 1), its EOS <|im_end|> (id 2); it adds neither.
    assert_eq!(
        (t.bos_token.as_str(), t.eos_token.as_str()),
        ("<|im_start|>", "<|im_end|>")
    );
    assert!(!t.add_bos && !t.add_eos);
    assert_eq!(
        tmpl.caps(),
        &TemplateCaps {
            supports_string_content: true,
            supports_typed_content: false,
            supports_system_role: true,
            // Tools and calls it cannot show: the server describes them in text instead.
            supports_tools: false,
            supports_tool_calls: false,
            supports_tool_responses: true,
            requires_object_arguments: false,
        }
    );
    // The rendered prompt tokenizes with its control tokens as single ids.
    let prompt = tmpl
        .render(
            &[serde_json::json!({"role": "user", "content": "Hi"})],
            &ChatOptions::default(),
        )
        .unwrap();
    let ids = tok.encode(&prompt, true, true).unwrap();
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.iter().filter(|&&id| id == 1).count(), 3);
    assert_eq!(ids.iter().filter(|&&id| id == 2).count(), 2);
}
