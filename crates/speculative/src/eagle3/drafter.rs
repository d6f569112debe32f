//! `EAGLE3` speculation: the head drafts each sequence's next tokens from the target's captured
//! residual streams, as a chain or a tree (`--speculative-eagle-topk`), the way SGLang does.
//!
//! The target's forward pass captures the streams of every row of the sequences that may
//! speculate ([`Drafter::features`]); the head runs on them lazily, when a sequence next drafts:
//! row `j` reads position `j`'s streams and token `j + 1`, so the last row it can run is the one
//! before the sequence's last token, and that row's output proposes the first draft. Drafting on
//! feeds the head its own pre-norm output (the carry) with each candidate token.
//!
//! The head's keys and values are paged with the target's block table (one slot per position,
//! like one more layer of the target), and each slot is stamped with a hash of the tokens it was
//! computed for. A row attends to the positions whose stamp is its own prefix's: what a reused
//! prefix block holds is used when the head computed it for the same tokens, and anything else
//! (a block reused by another sequence, positions never run because the sequence did not draft,
//! draft rows) is left out. The output never depends on any of this: verification is exact.

use super::Eagle3Head;
use super::batched::BatchedHead;
use crate::drafter::{Drafter, Guess};
use crate::{DraftRequest, DraftSampling, DraftTree};
use kernels::attention::f16;
use kernels::ops::softmax;
use kernels::quant::{GgmlType, dequantize};
use model::ModelError;
use model::sampler::splitmix64;
use scheduler::DraftDistribution;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Captured rows a sequence keeps for the head while it does not draft; older ones are dropped
/// and their positions stay out of the head's attention. It bounds the memory of a sequence that
/// does not speculate and, above all, the head's catching up when it drafts again: the adaptive
/// policy retries sequences it keeps off now and then, and each retry runs the head over every
/// row kept while the batch waits. The head barely reads that far back, so keeping fewer rows
/// costs next to no acceptance (figures: BENCHMARKS.md, "A bounded catch-up").
pub const MAX_PENDING_ROWS: usize = 32;

/// A sampled draft is drawn from the head's this many most likely tokens (renormalised): what
/// verification needs of the distribution stays small, and the tail it drops is mass a small
/// head spreads thin anyway.
const DRAWN_FROM: usize = 64;

/// Mixed into a request's seed for its draft draws, so they are not the sampler's own stream.
const DRAFT_STREAM: u64 = 0x5eed_d4a7_0f3a_91c5;

/// The target's token embeddings (the head's input when its checkpoint has none): the rows as
/// stored in the target's file, widened on use.
#[derive(Debug, Clone)]
pub struct TokenEmbedding {
    pub dtype: GgmlType,
    pub width: usize,
    pub data: Vec<u8>,
}

impl TokenEmbedding {
    fn row(&self, token: u32) -> Vec<f32> {
        let bytes = self.data.len() / self.rows();
        let at = token as usize * bytes;
        let mut out = vec![0.0; self.width];
        dequantize(self.dtype, &self.data[at..at + bytes], &mut out)
            .expect("the model's embedding type");
        out
    }

    fn rows(&self) -> usize {
        self.data.len() / (self.width / self.dtype.block_size() * self.dtype.type_size())
    }
}

/// The head's paged keys and values, and the stamp of the prefix each slot was computed for.
#[derive(Debug)]
struct HeadStore {
    block_size: usize,
    kv_width: usize,
    keys: Vec<f32>,
    values: Vec<f32>,
    stamps: Vec<u64>,
}

/// The stamp of a slot that holds nothing valid (a prefix hash is never 0).
const NO_STAMP: u64 = 0;

impl HeadStore {
    fn new(block_size: usize, n_blocks: usize, kv_width: usize) -> Self {
        let slots = block_size * n_blocks;
        Self {
            block_size,
            kv_width,
            keys: vec![0.0; slots * kv_width],
            values: vec![0.0; slots * kv_width],
            stamps: vec![NO_STAMP; slots],
        }
    }

    /// The slot of position `pos` in a sequence with block table `blocks`.
    fn slot(&self, blocks: &[u32], pos: usize) -> Option<usize> {
        let b = *blocks.get(pos / self.block_size)? as usize;
        let slot = b * self.block_size + pos % self.block_size;
        (slot < self.stamps.len()).then_some(slot)
    }

