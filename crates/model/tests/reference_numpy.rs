//! Correctness against independent references: teacher-forced over a 3,128-token text, specula's
//! next-token distributions against an exact float64 NumPy forward pass (over weights dequantised
//! by the `gguf` package), with llama.cpp's figures on the same positions beside ours.
//! Fixtures and the scripts that made them: scripts/reference/ (see its README).
//!
//! One test per weight format: the shipped Q4_1 file, and the Q4_K_M, Q4_0 and IQ4_XS files
//! (the last mostly IQ4_NL: rows of 576 are not whole IQ4_XS super-blocks) that
//! scripts/requantize.sh makes from it (each with its own reference, computed on that file's own
//! weights, in `data/reference/FORMAT/`); and one per other real model, by the name `specula model
//! pull` knows it by (`data/reference/NAME/`, with its own tokens); and one per architecture that
//! no reachable file has (qwen3, Llama 3's RoPE scaling; and a small gemma3 whose window the
//! chunks cross many times), on tiny random-weight models written by
//! scripts/reference/synthetic.sh (`data/reference/synthetic/`, models and tokens committed).
//! Each runs both activation modes and prints a table row per mode (`cargo test --release --test
//! reference_numpy -- --nocapture`). Int16 must be at least as good as llama.cpp; Int8 (what
//! llama.cpp itself does) must stay close to it. Int8 runs twice: with the default f32 KV cache,
//! and with the f16 one (`--kv-cache-dtype f16`, llama.cpp's default), which may add at most a
//! quarter to its KL.
//!
//! The requantised formats' and the named models' tests are tier 2 (`#[ignore]`d: they need files
//! the default test run does not fetch); scripts/test-heavy.sh makes the files and runs them with
//! `--ignored` (docs/testing.md).

mod common;

use model::{ActMode, KvDtype, LogitsFor, Model, Runner, SeqInput};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

const K: usize = 20;
/// The fixtures' chunking: independent chunks of at most 1,024 tokens from an empty context.
const CHUNK: usize = 1024;
/// Int8 bounds against llama.cpp's figures: at least as good on top-1 and KL, the rule that made
/// it the default mode (README, "Activation modes"); a change that loses that must say so.
const INT8_TOP1_FRACTION: f64 = 1.0;
const INT8_KL_FACTOR: f64 = 1.0;
/// The f16 KV cache (`--kv-cache-dtype f16`, llama.cpp's default) on top of int8: top-1 still
/// at least llama.cpp's, and at most this factor on int8's KL with the f32 cache (it adds 19% on
/// Gemma 3 270M, still half of llama.cpp's; up to 8% on the others).
const F16_KV_KL_FACTOR: f64 = 1.25;

/// The tests take the CPUs one at a time (each forward already uses every core), which also
/// keeps their printed rows together.
static SERIAL: Mutex<()> = Mutex::new(());

fn read_u32(path: &Path) -> Vec<u32> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn read_f32(path: &Path) -> Vec<f32> {
    read_u32(path).into_iter().map(f32::from_bits).collect()
}

fn read_f64(path: &Path) -> Vec<f64> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    b.chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Figures of one implementation against the reference.
#[derive(Debug, Clone, Copy)]
struct Figures {
    top1_agreement: f64,
    /// KL(reference ‖ candidate) over the reference's top 20, the rest lumped into one outcome.
    mean_kl_top20: f64,
    perplexity: f64,
}

/// KL over the reference's top-20 ids plus the lumped remainder.
fn kl_top20(ref_lp: &[f32], cand_lp: &[f64]) -> f64 {
    let p: Vec<f64> = ref_lp.iter().map(|&l| f64::from(l).exp()).collect();
    let q: Vec<f64> = cand_lp.iter().map(|&l| l.exp()).collect();
    let (p_rest, q_rest) = (
        (1.0 - p.iter().sum::<f64>()).max(0.0),
        (1.0 - q.iter().sum::<f64>()).max(1e-300),
    );
    let mut kl: f64 = p
        .iter()
        .zip(&q)
        .map(|(&pi, &qi)| if pi > 0.0 { pi * (pi / qi).ln() } else { 0.0 })
        .sum();
    if p_rest > 0.0 {
        kl += p_rest * (p_rest / q_rest).ln();
    }
    kl
}

/// One format's fixtures: the reference's top-20 and targets, llama.cpp's figures on the same
/// file, and the model file they were made from.
struct Fixture {
    format: &'static str,
    model: PathBuf,
    tokens: Vec<u32>,
    ref_ids: Vec<u32>,
    ref_lp: Vec<f32>,
    cpp: Figures,
    exact_ppl: f64,
    chunk: usize,
}

