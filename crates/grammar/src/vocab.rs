//! The model's vocabulary as llguidance sees it: each token's bytes, with control tokens behind
//! toktrie's special marker (so no grammar can spell them as text), and the model's own
//! tokenizer for the literals a grammar forces.

use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use model::tokenizer::{TokenAttr, Tokenizer};
use std::sync::Arc;

/// The token environment llguidance compiles grammars against: `eos` is the set of tokens that
/// end a generation (the grammar allows them where its language may end).
pub(crate) fn token_env(tokenizer: Arc<Tokenizer>, eos: &[u32]) -> Result<TokEnv, String> {
    let words: Vec<Vec<u8>> = (0..tokenizer.vocab_size() as u32)
        .map(|id| token_bytes(&tokenizer, id))
        .collect();
    let Some(&first_eos) = eos.first() else {
        return Err("the model has no end-of-generation token".into());
    };
    if let Some(&bad) = eos.iter().find(|&&t| t as usize >= words.len()) {
        return Err(format!(
            "end-of-generation token {bad} is outside the vocabulary"
        ));
    }
    let info = TokRxInfo {
        vocab_size: words.len() as u32,
        tok_eos: first_eos,
        tok_bos: tokenizer.bos_id(),
        tok_pad: None,
        tok_unk: None,
        tok_end_of_turn: None,
    };
    let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
    Ok(Arc::new(ModelTokEnv { trie, tokenizer }))
}

/// A token's bytes: its text for ordinary tokens, the special marker and its name for control,
/// unknown and unused ones (never produced by text).
fn token_bytes(tokenizer: &Tokenizer, id: u32) -> Vec<u8> {
    if is_marked(tokenizer, id) {
        let mut bytes = vec![TokTrie::SPECIAL_TOKEN_MARKER];
        bytes.extend_from_slice(tokenizer.token_text(id).unwrap_or_default().as_bytes());
        return bytes;
    }
    tokenizer
        .token_to_piece(id, true)
        .map(<[u8]>::to_vec)
        .unwrap_or_default()
}

/// Control, unknown and unused tokens: behind the special marker, never text.
fn is_marked(tokenizer: &Tokenizer, id: u32) -> bool {
    let special = TokenAttr::CONTROL
        .union(TokenAttr::UNKNOWN)
        .union(TokenAttr::UNUSED);
    tokenizer.token_attr(id).unwrap_or_default().has(special)
}

/// The control token spelled `text`, if the vocabulary has one (a grammar names it by id: its
/// text cannot reach it).
pub(crate) fn control_token(tokenizer: &Tokenizer, text: &str) -> Option<u32> {
    tokenizer
        .token_to_id(text)
        .filter(|&id| is_marked(tokenizer, id))
}

struct ModelTokEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for ModelTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// The model's own tokenization where it spells `s` back exactly (a SentencePiece model may
    /// add a leading space, for one); the trie's greedy one otherwise.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        let ours = std::str::from_utf8(s)
            .ok()
            .and_then(|text| self.tokenizer.encode(text, false, false).ok())
            .filter(|ids| self.trie.decode_raw(ids) == s);
        ours.unwrap_or_else(|| self.trie.greedy_tokenize(s))
    }
}
