//! The radix prefix cache: KV blocks of earlier sequences, kept by their tokens so that a new
//! sequence starting with the same tokens reuses them instead of computing them again (SGLang's
//! RadixAttention, at block granularity).
//!
//! The tree's edges are whole blocks: a node is one full block of `block_size` tokens, its key
//! those tokens, its parent the block before it. Only full blocks are cached, so a sequence that
//! reuses a prefix never writes into a shared block: it appends its own blocks after it.
//!
//! The cache holds one pool reference to each cached block (so a block outlives the sequence
//! that computed it); a sequence reusing a block holds another through its [`BlockTable`]. A
//! block only the cache references, with no cached block after it on the device, can be
//! evicted: [`RadixCache::evict`] frees the least recently used first, which makes room in the
//! pool when it runs short.
//!
//! # Host tier
//!
//! With a second pool ([`RadixCache::with_host_tier`]), an evicted block is demoted instead of
//! dropped: its node moves to a host slot, and a later match promotes it back into a fresh device
//! block instead of having it recomputed. Only bookkeeping happens here: each demotion and
//! promotion is queued as a [`KvCopy`] that the owner of the KV data performs, in queue order,
//! before the next forward pass ([`RadixCache::take_copies`]). Along every path of the tree the
//! device blocks come first: only a device node with no device children is demoted, and a match
//! promotes host nodes in path order. When the host tier is full, its least recently used
//! leaves are dropped, or, with a storage tier, written to it.
//!
//! # Storage tier
//!
//! With [`RadixCache::enable_storage`], blocks can also live in files (keyed by [`path_key`], a
//! hash of every token up to the block's end, so a key names one prefix): a host block that
//! would be dropped is written out instead ([`KvCopy::HostToStorage`]), [`RadixCache::persist`]
//! lists every block not yet written (for a shutdown), and [`RadixCache::restore`] puts a
//! stored block back in the tree (at start-up). A match promotes stored blocks straight into
//! device blocks ([`KvCopy::StorageToDevice`]). Stored blocks are not evicted: the directory is
//! the limit.

use crate::pool::{BlockId, BlockPool};
use crate::table::BlockTable;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

type NodeId = usize;

/// The tree's root, which holds no block.
const ROOT: NodeId = 0;

/// Where a cached block's KV is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Device(BlockId),
    /// A slot of the host tier's pool.
    Host(BlockId),
    /// Only in the storage tier (under the node's path key).
    Stored,
}

/// The storage key of a block: a hash (FNV-1a, 64-bit) of every token from the sequence's
/// start to the block's end, chained block by block from `parent` (0 at the root).
pub fn path_key(parent: u64, block: &[u32]) -> u64 {
    let mut h = if parent == 0 { FNV_OFFSET } else { parent };
    for &t in block {
        h = fnv1a(h, &t.to_le_bytes());
    }
    h.max(1)
}

/// FNV-1a's 64-bit offset basis: the hash of nothing.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a (64-bit), continued from `h` over `bytes`: small and stable across builds, for keys
/// that are written to disk.
pub fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[derive(Debug)]
struct Node {
    parent: NodeId,
    /// This block's tokens (empty for the root).
    key: Box<[u32]>,
    /// `None` for the root only.
    place: Option<Place>,
    children: HashMap<Box<[u32]>, NodeId>,
    /// Logical time of the last match or insert through this node.
    last_used: u64,
    /// [`path_key`] of the tokens up to this block's end (0 for the root).
    key_hash: u64,
    /// Whether the storage tier has this block.
    stored: bool,
}

/// A copy of one block's KV the data's owner must make before the next forward pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvCopy {
    /// Demotion: device block to host slot (the device block is free afterwards).
    ToHost { device: BlockId, host: BlockId },
    /// Promotion: host slot to device block.
    ToDevice { host: BlockId, device: BlockId },
    /// A host block leaving the host tier for the storage tier, under `key`; `tokens` is its
    /// whole path (the file's header, to restore it later).
    HostToStorage {
        host: BlockId,
        key: u64,
        tokens: Vec<u32>,
    },
    /// Promotion from storage; `tokens` is the block's whole path (checked against the file's).
    /// The device block stays pinned until [`RadixCache::unpin`], so a failed read can be traced
    /// to it.
    StorageToDevice {
        key: u64,
        device: BlockId,
        tokens: Vec<u32>,
    },
}

