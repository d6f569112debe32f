//! `STANDALONE` speculation: a second, smaller GGUF model drafts each sequence's next tokens by
//! greedy decoding, with its own KV store in the same engine.
//!
//! The draft's KV store has as many blocks as the target's and each sequence uses the same block
//! table in both: the scheduler's allocation (reservations for drafts, truncation of rejected
//! ones, freeing at the end) covers the draft for free, and the draft needs no pool of its own.
//! Per sequence the drafter remembers how many leading tokens have their draft KV; a proposal
//! first feeds the draft whatever it has not seen (the whole prompt the first time, usually just
//! the last accepted tokens later), then decodes one token per round, all speculating sequences
//! batched in one draft forward per round.

use model::gguf::GgufFile;
use model::sampler::argmax;
use model::{LogitsFor, Model, ModelError, Runner, SeqInput};
use std::collections::HashMap;

/// One sequence asking for drafts.
pub struct DraftRequest<'a> {
    /// The engine's id for the sequence (its draft KV state is kept under it).
    pub key: u64,
    /// Prompt and output so far; the last token has no KV in the target yet.
    pub tokens: &'a [u32],
    /// The sequence's KV block table, with slots reserved for `tokens.len() + drafts - 1`.
    pub blocks: &'a [u32],
    /// How many tokens to draft (at least 1).
    pub drafts: usize,
}

/// What the drafter knows about one sequence.
#[derive(Debug, Clone, Copy)]
struct DraftState {
    /// Leading tokens whose KV is in the draft store.
    valid: usize,
    /// The sequence's length when drafts were last proposed (their first position).
    proposed_at: usize,
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
        let runner = Runner::new(&model.config, block_size, n_blocks);
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

    /// Greedy drafts for each request, in order: `requests[i].drafts` tokens each.
    pub fn propose(&mut self, requests: &[DraftRequest<'_>]) -> Result<Vec<Vec<u32>>, ModelError> {
        let mut drafts: Vec<Vec<u32>> = requests
            .iter()
            .map(|r| Vec::with_capacity(r.drafts))
            .collect();
        let rounds = requests.iter().map(|r| r.drafts).max().unwrap_or(0);
        for round in 0..rounds {
            // Round 0 catches each sequence up to its last token; later rounds feed the previous
            // round's draft.
            let mut who = Vec::new();
            let mut inputs = Vec::new();
            for (i, r) in requests.iter().enumerate() {
                if round >= r.drafts {
                    continue;
                }
                let n = r.tokens.len();
                let (tokens, start_pos) = if round == 0 {
                    let valid = self.states.get(&r.key).map_or(0, |s| s.valid).min(n - 1);
                    (&r.tokens[valid..], valid)
                } else {
                    (&drafts[i][round - 1..round], n + round - 1)
                };
                who.push(i);
                inputs.push(SeqInput {
                    tokens,
                    start_pos,
                    blocks: r.blocks,
                    logits: LogitsFor::Last,
                });
            }
            let logits = self.runner.forward(&self.model, &inputs)?;
            drop(inputs);
            for (row, &i) in who.iter().enumerate() {
                drafts[i].push(argmax(logits.row(row, 0)));
            }
        }
        for r in requests {
            let n = r.tokens.len();
            // The last draft was never fed: positions up to n + drafts - 2 have draft KV.
            self.states.insert(
                r.key,
                DraftState {
                    valid: n + r.drafts - 1,
                    proposed_at: n,
                },
            );
        }
        Ok(drafts)
    }

    /// After verification: `accepted` of the sequence's last drafts were kept; the draft KV of
    /// the rejected ones is garbage.
    pub fn resolve(&mut self, key: u64, accepted: usize) {
        if let Some(s) = self.states.get_mut(&key) {
            s.valid = s.valid.min(s.proposed_at + accepted);
        }
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