/// A model by name has lower-case letters, digits, dots and dashes; a format is upper-case.
fn is_model_name(name: &str) -> bool {
    name.contains(['.', '-']) && !name.bytes().any(|b| b.is_ascii_uppercase())
}

fn load_fixture(format: &'static str) -> Fixture {
    let base = common::data_dir("reference");
    // Q4_1's fixtures are the folder itself; a requantised format's are in a subfolder, with
    // the same tokens (regenerate.sh checks that) and llama.cpp's figures in meta.json only; a
    // named model's subfolder has its own tokens.
    let dir = if format == "Q4_1" {
        base.clone()
    } else {
        base.join(format)
    };
    let named = is_model_name(format);
    let synthetic = format.starts_with("synthetic/");
    let tokens_dir = match (named, synthetic) {
        (true, _) => dir.clone(),
        (_, true) => base.join("synthetic"),
        _ => base.clone(),
    };
    let tokens = read_u32(&tokens_dir.join("tokens.bin"));
    let n = tokens.len();
    assert!(
        synthetic || n >= 2000,
        "the text must have at least 2,000 tokens"
    );
    let meta_path = dir.join("meta.json");
    let meta: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&meta_path)
            .unwrap_or_else(|e| panic!("{}: {e}", meta_path.display())),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", meta_path.display()));
    assert_eq!(
        meta["n_pos"].as_u64(),
        Some(n as u64),
        "{format}: the fixtures are not over the Q4_1 fixture's {n} tokens"
    );
    let ref_ids = read_u32(&dir.join("numpy_top20_ids.bin"));
    let ref_lp = read_f32(&dir.join("numpy_top20_logprobs.bin"));
    let ref_target = read_f64(&dir.join("numpy_target_logprobs.bin"));
    assert_eq!(
        (ref_ids.len(), ref_lp.len(), ref_target.len()),
        (n * K, n * K, n - 1)
    );

    let file = meta["model"]["file"]
        .as_str()
        .expect("meta.json: model.file");
    let model = if named {
        common::named_model_path(format, file)
    } else if synthetic {
        tokens_dir.join(file)
    } else {
        common::requantized_model_path(format)
    };
    let want = meta["model"]["sha256"]
        .as_str()
        .expect("meta.json: model.sha256");
    let got = common::sha256_hex(&model);
    assert!(
        got == want,
        "{} is not the file the {format} fixtures were made from (SHA-256 {got}, fixtures {want}); \
         another llama.cpp version quantises differently: delete the file and run \
         scripts/requantize.sh {format} with the pinned llama.cpp, or regenerate the fixtures \
         (scripts/reference/regenerate.sh {format})",
        model.display()
    );

    let cpp = if dir.join("llamacpp_top20_ids.bin").is_file() {
        // Q4_1 keeps llama.cpp's own files: its figures computed here as ours are.
        let cpp_ids = read_u32(&dir.join("llamacpp_top20_ids.bin"));
        let cpp_at_ref = read_f32(&dir.join("llamacpp_logprobs_at_numpy_top20.bin"));
        let cpp_target = read_f64(&dir.join("llamacpp_target_logprobs.bin"));
        Figures {
            top1_agreement: (0..n).filter(|&p| cpp_ids[p * K] == ref_ids[p * K]).count() as f64
                / n as f64,
            mean_kl_top20: (0..n)
                .map(|p| {
                    let q: Vec<f64> = cpp_at_ref[p * K..(p + 1) * K]
                        .iter()
                        .map(|&l| f64::from(l))
                        .collect();
                    kl_top20(&ref_lp[p * K..(p + 1) * K], &q)
                })
                .sum::<f64>()
                / n as f64,
            perplexity: (-cpp_target.iter().sum::<f64>() / (n - 1) as f64).exp(),
        }
    } else {
        // The same three figures, computed by compare_llamacpp.py the same way.
        let vs = &meta["llamacpp"]["vs_reference"];
        let field = |key: &str| {
            vs[key]
                .as_f64()
                .unwrap_or_else(|| panic!("{}: llamacpp.vs_reference.{key}", meta_path.display()))
        };
        Figures {
            top1_agreement: field("top1_agree_positions") / n as f64,
            mean_kl_top20: field("kl_top20_lumped_mean_nats"),
            perplexity: field("perplexity"),
        }
    };
    let exact_ppl = (-ref_target.iter().sum::<f64>() / (n - 1) as f64).exp();
    let chunk = meta["chunking"]["chunk_size"]
        .as_u64()
        .map_or(CHUNK, |c| c as usize);
    Fixture {
        format,
        model,
        tokens,
        ref_ids,
        ref_lp,
        cpp,
        exact_ppl,
        chunk,
    }
}

