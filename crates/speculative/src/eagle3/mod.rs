//! EAGLE-3 draft heads: one decoder layer that reads three of the target's hidden states (fused
//! by `fc`) beside the token's embedding and proposes tokens over a reduced vocabulary. This
//! module loads a head in SGLang's checkpoint layout (a folder with `config.json` and
//! safetensors: `fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`) or llama.cpp's GGUF form
//! (`gguf.rs`), checked against its target, and runs its forward pass (`forward.rs`, batched in `batched.rs`; row by row in `reference`).

mod batched;
mod config;
mod drafter;
mod forward;
mod gguf;
pub mod reference;
mod save;

pub use config::{Eagle3Config, TargetShape, default_capture_layers};
pub use drafter::{Eagle3Drafter, MAX_PENDING_ROWS, TokenEmbedding};
pub use forward::{HeadOutput, Projected};
pub use gguf::TargetOutput;
pub use save::WeightDtype;

use kernels::quant::{GgmlType, dequantize};
use safetensors::{Dtype, SafeTensors};
use std::path::Path;

/// Why a head cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum Eagle3Error {
    #[error("cannot read {path}: {message}")]
    Io { path: String, message: String },
    #[error("EAGLE-3 head config.json: {0}")]
    Config(String),
    #[error("EAGLE-3 head does not fit the target model: {0}")]
    WrongTarget(String),
    #[error("EAGLE-3 head weights: {0}")]
    Weights(String),
}

/// A row-major f32 matrix (`rows` outputs of `cols` inputs, torch's `[out, in]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

/// A loaded head: weights widened to f32, and the draft vocabulary's target ids.
#[derive(Debug, Clone)]
pub struct Eagle3Head {
    pub config: Eagle3Config,
    /// `[hidden, 3 × target_hidden]`: the three captured states (low, mid, high) to one.
    pub fc: Matrix,
    /// RMSNorm weights of the token embedding's half and of the feature's half.
    pub input_norm: Vec<f32>,
    pub hidden_norm: Vec<f32>,
    /// Attention over `[embedding ; feature]` (`2 × hidden` inputs).
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub wo: Matrix,
    pub post_attention_norm: Vec<f32>,
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
    pub norm: Vec<f32>,
    /// `[draft_vocab, hidden]`.
    pub lm_head: Matrix,
    /// Draft token `i`'s id in the target's vocabulary (`i + d2t[i]`).
    pub draft_to_target: Vec<u32>,
    /// The head's own token embedding, if it ships one (else it borrows the target's).
    pub embed: Option<Matrix>,
}

impl Eagle3Head {
    /// Loads a head from a GGUF file or an SGLang folder, for `target` (whose output layer a
    /// GGUF head without one borrows).
    pub fn open(
        path: &Path,
        target: TargetShape,
        output: Option<TargetOutput<'_>>,
    ) -> Result<Self, Eagle3Error> {
        if path.is_file() {
            Self::load_gguf(path, target, output)
        } else {
            Self::load(path, target)
        }
    }

    /// Loads the head in `dir` (`config.json` and every `*.safetensors` there) for `target`.
    pub fn load(dir: &Path, target: TargetShape) -> Result<Self, Eagle3Error> {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|e| Eagle3Error::Io {
                path: p.display().to_string(),
                message: e.to_string(),
            })
        };
        let text = read(&dir.join("config.json"))?;
        let config = Eagle3Config::parse(&String::from_utf8_lossy(&text), target)?;
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| Eagle3Error::Io {
                path: dir.display().to_string(),
                message: e.to_string(),
            })?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(Eagle3Error::Weights(format!(
                "no .safetensors file in {}",
                dir.display()
            )));
        }
        let blobs: Vec<Vec<u8>> = files.iter().map(|p| read(p)).collect::<Result<_, _>>()?;
        let named: Vec<(String, &[u8])> = files
            .iter()
            .zip(&blobs)
            .map(|(p, b)| (p.display().to_string(), b.as_slice()))
            .collect();
        Self::from_parts(config, &named)
    }

    /// A head from its checked configuration and its safetensors files' bytes (each with a
    /// name for errors): what [`Eagle3Head::load`] reads, or a head built into a binary.
    pub fn from_parts(
        config: Eagle3Config,
        files: &[(String, &[u8])],
    ) -> Result<Self, Eagle3Error> {
        let tensors: Vec<SafeTensors<'_>> = files
            .iter()
            .map(|(name, b)| {
                SafeTensors::deserialize(b)
                    .map_err(|e| Eagle3Error::Weights(format!("{name}: {e}")))
            })
            .collect::<Result<_, _>>()?;
        Self::from_tensors(config, &Tensors(tensors))
    }

    fn from_tensors(config: Eagle3Config, t: &Tensors<'_>) -> Result<Self, Eagle3Error> {
        let c = &config;
        let (h, q, kv) = (c.hidden, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
        let m = |name: &str, rows: usize, cols: usize| t.matrix(name, rows, cols);
        let v = |name: &str, len: usize| t.matrix(name, 1, len).map(|m| m.data);
        let attn = "midlayer.self_attn.";
        let mlp = "midlayer.mlp.";
        let head = Self {
            fc: m("fc.weight", h, 3 * c.target_hidden)?,
            input_norm: v("midlayer.input_layernorm.weight", h)?,
            hidden_norm: v("midlayer.hidden_norm.weight", h)?,
            wq: m(&format!("{attn}q_proj.weight"), q, 2 * h)?,
            wk: m(&format!("{attn}k_proj.weight"), kv, 2 * h)?,
            wv: m(&format!("{attn}v_proj.weight"), kv, 2 * h)?,
            wo: m(&format!("{attn}o_proj.weight"), h, q)?,
            post_attention_norm: v("midlayer.post_attention_layernorm.weight", h)?,
            gate: m(&format!("{mlp}gate_proj.weight"), c.intermediate, h)?,
            up: m(&format!("{mlp}up_proj.weight"), c.intermediate, h)?,
            down: m(&format!("{mlp}down_proj.weight"), h, c.intermediate)?,
            norm: v("norm.weight", h)?,
            lm_head: m("lm_head.weight", c.draft_vocab, h)?,
            draft_to_target: t.draft_to_target(c.draft_vocab, c.vocab)?,
            embed: match t.find("embed_tokens.weight") {
                Some(_) => Some(m("embed_tokens.weight", c.vocab, h)?),
                None => None,
            },
            config,
        };
        Ok(head)
    }
}

