//! `STANDALONE` speculation: a second, smaller GGUF model drafts each sequence's next tokens by
//! greedy decoding (a chain) or as a tree of its most likely continuations
//! (`--speculative-eagle-topk` > 1), with its own KV store in the same engine.
//!
//! The draft's KV store has as many blocks as the target's and each sequence uses the same block
//! table in both: the scheduler's allocation (reservations for drafts, truncation of rejected
//! ones, freeing at the end) covers the draft for free, and the draft needs no pool of its own.
//! Per sequence the drafter remembers how many leading tokens have their draft KV; a proposal
//! first feeds the draft whatever it has not seen (the whole prompt the first time, usually just
//! the last accepted tokens later), then extends its draft tree one level per round, all
//! speculating sequences batched in one draft forward per round.

use crate::DraftTree;
use model::gguf::GgufFile;
use model::sampler::{argmax, top_logprobs};
use model::{LogitsFor, Model, ModelError, Runner, SeqInput, Tree};
use std::collections::HashMap;

/// One sequence asking for drafts.
pub struct DraftRequest<'a> {
    /// The engine's id for the sequence (its draft KV state is kept under it).
    pub key: u64,
    /// Prompt and output so far; the last token has no KV in the target yet.
    pub tokens: &'a [u32],
    /// The sequence's KV block table, with slots reserved for the last token and
    /// [`DraftRequest::slots`] more.
    pub blocks: &'a [u32],
    /// Levels of the draft tree (at least 1): the longest path proposed.
    pub depth: usize,
    /// Candidates kept per level (`--speculative-eagle-topk`; 1 = a chain).
    pub width: usize,
    /// Most drafts returned (the tree's most likely nodes).
    pub nodes: usize,
    /// Draw a chain's drafts from the drafter's distribution (the request samples), or take
    /// the most likely tokens (`None`).
    pub sampling: Option<DraftSampling>,
}

/// How a sampling request's drafts are drawn: from the drafter's distribution at the request's
/// temperature, with draws seeded by the request's seed and the draft's position (so a seeded
/// request drafts the same tokens again).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftSampling {
    pub temperature: f32,
    pub seed: u64,
}

impl DraftRequest<'_> {
    /// KV slots after the last token the draft writes: every level but the last is fed.
    pub fn slots(depth: usize, width: usize, nodes: usize) -> usize {
        (width * depth.saturating_sub(1)).max(nodes)
    }
}

/// What the drafter knows about one sequence.
#[derive(Debug, Clone)]
struct DraftState {
    /// Leading tokens whose KV is in the draft store.
    valid: usize,
    /// The last proposal: the root's position (the sequence's last token then), the draft's own
    /// tree (node `n` stored in slot `root + n`), how many of its nodes were fed (have KV) and
    /// the block table they were written with.
    root: usize,
    tree: DraftTree,
    fed: usize,
    blocks: Vec<u32>,
}

/// The draft model, its runner (KV store) and each sequence's state.
pub struct DraftModel {
    model: Model,
    runner: Runner,
    states: HashMap<u64, DraftState>,
}

/// Why a model cannot draft for a target.
#[derive(Debug, thiserror::Error)]
pub enum DraftError {
    #[error(
        "the draft model's vocabulary ({draft} tokens) differs from the target's ({target}): \
         a draft model must share the target's tokenizer"
    )]
    VocabSize { draft: usize, target: usize },
    #[error(
        "the draft model's token {id} is {draft:?} but the target's is {target:?}: a draft model \
         must share the target's tokenizer"
    )]
    Token {
        id: usize,
        draft: String,
        target: String,
    },
    #[error("cannot read the tokenizer of the {0} model: {1}")]
    Tokenizer(&'static str, model::gguf::GgufError),
}

/// Checks that the model in `draft` can propose tokens for the one in `target`: the same
/// vocabulary, token for token.
pub fn check_vocabulary(draft: &GgufFile, target: &GgufFile) -> Result<(), DraftError> {
    fn tokens<'f>(f: &'f GgufFile, which: &'static str) -> Result<Vec<&'f str>, DraftError> {
        f.get_str_array("tokenizer.ggml.tokens")
            .map_err(|e| DraftError::Tokenizer(which, e))
    }
    let (d, t) = (tokens(draft, "draft")?, tokens(target, "target")?);
    if d.len() != t.len() {
        return Err(DraftError::VocabSize {
            draft: d.len(),
            target: t.len(),
        });
    }
    if let Some(id) = (0..d.len()).find(|&i| d[i] != t[i]) {
        return Err(DraftError::Token {
            id,
            draft: d[id].to_string(),
            target: t[id].to_string(),
        });
    }
    Ok(())
}

impl DraftModel {
    /// A drafter with a KV store of `n_blocks` blocks of `block_size` tokens (the target's).
    pub fn new(model: Model, block_size: usize, n_blocks: usize) -> Self {
        let runner = Runner::new(&model, block_size, n_blocks);
        Self {
            model,
            runner,
            states: HashMap::new(),
        }
    }

    /// Bytes the draft's KV store takes.
    pub fn kv_bytes(&self) -> usize {
        self.runner.kv_bytes()
    }

