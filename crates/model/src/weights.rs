//! The model's weights: validated descriptors of tensors that stay quantised in the mapped file.

use crate::ModelError;
use crate::config::{Arch, ModelConfig};
use crate::gguf::{GgmlType, GgufFile};
use kernels::gemm::{PackedMatrix, QMatrix};
use kernels::quant::dequantize;
use rayon::prelude::*;
use std::ops::Range;
use std::sync::Arc;

/// A weight matrix in the file: `rows` outputs of `cols` inputs, as `dtype` blocks at `range`,
/// and its copy in the AVX-512 kernels' panel layout where those kernels run.
#[derive(Debug, Clone)]
pub struct Linear {
    pub dtype: GgmlType,
    pub rows: usize,
    pub cols: usize,
    range: Range<usize>,
    packed: Option<Arc<PackedMatrix>>,
}

impl Linear {
    pub fn matrix<'a>(&'a self, file: &'a GgufFile) -> QMatrix<'a> {
        let m = QMatrix::new(
            self.dtype,
            self.rows,
            self.cols,
            &file.bytes()[self.range.clone()],
        )
        .expect("shape and type were checked at load");
        match &self.packed {
            Some(p) => m.with_packed(p),
            None => m,
        }
    }

    /// Bytes of the packed copy (0 without one).
    pub fn packed_bytes(&self) -> usize {
        self.packed.as_ref().map_or(0, |p| p.bytes())
    }

    /// Bytes a product reads: the packed copy, or the GGUF blocks where there is none.
    pub fn read_bytes(&self) -> usize {
        self.packed.as_ref().map_or(self.range.len(), |p| p.bytes())
    }
}

/// See [`ModelWeights::product_costs`].
#[derive(Debug, Clone, Copy)]
pub struct ProductCosts {
    pub layer_macs: usize,
    pub head_macs: usize,
    pub read_bytes: usize,
}

#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: Linear,
    pub wk: Linear,
    pub wv: Linear,
    /// Biases added to the products above (qwen2), each as long as its product's output.
    pub qkv_bias: Option<[Vec<f32>; 3]>,
    /// RMS norm weights over each query and each key head, before RoPE (qwen3, gemma3):
    /// `head_dim` long.
    pub qk_norm: Option<[Vec<f32>; 2]>,
    /// RMS norm weights over the attention's and the feed-forward's outputs before they are
    /// added to the residual stream (gemma3).
    pub post_norms: Option<[Vec<f32>; 2]>,
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
    /// Divisors of each RoPE pair's frequency (`rope_freqs.weight`: Llama 3's scaling, which
    /// converters store as a tensor), `rope_dims / 2` long.
    pub rope_freqs: Option<Vec<f32>>,
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
        packed: None,
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

/// Whether an architecture has a group of vectors (all of them or none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    Required,
    /// Loaded when the file has any of them (then it must have all).
    Optional,
    /// A file that has them is refused rather than silently run without them.
    Unused,
}

fn vectors<const N: usize>(
    file: &GgufFile,
    names: [String; N],
    len: [usize; N],
    need: Need,
    arch: Arch,
) -> Result<Option<[Vec<f32>; N]>, ModelError> {
    let present = names.iter().find(|n| file.tensor_info(n).is_some());
    match (need, present) {
        (Need::Unused, Some(n)) => Err(ModelError::BadTensor(
            n.clone(),
            format!("not used by a {} model", arch.name()),
        )),
        (Need::Unused, None) | (Need::Optional, None) => Ok(None),
        (Need::Required, _) | (Need::Optional, Some(_)) => {
            let mut out = Vec::with_capacity(N);
            for (name, len) in names.iter().zip(len) {
                out.push(vector(file, name, len)?);
            }
            Ok(out.try_into().ok())
        }
    }
}

