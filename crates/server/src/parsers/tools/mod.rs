//! Tool-call parsers (`--tool-call-parser`): find the calls in a model's text as it streams and
//! turn them into OpenAI tool calls, keeping every piece of their markup out of `content`.
//!
//! Each format ([`ToolFormat`]) says where a call starts (a marker such as `<tool_call>`, or a
//! bracket at the start of the message for the formats that have no marker), where it ends, and
//! how its body reads. Text outside calls goes out as content as it comes; what could still be
//! the start of a marker is held back until it is complete or ruled out, and so is whitespace,
//! which is dropped before and after a call. A call's body is held until it is complete, then
//! parsed whole: it goes out as its start (index, id, name) and then its arguments (a JSON
//! object as text), so a call is never half-sent; a body that does not parse goes out as plain
//! content and is reported as malformed (the server counts it). A call left open at the end of
//! the text is parsed as if closed (models often stop right after the JSON).

mod formats;
mod pythonic;
mod scan;

pub use formats::ToolFormat;

use super::reasoning::partial_tag;
use formats::{BodyScan, Markup};

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
    markup: &'static Markup,
    /// Inside a call: the marker that opened it (empty for a call opened without one).
    open: Option<&'static str>,
    /// Outside a call: text held back; inside: the call's body so far.
    pending: String,
    /// Inside a call: how far the search for its end has come.
    scan: BodyScan,
    /// Inside a call opened without a marker: its start was seen to read as a call.
    checked: bool,
    /// A call may start here without a marker (the message's start, or right after a call).
    may_start: bool,
    /// Leading whitespace of the next content is dropped (right after a call).
    trim_next: bool,
    calls: usize,
    /// Calls after this many are dropped with the rest of the text.
    max_calls: usize,
    /// The functions the request offers (empty: any name); a call of another is malformed.
    names: Vec<String>,
    /// Seeds the call ids (unique per request).
    id_seed: u64,
}

impl ToolParser {
    pub fn new(format: ToolFormat, id_seed: u64) -> Self {
        Self {
            format,
            markup: format.markup(),
            open: None,
            pending: String::new(),
            scan: BodyScan::default(),
            checked: false,
            may_start: true,
            trim_next: false,
            calls: 0,
            max_calls: usize::MAX,
            names: Vec::new(),
            id_seed,
        }
    }

    /// Only calls of these functions are calls; a body naming another is malformed.
    pub fn with_names(mut self, names: Vec<String>) -> Self {
        self.names = names;
        self
    }

    /// Stops at the first `max` calls (`parallel_tool_calls: false` is 1): what follows them
    /// is dropped, and [`ToolParser::is_done`] says so.
    pub fn with_max_calls(mut self, max: usize) -> Self {
        self.max_calls = max.max(1);
        self
    }