    fn write(&mut self, slot: usize, k: &[f32], v: &[f32], stamp: u64) {
        let w = self.kv_width;
        self.keys[slot * w..(slot + 1) * w].copy_from_slice(k);
        self.values[slot * w..(slot + 1) * w].copy_from_slice(v);
        self.stamps[slot] = stamp;
    }

    fn kv(&self, slot: usize) -> (&[f32], &[f32]) {
        let w = self.kv_width;
        (
            &self.keys[slot * w..(slot + 1) * w],
            &self.values[slot * w..(slot + 1) * w],
        )
    }
}

/// Hashes of a sequence's prefixes: `hashes[p]` is that of tokens `0..=p` (never 0).
#[derive(Debug, Clone, Default)]
struct PrefixHashes(Vec<u64>);

impl PrefixHashes {
    fn extend(&mut self, tokens: &[u32]) {
        if self.0.len() > tokens.len() {
            self.0.truncate(tokens.len());
        }
        for &t in &tokens[self.0.len()..] {
            let prev = self.0.last().copied().unwrap_or(0x9e37_79b9_7f4a_7c15);
            self.0
                .push(mix(prev ^ u64::from(t).wrapping_mul(0xff51_afd7_ed55_8ccd)) | 1);
        }
    }
}

/// SplitMix64's finaliser.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// What the drafter keeps for one sequence.
#[derive(Debug, Clone, Default)]
struct SeqState {
    hashes: PrefixHashes,
    /// Captured rows not yet run through the head: positions `pending_start..`. Kept in f16:
    /// half the memory, and what the head was trained on (`specula train-draft` stores the
    /// streams in f16).
    pending_start: usize,
    pending: VecDeque<f16>,
    /// The rows of the last verification (root first, then the draft nodes), until
    /// [`Drafter::accepted`] tells which were kept.
    verified: Option<(usize, Vec<f32>)>,
    /// The carry of the row before the last token, with the sequence's length then: asked
    /// again for the same sequence, the drafter proposes from it again.
    last: Option<(usize, Vec<f32>)>,
}

impl SeqState {
    fn pending_end(&self, width: usize) -> usize {
        self.pending_start + self.pending.len() / width
    }

    /// Appends rows for positions from `start`; rows that do not follow on replace the others.
    fn push_rows(&mut self, start: usize, rows: &[f32], width: usize) {
        // Of a long run of rows (a prompt), only the last MAX_PENDING_ROWS can be kept.
        let skip = (rows.len() / width).saturating_sub(MAX_PENDING_ROWS);
        let (start, rows) = (start + skip, &rows[skip * width..]);
        let end = self.pending_end(width);
        if start > end || self.pending.is_empty() {
            self.pending.clear();
            self.pending_start = start;
        } else if start < end {
            let keep = start.saturating_sub(self.pending_start);
            self.pending.truncate(keep * width);
            self.pending_start = start - keep;
        }
        self.pending.extend(rows.iter().map(|&x| f16::from_f32(x)));
        let n = self.pending.len() / width;
        if n > MAX_PENDING_ROWS {
            let drop = n - MAX_PENDING_ROWS;
            self.pending.drain(..drop * width);
            self.pending_start += drop;
        }
    }
}

/// A candidate draft of a proposal: its token (the target's id), parent, cumulative
/// probability, and once it has been fed to the head, the slot of its row and its carry.
struct Candidate {
    token: u32,
    parent: Option<usize>,
    score: f32,
    row: Option<(usize, Vec<f32>)>,
    /// What the token was drawn from, when the request samples.
    from: Option<DraftDistribution>,
}

/// A draft chosen from one row of the head's logits: (target id, probability, what it was
/// drawn from if sampled).
type Choice = (u32, f32, Option<DraftDistribution>);

/// One request's proposal in the making.
struct Proposal {
    root: usize,
    cands: Vec<Candidate>,
    beam: Vec<usize>,
    /// The carry the first level was proposed from.
    first: Vec<f32>,
    /// Draft rows run so far (row `i` is in slot `root + i`).
    rows: usize,
}

