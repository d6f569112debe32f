//! Suffix decoding (`SUFFIX`, vLLM's `suffix` method, from Arctic Inference): drafts from the
//! continuations of the context's longest suffix match, looked up both in the sequence's own
//! tokens (as prompt lookup does) and in a bounded cache of the prompts and outputs of recent
//! requests that every sequence shares. So an answer that repeats an earlier request's (an
//! agent's loop, a file edited again, a retried question) is drafted far ahead, while text that
//! repeats nothing drafts nothing.
//!
//! A draft's size follows its match: at most `max_spec_factor` × the match length tokens (a
//! one-token match proposes one), and a node is kept only while at least `min_token_prob` of
//! the occurrences' votes go through it (so a continuation seen once among many is not
//! drafted). The cache keeps the newest `max_cached_requests` requests and `max_cached_tokens`
//! tokens at most, whichever binds first; it is indexed by hash chains over each position's two
//! tokens before, so a lookup reads only the positions that continue the same bigram, the newest
//! first (`examples/suffix_cost.rs` times both).

use crate::DraftTree;
use crate::drafter::{Drafter, DrafterMemory, Guess};
use crate::ngram::{TREE_OCCURRENCES, occurrences, vote_tree};
use std::collections::VecDeque;
use std::io::{self, Read, Write};

/// The first bytes of a saved cache.
const SAVED: &[u8; 8] = b"SPSUFX01";

/// What separates two requests in the cache (no token id is this large).
const SEPARATOR: u32 = u32::MAX;

/// Positions a lookup reads per bigram at most, the newest first.
const POSITIONS_PER_BIGRAM: usize = 32;

/// Suffix decoding's settings (vLLM's `suffix_decoding_*` names, as `--speculative-suffix-*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SuffixSettings {
    /// The longest match looked for, in tokens (`--speculative-suffix-max-tree-depth`).
    pub max_tree_depth: usize,
    /// Requests the shared cache keeps, newest first; 0: none, only the sequence's own text
    /// (`--speculative-suffix-max-cached-requests`).
    pub max_cached_requests: usize,
    /// Tokens the shared cache keeps at most (`--speculative-suffix-max-cached-tokens`).
    pub max_cached_tokens: usize,
    /// Drafts per matched token at most (`--speculative-suffix-max-spec-factor`).
    pub max_spec_factor: f64,
    /// A node's least share of the votes (`--speculative-suffix-min-token-prob`).
    pub min_token_prob: f64,
}

/// vLLM's defaults, and a token bound of 4 M (16 MB of tokens): those of `specula serve`'s
/// flags (its tests hold them equal).
pub const DEFAULT_SETTINGS: SuffixSettings = SuffixSettings {
    max_tree_depth: 24,
    max_cached_requests: 10_000,
    max_cached_tokens: 4 << 20,
    max_spec_factor: 1.0,
    min_token_prob: 0.1,
};

impl Default for SuffixSettings {
    fn default() -> Self {
        DEFAULT_SETTINGS
    }
}

/// The prompts and outputs of recent requests, end to end with a separator after each, with
/// hash chains over their bigrams (as LZ77's match finders keep them): `heads` holds, for each
/// bigram's bucket, the newest position that follows it, and `prev` links each position to the
/// one before it in its bucket. So the index is 8 bytes a token and a fixed table, whatever the
/// text, and dropping a request drops its links with it.
#[derive(Debug)]
pub struct SuffixCache {
    tokens: VecDeque<u32>,
    /// For each token kept, the previous position in its bigram's chain ([`NONE`] if none).
    prev: VecDeque<u64>,
    /// The absolute position of `tokens[0]` (positions only grow; older ones are gone).
    first: u64,
    /// Where each cached request ends (past its separator), oldest first.
    ends: VecDeque<u64>,
    /// The newest position following each bucket's bigrams ([`NONE`] if none).
    heads: Vec<u64>,
    max_requests: usize,
    max_tokens: usize,
}

/// No position.
const NONE: u64 = u64::MAX;

/// Chain links a lookup follows at most (collisions included).
const MAX_LINKS: usize = 4 * POSITIONS_PER_BIGRAM;

impl SuffixCache {
    pub fn new(max_requests: usize, max_tokens: usize) -> Self {
        let buckets = (max_tokens / 4).clamp(1 << 10, 1 << 22).next_power_of_two();
        Self {
            tokens: VecDeque::new(),
            prev: VecDeque::new(),
            first: 0,
            ends: VecDeque::new(),
            heads: if max_requests == 0 {
                Vec::new()
            } else {
                vec![NONE; buckets]
            },
            max_requests,
            max_tokens,
        }
    }