    /// Calls found so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// The most calls were found: the rest of the text is not needed.
    pub fn is_done(&self) -> bool {
        self.calls >= self.max_calls
    }

    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        if !self.is_done() {
            self.pending.push_str(text);
            self.advance(&mut out, false);
        }
        out
    }

    /// The end of the text: an open call is parsed as if closed; held-back text goes out.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        if !self.is_done() {
            self.advance(&mut out, true);
        }
        self.pending.clear();
        out
    }

    fn advance(&mut self, out: &mut Vec<ToolEvent>, at_end: bool) {
        loop {
            if self.is_done() {
                self.pending.clear();
                return;
            }
            if let Some(opener) = self.open {
                if opener.is_empty() && !self.checked {
                    match self.format.looks_like_call(&self.pending) {
                        None if !at_end => return,
                        Some(true) => self.checked = true,
                        // Not a call after all: the text is content.
                        _ => {
                            self.open = None;
                            self.may_start = false;
                            continue;
                        }
                    }
                }
                let whole = opener.is_empty() && self.markup.implicit_is_whole;
                let end = match whole {
                    true => None,
                    false => self.format.body_end(&self.pending, &mut self.scan),
                };
                let Some((body_len, used)) = end else {
                    if at_end {
                        let body = std::mem::take(&mut self.pending);
                        self.open = None;
                        self.close(opener, &body, "", out);
                    }
                    return;
                };
                let body: String = self.pending.drain(..used).collect();
                self.open = None;
                self.close(opener, &body[..body_len], &body[body_len..], out);
                continue;
            }
            if self.may_start && self.start_implicit() {
                continue;
            }
            let m = self.markup;
            let found = m
                .openers
                .iter()
                .chain(m.wrappers)
                .filter_map(|&tag| self.pending.find(tag).map(|at| (at, tag)))
                .min();
            if let Some((at, tag)) = found {
                let before: String = self.pending.drain(..at).collect();
                self.pending.drain(..tag.len());
                // Whitespace right before call markup is dropped.
                self.content(before.trim_end(), out);
                if m.openers.contains(&tag) {
                    self.open_call(tag);
                } else if m.prefixes.contains(&tag) {
                    self.may_start = true;
                }
                continue;
            }
            let hold = if at_end {
                0
            } else {
                let partial = m
                    .openers
                    .iter()
                    .chain(m.wrappers)
                    .map(|tag| partial_tag(&self.pending, tag))
                    .max()
                    .unwrap_or(0);
                // With the whitespace before it: it is dropped if a call follows.
                let rest = &self.pending[..self.pending.len() - partial];
                partial + rest.len() - rest.trim_end().len()
            };
            let cut = self.pending.len() - hold;
            let ready: String = self.pending.drain(..cut).collect();
            if at_end && self.calls > 0 && ready.trim().is_empty() {
                return;
            }
            self.content(&ready, out);
            return;
        }
    }

    /// At a place where a call may start without a marker: drops a separator after a call, or
    /// opens a call at the implicit opener. True if it did either.
    fn start_implicit(&mut self) -> bool {
        let t = self.pending.trim_start();
        let skip = self.pending.len() - t.len();
        if let Some(sep) = self.markup.separator
            && self.calls > 0
            && t.starts_with(sep)
        {
            self.pending.drain(..skip + sep.len_utf8());
            return true;
        }
        if t.starts_with(self.markup.implicit)
            && !(self.markup.implicit_is_whole && (self.calls > 0 || self.names.is_empty()))
        {
            self.pending.drain(..skip);
            self.open_call("");
            return true;
        }
        false
    }

    /// A call opens (`opener` is its marker, empty for a call opened without one).
    fn open_call(&mut self, opener: &'static str) {
        self.open = Some(opener);
        self.scan = BodyScan::default();
        self.checked = false;
    }

    /// Text outside calls; anything but whitespace ends the place where a call may start.
    fn content(&mut self, text: &str, out: &mut Vec<ToolEvent>) {
        let text = if self.trim_next {
            text.trim_start()
        } else {
            text
        };
        if text.is_empty() {
            return;
        }
        self.trim_next = false;
        self.may_start = false;
        push_content(out, text.to_string());
    }

    /// A call's body is complete (`opener` and `closer` are the markup around it).
    fn close(&mut self, opener: &str, body: &str, closer: &str, out: &mut Vec<ToolEvent>) {
        let known = |calls: &Vec<(String, serde_json::Value)>| {
            self.names.is_empty() || calls.iter().all(|(n, _)| self.names.contains(n))
        };
        match self.format.parse_body(body).filter(known) {
            Some(calls) => {
                for (name, arguments) in calls {
                    if self.is_done() {
                        break;
                    }
                    let index = self.calls;
                    self.calls += 1;
                    out.push(ToolEvent::Start {
                        index,
                        id: self.format.call_id(self.id_seed, index, &name),
                        name,
                    });
                    out.push(ToolEvent::Arguments {
                        index,
                        fragment: arguments.to_string(),
                    });
                }
                self.may_start = true;
                self.trim_next = true;
            }
            None => {
                if !opener.is_empty() || self.format.attempted(body) {
                    out.push(ToolEvent::Malformed);
                }
                // As plain text, it may not start another call.
                self.may_start = false;
                self.trim_next = false;
                push_content(out, format!("{opener}{body}{closer}"));
            }
        }
    }
}

/// Appends content text, joined to content just before it.
fn push_content(out: &mut Vec<ToolEvent>, text: String) {
    if text.is_empty() {
        return;
    }
    if let Some(ToolEvent::Content(last)) = out.last_mut() {
        last.push_str(&text);
    } else {
        out.push(ToolEvent::Content(text));
    }
}

/// splitmix64 of the seed and index, twice over: 128 bits for an id.
fn id_bits(seed: u64, index: usize) -> (u64, u64) {
    use model::sampler::splitmix64;
    let a = splitmix64(seed ^ (index as u64).wrapping_mul(0xd6e8_feb8_6659_fd93));
    (a, splitmix64(a))
}

