//! The batched forward pass: a mixed batch of sequences (prefill chunks and single decode tokens
//! at any positions) in, logits out, with keys and values in a paged KV store.
//!
//! Every operation works row by row (a row is one token of one sequence), and the matrix
//! products fix their reduction order per output element, so a sequence's logits are bitwise the
//! same alone, in any batch, as a prefill chunk or token by token.

use crate::ModelError;
use crate::config::ModelConfig;
use crate::gguf::GgufFile;
use crate::weights::ModelWeights;
use kernels::attention::{KvShape, paged_attention, write_kv};
use kernels::gemm::{Activations, gemm, gemm_many};
use kernels::ops::{add_assign, rms_norm, rope_angles, rope_apply, silu_mul};
use kernels::quant::dequantize;
use rayon::prelude::*;
use std::path::Path;

/// A loaded model: the mapped file, its configuration and weight descriptors.
#[derive(Debug)]
pub struct Model {
    pub file: GgufFile,
    pub config: ModelConfig,
    pub weights: ModelWeights,
}

impl Model {
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        let file = GgufFile::open(path)?;
        Self::from_file(file)
    }

    pub fn from_file(file: GgufFile) -> Result<Self, ModelError> {
        let config = ModelConfig::from_gguf(&file)?;
        let weights = ModelWeights::load(&file, &config)?;
        Ok(Self {
            file,
            config,
            weights,
        })
    }
}

/// Which positions of a sequence need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsFor {
    /// Only the last new token (generation).
    Last,
    /// Every new token (speculative verification, scoring).
    All,
}

/// One sequence's part of a batch.
#[derive(Debug, Clone, Copy)]
pub struct SeqInput<'a> {
    /// New tokens, at positions `start_pos..start_pos + tokens.len()`.
    pub tokens: &'a [u32],
    pub start_pos: usize,
    /// KV blocks of the sequence, covering every position up to the last new token.
    pub blocks: &'a [u32],
    pub logits: LogitsFor,
}

/// Logits of a forward pass: `rows` × vocab, in batch order; `ranges[i]` are sequence i's rows.
#[derive(Debug, Clone, Default)]
pub struct Logits {
    pub vocab: usize,
    pub data: Vec<f32>,
    pub ranges: Vec<std::ops::Range<usize>>,
}

impl Logits {
    /// Row `r` (0-based within sequence `seq`'s rows).
    pub fn row(&self, seq: usize, r: usize) -> &[f32] {
        let row = self.ranges[seq].start + r;
        &self.data[row * self.vocab..(row + 1) * self.vocab]
    }

    /// The last row of a sequence.
    pub fn last(&self, seq: usize) -> &[f32] {
        let r = &self.ranges[seq];
        self.row(seq, r.len() - 1)
    }
}

/// The forward pass and the KV store it owns (`n_blocks` blocks of `block_size` tokens).
#[derive(Debug)]
pub struct Runner {
    shape: KvShape,
    n_blocks: usize,
    keys: Vec<f32>,
    values: Vec<f32>,
    acts: Activations,
}

