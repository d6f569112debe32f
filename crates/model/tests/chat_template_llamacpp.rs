//! The SmolLM2 chat template against llama.cpp: for every conversation rendered by llama-server's
//! `/apply-template` (`scripts/tokenizer/make_chat_template_reference.py`), the same prompt.

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
    let gguf = GgufFile::open(&common::model_path()).expect("open the model");
    let tok = Tokenizer::from_gguf(&gguf).expect("tokenizer");
    let tmpl = ChatTemplate::from_gguf(&gguf, &tok).expect("chat template");
    (tmpl, tok)
}

fn cases() -> Vec<Case> {
    let path = common::data_dir("chat_template").join("smollm2.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| serde_json::from_str(l).expect("reference line"))
        .collect()
}

#[test]
fn every_conversation_renders_as_llama_cpp_renders_it() {
    let (tmpl, _) = template();
    let cases = cases();
    assert!(
        cases.len() >= 10,
        "only {} reference renderings",
        cases.len()
    );
    let mut failures = Vec::new();
    for c in &cases {
        let messages = c.request["messages"].as_array().expect("messages").clone();
        let opts = ChatOptions {
            add_generation_prompt: c.request["add_generation_prompt"].as_bool().unwrap_or(true),
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
