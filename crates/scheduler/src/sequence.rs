//! One sequence's tokens, how many of them have their KV computed, and its KV block table.

use kvcache::{BlockPool, BlockTable, OutOfBlocks, RadixCache, Reuse};

/// The engine's id for a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

#[derive(Debug)]
pub struct Sequence {
    pub id: SeqId,
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Tokens whose keys and values are in the cache.
    computed: usize,
    table: Option<BlockTable>,
    /// Draft tokens at the end of `tokens`, being verified this step.
    drafts: usize,
    /// Leading full blocks of the table that are in the prefix cache.
    inserted: usize,
    /// Prompt tokens the first admission found in the prefix cache.
    cached_prompt: Option<usize>,
    /// Of the tokens the latest admission reused, those promoted from the host and storage
    /// tiers.
    from_host: usize,
    from_storage: usize,
}

impl Sequence {
    pub(crate) fn new(id: SeqId, prompt: Vec<u32>) -> Self {
        Self {
            id,
            prompt_len: prompt.len(),
            tokens: prompt,
            computed: 0,
            table: None,
            drafts: 0,
            inserted: 0,
            cached_prompt: None,
            from_host: 0,
            from_storage: 0,
        }
    }

    /// Prompt tokens whose KV came from the prefix cache when the sequence was first admitted
    /// (OpenAI's `cached_tokens`); `None` before that.
    pub fn cached_prompt_tokens(&self) -> Option<usize> {
        self.cached_prompt
    }

    /// Tokens (not drafts) whose KV is computed.
    fn committed(&self) -> usize {
        self.computed.min(self.tokens.len() - self.drafts)
    }

    /// Whether it was admitted before (it was preempted if it waits again).
    pub(crate) fn has_started(&self) -> bool {
        self.cached_prompt.is_some()
    }

    /// Whether the sequence holds blocks (a waiting one holds none).
    pub(crate) fn has_blocks(&self) -> bool {
        self.table.is_some()
    }

    /// Starts a sequence without blocks from a cached prefix of its tokens.
    pub(crate) fn start_from(&mut self, reuse: Reuse) {
        debug_assert!(self.table.is_none() && reuse.table.num_tokens() < self.tokens.len());
        let bs = reuse.table.pool().block_size();
        self.computed = reuse.table.num_tokens();
        self.inserted = self.computed / bs;
        self.from_host = reuse.host_tokens;
        self.from_storage = reuse.storage_tokens;
        self.table = Some(reuse.table);
    }

    /// Records an admission; on the first, returns the prompt's length and the tokens of it the
    /// cache supplied: in all, from the host tier and from storage.
    pub(crate) fn admitted(&mut self) -> Option<(usize, usize, usize, usize)> {
        if self.cached_prompt.is_some() {
            return None;
        }
        let cached = self.computed.min(self.prompt_len);
        self.cached_prompt = Some(cached);
        let host = self.from_host.min(cached);
        Some((
            self.prompt_len,
            cached,
            host,
            self.from_storage.min(cached - host),
        ))
    }

    /// Full blocks of this sequence's prefix (its first `blocks` blocks) the prefix cache may
    /// still be waiting for: computed here but not yet inserted. The tokens of that prefix, if
    /// this sequence has them all and is computing them.
    pub(crate) fn pending_prefix(&self, block_size: usize, blocks: usize) -> Option<&[u32]> {
        let end = blocks * block_size;
        (self.inserted < blocks && self.tokens.len() >= end && self.table.is_some())
            .then(|| &self.tokens[..end])
    }

    /// Inserts the newly completed full blocks into the prefix cache.
    pub(crate) fn cache_blocks(&mut self, cache: &mut RadixCache) {
        let Some(table) = self.table.as_ref() else {
            return;
        };
        let bs = table.pool().block_size();
        let full = self.committed() / bs;
        if full > self.inserted {
            cache.insert(&self.tokens[..full * bs], &table.blocks()[..full]);
            self.inserted = full;
        }
    }

    /// Prompt then generated tokens (then, during a speculative step, the drafts).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    pub fn computed(&self) -> usize {
        self.computed
    }

    /// Tokens still to feed.
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.computed
    }

    /// The KV block ids, as the runner takes them (empty while waiting).
    pub fn block_ids(&self) -> Vec<u32> {
        self.table
            .as_ref()
            .map(|t| t.blocks().iter().map(|b| b.0).collect())
            .unwrap_or_default()
    }

    /// Makes sure the table has slots for the next `len` tokens to feed.
    pub(crate) fn reserve(&mut self, pool: &BlockPool, len: usize) -> Result<(), OutOfBlocks> {
        let table = self.table.get_or_insert_with(|| pool.new_table());
        let want = self.computed + len;
        if table.num_tokens() < want {
            table.append(want - table.num_tokens())?;
        }
        Ok(())
    }

    pub(crate) fn advance(&mut self, len: usize) {
        self.computed += len;
        debug_assert!(self.computed <= self.tokens.len());
    }

    pub(crate) fn add_drafts(&mut self, drafts: &[u32]) {
        debug_assert_eq!(self.drafts, 0);
        self.tokens.extend_from_slice(drafts);
        self.drafts = drafts.len();
    }

    /// Keeps the drafts at indices `kept` (increasing; `0..n` for a chain's first n, a branch
    /// of a draft tree otherwise), in that order; the others leave the tokens, the computed
    /// count and the block table. The caller has moved the kept drafts' KV into place.
    pub(crate) fn resolve_drafts(&mut self, kept: &[usize]) {
        let base = self.tokens.len() - self.drafts;
        let tokens: Vec<u32> = kept
            .iter()
            .filter(|&&i| i < self.drafts)
            .map(|&i| self.tokens[base + i])
            .collect();
        self.tokens.truncate(base);
        self.tokens.extend(tokens);
        self.computed = self.computed.min(self.tokens.len());
        if let Some(t) = self.table.as_mut() {
            t.truncate(self.computed);
        }
        self.drafts = 0;
    }

    pub(crate) fn push(&mut self, token: u32) {
        self.tokens.push(token);
    }

    /// Frees the blocks: the sequence will be recomputed from its first token.
    pub(crate) fn release(&mut self) {
        self.table = None;
        self.computed = 0;
        self.inserted = 0;
        self.from_host = 0;
        self.from_storage = 0;
    }
}
