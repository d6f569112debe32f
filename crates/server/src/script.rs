//! Scripted model output, for tests only (`specula serve --scripted-output FILE`): what the model
//! "says" is taken from a list of rules instead of sampled, so tests of the API around the model
//! (tool calls, reasoning, streaming) are deterministic while every request still runs the real
//! path: template, tokenizer, engine, forward passes, detokenizer, parsers.
//!
//! The file is a JSON list of rules, `[{"when": "text in the prompt", "reply": "…"}, …]`; a
//! request's prompt (its tokens decoded, special tokens as text) takes the first rule whose
//! `when` it contains (a rule without `when` matches any prompt). The reply is tokenized and
//! followed by the end-of-generation token; `max_tokens` and stop strings still apply. A prompt
//! no rule matches is sampled as usual.

use crate::error::ApiError;
use model::tokenizer::Tokenizer;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    #[serde(default)]
    when: Option<String>,
    reply: String,
}

/// The rules of a script file.
#[derive(Debug, Clone)]
pub struct Script {
    rules: Vec<Rule>,
}

impl Script {
    /// Reads `[{"when": …, "reply": …}, …]`; errors name what is wrong.
    pub fn parse(json: &str) -> Result<Self, String> {
        let rules: Vec<Rule> = serde_json::from_str(json).map_err(|e| e.to_string())?;
        if rules.is_empty() {
            return Err("the script has no rules".into());
        }
        Ok(Self { rules })
    }

    /// The reply's text for a prompt, if a rule matches.
    pub fn reply(&self, prompt_text: &str) -> Option<&str> {
        self.rules
            .iter()
            .find(|r| r.when.as_deref().is_none_or(|w| prompt_text.contains(w)))
            .map(|r| r.reply.as_str())
    }

    /// The tokens the model is made to emit after `prompt`: the matching reply and an
    /// end-of-generation token; empty when no rule matches.
    pub fn reply_tokens(&self, tok: &Tokenizer, prompt: &[u32]) -> Result<Vec<u32>, ApiError> {
        let text = tok
            .decode(prompt, false)
            .map_err(|e| ApiError::internal(format!("scripted output: {e}")))?;
        let Some(reply) = self.reply(&text) else {
            return Ok(Vec::new());
        };
        let mut ids = tok
            .encode(reply, false, true)
            .map_err(|e| ApiError::internal(format!("scripted output: {e}")))?;
        ids.extend(tok.eos_id().or_else(|| tok.eog_ids().first().copied()));
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_matching_rule_replies() {
        let s = Script::parse(
            r#"[{"when": "tool_response", "reply": "It is sunny."}, {"reply": "<tool_call>x</tool_call>"}]"#,
        )
        .unwrap();
        assert_eq!(s.reply("…<tool_response>22 C…"), Some("It is sunny."));
        assert_eq!(s.reply("Weather?"), Some("<tool_call>x</tool_call>"));
        let only = Script::parse(r#"[{"when": "a", "reply": "b"}]"#).unwrap();
        assert_eq!(only.reply("c"), None);
        assert!(Script::parse("[]").is_err());
        assert!(Script::parse(r#"[{"reply": 1}]"#).is_err());
        assert!(Script::parse(r#"[{"reply": "x", "other": 1}]"#).is_err());
    }
}
