//! The block pool: fixed-size KV blocks, their reference counts and the free list.
//!
//! The pool only does bookkeeping. Block `i` names the `i`-th block of the KV tensors the model
//! runner owns; nothing here touches those tensors.

use std::cell::RefCell;
use std::fmt;
use std::rc::Rc;

use crate::table::BlockTable;

/// Tokens per block unless configured otherwise (as in vLLM).
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// Index of a block in the runner's KV storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(transparent)]
pub struct BlockId(pub u32);

impl BlockId {
    /// The id as a `u32`, e.g. to fill the block-table tensor of a batch.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// The id as an index into per-block arrays.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Why [`BlockPool::with_blocks`] cannot make a pool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("KV block size must be at least one token")]
    ZeroBlockSize,
    #[error("KV cache capacity is smaller than one block")]
    NoBlocks,
}

/// Not enough free blocks for an allocation; nothing was allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("out of KV cache blocks: {needed} needed, {free} free")]
pub struct OutOfBlocks {
    pub needed: usize,
    pub free: usize,
}

/// The pool's state. Only this module and [`crate::table`] change it, each in one short borrow
/// that never calls out, so the `RefCell` can never be found already borrowed.
pub(crate) struct PoolInner {
    block_size: usize,
    /// References to each block; 0 means free.
    ref_counts: Vec<u32>,
    /// Free blocks, popped from the end (ids come out in ascending order on a fresh pool; freed
    /// blocks are reused first, which keeps the hot set of KV storage small).
    free: Vec<BlockId>,
}

impl PoolInner {
    /// Takes `n` free blocks (ref count 1) onto `out`, or none at all.
    pub(crate) fn allocate_into(
        &mut self,
        n: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), OutOfBlocks> {
        if n > self.free.len() {
            return Err(OutOfBlocks {
                needed: n,
                free: self.free.len(),
            });
        }
        out.reserve(n);
        for _ in 0..n {
            if let Some(id) = self.free.pop() {
                self.ref_counts[id.index()] = 1;
                out.push(id);
            }
        }
        Ok(())
    }

    /// Adds a reference to a live block.
    pub(crate) fn retain(&mut self, id: BlockId) {
        let rc = &mut self.ref_counts[id.index()];
        debug_assert!(*rc > 0, "retain of free block {id}");
        *rc += 1;
    }

    /// Drops a reference; the block goes back to the free list when none are left.
    pub(crate) fn release(&mut self, id: BlockId) {
        let rc = &mut self.ref_counts[id.index()];
        debug_assert!(*rc > 0, "double free of block {id}");
        // Never push a block twice: an (impossible) extra release must not corrupt the free list.
        if *rc == 0 {
            return;
        }
        *rc -= 1;
        if *rc == 0 {
            self.free.push(id);
        }
    }

    pub(crate) fn ref_count(&self, id: BlockId) -> u32 {
        self.ref_counts.get(id.index()).copied().unwrap_or(0)
    }
}

/// A shared handle to the block pool of one KV cache.
///
/// Cloning the handle shares the pool. Blocks are only handed out inside [`BlockTable`]s, which
/// give them back on drop.
#[derive(Clone)]
pub struct BlockPool {
    inner: Rc<RefCell<PoolInner>>,
}

impl BlockPool {
    /// A pool of exactly `num_blocks` blocks of `block_size` tokens (the engine sizes it from
    /// the runner's block bytes and its token budget).
    pub fn with_blocks(block_size: usize, num_blocks: u32) -> Result<Self, ConfigError> {
        if block_size == 0 {
            return Err(ConfigError::ZeroBlockSize);
        }
        if num_blocks == 0 {
            return Err(ConfigError::NoBlocks);
        }
        Ok(Self {
            inner: Rc::new(RefCell::new(PoolInner {
                block_size,
                ref_counts: vec![0; num_blocks as usize],
                free: (0..num_blocks).rev().map(BlockId).collect(),
            })),
        })
    }

    pub(crate) fn inner(&self) -> &RefCell<PoolInner> {
        &self.inner
    }

    /// Whether two handles share one pool.
    pub fn same_pool(&self, other: &BlockPool) -> bool {
        Rc::ptr_eq(&self.inner, &other.inner)
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.inner.borrow().block_size
    }

    pub fn total_blocks(&self) -> usize {
        self.inner.borrow().ref_counts.len()
    }

    pub fn free_blocks(&self) -> usize {
        self.inner.borrow().free.len()
    }

    /// Blocks referenced by at least one table.
    pub fn used_blocks(&self) -> usize {
        let p = self.inner.borrow();
        p.ref_counts.len() - p.free.len()
    }

    /// Fraction of blocks in use, 0.0 to 1.0 (the `kv_cache_usage_perc` metric).
    pub fn usage(&self) -> f64 {
        let p = self.inner.borrow();
        let total = p.ref_counts.len();
        // A pool always has at least one block (ConfigError::NoBlocks), so this never divides by 0.
        (total - p.free.len()) as f64 / total as f64
    }

    /// Blocks needed to hold `n_tokens` tokens from scratch.
    pub fn blocks_for_tokens(&self, n_tokens: usize) -> usize {
        n_tokens.div_ceil(self.block_size())
    }

    /// Whether a new sequence of `n_tokens` tokens fits in the free blocks now (admission).
    pub fn can_allocate(&self, n_tokens: usize) -> bool {
        self.blocks_for_tokens(n_tokens) <= self.free_blocks()
    }

