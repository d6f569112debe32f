//! `POST /v1/embeddings` on the wire: the request (read strictly: an unknown field is refused by
//! name) and the response.

use crate::request::{FieldError, FromBody};
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingRequest {
    pub model: Option<String>,
    pub input: Option<EmbeddingInput>,
    /// `float` (the default) or `base64` (little-endian f32 bytes).
    pub encoding_format: Option<String>,
    /// The leading dimensions to keep (then normalised again).
    pub dimensions: Option<i64>,
    /// Accepted and not used.
    pub user: Option<String>,
}

impl FromBody for EmbeddingRequest {
    fn from_body(body: Value) -> Result<Self, FieldError> {
        crate::request::read(body)
    }
}

/// `input`: a text, texts, token ids, or lists of token ids.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "Value")]
pub enum EmbeddingInput {
    Texts(Vec<String>),
    Tokens(Vec<Vec<u32>>),
}

impl TryFrom<Value> for EmbeddingInput {
    type Error = String;

    fn try_from(v: Value) -> Result<Self, String> {
        let expected = || {
            "expected a string, a list of strings, a list of token ids or a list of lists of token ids"
                .to_string()
        };
        let ids = |v: &[Value]| -> Option<Vec<u32>> {
            v.iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect()
        };
        match v {
            Value::String(s) => Ok(Self::Texts(vec![s])),
            Value::Array(items) => match items.first() {
                None => Ok(Self::Texts(Vec::new())),
                Some(Value::String(_)) => items
                    .into_iter()
                    .map(|v| match v {
                        Value::String(s) => Ok(s),
                        _ => Err(expected()),
                    })
                    .collect::<Result<_, _>>()
                    .map(Self::Texts),
                Some(Value::Number(_)) => ids(&items)
                    .map(|t| Self::Tokens(vec![t]))
                    .ok_or_else(expected),
                Some(Value::Array(_)) => items
                    .iter()
                    .map(|v| v.as_array().and_then(|a| ids(a)).ok_or_else(expected))
                    .collect::<Result<_, _>>()
                    .map(Self::Tokens),
                Some(_) => Err(expected()),
            },
            _ => Err(expected()),
        }
    }
}

/// The response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingResponse {
    pub object: String,
    pub data: Vec<Embedding>,
    pub model: String,
    pub usage: EmbeddingUsage,
    /// How a text's hidden states became its vector (`last`: the last token's), and that the
    /// vectors have unit length.
    pub pooling: String,
    pub normalized: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Embedding {
    pub object: String,
    pub index: usize,
    /// Numbers, or their little-endian f32 bytes in base64.
    pub embedding: Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct EmbeddingUsage {
    pub prompt_tokens: u64,
    pub total_tokens: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_input_form_reads_and_others_are_refused() {
        let read = |v: Value| EmbeddingInput::try_from(v);
        assert_eq!(
            read(json!("a")),
            Ok(EmbeddingInput::Texts(vec!["a".into()]))
        );
        assert_eq!(
            read(json!(["a", "b"])).unwrap(),
            EmbeddingInput::Texts(vec!["a".into(), "b".into()])
        );
        assert_eq!(
            read(json!([1, 2])),
            Ok(EmbeddingInput::Tokens(vec![vec![1, 2]]))
        );
        assert_eq!(
            read(json!([[1], [2, 3]])),
            Ok(EmbeddingInput::Tokens(vec![vec![1], vec![2, 3]]))
        );
        for bad in [
            json!(["a", 1]),
            json!([-1]),
            json!([[1], "a"]),
            json!(5),
            json!([{}]),
        ] {
            assert!(read(bad.clone()).is_err(), "{bad}");
        }
    }
}
