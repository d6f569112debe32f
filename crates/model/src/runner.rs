//! The batched forward pass: a mixed batch of sequences (prefill chunks and single decode tokens
//! at any positions) in, logits out, with keys and values in a paged KV store.
//!
//! The layers themselves are in [`crate::layers`]; every operation works row by row (a row is one
//! token of one sequence), and the matrix products fix their reduction order per output element,
//! so a sequence's logits are bitwise the same alone, in any batch, as a prefill chunk or token by
//! token.

use crate::ModelError;
use crate::config::Arch;
use crate::config::ModelConfig;
use crate::gguf::GgufFile;
use crate::kv_store::{self, PagedKv};
use crate::layers::{BatchRows, Layer, Scratch, gemma3, standard};
use crate::weights::ModelWeights;
use kernels::attention::{KvDtype, KvShape};
use kernels::gemm::gemm;
use kernels::ops::{RopeFreqs, rms_norm};
use kernels::quant::{ActMode, dequantize};
use std::path::Path;

/// A loaded model: the mapped file, its configuration and weight descriptors, and how its
/// forward passes quantise activations (`--activations`; set it before running).
#[derive(Debug)]
pub struct Model {
    pub file: GgufFile,
    pub config: ModelConfig,
    pub weights: ModelWeights,
    pub activations: ActMode,
    /// What its runners' KV stores hold (`--kv-cache-dtype`; set it before making one).
    pub kv_cache_dtype: KvDtype,
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
            activations: ActMode::default(),
            kv_cache_dtype: KvDtype::default(),
        })
    }

    /// How the output head quantises its activations. 16 bits, whatever the mode, while the
    /// head costs less than the layers: it decides the logits directly (in the int8 mode a 16-bit
    /// head keeps the output closer to the exact model: docs/runtime.md) and runs only for the
    /// rows that want logits. A head that outweighs the layers (Gemma 3 270M's 262,144-token one is
    /// 1.7× them) follows the mode: at twice the 16-bit speed it is most of a step's saving.
    pub fn head_activations(&self) -> ActMode {
        let costs = self.weights.product_costs();
        if costs.head_macs > costs.layer_macs {
            self.activations
        } else {
            ActMode::Int16
        }
    }

    /// How RoPE turns each pair of a head's dimensions (in the global layers).
    pub fn rope_freqs(&self) -> RopeFreqs<'_> {
        RopeFreqs {
            rot_dims: self.config.rope_dims,
            base: self.config.rope_base,
            freq_scale: self.config.rope_freq_scale,
            divisors: self.weights.rope_freqs.as_deref(),
        }
    }

    /// The same in the local (sliding-window) layers, if the model has any: their own base,
    /// unscaled.
    pub fn local_rope_freqs(&self) -> Option<RopeFreqs<'_>> {
        self.config.sliding_window.map(|_| RopeFreqs {
            rot_dims: self.config.rope_dims,
            base: self.config.rope_base_local,
            freq_scale: 1.0,
            divisors: None,
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
    /// None: a prompt chunk that does not end the prompt.
    None,
    /// No logits: the last new token's final hidden state (after the output norm), for an
    /// embedding ([`Logits::hidden`]).
    Hidden,
}

/// A draft tree (speculative decoding with several candidates per step). Node `n` is stored in
/// KV slot `root + n` and sits at position `root + depth(n)`; it attends to the sequence before
/// `root` and to its own ancestors, so its result is that of decoding its path alone.
#[derive(Debug, Clone, Copy)]
pub struct Tree<'a> {
    /// The root's position: the sequence's tokens before it are ordinary context.
    pub root: usize,
    /// Each node's parent (`parents[0]`, the root's, is ignored); parents precede children.
    pub parents: &'a [usize],
}

impl Tree<'_> {
    /// Node `n`'s ancestors, root first, `n` last.
    pub fn path(&self, n: usize) -> Vec<usize> {
        let mut path = vec![n];
        let mut at = n;
        while at != 0 {
            at = self.parents[at];
            path.push(at);
        }
        path.reverse();
        path
    }
}

