//! What suffix decoding costs the engine thread: the time to add a finished request to the
//! cache (per token) and the time of one lookup (a guess), with the cache full at its default
//! bounds. The requests are made-up token streams (words drawn from a skewed 8,000-word
//! vocabulary, every fourth request repeating an earlier one in part), since what is timed is
//! the index, not the text.
//!
//! `cargo run --release -p speculative --example suffix_cost [REQUESTS] [TOKENS_EACH]`

use speculative::{Drafter, SuffixDrafter, SuffixSettings};
use std::time::Instant;

/// A small deterministic generator (xorshift), so runs are comparable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A token from a skewed vocabulary: low ids far more often (as in text).
    fn token(&mut self) -> u32 {
        let r = (self.next() % 1_000_000) as f64 / 1_000_000.0;
        (8000.0 * r * r * r) as u32
    }
}

/// This process's resident memory, bytes (Linux; 0 elsewhere).
fn resident() -> f64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<f64>().ok())
        .unwrap_or(0.0);
    pages * 4096.0
}

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let requests = args.next().and_then(Result::ok).unwrap_or(10_000);
    let each = args.next().and_then(Result::ok).unwrap_or(400);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut made: Vec<Vec<u32>> = Vec::with_capacity(requests);
    for i in 0..requests {
        let mut t: Vec<u32> = (0..each).map(|_| rng.token()).collect();
        if i % 4 == 3 {
            let earlier = &made[(rng.next() as usize) % made.len()];
            let from = (rng.next() as usize) % (each / 2);
            t[each / 2..].copy_from_slice(&earlier[from..from + each / 2]);
        }
        made.push(t);
    }
    let mut d = SuffixDrafter::new(SuffixSettings::default());
    let before = resident();
    let started = Instant::now();
    for t in &made {
        d.finished(t);
    }
    let add = started.elapsed().as_secs_f64();
    let memory = d.memory();
    println!(
        "added {requests} requests of {each} tokens: {:.1} ns a token ({:.2} s in all); cache: {} requests, {} tokens, {:.1} MB by its count, {:.1} MB resident",
        add * 1e9 / (requests * each) as f64,
        add,
        memory.requests,
        memory.tokens,
        memory.bytes as f64 / 1e6,
        (resident() - before) / 1e6
    );
    // Lookups: a context that continues a cached request (it drafts), and a fresh one.
    for (what, repeat) in [("continuing a cached request", true), ("fresh text", false)] {
        let n = 20_000;
        let contexts: Vec<Vec<u32>> = (0..n)
            .map(|_| {
                if repeat {
                    let t = &made[made.len() - 1 - (rng.next() as usize) % (made.len() / 2)];
                    let cut = 32 + (rng.next() as usize) % (each - 64);
                    t[..cut].to_vec()
                } else {
                    (0..256).map(|_| rng.token()).collect()
                }
            })
            .collect();
        let mut drafted = 0usize;
        let started = Instant::now();
        for c in &contexts {
            if let Some((tree, _)) = d.lookup(c, 16, 1) {
                drafted += tree.len();
            }
        }
        let took = started.elapsed().as_secs_f64();
        println!(
            "lookup, {what}: {:.1} µs each, {:.1} drafts on average",
            took * 1e6 / n as f64,
            drafted as f64 / n as f64
        );
    }
}
