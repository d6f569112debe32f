//! The packed GEMM's integer rate, kernels alone: `cargo run --release -p kernels --example
//! gemm_rate -- TYPE [ROWS COLS]` multiplies a random ROWS × COLS matrix of GGML type TYPE
//! (default 1536 × 576, the default model's FFN) with 1, 5, 8 and 512 activation rows in each
//! activation mode and prints G multiply-adds per second and µs per product. `THREADS` sets the
//! kernel threads (default 1). Compare builds by alternating them: the host is noisy.

use kernels::gemm::{Activations, PackedMatrix, QMatrix, gemm};
use kernels::quant::{ActMode, GgmlType};
use std::time::Instant;

/// Multiply-adds each measurement runs (at least three products).
const MACS_PER_MEASUREMENT: usize = 2_000_000_000;

fn usage(why: &str) -> ! {
    eprintln!("gemm_rate: {why}; usage: gemm_rate TYPE [ROWS COLS] (TYPE e.g. Q4_0, Q4_K)");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let name = args.first().unwrap_or_else(|| usage("no type"));
    let dtype = (0..64)
        .filter_map(GgmlType::from_id)
        .find(|t| t.to_string() == *name)
        .unwrap_or_else(|| usage(&format!("unknown type {name}")));
    let size = |i: usize, default: usize| {
        args.get(i).map_or(default, |a| {
            a.parse()
                .unwrap_or_else(|_| usage(&format!("not a size: {a}")))
        })
    };
    let (rows, cols) = (size(1, 1536), size(2, 576));
    let threads = std::env::var("THREADS").map_or(1, |t| {
        t.parse()
            .unwrap_or_else(|_| usage("THREADS is not a count"))
    });
    kernels::threads::set_count(threads);
    let bytes = random_bytes(dtype.bytes_for(rows * cols).unwrap_or(0));
    let w = QMatrix::new(dtype, rows, cols, &bytes)
        .unwrap_or_else(|_| usage(&format!("{dtype} cannot hold {rows} × {cols}")));
    let packed =
        PackedMatrix::pack(&w).unwrap_or_else(|| usage(&format!("{dtype} has no packed form")));
    let w = w.with_packed(&packed);
    println!(
        "{dtype} {rows} × {cols}, {threads} thread(s), kernels: {:?}",
        kernels::gemm::isa()
    );
    for mode in ActMode::ALL {
        for m in [1usize, 5, 8, 512] {
            let x: Vec<f32> = (0..m * cols)
                .map(|i| ((i * 7919 % 1000) as f32) / 500.0 - 1.0)
                .collect();
            let mut a = Activations::default();
            a.mode = mode;
            a.set(&x, m, cols);
            let mut out = vec![0f32; m * rows];
            let reps = (MACS_PER_MEASUREMENT / (m * rows * cols)).max(3);
            let t = Instant::now();
            kernels::threads::run(|| (0..reps).for_each(|_| gemm(&w, &a, &mut out)));
            let secs = t.elapsed().as_secs_f64();
            let macs = (reps * m * rows * cols) as f64;
            println!(
                "  {mode} m={m:<4} {:7.1} G MAC/s  {:9.2} µs a product",
                macs / secs / 1e9,
                secs / reps as f64 * 1e6
            );
        }
    }
}

/// Pseudo-random bytes; every byte's bits 2 and 6 cleared, so that f16 scales (any two bytes)
/// stay finite and small.
fn random_bytes(n: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_u32;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state >> 8) as u8 & 0x3b
        })
        .collect()
}
