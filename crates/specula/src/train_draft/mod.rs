//! `specula train-draft`: an EAGLE-3 head for a target, trained on this machine. Three stages in
//! one work folder, each resumable: the target answers ShareGPT's first turns (self-distillation)
//! or the dataset's own answers are taken (`sequences.jsonl`), the runtime captures the streams
//! the head reads (`features/`), and the trainer fits the head with EAGLE-3's training-time test
//! (`head/`, in SGLang's layout).

mod answers;
mod features;
mod trainer;

use crate::Failure;
use anyhow::{Context, anyhow, bail};
use bench::workload::Exchange;
use clap::{Args, ValueEnum};
use model::gguf::GgufFile;
use model::{Model, ModelConfig};
use speculative::eagle3::TargetShape;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct TrainDraftArgs {
    /// The target: a GGUF file or a model name [default: SmolLM2-135M-Instruct Q4_1].
    #[arg(long)]
    model: Option<PathBuf>,
    /// The work folder (data, streams, checkpoints); the head is written to OUTPUT/head.
    #[arg(long)]
    output: PathBuf,
    /// Prompts: `sharegpt` (first turns of ShareGPT V3) or a ShareGPT .json / .jsonl file.
    #[arg(long, default_value = "sharegpt")]
    dataset: String,
    /// Whose answers the head learns from: `target` (the target answers each prompt itself:
    /// self-distillation, slow) or `dataset` (the dataset's own answers, read by the target in
    /// one pass; the loss is still against the target's distribution at every token).
    #[arg(long, value_enum, default_value_t = AnswerSource::Target)]
    answers: AnswerSource,
    /// Prompts answered for training.
    #[arg(long, default_value_t = 2000)]
    num_prompts: usize,
    /// Prompts after those, kept out of training: written to OUTPUT/held_out.jsonl for
    /// `specula bench --dataset`.
    #[arg(long, default_value_t = 200)]
    held_out: usize,
    /// Prompts rendering longer than this are skipped.
    #[arg(long, default_value_t = 512)]
    max_prompt_tokens: usize,
    /// Longest answer.
    #[arg(long, default_value_t = 256)]
    max_new_tokens: usize,
    /// Sampling temperature of the answers.
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    /// Requests answered at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Bound on the captured streams kept on disk, in GB.
    #[arg(long, default_value_t = 8.0)]
    max_feature_gb: f64,
    #[command(flatten)]
    train: trainer::TrainSettings,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum AnswerSource {
    Target,
    Dataset,
}

pub async fn run(args: TrainDraftArgs) -> Result<(), Failure> {
    if args.num_prompts == 0 {
        return Err(anyhow!("--num-prompts must be at least 1").into());
    }
    if args.max_feature_gb.is_nan() || args.max_feature_gb <= 0.0 {
        return Err(anyhow!("--max-feature-gb must be positive").into());
    }
    args.train.check()?;
    let path = crate::models::resolve(args.model.as_deref())?;
    // A head to start from is checked before the hours of answering.
    let draft_vocab = args.train.draft_vocab(target_shape(&path)?)?;
    std::fs::create_dir_all(&args.output)
        .with_context(|| format!("cannot create {}", args.output.display()))?;
    let samples = answer_stage(&args, &path).await?;
    let features = args.output.join("features");
    features_stage(&args, &path, &samples, &features)?;
    trainer::train(&features, &args.output, &args.train, draft_vocab, args.seed)?;
    println!("head written to {}", args.output.join("head").display());
    Ok(())
}

/// The shape a head for the model in `path` must have (from the file's metadata alone).
fn target_shape(path: &Path) -> anyhow::Result<TargetShape> {
    let file = GgufFile::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(crate::heads::target_shape(&ModelConfig::from_gguf(&file)?))
}

/// The prompts with the dataset's answers, in file order: the first `num_prompts` for
/// training, the next `held_out` kept.
async fn prompts(args: &TrainDraftArgs) -> anyhow::Result<(Vec<Exchange>, Vec<String>)> {
    let file = if args.dataset == "sharegpt" {
        tokio::task::spawn_blocking(crate::assets::sharegpt_path).await??
    } else {
        PathBuf::from(&args.dataset)
    };
    let (mut exchanges, _) = bench::workload::load_exchanges(&file)?;
    if exchanges.len() < args.num_prompts {
        bail!(
            "{} has {} prompts; --num-prompts asks for {}",
            file.display(),
            exchanges.len(),
            args.num_prompts
        );
    }
    let held = exchanges[args.num_prompts..]
        .iter()
        .take(args.held_out)
        .map(|e| e.prompt.text())
        .collect();
    exchanges.truncate(args.num_prompts);
    if args.answers == AnswerSource::Dataset && exchanges.iter().all(|e| e.reply.is_none()) {
        bail!(
            "{} has no answers to learn from (--answers dataset needs a ShareGPT file whose conversations open with a person's turn and the assistant's answer)",
            file.display()
        );
    }
    Ok((exchanges, held))
}

/// Stage 1: the target's answers (resumed where a previous run stopped).
async fn answer_stage(args: &TrainDraftArgs, model: &Path) -> anyhow::Result<Vec<answers::Sample>> {
    let out = args.output.join("sequences.jsonl");
    let (exchanges, held) = prompts(args).await?;
    let held_path = args.output.join("held_out.jsonl");
    let lines: Vec<String> = held
        .iter()
        .map(|p| serde_json::json!({"prompt": p}).to_string())
        .collect();
    std::fs::write(&held_path, lines.join("\n") + "\n")?;
    let settings = answers::AnswerSettings {
        max_prompt_tokens: args.max_prompt_tokens,
        max_new_tokens: args.max_new_tokens,
        temperature: args.temperature,
        concurrency: args.concurrency,
        seed: args.seed,
    };
    if args.answers == AnswerSource::Dataset {
        if !out.is_file() {
            let written = answers::from_dataset(model, &exchanges, settings, &out)?;
            eprintln!("{written} of the dataset's answers tokenized");
        }
        return answers::read_samples(&out);
    }
    let train: Vec<String> = exchanges.iter().map(|e| e.prompt.text()).collect();
    // Resume: answers are appended in completion order, so every prompt is rendered again and
    // those already answered are skipped by their tokens.
    let done = answers::read_samples(&out)?;
    if done.len() < train.len() {
        answers::generate(model, &train, settings, &done, &out).await?;
    }
    answers::read_samples(&out)
}

/// Stage 2: the streams (skipped when `features/meta.json` says they are complete).
fn features_stage(
    args: &TrainDraftArgs,
    path: &Path,
    samples: &[answers::Sample],
    dir: &Path,
) -> anyhow::Result<()> {
    let meta_path = dir.join("meta.json");
    if meta_path.is_file() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    let mut model = Model::load(path).with_context(|| format!("cannot load {}", path.display()))?;
    // The head reads what the engine captures: the same activation mode as `serve`'s default.
    model.activations = kernels::quant::ActMode::default();
    let layers = speculative::eagle3::default_capture_layers(model.config.n_layers)
        .ok_or_else(|| anyhow!("a target of under 4 layers cannot have an EAGLE-3 head"))?;
    features::write_target(&model, &dir.join("target.safetensors"))?;
    let max_bytes = (args.max_feature_gb * 1e9) as usize;
    eprintln!(
        "capturing the target's streams of {} samples ...",
        samples.len()
    );
    let tokens = features::write_shards(&model, samples, layers, dir, max_bytes)?;
    let meta = features::meta(&model, layers, tokens);
    std::fs::write(&meta_path, serde_json::to_string_pretty(&meta)?)?;
    Ok(())
}
