//! The built-in `synthetic` dataset: realistic chat prompts of varied kinds and lengths.

use super::Prompt;
use serde::Deserialize;

const PROMPTS_JSONL: &str = include_str!("synthetic_prompts.jsonl");

#[derive(Deserialize)]
struct Line {
    prompt: String,
}

pub fn prompts() -> Vec<Prompt> {
    from_jsonl(PROMPTS_JSONL)
}

/// A built-in set's prompts, one `{"prompt", ...}` object a line.
pub(super) fn from_jsonl(text: &str) -> Vec<Prompt> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let line: Line = serde_json::from_str(l).expect("built-in prompt set is valid JSONL");
            Prompt::Text(line.prompt)
        })
        .collect()
}