/// A block [`RadixCache::persist`] wants written to storage, from where it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToPersist {
    /// `Ok(device block)` or `Err(host slot)`.
    pub from: Result<BlockId, BlockId>,
    pub key: u64,
    pub tokens: Vec<u32>,
}

/// What a lookup reused.
#[derive(Debug)]
pub struct Reuse {
    /// A table holding the reused blocks (one reference each), for the sequence to append to.
    pub table: BlockTable,
    /// Of its tokens, those that were on the device, and those promoted from the host and
    /// storage tiers.
    pub device_tokens: usize,
    pub host_tokens: usize,
    pub storage_tokens: usize,
}

/// Counters of the cache's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RadixStats {
    /// Blocks held on the device (in use by sequences or idle), in the host tier, and only in
    /// the storage tier.
    pub device_blocks: usize,
    pub host_blocks: usize,
    pub stored_blocks: usize,
    /// Device blocks only the cache holds (free for anyone, on eviction).
    pub idle_blocks: usize,
    /// Blocks dropped from the cache (from the device without a host tier, else from the host
    /// tier), moved to the host tier, and brought back from it.
    pub evicted: u64,
    pub demoted: u64,
    pub promoted: u64,
    /// Blocks written to storage.
    pub stored: u64,
}

/// A radix tree of cached KV blocks over one pool, and optionally a host tier.
pub struct RadixCache {
    pool: BlockPool,
    host: Option<BlockPool>,
    storage: bool,
    copies: Vec<KvCopy>,
    /// Device blocks with a storage read pending (one extra reference each).
    pinned: Vec<BlockId>,
    /// Slab of nodes; `None` marks a free slot (listed in `vacant`).
    nodes: Vec<Option<Node>>,
    vacant: Vec<NodeId>,
    clock: u64,
    evicted: u64,
    demoted: u64,
    promoted: u64,
    written: u64,
}

impl std::fmt::Debug for RadixCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RadixCache")
            .field("stats", &self.stats())
            .finish()
    }
}

impl RadixCache {
    pub fn new(pool: BlockPool) -> Self {
        Self {
            pool,
            host: None,
            storage: false,
            copies: Vec::new(),
            pinned: Vec::new(),
            nodes: vec![Some(Node {
                parent: ROOT,
                key: Box::new([]),
                place: None,
                children: HashMap::new(),
                last_used: 0,
                key_hash: 0,
                stored: false,
            })],
            vacant: Vec::new(),
            clock: 0,
            evicted: 0,
            demoted: 0,
            promoted: 0,
            written: 0,
        }
    }

    /// Adds a storage tier under the host tier (see the module docs).
    pub fn enable_storage(&mut self) {
        self.storage = true;
    }

    /// Puts a stored block back in the tree: `tokens` is its whole path (a whole number of
    /// blocks). Its ancestors must be there already (restore shorter paths first); returns
    /// false, changing nothing, if one is missing.
    pub fn restore(&mut self, tokens: &[u32]) -> bool {
        let bs = self.pool.block_size();
        if tokens.is_empty() || !tokens.len().is_multiple_of(bs) {
            return false;
        }
        let mut at = ROOT;
        let (head, last) = tokens.split_at(tokens.len() - bs);
        for key in head.chunks_exact(bs) {
            match self.node(at).children.get(key) {
                Some(&c) => at = c,
                None => return false,
            }
        }
        if let Some(&c) = self.node(at).children.get(last) {
            self.node_mut(c).stored = true;
            return true;
        }
        let key_hash = path_key(self.node(at).key_hash, last);
        let id = self.add_node(at, last, Place::Stored, key_hash);
        self.node_mut(id).stored = true;
        true
    }

