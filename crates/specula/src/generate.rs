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
    /// A GGUF model [default: SmolLM2-135M-Instruct Q4_1, fetched on first use].
    #[arg(long)]
    model: Option<PathBuf>,
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
    let path = crate::model_cmd::resolve(args.model)?;
    let model = Model::load(&path).with_context(|| format!("cannot load {}", path.display()))?;
    let tokenizer = Tokenizer::from_gguf(&model.file).context("cannot build the tokenizer")?;
    let text = if args.chat {
        let template = model::chat_template::ChatTemplate::from_gguf(&model.file, &tokenizer)
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
        return Err(anyhow!("the prompt is empty").into());
    }
    let context = model.config.context_length;
    let total = (prompt.len() + args.max_tokens).min(context);
    if prompt.len() >= context {
        return Err(anyhow!(
            "the prompt has {} tokens; the model's context is {context}",
            prompt.len()
        )
        .into());
    }

    let pool = BlockPool::with_blocks(BLOCK_SIZE, total.div_ceil(BLOCK_SIZE) as u32)
        .map_err(|e| anyhow!("KV cache: {e}"))?;
    let mut table = pool.new_table();
    table
        .append(prompt.len())
        .map_err(|e| anyhow!("KV cache: {e}"))?;
    let mut runner = Runner::new(&model.config, BLOCK_SIZE, pool.total_blocks() as usize);
    let mut sampler = Sampler::new(params, &prompt);
    let mut decoder = IncrementalDecoder::new(true);
    let mut stdout = std::io::stdout();

    // One forward pass over new tokens at `start`; the last row's logits.
    let mut step = |tokens: &[u32], start: usize, table: &kvcache::BlockTable| {
        let blocks: Vec<u32> = table.blocks().iter().map(|b| b.get()).collect();
        let input = SeqInput {
            tokens,
            start_pos: start,
            blocks: &blocks,
            logits: LogitsFor::Last,
            tree: None,
        };
        runner.forward(&model, &[input]).map(|l| l.last(0).to_vec())
    };

    let t0 = Instant::now();
    let mut tokens = prompt.clone();
    let mut logits = Vec::new();
    for start in (0..prompt.len()).step_by(PREFILL_CHUNK) {
        let end = (start + PREFILL_CHUNK).min(prompt.len());
        logits = step(&prompt[start..end], start, &table)?;
    }
    let prefill_s = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let mut generated = 0usize;
    let mut ids_out = Vec::new();
    loop {
        let next = sampler.sample(&mut logits, None).token;
        generated += 1;
        ids_out.push(next);
        let eog = tokenizer.is_eog(next) && !args.ignore_eos;
        if !eog {
            let piece = decoder
                .push(&tokenizer, next)
                .context("cannot decode a token")?;
            stdout
                .write_all(piece.as_bytes())
                .context("writing to stdout")?;
            stdout.flush().ok();
        }
        if eog || generated >= args.max_tokens || tokens.len() + 1 >= total {
            break;
        }
        let pos = tokens.len();
        tokens.push(next);
        table.append(1).map_err(|e| anyhow!("KV cache: {e}"))?;
        logits = step(&tokens[pos..], pos, &table)?;
    }
    let decode_s = t1.elapsed().as_secs_f64();
    let tail = decoder.flush();
    stdout
        .write_all(tail.as_bytes())
        .context("writing to stdout")?;
    println!();
    // Decode speed counts the forward passes after the first token (which came from the prefill).
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
        let ids: Vec<String> = ids_out.iter().map(u32::to_string).collect();
        println!("ids: {}", ids.join(" "));
    }
    Ok(())
}
