//! Prompt files: JSONL (`{"prompt": ...}` or `{"messages": [...]}` per line) and ShareGPT-style
//! JSON arrays, parsed element by element so that a file cut off mid-way still yields every
//! complete conversation before the cut.

use super::{Prompt, WorkloadError};
use protocol::ChatMessage;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::path::Path;

/// ShareGPT prompts longer than this are skipped, as SGLang's and vLLM's benchmarks skip prompts
/// over 1,024 tokens (about 4 characters a token in English).
const MAX_SHAREGPT_PROMPT_CHARS: usize = 4_096;

/// A remark about a loaded file, shown once before the run.
pub type LoadNote = String;

/// A prompt and, where its conversation opens with a person's turn answered by the assistant's,
/// that answer (text for training draft heads on the dataset's own answers).
#[derive(Debug, Clone, PartialEq)]
pub struct Exchange {
    pub prompt: Prompt,
    pub reply: Option<String>,
}

/// Loads a prompt file: ShareGPT-style JSON arrays or JSONL, told apart by the first character.
pub fn load_file(path: &Path) -> Result<(Vec<Prompt>, Vec<LoadNote>), WorkloadError> {
    let (exchanges, notes) = load_exchanges(path)?;
    Ok((exchanges.into_iter().map(|e| e.prompt).collect(), notes))
}

