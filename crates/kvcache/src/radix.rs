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
//! block only the cache references, at a leaf of the tree, can be evicted: [`RadixCache::evict`]
//! frees the least recently used first, which makes room in the pool when it runs short.

use crate::pool::{BlockId, BlockPool};
use crate::table::BlockTable;
use std::collections::HashMap;

type NodeId = usize;

/// The tree's root, which holds no block.
const ROOT: NodeId = 0;

#[derive(Debug)]
struct Node {
    parent: NodeId,
    /// This block's tokens (empty for the root).
    key: Box<[u32]>,
    block: Option<BlockId>,
    children: HashMap<Box<[u32]>, NodeId>,
    /// Logical time of the last match or insert through this node.
    last_used: u64,
}

/// What a lookup found: the blocks of the longest cached prefix, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    pub blocks: Vec<BlockId>,
    /// Tokens those blocks hold (`blocks.len() × block_size`).
    pub tokens: usize,
}

/// A radix tree of cached KV blocks over one pool.
pub struct RadixCache {
    pool: BlockPool,
    /// Slab of nodes; `None` marks a free slot (listed in `vacant`).
    nodes: Vec<Option<Node>>,
    vacant: Vec<NodeId>,
    clock: u64,
    evicted: u64,
}

impl std::fmt::Debug for RadixCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RadixCache")
            .field("cached_blocks", &self.cached_blocks())
            .field("evicted", &self.evicted)
            .finish()
    }
}

impl RadixCache {
    pub fn new(pool: BlockPool) -> Self {
        Self {
            pool,
            nodes: vec![Some(Node {
                parent: ROOT,
                key: Box::new([]),
                block: None,
                children: HashMap::new(),
                last_used: 0,
            })],
            vacant: Vec::new(),
            clock: 0,
            evicted: 0,
        }
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

    /// Blocks the cache holds (some may also be in use by sequences).
    pub fn cached_blocks(&self) -> usize {
        self.nodes.len() - self.vacant.len() - 1
    }

    /// Blocks evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evicted
    }

    /// Cached blocks no sequence uses: what [`RadixCache::evict`] could free at most.
    pub fn idle_blocks(&self) -> usize {
        self.nodes
            .iter()
            .flatten()
            .filter_map(|n| n.block)
            .filter(|&b| self.pool.ref_count(b) == 1)
            .count()
    }

    /// The longest cached prefix of `tokens` in whole blocks, marked as just used. Callers that
    /// need the last token's logits pass all but that token.
    pub fn match_prefix(&mut self, tokens: &[u32]) -> PrefixMatch {
        self.clock += 1;
        let (clock, bs) = (self.clock, self.pool.block_size());
        let mut found = PrefixMatch::default();
        let mut at = ROOT;
        for key in tokens.chunks_exact(bs) {
            let Some(&child) = self.node(at).children.get(key) else {
                break;
            };
            at = child;
            let node = self.node_mut(at);
            node.last_used = clock;
            found
                .blocks
                .push(node.block.expect("only the root has no block"));
        }
        found.tokens = found.blocks.len() * bs;
        found
    }

    /// Tokens of the longest cached prefix of `tokens`, in whole blocks; changes nothing.
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

    /// A table holding a match's blocks (one more reference each), for a sequence that starts
    /// with those tokens and appends its own after them.
    pub fn table_for(&self, found: &PrefixMatch) -> BlockTable {
        BlockTable::sharing(self.pool.clone(), &found.blocks, found.tokens)
    }

