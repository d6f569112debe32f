//! Stage 3: the trainer (`train/eagle3_train.py`, JAX on the CPU, chosen for its speed here: see
//! docs/training.md) run in its own virtual environment with pinned packages, its progress lines
//! shown as a bar, its per-epoch metrics drawn as an SVG, and the head it writes loaded back as
//! the server would load it.

use anyhow::{Context, anyhow, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use plotters::prelude::*;
use serde::Deserialize;
use speculative::eagle3::{Eagle3Head, TargetShape, default_capture_layers};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The trainer and its pinned requirements, built into the binary so that it runs anywhere.
const SCRIPT: &str = include_str!("../../../../train/eagle3_train.py");
const REQUIREMENTS: &str = include_str!("../../../../train/requirements.txt");

/// The draft vocabulary's size when neither `--draft-vocab-size` nor `--init-head` gives one.
const DEFAULT_DRAFT_VOCAB: usize = 4096;

/// The training settings (SpecForge's names where it has them).
#[derive(Args, Debug, Clone)]
pub struct TrainSettings {
    /// Rows of the head's output layer: the most frequent answer tokens (larger ones accepted no
    /// better and trained slower: docs/training.md) [default: 4096, or --init-head's].
    #[arg(long)]
    pub draft_vocab_size: Option<usize>,
    /// A head in SGLang's layout to start from (its weights and draft vocabulary, with a new
    /// optimizer and warmup) instead of a new one: training goes on from a shipped head or an
    /// earlier run's on new data.
    #[arg(long)]
    pub init_head: Option<PathBuf>,
    /// Passes over the data.
    #[arg(long, default_value_t = 3)]
    pub num_epochs: usize,
    /// Steps the head is unrolled on its own outputs in training (EAGLE-3's training-time test).
    #[arg(long, default_value_t = 3)]
    pub ttt_length: usize,
    /// Peak learning rate (AdamW; warmup then cosine decay).
    #[arg(long, default_value_t = 2e-3)]
    pub learning_rate: f64,
    /// Tokens per optimizer step.
    #[arg(long, default_value_t = 512)]
    pub batch_tokens: usize,
    /// Python interpreter that makes the trainer's virtual environment.
    #[arg(long, default_value = "python3")]
    pub python: String,
}

impl TrainSettings {
    pub fn check(&self) -> anyhow::Result<()> {
        for (flag, v) in [
            ("--draft-vocab-size", self.draft_vocab_size.unwrap_or(1)),
            ("--num-epochs", self.num_epochs),
            ("--ttt-length", self.ttt_length),
            ("--batch-tokens", self.batch_tokens),
        ] {
            if v == 0 {
                bail!("{flag} must be at least 1");
            }
        }
        if !self.learning_rate.is_finite() || self.learning_rate <= 0.0 {
            bail!("--learning-rate must be positive");
        }
        Ok(())
    }

    /// The draft vocabulary's size: `--init-head`'s (checked against `target` and the layers
    /// train-draft captures), else `--draft-vocab-size` or its default.
    pub fn draft_vocab(&self, target: TargetShape) -> anyhow::Result<usize> {
        let Some(dir) = &self.init_head else {
            return Ok(self.draft_vocab_size.unwrap_or(DEFAULT_DRAFT_VOCAB));
        };
        if !dir.is_dir() {
            bail!(
                "--init-head {} is not a head folder in SGLang's layout (config.json, model.safetensors)",
                dir.display()
            );
        }
        let head = Eagle3Head::load(dir, target)
            .map_err(|e| anyhow!("--init-head {}: {e}", dir.display()))?;
        let c = &head.config;
        if Some(c.capture_layers) != default_capture_layers(target.n_layers) {
            bail!(
                "--init-head {} reads the target's layers {:?}; train-draft captures {:?}",
                dir.display(),
                c.capture_layers,
                default_capture_layers(target.n_layers)
            );
        }
        if c.norm_before_residual {
            bail!(
                "--init-head {}: heads with norm_before_residual are not trained here",
                dir.display()
            );
        }
        match self.draft_vocab_size {
            Some(n) if n != c.draft_vocab => bail!(
                "--draft-vocab-size {n} differs from --init-head's {}",
                c.draft_vocab
            ),
            _ => Ok(c.draft_vocab),
        }
    }
}

/// One line the trainer prints.
#[derive(Debug, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum Progress {
    Start { steps: u64, tokens: u64 },
    Step { step: u64, loss: f64 },
    Epoch(EpochMetrics),
    Done,
}

/// An epoch's figures.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct EpochMetrics {
    pub epoch: usize,
    pub train_loss: f64,
    pub held_out_loss: f64,
    /// Mean tokens a verification would emit with a chain of `ttt_length` drafts (greedy).
    pub held_out_acceptance: f64,
    pub tokens_per_second: f64,
}

/// A virtual environment with the trainer's requirements, made once per requirements text.
fn venv(python: &str) -> anyhow::Result<PathBuf> {
    let hash = kvcache::fnv1a(kvcache::FNV_OFFSET, REQUIREMENTS.as_bytes());
    let dir = crate::assets::cache_home()?.join(format!("venvs/train-{hash:016x}"));
    let py = dir.join("bin/python");
    if py.is_file() && dir.join("ready").is_file() {
        return Ok(py);
    }
    eprintln!("making the trainer's environment in {} ...", dir.display());
    let status = Command::new(python)
        .args(["-m", "venv"])
        .arg(&dir)
        .status()
        .with_context(|| format!("cannot run {python}"))?;
    if !status.success() {
        bail!("{python} -m venv failed");
    }
    let reqs = dir.join("requirements.txt");
    std::fs::write(&reqs, REQUIREMENTS)?;
    let status = Command::new(&py)
        .args(["-m", "pip", "install", "--quiet", "-r"])
        .arg(&reqs)
        .status()?;
    if !status.success() {
        bail!(
            "cannot install the trainer's packages (pip install -r {})",
            reqs.display()
        );
    }
    std::fs::write(dir.join("ready"), "")?;
    Ok(py)
}

