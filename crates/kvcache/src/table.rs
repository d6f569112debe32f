//! Block tables: the blocks holding one sequence's KV, grown, shrunk, freed on drop.

use std::fmt;
use std::ops::Range;

use crate::pool::{BlockId, BlockPool, OutOfBlocks};

/// Where one token's K and V live: a block and the position inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slot {
    pub block: BlockId,
    pub offset: usize,
}

impl Slot {
    /// `block × block_size + offset`: the index of this token in KV storage seen as one flat
    /// array of token slots (vLLM's `slot_mapping`).
    pub const fn flat_index(&self, block_size: usize) -> usize {
        self.block.index() * block_size + self.offset
    }
}

/// A copy of the first `num_tokens` slots of block `src` into block `dst`, as
/// [`BlockTable::cow_last_block`] reports it. Test-only, like that method.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "the runner must copy the KV of `src` into `dst` before writing into `dst`"]
pub struct BlockCopy {
    pub src: BlockId,
    pub dst: BlockId,
    pub num_tokens: usize,
}

/// The blocks of one sequence, in order, and how many token slots of them it uses.
///
/// Invariant: `blocks.len() == ceil(num_tokens / block_size)`; only the last block may be
/// partly filled. The table holds one reference to each of its blocks and releases them all
/// when dropped, so a block can neither leak nor be freed twice.
pub struct BlockTable {
    pool: BlockPool,
    blocks: Vec<BlockId>,
    num_tokens: usize,
}

impl BlockTable {
    pub(crate) fn new(pool: BlockPool) -> Self {
        Self {
            pool,
            blocks: Vec::new(),
            num_tokens: 0,
        }
    }

    /// A table over blocks whose references the caller already took for it.
    pub(crate) fn adopt(pool: BlockPool, blocks: Vec<BlockId>, num_tokens: usize) -> Self {
        assert!(num_tokens <= blocks.len() * pool.block_size());
        Self {
            pool,
            blocks,
            num_tokens,
        }
    }

