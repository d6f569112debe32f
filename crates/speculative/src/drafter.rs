//! The drafters behind one interface: prompt lookup (`NGRAM`) guesses from the sequence's own
//! tokens before anything is reserved; a draft model (`STANDALONE`) drafts once the step's KV
//! slots are reserved, since it writes its own KV into them. A learned head that reads the
//! target's residual streams (EAGLE-3) gets them through [`Drafter::features`].

use crate::{DraftModel, DraftRequest, DraftTree, NgramProposer};
use model::ModelError;

/// What a drafter can tell about a sequence before its draft slots are granted.
#[derive(Debug, Clone, PartialEq)]
pub enum Guess {
    /// Drafts found already (prompt lookup), with the length of the n-gram match they continue
    /// (their acceptance is estimated by it).
    Drafts { tree: DraftTree, matched: usize },
    /// No good guess: the sequence does not speculate this step.
    Nothing,
    /// Drafting needs the reserved slots: it happens in [`Drafter::draft`].
    AfterSlots,
}

/// What a drafter that remembers earlier requests holds (`SUFFIX`'s cache).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrafterMemory {
    pub requests: u64,
    pub tokens: u64,
    /// About: the tokens and their index.
    pub bytes: u64,
}

/// Something that proposes draft tokens for decoding sequences. The defaults are those of a
/// drafter that guesses everything up front from the tokens alone (prompt lookup, suffix
/// decoding): one slot a draft, nothing drafted later, nothing kept per sequence.
pub trait Drafter {
    /// Up to `max` drafts following `tokens` (prompt and output so far), in a tree of `width`
    /// candidates per node (1: a chain), if the drafter can tell without KV slots.
    fn guess(&mut self, tokens: &[u32], max: usize, width: usize) -> Guess;
    /// KV slots past the sequence's last token that drafting `nodes` drafts in `depth` levels
    /// of `width` writes (besides the drafts verified).
    fn slots(&self, _depth: usize, _width: usize, nodes: usize) -> usize {
        nodes
    }
    /// Before [`Drafter::draft`], the work the drafter owes the sequences for positions it has
    /// not seen yet (an EAGLE-3 head's rows for what was decoded while the sequence did not
    /// draft): done apart so that the draft call's own time is what drafts cost, and a
    /// sequence's one-off catching up is not priced into every later draft. Returns the rows
    /// it ran.
    fn catch_up(&mut self, _requests: &[DraftRequest<'_>]) -> Result<usize, ModelError> {
        Ok(0)
    }
    /// The rows [`Drafter::catch_up`] would run for sequence `key`, `len` tokens long, before
    /// its next draft (what the adaptive policy charges its first draft).
    fn backlog(&self, _key: u64, _len: usize) -> usize {
        0
    }
    /// Drafts for the sequences that answered [`Guess::AfterSlots`], their slots reserved.
    fn draft(&mut self, requests: &[DraftRequest<'_>]) -> Result<Vec<DraftTree>, ModelError> {
        Ok(vec![DraftTree::default(); requests.len()])
    }
    /// After verification: the sequence `key` kept the draft nodes `path` (root excluded, in
    /// order), whose tokens are `tokens`.
    fn accepted(&mut self, _key: u64, _path: &[usize], _tokens: &[u32]) -> Result<(), ModelError> {
        Ok(())
    }
    /// After verification of drafts another drafter of a combination proposed: the sequence
    /// `key` kept their nodes `path`, whose tokens are `tokens`. A drafter that reads the
    /// target's streams keeps the kept rows as for its own drafts; one with a KV of its own
    /// catches up from what it last knew when it next drafts.
    fn observed(&mut self, _key: u64, _path: &[usize], _tokens: &[u32]) -> Result<(), ModelError> {
        Ok(())
    }
    /// The target layers whose entering residual streams the drafter reads, if it reads any
    /// (then [`Drafter::features`] gets them for every row of the sequences that speculate).
    fn capture_layers(&self) -> Option<[usize; 3]> {
        None
    }
    /// The captured streams of sequence `key`'s rows from position `start` on (side by side, a
    /// row after another); `verified`: they are the rows of its draft tree being verified (the
    /// root, then node after node), resolved by the [`Drafter::accepted`] that follows.
    fn features(&mut self, _key: u64, _start: usize, _rows: &[f32], _verified: bool) {}
    /// The sequence's KV is gone (it ended, was preempted or is recomputed).
    fn forget(&mut self, _key: u64) {}
    /// A request ended with these tokens (its prompt and output): what a drafter that learns
    /// from earlier requests (`SUFFIX`) remembers.
    fn finished(&mut self, _tokens: &[u32]) {}
    /// What it remembers of earlier requests (nothing, for most drafters).
    fn memory(&self) -> DrafterMemory {
        DrafterMemory::default()
    }
    /// Writes what it remembers of earlier requests to `out`, for [`Drafter::restore`] after a
    /// restart; `false`: it remembers nothing, and wrote nothing.
    fn save(&self, _out: &mut dyn std::io::Write) -> std::io::Result<bool> {
        Ok(false)
    }
    /// Takes back what [`Drafter::save`] wrote, for a target of `vocab` tokens (anything else,
    /// or more than the drafter keeps, is an error and restores nothing).
    fn restore(&mut self, _input: &mut dyn std::io::Read, _vocab: usize) -> std::io::Result<()> {
        Ok(())
    }
}

/// Prompt lookup as a drafter.
#[derive(Debug, Clone)]
pub struct NgramDrafter(pub NgramProposer);

impl Drafter for NgramDrafter {
    fn guess(&mut self, tokens: &[u32], max: usize, width: usize) -> Guess {
        let found = if width == 1 {
            self.0
                .lookup(tokens, max)
                .map(|(d, n)| (DraftTree::chain(d), n))
        } else {
            self.0.lookup_tree(tokens, max, width)
        };
        match found {
            Some((tree, matched)) => Guess::Drafts { tree, matched },
            None => Guess::Nothing,
        }
    }
}

impl Drafter for DraftModel {
    fn guess(&mut self, _tokens: &[u32], _max: usize, _width: usize) -> Guess {
        Guess::AfterSlots
    }

    fn slots(&self, depth: usize, width: usize, nodes: usize) -> usize {
        DraftRequest::slots(depth, width, nodes)
    }

    fn draft(&mut self, requests: &[DraftRequest<'_>]) -> Result<Vec<DraftTree>, ModelError> {
        self.propose(requests)
    }

    fn accepted(&mut self, key: u64, _path: &[usize], tokens: &[u32]) -> Result<(), ModelError> {
        self.resolve(key, tokens)
    }

    fn forget(&mut self, key: u64) {
        DraftModel::forget(self, key);
    }
}
