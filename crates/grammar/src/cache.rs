//! Compiled grammars kept for reuse, bounded in count and in (estimated) bytes; the least
//! recently used go first. llguidance does not say how big a compiled grammar is, so its size
//! is estimated from its spec's ([`estimated_bytes`]).

use std::collections::HashMap;

/// What a compiled grammar costs per byte of its spec, over [`GRAMMAR_BASE_BYTES`]: the widest
/// ratio of the resident memory a cached grammar added to its spec's bytes, on SmolLM2's
/// vocabulary (`examples/grammar_probe.rs`, `PROBE_CACHE`), over schemas, enums, regexes,
/// grammars and structural tags. It leaves out the lexer states a grammar adds as sequences use
/// it (bounded by [`MAX_LEXER_STATES`](crate::MAX_LEXER_STATES)).
pub const BYTES_PER_SPEC_BYTE: usize = 160;
/// What any compiled grammar costs besides (its parser, its lexer's start, its first mask).
pub const GRAMMAR_BASE_BYTES: usize = 256 << 10;

/// The estimated resident size of a grammar compiled from a spec of `spec_bytes`.
pub fn estimated_bytes(spec_bytes: usize) -> usize {
    GRAMMAR_BASE_BYTES.saturating_add(spec_bytes.saturating_mul(BYTES_PER_SPEC_BYTE))
}

struct Entry<V> {
    value: V,
    bytes: usize,
    used: u64,
}

/// The cache (behind the caller's lock) of compiled grammars (`V`), by their spec's key.
pub(crate) struct Cache<V> {
    entries: HashMap<String, Entry<V>>,
    bytes: usize,
    clock: u64,
    max_entries: usize,
    max_bytes: usize,
}

impl<V: Clone> Cache<V> {
    pub(crate) fn new(max_entries: usize, max_bytes: usize) -> Self {
        Self {
            entries: HashMap::new(),
            bytes: 0,
            clock: 0,
            max_entries,
            max_bytes,
        }
    }

    /// A fresh copy of the grammar cached under `key`.
    pub(crate) fn get(&mut self, key: &str) -> Option<V> {
        self.clock += 1;
        let entry = self.entries.get_mut(key)?;
        entry.used = self.clock;
        Some(entry.value.clone())
    }

    /// Keeps `value` under `key` (at an estimated `bytes`), making room by dropping the least
    /// recently used; one too big for the whole cache is not kept.
    pub(crate) fn insert(&mut self, key: String, value: V, bytes: usize) {
        if self.max_entries == 0 || bytes > self.max_bytes || self.entries.contains_key(&key) {
            return;
        }
        while self.entries.len() >= self.max_entries || self.bytes + bytes > self.max_bytes {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(e) = self.entries.remove(&oldest) {
                self.bytes -= e.bytes;
            }
        }
        self.clock += 1;
        self.bytes += bytes;
        let used = self.clock;
        self.entries.insert(key, Entry { value, bytes, used });
    }

    /// Grammars kept, and their estimated bytes.
    pub(crate) fn usage(&self) -> (usize, usize) {
        (self.entries.len(), self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_keeps_within_its_bytes_dropping_the_least_recently_used() {
        let mut cache = Cache::new(10, 100);
        cache.insert("a".into(), 1, 40);
        cache.insert("b".into(), 2, 40);
        assert_eq!(cache.get("a"), Some(1));
        // No room for 40 more: `b` was used least recently.
        cache.insert("c".into(), 3, 40);
        assert_eq!(
            (cache.get("b"), cache.get("a"), cache.get("c")),
            (None, Some(1), Some(3))
        );
        assert_eq!(cache.usage(), (2, 80));
        // Bigger than the whole cache: not kept, nothing dropped for it.
        cache.insert("d".into(), 4, 101);
        assert_eq!((cache.get("d"), cache.usage()), (None, (2, 80)));
        // And by count.
        let mut small = Cache::new(2, 1000);
        for (i, key) in ["x", "y", "z"].into_iter().enumerate() {
            small.insert(key.into(), i, 1);
        }
        assert_eq!((small.get("x"), small.usage().0), (None, 2));
    }

    #[test]
    fn the_estimate_grows_with_the_spec() {
        assert_eq!(estimated_bytes(0), GRAMMAR_BASE_BYTES);
        assert_eq!(
            estimated_bytes(1000),
            GRAMMAR_BASE_BYTES + 1000 * BYTES_PER_SPEC_BYTE
        );
        assert_eq!(estimated_bytes(usize::MAX), usize::MAX);
    }
}