impl ModelWeights {
    /// Finds and checks every tensor of the model's architecture.
    pub fn load(file: &GgufFile, cfg: &ModelConfig) -> Result<Self, ModelError> {
        let (h, kv, ffn) = (cfg.hidden, cfg.kv_dim(), cfg.ffn_hidden);
        let (q, hd) = (cfg.q_dim(), cfg.head_dim);
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
                    wq: linear(file, &p("attn_q.weight"), q, h)?,
                    wk: linear(file, &p("attn_k.weight"), kv, h)?,
                    wv: linear(file, &p("attn_v.weight"), kv, h)?,
                    qkv_bias: vectors(
                        file,
                        ["attn_q.bias", "attn_k.bias", "attn_v.bias"].map(p),
                        [q, kv, kv],
                        match cfg.arch {
                            Arch::Qwen2 => Need::Required,
                            Arch::Llama => Need::Optional,
                            Arch::Qwen3 | Arch::Gemma3 => Need::Unused,
                        },
                        cfg.arch,
                    )?,
                    qk_norm: vectors(
                        file,
                        ["attn_q_norm.weight", "attn_k_norm.weight"].map(p),
                        [hd, hd],
                        match cfg.arch {
                            Arch::Qwen3 | Arch::Gemma3 => Need::Required,
                            Arch::Llama | Arch::Qwen2 => Need::Unused,
                        },
                        cfg.arch,
                    )?,
                    post_norms: vectors(
                        file,
                        ["post_attention_norm.weight", "post_ffw_norm.weight"].map(p),
                        [h, h],
                        match cfg.arch {
                            Arch::Gemma3 => Need::Required,
                            _ => Need::Unused,
                        },
                        cfg.arch,
                    )?,
                    wo: linear(file, &p("attn_output.weight"), h, q)?,
                    ffn_norm: vector(file, &p("ffn_norm.weight"), h)?,
                    gate: linear(file, &p("ffn_gate.weight"), ffn, h)?,
                    up: linear(file, &p("ffn_up.weight"), ffn, h)?,
                    down: linear(file, &p("ffn_down.weight"), h, ffn)?,
                })
            })
            .collect::<Result<_, ModelError>>()?;
        let mut weights = Self {
            embeddings,
            layers,
            output_norm: vector(file, "output_norm.weight", h)?,
            output,
            rope_freqs: vectors(
                file,
                ["rope_freqs.weight".to_string()],
                [cfg.rope_dims / 2],
                Need::Optional,
                cfg.arch,
            )?
            .map(|[f]| f),
        };
        if let Some(f) = &weights.rope_freqs
            && let Some(bad) = f.iter().find(|v| !(v.is_finite() && **v > 0.0))
        {
            return Err(ModelError::BadTensor(
                "rope_freqs.weight".into(),
                format!("frequency divisor {bad} is not a positive number"),
            ));
        }
        weights.pack(file);
        Ok(weights)
    }

    /// Every product's weights, mutably (not the embeddings: they are only looked up by row).
    fn products_mut(&mut self) -> impl Iterator<Item = &mut Linear> {
        self.layers
            .iter_mut()
            .flat_map(|l| {
                [
                    &mut l.wq,
                    &mut l.wk,
                    &mut l.wv,
                    &mut l.wo,
                    &mut l.gate,
                    &mut l.up,
                    &mut l.down,
                ]
            })
            .chain(std::iter::once(&mut self.output))
    }

    /// Copies the products' weights into the packed layout where this CPU's kernels read one
    /// (in parallel), releasing the mapped pages of each as soon as it is copied, so resident
    /// memory holds about one copy of the weights even while loading.
    fn pack(&mut self, file: &GgufFile) {
        let mut all: Vec<&mut Linear> = self.products_mut().collect();
        // Largest first, taken in that order as threads come free: while a tensor is copied its
        // mapped pages and its copy are both resident, so the big ones (an output head of
        // 144 MB) go while little else is packed yet, and the peak stays near the final size.
        all.sort_by_key(|l| std::cmp::Reverse(l.range.len()));
        kernels::threads::run(|| {
            all.into_iter().par_bridge().for_each(|l| {
                l.packed = PackedMatrix::for_this_cpu(&l.matrix(file)).map(Arc::new);
                if l.packed.is_some() {
                    file.release(l.range.clone());
                }
            });
        });
    }

    /// Every layer's products (not the output head).
    fn layer_products(&self) -> impl Iterator<Item = &Linear> {
        self.layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down])
    }

    /// Every product, the output head last.
    fn products(&self) -> impl Iterator<Item = &Linear> {
        self.layer_products().chain(std::iter::once(&self.output))
    }

    /// What one token costs the matrix products: multiply-adds in the layers and in the output
    /// head, and the bytes of weights a step reads (each matrix once, whatever the batch).
    pub fn product_costs(&self) -> ProductCosts {
        ProductCosts {
            layer_macs: self.layer_products().map(|l| l.rows * l.cols).sum(),
            head_macs: self.output.rows * self.output.cols,
            read_bytes: self.products().map(Linear::read_bytes).sum(),
        }
    }

    /// Whether every product (the output head's too) has a packed copy.
    pub fn all_packed(&self) -> bool {
        self.products().all(|l| l.packed.is_some())
    }

    /// Bytes of the packed copies.
    pub fn packed_bytes(&self) -> usize {
        self.products().map(Linear::packed_bytes).sum()
    }
}
