//! Errors of the tokenizer: what in the GGUF metadata is missing, unsupported or inconsistent.

use crate::gguf::GgufError;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer metadata: {0}")]
    Metadata(#[from] GgufError),
    #[error(
        "unsupported tokenizer model `{0}` (tokenizer.ggml.model); supported: {supported}",
        supported = super::SUPPORTED_MODELS.join(", ")
    )]
    UnsupportedModel(String),
    #[error(
        "unsupported pre-tokenizer `{0}` (tokenizer.ggml.pre); supported: {supported}",
        supported = super::pre::supported_names().join(", ")
    )]
    UnsupportedPreTokenizer(String),
    #[error("invalid tokenizer metadata: {0}")]
    Invalid(String),
    #[error("token id {id} is out of range (vocabulary of {vocab_size})")]
    IdOutOfRange { id: u32, vocab_size: usize },
    #[error("the model adds a {0} token but has none")]
    MissingSpecialToken(&'static str),
    #[error("tokenizers: {0}")]
    Backend(String),
}