    /// References to `id` (0 when free or not a block of this pool).
    pub fn ref_count(&self, id: BlockId) -> u32 {
        self.inner.borrow().ref_count(id)
    }

    /// Whether more than one holder references `id`: writing into it then needs a copy first.
    pub fn is_shared(&self, id: BlockId) -> bool {
        self.ref_count(id) > 1
    }

    /// An empty table on this pool, for a sequence that grows with [`BlockTable::append`].
    pub fn new_table(&self) -> BlockTable {
        BlockTable::new(self.clone())
    }

    /// A table holding `n_tokens` slots, or [`OutOfBlocks`] with nothing allocated.
    pub fn allocate(&self, n_tokens: usize) -> Result<BlockTable, OutOfBlocks> {
        let mut table = self.new_table();
        table.append(n_tokens)?;
        Ok(table)
    }

    /// Panics unless the free list and the ref counts agree: no block free and referenced, none
    /// unreferenced and not free, none free twice (for tests, here and in crates built on the
    /// pool).
    pub fn assert_consistent(&self) {
        let p = self.inner.borrow();
        let mut seen = vec![false; p.ref_counts.len()];
        for id in &p.free {
            assert!(!seen[id.index()], "block {id} twice on the free list");
            seen[id.index()] = true;
            assert_eq!(p.ref_counts[id.index()], 0, "free block {id} is referenced");
        }
        for (i, &rc) in p.ref_counts.iter().enumerate() {
            assert!(
                rc > 0 || seen[i],
                "unreferenced block #{i} is not free (leak)"
            );
        }
    }
}

impl fmt::Debug for BlockPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.inner.borrow();
        f.debug_struct("BlockPool")
            .field("block_size", &p.block_size)
            .field("total_blocks", &p.ref_counts.len())
            .field("free_blocks", &p.free.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_sizes_are_errors() {
        assert_eq!(
            BlockPool::with_blocks(0, 8).err(),
            Some(ConfigError::ZeroBlockSize)
        );
        assert_eq!(
            BlockPool::with_blocks(16, 0).err(),
            Some(ConfigError::NoBlocks)
        );
    }

    #[test]
    fn fresh_pool_is_all_free() {
        let pool = BlockPool::with_blocks(16, 8).unwrap();
        assert_eq!(pool.total_blocks(), 8);
        assert_eq!(pool.free_blocks(), 8);
        assert_eq!(pool.used_blocks(), 0);
        assert_eq!(pool.usage(), 0.0);
        assert_eq!(pool.ref_count(BlockId(3)), 0);
        assert_eq!(
            pool.ref_count(BlockId(99)),
            0,
            "ids outside the pool are never referenced"
        );
        pool.assert_consistent();
    }

    #[test]
    fn queries_track_allocation() {
        let pool = BlockPool::with_blocks(4, 4).unwrap();
        assert_eq!(pool.blocks_for_tokens(0), 0);
        assert_eq!(pool.blocks_for_tokens(4), 1);
        assert_eq!(pool.blocks_for_tokens(5), 2);
        assert!(pool.can_allocate(16));
        assert!(!pool.can_allocate(17));

        let t = pool.allocate(9).unwrap();
        assert_eq!(t.blocks(), &[BlockId(0), BlockId(1), BlockId(2)]);
        assert_eq!(pool.used_blocks(), 3);
        assert_eq!(pool.free_blocks(), 1);
        assert_eq!(pool.usage(), 0.75);
        assert!(pool.can_allocate(4));
        assert!(!pool.can_allocate(5));
        drop(t);
        assert_eq!(pool.free_blocks(), 4);
        pool.assert_consistent();
    }

    #[test]
    fn allocate_out_of_blocks_reports_and_changes_nothing() {
        let pool = BlockPool::with_blocks(4, 2).unwrap();
        let _a = pool.allocate(5).unwrap();
        let err = pool.allocate(1).unwrap_err();
        assert_eq!(err, OutOfBlocks { needed: 1, free: 0 });
        assert_eq!(err.to_string(), "out of KV cache blocks: 1 needed, 0 free");
        assert_eq!(pool.free_blocks(), 0);
        pool.assert_consistent();
    }

    #[test]
    fn freed_blocks_are_reused_first() {
        let pool = BlockPool::with_blocks(1, 4).unwrap();
        let a = pool.allocate(1).unwrap();
        let _b = pool.allocate(1).unwrap();
        let id = a.blocks()[0];
        drop(a);
        let c = pool.allocate(1).unwrap();
        assert_eq!(c.blocks()[0], id);
    }

    #[test]
    fn clones_share_one_pool() {
        let pool = BlockPool::with_blocks(16, 4).unwrap();
        let other = pool.clone();
        let _t = other.allocate(1).unwrap();
        assert_eq!(pool.free_blocks(), 3);
        assert!(pool.same_pool(&other));
        assert!(!pool.same_pool(&BlockPool::with_blocks(16, 4).unwrap()));
    }

    #[test]
    fn block_id_accessors() {
        let id = BlockId(7);
        assert_eq!(id.get(), 7);
        assert_eq!(id.index(), 7);
        assert_eq!(id.to_string(), "#7");
        let pool = BlockPool::with_blocks(16, 4).unwrap();
        assert_eq!(
            format!("{pool:?}"),
            "BlockPool { block_size: 16, total_blocks: 4, free_blocks: 4 }"
        );
    }
}