    /// Requests and tokens cached.
    pub fn len(&self) -> (usize, usize) {
        (self.ends.len(), self.tokens.len())
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Bytes the cache holds: its tokens, their links, the bucket table, the requests' ends.
    pub fn bytes(&self) -> usize {
        self.tokens.len() * 12 + self.heads.len() * 8 + self.ends.len() * 8
    }

    fn bucket(&self, a: u32, b: u32) -> usize {
        let h = (u64::from(a) << 32 | u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (h >> 32) as usize & (self.heads.len() - 1)
    }

    /// Adds a finished request's tokens (its last `max_tokens` if it is longer), then drops the
    /// oldest requests past either bound.
    pub fn add(&mut self, tokens: &[u32]) {
        if self.max_requests == 0 || self.max_tokens < 2 {
            return;
        }
        let tokens = &tokens[tokens.len().saturating_sub(self.max_tokens - 1)..];
        let end = self.first + self.tokens.len() as u64;
        for (i, &t) in tokens.iter().enumerate() {
            let mut link = NONE;
            if i >= 2 {
                let h = self.bucket(tokens[i - 2], tokens[i - 1]);
                link = std::mem::replace(&mut self.heads[h], end + i as u64);
            }
            self.tokens.push_back(t);
            self.prev.push_back(link);
        }
        self.tokens.push_back(SEPARATOR);
        self.prev.push_back(NONE);
        self.ends.push_back(end + tokens.len() as u64 + 1);
        while self.ends.len() > self.max_requests || self.tokens.len() > self.max_tokens {
            self.drop_oldest();
        }
    }

    fn drop_oldest(&mut self) {
        let Some(end) = self.ends.pop_front() else {
            return;
        };
        let n = (end - self.first) as usize;
        self.tokens.drain(..n);
        self.prev.drain(..n);
        self.first = end;
    }

    /// Writes the cached requests (oldest first) to `out`.
    pub fn save(&self, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(SAVED)?;
        out.write_all(&(self.tokens.len() as u64).to_le_bytes())?;
        let mut bytes = Vec::with_capacity(self.tokens.len() * 4);
        for t in &self.tokens {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        out.write_all(&bytes)
    }

    /// Adds the requests [`SuffixCache::save`] wrote; the whole input is checked first (its
    /// size within this cache's bound, every token below `vocab`), so a bad one adds nothing.
    pub fn restore(&mut self, input: &mut dyn Read, vocab: usize) -> io::Result<()> {
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
        let mut magic = [0u8; 8];
        input.read_exact(&mut magic)?;
        if &magic != SAVED {
            return Err(bad("not a saved suffix cache"));
        }
        let mut n = [0u8; 8];
        input.read_exact(&mut n)?;
        let n = u64::from_le_bytes(n);
        if n > self.max_tokens as u64 {
            return Err(bad("more tokens than the cache keeps"));
        }
        let mut bytes = vec![0u8; n as usize * 4];
        input.read_exact(&mut bytes)?;
        let tokens: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        if tokens
            .iter()
            .any(|&t| t != SEPARATOR && t as usize >= vocab)
        {
            return Err(bad("a token id past the vocabulary"));
        }
        for request in tokens.split(|&t| t == SEPARATOR).filter(|r| !r.is_empty()) {
            self.add(request);
        }
        Ok(())
    }

    fn at(&self, position: u64) -> Option<u32> {
        let i = position.checked_sub(self.first)?;
        self.tokens.get(i as usize).copied()
    }

    /// The cached occurrences of `context`'s suffix, as (match length up to `depth`, the
    /// tokens that followed, up to `max` and the request's end), the newest first, `most` of
    /// them.
    pub fn occurrences(
        &self,
        context: &[u32],
        depth: usize,
        max: usize,
        most: usize,
    ) -> Vec<(usize, Vec<u32>)> {
        let len = context.len();
        if len < 2 || max == 0 {
            return Vec::new();
        }
        if self.heads.is_empty() {
            return Vec::new();
        }
        let (a, b) = (context[len - 2], context[len - 1]);
        let mut found = Vec::new();
        let mut p = self.heads[self.bucket(a, b)];
        for _ in 0..MAX_LINKS {
            if p == NONE || p < self.first {
                break;
            }
            let here = p;
            p = self.prev[(here - self.first) as usize];
            // A bucket holds other bigrams too.
            if self.at(here - 1) != Some(b) || self.at(here - 2) != Some(a) {
                continue;
            }
            let p = here;
            let n = (1..=depth.min(len))
                .take_while(|&k| {
                    p.checked_sub(k as u64)
                        .and_then(|q| self.at(q))
                        .is_some_and(|t| t == context[len - k])
                })
                .count();
            let next: Vec<u32> = (0..max as u64)
                .map_while(|k| self.at(p + k).filter(|&t| t != SEPARATOR))
                .collect();
            if !next.is_empty() {
                found.push((n, next));
            }
            if found.len() == most {
                break;
            }
        }
        found
    }
}

/// Suffix decoding as a drafter: every guess is made up front from the two lookups.
#[derive(Debug)]
pub struct SuffixDrafter {
    settings: SuffixSettings,
    cache: SuffixCache,
}

impl SuffixDrafter {
    pub fn new(settings: SuffixSettings) -> Self {
        Self {
            cache: SuffixCache::new(settings.max_cached_requests, settings.max_cached_tokens),
            settings,
        }
    }

    /// Up to `max` drafts in a tree of `width` children a node, and the longest match.
    pub fn lookup(&self, tokens: &[u32], max: usize, width: usize) -> Option<(DraftTree, usize)> {
        let depth = self.settings.max_tree_depth;
        let own = occurrences(tokens, depth, 1, TREE_OCCURRENCES);
        let cached = self.cache.occurrences(tokens, depth, max, TREE_OCCURRENCES);
        let mut votes: Vec<(usize, &[u32])> = own
            .iter()
            .map(|&(n, end)| (n, &tokens[end..(end + max).min(tokens.len())]))
            .chain(cached.iter().map(|(n, next)| (*n, next.as_slice())))
            .collect();
        let longest = votes.iter().map(|v| v.0).max()?;
        // The occurrences of the longest matches vote; shorter ones are kept only as far as
        // the longest are few (a longer match predicts better, and outweighs them anyway).
        votes.sort_by_key(|v| std::cmp::Reverse(v.0));
        votes.truncate(TREE_OCCURRENCES);
        let budget = (self.settings.max_spec_factor * longest as f64).floor() as usize;
        let tree = vote_tree(&votes, max.min(budget), width, self.settings.min_token_prob);
        (!tree.is_empty()).then_some((tree, longest))
    }
}

impl Drafter for SuffixDrafter {
    fn guess(&mut self, tokens: &[u32], max: usize, width: usize) -> Guess {
        match self.lookup(tokens, max, width.max(1)) {
            Some((tree, matched)) => Guess::Drafts { tree, matched },
            None => Guess::Nothing,
        }
    }

    fn finished(&mut self, tokens: &[u32]) {
        self.cache.add(tokens);
    }

    fn save(&self, out: &mut dyn Write) -> io::Result<bool> {
        if self.cache.is_empty() {
            return Ok(false);
        }
        self.cache.save(out)?;
        Ok(true)
    }

    fn restore(&mut self, input: &mut dyn Read, vocab: usize) -> io::Result<()> {
        self.cache.restore(input, vocab)
    }

    fn memory(&self) -> DrafterMemory {
        let (requests, tokens) = self.cache.len();
        DrafterMemory {
            requests: requests as u64,
            tokens: tokens as u64,
            bytes: self.cache.bytes() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drafter(requests: usize, tokens: usize) -> SuffixDrafter {
        SuffixDrafter::new(SuffixSettings {
            max_cached_requests: requests,
            max_cached_tokens: tokens,
            ..SuffixSettings::default()
        })
    }

    #[test]
    fn a_finished_request_drafts_the_next_one_that_repeats_it() {
        let mut d = drafter(10, 1000);
        let answer: Vec<u32> = (100..140).collect();
        let mut first = vec![1, 2, 3];
        first.extend(&answer);
        d.finished(&first);
        // A new request has produced the first 6 tokens of the same answer.
        let mut context = vec![7, 8];
        context.extend(&answer[..6]);
        let (tree, matched) = d.lookup(&context, 16, 1).unwrap();
        assert_eq!(matched, 6);
        // As many drafts as the match is long (factor 1), and they are the answer's next ones.
        assert_eq!(tree.tokens(), &answer[6..12]);
        assert!(tree.is_chain());
        // Nothing continues across the end of a cached request.
        assert_eq!(d.lookup(&answer, 16, 1), None);
        // Text the cache never saw drafts nothing.
        assert_eq!(d.guess(&[50, 51, 52], 8, 1), Guess::Nothing);
    }

    #[test]
    fn a_continuation_under_min_token_prob_is_not_drafted() {
        let mut d = drafter(100, 1000);
        for _ in 0..15 {
            d.finished(&[5, 6, 7]);
        }
        d.finished(&[5, 6, 9]);
        // A sixteenth of the votes goes to 9: under the default 0.1, so not drafted.
        let (tree, matched) = d.lookup(&[1, 5, 6], 2, 2).unwrap();
        assert_eq!((tree.tokens(), matched), (&[7][..], 2));
        d.settings.min_token_prob = 0.0;
        let (tree, _) = d.lookup(&[1, 5, 6], 2, 2).unwrap();
        assert_eq!(tree.tokens(), &[7, 9]);
    }

    #[test]
    fn the_sequences_own_text_drafts_as_prompt_lookup_does() {
        let d = drafter(10, 1000);
        let tokens = [3, 4, 5, 6, 7, 8, 0, 3, 4, 5];
        let (tree, matched) = d.lookup(&tokens, 8, 1).unwrap();
        assert_eq!((tree.tokens(), matched), (&[6, 7, 8][..], 3));
    }

    #[test]
    fn the_cache_keeps_the_newest_requests_within_both_bounds() {
        let mut c = SuffixCache::new(3, 100);
        for r in 0..5u32 {
            c.add(&[1000 + r, 1, 2, 3, r]);
        }
        assert_eq!(c.len(), (3, 18));
        // The bigram (1, 2) is followed by 3 in each cached request; only the newest three are
        // found, newest first, each with its own ending.
        let found = c.occurrences(&[9, 1, 2], 24, 3, 16);
        let nexts: Vec<Vec<u32>> = found.into_iter().map(|(_, n)| n).collect();
        assert_eq!(nexts, [vec![3, 4], vec![3, 3], vec![3, 2]]);
        // The token bound: a long request pushes the others out and keeps its own tail.
        let long: Vec<u32> = (0..500).collect();
        c.add(&long);
        assert_eq!(c.len(), (1, 100));
        assert!(c.occurrences(&[1, 2], 24, 3, 16).is_empty());
        assert_eq!(c.occurrences(&[401, 402], 24, 2, 16)[0].1, [403, 404]);
        assert!(c.bytes() >= 100 * 4);
        // No cache at all with 0 requests.
        let mut none = SuffixCache::new(0, 100);
        none.add(&[1, 2, 3]);
        assert!(none.is_empty());
    }

    #[test]
    fn a_saved_cache_is_restored_and_a_bad_one_restores_nothing() {
        let mut c = SuffixCache::new(10, 1000);
        c.add(&[1, 2, 3, 4]);
        c.add(&[5, 6, 7]);
        let mut saved = Vec::new();
        c.save(&mut saved).unwrap();
        let mut back = SuffixCache::new(10, 1000);
        back.restore(&mut saved.as_slice(), 100).unwrap();
        assert_eq!(back.len(), c.len());
        assert_eq!(back.occurrences(&[0, 1, 2], 24, 4, 16), [(2, vec![3, 4])]);
        // A token past the vocabulary, a cut file, another format, more than the cache keeps:
        // errors, and nothing is added.
        let mut other = SuffixCache::new(10, 1000);
        assert!(other.restore(&mut saved.as_slice(), 7).is_err());
        assert!(other.restore(&mut &saved[..saved.len() - 2], 100).is_err());
        assert!(other.restore(&mut &b"SPECULAKV2xxxxxx"[..], 100).is_err());
        assert!(
            SuffixCache::new(10, 4)
                .restore(&mut saved.as_slice(), 100)
                .is_err()
        );
        assert!(other.is_empty());
    }

    #[test]
    fn a_bucket_shared_by_other_bigrams_finds_only_the_context_s() {
        // 1,024 buckets (the least) for the 4,096 tokens of the newest 682 requests, each with
        // bigrams of its own: buckets are shared.
        let mut c = SuffixCache::new(100_000, 4_096);
        for r in 0..10_000u32 {
            c.add(&[r, r + 50_000, 7, r + 100_000, 8]);
        }
        assert!(c.occurrences(&[50_000, 7], 24, 4, 16).is_empty());
        for r in [9_318u32, 9_500, 9_999] {
            let found = c.occurrences(&[r + 50_000, 7], 24, 4, 16);
            assert_eq!(found, [(2, vec![r + 100_000, 8])], "{r}");
        }
        assert_eq!(c.len(), (682, 4_092));
        assert_eq!(c.bytes(), 4_092 * 12 + 1024 * 8 + 682 * 8);
    }
}