/// Rows of one batched pass through the head: which sequence, its block table and prefix
/// hashes' owner, the row's position and slot, and the draft-row slots it also attends to.
struct RowSpec<'a> {
    blocks: &'a [u32],
    key: u64,
    position: usize,
    slot: usize,
    /// Real positions it attends to: `0..context` (those with the sequence's stamps).
    context: usize,
    /// Draft rows it attends to (its ancestors' slots, then its own).
    extra: Vec<usize>,
    stamp: u64,
}

/// The EAGLE-3 drafter: the head, the target's embeddings and the head's paged KV.
pub struct Eagle3Drafter {
    head: Eagle3Head,
    batched: BatchedHead,
    embedding: TokenEmbedding,
    store: HeadStore,
    seqs: HashMap<u64, SeqState>,
}

impl Eagle3Drafter {
    /// A drafter over a KV pool of `n_blocks` blocks of `block_size` tokens (the target's);
    /// `embedding` is the target's (used where the head has none of its own).
    pub fn new(
        head: Eagle3Head,
        embedding: TokenEmbedding,
        block_size: usize,
        n_blocks: usize,
    ) -> Self {
        let store = HeadStore::new(block_size, n_blocks, head.kv_width());
        Self {
            batched: BatchedHead::new(&head),
            head,
            embedding,
            store,
            seqs: HashMap::new(),
        }
    }

    fn embed(&self, token: u32) -> Vec<f32> {
        match &self.head.embed {
            Some(e) => e.data[token as usize * e.cols..(token as usize + 1) * e.cols].to_vec(),
            None => self.embedding.row(token),
        }
    }

    fn feature_width(&self) -> usize {
        3 * self.head.config.target_hidden
    }