    /// The pool this table's blocks come from.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// The block ids, in token order.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Token slots in use.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    pub fn is_empty(&self) -> bool {
        self.num_tokens == 0
    }

    /// Token slots the current blocks hold, used or not.
    pub fn capacity(&self) -> usize {
        self.blocks.len() * self.block_size()
    }

    fn block_size(&self) -> usize {
        self.pool.block_size()
    }

    /// New blocks [`append`](Self::append) would take to grow by `k` tokens (the scheduler's
    /// budget check).
    pub fn blocks_needed(&self, k: usize) -> usize {
        self.num_tokens
            .saturating_add(k)
            .div_ceil(self.block_size())
            .saturating_sub(self.blocks.len())
    }

    /// Adds `k` token slots, taking new blocks as the last one fills up. Either all `k` slots are
    /// added or, with [`OutOfBlocks`], nothing changes.
    ///
    /// The new slots of a partly filled last block are written in place, so the caller must not
    /// append into a last block another holder shares ([`BlockPool::is_shared`]); the engine's
    /// tables share only the full blocks the radix cache hands out.
    pub fn append(&mut self, k: usize) -> Result<(), OutOfBlocks> {
        let needed = self.blocks_needed(k);
        self.pool
            .inner()
            .borrow_mut()
            .allocate_into(needed, &mut self.blocks)?;
        self.num_tokens += k;
        Ok(())
    }

    /// Where the token at `pos` lives, or `None` past the end.
    pub fn slot(&self, pos: usize) -> Option<Slot> {
        if pos >= self.num_tokens {
            return None;
        }
        let bs = self.block_size();
        Some(Slot {
            block: self.blocks[pos / bs],
            offset: pos % bs,
        })
    }

    /// The slots of the positions in `range` (clipped to the table), e.g. those of the tokens
    /// the next forward pass writes.
    pub fn slots(&self, range: Range<usize>) -> impl Iterator<Item = Slot> + '_ {
        let bs = self.block_size();
        let end = range.end.min(self.num_tokens);
        (range.start.min(end)..end).map(move |pos| Slot {
            block: self.blocks[pos / bs],
            offset: pos % bs,
        })
    }

    /// Keeps the first `n_tokens` slots (no-op if there are not more), releasing the blocks left
    /// empty, as speculative decoding does after rejecting draft tokens. Returns how many blocks
    /// this table let go (a shared one stays allocated for its other holders).
    pub fn truncate(&mut self, n_tokens: usize) -> usize {
        if n_tokens >= self.num_tokens {
            return 0;
        }
        let keep = n_tokens.div_ceil(self.block_size());
        let mut pool = self.pool.inner().borrow_mut();
        let released = self.blocks.len() - keep;
        for id in self.blocks.drain(keep..) {
            pool.release(id);
        }
        self.num_tokens = n_tokens;
        released
    }

    /// Releases every block; the table stays usable, empty.
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// A second table with the same tokens, sharing every block (full and partial) by ref count;
    /// nothing is allocated, so it cannot fail.
    ///
    /// Test-only: the engine never forks a sequence (tables share blocks through
    /// [`RadixCache::acquire`](crate::RadixCache::acquire)); the tests use it to share blocks,
    /// partial ones included, and check the ref counts.
    #[cfg(test)]
    pub fn fork(&self) -> BlockTable {
        let mut pool = self.pool.inner().borrow_mut();
        for &id in &self.blocks {
            pool.retain(id);
        }
        BlockTable {
            pool: self.pool.clone(),
            blocks: self.blocks.clone(),
            num_tokens: self.num_tokens,
        }
    }

    /// Whether appending would write into a block another holder also reads: the last block is
    /// partly filled and shared. Test-only, with [`fork`](Self::fork).
    #[cfg(test)]
    pub fn needs_cow(&self) -> bool {
        let partial = !self.num_tokens.is_multiple_of(self.block_size());
        partial
            && self
                .blocks
                .last()
                .is_some_and(|&id| self.pool.is_shared(id))
    }

    /// Copy-on-write for the last block: if [`needs_cow`](Self::needs_cow), swaps it for a fresh
    /// private block and returns the copy the runner must make; otherwise does nothing. With
    /// [`OutOfBlocks`] nothing changes. Test-only, with [`fork`](Self::fork).
    #[cfg(test)]
    pub fn cow_last_block(&mut self) -> Result<Option<BlockCopy>, OutOfBlocks> {
        if !self.needs_cow() {
            return Ok(None);
        }
        let Some(&src) = self.blocks.last() else {
            return Ok(None);
        };
        let bs = self.block_size();
        let mut pool = self.pool.inner().borrow_mut();
        let mut fresh = Vec::with_capacity(1);
        pool.allocate_into(1, &mut fresh)?;
        let dst = fresh[0];
        pool.release(src);
        let last = self.blocks.len() - 1;
        self.blocks[last] = dst;
        Ok(Some(BlockCopy {
            src,
            dst,
            num_tokens: self.num_tokens - last * bs,
        }))
    }
}

impl Drop for BlockTable {
    fn drop(&mut self) {
        if self.blocks.is_empty() {
            return;
        }
        let mut pool = self.pool.inner().borrow_mut();
        for id in self.blocks.drain(..) {
            pool.release(id);
        }
    }
}

