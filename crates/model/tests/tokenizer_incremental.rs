//! Streaming detokenization on the real SmolLM2 vocabulary and Gemma 3's SentencePiece one: the
//! chunks of `IncrementalDecoder` add up to `Tokenizer::decode`, and text that was valid UTF-8
//! streams back without a single replacement character, however its characters are split across
//! tokens (byte-level BPE pieces, or SentencePiece's `<0xXX>` byte fallback). Gemma's tests are
//! tier 2 (`#[ignore]`d; scripts/test-heavy.sh pulls the model and runs them, docs/testing.md).

mod common;

use model::gguf::GgufFile;
use model::tokenizer::{IncrementalDecoder, Tokenizer};
use proptest::prelude::*;
use std::sync::OnceLock;

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let gguf = GgufFile::open(&common::model_path()).expect("open the model");
        Tokenizer::from_gguf(&gguf).expect("build the tokenizer")
    })
}

/// Gemma 3 270M's tokenizer, from the file its corpus folder names.
fn gemma() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let name = "gemma3-270m";
        let dir = common::data_dir("tokenizer").join(name);
        let path = common::named_model_path(name, &common::source_model_file(&dir));
        let gguf = GgufFile::open(&path).expect("open the model");
        Tokenizer::from_gguf(&gguf).expect("build the tokenizer")
    })
}

/// The stream of `ids` (from the start of a sequence) equals their decoding, nothing held back.
fn stream_equals_decode(tok: &Tokenizer, ids: &[u32], skip: bool) -> Result<(), TestCaseError> {
    let mut dec = IncrementalDecoder::at_sequence_start(skip);
    let streamed: String = stream(tok, &mut dec, ids).concat();
    prop_assert_eq!(streamed, tok.decode(ids, skip).unwrap());
    prop_assert!(!dec.has_pending());
    Ok(())
}

/// The stream of `text`'s ids has no replacement character the text lacks, and is `want`.
fn streams_without_replacement(
    tok: &Tokenizer,
    text: &str,
    strip_space: bool,
    want: &str,
) -> Result<(), TestCaseError> {
    let ids = tok.encode(text, false, false).unwrap();
    let mut dec = IncrementalDecoder::new(strip_space);
    let chunks = stream(tok, &mut dec, &ids);
    for c in &chunks {
        prop_assert!(
            !c.contains('\u{FFFD}') || text.contains('\u{FFFD}'),
            "{:?}",
            chunks
        );
    }
    prop_assert_eq!(chunks.concat(), want);
    Ok(())
}

/// Streams `ids` with a decoder that strips a leading space or not: the whole text, and how many
/// tokens ended inside a character (their chunk empty, bytes held back).
fn stream_holding(tok: &Tokenizer, ids: &[u32], strip_space: bool) -> (String, usize) {
    let mut dec = IncrementalDecoder::new(strip_space);
    let mut out = String::new();
    let mut held = 0;
    for &id in ids {
        let chunk = dec.push(tok, id).unwrap();
        held += usize::from(chunk.is_empty() && dec.has_pending());
        out.push_str(&chunk);
    }
    out.push_str(&dec.flush());
    (out, held)
}

/// Streams `ids` one token at a time; returns the chunks (the flushed rest last).
fn stream(tok: &Tokenizer, dec: &mut IncrementalDecoder, ids: &[u32]) -> Vec<String> {
    let mut chunks: Vec<String> = ids.iter().map(|&id| dec.push(tok, id).unwrap()).collect();
    chunks.push(dec.flush());
    chunks
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any ids at all (byte fragments, control tokens, invalid sequences): the stream equals decode.
    #[test]
    fn chunks_add_up_to_decode(ids in prop::collection::vec(0u32..49152, 0..64), skip in any::<bool>()) {
        stream_equals_decode(tokenizer(), &ids, skip)?;
    }

    /// Ids of real text: no chunk ever holds a replacement character, the stream is the text.
    #[test]
    fn valid_text_streams_without_replacement(text in "(\\PC|[ \t\n]){0,48}") {
        let tok = tokenizer();
        let kept: Vec<u8> = text.bytes().filter(|&b| tok.byte_to_token(b).is_some()).collect();
        prop_assume!(kept.len() == text.len());
        streams_without_replacement(tok, &text, true, &text)?;
    }

    /// Gemma: any ids (byte tokens, control and user-defined tokens): the stream equals decode.
    #[test]
    #[ignore = "tier 2 (scripts/test-heavy.sh): needs `specula model pull gemma3-270m`"]
    fn gemma_chunks_add_up_to_decode(
        ids in prop::collection::vec(prop_oneof![0u32..262_144, 0u32..512], 0..64),
        skip in any::<bool>(),
    ) {
        stream_equals_decode(gemma(), &ids, skip)?;
    }

    /// Gemma: real text streams back whole (byte fallback covers every byte), with `▁` as the
    /// space it stands for.
    #[test]
    #[ignore = "tier 2 (scripts/test-heavy.sh): needs `specula model pull gemma3-270m`"]
    fn gemma_valid_text_streams_without_replacement(text in "(\\PC|[ \t\n]){0,48}") {
        streams_without_replacement(gemma(), &text, false, &text.replace('\u{2581}', " "))?;
    }
}

#[test]
#[ignore = "tier 2 (scripts/test-heavy.sh): needs `specula model pull gemma3-270m`"]
fn gemma_byte_fallback_characters_come_out_whole() {
    let tok = gemma();
    // Characters Gemma has no token for are spelled byte by byte.
    let text = "a\u{10fffd}b\u{e0100} \u{50000}!";
    let ids = tok.encode(text, false, false).unwrap();
    let (out, held) = stream_holding(tok, &ids, true);
    assert!(
        held >= 3,
        "byte tokens should end inside a character: {ids:?}"
    );
    assert_eq!(out, text);
}

#[test]
fn emoji_split_over_tokens_comes_out_whole() {
    let tok = tokenizer();
    let text = "I ❤️ Rust 🦀! 你好，世界 👨‍👩‍👧‍👦";
    let ids = tok.encode(text, false, false).unwrap();
    assert!(
        ids.len() > text.chars().count() / 2,
        "expected byte-level splits: {ids:?}"
    );
    let (out, held) = stream_holding(tok, &ids, false);
    assert!(held > 0, "some token should end inside a character");
    assert_eq!(out, text);
}

#[test]
fn control_tokens_stream_only_when_not_skipped() {
    let tok = tokenizer();
    let ids = tok
        .encode("<|im_start|>assistant\nHi!<|im_end|>", false, true)
        .unwrap();
    let mut shown = IncrementalDecoder::new(false);
    assert_eq!(
        shown.push_all(tok, &ids).unwrap(),
        "<|im_start|>assistant\nHi!<|im_end|>"
    );
    let mut hidden = IncrementalDecoder::new(true);
    assert_eq!(hidden.push_all(tok, &ids).unwrap(), "assistant\nHi!");
    assert!(hidden.push(tok, 1_000_000).is_err());
}
