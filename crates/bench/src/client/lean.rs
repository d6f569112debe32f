//! Borrowed views of stream chunks and responses: just the fields the benchmark measures,
//! parsed straight from the network buffer. Unknown fields are skipped without allocating.

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

#[derive(Deserialize)]
pub struct LeanChunk<'a> {
    #[serde(default, borrow)]
    pub choices: Option<FirstChoice<'a>>,
    #[serde(default)]
    pub usage: Option<LeanUsage>,
    #[serde(default, borrow)]
    pub error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
pub struct LeanUsage {
    #[serde(default)]
    pub completion_tokens: u64,
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub prompt_tokens_details: Option<LeanPromptDetails>,
    /// Speculative decoding (SGLang's extension): tokens emitted per verification pass.
    #[serde(default)]
    pub spec_accept_length: Option<f64>,
}

#[derive(Deserialize)]
pub struct LeanPromptDetails {
    #[serde(default)]
    pub cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
pub struct LeanChoice<'a> {
    /// Streamed chat chunks.
    #[serde(default, borrow)]
    pub delta: Option<LeanMessage<'a>>,
    /// Non-streamed chat responses.
    #[serde(default, borrow)]
    pub message: Option<LeanMessage<'a>>,
    /// Legacy completions, streamed or not.
    #[serde(default, borrow)]
    pub text: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
pub struct LeanMessage<'a> {
    #[serde(default, borrow)]
    pub content: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub reasoning_content: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub tool_calls: Option<&'a RawValue>,
}

impl LeanMessage<'_> {
    pub fn has_content(&self) -> bool {
        [self.content, self.reasoning_content, self.tool_calls]
            .into_iter()
            .flatten()
            .any(has_content)
    }
}

/// Whether a raw JSON value carries output: not null, not an empty string or list.
pub fn has_content(raw: &RawValue) -> bool {
    !matches!(raw.get().trim(), "null" | "\"\"" | "[]")
}

/// The first element of `choices`; the others (n > 1) are skipped, so no `Vec` is built.
pub struct FirstChoice<'a>(pub Option<LeanChoice<'a>>);

impl<'de: 'a, 'a> Deserialize<'de> for FirstChoice<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct First<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for First<'a> {
            type Value = FirstChoice<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of choices")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let first = seq.next_element::<LeanChoice<'a>>()?;
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(FirstChoice(first))
            }
        }
        deserializer.deserialize_seq(First(std::marker::PhantomData))
    }
}