    /// Runs `rows` through the head in one batch: writes each row's key and value with its
    /// stamp, attends, and returns the carries (`rows.len() × hidden`).
    fn run_rows(&mut self, rows: &[RowSpec<'_>], tokens: &[u32], features: &[f32]) -> Vec<f32> {
        let embeddings: Vec<f32> = tokens.iter().flat_map(|&t| self.embed(t)).collect();
        let positions: Vec<usize> = rows.iter().map(|r| r.position).collect();
        let p = self
            .batched
            .project(&self.head, &embeddings, features, &positions);
        let (kvw, qw) = (self.head.kv_width(), p.q.len() / rows.len());
        for (i, r) in rows.iter().enumerate() {
            let kv = i * kvw..(i + 1) * kvw;
            self.store
                .write(r.slot, &p.k[kv.clone()], &p.v[kv], r.stamp);
        }
        let mut attn = Vec::with_capacity(p.q.len());
        for (i, r) in rows.iter().enumerate() {
            let hashes = &self.seqs[&r.key].hashes;
            let kv = self.context(r.blocks, hashes, r.context, &r.extra);
            attn.extend(self.head.attend(&p.q[i * qw..(i + 1) * qw], &kv));
        }
        self.batched.finish(&self.head, &attn, &p.residual)
    }

    /// Runs every request's pending rows whose next token is known, in one batch; returns each
    /// request's carry of the row before its last token, where that row is known, and the rows
    /// run.
    fn extend(&mut self, requests: &[DraftRequest<'_>]) -> (Vec<Option<Vec<f32>>>, usize) {
        let width = self.feature_width();
        let h = self.head.config.hidden;
        let (mut rows, mut tokens, mut features) = (Vec::new(), Vec::new(), Vec::new());
        let mut last_row = vec![None; requests.len()];
        for (i, r) in requests.iter().enumerate() {
            let state = self.seqs.entry(r.key).or_default();
            state.hashes.extend(r.tokens);
            let first = state.pending_start;
            let end = state.pending_end(width).min(r.tokens.len() - 1);
            for j in first..end {
                let Some(slot) = self.store.slot(r.blocks, j) else {
                    break;
                };
                if j + 2 == r.tokens.len() {
                    last_row[i] = Some(rows.len());
                }
                let stamp = state.hashes.0[j + 1];
                rows.push(RowSpec {
                    blocks: r.blocks,
                    key: r.key,
                    position: j,
                    slot,
                    context: j + 1,
                    extra: Vec::new(),
                    stamp,
                });
                tokens.push(r.tokens[j + 1]);
                features.extend(
                    state
                        .pending
                        .range((j - first) * width..(j - first + 1) * width)
                        .map(|x| x.to_f32()),
                );
            }
            let done = end.max(first) - first;
            state.pending.drain(..done * width);
            state.pending_start += done;
        }
        let carries = if rows.is_empty() {
            Vec::new()
        } else {
            self.run_rows(&rows, &tokens, &features)
        };
        let firsts = requests
            .iter()
            .zip(last_row)
            .map(|(r, row)| {
                let state = self.seqs.get_mut(&r.key).expect("made above");
                match row {
                    Some(row) => {
                        let carry = carries[row * h..(row + 1) * h].to_vec();
                        state.last = Some((r.tokens.len(), carry));
                    }
                    None => state.last = state.last.take().filter(|(n, _)| *n == r.tokens.len()),
                }
                state.last.as_ref().map(|(_, c)| c.clone())
            })
            .collect();
        (firsts, rows.len())
    }

    /// The keys and values a row sees: positions `0..len` whose stamp is the sequence's, then
    /// the draft rows in `extra` (slots).
    fn context(
        &self,
        blocks: &[u32],
        hashes: &PrefixHashes,
        len: usize,
        extra: &[usize],
    ) -> Vec<(&[f32], &[f32])> {
        let mut kv: Vec<(&[f32], &[f32])> = (0..len)
            .filter_map(|p| {
                let slot = self.store.slot(blocks, p)?;
                (self.store.stamps[slot] == hashes.0[p + 1]).then(|| self.store.kv(slot))
            })
            .collect();
        kv.extend(extra.iter().map(|&s| self.store.kv(s)));
        kv
    }

    /// Each row's drafts: drawn (`rows[r]`: the request's sampling and the drafted token's
    /// position), or else the `width` most likely.
    fn choose(
        &self,
        logits: &[f32],
        rows: &[(Option<DraftSampling>, usize)],
        width: usize,
    ) -> Vec<Vec<Choice>> {
        logits
            .chunks_exact(self.head.config.draft_vocab)
            .zip(rows)
            .map(|(row, &(sampling, position))| match sampling {
                Some(s) => vec![self.draw(row, s, position)],
                None => {
                    let p = probabilities(row, 1.0);
                    most_likely(&p, width)
                        .into_iter()
                        .map(|i| (self.head.draft_to_target[i], p[i], None))
                        .collect()
                }
            })
            .collect()
    }

    /// A draft drawn from a row at the request's temperature, among its [`DRAWN_FROM`] most
    /// likely tokens, with a uniform number from the request's seed and the position.
    fn draw(&self, row: &[f32], s: DraftSampling, position: usize) -> Choice {
        let p = probabilities(row, s.temperature);
        let keep = most_likely(&p, DRAWN_FROM);
        let total: f32 = keep.iter().map(|&i| p[i]).sum();
        let z = splitmix64(splitmix64(s.seed ^ DRAFT_STREAM) ^ position as u64);
        let mut u = (z >> 40) as f32 / (1u64 << 24) as f32 * total;
        let chosen = *keep
            .iter()
            .find(|&&i| {
                u -= p[i];
                u < 0.0
            })
            .unwrap_or(&keep[keep.len() - 1]);
        let mut from: Vec<(u32, f32)> = keep
            .iter()
            .map(|&i| (self.head.draft_to_target[i], p[i] / total))
            .collect();
        from.sort_by_key(|&(t, _)| t);
        let token = self.head.draft_to_target[chosen];
        (token, p[chosen] / total, Some(Arc::from(from)))
    }

    /// Every request's proposal (see [`DraftRequest`]), the head's rows of each draft level
    /// batched over the requests.
    fn propose(&mut self, requests: &[DraftRequest<'_>]) -> Vec<DraftTree> {
        let (firsts, _) = self.extend(requests);
        let h = self.head.config.hidden;
        let ready: Vec<usize> = (0..requests.len())
            .filter(|&i| firsts[i].is_some())
            .collect();
        let first_carries: Vec<f32> = ready
            .iter()
            .filter_map(|&i| firsts[i].as_deref())
            .flatten()
            .copied()
            .collect();
        let mut proposals: Vec<Option<Proposal>> = (0..requests.len()).map(|_| None).collect();
        if !ready.is_empty() {
            let logits = self.batched.logits(&self.head, &first_carries);
            let width = requests.iter().map(|r| r.width).max().unwrap_or(1);
            let rows: Vec<_> = ready
                .iter()
                .map(|&i| (requests[i].sampling, requests[i].tokens.len()))
                .collect();
            for (at, (&i, top)) in ready
                .iter()
                .zip(self.choose(&logits, &rows, width))
                .enumerate()
            {
                let cands: Vec<Candidate> = top
                    .into_iter()
                    .take(requests[i].width)
                    .map(|(token, score, from)| Candidate {
                        token,
                        parent: None,
                        score,
                        row: None,
                        from,
                    })
                    .collect();
                proposals[i] = Some(Proposal {
                    root: requests[i].tokens.len() - 1,
                    beam: (0..cands.len()).collect(),
                    cands,
                    first: first_carries[at * h..(at + 1) * h].to_vec(),
                    rows: 0,
                });
            }
        }
        let depth = requests.iter().map(|r| r.depth).max().unwrap_or(0);
        for d in 1..depth {
            self.draft_level(requests, &mut proposals, d);
        }
        proposals
            .into_iter()
            .zip(requests)
            .map(|(p, r)| p.map_or_else(DraftTree::default, |p| select(&p.cands, r.nodes)))
            .collect()
    }

    /// Feeds each proposal's beam at level `d` to the head, in one batch, and grows the next
    /// level's candidates.
    fn draft_level(
        &mut self,
        requests: &[DraftRequest<'_>],
        proposals: &mut [Option<Proposal>],
        d: usize,
    ) {
        let h = self.head.config.hidden;
        let (mut rows, mut tokens, mut features, mut owners) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, (r, p)) in requests.iter().zip(proposals.iter_mut()).enumerate() {
            let Some(p) = p.as_mut().filter(|_| d < r.depth) else {
                continue;
            };
            for &b in &p.beam {
                let Some(slot) = self.store.slot(r.blocks, p.root + p.rows) else {
                    break;
                };
                p.rows += 1;
                let mut extra = vec![slot];
                let mut at = p.cands[b].parent;
                while let Some(a) = at {
                    extra.push(p.cands[a].row.as_ref().expect("ancestors ran").0);
                    at = p.cands[a].parent;
                }
                extra.reverse();
                features.extend_from_slice(match p.cands[b].parent {
                    Some(a) => &p.cands[a].row.as_ref().expect("parents ran").1,
                    None => &p.first,
                });
                tokens.push(p.cands[b].token);
                rows.push(RowSpec {
                    blocks: r.blocks,
                    key: r.key,
                    position: p.root + d - 1,
                    slot,
                    context: p.root,
                    extra,
                    stamp: NO_STAMP,
                });
                owners.push((i, b));
            }
        }
        if rows.is_empty() {
            return;
        }
        let carries = self.run_rows(&rows, &tokens, &features);
        let logits = self.batched.logits(&self.head, &carries);
        let width = requests.iter().map(|r| r.width).max().unwrap_or(1);
        // Row k's children are drafts for the position after its own token's.
        let draws: Vec<_> = owners
            .iter()
            .zip(&rows)
            .map(|(&(i, _), r)| (requests[i].sampling, r.position + 2))
            .collect();
        let tops = self.choose(&logits, &draws, width);
        let mut children: Vec<Vec<usize>> = vec![Vec::new(); requests.len()];
        for (k, ((i, b), top)) in owners.into_iter().zip(tops).enumerate() {
            let p = proposals[i].as_mut().expect("owners have proposals");
            for (token, prob, from) in top.into_iter().take(requests[i].width) {
                children[i].push(p.cands.len());
                let score = p.cands[b].score * prob;
                p.cands.push(Candidate {
                    token,
                    parent: Some(b),
                    score,
                    row: None,
                    from,
                });
            }
            p.cands[b].row = Some((rows[k].slot, carries[k * h..(k + 1) * h].to_vec()));
        }
        for (i, mut next) in children.into_iter().enumerate() {
            let Some(p) = proposals[i].as_mut() else {
                continue;
            };
            next.sort_by(|&a, &b| {
                p.cands[b]
                    .score
                    .total_cmp(&p.cands[a].score)
                    .then(a.cmp(&b))
            });
            next.truncate(requests[i].width);
            p.beam = next;
        }
    }
}

/// softmax(row / temperature).
fn probabilities(row: &[f32], temperature: f32) -> Vec<f32> {
    let mut p: Vec<f32> = row.iter().map(|&l| l / temperature).collect();
    softmax(&mut p);
    p
}

/// The indices of the `n` largest of `p`, largest first (lower index among equals).
fn most_likely(p: &[f32], n: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..p.len()).collect();
    let n = n.min(p.len());
    let by_prob = |a: &usize, b: &usize| p[*b].total_cmp(&p[*a]).then(a.cmp(b));
    if n < idx.len() {
        idx.select_nth_unstable_by(n.saturating_sub(1), by_prob);
        idx.truncate(n);
    }
    idx.sort_by(by_prob);
    idx
}

/// The tree of the `nodes` most likely candidates (ancestors included), parents first.
fn select(cands: &[Candidate], nodes: usize) -> DraftTree {
    let mut order: Vec<usize> = (0..cands.len()).collect();
    order.sort_by(|&a, &b| cands[b].score.total_cmp(&cands[a].score).then(a.cmp(&b)));
    let mut chosen = vec![false; cands.len()];
    let mut count = 0;
    for c in order {
        let mut path = Vec::new();
        let mut at = Some(c);
        while let Some(a) = at.filter(|&a| !chosen[a]) {
            path.push(a);
            at = cands[a].parent;
        }
        if count + path.len() > nodes {
            continue;
        }
        count += path.len();
        path.iter().for_each(|&a| chosen[a] = true);
    }
    // Candidates are numbered parents first, so index order is a valid node order.
    let mut tree = DraftTree::default();
    let mut node_of = vec![0usize; cands.len()];
    for (i, c) in cands.iter().enumerate().filter(|(i, _)| chosen[*i]) {
        let parent = c.parent.map_or(0, |p| node_of[p]);
        node_of[i] = tree.push_drawn(parent, c.token, c.from.clone());
    }
    tree
}

impl Drafter for Eagle3Drafter {
    fn guess(&mut self, _tokens: &[u32], _max: usize, _width: usize) -> Guess {
        Guess::AfterSlots
    }

    fn slots(&self, depth: usize, width: usize, nodes: usize) -> usize {
        DraftRequest::slots(depth, width, nodes)
    }

    fn catch_up(&mut self, requests: &[DraftRequest<'_>]) -> Result<usize, ModelError> {
        Ok(kernels::threads::run(|| self.extend(requests).1))
    }

    fn backlog(&self, key: u64, len: usize) -> usize {
        // `extend` runs the pending rows whose next token is known.
        self.seqs.get(&key).map_or(0, |s| {
            s.pending_end(self.feature_width())
                .min(len.saturating_sub(1))
                .saturating_sub(s.pending_start)
        })
    }

    fn draft(&mut self, requests: &[DraftRequest<'_>]) -> Result<Vec<DraftTree>, ModelError> {
        Ok(kernels::threads::run(|| self.propose(requests)))
    }

    fn capture_layers(&self) -> Option<[usize; 3]> {
        Some(self.head.config.capture_layers)
    }

    fn features(&mut self, key: u64, start: usize, rows: &[f32], verified: bool) {
        let width = self.feature_width();
        if rows.is_empty() || !rows.len().is_multiple_of(width) {
            return;
        }
        let state = self.seqs.entry(key).or_default();
        if verified {
            state.verified = Some((start, rows.to_vec()));
        } else {
            state.push_rows(start, rows, width);
        }
    }

    fn accepted(&mut self, key: u64, path: &[usize], _tokens: &[u32]) -> Result<(), ModelError> {
        let width = self.feature_width();
        let Some(state) = self.seqs.get_mut(&key) else {
            return Ok(());
        };
        let Some((start, rows)) = state.verified.take() else {
            return Ok(());
        };
        // The root's row, then the accepted nodes' in order: consecutive positions.
        let kept: Vec<f32> = std::iter::once(0)
            .chain(path.iter().copied())
            .filter(|&n| (n + 1) * width <= rows.len())
            .flat_map(|n| rows[n * width..(n + 1) * width].iter().copied())
            .collect();
        state.push_rows(start, &kept, width);
        Ok(())
    }

    fn observed(&mut self, key: u64, path: &[usize], tokens: &[u32]) -> Result<(), ModelError> {
        // The verified rows are the target's whoever drafted them: the head keeps them alike.
        self.accepted(key, path, tokens)
    }

    fn forget(&mut self, key: u64) {
        self.seqs.remove(&key);
    }
}

#[cfg(test)]
mod tests;
