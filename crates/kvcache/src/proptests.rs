//! Property tests: random allocate / append / fork / truncate / cow / drop sequences never leak,
//! never double-free, and keep ref counts equal to the references tables hold (fork and cow are
//! test-only: they share blocks, partly filled ones too, more freely than the engine does); and
//! requests through the radix cache, which shares cached full blocks between sequences by
//! [`RadixCache::acquire`](crate::RadixCache::acquire) as the engine does, leak nothing either.

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

/// A request in the prefix-cache simulation: its tokens, the table over its KV, and how many of
/// its tokens are computed (written into their slots).
struct Live {
    tokens: Vec<u32>,
    table: BlockTable,
    computed: usize,
    inserted: usize,
}

/// 10,000 requests through a [`RadixCache`] over a small pool: prompts sharing heads, admitted
/// from their longest cached prefix, computed in random chunks, finished (their full blocks
/// cached) or aborted at random, with random evictions and flushes. The KV store is modelled as
/// one token per slot (on both tiers, the cache's copies made as it asks): a matched prefix must
/// hold exactly the prompt's tokens, and nobody may write into a block someone else holds. At the
/// end no block or host slot is leaked or freed twice.
fn run_prefix_cache(seed: u64, block_size: usize, num_blocks: u32, host_blocks: u32, files: bool) {
    use crate::radix::{KvCopy, RadixCache};
    type Store = Vec<Vec<Option<u32>>>;
    type Files = HashMap<u64, Vec<Option<u32>>>;
    // The KV copies the cache asks for, made on the modelled stores.
    fn apply(cache: &mut RadixCache, store: &mut Store, host_store: &mut (Store, Files)) {
        let (host_store, files) = host_store;
        let copies = cache.take_copies();
        for copy in copies {
            match copy {
                KvCopy::ToHost { device, host } => {
                    host_store[host.index()] = store[device.index()].clone();
                }
                KvCopy::ToDevice { host, device } => {
                    store[device.index()] = host_store[host.index()].clone();
                }
                KvCopy::HostToStorage { host, key, .. } => {
                    files.insert(key, host_store[host.index()].clone());
                }
                KvCopy::StorageToDevice { key, device, .. } => {
                    store[device.index()] = files[&key].clone();
                }
            }
        }
        cache.unpin();
    }
    let mut state = seed.max(1);
    let mut rand = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let pool = BlockPool::with_blocks(block_size, num_blocks).unwrap();
    let host = (host_blocks > 0).then(|| BlockPool::with_blocks(block_size, host_blocks).unwrap());
    let mut cache = match &host {
        Some(h) => RadixCache::with_host_tier(pool.clone(), h.clone()),
        None => RadixCache::new(pool.clone()),
    };
    let mut store: Store = vec![vec![None; block_size]; num_blocks as usize];
    let mut host_store: (Store, Files) = (
        vec![vec![None; block_size]; host_blocks as usize],
        HashMap::new(),
    );
    if files && host.is_some() {
        cache.enable_storage();
    }
    let heads: Vec<Vec<u32>> = (0..4u32)
        .map(|h| (0..(3 + 5 * h)).map(|t| t % 3 + 10 * h).collect())
        .collect();
    let mut live: Vec<Live> = Vec::new();
    let (mut admitted, mut reused) = (0, 0);
    while admitted < 10_000 {
        match rand(10) {
            // A new request: a head, then a short random tail (tokens 0..3, so tails collide).
            0..=2 => {
                let mut tokens = heads[rand(heads.len())].clone();
                tokens.extend((0..1 + rand(12)).map(|_| rand(3) as u32));
                let found = cache.acquire(&tokens[..tokens.len() - 1]);
                apply(&mut cache, &mut store, &mut host_store);
                for (i, &b) in found.table.blocks().iter().enumerate() {
                    let want = &tokens[i * block_size..(i + 1) * block_size];
                    let held: Vec<u32> = store[b.index()].iter().map(|s| s.unwrap()).collect();
                    assert_eq!(held, want, "a cached block holds other tokens");
                }
                let reused_now = found.table.num_tokens();
                let mut table = found.table;
                let rest = tokens.len() - reused_now;
                if table.append(rest).is_err() {
                    let short = table.blocks_needed(rest).saturating_sub(pool.free_blocks());
                    cache.evict(short);
                    apply(&mut cache, &mut store, &mut host_store);
                    if table.append(rest).is_err() {
                        continue; // does not fit now: dropped
                    }
                }
                admitted += 1;
                reused += reused_now;
                live.push(Live {
                    computed: reused_now,
                    inserted: reused_now / block_size,
                    tokens,
                    table,
                });
            }
            // Compute a chunk of a request and cache its newly full blocks.
            3..=6 if !live.is_empty() => {
                let i = rand(live.len());
                let r = &mut live[i];
                let end = (r.computed + 1 + rand(8)).min(r.tokens.len());
                for pos in r.computed..end {
                    let slot = r.table.slot(pos).unwrap();
                    assert_eq!(pool.ref_count(slot.block), 1, "a write into a shared block");
                    store[slot.block.index()][slot.offset] = Some(r.tokens[pos]);
                }
                r.computed = end;
                let full = r.computed / block_size;
                if full > r.inserted {
                    cache.insert(&r.tokens[..full * block_size], &r.table.blocks()[..full]);
                    r.inserted = full;
                }
            }
            // Finish or abort a request: its table goes, the cache keeps what it inserted.
            7 | 8 if !live.is_empty() => {
                let i = rand(live.len());
                live.swap_remove(i);
            }
            _ => {
                if rand(50) == 0 && live.is_empty() {
                    cache.clear();
                } else {
                    // Evicting frees exactly what it says (never a block someone holds).
                    let free = pool.free_blocks();
                    let freed = cache.evict(rand(4));
                    assert_eq!(pool.free_blocks(), free + freed);
                    apply(&mut cache, &mut store, &mut host_store);
                }
            }
        }
        pool.assert_consistent();
        assert!(cache.cached_blocks() <= pool.used_blocks());
    }
    assert!(reused > 0, "the workload was meant to hit the cache");
    drop(live);
    assert_eq!(cache.idle_blocks(), cache.cached_blocks());
    let cached = cache.cached_blocks();
    assert_eq!(
        cache.evict(usize::MAX),
        cached,
        "every idle block can be evicted"
    );
    assert_eq!(pool.free_blocks(), pool.total_blocks(), "leaked blocks");
    pool.assert_consistent();
    if let Some(h) = host {
        assert!(cache.stats().demoted > 0 && cache.stats().promoted > 0);
        cache.clear();
        assert_eq!(h.used_blocks(), 0, "leaked host slots");
        h.assert_consistent();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    #[test]
    fn ten_thousand_requests_through_the_prefix_cache_leak_nothing(
        seed in any::<u64>(),
        block_size in 1..=4usize,
        num_blocks in 12..=48u32,
        host_blocks in prop_oneof![Just(0u32), 4..=64u32],
        files in any::<bool>(),
    ) {
        run_prefix_cache(seed, block_size, num_blocks, host_blocks, files);
    }
}
