//! Correctness against independent references: teacher-forced over a 3,128-token text, specula's
//! next-token distributions against an exact float64 NumPy forward pass (over weights dequantised
//! by the `gguf` package), with llama.cpp's figures on the same positions beside ours.
//! Fixtures and the scripts that made them: scripts/reference/ (see its README).

mod common;

use model::{LogitsFor, Model, Runner, SeqInput};
use std::path::Path;

const K: usize = 20;
/// The fixtures' chunking: independent chunks of at most 1,024 tokens from an empty context.
const CHUNK: usize = 1024;

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
    let b = std::fs::read(path).unwrap();
    b.chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Figures of one implementation against the reference.
#[derive(Debug)]
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

#[test]
fn closer_to_the_exact_model_than_llama_cpp() {
    let data = common::data_dir("reference");
    let tokens = read_u32(&data.join("tokens.bin"));
    let n = tokens.len();
    assert!(n >= 2000, "the text must have at least 2,000 tokens");
    let ref_ids = read_u32(&data.join("numpy_top20_ids.bin"));
    let ref_lp = read_f32(&data.join("numpy_top20_logprobs.bin"));
    let ref_target = read_f64(&data.join("numpy_target_logprobs.bin"));
    let cpp_ids = read_u32(&data.join("llamacpp_top20_ids.bin"));
    let cpp_at_ref = read_f32(&data.join("llamacpp_logprobs_at_numpy_top20.bin"));
    let cpp_target = read_f64(&data.join("llamacpp_target_logprobs.bin"));
    assert_eq!((ref_ids.len(), ref_target.len()), (n * K, n - 1));

    let model = Model::load(&common::model_path()).unwrap();
    let blocks: Vec<u32> = (0..(CHUNK / 16) as u32).collect();
    let mut runner = Runner::new(&model.config, 16, blocks.len());
    let (mut agree, mut kl_sum, mut nll) = (0usize, 0.0f64, 0.0f64);
    for start in (0..n).step_by(CHUNK) {
        let chunk = &tokens[start..(start + CHUNK).min(n)];
        let input = SeqInput {
            tokens: chunk,
            start_pos: 0,
            blocks: &blocks,
            logits: LogitsFor::All,
            tree: None,
        };
        let logits = runner.forward(&model, &[input]).unwrap();
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
    let ours = Figures {
        top1_agreement: agree as f64 / n as f64,
        mean_kl_top20: kl_sum / n as f64,
        perplexity: (nll / (n - 1) as f64).exp(),
    };
    let cpp = Figures {
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
    };
    let exact_ppl = (-ref_target.iter().sum::<f64>() / (n - 1) as f64).exp();
    println!("against the float64 reference over {n} positions (perplexity {exact_ppl:.4}):");
    println!("  specula:   {ours:?}");
    println!("  llama.cpp: {cpp:?}");

    assert!(
        ours.top1_agreement >= cpp.top1_agreement,
        "top-1 agreement below llama.cpp's"
    );
    assert!(
        ours.mean_kl_top20 <= cpp.mean_kl_top20,
        "mean KL above llama.cpp's"
    );
    assert!(ours.mean_kl_top20 <= 0.005, "mean KL over 0.005 nats");
    assert!(
        (ours.perplexity / cpp.perplexity - 1.0).abs() <= 0.01,
        "perplexity over 1% from llama.cpp's"
    );
}