    /// Caches the full blocks of a sequence: `tokens` (a whole number of blocks) whose KV is in
    /// `blocks`. Blocks already cached under the same tokens stay as they are (the sequence
    /// keeps its own copy until it ends); new ones gain the cache's reference.
    pub fn insert(&mut self, tokens: &[u32], blocks: &[BlockId]) {
        let bs = self.pool.block_size();
        assert_eq!(tokens.len(), blocks.len() * bs, "whole blocks only");
        self.clock += 1;
        let clock = self.clock;
        let mut at = ROOT;
        for (key, &block) in tokens.chunks_exact(bs).zip(blocks) {
            at = match self.node(at).children.get(key) {
                Some(&child) => child,
                None => {
                    self.pool.inner().borrow_mut().retain(block);
                    let node = Node {
                        parent: at,
                        key: key.into(),
                        block: Some(block),
                        children: HashMap::new(),
                        last_used: clock,
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
                    self.node_mut(at).children.insert(key.into(), id);
                    id
                }
            };
            self.node_mut(at).last_used = clock;
        }
    }

    /// Frees up to `n` blocks that only the cache holds, least recently used leaves first (a
    /// parent becomes a leaf once its children are gone). Returns how many were freed.
    pub fn evict(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        let idle_leaf = |cache: &Self, id: NodeId| {
            let node = cache.node(id);
            id != ROOT
                && node.children.is_empty()
                && node.block.is_some_and(|b| cache.pool.ref_count(b) == 1)
        };
        // Min-heap on last use.
        let mut heap: std::collections::BinaryHeap<std::cmp::Reverse<(u64, NodeId)>> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(id, n)| n.is_some() && idle_leaf(self, *id))
            .map(|(id, n)| std::cmp::Reverse((n.as_ref().expect("live").last_used, id)))
            .collect();
        let mut freed = 0;
        while freed < n {
            let Some(std::cmp::Reverse((_, id))) = heap.pop() else {
                break;
            };
            let parent = self.remove_leaf(id);
            freed += 1;
            if idle_leaf(self, parent) {
                heap.push(std::cmp::Reverse((self.node(parent).last_used, parent)));
            }
        }
        self.evicted += freed as u64;
        freed
    }

    /// Drops a leaf and its block reference; returns its parent.
    fn remove_leaf(&mut self, id: NodeId) -> NodeId {
        let node = self.nodes[id].take().expect("live node");
        debug_assert!(node.children.is_empty());
        self.node_mut(node.parent).children.remove(&node.key);
        if let Some(b) = node.block {
            self.pool.inner().borrow_mut().release(b);
        }
        self.vacant.push(id);
        node.parent
    }

    /// Drops every cached block (those in use stay with their sequences). Returns how many
    /// nodes were dropped.
    pub fn clear(&mut self) -> usize {
        let dropped = self.cached_blocks();
        let mut pool = self.pool.inner().borrow_mut();
        for node in self.nodes.drain(1..).flatten() {
            if let Some(b) = node.block {
                pool.release(b);
            }
        }
        drop(pool);
        self.vacant.clear();
        self.node_mut(ROOT).children.clear();
        dropped
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
        let found = cache.match_prefix(&longer);
        assert_eq!(found.blocks, blocks);
        assert_eq!(found.tokens, 8);
        // A different second block shares only the first.
        let mut other = prompt[..4].to_vec();
        other.extend([9, 9, 9, 9]);
        assert_eq!(cache.match_prefix(&other).tokens, 4);
        assert_eq!(
            cache.match_prefix(&tokens(3, 0)).tokens,
            0,
            "no whole block"
        );
        // A table built on the match shares the blocks and appends its own.
        let mut table = cache.table_for(&found);
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
        cache.match_prefix(&a);
        assert_eq!(cache.evict(1), 1);
        assert_eq!(cache.match_prefix(&b).tokens, 2, "b's own block went first");
        assert_eq!(pool.ref_count(b_blocks[1]), 0);
        // A block in use is never evicted: hold a's prefix.
        let found = cache.match_prefix(&a);
        assert_eq!(found.blocks, a_blocks);
        let user = cache.table_for(&found);
        assert_eq!(cache.evict(10), 0);
        drop(user);
        // Leaves go first, then their parents: all three.
        assert_eq!(cache.evict(10), 3);
        assert_eq!(pool.used_blocks(), 0);
        assert_eq!(cache.evictions(), 4);
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
        assert_eq!(cache.match_prefix(&[1, 2, 3, 4]).tokens, 0);
        pool.assert_consistent();
    }
}
