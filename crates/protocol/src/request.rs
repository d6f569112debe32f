//! The routes' requests as types: [`ChatCompletionRequest`] and [`CompletionRequest`], each
//! with the [`GenerationFields`] both share, and the tokenizer's [`TokenizeRequest`] and
//! [`DetokenizeRequest`]. [`parse`] reads one from
//! a JSON body and reports a mistake at its path (`tools[0].function.name`), in words a client
//! understands ("expected a number", not "expected f64").
//!
//! The types hold what was sent, checked for its JSON shape; ranges, limits and the rules
//! between fields (`top_logprobs` needs `logprobs`, a named `tool_choice` must be offered) are
//! the server's, which knows the model. A field no type names is neither read nor refused here:
//! the server decides what an unknown field means (`field_names` lists the known ones).

use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// What every generating route reads: OpenAI's sampling and output fields, vLLM's and SGLang's
/// (`top_k`, `min_p`, `repetition_penalty`, `stop_token_ids`, `ignore_eos`, `regex`, `ebnf`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GenerationFields {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub n: Option<i64>,
    /// Token ids (the object's keys, as OpenAI spells them) to biases.
    pub logit_bias: Option<BTreeMap<String, f64>>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub ignore_eos: Option<bool>,
    pub response_format: Option<ResponseFormat>,
    pub regex: Option<String>,
    pub ebnf: Option<String>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatCompletionRequest {
    /// Read from the same object by [`parse`] (not nested in the JSON).
    #[serde(skip)]
    pub generation: GenerationFields,
    /// Each message as sent: the chat template reads them as JSON.
    pub messages: Option<Vec<Value>>,
    pub max_completion_tokens: Option<i64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub tools: Option<Vec<Tool>>,
    pub tool_choice: Option<ToolChoice>,
    pub parallel_tool_calls: Option<bool>,
    pub add_generation_prompt: Option<bool>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// SGLang's: the reasoning parser's output as `reasoning_content` (default true).
    pub separate_reasoning: Option<bool>,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// Read from the same object by [`parse`] (not nested in the JSON).
    #[serde(skip)]
    pub generation: GenerationFields,
    pub prompt: Option<Prompt>,
    pub echo: Option<bool>,
    pub best_of: Option<i64>,
    pub suffix: Option<String>,
    /// How many top log-probabilities each token reports.
    pub logprobs: Option<i64>,
}

/// `stop`: one string or a list of them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "Value")]
pub struct Stop(pub Vec<String>);

impl TryFrom<Value> for Stop {
    type Error = String;

    fn try_from(v: Value) -> Result<Self, String> {
        let expected = || "expected a string or a list of strings".to_string();
        match v {
            Value::String(s) => Ok(Self(vec![s])),
            Value::Array(items) => items
                .into_iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s),
                    _ => Err(expected()),
                })
                .collect::<Result<_, _>>()
                .map(Self),
            _ => Err(expected()),
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// `response_format`: its `type` (`text`, `json_object`, `json_schema`, `structural_tag`) and
/// the fields of the type that has them; which types exist is the server's to say.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    pub json_schema: Option<JsonSchemaFormat>,
    /// SGLang's `structural_tag`: the structures, each opened by one of the triggers.
    pub structures: Option<Vec<TaggedStructure>>,
    pub triggers: Option<Vec<String>>,
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, Deserialize)]
pub struct JsonSchemaFormat {
    pub name: Option<String>,
    pub description: Option<String>,
    /// A JSON Schema (an object, or `true` for any JSON value).
    pub schema: Option<Value>,
    pub strict: Option<bool>,
}

/// One structure of a `structural_tag`.
#[derive(Debug, Clone, Deserialize)]
pub struct TaggedStructure {
    pub begin: Option<String>,
    pub schema: Option<Value>,
    pub end: Option<String>,
}

/// A tool the model may call: `{"type": "function", "function": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDefinition,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionDefinition {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The arguments' JSON Schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Map<String, Value>>,
    /// Whether the arguments must follow `parameters` exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "Value")]
pub enum ToolChoice {
    /// The model may not call tools: they are not in the prompt and output is not parsed.
    None,
    Auto,
    /// At least one call.
    Required,
    /// A call of this function: `{"type": "function", "function": {"name": ...}}`.
    Function(String),
}

impl TryFrom<Value> for ToolChoice {
    type Error = String;

    fn try_from(v: Value) -> Result<Self, String> {
        match v {
            Value::String(s) => match s.as_str() {
                "none" => Ok(Self::None),
                "auto" => Ok(Self::Auto),
                "required" => Ok(Self::Required),
                other => Err(format!(
                    "expected none, auto, required or {{\"type\": \"function\", \"function\": {{\"name\": …}}}}, got `{other}`"
                )),
            },
            Value::Object(o) => o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| o.get("type").and_then(Value::as_str) == Some("function"))
                .map(|name| Self::Function(name.to_string()))
                .ok_or_else(|| {
                    "a named tool choice is {\"type\": \"function\", \"function\": {\"name\": …}}"
                        .to_string()
                }),
            _ => Err("expected a string or an object".into()),
        }
    }
}

