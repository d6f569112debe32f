//! Paged KV cache bookkeeping: which blocks of KV storage hold which sequence's tokens.
//!
//! Pure logic, no tensors: the model runner owns the K and V storage, cut into fixed-size blocks
//! of `block_size` tokens; this crate decides which block ids each sequence uses.
//!
//! - [`pool`]: [`BlockPool`], the blocks, their reference counts and the free list, with the
//!   queries the scheduler needs (free, used, usage, `can_allocate`).
//! - [`radix`]: [`RadixCache`], the prefix cache: full blocks of earlier sequences kept in a
//!   radix tree by their tokens, reused by new sequences, evicted least recently used first.
//! - [`table`]: [`BlockTable`], one sequence's blocks: append (atomic, [`OutOfBlocks`] on
//!   failure), slot lookup, truncate (speculative rollback), release on drop.
//!
//! # Ownership: why `Rc<RefCell<..>>`
//!
//! A [`BlockPool`] is a cheap handle to one `Rc<RefCell<..>>`, and every [`BlockTable`] holds a
//! clone of it. A table holds one reference to each of its blocks and gives them all back in
//! `Drop`, so blocks cannot leak and cannot be freed twice, whatever path (finish, abort,
//! preemption, panic unwinding) ends a sequence. Tables never mix pools: each one only talks to
//! its own.
//!
//! The engine's step loop owns the KV cache on one dedicated thread, so there is no
//! contention to pay a `Mutex` for: `Rc` + `RefCell` is the simplest choice and it is free.
//! Pool and tables are therefore `!Send`, and the compiler enforces that they stay on that
//! thread: build the pool inside the engine thread, not before spawning it.
//! The `RefCell` is only borrowed inside this crate's methods, briefly and never across a call
//! out, so its borrow checks cannot fail.
//!
//! ```compile_fail
//! fn assert_send<T: Send>() {}
//! assert_send::<kvcache::BlockPool>();
//! ```
//!
//! # Sharing
//!
//! Blocks are ref-counted so that several holders can read one block: the radix prefix cache
//! holds a reference to each block it caches, and [`RadixCache::acquire`] hands a new sequence a
//! table over the cached full blocks of its prefix, each taking one more reference; they are
//! freed when the last holder lets go. Only full blocks are shared that way, and a sequence
//! appends after them into blocks of its own. Writing into a shared block is the caller's
//! decision: [`BlockPool::is_shared`] / [`BlockPool::ref_count`] say when.
//!
//! ```
//! use kvcache::BlockPool;
//!
//! let pool = BlockPool::with_blocks(16, 64)?; // 64 blocks of 16 tokens
//! assert!(pool.can_allocate(100));
//! let mut seq = pool.allocate(100)?; // the prompt: 7 blocks
//! assert_eq!(seq.blocks_needed(12), 0); // the 7th block has room for 12 more
//! seq.append(1)?; // one decoded token
//! let slot = seq.slot(100).expect("just appended");
//! assert_eq!(slot.offset, 4);
//! assert_eq!(pool.used_blocks(), 7);
//! drop(seq);
//! assert_eq!(pool.free_blocks(), 64);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod pool;
pub mod radix;
pub mod table;

#[cfg(test)]
mod proptests;

pub use pool::{BlockId, BlockPool, ConfigError, DEFAULT_BLOCK_SIZE, OutOfBlocks};
pub use radix::{FNV_OFFSET, KvCopy, RadixCache, RadixStats, Reuse, ToPersist, fnv1a, path_key};
#[cfg(test)]
pub use table::BlockCopy;
pub use table::{BlockTable, Slot};
