//! `specula generate`: one prompt through the model runtime, streamed to stdout, then its speed.

use crate::Failure;
use anyhow::{Context, anyhow};
use clap::Args;
use kvcache::{BlockPool, DEFAULT_BLOCK_SIZE as BLOCK_SIZE};
use model::sampler::{Sampler, SamplingParams};
use model::tokenizer::{IncrementalDecoder, Tokenizer};
use model::{LogitsFor, Model, Runner, SeqInput};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct GenerateArgs {
    /// The prompt text.
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// After the speed line, print the generated token ids (`ids: 1 2 3`).
    #[arg(long)]
    show_ids: bool,
    /// A GGUF file or a model name (`specula model list`; pulled if missing) [default:
    /// SmolLM2-135M-Instruct Q4_1, fetched on first use].
    #[arg(long)]
    model: Option<PathBuf>,
    #[command(flatten)]
    activations: crate::activations::ActivationsArg,
}

/// Tokens per forward pass while prefilling (bounds the activations' memory).
const PREFILL_CHUNK: usize = 512;

pub fn run(args: GenerateArgs) -> Result<(), Failure> {
    let params = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        seed: args.seed,
        ..SamplingParams::default()
    };
    params.validate().map_err(|e| anyhow!("{e}"))?;
    if args.max_tokens == 0 {
        return Err(anyhow!("--max-tokens must be at least 1").into());
    }
    let path = crate::models::resolve(args.model.as_deref())?;
    let mut model =
        Model::load(&path).with_context(|| format!("cannot load {}", path.display()))?;
    args.activations.apply(&mut model);
    let tokenizer = Tokenizer::from_gguf(&model.file).context("cannot build the tokenizer")?;
    let prompt = prompt_tokens(&args, &model, &tokenizer)?;
    let context = model.config.context_length;
    let total = (prompt.len() + args.max_tokens).min(context);
    if prompt.len() >= context {
        return Err(anyhow!(
            "the prompt has {} tokens; the model's context is {context}",
            prompt.len()
        )
        .into());
    }
    let mut seq = Sequence::new(&model, prompt.len(), total)?;
    let mut sampler = Sampler::new(params, &prompt);

    let t0 = Instant::now();
    let mut logits = Vec::new();
    for start in (0..prompt.len()).step_by(PREFILL_CHUNK) {
        let end = (start + PREFILL_CHUNK).min(prompt.len());
        logits = seq.forward(&prompt[start..end], start)?;
    }
    let prefill_s = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let ids = decode(
        &args,
        &tokenizer,
        &mut seq,
        &mut sampler,
        &prompt,
        total,
        logits,
    )?;
    let decode_s = t1.elapsed().as_secs_f64();
    // Decode speed counts the forward passes after the first token (which came from the prefill).
    let generated = ids.len();
    let decode_rate = if generated > 1 {
        (generated - 1) as f64 / decode_s
    } else {
        0.0
    };
    println!(
        "prompt: {} tokens, {:.1} tok/s | generated: {} tokens, {:.1} tok/s",
        prompt.len(),
        prompt.len() as f64 / prefill_s,
        generated,
        decode_rate
    );
    if args.show_ids {
        let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("ids: {}", ids.join(" "));
    }
    Ok(())
}

/// The prompt's tokens: the text as given, or as a user message in the chat template.
fn prompt_tokens(
    args: &GenerateArgs,
    model: &Model,
    tokenizer: &Tokenizer,
) -> anyhow::Result<Vec<u32>> {
    let text = if args.chat {
        let template = model::chat_template::ChatTemplate::from_gguf(&model.file, tokenizer)
            .context("the model has no usable chat template")?;
        let messages = [serde_json::json!({"role": "user", "content": args.prompt})];
        template
            .render(&messages, &model::chat_template::ChatOptions::default())
            .context("cannot render the chat template")?
    } else {
        args.prompt.clone()
    };
    let prompt = tokenizer
        .encode(&text, true, args.chat)
        .context("cannot tokenize the prompt")?;
    if prompt.is_empty() {
        anyhow::bail!("the prompt is empty");
    }
    Ok(prompt)
}

/// The one sequence's model, runner and KV blocks (a pool of enough for `total` tokens).
struct Sequence<'m> {
    model: &'m Model,
    runner: Runner,
    table: kvcache::BlockTable,
}

impl<'m> Sequence<'m> {
    fn new(model: &'m Model, prompt: usize, total: usize) -> anyhow::Result<Self> {
        let blocks = total.div_ceil(BLOCK_SIZE);
        let pool = BlockPool::with_blocks(BLOCK_SIZE, blocks as u32)
            .map_err(|e| anyhow!("KV cache: {e}"))?;
        let mut table = pool.new_table();
        table.append(prompt).map_err(|e| anyhow!("KV cache: {e}"))?;
        let runner = Runner::new(model, BLOCK_SIZE, blocks);
        Ok(Self {
            model,
            runner,
            table,
        })
    }

    /// One forward pass over new tokens at `start`; the last row's logits.
    fn forward(&mut self, tokens: &[u32], start: usize) -> anyhow::Result<Vec<f32>> {
        let blocks: Vec<u32> = self.table.blocks().iter().map(|b| b.get()).collect();
        let input = SeqInput {
            tokens,
            start_pos: start,
            blocks: &blocks,
            logits: LogitsFor::Last,
            tree: None,
        };
        let logits = self.runner.forward(self.model, &[input])?;
        Ok(logits.last(0).to_vec())
    }
}

/// Samples and streams tokens to stdout until an end of generation, `--max-tokens` or `total`
/// tokens in all; the generated ids.
fn decode(
    args: &GenerateArgs,
    tokenizer: &Tokenizer,
    seq: &mut Sequence<'_>,
    sampler: &mut Sampler,
    prompt: &[u32],
    total: usize,
    mut logits: Vec<f32>,
) -> anyhow::Result<Vec<u32>> {
    let mut stdout = std::io::stdout();
    let mut decoder = IncrementalDecoder::new(true);
    let mut tokens = prompt.to_vec();
    let mut ids = Vec::new();
    loop {
        let next = sampler.sample(&mut logits, None).token;
        ids.push(next);
        let eog = tokenizer.is_eog(next) && !args.ignore_eos;
        if !eog {
            let piece = decoder
                .push(tokenizer, next)
                .context("cannot decode a token")?;
            stdout
                .write_all(piece.as_bytes())
                .context("writing to stdout")?;
            stdout.flush().ok();
        }
        if eog || ids.len() >= args.max_tokens || tokens.len() + 1 >= total {
            break;
        }
        let pos = tokens.len();
        tokens.push(next);
        seq.table.append(1).map_err(|e| anyhow!("KV cache: {e}"))?;
        logits = seq.forward(&tokens[pos..], pos)?;
    }
    let tail = decoder.flush();
    stdout
        .write_all(tail.as_bytes())
        .context("writing to stdout")?;
    println!();
    Ok(ids)
}