/// Specula's figures on the fixture's tokens, with the model's current activation mode.
fn specula_figures(model: &Model, fx: &Fixture) -> Figures {
    let (tokens, ref_ids, ref_lp) = (&fx.tokens, &fx.ref_ids, &fx.ref_lp);
    let n = tokens.len();
    let blocks: Vec<u32> = (0..fx.chunk.div_ceil(16) as u32).collect();
    let mut runner = Runner::new(model, 16, blocks.len());
    let (mut agree, mut kl_sum, mut nll) = (0usize, 0.0f64, 0.0f64);
    for start in (0..n).step_by(fx.chunk) {
        let chunk = &tokens[start..(start + fx.chunk).min(n)];
        let input = SeqInput {
            tokens: chunk,
            start_pos: 0,
            blocks: &blocks,
            logits: LogitsFor::All,
            tree: None,
        };
        let logits = runner.forward(model, &[input]).unwrap();
        for (j, _) in chunk.iter().enumerate() {
            let pos = start + j;
            let row = logits.row(0, j);
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let log_z = f64::from(max)
                + row
                    .iter()
                    .map(|&l| f64::from(l - max).exp())
                    .sum::<f64>()
                    .ln();
            let lp = |id: u32| f64::from(row[id as usize]) - log_z;
            if model::sampler::argmax(row) == ref_ids[pos * K] {
                agree += 1;
            }
            let ours_at_ref: Vec<f64> = ref_ids[pos * K..(pos + 1) * K]
                .iter()
                .map(|&id| lp(id))
                .collect();
            kl_sum += kl_top20(&ref_lp[pos * K..(pos + 1) * K], &ours_at_ref);
            if pos + 1 < n {
                nll -= lp(tokens[pos + 1]);
            }
        }
    }
    Figures {
        top1_agreement: agree as f64 / n as f64,
        mean_kl_top20: kl_sum / n as f64,
        perplexity: (nll / (n - 1) as f64).exp(),
    }
}

/// What `mode` must achieve against llama.cpp on the same file; the failed checks, if any.
fn failures(format: &str, mode: ActMode, ours: &Figures, cpp: &Figures) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            out.push(format!("{format} {mode}: {what}"));
        }
    };
    match mode {
        ActMode::Int16 => {
            check(
                ours.top1_agreement >= cpp.top1_agreement,
                format!(
                    "top-1 agreement {:.3} % below llama.cpp's {:.3} %",
                    100.0 * ours.top1_agreement,
                    100.0 * cpp.top1_agreement
                ),
            );
            check(
                ours.mean_kl_top20 <= cpp.mean_kl_top20,
                format!(
                    "mean KL {:.6} above llama.cpp's {:.6}",
                    ours.mean_kl_top20, cpp.mean_kl_top20
                ),
            );
            check(
                ours.mean_kl_top20 <= 0.005,
                format!("mean KL {:.6} over 0.005 nats", ours.mean_kl_top20),
            );
            check(
                (ours.perplexity / cpp.perplexity - 1.0).abs() <= 0.01,
                format!(
                    "perplexity {:.4} over 1% from llama.cpp's {:.4}",
                    ours.perplexity, cpp.perplexity
                ),
            );
        }
        ActMode::Int8 => {
            check(
                ours.top1_agreement >= INT8_TOP1_FRACTION * cpp.top1_agreement,
                format!(
                    "top-1 agreement {:.3} % below {INT8_TOP1_FRACTION} × llama.cpp's {:.3} %",
                    100.0 * ours.top1_agreement,
                    100.0 * cpp.top1_agreement
                ),
            );
            check(
                ours.mean_kl_top20 <= INT8_KL_FACTOR * cpp.mean_kl_top20,
                format!(
                    "mean KL {:.6} above {INT8_KL_FACTOR} × llama.cpp's {:.6}",
                    ours.mean_kl_top20, cpp.mean_kl_top20
                ),
            );
        }
    }
    out
}