/// One sequence's part of a batch.
#[derive(Debug, Clone, Copy)]
pub struct SeqInput<'a> {
    /// New tokens, in KV slots `start_pos..start_pos + tokens.len()` (at those positions, unless
    /// they are nodes of a tree).
    pub tokens: &'a [u32],
    pub start_pos: usize,
    /// KV blocks of the sequence, covering every slot up to the last new token.
    pub blocks: &'a [u32],
    pub logits: LogitsFor,
    /// The new tokens are nodes `start_pos - root ..` of this tree.
    pub tree: Option<Tree<'a>>,
}

/// Logits of a forward pass: `rows` × vocab, in batch order; `ranges[i]` are sequence i's rows.
#[derive(Debug, Clone, Default)]
pub struct Logits {
    pub vocab: usize,
    pub data: Vec<f32>,
    pub ranges: Vec<std::ops::Range<usize>>,
    /// The residual streams captured ([`Runner::forward_capturing`]): for every row of each
    /// capturing sequence, the streams entering the capture layers side by side, in order;
    /// `feature_ranges[i]` are sequence i's rows (empty when it does not capture).
    pub features: Vec<f32>,
    pub feature_ranges: Vec<std::ops::Range<usize>>,
    /// Values a captured row (the model's width for each capture layer).
    pub feature_width: usize,
    /// The final hidden states of the sequences that asked for them ([`LogitsFor::Hidden`]),
    /// `hidden_width` values each, in batch order; `hidden_rows[i]` is sequence i's row.
    pub hidden: Vec<f32>,
    pub hidden_rows: Vec<Option<usize>>,
    pub hidden_width: usize,
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

    /// Sequence `seq`'s final hidden state, if it asked for it ([`LogitsFor::Hidden`]).
    pub fn hidden(&self, seq: usize) -> Option<&[f32]> {
        let w = self.hidden_width;
        let r = (*self.hidden_rows.get(seq)?)?;
        Some(&self.hidden[r * w..(r + 1) * w])
    }

    /// Sequence `seq`'s captured streams, row after row (empty when it did not capture).
    pub fn features(&self, seq: usize) -> &[f32] {
        let w = self.feature_width;
        self.feature_ranges
            .get(seq)
            .map_or(&[], |r| &self.features[r.start * w..r.end * w])
    }
}

/// The KV store's layout for `cfg`.
fn kv_shape(cfg: &ModelConfig, block_size: usize) -> KvShape {
    KvShape {
        block_size,
        n_kv_heads: cfg.n_kv_heads,
        head_dim: cfg.head_dim,
    }
}

/// The forward pass and the KV store it owns (`n_blocks` blocks of `block_size` tokens).
#[derive(Debug)]
pub struct Runner {
    kv: PagedKv,
    scratch: Scratch,
}

