//! Quantised weight formats (GGML's block layouts) and their scalar dequantisation, the
//! reference every faster kernel is tested against.

mod dequant;
mod q8;
mod types;

pub use dequant::{dequantize, supports_dequantize};
pub use q8::{BlockQ8, Q8_BLOCK, quantize_row_q8};
pub use types::GgmlType;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("{0} weights are not supported yet")]
    Unsupported(GgmlType),
    #[error("{dtype}: {bytes} bytes do not hold {values} values")]
    SizeMismatch {
        dtype: GgmlType,
        bytes: usize,
        values: usize,
    },
}
