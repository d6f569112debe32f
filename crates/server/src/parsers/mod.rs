//! Output parsers between the engine's text and the OpenAI response: reasoning (the thought
//! goes to `reasoning_content`) and tool calls (`tool_calls`), both streaming.

pub mod reasoning;
pub mod tools;

pub use reasoning::{ReasoningFormat, ReasoningParser, Split};
pub use tools::{ToolEvent, ToolFormat, ToolParser};

/// A piece of one choice's output, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Reasoning(String),
    Content(String),
    /// A tool call starts: its index in the message, id and function name.
    ToolCall {
        index: usize,
        id: String,
        name: String,
    },
    /// Arguments (JSON text) to append to tool call `index`.
    ToolArguments {
        index: usize,
        fragment: String,
    },
    /// A call's markup held something that was not a call (its text went out as content).
    MalformedToolCall,
}

/// One choice's parsers in a chain: the reasoning parser takes the thought out first, and only
/// the answer goes through the tool-call parser, so a call written while thinking is part of
/// the thought, never a call.
#[derive(Debug, Clone, Default)]
pub struct OutputParser {
    reasoning: Option<ReasoningParser>,
    tools: Option<ToolParser>,
}

impl OutputParser {
    pub fn new(reasoning: Option<ReasoningParser>, tools: Option<ToolParser>) -> Self {
        Self { reasoning, tools }
    }

    /// Whether tool calls are parsed.
    pub fn has_tools(&self) -> bool {
        self.tools.is_some()
    }

    /// Tool calls found so far.
    pub fn tool_calls(&self) -> usize {
        self.tools.as_ref().map_or(0, ToolParser::calls)
    }

    /// The tool parser has all the calls it may take: the rest of the output is not needed.
    pub fn is_done(&self) -> bool {
        self.tools.as_ref().is_some_and(ToolParser::is_done)
    }

    pub fn push(&mut self, text: &str) -> Vec<Output> {
        let split = match &mut self.reasoning {
            Some(r) => r.push(text),
            None => Split {
                reasoning: String::new(),
                content: text.to_string(),
            },
        };
        self.route(split, false)
    }

    /// The end of the output: whatever the parsers held back.
    pub fn finish(&mut self) -> Vec<Output> {
        let split = match &mut self.reasoning {
            Some(r) => r.finish(),
            None => Split::default(),
        };
        self.route(split, true)
    }

    fn route(&mut self, split: Split, last: bool) -> Vec<Output> {
        let mut out = Vec::new();
        if !split.reasoning.is_empty() {
            out.push(Output::Reasoning(split.reasoning));
        }
        let Some(tools) = &mut self.tools else {
            if !split.content.is_empty() {
                out.push(Output::Content(split.content));
            }
            return out;
        };
        let mut events = tools.push(&split.content);
        if last {
            events.extend(tools.finish());
        }
        out.extend(events.into_iter().map(|e| match e {
            ToolEvent::Content(c) => Output::Content(c),
            ToolEvent::Start { index, id, name } => Output::ToolCall { index, id, name },
            ToolEvent::Arguments { index, fragment } => Output::ToolArguments { index, fragment },
            ToolEvent::Malformed => Output::MalformedToolCall,
        }));
        out
    }
}

/// Every way the tests feed a text: in two pieces split at each char boundary, and char by
/// char; `run` must give `want` for each.
#[cfg(test)]
pub(crate) fn assert_any_chunking<T: PartialEq + std::fmt::Debug>(
    text: &str,
    want: &T,
    run: impl Fn(&[&str]) -> T,
) {
    for i in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
        assert_eq!(
            &run(&[&text[..i], &text[i..]]),
            want,
            "split at {i} of {text:?}"
        );
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(&run(&refs), want, "char by char: {text:?}");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (reasoning, content, calls as name + arguments, malformed) of `pieces` through both
    /// parsers.
    type Parsed = (String, String, Vec<(String, String)>, usize);

    fn run(inside: bool, pieces: &[&str]) -> Parsed {
        let mut p = OutputParser::new(
            Some(ReasoningParser::new(ReasoningFormat::Qwen3, inside)),
            Some(ToolParser::new(ToolFormat::Hermes, 3)),
        );
        let mut outputs: Vec<Output> = pieces.iter().flat_map(|s| p.push(s)).collect();
        outputs.extend(p.finish());
        let mut parsed = Parsed::default();
        for o in outputs {
            match o {
                Output::Reasoning(r) => parsed.0.push_str(&r),
                Output::Content(c) => parsed.1.push_str(&c),
                Output::ToolCall { name, .. } => parsed.2.push((name, String::new())),
                Output::ToolArguments { index, fragment } => parsed.2[index].1.push_str(&fragment),
                Output::MalformedToolCall => parsed.3 += 1,
            }
        }
        assert_eq!(parsed.2.len(), p.tool_calls());
        parsed
    }

    #[test]
    fn both_parsers_at_once_in_every_chunking() {
        let call = |n: &str| {
            format!(
                "<tool_call>\n{{\"name\": \"{n}\", \"arguments\": {{\"q\": \"é\"}}}}\n</tool_call>"
            )
        };
        // A call inside the thought is thought; the one after it is a call.
        let text = format!(
            "<think>Maybe {}? Ünïcode.</think>\n\nCalling.\n{}",
            call("draft"),
            call("search")
        );
        let want: Parsed = (
            format!("Maybe {}? Ünïcode.", call("draft")),
            "Calling.".into(),
            vec![("search".into(), r#"{"q":"é"}"#.into())],
            0,
        );
        assert_any_chunking(&text, &want, |p| run(false, p));
        // Opened by the template; a malformed call after the thought.
        let text = "thinking</think><tool_call>{bad}</tool_call>";
        let want: Parsed = (
            "thinking".into(),
            "<tool_call>{bad}</tool_call>".into(),
            vec![],
            1,
        );
        assert_any_chunking(text, &want, |p| run(true, p));
    }
}
