//! specula's CPU kernels: GGML's quantised formats, GEMM of quantised weights with 16-bit
//! activations, attention over paged KV blocks, norms, RoPE and activations, with AVX-512 /
//! AVX2 / portable paths chosen at run time, and the thread pool they run on.

pub mod attention;
pub mod gemm;
pub mod ops;
pub mod quant;
pub mod roof;
#[cfg(target_arch = "x86_64")]
mod simd;
pub mod threads;