/// `prompt`: a string, a list of strings, token ids, or a list of token-id lists.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "Value")]
pub struct Prompt(pub Vec<PromptInput>);

/// One prompt of a request.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Ids(Vec<u32>),
}

impl TryFrom<Value> for Prompt {
    type Error = String;

    fn try_from(v: Value) -> Result<Self, String> {
        let not_a_prompt = || "expected a string, a list of strings, or token ids".to_string();
        let ids = token_ids;
        match v {
            Value::String(s) => Ok(Self(vec![PromptInput::Text(s)])),
            Value::Array(items) if !items.is_empty() => {
                if items.iter().all(Value::is_number) {
                    return Ok(Self(vec![PromptInput::Ids(ids(&items)?)]));
                }
                items
                    .into_iter()
                    .map(|item| match item {
                        Value::String(s) => Ok(PromptInput::Text(s)),
                        Value::Array(inner) => Ok(PromptInput::Ids(ids(&inner)?)),
                        _ => Err(not_a_prompt()),
                    })
                    .collect::<Result<_, _>>()
                    .map(Self)
            }
            _ => Err(not_a_prompt()),
        }
    }
}

/// `POST /tokenize` (and `/v1/tokenize`): llama-server's `content`, vLLM's and SGLang's `prompt`
/// (a list of strings too, SGLang's batch), or vLLM's `messages` rendered by the chat template;
/// each peer's flags under its own name.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub content: Option<String>,
    pub prompt: Option<Prompt>,
    pub messages: Option<Vec<Value>>,
    pub add_generation_prompt: Option<bool>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// llama-server's name for `add_special_tokens`.
    pub add_special: Option<bool>,
    pub add_special_tokens: Option<bool>,
    pub parse_special: Option<bool>,
    pub with_pieces: Option<bool>,
    pub return_token_strs: Option<bool>,
}

/// `POST /detokenize` (and `/v1/detokenize`): token ids, or a list of lists (SGLang's batch).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Option<TokenLists>,
    pub skip_special_tokens: Option<bool>,
}

/// `tokens`: one list of ids (`batch` false) or a list of them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "Value")]
pub struct TokenLists {
    pub lists: Vec<Vec<u32>>,
    pub batch: bool,
}

impl TryFrom<Value> for TokenLists {
    type Error = String;

    fn try_from(v: Value) -> Result<Self, String> {
        let Value::Array(items) = v else {
            return Err("expected a list of token ids".into());
        };
        if items.iter().all(Value::is_array) && !items.is_empty() {
            let lists = items
                .into_iter()
                .map(|l| match l {
                    Value::Array(ids) => token_ids(&ids),
                    _ => unreachable!("checked to be lists"),
                })
                .collect::<Result<_, _>>()?;
            return Ok(Self { lists, batch: true });
        }
        Ok(Self {
            lists: vec![token_ids(&items)?],
            batch: false,
        })
    }
}

fn token_ids(items: &[Value]) -> Result<Vec<u32>, String> {
    items
        .iter()
        .map(|t| {
            t.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| "token ids must be integers below 2^32".to_string())
        })
        .collect()
}

/// A body that is not the request its route takes: where (`None`: the body itself) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The top-level field the mistake is in (OpenAI's error `param`).
    pub param: Option<String>,
    /// The path to the value at fault, and what is wrong with it.
    pub message: String,
}

/// A request read from a JSON body (`null` counts as absent everywhere).
pub trait FromBody: Sized {
    /// Reads the request from the body's object.
    fn from_body(body: Value) -> Result<Self, FieldError>;
}

impl FromBody for ChatCompletionRequest {
    fn from_body(body: Value) -> Result<Self, FieldError> {
        let generation = read(&body)?;
        Ok(Self {
            generation,
            ..read(body)?
        })
    }
}

impl FromBody for TokenizeRequest {
    fn from_body(body: Value) -> Result<Self, FieldError> {
        read(body)
    }
}

impl FromBody for DetokenizeRequest {
    fn from_body(body: Value) -> Result<Self, FieldError> {
        read(body)
    }
}

impl FromBody for CompletionRequest {
    fn from_body(body: Value) -> Result<Self, FieldError> {
        let generation = read(&body)?;
        Ok(Self {
            generation,
            ..read(body)?
        })
    }
}

/// A request of type `T` read from `body`.
pub fn parse<T: FromBody>(body: Value) -> Result<T, FieldError> {
    T::from_body(body)
}

