//! `specula model`: fetch the default model, or describe a GGUF file.

use crate::Failure;
use anyhow::Context;
use clap::{Args, Subcommand};
use model::gguf::GgufFile;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Args)]
pub struct ModelArgs {
    #[command(subcommand)]
    action: ModelAction,
}

#[derive(Subcommand)]
enum ModelAction {
    /// Fetch the default model (SmolLM2-135M-Instruct Q4_1) into the cache and print its path.
    Pull,
    /// Measure the runtime's prompt, decode and batched-decode speed (like llama-bench).
    Bench(crate::model_bench::ModelBenchArgs),
    /// Print a GGUF model's architecture, configuration and tensor types.
    Info {
        /// A GGUF file [default: the default model].
        #[arg(long)]
        model: Option<PathBuf>,
    },
}

/// Per weight type of the file's matrices (2-D tensors), how its products run on this CPU.
fn print_product_paths(file: &GgufFile) {
    let isa = kernels::gemm::isa();
    let mut matrices: BTreeMap<String, (usize, kernels::gemm::ProductPath)> = BTreeMap::new();
    for t in file.tensors().iter().filter(|t| t.shape.len() == 2) {
        let path = kernels::gemm::product_path(t.dtype, isa);
        matrices.entry(t.dtype.to_string()).or_insert((0, path)).0 += 1;
    }
    println!("  matrix products ({isa:?} kernels):");
    for (dtype, (count, path)) in matrices {
        println!("    {dtype:<6} {count:>4} tensors: {path}");
    }
}

/// `--model PATH`, or the default model (fetched if needed).
pub fn resolve(model: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    match model {
        Some(p) if p.is_file() => Ok(p),
        Some(p) => anyhow::bail!("model file {} does not exist", p.display()),
        None => crate::assets::default_model(),
    }
}

pub fn run(args: ModelArgs) -> Result<(), Failure> {
    match args.action {
        ModelAction::Pull => {
            println!("{}", crate::assets::default_model()?.display());
        }
        ModelAction::Bench(args) => crate::model_bench::run(args)?,
        ModelAction::Info { model } => {
            let path = resolve(model)?;
            let file = GgufFile::open(&path)?;
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
            println!("  {cfg:?}");
            println!("  tensor types: {types:?}");
            print_product_paths(&file);
        }
    }
    Ok(())
}
