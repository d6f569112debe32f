//! The built-in `code` dataset: programming requests (write, explain, fix, convert, test and edit
//! code), most of them carrying the code they are about.

use super::Prompt;

const PROMPTS_JSONL: &str = include_str!("code_prompts.jsonl");

pub fn prompts() -> Vec<Prompt> {
    super::synthetic::from_jsonl(PROMPTS_JSONL)
}
