//! `specula model bench`: the runtime's raw speed, measured the way llama.cpp's `llama-bench`
//! (prompt processing, single-sequence decode) and `llama-batched-bench` (aggregate decode of N
//! sequences in one batched step) measure theirs, so the figures can stand side by side.

use crate::Failure;
use anyhow::{Context, anyhow};
use clap::Args;
use model::{ActMode, LogitsFor, Model, Runner, SeqInput};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct ModelBenchArgs {
    /// A GGUF file or a model name (`specula model list`; pulled if missing) [default: the
    /// default model].
    #[arg(long)]
    model: Option<PathBuf>,
    /// Prompt tokens processed in one forward pass (llama-bench's pp).
    #[arg(long, default_value_t = 512)]
    pp: usize,
    /// Tokens decoded one at a time after a 1-token prompt (llama-bench's tg).
    #[arg(long, default_value_t = 128)]
    tg: usize,
    /// Sequences decoded together in one batched step, comma-separated (llama-batched-bench's
    /// -npl); each decodes --batch-tokens tokens after a --batch-prompt-token prompt.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,64")]
    batch: Vec<usize>,
    #[arg(long, default_value_t = 128)]
    batch_prompt: usize,
    #[arg(long, default_value_t = 32)]
    batch_tokens: usize,
    /// Draft lengths k for the verification measurement: one sequence (after a --batch-prompt
    /// prompt) runs steps of 1 + k rows with logits for every row, as speculative decoding's
    /// verification does; the cost is reported relative to a plain decode step (k = 0).
    #[arg(long, value_delimiter = ',', default_value = "0,1,2,4,8")]
    verify: Vec<usize>,
    /// Repetitions of each measurement (the best is reported, as the noise here is one-sided).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    #[command(flatten)]
    activations: crate::activations::ActivationsArg,
}

const BLOCK: usize = 16;

/// Token ids to feed: ordinary ids spread over the vocabulary (content does not change speed).
fn tokens(n: usize, seed: usize, vocab: usize) -> Vec<u32> {
    let (skip, span) = if vocab > 300 {
        (100, vocab - 200)
    } else {
        (0, vocab)
    };
    (0..n)
        .map(|i| (skip + (i * 7919 + seed * 104_729) % span) as u32)
        .collect()
}

fn best_of<F: FnMut() -> anyhow::Result<f64>>(repeat: usize, mut f: F) -> anyhow::Result<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..repeat.max(1) {
        best = best.min(f()?);
    }
    Ok(best)
}

pub fn run(args: ModelBenchArgs) -> Result<(), Failure> {
    if args.pp == 0 || args.tg == 0 || args.batch.contains(&0) {
        return Err(anyhow!("--pp, --tg and --batch levels must be at least 1").into());
    }
    let path = crate::models::resolve(args.model.as_deref())?;
    let mut model =
        Model::load(&path).with_context(|| format!("cannot load {}", path.display()))?;
    args.activations.apply(&mut model);
    // The header says what was measured: the file, the threads, the kernels, the activations and
    // the KV cache's dtype.
    println!(
        "specula model bench: {} ({} threads, kernels: {:?}, activations: {}, KV cache: {})",
        path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned()
        ),
        kernels::threads::count(),
        kernels::gemm::isa(),
        model.activations,
        model.kv_cache_dtype
    );
    let roof = Roof::measure(&model);
    println!("  {}", roof.describe());
    prompt_processing(&model, &args, &roof)?;
    single_decode(&model, &args, &roof)?;
    for &n in &args.batch {
        batched_decode(&model, &args, n, &roof)?;
    }
    verify_costs(&model, &args)?;
    tier_copy_cost(&model, &args)
}

fn blocks_for(n: usize) -> usize {
    n.div_ceil(BLOCK)
}

/// The least time a token can take by the measured roofs ([`kernels::roof`]): the products'
/// byte multiply-adds at the machine's rate (two instructions per four in int16, and the output
/// head always in int16), or its weight bytes at the memory's read rate.
struct Roof {
    roofs: kernels::roof::Roofs,
    costs: model::weights::ProductCosts,
    /// Byte multiply-adds a product's multiply-add takes: 2 in int16 (high and low bytes), 1 in
    /// int8.
    layer_factor: f64,
}

impl Roof {
    fn measure(model: &Model) -> Self {
        Self {
            roofs: kernels::roof::measure(),
            costs: model.weights.product_costs(),
            layer_factor: match model.activations {
                ActMode::Int16 => 2.0,
                ActMode::Int8 => 1.0,
            },
        }
    }

