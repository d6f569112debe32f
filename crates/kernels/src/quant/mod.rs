//! Quantised weight formats (GGML's block layouts) and their scalar dequantisation, the
//! reference every faster kernel is tested against.

mod acts;
mod dequant;
mod types;

pub use acts::{ACT_BLOCK, ActMode, BlockQ8Pair, BlockQ16, quantize_row, quantize_row_pairs};
pub use dequant::dequantize;
pub(crate) use dequant::{
    IQ4_UNSIGNED, f16_at, fifth_bits, fixed_offset, iq4_index, iq4_indices, iq4_unsigned, k_scales,
    k_sub_block, k_super_scales, q5_values,
};
pub use types::GgmlType;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("{dtype}: {bytes} bytes do not hold {values} values")]
    SizeMismatch {
        dtype: GgmlType,
        bytes: usize,
        values: usize,
    },
    #[error("{0} tensors hold integers, not weights")]
    NotWeights(GgmlType),
}
