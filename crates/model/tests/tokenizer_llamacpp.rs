//! The tokenizer against llama.cpp on the real GGUFs (SmolLM2, Qwen2.5-Coder, and Gemma 3's
//! SentencePiece vocabulary): the same ids for every string of the corpus made by
//! `scripts/tokenizer/make_reference.py`, and decoding gives the text back. Qwen's and
//! Gemma's tests are tier 2 (`#[ignore]`d; scripts/test-heavy.sh pulls the models and runs
//! them, docs/testing.md).

mod common;

use model::gguf::GgufFile;
use model::tokenizer::{IncrementalDecoder, TokenAttr, Tokenizer};
use std::sync::OnceLock;

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
    parse_special: bool,
}

/// Qwen2.5-Coder's corpus folder (in `data/tokenizer/`), named as `specula model pull` names it.
const QWEN: &str = "qwen2.5-coder-0.5b";

/// Gemma 3 270M's corpus folder.
const GEMMA: &str = "gemma3-270m";

fn gemma() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| named_tokenizer(GEMMA))
}

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let gguf = GgufFile::open(&common::model_path()).expect("open the model");
        Tokenizer::from_gguf(&gguf).expect("build the tokenizer")
    })
}

/// The tokenizer of model `name`, whose corpus is in `data/tokenizer/NAME/`.
fn named_tokenizer(name: &str) -> Tokenizer {
    let dir = common::data_dir("tokenizer").join(name);
    let path = common::named_model_path(name, &common::source_model_file(&dir));
    let gguf = GgufFile::open(&path).expect("open the model");
    Tokenizer::from_gguf(&gguf).expect("build the tokenizer")
}

fn corpus() -> Vec<Case> {
    corpus_in("")
}

/// The corpus in `data/tokenizer/SUB/`.
fn corpus_in(sub: &str) -> Vec<Case> {
    let path = common::data_dir("tokenizer").join(sub).join("corpus.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("corpus line {}: {e}", i + 1))
        })
        .collect()
}

#[test]
fn every_corpus_string_gets_llama_cpp_ids() {
    same_ids_as_llama_cpp(tokenizer(), &corpus());
}

#[test]
#[ignore = "tier 2 (scripts/test-heavy.sh): needs `specula model pull qwen2.5-coder-0.5b`"]
fn qwen_gets_llama_cpp_ids_for_every_corpus_string() {
    same_ids_as_llama_cpp(&named_tokenizer(QWEN), &corpus_in(QWEN));
}

#[test]
#[ignore = "tier 2 (scripts/test-heavy.sh): needs `specula model pull gemma3-270m`"]
fn gemma_gets_llama_cpp_ids_for_every_corpus_string() {
    same_ids_as_llama_cpp(gemma(), &corpus_in(GEMMA));
}