    fn describe(&self) -> String {
        let macs = self
            .roofs
            .byte_macs_per_s
            .map_or("no packed kernels".into(), |r| {
                format!("{:.0} G byte-MAC/s", r / 1e9)
            });
        format!(
            "roofs: memory {:.1} GB/s (weights {:.1} MB a step), {macs}",
            self.roofs.read_bytes_per_s / 1e9,
            self.costs.read_bytes as f64 / 1e6
        )
    }

    /// The products' least seconds for one token, `with_head` of a token's output head.
    fn compute_secs(&self, with_head: f64) -> Option<f64> {
        let rate = self.roofs.byte_macs_per_s?;
        let macs = self.costs.layer_macs as f64 * self.layer_factor
            + self.costs.head_macs as f64 * 2.0 * with_head;
        Some(macs / rate)
    }

    /// " (N% of the compute roof)" for `tok_s` tokens a second, `with_head` as above.
    fn of_compute(&self, tok_s: f64, with_head: f64) -> String {
        self.compute_secs(with_head).map_or(String::new(), |s| {
            format!("  ({:.0}% of the compute roof)", 100.0 * s * tok_s)
        })
    }

    /// " (N% of the memory roof)": each step reads every weight once.
    fn of_memory(&self, steps_s: f64) -> String {
        let secs = self.costs.read_bytes as f64 / self.roofs.read_bytes_per_s;
        format!("  ({:.0}% of the memory roof)", 100.0 * secs * steps_s)
    }
}

/// Prompt processing: one forward over pp tokens.
fn prompt_processing(model: &Model, args: &ModelBenchArgs, roof: &Roof) -> Result<(), Failure> {
    let prompt = tokens(args.pp, 1, model.config.vocab_size);
    let table: Vec<u32> = (0..blocks_for(args.pp) as u32).collect();
    let mut runner = Runner::new(model, BLOCK, table.len());
    let secs = best_of(args.repeat, || {
        let t = Instant::now();
        let input = SeqInput {
            tokens: &prompt,
            start_pos: 0,
            blocks: &table,
            logits: LogitsFor::Last,
            tree: None,
        };
        runner.forward(model, &[input])?;
        Ok(t.elapsed().as_secs_f64())
    })?;
    let tok_s = args.pp as f64 / secs;
    // Only the last prompt token runs the output head.
    let head = 1.0 / args.pp as f64;
    println!(
        "  pp{:<5} {tok_s:>9.1} tok/s{}",
        args.pp,
        roof.of_compute(tok_s, head)
    );
    Ok(())
}

/// Single-sequence decode: tg steps of one token.
fn single_decode(model: &Model, args: &ModelBenchArgs, roof: &Roof) -> Result<(), Failure> {
    let decode_tokens = tokens(args.tg + 1, 2, model.config.vocab_size);
    let table: Vec<u32> = (0..blocks_for(args.tg + 1) as u32).collect();
    let mut runner = Runner::new(model, BLOCK, table.len());
    let secs = best_of(args.repeat, || {
        let t = Instant::now();
        for pos in 0..args.tg {
            let input = SeqInput {
                tokens: &decode_tokens[pos..pos + 1],
                start_pos: pos,
                blocks: &table,
                logits: LogitsFor::Last,
                tree: None,
            };
            runner.forward(model, &[input])?;
        }
        Ok(t.elapsed().as_secs_f64())
    })?;
    let tok_s = args.tg as f64 / secs;
    println!(
        "  tg{:<5} {tok_s:>9.1} tok/s{}",
        args.tg,
        roof.of_memory(tok_s)
    );
    Ok(())
}

/// Aggregate decode: n sequences, prompts prefilled first (not timed), then batched steps.
fn batched_decode(
    model: &Model,
    args: &ModelBenchArgs,
    n: usize,
    roof: &Roof,
) -> Result<(), Failure> {
    let per_seq = blocks_for(args.batch_prompt + args.batch_tokens);
    let seqs: Vec<Vec<u32>> = (0..n)
        .map(|i| {
            let len = args.batch_prompt + args.batch_tokens;
            tokens(len, 10 + i, model.config.vocab_size)
        })
        .collect();
    let tables: Vec<Vec<u32>> = (0..n)
        .map(|i| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect())
        .collect();
    let mut runner = Runner::new(model, BLOCK, n * per_seq);
    let secs = best_of(args.repeat, || {
        for (s, t) in seqs.iter().zip(&tables) {
            let input = SeqInput {
                tokens: &s[..args.batch_prompt],
                start_pos: 0,
                blocks: t,
                logits: LogitsFor::Last,
                tree: None,
            };
            runner.forward(model, &[input])?;
        }
        let t = Instant::now();
        for step in 0..args.batch_tokens {
            let pos = args.batch_prompt + step;
            let inputs: Vec<SeqInput<'_>> = seqs
                .iter()
                .zip(&tables)
                .map(|(s, t)| SeqInput {
                    tokens: &s[pos..pos + 1],
                    start_pos: pos,
                    blocks: t,
                    logits: LogitsFor::Last,
                    tree: None,
                })
                .collect();
            runner.forward(model, &inputs)?;
        }
        Ok(t.elapsed().as_secs_f64())
    })?;
    let tok_s = (n * args.batch_tokens) as f64 / secs;
    // One sequence is bound by reading the weights; many, by the multiply-adds.
    let bound = if n == 1 {
        roof.of_memory(tok_s)
    } else {
        roof.of_compute(tok_s, 1.0)
    };
    println!(
        "  decode x{n:<3} {tok_s:>9.1} tok/s aggregate ({} tokens each after a {}-token prompt){bound}",
        args.batch_tokens, args.batch_prompt
    );
    Ok(())
}