impl Runner {
    /// A runner for `model`, its KV store holding `model.kv_cache_dtype`.
    pub fn new(model: &Model, block_size: usize, n_blocks: usize) -> Self {
        let cfg = &model.config;
        Self {
            kv: PagedKv::new(
                kv_shape(cfg, block_size),
                cfg.n_layers,
                n_blocks,
                model.kv_cache_dtype,
            ),
            scratch: Scratch::default(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.kv.shape.block_size
    }

    /// What the KV store holds.
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv.dtype()
    }

    /// Bytes the KV store takes.
    pub fn kv_bytes(&self) -> usize {
        self.kv.bytes()
    }

    /// [`Runner::block_bytes`] of a runner for `model` with `block_size`-token blocks, before
    /// there is one.
    pub fn block_bytes_for(model: &Model, block_size: usize) -> usize {
        let cfg = &model.config;
        kv_store::block_bytes(
            kv_shape(cfg, block_size),
            cfg.n_layers,
            model.kv_cache_dtype,
        )
    }

    /// Bytes of one block's keys and values over all layers (what [`Runner::save_block`]
    /// writes).
    pub fn block_bytes(&self) -> usize {
        self.kv.block_bytes()
    }

    /// Copies block `block`'s keys and values, every layer, into `out` ([`Runner::block_bytes`]
    /// long, in the store's dtype): the prefix cache's demotion to its host tier.
    pub fn save_block(&self, block: u32, out: &mut [u8]) -> Result<(), ModelError> {
        self.kv.save_block(block, out)
    }

    /// Writes a block saved by [`Runner::save_block`] back into block `block`: a promotion.
    pub fn load_block(&mut self, block: u32, data: &[u8]) -> Result<(), ModelError> {
        self.kv.load_block(block, data)
    }

    /// Copies the keys and values in slot `from` to slot `to` of the same block table, in every
    /// layer: the accepted path of a draft tree is moved into consecutive positions this way.
    pub fn move_kv(&mut self, blocks: &[u32], from: usize, to: usize) -> Result<(), ModelError> {
        let bs = self.kv.shape.block_size;
        let outside = |slot: usize| {
            blocks
                .get(slot / bs)
                .is_none_or(|&b| b as usize >= self.kv.n_blocks)
        };
        if outside(from) || outside(to) {
            return Err(ModelError::BadBatch(format!(
                "KV move {from} → {to} outside the sequence's blocks"
            )));
        }
        self.kv.move_slot(blocks, from, to);
        Ok(())
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
            if s.blocks.len() * self.kv.shape.block_size < end {
                return Err(ModelError::BadBatch(format!(
                    "sequence {i} needs {end} KV slots but its {} blocks hold {}",
                    s.blocks.len(),
                    s.blocks.len() * self.kv.shape.block_size
                )));
            }
            if let Some(tree) = s.tree {
                let nodes = end.saturating_sub(tree.root);
                if s.start_pos < tree.root || tree.parents.len() < nodes {
                    return Err(ModelError::BadBatch(format!(
                        "sequence {i}'s tree does not cover its new tokens"
                    )));
                }
                if (1..nodes).any(|n| tree.parents[n] >= n) {
                    return Err(ModelError::BadBatch(format!(
                        "sequence {i}'s tree has a node before its parent"
                    )));
                }
            }
            if let Some(b) = s.blocks.iter().find(|&&b| b as usize >= self.kv.n_blocks) {
                return Err(ModelError::BadBatch(format!(
                    "sequence {i} uses block {b} of {}",
                    self.kv.n_blocks
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
        self.forward_capturing(model, seqs, None)
    }

    /// [`Runner::forward`], also capturing the residual streams entering `capture.layers` for
    /// every row of the sequences `capture.seqs` marks (what an EAGLE-3 head reads). Nothing is
    /// copied for the others, and without a capture nothing at all.
    pub fn forward_capturing(
        &mut self,
        model: &Model,
        seqs: &[SeqInput<'_>],
        capture: Option<Capture<'_>>,
    ) -> Result<Logits, ModelError> {
        self.check(model, seqs)?;
        if let Some(c) = &capture {
            if c.seqs.len() != seqs.len() {
                return Err(ModelError::BadBatch(format!(
                    "capture marks {} sequences of {}",
                    c.seqs.len(),
                    seqs.len()
                )));
            }
            if let Some(l) = c.layers.iter().find(|&&l| l > model.config.n_layers) {
                return Err(ModelError::BadBatch(format!(
                    "capture of layer {l} in a {}-layer model",
                    model.config.n_layers
                )));
            }
        }
        kernels::threads::run(|| self.forward_checked(model, seqs, capture))
    }

    fn forward_checked(
        &mut self,
        model: &Model,
        seqs: &[SeqInput<'_>],
        capture: Option<Capture<'_>>,
    ) -> Result<Logits, ModelError> {
        let cfg = &model.config;
        let hd = cfg.hidden;
        self.scratch.acts.mode = model.activations;
        self.scratch.acts.skip_f32 = model.weights.all_packed();
        let batch = BatchRows::new(seqs, &model.rope_freqs(), model.local_rope_freqs().as_ref());
        let m = batch.len();
        let mut h = vec![0.0f32; m * hd];
        let embd = model.weights.embeddings.matrix(&model.file);
        for (row, &tok) in h
            .chunks_exact_mut(hd)
            .zip(seqs.iter().flat_map(|s| s.tokens))
        {
            dequantize(embd.dtype, embd.row(tok as usize), row).expect("checked at load");
            if let Some(scale) = cfg.embed_scale {
                row.iter_mut().for_each(|x| *x *= scale);
            }
        }
        self.scratch.resize(cfg, m);
        let mut captured = Captured::new(capture, seqs, hd);
        for (l, lw) in model.weights.layers.iter().enumerate() {
            captured.take(l, &h);
            let mut kv = self.kv.layer(l);
            let run = match cfg.arch {
                Arch::Gemma3 => gemma3::layer,
                Arch::Llama | Arch::Qwen2 | Arch::Qwen3 => standard::layer,
            };
            let layer = Layer {
                cfg,
                file: &model.file,
                weights: lw,
                index: l,
            };
            run(&layer, &batch, &mut kv, &mut self.scratch, &mut h);
        }
        captured.take(model.weights.layers.len(), &h);

        // Logits only for the rows that want them.
        let mut wanted = Vec::new();
        let mut ranges = Vec::with_capacity(seqs.len());
        let (mut hidden, mut hidden_rows) = (Vec::new(), Vec::with_capacity(seqs.len()));
        let mut row = 0;
        for s in seqs {
            let first = wanted.len();
            let n = s.tokens.len();
            let mut hidden_row = None;
            match s.logits {
                LogitsFor::Last => wanted.push(row + n - 1),
                LogitsFor::All => wanted.extend(row..row + n),
                LogitsFor::None => {}
                LogitsFor::Hidden => {
                    let at = row + n - 1;
                    let mut out = vec![0.0f32; hd];
                    let input = &h[at * hd..(at + 1) * hd];
                    rms_norm(input, &model.weights.output_norm, cfg.norm_eps, &mut out);
                    hidden_row = Some(hidden.len() / hd);
                    hidden.extend(out);
                }
            }
            hidden_rows.push(hidden_row);
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
        let mut data = vec![0.0f32; wanted.len() * cfg.vocab_size];
        if !wanted.is_empty() {
            let acts = &mut self.scratch.acts;
            acts.mode = model.head_activations();
            acts.set(&final_norm, wanted.len(), hd);
            gemm(&model.weights.output.matrix(&model.file), acts, &mut data);
            if let Some(c) = cfg.final_logit_softcap {
                data.iter_mut().for_each(|x| *x = c * (*x / c).tanh());
            }
        }
        Ok(Logits {
            vocab: cfg.vocab_size,
            data,
            ranges,
            features: captured.data,
            feature_ranges: captured.ranges,
            feature_width: captured.layers.len() * hd,
            hidden,
            hidden_rows,
            hidden_width: hd,
        })
    }
}

/// Which residual streams a forward pass captures: those entering `layers`, in that order (the
/// model's layer count names the stream after the last layer, before the final norm), for the
/// rows of the sequences whose `seqs` entry is true.
#[derive(Debug, Clone, Copy)]
pub struct Capture<'a> {
    pub layers: &'a [usize],
    pub seqs: &'a [bool],
}

/// The captured streams being gathered: `data` has `layers.len() × hidden` values a row.
struct Captured {
    layers: Vec<usize>,
    /// (batch row, captured row) of every row captured.
    rows: Vec<(usize, usize)>,
    hidden: usize,
    data: Vec<f32>,
    ranges: Vec<std::ops::Range<usize>>,
}

impl Captured {
    fn new(capture: Option<Capture<'_>>, seqs: &[SeqInput<'_>], hidden: usize) -> Self {
        let mut rows = Vec::new();
        let mut ranges = Vec::with_capacity(seqs.len());
        let mut batch_row = 0;
        for (i, s) in seqs.iter().enumerate() {
            let first = rows.len();
            if capture.is_some_and(|c| c.seqs[i]) {
                rows.extend((0..s.tokens.len()).map(|r| (batch_row + r, first + r)));
            }
            ranges.push(first..rows.len());
            batch_row += s.tokens.len();
        }
        Self {
            layers: capture.map_or(Vec::new(), |c| c.layers.to_vec()),
            data: vec![0.0; rows.len() * capture.map_or(0, |c| c.layers.len()) * hidden],
            rows,
            hidden,
            ranges,
        }
    }

    /// Copies the streams entering layer `layer` (held in `h`) if it is captured.
    fn take(&mut self, layer: usize, h: &[f32]) {
        let (hd, n) = (self.hidden, self.layers.len());
        for k in (0..n).filter(|&k| self.layers[k] == layer) {
            for &(b, c) in &self.rows {
                let at = (c * n + k) * hd;
                self.data[at..at + hd].copy_from_slice(&h[b * hd..(b + 1) * hd]);
            }
        }
    }
}