fn same_ids_as_llama_cpp(tok: &Tokenizer, cases: &[Case]) {
    assert!(
        cases.len() >= 200,
        "corpus has only {} strings",
        cases.len()
    );
    let mut failures = Vec::new();
    for c in cases {
        let got = tok.encode(&c.text, true, c.parse_special).expect("encode");
        if got != c.ids {
            failures.push(format!(
                "{:?} (parse_special {}):\n  llama.cpp {:?}\n  ours      {:?}",
                c.text, c.parse_special, c.ids, got
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} strings differ from llama.cpp:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn decoding_gives_the_text_back() {
    let tok = tokenizer();
    let mut checked = 0;
    for c in corpus() {
        let ids = tok.encode(&c.text, true, c.parse_special).expect("encode");
        // Control tokens decode to their text unless skipped, so every string comes back whole,
        // less the bytes the vocabulary has no token for (encoding drops them, as llama.cpp does).
        let kept: Vec<u8> = c
            .text
            .bytes()
            .filter(|&b| tok.byte_to_token(b).is_some())
            .collect();
        let expected = String::from_utf8_lossy(&kept);
        assert_eq!(tok.decode(&ids, false).unwrap(), expected, "{ids:?}");
        let has_special = ids.iter().any(|&id| {
            tok.token_attr(id)
                .is_some_and(|a| a.has(TokenAttr::CONTROL))
        });
        if !has_special {
            assert_eq!(tok.decode(&ids, true).unwrap(), expected, "{ids:?}");
        }
        checked += usize::from(kept.len() == c.text.len());
    }
    assert!(checked >= 200, "only {checked} strings round-trip exactly");
}

#[test]
fn special_tokens_match_llama_cpp() {
    let tok = tokenizer();
    // As llama.cpp's load log prints them (`print_info` / "printing all EOG tokens").
    assert_eq!(tok.kind(), ("gpt2", "smollm"));
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(1), Some(2)));
    assert_eq!(tok.special_ids().unk, Some(0));
    assert_eq!(tok.special_ids().pad, Some(2));
    assert_eq!(tok.special_ids().fim_rep, Some(4));
    assert_eq!(tok.eog_ids(), [0, 2, 4]);
    assert!(!tok.add_bos() && !tok.add_eos());
    assert_eq!(tok.token_to_piece(198, false), Some(&b"\n"[..]));
    assert_eq!(tok.encode("<|im_end|>", false, true).unwrap(), [2]);
    assert_eq!(tok.token_to_piece(2, false), Some(&b""[..]));
    assert_eq!(tok.token_to_piece(2, true), Some(&b"<|im_end|>"[..]));
}

#[test]
#[ignore = "tier 2 (scripts/test-heavy.sh): needs `specula model pull qwen2.5-coder-0.5b`"]
fn qwen_special_tokens_match_llama_cpp() {
    let tok = named_tokenizer(QWEN);
    assert_eq!(tok.kind(), ("gpt2", "qwen2"));
    assert_eq!(tok.vocab_size(), 151_936);
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(151_643), Some(151_645)));
    // As llama.cpp prints them: a stray `</s>` (a normal token that looks like control, which
    // llama.cpp retypes and adds), <|endoftext|>, <|im_end|>, and the FIM pad, repo-name and
    // file-separator tokens.
    assert_eq!(
        tok.eog_ids(),
        [128_247, 151_643, 151_645, 151_662, 151_663, 151_664]
    );
    assert!(!tok.add_bos() && !tok.add_eos());
    // <tool_call> is user-defined: text, whether specials are shown or not.
    assert_eq!(
        tok.token_to_piece(151_657, false),
        Some(&b"<tool_call>"[..])
    );
    assert_eq!(tok.encode("<tool_call>", false, false).unwrap(), [151_657]);
}

#[test]
#[ignore = "tier 2 (scripts/test-heavy.sh): needs `specula model pull gemma3-270m`"]
fn gemma_decoding_gives_the_text_back() {
    let tok = gemma();
    let cases = corpus_in(GEMMA);
    for c in &cases {
        let ids = tok.encode(&c.text, true, c.parse_special).expect("encode");
        // Byte fallback covers every byte, so nothing is dropped; but a `▁` in the input is the
        // same token as an escaped space, so it comes back as a space.
        let expected = c.text.replace('\u{2581}', " ");
        // Shown specials: the BOS the model adds, then the text whole.
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            format!("<bos>{expected}"),
            "{ids:?}"
        );
        let control = ids[1..].iter().any(|&id| {
            tok.token_attr(id)
                .is_some_and(|a| a.has(TokenAttr::CONTROL))
        });
        if !control {
            // Skipped specials: the added BOS goes, user-defined tokens stay as text.
            assert_eq!(tok.decode(&ids, true).unwrap(), expected, "{ids:?}");
        }
        // Streaming from the first token adds up to the same text.
        let mut dec = IncrementalDecoder::at_sequence_start(true);
        let streamed = dec.push_all(tok, &ids).unwrap() + &dec.flush();
        assert_eq!(streamed, tok.decode(&ids, true).unwrap(), "{ids:?}");
    }
}