/// Trains on the streams in `features` into `work/head`; resumes from `work/checkpoint`.
pub fn train(
    features: &Path,
    work: &Path,
    settings: &TrainSettings,
    draft_vocab: usize,
    seed: u64,
) -> anyhow::Result<Vec<EpochMetrics>> {
    let py = venv(&settings.python)?;
    let script = work.join("eagle3_train.py");
    std::fs::write(&script, SCRIPT)?;
    let mut child = Command::new(py)
        .arg(&script)
        .arg("--features")
        .arg(features)
        .arg("--work")
        .arg(work)
        .args([
            "--draft-vocab-size",
            &draft_vocab.to_string(),
            "--num-epochs",
            &settings.num_epochs.to_string(),
            "--ttt-length",
            &settings.ttt_length.to_string(),
            "--learning-rate",
            &settings.learning_rate.to_string(),
            "--batch-tokens",
            &settings.batch_tokens.to_string(),
            "--seed",
            &seed.to_string(),
        ])
        .args(
            settings
                .init_head
                .iter()
                .flat_map(|h| [OsStr::new("--init-head"), h.as_os_str()]),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("cannot start the trainer")?;
    let stdout = child.stdout.take().expect("piped");
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template(
            "training {bar:40} {pos}/{len} steps {msg} [{elapsed} < {eta}]",
        )
        .expect("a valid template"),
    );
    let mut epochs = Vec::new();
    let mut done = false;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        match serde_json::from_str::<Progress>(&line) {
            Ok(Progress::Start { steps, tokens }) => {
                bar.set_length(steps);
                bar.suspend(|| eprintln!("{tokens} training tokens, {steps} optimizer steps"));
            }
            Ok(Progress::Step { step, loss }) => {
                bar.set_position(step);
                bar.set_message(format!("loss {loss:.3}"));
            }
            Ok(Progress::Epoch(m)) => {
                bar.suspend(|| {
                    eprintln!(
                        "epoch {}: train loss {:.3}, held-out loss {:.3}, acceptance length \
                         {:.2}, {:.0} tokens/s",
                        m.epoch,
                        m.train_loss,
                        m.held_out_loss,
                        m.held_out_acceptance,
                        m.tokens_per_second
                    )
                });
                epochs.push(m);
            }
            Ok(Progress::Done) => done = true,
            Err(_) => bar.suspend(|| eprintln!("{line}")),
        }
    }
    let status = child.wait()?;
    bar.finish();
    if !status.success() || !done {
        bail!("the trainer failed ({status})");
    }
    record_metrics(work, epochs)
}

/// Writes `metrics.json` and `training.svg` with every epoch so far: a resumed run reports only
/// the epochs it ran (`ran`), the earlier ones come from the last file.
fn record_metrics(work: &Path, ran: Vec<EpochMetrics>) -> anyhow::Result<Vec<EpochMetrics>> {
    let path = work.join("metrics.json");
    let earlier: Vec<EpochMetrics> = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    let first = ran.first().map_or(usize::MAX, |e| e.epoch);
    let mut epochs: Vec<EpochMetrics> = earlier
        .into_iter()
        .filter(|e| e.epoch < first)
        .chain(ran)
        .collect();
    epochs.sort_by_key(|e| e.epoch);
    std::fs::write(&path, serde_json::to_string_pretty(&epochs)?)?;
    if !epochs.is_empty() {
        plot(&epochs, &work.join("training.svg"))?;
    }
    Ok(epochs)
}

/// Loss (train and held out) and held-out acceptance length per epoch, side by side.
fn plot(epochs: &[EpochMetrics], path: &Path) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (960, 400)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(480);
    let last = epochs.last().map_or(1, |e| e.epoch).max(1);
    let xs = 0f64..last as f64 + 0.5;
    let max_loss = epochs
        .iter()
        .map(|e| e.train_loss.max(e.held_out_loss))
        .fold(0.0, f64::max);
    let mut chart = ChartBuilder::on(&left)
        .caption("loss per epoch", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(xs.clone(), 0f64..max_loss * 1.1)?;
    chart.configure_mesh().x_desc("epoch").draw()?;
    for (name, color, get) in [
        (
            "train",
            BLUE,
            (|e: &EpochMetrics| e.train_loss) as fn(&EpochMetrics) -> f64,
        ),
        ("held out", RED, |e: &EpochMetrics| e.held_out_loss),
    ] {
        chart
            .draw_series(LineSeries::new(
                epochs.iter().map(|e| (e.epoch as f64, get(e))),
                color,
            ))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE)
        .draw()?;
    let max_acc = epochs
        .iter()
        .map(|e| e.held_out_acceptance)
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&right)
        .caption("held-out acceptance length", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(xs, 1f64..max_acc * 1.1)?;
    chart.configure_mesh().x_desc("epoch").draw()?;
    chart.draw_series(LineSeries::new(
        epochs
            .iter()
            .map(|e| (e.epoch as f64, e.held_out_acceptance)),
        GREEN,
    ))?;
    root.present()?;
    Ok(())
}