/// `call_` and 24 hex digits, distinct per seed and call index.
fn call_id(seed: u64, index: usize) -> String {
    let (a, b) = id_bits(seed, index);
    format!("call_{a:016x}{:08x}", b as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ToolFormat::*;

    /// Content, calls (name, arguments) and malformed count of `text` fed in pieces.
    type Parsed = (String, Vec<(String, String)>, usize);

    fn run(format: ToolFormat, pieces: &[&str]) -> Parsed {
        run_offering(format, &[], pieces)
    }

    /// As `run`, the request offering the functions `names`.
    fn run_offering(format: ToolFormat, names: &[&str], pieces: &[&str]) -> Parsed {
        let names = names.iter().map(|n| n.to_string()).collect();
        let mut p = ToolParser::new(format, 7).with_names(names);
        let mut events: Vec<ToolEvent> = pieces.iter().flat_map(|s| p.push(s)).collect();
        events.extend(p.finish());
        let mut parsed: Parsed = Default::default();
        for e in events {
            match e {
                ToolEvent::Content(c) => parsed.0.push_str(&c),
                ToolEvent::Start { index, name, id } => {
                    assert_eq!(index, parsed.1.len());
                    match format {
                        Mistral => assert!(
                            id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()),
                            "{id}"
                        ),
                        KimiK2 => assert_eq!(id, format!("functions.{name}:{index}")),
                        _ => assert!(id.starts_with("call_") && id.len() == 29, "{id}"),
                    }
                    parsed.1.push((name, String::new()));
                }
                ToolEvent::Arguments { index, fragment } => parsed.1[index].1.push_str(&fragment),
                ToolEvent::Malformed => parsed.2 += 1,
            }
        }
        parsed
    }

    /// `text` in every chunking gives this content, these calls and this many malformed ones.
    fn check(format: ToolFormat, text: &str, want: (&str, &[(&str, &str)], usize)) {
        let want: Parsed = (
            want.0.to_string(),
            want.1
                .iter()
                .map(|(n, a)| (n.to_string(), a.to_string()))
                .collect(),
            want.2,
        );
        super::super::assert_any_chunking(text, &want, |pieces| run(format, pieces));
    }

    const WEATHER: (&str, &str) = ("get_weather", r#"{"city":"Zürich"}"#);

    #[test]
    fn hermes_calls_are_found_wherever_the_chunks_break() {
        check(
            Hermes,
            "Let me look. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>",
            ("Let me look.", &[WEATHER], 0),
        );
        // Two calls, one without parameters; the whitespace between them is dropped.
        check(
            Hermes,
            "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"now\"}</tool_call>\n",
            ("", &[("a", "{}"), ("now", "{}")], 0),
        );
        // Left open at the end; a second call opened before the first was closed.
        check(
            Hermes,
            "<tool_call>{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}",
            ("", &[("b", r#"{"x":[1,2]}"#)], 0),
        );
        check(
            Hermes,
            "<tool_call>{\"name\": \"a\"}\n<tool_call>{\"name\": \"b\"}</tool_call> Done.",
            ("Done.", &[("a", "{}"), ("b", "{}")], 0),
        );
        // No call at all, a lone '<', trailing whitespace kept without calls.
        check(Hermes, "1 < 2 <tool \n", ("1 < 2 <tool \n", &[], 0));
        // Bodies that are not calls go out as they came, and are counted.
        check(
            Hermes,
            "<tool_call>{\"name\": oops}</tool_call> after",
            ("<tool_call>{\"name\": oops}</tool_call> after", &[], 1),
        );
        check(
            Hermes,
            "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
            (
                "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
                &[],
                1,
            ),
        );
        // Tags inside the arguments' strings are text of the arguments.
        check(
            Hermes,
            "<tool_call>{\"name\": \"write\", \"arguments\": {\"text\": \"<tool_call> and </tool_call>\"}}</tool_call>",
            (
                "",
                &[("write", r#"{"text":"<tool_call> and </tool_call>"}"#)],
                0,
            ),
        );
        // Arguments written as a JSON string are taken as the object they hold.
        check(
            Hermes,
            "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"k\\\": 1}\"}</tool_call>",
            ("", &[("f", r#"{"k":1}"#)], 0),
        );
    }

    #[test]
    fn llama3_calls_are_json_at_the_start_of_the_message() {
        check(
            Llama3,
            " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Zürich\"}}; {\"name\": \"now\", \"parameters\": {}}",
            ("", &[WEATHER, ("now", "{}")], 0),
        );
        check(
            Llama3,
            "<|python_tag|>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}",
            ("", &[WEATHER], 0),
        );
        // JSON that is not a call is an answer; a call's JSON later in the text is text.
        check(Llama3, "{\"answer\": 42}", ("{\"answer\": 42}", &[], 0));
        check(
            Llama3,
            "Use {\"name\": \"x\"} like this.",
            ("Use {\"name\": \"x\"} like this.", &[], 0),
        );
        check(
            Llama3,
            "{\"name\": \"f\", \"parameters\": {\"a\": }",
            ("{\"name\": \"f\", \"parameters\": {\"a\": }", &[], 1),
        );
        // Neither is an attempted call: not counted.
        check(
            Llama3,
            "{\"name\": \"Alice\", \"age\": 3}",
            ("{\"name\": \"Alice\", \"age\": 3}", &[], 0),
        );
        check(Llama3, "{ a: 1 } and more", ("{ a: 1 } and more", &[], 0));
    }

    #[test]
    fn mistral_calls_in_both_spellings() {
        check(
            Mistral,
            "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}, {\"name\": \"now\", \"arguments\": {}}]",
            ("", &[WEATHER, ("now", "{}")], 0),
        );
        check(
            Mistral,
            "Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Zürich\"}[TOOL_CALLS]now[ARGS]{}",
            ("Checking.", &[WEATHER, ("now", "{}")], 0),
        );
        check(
            Mistral,
            "[TOOL_CALLS] [{\"name\": 1}]",
            ("[TOOL_CALLS] [{\"name\": 1}]", &[], 1),
        );
    }

    #[test]
    fn deepseek_v3_calls_inside_their_section() {
        check(
            DeepseekV3,
            "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Zürich\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            ("Sure.", &[WEATHER, ("now", "{}")], 0),
        );
        // V3.1's spelling: the name before the separator, bare JSON after it.
        check(
            DeepseekV3,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Zürich\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            ("", &[WEATHER], 0),
        );
    }

    #[test]
    fn kimi_k2_calls_inside_their_section() {
        check(
            KimiK2,
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Zürich\"}<|tool_call_end|><|tool_call_begin|>functions.now:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
            ("", &[WEATHER, ("now", "{}")], 0),
        );
        check(
            KimiK2,
            "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{oops<|tool_call_end|>",
            (
                "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{oops<|tool_call_end|>",
                &[],
                1,
            ),
        );
    }

    #[test]
    fn pythonic_calls_are_a_list_at_the_start_of_the_message() {
        check(
            Pythonic,
            "[get_weather(city='Zürich'), now()]",
            ("", &[WEATHER, ("now", "{}")], 0),
        );
        check(
            Pythonic,
            "<|python_start|>[get_weather(city=\"Zürich\")]<|python_end|>",
            ("", &[WEATHER], 0),
        );
        // A bracket that is not a call list is text (even with an open quote after it); a
        // broken call list is malformed.
        check(Pythonic, "[1] See below.", ("[1] See below.", &[], 0));
        check(
            Pythonic,
            "[Here's the doc](url) and more",
            ("[Here's the doc](url) and more", &[], 0),
        );
        check(Pythonic, "[f(x=)]", ("[f(x=)]", &[], 1));
    }

    #[test]
    fn a_call_of_a_function_not_offered_is_malformed() {
        let mut p = ToolParser::new(Hermes, 1).with_names(vec!["get_weather".into()]);
        let text = "<tool_call>{\"name\": \"Paris\", \"arguments\": {}}</tool_call>";
        let mut events = p.push(text);
        events.extend(p.finish());
        assert_eq!(
            events,
            [ToolEvent::Malformed, ToolEvent::Content(text.to_string())]
        );
    }

    #[test]
    fn a_whole_hermes_answer_that_is_a_bare_call_of_an_offered_tool_is_a_call() {
        // Qwen2.5-Coder answers a weather question with the object alone, without the tags.
        let named = |text: &str, names: &[&str]| -> Vec<ToolEvent> {
            let mut p = ToolParser::new(Hermes, 1)
                .with_names(names.iter().map(|n| n.to_string()).collect());
            let mut events: Vec<ToolEvent> = text
                .split_inclusive([',', ' '])
                .flat_map(|piece| p.push(piece))
                .collect();
            events.extend(p.finish());
            events
        };
        let call = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}";
        let events = named(&format!("\n{call}\n"), &["get_weather"]);
        assert!(
            matches!(&events[..], [ToolEvent::Start { name, .. }, ToolEvent::Arguments { fragment, .. }]
                if name == "get_weather" && fragment == r#"{"city":"Paris"}"#),
            "{events:?}"
        );
        // Not a call: another name, no tools offered, text after the object, a JSON answer.
        for (text, names) in [
            (
                call.replace("get_weather", "get_time"),
                &["get_weather"][..],
            ),
            (call.to_string(), &[][..]),
            (format!("{call} Shall I?"), &["get_weather"][..]),
            ("{\"city\": \"Paris\"}".to_string(), &["get_weather"][..]),
            // A fence showing JSON that names no offered tool, a fence of another language.
            (
                format!("```json\n{}\n```", call.replace("get_weather", "get_time")),
                &["get_weather"][..],
            ),
            (
                "```python\nprint({\"name\": 1})\n```".to_string(),
                &["get_weather"][..],
            ),
            (
                format!("```json\n{call}\n```\nIt is sunny."),
                &["get_weather"][..],
            ),
        ] {
            let mut content = String::new();
            for e in named(&text, names) {
                match e {
                    ToolEvent::Content(c) => content.push_str(&c),
                    other => panic!("{text}: {other:?}"),
                }
            }
            assert_eq!(content, text);
        }
    }

    #[test]
    fn a_hermes_call_in_a_json_fence_is_a_call() {
        // Qwen2.5-Coder under `auto` often writes its call in a Markdown fence, without tags.
        let call = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}";
        let time = "{\"name\": \"get_time\", \"arguments\": {}}";
        for (text, want) in [
            (format!("```json\n{call}\n```"), &[WEATHER_PARIS][..]),
            (format!("\n```\n{call}\n```\n"), &[WEATHER_PARIS][..]),
            // Left open: the model stopped after the JSON.
            (format!("```json\n{call}\n"), &[WEATHER_PARIS][..]),
            (
                format!("```json\n[{call}, {time}]\n```"),
                &[WEATHER_PARIS, ("get_time", "{}")][..],
            ),
        ] {
            let want: Parsed = (
                String::new(),
                want.iter()
                    .map(|(n, a)| (n.to_string(), a.to_string()))
                    .collect(),
                0,
            );
            super::super::assert_any_chunking(&text, &want, |pieces| {
                run_offering(Hermes, &["get_weather", "get_time"], pieces)
            });
        }
    }

    const WEATHER_PARIS: (&str, &str) = ("get_weather", r#"{"city":"Paris"}"#);

    #[test]
    fn with_one_call_at_most_the_rest_is_dropped() {
        let mut p = ToolParser::new(Hermes, 1).with_max_calls(1);
        let mut events =
            p.push("<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\"}");
        assert!(p.is_done());
        events.extend(p.push("</tool_call> more"));
        events.extend(p.finish());
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(p.calls(), 1);
    }

    #[test]
    fn written_calls_parse_back_in_every_format() {
        let args = serde_json::json!({"city": "Zürich", "days": 2});
        let calls = [("get_weather", &args), ("now", &serde_json::json!({}))];
        for format in [Hermes, Llama3, Mistral, DeepseekV3, KimiK2, Pythonic] {
            let text = format.write_calls(&calls);
            let parsed = run(format, &[&text]);
            assert_eq!(
                parsed,
                (
                    String::new(),
                    vec![
                        ("get_weather".into(), r#"{"city":"Zürich","days":2}"#.into()),
                        ("now".into(), "{}".into())
                    ],
                    0
                ),
                "{format:?}: {text}"
            );
            assert_eq!(ToolFormat::parse(format.name()), Some(format));
            // A forced opening continued by the model's arguments is one call.
            let forced = format.forced_opening(Some("get_weather"));
            let rest = match format {
                Pythonic => "city='Zürich', days=2)]".to_string(),
                DeepseekV3 => format!("{args}\n```<｜tool▁call▁end｜>"),
                KimiK2 => format!("{args}<|tool_call_end|>"),
                Mistral => format!("{args}}}]"),
                Hermes => format!("{args}}}\n</tool_call>"),
                Llama3 => format!("{args}}}"),
            };
            let parsed = run(format, &[&forced, &rest]);
            assert_eq!(parsed.1.len(), 1, "{format:?}: {forced}{rest}");
            assert_eq!(parsed.1[0].0, "get_weather");
            // What the grammar of optional calls allows: text, then calls each opened by the
            // format's marker.
            if let Some(trigger) = format.call_trigger() {
                assert!(forced.starts_with(trigger), "{format:?}");
                let call = format!("{forced}{rest}");
                let parsed = run(format, &["Let me look. ", &call, "\n", &call]);
                assert_eq!(parsed.0.trim(), "Let me look.", "{format:?}");
                assert_eq!(parsed.1.len(), 2, "{format:?}: {call}");
            }
        }
    }

    #[test]
    fn ids_differ_between_calls_and_requests() {
        assert_ne!(call_id(1, 0), call_id(1, 1));
        assert_ne!(call_id(1, 0), call_id(2, 0));
        assert_ne!(Mistral.call_id(1, 0, "f"), Mistral.call_id(1, 1, "f"));
        assert_eq!(ToolFormat::parse("qwen25"), Some(ToolFormat::Hermes));
        assert_eq!(ToolFormat::parse("nope"), None);
    }
}