/// Loads a prompt file as exchanges: prompts in `load_file`'s order, with the dataset's answers
/// where a ShareGPT conversation has them (JSONL prompts have none).
pub fn load_exchanges(path: &Path) -> Result<(Vec<Exchange>, Vec<LoadNote>), WorkloadError> {
    let bytes = std::fs::read(path).map_err(|error| WorkloadError::Io {
        path: path.to_path_buf(),
        error,
    })?;
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return parse_sharegpt_exchanges(&bytes).map_err(|message| WorkloadError::BadFile {
            path: path.to_path_buf(),
            message,
        });
    }
    let text = std::str::from_utf8(&bytes).map_err(|e| WorkloadError::BadFile {
        path: path.to_path_buf(),
        message: format!("not UTF-8: {e}"),
    })?;
    let prompts = parse_jsonl(text).map_err(|(line, message)| WorkloadError::BadLine {
        path: path.to_path_buf(),
        line,
        message,
    })?;
    let exchanges = prompts
        .into_iter()
        .map(|prompt| Exchange {
            prompt,
            reply: None,
        })
        .collect();
    Ok((exchanges, Vec::new()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonlLine {
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    messages: Option<Vec<ChatMessage>>,
}

/// Parses JSONL prompts. An error names the 1-based line.
pub fn parse_jsonl(text: &str) -> Result<Vec<Prompt>, (usize, String)> {
    let mut prompts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let parsed: JsonlLine = serde_json::from_str(line).map_err(|e| (i + 1, e.to_string()))?;
        match (parsed.prompt, parsed.messages) {
            (Some(p), None) => prompts.push(Prompt::Text(p)),
            (None, Some(m)) if !m.is_empty() => prompts.push(Prompt::Messages(m)),
            _ => {
                return Err((
                    i + 1,
                    "expected exactly one of \"prompt\" (a string) or \"messages\" (a non-empty list)"
                        .into(),
                ));
            }
        }
    }
    Ok(prompts)
}

#[derive(Deserialize)]
struct Turn {
    #[serde(default, alias = "role")]
    from: Option<String>,
    #[serde(alias = "content")]
    value: String,
}

impl Turn {
    fn is_person(&self) -> bool {
        matches!(self.from.as_deref(), Some("human" | "user"))
    }

    fn is_assistant(&self) -> bool {
        matches!(
            self.from.as_deref(),
            Some("gpt" | "assistant" | "chatgpt" | "bard" | "bing")
        )
    }
}

#[derive(Deserialize)]
struct Conversation {
    conversations: Vec<Turn>,
}

/// Parses a ShareGPT JSON array. As in SGLang's and vLLM's benchmarks, a prompt is the first turn
/// of a conversation that has at least two turns, whoever speaks it (a third of ShareGPT V3's
/// split conversations open with the assistant). A broken tail (a file cut off mid-element) ends the
/// parse with a note instead of an error.
pub fn parse_sharegpt(bytes: &[u8]) -> Result<(Vec<Prompt>, Vec<LoadNote>), String> {
    let (exchanges, notes) = parse_sharegpt_exchanges(bytes)?;
    Ok((exchanges.into_iter().map(|e| e.prompt).collect(), notes))
}

/// `parse_sharegpt` with each prompt's answer where the conversation has one.
pub fn parse_sharegpt_exchanges(bytes: &[u8]) -> Result<(Vec<Exchange>, Vec<LoadNote>), String> {
    let mut pos = skip_ws(bytes, 0);
    if bytes.get(pos) != Some(&b'[') {
        return Err("expected a JSON array of conversations".into());
    }
    pos += 1;
    let (mut prompts, mut skipped, mut elements) = (Vec::new(), 0usize, 0usize);
    let mut truncated = false;
    loop {
        pos = skip_ws(bytes, pos);
        match bytes.get(pos) {
            None => {
                truncated = true;
                break;
            }
            Some(b']') => break,
            Some(b',') if elements > 0 => pos = skip_ws(bytes, pos + 1),
            _ => {}
        }
        let mut stream =
            serde_json::Deserializer::from_slice(&bytes[pos..]).into_iter::<&RawValue>();
        match stream.next() {
            Some(Ok(raw)) => {
                pos += stream.byte_offset();
                elements += 1;
                match sharegpt_exchange(raw) {
                    Some(p) => prompts.push(p),
                    None => skipped += 1,
                }
            }
            Some(Err(e)) if e.is_eof() => {
                truncated = true;
                break;
            }
            None => {
                truncated = true;
                break;
            }
            Some(Err(e)) => return Err(format!("element {}: {e}", elements + 1)),
        }
    }
    let mut notes = vec![format!(
        "{} conversations read, {} usable prompts ({} skipped: fewer than two turns, or an empty prompt or one over {} characters)",
        elements,
        prompts.len(),
        skipped,
        MAX_SHAREGPT_PROMPT_CHARS
    )];
    if truncated {
        notes.push(format!(
            "the file is cut off after byte {pos}: the broken tail was skipped"
        ));
    }
    Ok((prompts, notes))
}

fn sharegpt_exchange(raw: &RawValue) -> Option<Exchange> {
    if let Ok(c) = serde_json::from_str::<Conversation>(raw.get()) {
        let [first, second, ..] = c.conversations.as_slice() else {
            return None;
        };
        let len = first.value.chars().count();
        if len == 0 || len > MAX_SHAREGPT_PROMPT_CHARS {
            return None;
        }
        let answered = first.is_person() && second.is_assistant() && !second.value.is_empty();
        return Some(Exchange {
            prompt: Prompt::Text(first.value.clone()),
            reply: answered.then(|| second.value.clone()),
        });
    }
    // Also accept arrays of JSONL-style objects.
    let prompt = parse_jsonl(raw.get()).ok()?.into_iter().next()?;
    Some(Exchange {
        prompt,
        reply: None,
    })
}

fn skip_ws(bytes: &[u8], mut pos: usize) -> usize {
    while bytes.get(pos).is_some_and(u8::is_ascii_whitespace) {
        pos += 1;
    }
    pos
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = r#"[
      {"id": "a", "conversations": [{"from": "human", "value": "Hello?"}, {"from": "gpt", "value": "Hi"}]},
      {"id": "b", "conversations": [{"from": "human", "value": "only one turn"}]},
      {"id": "c", "conversations": [{"from": "gpt", "value": "bot first"}, {"from": "human", "value": "x"}]},
      {"id": "d", "conversations": [{"from": "human", "value": "Second \"quoted\" prompt"}, {"from": "gpt", "value": "ok"}]}
    ]"#;

    #[test]
    fn sharegpt_takes_the_first_turn_of_multi_turn_conversations() {
        let (prompts, notes) = parse_sharegpt(TWO.as_bytes()).unwrap();
        assert_eq!(
            prompts,
            vec![
                Prompt::Text("Hello?".into()),
                Prompt::Text("bot first".into()),
                Prompt::Text("Second \"quoted\" prompt".into())
            ]
        );
        assert_eq!(notes.len(), 1, "complete file: no truncation note");
        assert!(notes[0].starts_with("4 conversations read, 3 usable"));
    }

    #[test]
    fn sharegpt_exchanges_keep_the_assistants_first_answer() {
        let (exchanges, _) = parse_sharegpt_exchanges(TWO.as_bytes()).unwrap();
        let replies: Vec<_> = exchanges.iter().map(|e| e.reply.as_deref()).collect();
        // The conversation that opens with the assistant has no answer to its first turn.
        assert_eq!(replies, vec![Some("Hi"), None, Some("ok")]);
        assert_eq!(exchanges[2].prompt.text(), "Second \"quoted\" prompt");
    }

    #[test]
    fn sharegpt_cut_off_mid_element_keeps_complete_ones() {
        let cut = TWO.find(r#"{"id": "d""#).unwrap() + 30;
        let (prompts, notes) = parse_sharegpt(&TWO.as_bytes()[..cut]).unwrap();
        assert_eq!(
            prompts,
            vec![
                Prompt::Text("Hello?".into()),
                Prompt::Text("bot first".into())
            ]
        );
        assert!(notes.iter().any(|n| n.contains("cut off")), "{notes:?}");
    }

    #[test]
    fn sharegpt_cut_right_after_a_comma() {
        let cut = TWO.find(r#"{"id": "b""#).unwrap();
        let (prompts, notes) = parse_sharegpt(&TWO.as_bytes()[..cut]).unwrap();
        assert_eq!(prompts.len(), 1);
        assert!(notes.iter().any(|n| n.contains("cut off")));
    }

    #[test]
    fn json_arrays_of_prompt_objects_load_too() {
        let (prompts, _) = parse_sharegpt(
            br#"[{"prompt": "a"}, {"messages": [{"role": "user", "content": "b"}]}]"#,
        )
        .unwrap();
        assert_eq!(prompts.len(), 2);
        assert_eq!(prompts[1].text(), "b");
    }

    #[test]
    fn sharegpt_rejects_non_arrays_and_garbage() {
        assert!(parse_sharegpt(b"{}").is_err());
        assert!(parse_sharegpt(b"[{\"conversations\": [}]").is_err());
    }

    #[test]
    fn jsonl_prompts_and_messages() {
        let text =
            "{\"prompt\": \"a\"}\n\n{\"messages\": [{\"role\": \"user\", \"content\": \"b\"}]}\n";
        let p = parse_jsonl(text).unwrap();
        assert_eq!(p[0], Prompt::Text("a".into()));
        assert_eq!(p[1].text(), "b");
    }

    #[test]
    fn jsonl_errors_name_the_line() {
        let err = parse_jsonl("{\"prompt\": \"a\"}\n{\"prompt\": 3}\n").unwrap_err();
        assert_eq!(err.0, 2);
        let err = parse_jsonl("{\"prompt\": \"a\", \"messages\": []}\n").unwrap_err();
        assert_eq!(err.0, 1);
        let err = parse_jsonl("{\"text\": \"a\"}\n").unwrap_err();
        assert_eq!(err.0, 1);
    }

    #[test]
    fn load_file_detects_the_format() {
        let dir = tempfile::tempdir().unwrap();
        let jsonl = dir.path().join("p.jsonl");
        std::fs::write(&jsonl, "{\"prompt\": \"x\"}\n").unwrap();
        assert_eq!(load_file(&jsonl).unwrap().0.len(), 1);
        let json = dir.path().join("s.json");
        std::fs::write(&json, TWO).unwrap();
        assert_eq!(load_file(&json).unwrap().0.len(), 3);
        let missing = load_file(&dir.path().join("nope.jsonl")).unwrap_err();
        assert!(missing.to_string().contains("nope.jsonl"));
    }
}
