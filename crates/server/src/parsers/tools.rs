//! Tool-call parsers (`--tool-call-parser`): find the calls in a model's text as it streams and
//! turn them into OpenAI tool calls, keeping every piece of their markup out of `content`.
//!
//! A call is recognised between a start and an end tag (`<tool_call>` … `</tool_call>` for
//! Hermes and Qwen 2.5). Text outside calls goes out as content as it comes (a tag split across
//! chunks is held back until complete or ruled out); a call's body is held until its end tag,
//! then parsed whole: a call goes out as its start (index, id, name) and its arguments (a JSON
//! string), so a call is never half-sent; a body that does not parse goes out as plain content
//! and is reported as malformed (the server counts it). A call left open at the end of the text
//! is parsed as if closed (models often stop right after the JSON).

use super::reasoning::partial_tag;
use serde_json::Value;

/// The model families' tool-call formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (Hermes, Qwen 2.5).
    Hermes,
}

impl ToolFormat {
    /// The `--tool-call-parser` names.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "hermes" | "qwen25" | "qwen" => Some(Self::Hermes),
            _ => None,
        }
    }

    fn tags(self) -> (&'static str, &'static str) {
        match self {
            Self::Hermes => ("<tool_call>", "</tool_call>"),
        }
    }

    /// The calls in one body: `(name, arguments as JSON text)`.
    fn calls(self, body: &str) -> Option<Vec<(String, String)>> {
        match self {
            Self::Hermes => json_call(body.trim(), "arguments").map(|c| vec![c]),
        }
    }
}

/// `{"name": "…", "<args_key>": {…}}` as (name, arguments); missing arguments are `{}`.
fn json_call(text: &str, args_key: &str) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(text).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let args = match v.get(args_key) {
        None | Some(Value::Null) => "{}".to_string(),
        // Some models write the arguments as a JSON string.
        Some(Value::String(s)) if serde_json::from_str::<Value>(s).is_ok_and(|a| a.is_object()) => {
            s.clone()
        }
        Some(a @ Value::Object(_)) => a.to_string(),
        Some(_) => return None,
    };
    Some((name, args))
}

/// What the parser found in a piece of text, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEvent {
    Content(String),
    /// A new call: its index in the message, its id (`call_…`) and the function's name.
    Start {
        index: usize,
        id: String,
        name: String,
    },
    /// Arguments (JSON text) to append to call `index`.
    Arguments {
        index: usize,
        fragment: String,
    },
    /// A call's markup held something that is not a call: its text went out as content.
    Malformed,
}

/// One choice's streaming tool-call parser.
#[derive(Debug, Clone)]
pub struct ToolParser {
    format: ToolFormat,
    start: &'static str,
    end: &'static str,
    inside: bool,
    /// Outside a call: text held back (a possible tag start); inside: the call's body so far.
    pending: String,
    calls: usize,
    /// Seeds the call ids (unique per request).
    id_seed: u64,
}

impl ToolParser {
    pub fn new(format: ToolFormat, id_seed: u64) -> Self {
        let (start, end) = format.tags();
        Self {
            format,
            start,
            end,
            inside: false,
            pending: String::new(),
            calls: 0,
            id_seed,
        }
    }