/// What the prefix cache's host tier pays per block: one demotion (device → host) and one
/// promotion (host → device) of a block's keys and values over all layers.
fn tier_copy_cost(model: &Model, args: &ModelBenchArgs) -> Result<(), Failure> {
    const BLOCKS: usize = 64;
    let mut runner = Runner::new(model, BLOCK, BLOCKS);
    let bytes = runner.block_bytes();
    let mut host = vec![0u8; BLOCKS * bytes];
    let save = best_of(args.repeat, || {
        let t = Instant::now();
        for (b, slot) in host.chunks_exact_mut(bytes).enumerate() {
            runner.save_block(b as u32, slot)?;
        }
        Ok(t.elapsed().as_secs_f64() / BLOCKS as f64)
    })?;
    let load = best_of(args.repeat, || {
        let t = Instant::now();
        for (b, slot) in host.chunks_exact(bytes).enumerate() {
            runner.load_block(b as u32, slot)?;
        }
        Ok(t.elapsed().as_secs_f64() / BLOCKS as f64)
    })?;
    println!(
        "  KV block    {:>8.1} µs demotion, {:.1} µs promotion ({} KB a block of {BLOCK} tokens, {})",
        save * 1e6,
        load * 1e6,
        bytes / 1000,
        runner.kv_dtype()
    );
    Ok(())
}

/// Speculative verification: steps of 1 + k rows of one sequence, every row with logits. Each
/// repetition times every k in turn, so that the costs compared to the plain step (k = 0) are
/// taken close together on a host whose speed drifts; each k's best is reported.
fn verify_costs(model: &Model, args: &ModelBenchArgs) -> Result<(), Failure> {
    const STEPS: usize = 32;
    let cfg = &model.config;
    let longest = args.verify.iter().max().copied().unwrap_or(0) + 1;
    let total = args.batch_prompt + STEPS * longest;
    let seq = tokens(total, 3, cfg.vocab_size);
    let table: Vec<u32> = (0..total.div_ceil(BLOCK) as u32).collect();
    let mut runner = Runner::new(model, BLOCK, table.len());
    let mut step_secs = |k: usize| -> anyhow::Result<f64> {
        let input = SeqInput {
            tokens: &seq[..args.batch_prompt],
            start_pos: 0,
            blocks: &table,
            logits: LogitsFor::None,
            tree: None,
        };
        runner.forward(model, &[input])?;
        let t = Instant::now();
        for step in 0..STEPS {
            let pos = args.batch_prompt + step * (k + 1);
            let input = SeqInput {
                tokens: &seq[pos..pos + k + 1],
                start_pos: pos,
                blocks: &table,
                logits: LogitsFor::All,
                tree: None,
            };
            runner.forward(model, &[input])?;
        }
        Ok(t.elapsed().as_secs_f64() / STEPS as f64)
    };
    let mut best = vec![f64::INFINITY; args.verify.len()];
    for _ in 0..args.repeat.max(1) {
        for (b, &k) in best.iter_mut().zip(&args.verify) {
            *b = b.min(step_secs(k)?);
        }
    }
    // The plain step: k = 0 where it was measured, else the first length given.
    let base = args
        .verify
        .iter()
        .position(|&k| k == 0)
        .map_or(best[0], |i| best[i]);
    for (&k, secs) in args.verify.iter().zip(best) {
        println!(
            "  verify +{k:<3} {:>8.2} ms/step  {:>5.2}x a decode step ({} rows with logits)",
            secs * 1e3,
            secs / base,
            k + 1
        );
    }
    Ok(())
}