/// The tensors of a checkpoint's files, found by name (with or without a `model.` prefix).
struct Tensors<'a>(Vec<SafeTensors<'a>>);

impl<'a> Tensors<'a> {
    fn find(&self, name: &str) -> Option<safetensors::tensor::TensorView<'a>> {
        let prefixed = format!("model.{name}");
        self.0
            .iter()
            .find_map(|f| f.tensor(name).or_else(|_| f.tensor(&prefixed)).ok())
    }

    fn get(&self, name: &str) -> Result<safetensors::tensor::TensorView<'a>, Eagle3Error> {
        self.find(name)
            .ok_or_else(|| Eagle3Error::Weights(format!("{name} is missing")))
    }

    /// A float tensor of `rows × cols` values (a vector as `1 × cols`), widened to f32.
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix, Eagle3Error> {
        let t = self.get(name)?;
        let want: Vec<usize> = if rows == 1 {
            vec![cols]
        } else {
            vec![rows, cols]
        };
        if t.shape() != want.as_slice() {
            return Err(Eagle3Error::Weights(format!(
                "{name} has shape {:?}, the config needs {want:?}",
                t.shape()
            )));
        }
        let dtype = match t.dtype() {
            Dtype::F32 => GgmlType::F32,
            Dtype::F16 => GgmlType::F16,
            Dtype::BF16 => GgmlType::BF16,
            other => {
                return Err(Eagle3Error::Weights(format!(
                    "{name} is {other:?}; weights must be F32, F16 or BF16"
                )));
            }
        };
        let mut data = vec![0.0; rows * cols];
        dequantize(dtype, t.data(), &mut data)
            .map_err(|e| Eagle3Error::Weights(format!("{name}: {e}")))?;
        Ok(Matrix { rows, cols, data })
    }

    /// `d2t` (offsets: draft token `i` is target token `i + d2t[i]`) as target ids, each checked.
    fn draft_to_target(&self, draft_vocab: usize, vocab: usize) -> Result<Vec<u32>, Eagle3Error> {
        let t = self.get("d2t")?;
        if t.shape() != [draft_vocab] {
            return Err(Eagle3Error::Weights(format!(
                "d2t has shape {:?}, the config needs [{draft_vocab}]",
                t.shape()
            )));
        }
        let offsets = match t.dtype() {
            Dtype::I64 => read_integers(t.data(), true),
            Dtype::I32 => read_integers(t.data(), false),
            other => {
                return Err(Eagle3Error::Weights(format!(
                    "d2t is {other:?}; it must be I64 or I32"
                )));
            }
        };
        let ids: Vec<i64> = offsets
            .iter()
            .enumerate()
            .map(|(i, &d)| (i as i64).saturating_add(d))
            .collect();
        checked_target_ids(&ids, vocab)
    }
}

/// Little-endian integers of 8 bytes (`wide`) or 4, as i64.
fn read_integers(bytes: &[u8], wide: bool) -> Vec<i64> {
    if wide {
        bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect()
    } else {
        bytes
            .chunks_exact(4)
            .map(|c| i64::from(i32::from_le_bytes(c.try_into().expect("4 bytes"))))
            .collect()
    }
}

/// Draft token `i`'s target id `ids[i]`, each checked to lie in the target's vocabulary.
fn checked_target_ids(ids: &[i64], vocab: usize) -> Result<Vec<u32>, Eagle3Error> {
    ids.iter()
        .enumerate()
        .map(|(i, &id)| {
            u32::try_from(id)
                .ok()
                .filter(|&id| (id as usize) < vocab)
                .ok_or_else(|| {
                    Eagle3Error::Weights(format!(
                        "d2t maps draft token {i} to {id}, outside the target's {vocab} tokens"
                    ))
                })
        })
        .collect()
}

#[cfg(test)]
mod tests;
