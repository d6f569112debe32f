//! Property tests: random allocate / append / fork / truncate / cow / drop sequences never leak,
//! never double-free, and keep ref counts equal to the references tables hold.

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;

use crate::{BlockId, BlockPool, BlockTable};

#[derive(Debug, Clone)]
enum Op {
    Allocate(usize),
    /// Table (index modulo the live tables), tokens to add.
    Append(usize, usize),
    Fork(usize),
    /// Table, tokens to keep (may exceed its length).
    Truncate(usize, usize),
    Cow(usize),
    Drop(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..40usize).prop_map(Op::Allocate),
        4 => (any::<usize>(), 0..20usize).prop_map(|(i, k)| Op::Append(i, k)),
        2 => any::<usize>().prop_map(Op::Fork),
        3 => (any::<usize>(), 0..40usize).prop_map(|(i, n)| Op::Truncate(i, n)),
        1 => any::<usize>().prop_map(Op::Cow),
        2 => any::<usize>().prop_map(Op::Drop),
    ]
}

/// Every invariant that must hold between operations.
fn check(pool: &BlockPool, tables: &[BlockTable], lens: &[usize]) {
    pool.assert_consistent();
    let bs = pool.block_size();
    let mut refs: HashMap<BlockId, u32> = HashMap::new();
    for (t, &len) in tables.iter().zip(lens) {
        assert_eq!(t.num_tokens(), len);
        assert_eq!(t.blocks().len(), len.div_ceil(bs));
        let flat: HashSet<usize> = t.slots(0..len).map(|s| s.flat_index(bs)).collect();
        assert_eq!(flat.len(), len, "two positions share a slot");
        for &id in t.blocks() {
            *refs.entry(id).or_default() += 1;
        }
    }
    // Each block's count is exactly the references tables hold: so the sum matches, nothing
    // referenced is free (free blocks have count 0) and nothing unreferenced is in use.
    for i in 0..pool.total_blocks() {
        let id = BlockId(i as u32);
        assert_eq!(
            pool.ref_count(id),
            refs.get(&id).copied().unwrap_or(0),
            "{id}"
        );
    }
    assert_eq!(pool.used_blocks(), refs.len());
    assert_eq!(pool.free_blocks() + pool.used_blocks(), pool.total_blocks());
}

fn run(block_size: usize, num_blocks: u32, ops: Vec<Op>) {
    let pool = BlockPool::with_blocks(block_size, num_blocks).unwrap();
    let mut tables: Vec<BlockTable> = Vec::new();
    // The length each table should have, tracked independently of the tables.
    let mut lens: Vec<usize> = Vec::new();
    for op in ops {
        let free = pool.free_blocks();
        let n = tables.len();
        match op {
            Op::Allocate(tokens) => match pool.allocate(tokens) {
                Ok(t) => {
                    assert_eq!(free - pool.free_blocks(), tokens.div_ceil(block_size));
                    tables.push(t);
                    lens.push(tokens);
                }
                Err(e) => {
                    assert_eq!(e.needed, tokens.div_ceil(block_size));
                    assert_eq!(e.free, free);
                    assert!(e.needed > e.free);
                    assert!(!pool.can_allocate(tokens));
                    assert_eq!(pool.free_blocks(), free);
                }
            },
            Op::Append(i, k) if n > 0 => {
                let t = &mut tables[i % n];
                let needed = t.blocks_needed(k);
                let before = t.blocks().to_vec();
                match t.append(k) {
                    Ok(()) => {
                        assert!(needed <= free);
                        assert_eq!(free - pool.free_blocks(), needed);
                        assert_eq!(&t.blocks()[..before.len()], before, "existing blocks kept");
                        lens[i % n] += k;
                    }
                    Err(e) => {
                        // Atomic: the table and the pool are as they were.
                        assert_eq!((e.needed, e.free), (needed, free));
                        assert!(needed > free);
                        assert_eq!(t.blocks(), before);
                        assert_eq!(pool.free_blocks(), free);
                    }
                }
            }
            Op::Fork(i) if n > 0 => {
                let f = tables[i % n].fork();
                assert_eq!(f.blocks(), tables[i % n].blocks());
                assert_eq!(pool.free_blocks(), free);
                tables.push(f);
                lens.push(lens[i % n]);
            }
            Op::Truncate(i, keep) if n > 0 => {
                let t = &mut tables[i % n];
                let blocks_before = t.blocks().len();
                let released = t.truncate(keep);
                assert_eq!(blocks_before - t.blocks().len(), released);
                assert!(free <= pool.free_blocks() && pool.free_blocks() <= free + released);
                lens[i % n] = lens[i % n].min(keep);
            }
            Op::Cow(i) if n > 0 => {
                let t = &mut tables[i % n];
                let needed = t.needs_cow();
                let before = t.blocks().to_vec();
                match t.cow_last_block() {
                    Ok(Some(copy)) => {
                        assert!(needed);
                        assert_eq!(t.blocks().last(), Some(&copy.dst));
                        assert_eq!(before.last(), Some(&copy.src));
                        assert_eq!(pool.ref_count(copy.dst), 1);
                        assert!(pool.ref_count(copy.src) >= 1, "others still read it");
                        assert!(copy.num_tokens > 0 && copy.num_tokens < block_size);
                        assert!(!t.needs_cow());
                        assert_eq!(pool.free_blocks(), free - 1);
                    }
                    Ok(None) => {
                        assert!(!needed);
                        assert_eq!(t.blocks(), before);
                    }
                    Err(e) => {
                        assert!(needed);
                        assert_eq!((e.needed, e.free), (1, 0));
                        assert_eq!(t.blocks(), before);
                    }
                }
            }
            Op::Drop(i) if n > 0 => {
                tables.swap_remove(i % n);
                lens.swap_remove(i % n);
            }
            _ => {}
        }
        check(&pool, &tables, &lens);
    }
    drop(tables);
    assert_eq!(pool.free_blocks(), pool.total_blocks(), "leaked blocks");
    pool.assert_consistent();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_ops_never_leak_or_double_free(
        block_size in 1..=8usize,
        num_blocks in 1..=16u32,
        ops in prop::collection::vec(op(), 0..80),
    ) {
        run(block_size, num_blocks, ops);
    }

    #[test]
    fn append_is_all_or_nothing(
        block_size in 1..=8usize,
        num_blocks in 1..=8u32,
        prefix in 0..64usize,
        grow in 0..128usize,
    ) {
        let pool = BlockPool::with_blocks(block_size, num_blocks).unwrap();
        let Ok(mut t) = pool.allocate(prefix) else {
            prop_assert_eq!(pool.free_blocks(), pool.total_blocks());
            return Ok(());
        };
        let (free, blocks) = (pool.free_blocks(), t.blocks().to_vec());
        let fits = t.blocks_needed(grow) <= free;
        prop_assert_eq!(t.append(grow).is_ok(), fits);
        if !fits {
            prop_assert_eq!(t.blocks(), blocks.as_slice());
            prop_assert_eq!(t.num_tokens(), prefix);
            prop_assert_eq!(pool.free_blocks(), free);
        }
        drop(t);
        prop_assert_eq!(pool.free_blocks(), pool.total_blocks());
    }
}
