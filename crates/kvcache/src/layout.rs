//! Sizing of the KV cache: bytes per token and per block of a model's K and V tensors.

/// Shape of one model's KV cache, enough to size it in bytes.
///
/// One token's KV is, for every layer, a K and a V vector per KV head:
/// `layers × kv_heads × head_dim × 2 × bytes_per_element`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvLayout {
    pub num_layers: u32,
    pub num_kv_heads: u32,
    pub head_dim: u32,
    /// 2 for f16/bf16, 4 for f32, 1 for fp8. Block-quantised KV formats (with scales) are not
    /// expressible here yet.
    pub bytes_per_element: u32,
}

impl KvLayout {
    pub const fn new(
        num_layers: u32,
        num_kv_heads: u32,
        head_dim: u32,
        bytes_per_element: u32,
    ) -> Self {
        Self {
            num_layers,
            num_kv_heads,
            head_dim,
            bytes_per_element,
        }
    }

    /// Bytes of K and V for one token across all layers.
    ///
    /// Computed in `u64` from `u32` factors, so it cannot overflow for any realistic model; it
    /// saturates rather than wraps should it ever do so.
    pub const fn bytes_per_token(&self) -> u64 {
        (self.num_layers as u64)
            .saturating_mul(self.num_kv_heads as u64)
            .saturating_mul(self.head_dim as u64)
            .saturating_mul(2)
            .saturating_mul(self.bytes_per_element as u64)
    }

    /// Bytes of one block of `block_size` tokens.
    pub const fn bytes_per_block(&self, block_size: usize) -> u64 {
        self.bytes_per_token().saturating_mul(block_size as u64)
    }

    /// Whole blocks of `block_size` tokens that fit in `budget_bytes` (0 if a token has no bytes,
    /// which [`crate::PoolConfig`] rejects before it gets here).
    pub const fn blocks_in_budget(&self, budget_bytes: u64, block_size: usize) -> u64 {
        match self.bytes_per_block(block_size) {
            0 => 0,
            per_block => budget_bytes / per_block,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smollm2_135m_f16() {
        // 30 layers, 3 KV heads of 64, f16: 30 * 3 * 64 * 2 * 2 = 23,040 bytes a token.
        let l = KvLayout::new(30, 3, 64, 2);
        assert_eq!(l.bytes_per_token(), 23_040);
        assert_eq!(l.bytes_per_block(16), 368_640);
    }

    #[test]
    fn llama3_8b_f16() {
        // 32 layers, 8 KV heads of 128, f16: 128 KiB a token.
        let l = KvLayout::new(32, 8, 128, 2);
        assert_eq!(l.bytes_per_token(), 131_072);
        assert_eq!(l.blocks_in_budget(1 << 30, 16), 512);
    }

    #[test]
    fn budget_rounds_down_to_whole_blocks() {
        let l = KvLayout::new(1, 1, 1, 1); // 2 bytes a token
        assert_eq!(l.bytes_per_block(4), 8);
        assert_eq!(l.blocks_in_budget(15, 4), 1);
        assert_eq!(l.blocks_in_budget(16, 4), 2);
        assert_eq!(l.blocks_in_budget(7, 4), 0);
    }

    #[test]
    fn zero_sized_layout_fits_no_blocks() {
        let l = KvLayout::new(0, 8, 128, 2);
        assert_eq!(l.bytes_per_token(), 0);
        assert_eq!(l.blocks_in_budget(u64::MAX, 16), 0);
    }

    #[test]
    fn saturates_instead_of_wrapping() {
        let l = KvLayout::new(u32::MAX, u32::MAX, u32::MAX, u32::MAX);
        assert_eq!(l.bytes_per_token(), u64::MAX);
        assert_eq!(l.bytes_per_block(16), u64::MAX);
    }
}
