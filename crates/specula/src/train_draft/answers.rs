//! Training sequences, kept as token ids in `sequences.jsonl` (one line a prompt; the prompt as
//! the chat template renders it): self-distillation, each prompt answered by the target itself
//! through the engine (many at once, continuous batching; resumable), or the dataset's own
//! answers tokenized.

use anyhow::{Context, bail};
use bench::workload::Exchange;
use engine::{EngineConfig, GenerateRequest, TokenEvent};
use indicatif::{ProgressBar, ProgressStyle};
use model::Model;
use model::chat_template::{ChatOptions, ChatTemplate};
use model::sampler::SamplingParams;
use model::tokenizer::Tokenizer;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::Path;

/// One training sequence: the rendered prompt's tokens and the target's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sample {
    pub prompt: Vec<u32>,
    pub answer: Vec<u32>,
}

/// How answers are generated.
#[derive(Debug, Clone, Copy)]
pub struct AnswerSettings {
    pub max_prompt_tokens: usize,
    pub max_new_tokens: usize,
    pub temperature: f32,
    pub concurrency: usize,
    pub seed: u64,
}

/// Reads the samples written so far (a cut-off last line is dropped).
pub fn read_samples(path: &Path) -> anyhow::Result<Vec<Sample>> {
    if !path.is_file() {
        return Ok(Vec::new());
    }
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut out = Vec::new();
    for line in std::io::BufReader::new(file).lines() {
        match serde_json::from_str(&line?) {
            Ok(s) => out.push(s),
            Err(_) => break,
        }
    }
    Ok(out)
}

/// The renderings of `prompts` still to answer: those within `max_prompt_tokens` whose rendering
/// is not the prompt of a sample in `done`, with a line saying how many.
fn unanswered(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    prompts: &[String],
    max_prompt_tokens: usize,
    done: &[Sample],
) -> anyhow::Result<Vec<Vec<u32>>> {
    let answered: std::collections::HashSet<&[u32]> =
        done.iter().map(|s| s.prompt.as_slice()).collect();
    let (mut rendered, mut too_long) = (Vec::new(), 0);
    for p in prompts {
        let ids = render(template, tokenizer, p)?;
        if ids.is_empty() || ids.len() > max_prompt_tokens {
            too_long += usize::from(!ids.is_empty());
        } else if !answered.contains(ids.as_slice()) {
            rendered.push(ids);
        }
    }
    if !rendered.is_empty() {
        eprintln!(
            "answering {} prompts with the target ({} answered before, {too_long} render over \
             --max-prompt-tokens) ...",
            rendered.len(),
            done.len()
        );
    }
    Ok(rendered)
}