    /// Every cached block not yet in storage, marked as stored: the owner of the data writes
    /// them (a shutdown). Empty without a storage tier.
    pub fn persist(&mut self) -> Vec<ToPersist> {
        if !self.storage {
            return Vec::new();
        }
        let ids: Vec<NodeId> = self
            .live()
            .filter(|(_, n)| !n.stored)
            .map(|(id, _)| id)
            .collect();
        let mut out = Vec::new();
        for id in ids {
            let from = match self.node(id).place {
                Some(Place::Device(b)) => Ok(b),
                Some(Place::Host(h)) => Err(h),
                _ => continue,
            };
            out.push(ToPersist {
                from,
                key: self.node(id).key_hash,
                tokens: self.path(id),
            });
            self.node_mut(id).stored = true;
            self.written += 1;
        }
        out
    }

    /// The tokens from the root to the end of node `id`'s block.
    fn path(&self, mut id: NodeId) -> Vec<u32> {
        let mut parts = Vec::new();
        while id != ROOT {
            let n = self.node(id);
            parts.push(&n.key[..]);
            id = n.parent;
        }
        parts.into_iter().rev().flatten().copied().collect()
    }

    fn add_node(&mut self, parent: NodeId, key: &[u32], place: Place, key_hash: u64) -> NodeId {
        let node = Node {
            parent,
            key: key.into(),
            place: Some(place),
            children: HashMap::new(),
            last_used: self.clock,
            key_hash,
            stored: false,
        };
        let id = match self.vacant.pop() {
            Some(id) => {
                self.nodes[id] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        };
        self.node_mut(parent).children.insert(key.into(), id);
        id
    }

    /// A cache whose evicted blocks move to `host` (a pool of host slots of the same block
    /// size) instead of being dropped.
    pub fn with_host_tier(pool: BlockPool, host: BlockPool) -> Self {
        assert_eq!(
            pool.block_size(),
            host.block_size(),
            "tiers of one block size"
        );
        let mut cache = Self::new(pool);
        cache.host = Some(host);
        cache
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    fn node(&self, id: NodeId) -> &Node {
        self.nodes[id].as_ref().expect("live node")
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.nodes[id].as_mut().expect("live node")
    }

    fn live(&self) -> impl Iterator<Item = (NodeId, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .skip(1)
            .filter_map(|(id, n)| n.as_ref().map(|n| (id, n)))
    }

    pub fn stats(&self) -> RadixStats {
        let mut s = RadixStats {
            evicted: self.evicted,
            demoted: self.demoted,
            promoted: self.promoted,
            stored: self.written,
            ..RadixStats::default()
        };
        for (_, n) in self.live() {
            match n.place {
                Some(Place::Device(b)) => {
                    s.device_blocks += 1;
                    s.idle_blocks += usize::from(self.pool.ref_count(b) == 1);
                }
                Some(Place::Host(_)) => s.host_blocks += 1,
                Some(Place::Stored) => s.stored_blocks += 1,
                None => {}
            }
        }
        s
    }

    /// Blocks the cache holds on the device (some may also be in use by sequences).
    pub fn cached_blocks(&self) -> usize {
        self.stats().device_blocks
    }

    /// Cached device blocks no sequence uses: what [`RadixCache::evict`] could free at most.
    pub fn idle_blocks(&self) -> usize {
        self.stats().idle_blocks
    }

    /// Releases the blocks pinned by storage reads: call once the copies are made (and a failed
    /// read's block is forgotten).
    pub fn unpin(&mut self) {
        let mut pool = self.pool.inner().borrow_mut();
        for b in self.pinned.drain(..) {
            pool.release(b);
        }
    }

    /// The copies queued since the last call, in the order they must be made.
    pub fn take_copies(&mut self) -> Vec<KvCopy> {
        std::mem::take(&mut self.copies)
    }

    /// Tokens of the longest cached prefix of `tokens` (either tier), in whole blocks; changes
    /// nothing.
    pub fn prefix_len(&self, tokens: &[u32]) -> usize {
        let bs = self.pool.block_size();
        let mut at = ROOT;
        let mut blocks = 0;
        for key in tokens.chunks_exact(bs) {
            match self.node(at).children.get(key) {
                Some(&child) => at = child,
                None => break,
            }
            blocks += 1;
        }
        blocks * bs
    }

    /// The longest cached prefix of `tokens` in whole blocks, as a table for a sequence that
    /// starts with those tokens and appends its own after them; host-tier blocks on the way are
    /// promoted (while device blocks can be had). Marks the path as just used. Callers that need
    /// the last token's logits pass all but that token.
    pub fn acquire(&mut self, tokens: &[u32]) -> Reuse {
        self.clock += 1;
        let (clock, bs) = (self.clock, self.pool.block_size());
        let mut blocks = Vec::new();
        let (mut host_blocks, mut storage_blocks) = (0, 0);
        let mut at = ROOT;
        for key in tokens.chunks_exact(bs) {
            let Some(&child) = self.node(at).children.get(key) else {
                break;
            };
            let block = match self.node(child).place.expect("only the root has no place") {
                Place::Device(b) => b,
                place => match self.promote(child, place) {
                    Some(b) => {
                        match place {
                            Place::Host(_) => host_blocks += 1,
                            _ => storage_blocks += 1,
                        }
                        b
                    }
                    None => break,
                },
            };
            // The sequence's reference, taken now so that promotions further down cannot
            // evict this block.
            self.pool.inner().borrow_mut().retain(block);
            blocks.push(block);
            at = child;
            self.node_mut(at).last_used = clock;
        }
        let tokens = blocks.len() * bs;
        Reuse {
            table: BlockTable::adopt(self.pool.clone(), blocks, tokens),
            device_tokens: tokens - (host_blocks + storage_blocks) * bs,
            host_tokens: host_blocks * bs,
            storage_tokens: storage_blocks * bs,
        }
    }

    /// Brings node `id` back from the host or storage tier into a device block, evicting
    /// another if need be.
    fn promote(&mut self, id: NodeId, from: Place) -> Option<BlockId> {
        let mut fresh = Vec::with_capacity(1);
        if self
            .pool
            .inner()
            .borrow_mut()
            .allocate_into(1, &mut fresh)
            .is_err()
        {
            // Dropped, not demoted: a demotion could take the host tier's last leaf, this one.
            self.evict_from_device(1, false);
            self.pool
                .inner()
                .borrow_mut()
                .allocate_into(1, &mut fresh)
                .ok()?;
        }
        let device = fresh[0];
        match from {
            Place::Host(h) => {
                self.copies.push(KvCopy::ToDevice { host: h, device });
                self.release_host(h);
            }
            _ => {
                let (key, tokens) = (self.node(id).key_hash, self.path(id));
                self.copies.push(KvCopy::StorageToDevice {
                    key,
                    device,
                    tokens,
                });
                self.pool.inner().borrow_mut().retain(device);
                self.pinned.push(device);
            }
        }
        self.node_mut(id).place = Some(Place::Device(device));
        self.promoted += 1;
        Some(device)
    }

    fn release_host(&self, h: BlockId) {
        if let Some(host) = &self.host {
            host.inner().borrow_mut().release(h);
        }
    }

    /// Caches the full blocks of a sequence: `tokens` (a whole number of blocks) whose KV is in
    /// `blocks`. Blocks already cached on the device under the same tokens stay as they are
    /// (the sequence keeps its own copy until it ends); a host-tier copy is replaced by the
    /// sequence's block; new ones gain the cache's reference.
    pub fn insert(&mut self, tokens: &[u32], blocks: &[BlockId]) {
        let bs = self.pool.block_size();
        assert_eq!(tokens.len(), blocks.len() * bs, "whole blocks only");
        self.clock += 1;
        let clock = self.clock;
        let mut at = ROOT;
        for (key, &block) in tokens.chunks_exact(bs).zip(blocks) {
            at = match self.node(at).children.get(key) {
                Some(&child) => {
                    match self.node(child).place {
                        Some(Place::Host(h)) => {
                            self.release_host(h);
                            self.pool.inner().borrow_mut().retain(block);
                            self.node_mut(child).place = Some(Place::Device(block));
                        }
                        Some(Place::Stored) => {
                            self.pool.inner().borrow_mut().retain(block);
                            self.node_mut(child).place = Some(Place::Device(block));
                        }
                        _ => {}
                    }
                    child
                }
                None => {
                    self.pool.inner().borrow_mut().retain(block);
                    let key_hash = path_key(self.node(at).key_hash, key);
                    self.add_node(at, key, Place::Device(block), key_hash)
                }
            };
            self.node_mut(at).last_used = clock;
        }
    }

    /// A device node only the cache holds, with no device node after it.
    fn device_leaf(&self, id: NodeId) -> bool {
        let node = self.node(id);
        let idle = matches!(node.place, Some(Place::Device(b)) if self.pool.ref_count(b) == 1);
        idle && node
            .children
            .values()
            .all(|&c| !matches!(self.node(c).place, Some(Place::Device(_))))
    }

    /// Frees up to `n` device blocks that only the cache holds, least recently used first (a
    /// parent's turn comes once nothing after it is on the device). With a host tier they move
    /// there; without, they are dropped. Returns how many device blocks were freed.
    pub fn evict(&mut self, n: usize) -> usize {
        self.evict_from_device(n, true)
    }

    fn evict_from_device(&mut self, n: usize, demote: bool) -> usize {
        if n == 0 {
            return 0;
        }
        let mut heap: BinaryHeap<Reverse<(u64, NodeId)>> = self
            .live()
            .filter(|&(id, _)| self.device_leaf(id))
            .map(|(id, node)| Reverse((node.last_used, id)))
            .collect();
        let mut freed = 0;
        while freed < n {
            let Some(Reverse((_, id))) = heap.pop() else {
                break;
            };
            let Some(Place::Device(b)) = self.node(id).place else {
                continue;
            };
            let parent = self.node(id).parent;
            let slot = if demote { self.host_slot() } else { None };
            match slot {
                Some(h) => {
                    self.copies.push(KvCopy::ToHost { device: b, host: h });
                    self.pool.inner().borrow_mut().release(b);
                    self.node_mut(id).place = Some(Place::Host(h));
                    self.demoted += 1;
                }
                None => self.drop_subtree(id),
            }
            freed += 1;
            if parent != ROOT && self.device_leaf(parent) {
                heap.push(Reverse((self.node(parent).last_used, parent)));
            }
        }
        freed
    }

    /// A free host slot, dropping the host tier's least recently used leaf if it is full;
    /// `None` without a host tier (or one of no slots).
    fn host_slot(&mut self) -> Option<BlockId> {
        let host = self.host.clone()?;
        let mut slot = Vec::with_capacity(1);
        if host
            .inner()
            .borrow_mut()
            .allocate_into(1, &mut slot)
            .is_ok()
        {
            return Some(slot[0]);
        }
        // The least recently used host block with no host block after it.
        let victim = self
            .live()
            .filter(|(_, n)| {
                matches!(n.place, Some(Place::Host(_)))
                    && n.children
                        .values()
                        .all(|&c| !matches!(self.node(c).place, Some(Place::Host(_))))
            })
            .filter(|(_, n)| self.storage || n.children.is_empty())
            .min_by_key(|(_, n)| n.last_used)
            .map(|(id, _)| id)?;
        if self.storage {
            let Some(Place::Host(h)) = self.node(victim).place else {
                unreachable!("a host node")
            };
            if !self.node(victim).stored {
                let (key, tokens) = (self.node(victim).key_hash, self.path(victim));
                self.copies.push(KvCopy::HostToStorage {
                    host: h,
                    key,
                    tokens,
                });
                self.node_mut(victim).stored = true;
                self.written += 1;
            }
            self.node_mut(victim).place = Some(Place::Stored);
            // The slot is reused at once: its copy to storage is queued before any copy into it.
            return Some(h);
        }
        self.drop_subtree(victim);
        host.inner().borrow_mut().allocate_into(1, &mut slot).ok()?;
        Some(slot[0])
    }

    /// Drops a node and everything after it, releasing their blocks.
    fn drop_subtree(&mut self, id: NodeId) {
        let mut stack = vec![id];
        let mut dropped = Vec::new();
        while let Some(n) = stack.pop() {
            stack.extend(self.node(n).children.values().copied());
            dropped.push(n);
        }
        let node = self.node(id);
        let (parent, key) = (node.parent, node.key.clone());
        self.node_mut(parent).children.remove(&key);
        for n in dropped {
            let node = self.nodes[n].take().expect("live node");
            match node.place {
                Some(Place::Device(b)) => self.pool.inner().borrow_mut().release(b),
                Some(Place::Host(h)) => self.release_host(h),
                Some(Place::Stored) | None => {}
            }
            self.vacant.push(n);
            self.evicted += 1;
        }
    }

    /// Drops the node holding device block `block`, and everything after it (their KV cannot be
    /// trusted); nothing if no node holds it.
    pub fn forget_device_block(&mut self, block: BlockId) {
        let found = self
            .live()
            .find(|(_, n)| n.place == Some(Place::Device(block)))
            .map(|(id, _)| id);
        if let Some(id) = found {
            self.drop_subtree(id);
        }
    }

    /// Drops every cached block on both tiers (those in use stay with their sequences), and
    /// any copies not yet made. Returns how many blocks were dropped.
    pub fn clear(&mut self) -> usize {
        let stats = self.stats();
        let children: Vec<NodeId> = self.node(ROOT).children.values().copied().collect();
        let evicted = self.evicted;
        for c in children {
            self.drop_subtree(c);
        }
        self.evicted = evicted;
        self.copies.clear();
        stats.device_blocks + stats.host_blocks + stats.stored_blocks
    }
}

impl Drop for RadixCache {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(n: usize, seed: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 31 + seed).collect()
    }

    /// The reused blocks, dropping the table.
    fn reused(cache: &mut RadixCache, tokens: &[u32]) -> Vec<BlockId> {
        cache.acquire(tokens).table.blocks().to_vec()
    }

    #[test]
    fn a_cached_prefix_is_found_in_whole_blocks_and_outlives_its_sequence() {
        let pool = BlockPool::with_blocks(4, 16).unwrap();
        let mut cache = RadixCache::new(pool.clone());
        let prompt = tokens(10, 0); // 2 full blocks and 2 tokens
        let mut seq = pool.allocate(10).unwrap();
        let full = 10 / 4;
        cache.insert(&prompt[..full * 4], &seq.blocks()[..full]);
        let blocks = seq.blocks()[..full].to_vec();
        seq.clear();
        drop(seq);
        assert_eq!(pool.used_blocks(), 2, "the cache keeps the full blocks");
        let mut longer = prompt.clone();
        longer.extend([7, 7, 7, 7, 7]);
        assert_eq!(cache.prefix_len(&longer), 8);
        assert_eq!(reused(&mut cache, &longer), blocks);
        // A different second block shares only the first.
        let mut other = prompt[..4].to_vec();
        other.extend([9, 9, 9, 9]);
        assert_eq!(cache.acquire(&other).table.num_tokens(), 4);
        assert_eq!(
            cache.acquire(&tokens(3, 0)).table.num_tokens(),
            0,
            "no whole block"
        );
        // A table built on the match shares the blocks and appends its own.
        let found = cache.acquire(&longer);
        assert_eq!((found.device_tokens, found.host_tokens), (8, 0));
        let mut table = found.table;
        assert_eq!(table.num_tokens(), 8);
        assert_eq!(pool.ref_count(blocks[0]), 2);
        table.append(3).unwrap();
        assert_eq!(pool.used_blocks(), 3);
        drop(table);
        assert_eq!(pool.used_blocks(), 2);
        pool.assert_consistent();
    }

    #[test]
    fn eviction_takes_idle_leaves_least_recently_used_first() {
        let pool = BlockPool::with_blocks(2, 16).unwrap();
        let mut cache = RadixCache::new(pool.clone());
        // Two branches off one shared first block: a = [x, a1, a2], b = [x, b1].
        let a = [1, 1, 2, 2, 3, 3];
        let b = [1, 1, 5, 5];
        let ta = pool.allocate(6).unwrap();
        cache.insert(&a, ta.blocks());
        let tb = pool.allocate(4).unwrap();
        cache.insert(&b, tb.blocks());
        let (a_blocks, b_blocks) = (ta.blocks().to_vec(), tb.blocks().to_vec());
        drop(ta);
        // b's first block duplicates a's (it stays with b's table until that ends).
        drop(tb);
        assert_eq!(cache.cached_blocks(), 4);
        assert_eq!(pool.used_blocks(), 4);
        // Touch branch a: b's leaf is now the oldest.
        reused(&mut cache, &a);
        assert_eq!(cache.evict(1), 1);
        assert_eq!(cache.prefix_len(&b), 2, "b's own block went first");
        assert_eq!(pool.ref_count(b_blocks[1]), 0);
        // A block in use is never evicted: hold a's prefix.
        let user = cache.acquire(&a).table;
        assert_eq!(user.blocks(), a_blocks);
        assert_eq!(cache.evict(10), 0);
        drop(user);
        // Leaves go first, then their parents: all three.
        assert_eq!(cache.evict(10), 3);
        assert_eq!(pool.used_blocks(), 0);
        assert_eq!(cache.stats().evicted, 4);
        assert!(cache.take_copies().is_empty(), "no host tier, no copies");
        pool.assert_consistent();
    }

    #[test]
    fn clearing_keeps_blocks_in_use() {
        let pool = BlockPool::with_blocks(2, 8).unwrap();
        let mut cache = RadixCache::new(pool.clone());
        let t = pool.allocate(4).unwrap();
        cache.insert(&[1, 2, 3, 4], t.blocks());
        assert_eq!(cache.idle_blocks(), 0);
        assert_eq!(cache.clear(), 2);
        assert_eq!(pool.used_blocks(), 2, "still the sequence's");
        drop(t);
        assert_eq!(pool.used_blocks(), 0);
        assert_eq!(cache.prefix_len(&[1, 2, 3, 4]), 0);
        pool.assert_consistent();
    }

    #[test]
    fn evicted_blocks_move_to_the_host_tier_and_come_back_on_a_match() {
        let pool = BlockPool::with_blocks(2, 4).unwrap();
        let host = BlockPool::with_blocks(2, 2).unwrap();
        let mut cache = RadixCache::with_host_tier(pool.clone(), host.clone());
        let a = [1, 1, 2, 2];
        let t = pool.allocate(4).unwrap();
        let a_blocks = t.blocks().to_vec();
        cache.insert(&a, t.blocks());
        drop(t);
        // Both demoted, the leaf first: the device blocks are free, the host tier full.
        assert_eq!(cache.evict(2), 2);
        assert_eq!(pool.used_blocks(), 0);
        assert_eq!(host.used_blocks(), 2);
        let copies = cache.take_copies();
        assert_eq!(copies.len(), 2);
        assert!(matches!(copies[0], KvCopy::ToHost { device, .. } if device == a_blocks[1]));
        assert!(matches!(copies[1], KvCopy::ToHost { device, .. } if device == a_blocks[0]));
        let stats = cache.stats();
        assert_eq!(
            (stats.device_blocks, stats.host_blocks, stats.demoted),
            (0, 2, 2)
        );
        // Still found (by either tier), then promoted in path order into fresh blocks.
        assert_eq!(cache.prefix_len(&a), 4);
        let found = cache.acquire(&[1, 1, 2, 2, 9]);
        assert_eq!((found.device_tokens, found.host_tokens), (0, 4));
        let hosts: Vec<BlockId> = copies
            .iter()
            .map(|c| match c {
                KvCopy::ToHost { host, .. } => *host,
                other => unreachable!("{other:?}"),
            })
            .collect();
        let back = cache.take_copies();
        assert_eq!(
            back,
            [
                KvCopy::ToDevice {
                    host: hosts[1],
                    device: found.table.blocks()[0]
                },
                KvCopy::ToDevice {
                    host: hosts[0],
                    device: found.table.blocks()[1]
                }
            ]
        );
        assert_eq!(host.used_blocks(), 0);
        assert_eq!(cache.stats().promoted, 2);
        drop(found);
        // A host tier that is full drops its oldest leaf for a new demotion.
        let b = [7, 7];
        let t = pool.allocate(2).unwrap();
        cache.insert(&b, t.blocks());
        drop(t);
        reused(&mut cache, &b);
        assert_eq!(cache.evict(3), 3); // a's two (host now full), then b's: a's leaf dropped
        assert_eq!(cache.prefix_len(&a), 2);
        assert_eq!(cache.prefix_len(&b), 2);
        assert_eq!(cache.stats().evicted, 1);
        cache.clear();
        assert_eq!((pool.used_blocks(), host.used_blocks()), (0, 0));
        pool.assert_consistent();
        host.assert_consistent();
    }

    #[test]
    fn the_storage_tier_takes_what_the_host_tier_drops_and_restores_a_tree() {
        let pool = BlockPool::with_blocks(2, 4).unwrap();
        let host = BlockPool::with_blocks(2, 1).unwrap();
        let mut cache = RadixCache::with_host_tier(pool.clone(), host.clone());
        cache.enable_storage();
        let a = [1, 1, 2, 2];
        let t = pool.allocate(4).unwrap();
        cache.insert(&a, t.blocks());
        drop(t);
        // The leaf goes to the host slot, then to storage to make room for its parent.
        assert_eq!(cache.evict(2), 2);
        let copies = cache.take_copies();
        let leaf_key = path_key(path_key(0, &[1, 1]), &[2, 2]);
        assert!(matches!(
            &copies[1],
            KvCopy::HostToStorage { key, tokens, .. } if *key == leaf_key && tokens == &a
        ));
        let stats = cache.stats();
        assert_eq!(
            (stats.host_blocks, stats.stored_blocks, stats.stored),
            (1, 1, 1)
        );
        // Matching promotes both: the parent from the host, the leaf from storage.
        let found = cache.acquire(&[1, 1, 2, 2, 3]);
        assert_eq!(
            (found.device_tokens, found.host_tokens, found.storage_tokens),
            (0, 2, 2)
        );
        assert!(matches!(
            &cache.take_copies()[1],
            KvCopy::StorageToDevice { key, tokens, .. } if *key == leaf_key && tokens == &a
        ));
        let promoted = found.table.blocks().to_vec();
        drop(found);
        assert_eq!(
            pool.ref_count(promoted[1]),
            2,
            "pinned until the read is done"
        );
        assert_eq!(cache.evict(4), 0, "the pinned leaf holds its path");
        cache.unpin();
        assert_eq!(pool.ref_count(promoted[1]), 1);
        let found = cache.acquire(&a);
        assert_eq!(found.table.num_tokens(), 4);
        let _ = cache.take_copies();
        drop(found);
        // A shutdown persists what storage lacks (the parent); a new cache restores the tree.
        let persist = cache.persist();
        assert_eq!(persist.len(), 1);
        assert_eq!(persist[0].tokens, [1, 1]);
        assert!(cache.persist().is_empty(), "written once");
        let mut fresh = RadixCache::with_host_tier(pool.clone(), host.clone());
        fresh.enable_storage();
        assert!(!fresh.restore(&a), "the parent first");
        assert!(fresh.restore(&[1, 1]) && fresh.restore(&a));
        assert_eq!(fresh.prefix_len(&a), 4);
        assert_eq!(fresh.stats().stored_blocks, 2);
        // A block that cannot be trusted (unreadable) is forgotten, with what follows it.
        cache.forget_device_block(promoted[0]);
        assert_eq!(cache.prefix_len(&a), 0);
        assert_eq!(pool.ref_count(promoted[0]), 0);
        drop(cache);
        drop(fresh);
        assert_eq!((pool.used_blocks(), host.used_blocks()), (0, 0));
    }
}
