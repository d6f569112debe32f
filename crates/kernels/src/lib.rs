//! specula's CPU kernels: quantised formats and (to come) GEMM over them, attention over paged
//! KV blocks, norms, RoPE and activations, with AVX-512 / AVX2 / portable paths chosen at run time.

pub mod attention;
pub mod gemm;
pub mod ops;
pub mod quant;
pub mod threads;
