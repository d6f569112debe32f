//! This machine's roofs, measured with the kernels' own threads: how fast memory reads, and how
//! many byte multiply-adds per second the packed kernels' integer instruction can do, so that a
//! benchmark can say what fraction of the possible it reaches (decode is bound by the first,
//! prompts and batched decode by the second).

use crate::gemm::{Isa, isa};
use rayon::prelude::*;
use std::time::Instant;

/// The measured roofs.
#[derive(Debug, Clone, Copy)]
pub struct Roofs {
    /// Bytes read per second by every kernel thread streaming a buffer far larger than the caches.
    pub read_bytes_per_s: f64,
    /// Byte multiply-adds per second (u8·i8 products summed into i32) of the packed kernels'
    /// instruction on this path, every thread issuing independent ones; `None` where products
    /// do not run on packed panels (the portable path).
    pub byte_macs_per_s: Option<f64>,
}

/// Measures both roofs (about a second), best of three tries each.
pub fn measure() -> Roofs {
    crate::threads::run(|| Roofs {
        read_bytes_per_s: best_of_three(read_bandwidth),
        byte_macs_per_s: (isa() >= Isa::Avx2).then(|| best_of_three(byte_mac_rate)),
    })
}

fn best_of_three(f: fn() -> f64) -> f64 {
    (0..3).map(|_| f()).fold(0.0, f64::max)
}

/// Bytes per second of all threads summing disjoint parts of a 256 MiB buffer.
fn read_bandwidth() -> f64 {
    const BYTES: usize = 256 << 20;
    let buffer: Vec<u64> = (0..BYTES / 8).map(|i| i as u64).collect();
    let t = Instant::now();
    let sum: u64 = buffer
        .par_chunks(1 << 16)
        .map(|c| c.iter().fold(0u64, |a, &v| a.wrapping_add(v)))
        .reduce(|| 0, u64::wrapping_add);
    let secs = t.elapsed().as_secs_f64();
    std::hint::black_box(sum);
    BYTES as f64 / secs
}

/// Independent instructions each thread issues (enough accumulators to hide their latency).
const ROUNDS: usize = 1 << 20;

/// Byte multiply-adds per second of all threads running the path's dot instruction.
fn byte_mac_rate() -> f64 {
    let threads = rayon::current_num_threads();
    let t = Instant::now();
    let macs: f64 = (0..threads).into_par_iter().map(|_| dot_loop()).sum();
    macs / t.elapsed().as_secs_f64()
}

/// One thread's loop of dot instructions; returns the byte multiply-adds done.
fn dot_loop() -> f64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: each path runs only where `isa()` reports its features.
    unsafe {
        match isa() {
            Isa::Avx512 => return x86::avx512(ROUNDS),
            Isa::AvxVnni => return x86::avx_vnni(ROUNDS),
            Isa::Avx2 => return x86::avx2(ROUNDS),
            Isa::Portable => {}
        }
    }
    0.0
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::hint::black_box;

    const CHAINS: usize = 12;

    /// `vpdpbusd` on 512 bits: 64 byte products an instruction.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and VNNI.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(super) unsafe fn avx512(rounds: usize) -> f64 {
        let (w, x) = (
            _mm512_set1_epi8(black_box(3)),
            _mm512_set1_epi8(black_box(5)),
        );
        let mut acc = [_mm512_setzero_si512(); CHAINS];
        for _ in 0..rounds {
            for a in &mut acc {
                *a = _mm512_dpbusd_epi32(*a, w, x);
            }
        }
        black_box(acc);
        (rounds * CHAINS * 64) as f64
    }

    /// `vpdpbusd` on 256 bits (AVX-VNNI): 32 byte products an instruction.
    ///
    /// # Safety
    /// The CPU must have AVX2 and AVX-VNNI.
    #[target_feature(enable = "avx2,avxvnni")]
    pub(super) unsafe fn avx_vnni(rounds: usize) -> f64 {
        let (w, x) = (
            _mm256_set1_epi8(black_box(3)),
            _mm256_set1_epi8(black_box(5)),
        );
        let mut acc = [_mm256_setzero_si256(); CHAINS];
        for _ in 0..rounds {
            for a in &mut acc {
                *a = _mm256_dpbusd_avx_epi32(*a, w, x);
            }
        }
        black_box(acc);
        (rounds * CHAINS * 32) as f64
    }

    /// `vpmaddubsw` + `vpmaddwd` + add (AVX2's byte dot): 32 byte products a step.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn avx2(rounds: usize) -> f64 {
        let (x, ones) = (_mm256_set1_epi8(black_box(5)), _mm256_set1_epi16(1));
        let mut acc = [_mm256_setzero_si256(); CHAINS];
        for _ in 0..rounds {
            for a in &mut acc {
                // The accumulator as the weights keeps each step from being hoisted.
                let pairs = _mm256_maddubs_epi16(*a, x);
                *a = _mm256_add_epi32(*a, _mm256_madd_epi16(pairs, ones));
            }
        }
        black_box(acc);
        (rounds * CHAINS * 32) as f64
    }
}