/// `T` from `de`, a mistake reported with its path.
pub(crate) fn read<'de, T: Deserialize<'de>, D>(de: D) -> Result<T, FieldError>
where
    D: Deserializer<'de, Error = serde_json::Error>,
{
    serde_path_to_error::deserialize(de).map_err(|e| {
        let param = e.path().iter().find_map(|s| match s {
            serde_path_to_error::Segment::Map { key } => Some(key.clone()),
            _ => None,
        });
        let why = plain_words(&e.inner().to_string());
        let message = match &param {
            Some(_) => format!("`{}`: {why}", e.path()),
            None => why,
        };
        FieldError { param, message }
    })
}

/// serde's words for the JSON a type takes, as a client would say them.
fn plain_words(message: &str) -> String {
    const WORDS: &[(&str, &str)] = &[
        ("expected f64", "expected a number"),
        ("expected f32", "expected a number"),
        ("expected i64", "expected an integer"),
        ("expected u32", "expected an integer from 0 to 4294967295"),
        ("expected a sequence", "expected a list"),
        ("expected a map", "expected an object"),
    ];
    let mut out = message.to_string();
    for (rust, plain) in WORDS {
        out = out.replace(rust, plain);
    }
    if let Some(i) = out.find("expected struct ") {
        out.replace_range(i.., "expected an object");
    }
    out
}

/// The top-level fields `T` reads, as its `Deserialize` declares them.
pub fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    let mut names = FieldNames(&[]);
    let _ = T::deserialize(&mut names);
    names.0
}

/// A deserializer that only notes the fields of the struct asked of it.
struct FieldNames(&'static [&'static str]);

impl<'de> Deserializer<'de> for &mut FieldNames {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        self.0 = fields;
        Err(de::Error::custom("only the field names are read"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(body: Value) -> Result<ChatCompletionRequest, FieldError> {
        parse(body)
    }

    #[test]
    fn both_halves_of_a_request_come_from_the_one_object() {
        let r = chat(
            json!({"messages": [{"role": "user", "content": "hi"}], "temperature": 0.5,
            "stop": "x", "tool_choice": "required", "logprobs": true, "top_k": null}),
        )
        .unwrap();
        assert_eq!(r.generation.temperature, Some(0.5));
        assert_eq!(r.generation.stop, Some(Stop(vec!["x".into()])));
        assert_eq!(r.generation.top_k, None);
        assert_eq!(
            (r.tool_choice, r.logprobs, r.messages.map(|m| m.len())),
            (Some(ToolChoice::Required), Some(true), Some(1))
        );
        let c: CompletionRequest = parse(json!({"prompt": [[1, 2], "a"], "logprobs": 2})).unwrap();
        assert_eq!(
            c.prompt,
            Some(Prompt(vec![
                PromptInput::Ids(vec![1, 2]),
                PromptInput::Text("a".into())
            ]))
        );
        assert_eq!(c.logprobs, Some(2));
    }

    #[test]
    fn a_mistake_names_its_field_and_path_in_plain_words() {
        for (body, param, says) in [
            (
                json!({"temperature": "hot"}),
                "temperature",
                "`temperature`: invalid type: string \"hot\", expected a number",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": 3}}]}),
                "tools",
                "`tools[0].function.name`: invalid type: integer `3`, expected a string",
            ),
            (
                json!({"stop": [1]}),
                "stop",
                "a string or a list of strings",
            ),
            (json!({"messages": "hi"}), "messages", "expected a list"),
            (json!({"stream_options": {"x": 1}}), "stream_options", "`x`"),
            (json!({"tool_choice": "always"}), "tool_choice", "`always`"),
            (
                json!({"response_format": 3}),
                "response_format",
                "an object",
            ),
            (json!({"logit_bias": {"1": "a"}}), "logit_bias", "a number"),
        ] {
            let e = chat(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
            assert!(e.message.contains(says), "{body}: {}", e.message);
        }
        let e = parse::<CompletionRequest>(json!({"prompt": [1, -2]})).unwrap_err();
        assert!(
            e.message.starts_with("`prompt`: token ids"),
            "{}",
            e.message
        );
        let e = chat(json!([1])).unwrap_err();
        assert_eq!(e.param, None);
    }

    #[test]
    fn the_field_names_are_the_ones_each_route_reads() {
        let shared = field_names::<GenerationFields>();
        assert!(shared.contains(&"temperature") && shared.contains(&"ebnf"));
        let chat = field_names::<ChatCompletionRequest>();
        assert!(chat.contains(&"messages") && chat.contains(&"tool_choice"));
        assert!(!chat.contains(&"generation"));
        let completions = field_names::<CompletionRequest>();
        assert!(completions.contains(&"prompt") && !completions.contains(&"messages"));
    }
}