impl Runner {
    pub fn new(cfg: &ModelConfig, block_size: usize, n_blocks: usize) -> Self {
        let shape = KvShape {
            block_size,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim,
        };
        let len = cfg.n_layers * n_blocks * shape.block_stride();
        Self {
            shape,
            n_blocks,
            keys: vec![0.0; len],
            values: vec![0.0; len],
            acts: Activations::default(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.shape.block_size
    }

    /// Bytes the KV store takes.
    pub fn kv_bytes(&self) -> usize {
        (self.keys.len() + self.values.len()) * std::mem::size_of::<f32>()
    }

    fn check(&self, model: &Model, seqs: &[SeqInput<'_>]) -> Result<(), ModelError> {
        for (i, s) in seqs.iter().enumerate() {
            let end = s.start_pos + s.tokens.len();
            if s.tokens.is_empty() {
                return Err(ModelError::BadBatch(format!(
                    "sequence {i} has no new tokens"
                )));
            }
            if end > model.config.context_length {
                return Err(ModelError::BadBatch(format!(
                    "sequence {i} reaches position {end}, beyond the context of {}",
                    model.config.context_length
                )));
            }
            if s.blocks.len() * self.shape.block_size < end {
                return Err(ModelError::BadBatch(format!(
                    "sequence {i} needs {end} KV slots but its {} blocks hold {}",
                    s.blocks.len(),
                    s.blocks.len() * self.shape.block_size
                )));
            }
            if let Some(b) = s.blocks.iter().find(|&&b| b as usize >= self.n_blocks) {
                return Err(ModelError::BadBatch(format!(
                    "sequence {i} uses block {b} of {}",
                    self.n_blocks
                )));
            }
            if let Some(t) = s
                .tokens
                .iter()
                .find(|&&t| t as usize >= model.config.vocab_size)
            {
                return Err(ModelError::BadBatch(format!(
                    "token id {t} is outside the vocabulary"
                )));
            }
        }
        Ok(())
    }

    /// Runs one forward pass over the batch and returns the requested logits.
    pub fn forward(&mut self, model: &Model, seqs: &[SeqInput<'_>]) -> Result<Logits, ModelError> {
        self.check(model, seqs)?;
        kernels::threads::run(|| self.forward_checked(model, seqs))
    }

    fn forward_checked(
        &mut self,
        model: &Model,
        seqs: &[SeqInput<'_>],
    ) -> Result<Logits, ModelError> {
        let cfg = &model.config;
        let (hd, kvd, ffn) = (cfg.hidden, cfg.kv_dim(), cfg.ffn_hidden);
        // Row bookkeeping: which sequence and position each row is.
        let rows: Vec<(usize, usize)> = seqs
            .iter()
            .enumerate()
            .flat_map(|(i, s)| (0..s.tokens.len()).map(move |j| (i, s.start_pos + j)))
            .collect();
        let m = rows.len();
        let mut h = vec![0.0f32; m * hd];
        let embd = model.weights.embeddings.matrix(&model.file);
        for (row, &tok) in h
            .chunks_exact_mut(hd)
            .zip(seqs.iter().flat_map(|s| s.tokens))
        {
            dequantize(embd.dtype, embd.row(tok as usize), row).expect("checked at load");
        }
        let mut xn = vec![0.0f32; m * hd];
        let (mut q, mut k, mut v) = (vec![0.0; m * hd], vec![0.0; m * kvd], vec![0.0; m * kvd]);
        let mut attn = vec![0.0f32; m * hd];
        let mut proj = vec![0.0f32; m * hd];
        let (mut gate, mut up) = (vec![0.0f32; m * ffn], vec![0.0f32; m * ffn]);
        let layer_stride = self.n_blocks * self.shape.block_stride();
        // RoPE angles per row, shared by every layer and by queries and keys.
        let angles: Vec<Vec<(f32, f32)>> = rows
            .iter()
            .map(|&(_, pos)| {
                let mut a = Vec::new();
                rope_angles(pos, cfg.rope_dims, cfg.rope_base, &mut a);
                a
            })
            .collect();
        let scale = 1.0 / (cfg.head_dim as f32).sqrt();

        for (l, lw) in model.weights.layers.iter().enumerate() {
            for (x, o) in h.chunks_exact(hd).zip(xn.chunks_exact_mut(hd)) {
                rms_norm(x, &lw.attn_norm, cfg.norm_eps, o);
            }
            self.acts.set(&xn, m, hd);
            let f = &model.file;
            gemm_many(
                &mut [
                    (lw.wq.matrix(f), &mut q),
                    (lw.wk.matrix(f), &mut k),
                    (lw.wv.matrix(f), &mut v),
                ],
                &self.acts,
            );
            let keys = &mut self.keys[l * layer_stride..(l + 1) * layer_stride];
            let values = &mut self.values[l * layer_stride..(l + 1) * layer_stride];
            for (r, &(si, pos)) in rows.iter().enumerate() {
                rope_apply(&mut q[r * hd..(r + 1) * hd], cfg.head_dim, &angles[r]);
                rope_apply(&mut k[r * kvd..(r + 1) * kvd], cfg.head_dim, &angles[r]);
                write_kv(
                    keys,
                    values,
                    self.shape,
                    seqs[si].blocks,
                    pos,
                    &k[r * kvd..(r + 1) * kvd],
                    &v[r * kvd..(r + 1) * kvd],
                );
            }
            // Rows attend independently: split them over the kernel threads.
            let (keys, values, shape) = (&*keys, &*values, self.shape);
            attn.par_chunks_mut(hd)
                .zip(q.par_chunks(hd))
                .zip(rows.par_iter())
                .for_each_init(Vec::new, |scores, ((out, qr), &(si, pos))| {
                    paged_attention(
                        qr,
                        keys,
                        values,
                        shape,
                        seqs[si].blocks,
                        pos + 1,
                        scale,
                        out,
                        scores,
                    );
                });
            self.acts.set(&attn, m, hd);
            gemm(&lw.wo.matrix(&model.file), &self.acts, &mut proj);
            add_assign(&mut h, &proj);

            for (x, o) in h.chunks_exact(hd).zip(xn.chunks_exact_mut(hd)) {
                rms_norm(x, &lw.ffn_norm, cfg.norm_eps, o);
            }
            self.acts.set(&xn, m, hd);
            gemm_many(
                &mut [
                    (lw.gate.matrix(&model.file), &mut gate),
                    (lw.up.matrix(&model.file), &mut up),
                ],
                &self.acts,
            );
            silu_mul(&mut gate, &up);
            self.acts.set(&gate, m, ffn);
            gemm(&lw.down.matrix(&model.file), &self.acts, &mut proj);
            add_assign(&mut h, &proj);
        }

        // Logits only for the rows that want them.
        let mut wanted = Vec::new();
        let mut ranges = Vec::with_capacity(seqs.len());
        let mut row = 0;
        for s in seqs {
            let first = wanted.len();
            let n = s.tokens.len();
            match s.logits {
                LogitsFor::Last => wanted.push(row + n - 1),
                LogitsFor::All => wanted.extend(row..row + n),
            }
            ranges.push(first..wanted.len());
            row += n;
        }
        let mut final_norm = vec![0.0f32; wanted.len() * hd];
        for (&r, o) in wanted.iter().zip(final_norm.chunks_exact_mut(hd)) {
            rms_norm(
                &h[r * hd..(r + 1) * hd],
                &model.weights.output_norm,
                cfg.norm_eps,
                o,
            );
        }
        self.acts.set(&final_norm, wanted.len(), hd);
        let mut data = vec![0.0f32; wanted.len() * cfg.vocab_size];
        gemm(
            &model.weights.output.matrix(&model.file),
            &self.acts,
            &mut data,
        );
        Ok(Logits {
            vocab: cfg.vocab_size,
            data,
            ranges,
        })
    }
}
