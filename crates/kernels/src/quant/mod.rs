//! Quantised weight formats (GGML's block layouts) and their scalar dequantisation, the
//! reference every faster kernel is tested against.

mod acts;
mod dequant;
mod types;

pub use acts::{ACT_BLOCK, BlockQ8Pair, BlockQ16, quantize_row, quantize_row_pairs};
pub use dequant::{dequantize, supports_dequantize};
pub(crate) use dequant::{f16_at, fifth_bits, q4_k_sub_block, q5_values};
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
