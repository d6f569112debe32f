//! What the trainer reads, made by the runtime itself: for every token of every sample, the three
//! residual streams the head will read at inference (captured exactly as the engine captures
//! them) and the target's final normed stream (its logits are that times the output matrix), in
//! f16 safetensors shards; the target's embedding and output matrices and final norm; and
//! `meta.json` with the shapes. The shards stop at a size bound.

use super::answers::Sample;
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use kernels::attention::f16;
use kernels::ops::rms_norm;
use kernels::quant::dequantize;
use model::{Capture, LogitsFor, Model, Runner, SeqInput};
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use std::path::Path;

/// Tokens a shard holds (about 300 MB of streams for a 576-wide model).
const SHARD_TOKENS: usize = 65_536;
/// Tokens per forward pass.
const CHUNK: usize = 1024;

/// A shard being filled.
#[derive(Default)]
struct Shard {
    ids: Vec<u32>,
    mask: Vec<u8>,
    lengths: Vec<u32>,
    aux: Vec<f16>,
    target: Vec<f16>,
}

impl Shard {
    fn write(&self, path: &Path, hidden: usize) -> anyhow::Result<()> {
        let n = self.ids.len();
        let ids: Vec<u8> = self
            .ids
            .iter()
            .flat_map(|&t| (t as i32).to_le_bytes())
            .collect();
        let lengths: Vec<u8> = self
            .lengths
            .iter()
            .flat_map(|&t| (t as i32).to_le_bytes())
            .collect();
        let halves = |v: &[f16]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let (aux, target) = (halves(&self.aux), halves(&self.target));
        let views = [
            ("input_ids", TensorView::new(Dtype::I32, vec![n], &ids)?),
            (
                "loss_mask",
                TensorView::new(Dtype::U8, vec![n], &self.mask)?,
            ),
            (
                "lengths",
                TensorView::new(Dtype::I32, vec![self.lengths.len()], &lengths)?,
            ),
            (
                "aux",
                TensorView::new(Dtype::F16, vec![n, 3 * hidden], &aux)?,
            ),
            (
                "target",
                TensorView::new(Dtype::F16, vec![n, hidden], &target)?,
            ),
        ];
        safetensors::serialize_to_file(views, None, path)?;
        Ok(())
    }

    fn bytes(&self) -> usize {
        self.ids.len() * 5 + (self.aux.len() + self.target.len()) * 2
    }
}

/// The target's shapes and the captured layers, for the trainer.
pub fn meta(model: &Model, layers: [usize; 3], tokens: usize) -> serde_json::Value {
    let c = &model.config;
    serde_json::json!({
        "hidden_size": c.hidden,
        "vocab_size": c.vocab_size,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "intermediate_size": c.ffn_hidden,
        "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_base,
        "capture_layers": layers,
        "final_logit_softcapping": c.final_logit_softcap,
        "tokens": tokens,
    })
}

/// Writes the target's embedding and output matrices, widened to f16, and its final norm into
/// `path`.
pub fn write_target(model: &Model, path: &Path) -> anyhow::Result<()> {
    let c = &model.config;
    let mut row = vec![0.0f32; c.hidden];
    let mut widen = |m: model::weights::Linear| -> anyhow::Result<Vec<u8>> {
        let q = m.matrix(&model.file);
        let mut out = Vec::with_capacity(q.rows * q.cols * 2);
        for r in 0..q.rows {
            dequantize(q.dtype, q.row(r), &mut row)?;
            out.extend(row.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()));
        }
        Ok(out)
    };
    let embed = widen(model.weights.embeddings.clone())?;
    let output = widen(model.weights.output.clone())?;
    let norm: Vec<u8> = model
        .weights
        .output_norm
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let shape = vec![c.vocab_size, c.hidden];
    let views = [
        ("embed", TensorView::new(Dtype::F16, shape.clone(), &embed)?),
        ("lm_head", TensorView::new(Dtype::F16, shape, &output)?),
        (
            "output_norm",
            TensorView::new(Dtype::F32, vec![c.hidden], &norm)?,
        ),
    ];
    safetensors::serialize_to_file(views, None, path)?;
    Ok(())
}

/// Runs every sample through `model`, capturing `layers` and the final stream, into shards in
/// `dir`, until `max_bytes`; returns the tokens written.
pub fn write_shards(
    model: &Model,
    samples: &[Sample],
    layers: [usize; 3],
    dir: &Path,
    max_bytes: usize,
) -> anyhow::Result<usize> {
    let c = &model.config;
    let (hd, bs) = (c.hidden, kvcache::DEFAULT_BLOCK_SIZE);
    let longest = samples
        .iter()
        .map(|s| s.prompt.len() + s.answer.len())
        .max()
        .unwrap_or(1);
    let blocks: Vec<u32> = (0..longest.div_ceil(bs) as u32).collect();
    let mut runner = Runner::new(model, bs, blocks.len());
    let capture_layers = [layers[0], layers[1], layers[2], c.n_layers];
    let bar = ProgressBar::new(samples.len() as u64).with_style(
        ProgressStyle::with_template("streams {bar:40} {pos}/{len} [{elapsed} < {eta}]")
            .expect("a valid template"),
    );
    let (mut shard, mut index, mut total, mut bytes) = (Shard::default(), 0, 0, 0);
    let mut normed = vec![0.0f32; hd];
    for s in samples {
        let tokens: Vec<u32> = s.prompt.iter().chain(&s.answer).copied().collect();
        let mut start = 0;
        while start < tokens.len() {
            let end = (start + CHUNK).min(tokens.len());
            let input = SeqInput {
                tokens: &tokens[start..end],
                start_pos: start,
                blocks: &blocks,
                logits: LogitsFor::None,
                tree: None,
            };
            let capture = Capture {
                layers: &capture_layers,
                seqs: &[true],
            };
            let out = runner.forward_capturing(model, &[input], Some(capture))?;
            for row in out.features(0).chunks_exact(4 * hd) {
                shard
                    .aux
                    .extend(row[..3 * hd].iter().map(|&x| f16::from_f32(x)));
                rms_norm(
                    &row[3 * hd..],
                    &model.weights.output_norm,
                    c.norm_eps,
                    &mut normed,
                );
                shard
                    .target
                    .extend(normed.iter().map(|&x| f16::from_f32(x)));
            }
            start = end;
        }
        shard.ids.extend(&tokens);
        shard.mask.extend(
            tokens
                .iter()
                .enumerate()
                .map(|(i, _)| u8::from(i >= s.prompt.len())),
        );
        shard.lengths.push(tokens.len() as u32);
        total += tokens.len();
        bar.inc(1);
        if shard.ids.len() >= SHARD_TOKENS {
            bytes += shard.bytes();
            shard.write(&dir.join(format!("shard-{index:05}.safetensors")), hd)?;
            (shard, index) = (Shard::default(), index + 1);
            if bytes >= max_bytes {
                bar.abandon_with_message("size bound reached");
                eprintln!("stopping at {total} tokens: --max-feature-gb reached");
                return Ok(total);
            }
        }
    }
    if !shard.ids.is_empty() {
        shard
            .write(&dir.join(format!("shard-{index:05}.safetensors")), hd)
            .context("cannot write a shard")?;
    }
    bar.finish();
    Ok(total)
}
