//! Output parsers between the engine's text and the OpenAI response: reasoning (the thought
//! goes to `reasoning_content`) and tool calls (`tool_calls`), both streaming.

pub mod reasoning;
pub mod tools;

pub use reasoning::{ReasoningFormat, ReasoningParser, Split};
pub use tools::{ToolEvent, ToolFormat, ToolParser};

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