impl fmt::Debug for BlockTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockTable")
            .field("num_tokens", &self.num_tokens)
            .field("blocks", &self.blocks)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(block_size: usize, blocks: u32) -> BlockPool {
        BlockPool::with_blocks(block_size, blocks).unwrap()
    }

    fn ids(raw: &[u32]) -> Vec<BlockId> {
        raw.iter().copied().map(BlockId).collect()
    }

    #[test]
    fn append_takes_a_block_only_when_the_last_is_full() {
        let pool = pool(4, 8);
        let mut t = pool.new_table();
        assert!(t.is_empty());
        assert!(t.blocks().is_empty());
        t.append(1).unwrap();
        assert_eq!(t.blocks(), ids(&[0]));
        t.append(3).unwrap();
        assert_eq!((t.num_tokens(), t.blocks().len(), t.capacity()), (4, 1, 4));
        t.append(1).unwrap();
        assert_eq!(t.blocks(), ids(&[0, 1]));
        t.append(0).unwrap();
        assert_eq!(t.blocks().len(), 2);
        t.append(8).unwrap();
        assert_eq!((t.num_tokens(), t.blocks().len()), (13, 4));
        assert_eq!(pool.free_blocks(), 4);
    }

    #[test]
    fn blocks_needed_matches_append() {
        let pool = pool(4, 8);
        let mut t = pool.new_table();
        assert_eq!(t.blocks_needed(0), 0);
        assert_eq!(t.blocks_needed(1), 1);
        assert_eq!(t.blocks_needed(4), 1);
        assert_eq!(t.blocks_needed(5), 2);
        t.append(3).unwrap();
        assert_eq!(t.blocks_needed(1), 0);
        assert_eq!(t.blocks_needed(2), 1);
        assert_eq!(t.blocks_needed(usize::MAX), usize::MAX / 4);
        for k in 0..40 {
            let (needed, free) = (t.blocks_needed(k), pool.free_blocks());
            let mut f = t.fork();
            let ok = f.append(k).is_ok();
            assert_eq!(ok, needed <= free, "k = {k}");
            let taken = free - pool.free_blocks();
            assert_eq!(taken, if ok { needed } else { 0 }, "k = {k}");
        }
    }

    #[test]
    fn append_out_of_blocks_is_atomic() {
        let pool = pool(4, 3);
        let mut t = pool.allocate(6).unwrap();
        let before = t.blocks().to_vec();
        let err = t.append(7).unwrap_err();
        assert_eq!(err, OutOfBlocks { needed: 2, free: 1 });
        assert_eq!(t.blocks(), before);
        assert_eq!(t.num_tokens(), 6);
        assert_eq!(pool.free_blocks(), 1);
        t.append(6).unwrap();
        assert_eq!(t.num_tokens(), 12);
        assert_eq!(pool.free_blocks(), 0);
        assert!(
            t.append(usize::MAX).is_err(),
            "overflowing sizes are just out of blocks"
        );
        pool.assert_consistent();
    }

    #[test]
    fn slots_locate_tokens() {
        let pool = pool(4, 8);
        let _other = pool.allocate(1).unwrap(); // so the table's blocks are not 0, 1, ...
        let t = pool.allocate(6).unwrap();
        assert_eq!(t.blocks(), ids(&[1, 2]));
        assert_eq!(
            t.slot(0),
            Some(Slot {
                block: BlockId(1),
                offset: 0
            })
        );
        assert_eq!(
            t.slot(5),
            Some(Slot {
                block: BlockId(2),
                offset: 1
            })
        );
        assert_eq!(t.slot(6), None);
        assert_eq!(t.slot(5).map(|s| s.flat_index(4)), Some(9));
        let flat: Vec<usize> = t.slots(2..100).map(|s| s.flat_index(4)).collect();
        assert_eq!(flat, [6, 7, 8, 9]);
        assert_eq!(t.slots(7..9).count(), 0);
    }

    #[test]
    fn truncate_frees_emptied_blocks() {
        let pool = pool(4, 8);
        let mut t = pool.allocate(10).unwrap();
        assert_eq!(pool.free_blocks(), 5);
        assert_eq!(t.truncate(12), 0, "growing is not truncate's job");
        assert_eq!(t.truncate(9), 0, "block 2 still holds token 8");
        assert_eq!(t.truncate(8), 1);
        assert_eq!((t.num_tokens(), t.blocks().len()), (8, 2));
        assert_eq!(t.truncate(5), 0);
        assert_eq!(t.truncate(4), 1);
        assert_eq!(pool.free_blocks(), 7);
        t.clear();
        assert!(t.is_empty() && t.blocks().is_empty());
        assert_eq!(pool.free_blocks(), 8);
        t.append(2).unwrap();
        assert_eq!(pool.free_blocks(), 7);
        pool.assert_consistent();
    }

    #[test]
    fn speculative_rollback() {
        // Accepted 5 tokens, 4 drafts appended for verification, 1 accepted.
        let pool = pool(4, 8);
        let mut t = pool.allocate(5).unwrap();
        t.append(4).unwrap();
        assert_eq!(t.blocks().len(), 3);
        t.truncate(6);
        assert_eq!((t.num_tokens(), t.blocks().len()), (6, 2));
        assert_eq!(pool.free_blocks(), 6);
    }

    #[test]
    fn drop_returns_every_block() {
        let pool = pool(4, 8);
        let a = pool.allocate(17).unwrap();
        let b = a.fork();
        assert_eq!(pool.free_blocks(), 3);
        drop(a);
        assert_eq!(pool.free_blocks(), 3, "b still holds them");
        drop(b);
        assert_eq!(pool.free_blocks(), 8);
        pool.assert_consistent();
    }

    #[test]
    fn fork_shares_all_blocks() {
        let pool = pool(4, 8);
        let a = pool.allocate(6).unwrap();
        let b = a.fork();
        assert_eq!(b.blocks(), a.blocks());
        assert_eq!(b.num_tokens(), 6);
        assert!(b.pool().same_pool(&pool));
        for &id in a.blocks() {
            assert_eq!(pool.ref_count(id), 2);
            assert!(pool.is_shared(id));
        }
        let c = b.fork();
        assert_eq!(pool.ref_count(c.blocks()[0]), 3);
        assert_eq!(pool.used_blocks(), 2);
    }

    #[test]
    fn cow_only_for_a_shared_partial_last_block() {
        let pool = pool(4, 8);
        let mut a = pool.allocate(4).unwrap();
        assert!(!a.needs_cow(), "not shared");
        let b = a.fork();
        assert!(
            !a.needs_cow(),
            "shared but full: appending takes a new block"
        );
        assert_eq!(a.cow_last_block(), Ok(None));
        a.append(2).unwrap();
        assert_eq!(a.blocks().len(), 2);
        assert!(!a.needs_cow(), "the new last block is a's own");
        drop(b);

        let mut c = a.fork();
        assert!(a.needs_cow() && c.needs_cow());
        let copy = c.cow_last_block().unwrap().unwrap();
        assert_eq!(copy.src, a.blocks()[1]);
        assert_eq!(copy.dst, c.blocks()[1]);
        assert_eq!(copy.num_tokens, 2);
        assert_ne!(copy.src, copy.dst);
        assert_eq!(c.blocks()[0], a.blocks()[0], "full blocks stay shared");
        assert!(!a.needs_cow() && !c.needs_cow());
        assert_eq!(pool.ref_count(copy.src), 1);
        assert_eq!(pool.ref_count(copy.dst), 1);
        pool.assert_consistent();
    }

    #[test]
    fn truncate_into_a_shared_block_needs_cow() {
        let pool = pool(4, 8);
        let mut a = pool.allocate(8).unwrap();
        let _b = a.fork();
        a.truncate(6);
        assert!(
            a.needs_cow(),
            "appending would overwrite b's tokens 6 and 7"
        );
    }

    #[test]
    fn cow_out_of_blocks_changes_nothing() {
        let pool = pool(4, 1);
        let mut a = pool.allocate(2).unwrap();
        let b = a.fork();
        assert_eq!(a.cow_last_block(), Err(OutOfBlocks { needed: 1, free: 0 }));
        assert_eq!(a.blocks(), b.blocks());
        assert_eq!(pool.ref_count(a.blocks()[0]), 2);
    }

    #[test]
    fn debug_shows_tokens_and_blocks() {
        let pool = pool(4, 8);
        let t = pool.allocate(5).unwrap();
        assert_eq!(
            format!("{t:?}"),
            "BlockTable { num_tokens: 5, blocks: [BlockId(0), BlockId(1)] }"
        );
    }
}
