//! The model runtime: GGUF files, tokenizer and chat template from their metadata, the model's
//! configuration and weights, the batched runner over a paged KV store, and the sampler.

pub mod chat_template;
pub mod config;
pub mod gguf;
mod kv_store;
mod layers;
pub mod runner;
pub mod sampler;
pub mod weights;

pub use config::ModelConfig;
pub use kernels::attention::KvDtype;
pub use kernels::quant::ActMode;
pub use runner::{Capture, Logits, LogitsFor, Model, Runner, SeqInput, Tree};

/// Why a model cannot be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    #[error("architecture `{0}` is not supported (supported: {supported})", supported = config::supported_architectures().join(", "))]
    UnsupportedArchitecture(String),
    #[error("model configuration: {0}")]
    BadConfig(String),
    #[error("tensor `{0}`: {1}")]
    BadTensor(String, String),
    #[error("bad batch: {0}")]
    BadBatch(String),
}
pub mod tokenizer;