/// Answers `prompts` (user messages) with the model at `model_path`, appending each finished
/// sample to `out`; prompts whose rendering is over the limit, or is the prompt of a sample in
/// `done`, are skipped. Returns the count written.
pub async fn generate(
    model_path: &Path,
    prompts: &[String],
    settings: AnswerSettings,
    done: &[Sample],
    out: &Path,
) -> anyhow::Result<usize> {
    let mut model =
        Model::load(model_path).with_context(|| format!("cannot load {}", model_path.display()))?;
    // Long answers at many at once spend most of a step reading the KV cache; f16 halves
    // that. The answers are training text, not a reference: the features are recomputed later.
    model.kv_cache_dtype = model::KvDtype::F16;
    let (tokenizer, template) = chat_of(&model)?;
    let rendered = unanswered(
        &template,
        &tokenizer,
        prompts,
        settings.max_prompt_tokens,
        done,
    )?;
    if rendered.is_empty() {
        return Ok(0);
    }
    let per_seq = settings.max_prompt_tokens + settings.max_new_tokens;
    let config = EngineConfig {
        max_running: settings.concurrency,
        max_queued: rendered.len().max(1),
        max_total_tokens: (settings.concurrency * per_seq).next_multiple_of(16),
        chunked_prefill_size: 2048,
        context_length: model.config.context_length,
        block_size: kvcache::DEFAULT_BLOCK_SIZE,
        speculative: None,
        prefix_cache: true,
        schedule_policy: Default::default(),
        host_cache_blocks: 0,
        hicache_storage_dir: None,
        model_fingerprint: String::new(),
        grammar_forced_drafts: false,
        test_fault: None,
    };
    let eog = tokenizer.eog_ids().to_vec();
    let handle = engine::start(model, None, config, eog).context("cannot start the engine")?;
    let bar = ProgressBar::new(rendered.len() as u64).with_style(
        ProgressStyle::with_template("answers {bar:40} {pos}/{len} [{elapsed} < {eta}]")
            .expect("a valid template"),
    );
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)
        .with_context(|| format!("cannot write {}", out.display()))?;
    let mut tasks = tokio::task::JoinSet::new();
    for (i, prompt) in rendered.into_iter().enumerate() {
        let request = GenerateRequest {
            prompt: prompt.clone(),
            max_tokens: settings.max_new_tokens,
            sampling: SamplingParams {
                temperature: settings.temperature,
                seed: settings.seed.wrapping_add(i as u64),
                ..SamplingParams::default()
            },
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            logprobs: None,
            scripted: Vec::new(),
            constraint: None,
            embed: false,
        };
        let mut stream = handle.submit(request)?;
        tasks.spawn(async move {
            let mut answer = Vec::new();
            while let Some(event) = stream.events.recv().await {
                match event {
                    TokenEvent::Token { id, .. } => answer.push(id),
                    TokenEvent::Finished { .. } => break,
                    TokenEvent::Failed(f) => bail!("a generation failed: {f}"),
                    TokenEvent::Admitted { .. } | TokenEvent::Embedding(_) => {}
                }
            }
            anyhow::Ok(Sample { prompt, answer })
        });
    }
    let mut written = 0;
    while let Some(done) = tasks.join_next().await {
        let sample = done??;
        writeln!(file, "{}", serde_json::to_string(&sample)?)?;
        written += 1;
        bar.inc(1);
    }
    bar.finish();
    Ok(written)
}

/// The target's tokenizer and chat template.
fn chat_of(model: &Model) -> anyhow::Result<(Tokenizer, ChatTemplate)> {
    let tokenizer = Tokenizer::from_gguf(&model.file).context("cannot build the tokenizer")?;
    let template = ChatTemplate::from_gguf(&model.file, &tokenizer)
        .context("the target has no usable chat template")?;
    Ok((tokenizer, template))
}

/// A user message as the target's chat template renders it for an answer, in tokens.
fn render(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    prompt: &str,
) -> anyhow::Result<Vec<u32>> {
    let messages = [serde_json::json!({"role": "user", "content": prompt})];
    let text = template.render(&messages, &ChatOptions::default())?;
    Ok(tokenizer.encode(&text, true, true)?)
}

/// Writes the dataset's own answers as samples: each answered prompt rendered as `generate`
/// renders it, its answer tokenized as plain text (special-token spellings in it stay text) and
/// cut at `max_new_tokens`, an uncut answer closed by the end-of-turn token. Written whole or
/// not at all (through a temporary file). Returns the count written.
pub fn from_dataset(
    model_path: &Path,
    exchanges: &[Exchange],
    settings: AnswerSettings,
    out: &Path,
) -> anyhow::Result<usize> {
    let model =
        Model::load(model_path).with_context(|| format!("cannot load {}", model_path.display()))?;
    let (tokenizer, template) = chat_of(&model)?;
    let end = *tokenizer
        .eog_ids()
        .first()
        .context("the target has no end-of-turn token")?;
    let partial = out.with_extension("jsonl.partial");
    let mut file = std::io::BufWriter::new(
        std::fs::File::create(&partial)
            .with_context(|| format!("cannot write {}", partial.display()))?,
    );
    let mut written = 0;
    for e in exchanges {
        let Some(reply) = &e.reply else { continue };
        let prompt = render(&template, &tokenizer, &e.prompt.text())?;
        if prompt.is_empty() || prompt.len() > settings.max_prompt_tokens {
            continue;
        }
        let mut answer = tokenizer.encode(reply, false, false)?;
        if answer.len() >= settings.max_new_tokens {
            answer.truncate(settings.max_new_tokens);
        } else {
            answer.push(end);
        }
        writeln!(
            file,
            "{}",
            serde_json::to_string(&Sample { prompt, answer })?
        )?;
        written += 1;
    }
    file.flush()?;
    drop(file);
    std::fs::rename(&partial, out)?;
    Ok(written)
}