/// What int8 with an f16 KV cache must achieve against int8 with an f32 one and llama.cpp.
fn f16_kv_failures(format: &str, ours: &Figures, f32_kv: &Figures, cpp: &Figures) -> Vec<String> {
    let mut out = Vec::new();
    if ours.top1_agreement < INT8_TOP1_FRACTION * cpp.top1_agreement {
        out.push(format!(
            "{format} int8, f16 KV: top-1 agreement {:.3} % below llama.cpp's {:.3} %",
            100.0 * ours.top1_agreement,
            100.0 * cpp.top1_agreement
        ));
    }
    if ours.mean_kl_top20 > F16_KV_KL_FACTOR * f32_kv.mean_kl_top20 {
        out.push(format!(
            "{format} int8, f16 KV: mean KL {:.6} above {F16_KV_KL_FACTOR} × the f32 cache's {:.6}",
            ours.mean_kl_top20, f32_kv.mean_kl_top20
        ));
    }
    out
}

/// Both activation modes (int8 with either KV cache dtype) on one format's file against its
/// reference, one table row each.
fn check_format(format: &'static str) {
    let _cpus = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let fx = load_fixture(format);
    let mut model = Model::load(&fx.model).unwrap();
    let n = fx.tokens.len();
    println!(
        "{format}: against the float64 reference over {n} positions (its perplexity {:.4}); \
         specula / llama.cpp on the same file:",
        fx.exact_ppl
    );
    println!(
        "  {:<7} {:<12} {:>19}  {:>21}  {:>19}",
        "format", "acts", "top-1 agreement %", "mean KL top-20", "perplexity"
    );
    let mut failed = Vec::new();
    let mut int8 = None;
    for (mode, kv) in [
        (ActMode::Int16, KvDtype::F32),
        (ActMode::Int8, KvDtype::F32),
        (ActMode::Int8, KvDtype::F16),
    ] {
        model.activations = mode;
        model.kv_cache_dtype = kv;
        let ours = specula_figures(&model, &fx);
        let pair = |a: String, b: String| format!("{a:>8} / {b:>8}");
        let label = match kv {
            KvDtype::F32 => mode.to_string(),
            KvDtype::F16 => format!("{mode}, f16 KV"),
        };
        println!(
            "  {:<7} {:<12} {:>19}  {:>21}  {:>19}",
            fx.format,
            label,
            pair(
                format!("{:.3}", 100.0 * ours.top1_agreement),
                format!("{:.3}", 100.0 * fx.cpp.top1_agreement)
            ),
            format!(
                "{:>9.3e} / {:>9.3e}",
                ours.mean_kl_top20, fx.cpp.mean_kl_top20
            ),
            pair(
                format!("{:.4}", ours.perplexity),
                format!("{:.4}", fx.cpp.perplexity)
            ),
        );
        if kv == KvDtype::F16 {
            let f32_kv = int8.expect("int8 with an f32 cache runs first");
            failed.extend(f16_kv_failures(format, &ours, &f32_kv, &fx.cpp));
        } else {
            failed.extend(failures(format, mode, &ours, &fx.cpp));
        }
        if mode == ActMode::Int8 {
            int8 = Some(ours);
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn q4_1_closer_to_the_exact_model_than_llama_cpp() {
    check_format("Q4_1");
}

#[test]
#[ignore = "tier 2 (scripts/test-heavy.sh): needs scripts/requantize.sh Q4_K_M"]
fn q4_k_m_closer_to_the_exact_model_than_llama_cpp() {
    check_format("Q4_K_M");
}

#[test]
#[ignore = "tier 2 (scripts/test-heavy.sh): needs scripts/requantize.sh Q4_0"]
fn q4_0_closer_to_the_exact_model_than_llama_cpp() {
    check_format("Q4_0");
}

#[test]
#[ignore = "tier 2 (scripts/test-heavy.sh): needs scripts/requantize.sh IQ4_XS"]
fn iq4_xs_closer_to_the_exact_model_than_llama_cpp() {
    check_format("IQ4_XS");
}

#[test]
#[ignore = "tier 2 (scripts/test-heavy.sh): needs `specula model pull qwen2.5-coder-0.5b`"]
fn qwen2_5_coder_closer_to_the_exact_model_than_llama_cpp() {
    check_format("qwen2.5-coder-0.5b");
}

#[test]
fn synthetic_qwen3_closer_to_the_exact_model_than_llama_cpp() {
    check_format("synthetic/qwen3");
}

#[test]
fn synthetic_llama3_rope_closer_to_the_exact_model_than_llama_cpp() {
    check_format("synthetic/llama3");
}

#[test]
fn synthetic_gemma3_closer_to_the_exact_model_than_llama_cpp() {
    check_format("synthetic/gemma3");
}

#[test]
#[ignore = "tier 2 (scripts/test-heavy.sh): needs `specula model pull gemma3-270m`"]
fn gemma3_closer_to_the_exact_model_than_llama_cpp() {
    check_format("gemma3-270m");
}