    /// Calls found so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            let tag = if self.inside { self.end } else { self.start };
            if let Some(at) = self.pending.find(tag) {
                let before: String = self.pending.drain(..at).collect();
                self.pending.drain(..tag.len());
                if self.inside {
                    self.close(&before, &mut out);
                } else {
                    content(&mut out, before);
                }
                self.inside = !self.inside;
                continue;
            }
            if !self.inside {
                let keep = partial_tag(&self.pending, tag);
                let cut = self.pending.len() - keep;
                let ready: String = self.pending.drain(..cut).collect();
                content(&mut out, ready);
            }
            return out;
        }
    }

    /// The end of the text: an open call is parsed as if closed; held-back text goes out.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.pending);
        if self.inside {
            self.inside = false;
            self.close(&rest, &mut out);
        } else {
            content(&mut out, rest);
        }
        out
    }

    /// A call's body is complete.
    fn close(&mut self, body: &str, out: &mut Vec<ToolEvent>) {
        match self.format.calls(body) {
            Some(calls) => {
                for (name, arguments) in calls {
                    let index = self.calls;
                    self.calls += 1;
                    out.push(ToolEvent::Start {
                        index,
                        id: call_id(self.id_seed, index),
                        name,
                    });
                    out.push(ToolEvent::Arguments {
                        index,
                        fragment: arguments,
                    });
                }
            }
            None => {
                out.push(ToolEvent::Malformed);
                content(out, format!("{}{body}{}", self.start, self.end));
            }
        }
    }
}

fn content(out: &mut Vec<ToolEvent>, text: String) {
    if text.is_empty() {
        return;
    }
    if let Some(ToolEvent::Content(last)) = out.last_mut() {
        last.push_str(&text);
    } else {
        out.push(ToolEvent::Content(text));
    }
}

/// `call_` and 24 hex digits, distinct per request seed and call index.
fn call_id(seed: u64, index: usize) -> String {
    let mut h = seed ^ 0x9e37_79b9_7f4a_7c15 ^ (index as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 31;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    format!("call_{h:016x}{:08x}", (h >> 32) as u32 ^ index as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Content, calls (name, arguments) and malformed count of `text` fed in pieces.
    type Parsed = (String, Vec<(String, String)>, usize);

    fn run(pieces: &[&str]) -> Parsed {
        let mut p = ToolParser::new(ToolFormat::Hermes, 7);
        let mut events: Vec<ToolEvent> = pieces.iter().flat_map(|s| p.push(s)).collect();
        events.extend(p.finish());
        let mut parsed: Parsed = Default::default();
        for e in events {
            match e {
                ToolEvent::Content(c) => parsed.0.push_str(&c),
                ToolEvent::Start { index, name, id } => {
                    assert_eq!(index, parsed.1.len());
                    assert!(id.starts_with("call_") && id.len() == 29, "{id}");
                    parsed.1.push((name, String::new()));
                }
                ToolEvent::Arguments { index, fragment } => parsed.1[index].1.push_str(&fragment),
                ToolEvent::Malformed => parsed.2 += 1,
            }
        }
        parsed
    }

    fn check(text: &str, want: (&str, &[(&str, &str)], usize)) {
        let want: Parsed = (
            want.0.to_string(),
            want.1
                .iter()
                .map(|(n, a)| (n.to_string(), a.to_string()))
                .collect(),
            want.2,
        );
        super::super::assert_any_chunking(text, &want, run);
    }

    #[test]
    fn hermes_calls_are_found_wherever_the_chunks_break() {
        check(
            "Let me look. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>",
            (
                "Let me look. ",
                &[("get_weather", r#"{"city":"Zürich"}"#)],
                0,
            ),
        );
        // Two calls, one without parameters; a call left open at the end.
        check(
            "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"now\"}</tool_call>",
            ("", &[("a", "{}"), ("now", "{}")], 0),
        );
        check(
            "<tool_call>{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}",
            ("", &[("b", r#"{"x":[1,2]}"#)], 0),
        );
        // No call at all, a lone '<', and a body that is not a call.
        check("1 < 2 <tool", ("1 < 2 <tool", &[], 0));
        check(
            "<tool_call>{\"name\": oops}</tool_call> after",
            ("<tool_call>{\"name\": oops}</tool_call> after", &[], 1),
        );
    }

    #[test]
    fn ids_differ_between_calls_and_requests() {
        assert_ne!(call_id(1, 0), call_id(1, 1));
        assert_ne!(call_id(1, 0), call_id(2, 0));
        assert_eq!(ToolFormat::parse("qwen25"), Some(ToolFormat::Hermes));
    }
}
