//! The Hugging Face `tokenizers::Tokenizer` for a GPT-2-style byte-level BPE vocabulary: the
//! pre-type's split regexes, byte-level mapping, the merges, and the special tokens as added tokens.

use super::vocab::{TokenAttr, Vocab};
use super::{TokenizerError, pieces};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, Model, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer,
    SplitDelimiterBehavior,
};

fn backend(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Backend(e.to_string())
}

/// Builds the tokenizer. Control and unknown tokens become special added tokens, user-defined
/// ones plain added tokens, so that `Tokenizer::encode` on it alone recognises them as llama.cpp
/// does with `parse_special` on.
pub fn build(vocab: &Vocab) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let mut splits: Vec<PreTokenizerWrapper> = vocab
        .spec
        .regexes
        .iter()
        .map(|re| {
            Split::new(
                SplitPattern::Regex((*re).to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map(PreTokenizerWrapper::from)
            .map_err(backend)
        })
        .collect::<Result<_, _>>()?;
    // Only the byte-to-char mapping: the splitting is the regexes' job.
    splits.push(ByteLevel::new(false, false, false).into());
    if let Some(split) = drop_unknown_bytes(vocab)? {
        splits.push(split);
    }

    let bpe_vocab: tokenizers::models::bpe::Vocab = vocab
        .token_to_id
        .iter()
        .map(|(t, &id)| (t.clone(), id))
        .collect();
    let model = BPE::builder()
        .vocab_and_merges(bpe_vocab, usable_merges(vocab))
        .ignore_merges(vocab.spec.ignore_merges)
        .build()
        .map_err(backend)?;

    let mut tok = tokenizers::Tokenizer::new(model);
    tok.with_pre_tokenizer(Some(Sequence::new(splits)));
    tok.with_decoder(Some(ByteLevelDecoder::new(false, false, false)));

    let added = |id: usize, special: bool| {
        AddedToken::from(vocab.tokens[id].clone(), special).normalized(false)
    };
    let mut special = Vec::new();
    let mut user = Vec::new();
    for (id, attr) in vocab.attrs.iter().enumerate() {
        if attr.has(TokenAttr::CONTROL.union(TokenAttr::UNKNOWN)) {
            special.push(added(id, true));
        } else if attr.has(TokenAttr::USER_DEFINED) {
            user.push(added(id, false));
        }
    }
    tok.add_special_tokens(&special);
    tok.add_tokens(&user);
    Ok(tok)
}

/// Bytes without a token of their own (SmolLM2 has none for 0xF5..=0xFF, 0xC0, 0xC1 and a few
/// control characters) are dropped, and no merge may join the bytes on either side of one:
/// llama.cpp keeps such a byte as a symbol through the merges and only then finds no token for
/// it, while the BPE model alone would drop it first and merge its neighbours. A `Removed` split
/// on those byte-level chars does both.
fn drop_unknown_bytes(vocab: &Vocab) -> Result<Option<PreTokenizerWrapper>, TokenizerError> {
    let class: String = pieces::byte_chars()
        .into_iter()
        .filter(|c| !vocab.token_to_id.contains_key(c.to_string().as_str()))
        .map(|c| format!("\\x{{{:X}}}", u32::from(c)))
        .collect();
    if class.is_empty() {
        return Ok(None);
    }
    let split = Split::new(
        SplitPattern::Regex(format!("[{class}]")),
        SplitDelimiterBehavior::Removed,
        false,
    )
    .map_err(backend)?;
    Ok(Some(split.into()))
}

/// The merges whose parts and result are all in the vocabulary. The BPE model rejects any other;
/// llama.cpp would apply such a merge and then spell the unknown result out byte by byte, which
/// no well-formed vocabulary needs.
fn usable_merges(vocab: &Vocab) -> Vec<(String, String)> {
    let known = |s: &str| vocab.token_to_id.contains_key(s);
    let mut skipped = 0usize;
    let merges: Vec<(String, String)> = vocab
        .merges
        .iter()
        .filter(|(a, b)| {
            let ok = known(a) && known(b) && known(&format!("{a}{b}"));
            skipped += usize::from(!ok);
            ok
        })
        .cloned()
        .collect();
    if skipped > 0 {
        tracing::warn!("skipped {skipped} merges whose tokens are not in the vocabulary");
    }
    merges
}

/// Token ids for text that holds no special token: the pre-tokenizer and the BPE model alone,
/// without the added-token matching of `Tokenizer::encode`.
pub fn encode_plain(
    tok: &tokenizers::Tokenizer,
    text: &str,
    out: &mut Vec<u32>,
) -> Result<(), TokenizerError> {
    let mut pre = PreTokenizedString::from(text);
    if let Some(p) = tok.get_pre_tokenizer() {
        p.pre_tokenize(&mut pre).map_err(backend)?;
    }
    let model = tok.get_model();
    pre.tokenize(|piece| model.tokenize(piece.get()))
        .map_err(backend)?;
    for (_, _, tokens) in pre.get_splits(OffsetReferential::Original, OffsetType::None) {
        out.extend(tokens.iter().flatten().map(|t| t.id));
    }
    Ok(())
}