#[test]
#[ignore = "tier 2 (scripts/test-heavy.sh): needs `specula model pull gemma3-270m`"]
fn gemma_special_tokens_match_llama_cpp() {
    let tok = gemma();
    // As llama.cpp's load log prints them (`print_info`, "printing all EOG tokens").
    assert_eq!(tok.kind(), ("llama", "default"));
    assert_eq!(tok.vocab_size(), 262_144);
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(2), Some(1)));
    let s = tok.special_ids();
    assert_eq!((s.unk, s.pad, s.eot), (Some(3), Some(0), Some(106)));
    // `</s>` (212) is a user-defined token that looks like an end token: llama.cpp adds it to
    // the EOG set and gives it the control attribute as well.
    assert_eq!(tok.eog_ids(), [1, 106, 212]);
    assert!(tok.token_attr(212).unwrap().has(TokenAttr::CONTROL));
    assert!(tok.add_bos() && !tok.add_eos() && !tok.add_space_prefix());
    assert!(tok.inner().is_none());
    // BOS only with add_special; control tokens only with parse_special.
    assert_eq!(tok.encode("hello", true, false).unwrap(), [2, 23391]);
    assert_eq!(tok.encode("hello", false, false).unwrap(), [23391]);
    assert_eq!(tok.encode("", true, true).unwrap(), [2]);
    assert_eq!(tok.encode("<end_of_turn>", false, true).unwrap(), [106]);
    assert!(
        !tok.encode("<end_of_turn>", false, false)
            .unwrap()
            .contains(&106)
    );
    // User-defined runs of whitespace are cut out whatever parse_special says.
    assert_eq!(
        tok.encode("a  b", false, false).unwrap(),
        [236746, 138, 236763]
    );
    assert_eq!(tok.encode("\n\n", false, false).unwrap(), [108]);
    // Pieces: control tokens empty unless shown, byte tokens their byte, `▁` a space.
    assert_eq!(tok.token_to_piece(106, false), Some(&b""[..]));
    assert_eq!(tok.token_to_piece(106, true), Some(&b"<end_of_turn>"[..]));
    assert_eq!(
        tok.token_to_piece(255_999, false),
        Some(&b"<start_of_image>"[..])
    );
    assert_eq!(tok.token_to_piece(248, false), Some(&b"\n"[..]));
    assert_eq!(tok.token_to_piece(236_743, false), Some(&b" "[..]));
    assert_eq!(tok.token_text(236_743), Some("\u{2581}"));
    assert_eq!(tok.byte_to_token(0), Some(238));
    assert_eq!(tok.byte_to_token(0xff), Some(493));
    assert_eq!(tok.token_to_piece(493, false), Some(&[0xff_u8][..]));
}

#[test]
#[ignore = "tier 2 (scripts/test-heavy.sh): needs `specula model pull gemma3-270m`"]
fn gemma_byte_fallback_and_long_inputs() {
    let tok = gemma();
    // A character no token covers is spelled as its UTF-8 bytes (as llama.cpp does, see the
    // corpus), which decode back to it.
    let rare = "\u{10fffd}";
    let ids = tok.encode(rare, false, false).unwrap();
    let bytes: Vec<u32> = rare
        .bytes()
        .map(|b| tok.byte_to_token(b).unwrap())
        .collect();
    assert_eq!(ids, bytes);
    assert_eq!(tok.decode(&ids, false).unwrap(), rare);
    let mut dec = IncrementalDecoder::new(false);
    assert_eq!(dec.push_all(tok, &ids[..3]).unwrap(), "");
    assert_eq!(dec.push(tok, ids[3]).unwrap(), rare);
    // A long prompt of prose, code and whitespace runs encodes quickly and round-trips.
    let unit = "The quick brown fox jumps over the lazy dog.  \n\n\tfn main() { let x = 42; }\n\
                Привет, мир! 你好，世界！ 😀 naïve café   <b>bold</b>\n";
    let text = unit.repeat(200);
    let start = std::time::Instant::now();
    let ids = tok.encode(&text, false, true).unwrap();
    let took = start.elapsed();
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    // Generous even for a debug build; a release build takes milliseconds.
    assert!(took.as_secs() < 10, "{} bytes took {took:?}", text.len());
}
