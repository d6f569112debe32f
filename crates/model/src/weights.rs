//! The model's weights: validated descriptors of tensors that stay quantised in the mapped file.

use crate::ModelError;
use crate::config::ModelConfig;
use crate::gguf::{GgmlType, GgufFile};
use kernels::gemm::QMatrix;
use kernels::quant::dequantize;
use std::ops::Range;

/// A weight matrix in the file: `rows` outputs of `cols` inputs, as `dtype` blocks at `range`.
#[derive(Debug, Clone)]
pub struct Linear {
    pub dtype: GgmlType,
    pub rows: usize,
    pub cols: usize,
    range: Range<usize>,
}

impl Linear {
    pub fn matrix<'a>(&self, file: &'a GgufFile) -> QMatrix<'a> {
        QMatrix::new(
            self.dtype,
            self.rows,
            self.cols,
            &file.bytes()[self.range.clone()],
        )
        .expect("shape and type were checked at load")
    }
}

#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: Linear,
    pub wk: Linear,
    pub wv: Linear,
    pub wo: Linear,
    pub ffn_norm: Vec<f32>,
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

#[derive(Debug, Clone)]
pub struct ModelWeights {
    /// Token embeddings (`vocab` rows of `hidden`); also the output head when the model ties them.
    pub embeddings: Linear,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    pub output: Linear,
}

fn linear(file: &GgufFile, name: &str, rows: usize, cols: usize) -> Result<Linear, ModelError> {
    let info = file
        .tensor_info(name)
        .ok_or_else(|| ModelError::BadTensor(name.into(), "missing".into()))?;
    if info.shape != [cols, rows] {
        return Err(ModelError::BadTensor(
            name.into(),
            format!("shape {:?}, expected [{cols}, {rows}]", info.shape),
        ));
    }
    QMatrix::new(info.dtype, rows, cols, &file.bytes()[file.data_range(info)])
        .map_err(|e| ModelError::BadTensor(name.into(), e.to_string()))?;
    Ok(Linear {
        dtype: info.dtype,
        rows,
        cols,
        range: file.data_range(info),
    })
}

/// A vector (norm weights), dequantised to f32.
fn vector(file: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let t = file
        .tensor(name)
        .map_err(|_| ModelError::BadTensor(name.into(), "missing".into()))?;
    if t.info.shape != [len] {
        return Err(ModelError::BadTensor(
            name.into(),
            format!("shape {:?}, expected [{len}]", t.info.shape),
        ));
    }
    let mut out = vec![0.0; len];
    dequantize(t.info.dtype, t.bytes, &mut out)
        .map_err(|e| ModelError::BadTensor(name.into(), e.to_string()))?;
    Ok(out)
}

impl ModelWeights {
    /// Finds and checks every tensor of a llama-style model.
    pub fn load(file: &GgufFile, cfg: &ModelConfig) -> Result<Self, ModelError> {
        let (h, kv, ffn) = (cfg.hidden, cfg.kv_dim(), cfg.ffn_hidden);
        let embeddings = linear(file, "token_embd.weight", cfg.vocab_size, h)?;
        let output = if file.tensor_info("output.weight").is_some() {
            linear(file, "output.weight", cfg.vocab_size, h)?
        } else {
            embeddings.clone()
        };
        let layers = (0..cfg.n_layers)
            .map(|i| {
                let p = |s: &str| format!("blk.{i}.{s}");
                Ok(LayerWeights {
                    attn_norm: vector(file, &p("attn_norm.weight"), h)?,
                    wq: linear(file, &p("attn_q.weight"), h, h)?,
                    wk: linear(file, &p("attn_k.weight"), kv, h)?,
                    wv: linear(file, &p("attn_v.weight"), kv, h)?,
                    wo: linear(file, &p("attn_output.weight"), h, h)?,
                    ffn_norm: vector(file, &p("ffn_norm.weight"), h)?,
                    gate: linear(file, &p("ffn_gate.weight"), ffn, h)?,
                    up: linear(file, &p("ffn_up.weight"), ffn, h)?,
                    down: linear(file, &p("ffn_down.weight"), h, ffn)?,
                })
            })
            .collect::<Result<_, ModelError>>()?;
        Ok(Self {
            embeddings,
            layers,
            output_norm: vector(file, "output_norm.weight", h)?,
            output,
        })
    }
}