    /// A draft tree for each request, in order. Level by level the draft model runs every
    /// sequence's newest level in one batched forward (tree attention); each node's `width` most
    /// likely next tokens are candidates, scored by the path's summed log-probability, and the
    /// `width` best candidates form the next level (EAGLE-2's expansion). The `nodes` best of
    /// the whole tree are returned. With width 1 this is greedy decoding of a chain.
    pub fn propose(&mut self, requests: &[DraftRequest<'_>]) -> Result<Vec<DraftTree>, ModelError> {
        let mut trees: Vec<DraftTree> = vec![DraftTree::default(); requests.len()];
        let mut scores: Vec<Vec<f64>> = vec![vec![0.0]; requests.len()];
        // Each request's newest level (nodes `from..` of its tree).
        let mut level_from: Vec<usize> = vec![0; requests.len()];
        let rounds = requests.iter().map(|r| r.depth).max().unwrap_or(0);
        for round in 0..rounds {
            // Round 0 catches each sequence up to its last token (the root); later rounds feed
            // the previous round's level.
            let mut who = Vec::new();
            let mut inputs = Vec::new();
            for (i, r) in requests.iter().enumerate() {
                if round >= r.depth {
                    continue;
                }
                let root = r.tokens.len() - 1;
                let input = if round == 0 {
                    let valid = self.states.get(&r.key).map_or(0, |s| s.valid).min(root);
                    SeqInput {
                        tokens: &r.tokens[valid..],
                        start_pos: valid,
                        blocks: r.blocks,
                        logits: LogitsFor::Last,
                        tree: None,
                    }
                } else {
                    let from = level_from[i];
                    SeqInput {
                        tokens: &trees[i].tokens()[from - 1..],
                        start_pos: root + from,
                        blocks: r.blocks,
                        logits: LogitsFor::All,
                        tree: Some(Tree {
                            root,
                            parents: trees[i].parents(),
                        }),
                    }
                };
                who.push(i);
                inputs.push(input);
            }
            let logits = self.runner.forward(&self.model, &inputs)?;
            drop(inputs);
            for (row, &i) in who.iter().enumerate() {
                let (width, tree) = (requests[i].width, &mut trees[i]);
                let from = level_from[i];
                let level = if round == 0 {
                    0..1
                } else {
                    from..tree.len() + 1
                };
                let mut candidates: Vec<(f64, usize, u32)> = Vec::new();
                for (r, node) in level.enumerate() {
                    let l = logits.row(row, if round == 0 { 0 } else { r });
                    if width == 1 {
                        candidates.push((0.0, node, argmax(l)));
                    } else {
                        candidates.extend(
                            top_logprobs(l, width)
                                .into_iter()
                                .map(|(t, lp)| (scores[i][node] + f64::from(lp), node, t)),
                        );
                    }
                }
                // Best first; among equals the earlier parent, then the likelier token.
                candidates.sort_by(|a, b| b.0.total_cmp(&a.0));
                level_from[i] = tree.len() + 1;
                for &(score, parent, token) in candidates.iter().take(width) {
                    tree.push(parent, token);
                    scores[i].push(score);
                }
            }
        }
        let mut out = Vec::with_capacity(requests.len());
        for (i, r) in requests.iter().enumerate() {
            let tree = std::mem::take(&mut trees[i]);
            // Nodes by score (a node never outscores its parent; ties keep node order).
            let mut best: Vec<usize> = (1..=tree.len()).collect();
            best.sort_by(|&a, &b| scores[i][b].total_cmp(&scores[i][a]).then(a.cmp(&b)));
            best.truncate(r.nodes);
            out.push(tree.select(&best));
            let root = r.tokens.len() - 1;
            self.states.insert(
                r.key,
                DraftState {
                    valid: root + 1,
                    root,
                    fed: level_from[i] - 1,
                    tree,
                    blocks: r.blocks.to_vec(),
                },
            );
        }
        Ok(out)
    }

    /// After verification: the sequence kept `accepted` (the tokens of the verified path, in
    /// order). Their draft KV is moved into place where the draft's own tree has it; the rest of
    /// the tree's KV is garbage.
    pub fn resolve(&mut self, key: u64, accepted: &[u32]) -> Result<(), ModelError> {
        let Some(s) = self.states.get_mut(&key) else {
            return Ok(());
        };
        let mut kept = 0;
        for (k, node) in s.tree.follow(accepted).into_iter().enumerate() {
            if node > s.fed {
                break;
            }
            if node != k + 1 {
                self.runner
                    .move_kv(&s.blocks, s.root + node, s.root + k + 1)?;
            }
            kept += 1;
        }
        s.valid = s.valid.min(s.root + 1 + kept);
        Ok(())
    }

    /// The sequence ended or lost its KV blocks (preempted): start it over next time.
    pub fn forget(&mut self, key: u64) {
        self.states.remove(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::gguf::MetaValue;
    use model::gguf::write::GgufWriter;

    fn vocab(tokens: &[&str]) -> GgufFile {
        let mut w = GgufWriter::new();
        w.meta(
            "tokenizer.ggml.tokens",
            MetaValue::Array(
                tokens
                    .iter()
                    .map(|t| MetaValue::String(t.to_string()))
                    .collect(),
            ),
        );
        GgufFile::from_bytes(w.finish()).unwrap()
    }

    #[test]
    fn a_draft_must_share_the_vocabulary_token_for_token() {
        let target = vocab(&["<s>", "a", "b"]);
        assert!(check_vocabulary(&vocab(&["<s>", "a", "b"]), &target).is_ok());
        let e = check_vocabulary(&vocab(&["<s>", "a"]), &target).unwrap_err();
        assert!(
            e.to_string()
                .contains("(2 tokens) differs from the target's (3)"),
            "{e}"
        );
        let e = check_vocabulary(&vocab(&["<s>", "a", "c"]), &target).unwrap_err();
        assert!(
            e.to_string()
                .contains("token 2 is \"c\" but the target's is \"b\""),
            "{e}"
        );
        let e = check_vocabulary(
            &GgufFile::from_bytes(GgufWriter::new().finish()).unwrap(),
            &target,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("tokenizer of the draft model"),
            "{e}"
        );
    }
}
