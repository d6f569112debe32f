//! The paged attention kernel's rate, alone: `cargo run --release -p kernels --example
//! attention_rate -- [CTX [ROWS]]` runs one sequence's decode (ROWS = 1) or verification (ROWS =
//! 1 + drafts, consecutive positions ending at CTX) over a context of CTX positions with the
//! default model's geometry (9 query heads over 3 KV heads of 64, blocks of 16), through 30
//! layers' separate stores (so the KV comes from memory as in a real step), one thread. It prints
//! µs a step (all layers) and G multiply-adds a second, for an f32 and an f16 store, each row
//! alone (`paged_attention`) and the rows together (`paged_attention_rows`). Compare builds by
//! alternating them: the host is noisy.

use kernels::attention::{
    Context, KvElem, KvShape, f16, paged_attention, paged_attention_rows, write_kv,
};
use std::time::Instant;

const LAYERS: usize = 30;
const N_HEADS: usize = 9;
const SHAPE: KvShape = KvShape {
    block_size: 16,
    n_kv_heads: 3,
    head_dim: 64,
};
/// Multiply-adds each measurement runs (at least three steps).
const MACS_PER_MEASUREMENT: usize = 1_000_000_000;

fn usage(why: &str) -> ! {
    eprintln!("attention_rate: {why}; usage: attention_rate [CTX [ROWS]]");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let size = |i: usize, default: usize| {
        args.get(i).map_or(default, |a| match a.parse() {
            Ok(n) if n > 0 => n,
            _ => usage(&format!("not a positive count: {a}")),
        })
    };
    let (ctx, rows) = (size(0, 512), size(1, 1));
    if rows > ctx {
        usage("more rows than positions");
    }
    println!(
        "attention over {ctx} positions, {rows} row(s), {LAYERS} layers, kernels: {:?}",
        kernels::gemm::isa()
    );
    measure::<f32>(ctx, rows);
    measure::<f16>(ctx, rows);
}

/// One step's attention over every layer, each row alone and the rows together.
fn measure<E: KvElem>(ctx: usize, rows: usize) {
    let blocks: Vec<u32> = (0..ctx.div_ceil(SHAPE.block_size) as u32).rev().collect();
    let stores: Vec<(Vec<E>, Vec<E>)> = (0..LAYERS).map(|l| store(l, &blocks, ctx)).collect();
    let q: Vec<f32> = (0..rows * N_HEADS * SHAPE.head_dim)
        .map(|i| wave(i, 0.23))
        .collect();
    let contexts: Vec<Context<'_>> = (0..rows)
        .map(|r| Context::causal(ctx - rows + r + 1))
        .collect();
    let width = N_HEADS * SHAPE.head_dim;
    let mut out = vec![0f32; q.len()];
    let mut scores = Vec::new();
    let macs_per_step: usize = contexts.iter().map(|c| 2 * c.len() * width * LAYERS).sum();
    let reps = (MACS_PER_MEASUREMENT / macs_per_step).max(3);
    for together in [false, true] {
        let t = Instant::now();
        for _ in 0..reps {
            for (keys, values) in &stores {
                if together {
                    paged_attention_rows(
                        &q,
                        keys,
                        values,
                        SHAPE,
                        &blocks,
                        &contexts,
                        0.125,
                        &mut out,
                        &mut scores,
                    );
                } else {
                    for (r, c) in contexts.iter().enumerate() {
                        let at = r * width..(r + 1) * width;
                        paged_attention(
                            &q[at.clone()],
                            keys,
                            values,
                            SHAPE,
                            &blocks,
                            *c,
                            0.125,
                            &mut out[at],
                            &mut scores,
                        );
                    }
                }
            }
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "  {:?} {:<8} {:8.1} µs a step  {:6.2} G MAC/s",
            E::DTYPE,
            if together { "together" } else { "alone" },
            secs / reps as f64 * 1e6,
            (reps * macs_per_step) as f64 / secs / 1e9
        );
    }
}

fn wave(i: usize, f: f32) -> f32 {
    ((i * 7919 % 1000) as f32 * f).sin()
}

/// One layer's keys and values for positions `0..ctx`.
fn store<E: KvElem>(layer: usize, blocks: &[u32], ctx: usize) -> (Vec<E>, Vec<E>) {
    let n = blocks.len() * SHAPE.block_stride();
    let (mut keys, mut values) = (vec![E::default(); n], vec![E::default(); n]);
    let kvd = SHAPE.token_stride();
    for pos in 0..ctx {
        let row = |f: f32| -> Vec<f32> {
            (0..kvd)
                .map(|i| wave(layer * 131 + pos * 31 + i, f))
                .collect()
        };
        write_kv(
            &mut keys,
            &mut values,
            SHAPE,
            blocks,
            pos,
            &row(0.37),
            &row(0.11),
        );
    }
    (keys, values)
}
