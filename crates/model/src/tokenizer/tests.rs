//! Unit tests of the tokenizer on a tiny byte-level vocabulary written as an in-memory GGUF.

use super::*;
use crate::gguf::MetaValue;
use crate::gguf::write::GgufWriter;

/// GPT-2's char for each byte.
fn byte_char(b: u8) -> char {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    if printable(u32::from(b)) {
        return char::from(b);
    }
    let n = (0..u32::from(b)).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap()
}

const SPECIALS: [(&str, i32); 4] = [
    ("<|endoftext|>", 3),
    ("<|im_start|>", 3),
    ("<|im_end|>", 3),
    ("<tool>", 4),
];
const MERGES: [&str; 4] = ["Ġ t", "h e", "Ġt he", "Ã ©"];

struct Meta {
    model: &'static str,
    pre: Option<&'static str>,
    add_bos: bool,
    space_prefix: bool,
}

impl Default for Meta {
    fn default() -> Self {
        Self {
            model: "gpt2",
            pre: Some("smollm"),
            add_bos: false,
            space_prefix: false,
        }
    }
}

fn gguf(meta: Meta) -> GgufFile {
    let mut tokens: Vec<String> = SPECIALS.iter().map(|(t, _)| t.to_string()).collect();
    let mut types: Vec<i32> = SPECIALS.iter().map(|&(_, ty)| ty).collect();
    for b in 0..=255u8 {
        tokens.push(byte_char(b).to_string());
        types.push(1);
    }
    for m in MERGES {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    let strings = |v: Vec<String>| MetaValue::Array(v.into_iter().map(MetaValue::String).collect());
    let mut w = GgufWriter::new();
    w.meta("tokenizer.ggml.model", MetaValue::String(meta.model.into()));
    if let Some(pre) = meta.pre {
        w.meta("tokenizer.ggml.pre", MetaValue::String(pre.into()));
    }
    w.meta("tokenizer.ggml.tokens", strings(tokens));
    w.meta(
        "tokenizer.ggml.token_type",
        MetaValue::Array(types.into_iter().map(MetaValue::I32).collect()),
    );
    w.meta(
        "tokenizer.ggml.merges",
        strings(MERGES.iter().map(|m| m.to_string()).collect()),
    );
    w.meta("tokenizer.ggml.bos_token_id", MetaValue::U32(1));
    w.meta("tokenizer.ggml.eos_token_id", MetaValue::U32(2));
    w.meta(
        "tokenizer.ggml.add_bos_token",
        MetaValue::Bool(meta.add_bos),
    );
    w.meta(
        "tokenizer.ggml.add_space_prefix",
        MetaValue::Bool(meta.space_prefix),
    );
    GgufFile::from_bytes(w.finish()).unwrap()
}

fn tiny() -> Tokenizer {
    Tokenizer::from_gguf(&gguf(Meta::default())).unwrap()
}

fn id(tok: &Tokenizer, text: &str) -> u32 {
    tok.token_to_id(text).unwrap()
}

#[test]
fn merges_and_digit_splitting() {
    let tok = tiny();
    let the = id(&tok, "Ġthe");
    let (t, he) = (id(&tok, "t"), id(&tok, "he"));
    assert_eq!(tok.encode("the the", false, true).unwrap(), [t, he, the]);
    let digits = tok.encode("123", false, true).unwrap();
    assert_eq!(digits, [id(&tok, "1"), id(&tok, "2"), id(&tok, "3")]);
    assert_eq!(tok.encode("", true, true).unwrap(), Vec::<u32>::new());
}

#[test]
fn control_tokens_need_parse_special_but_user_tokens_do_not() {
    let tok = tiny();
    let parsed = tok.encode("<|im_start|>hi<tool>", false, true).unwrap();
    assert_eq!(parsed, [1, id(&tok, "h"), id(&tok, "i"), 3]);
    let plain = tok.encode("<|im_start|>hi<tool>", false, false).unwrap();
    assert_eq!(plain.len(), "<|im_start|>hi".len() + 1, "{plain:?}");
    assert_eq!(plain.last(), Some(&3));
    assert!(!plain.contains(&1));
}

#[test]
fn bos_follows_the_flag() {
    let tok = Tokenizer::from_gguf(&gguf(Meta {
        add_bos: true,
        ..Meta::default()
    }))
    .unwrap();
    assert_eq!(tok.encode("t", true, false).unwrap(), [1, id(&tok, "t")]);
    assert_eq!(tok.encode("t", false, false).unwrap(), [id(&tok, "t")]);
    // A leading BOS the model adds itself goes with skip_special.
    assert_eq!(tok.decode(&[1, id(&tok, "t")], true).unwrap(), "t");
}

#[test]
fn decode_round_trips_and_renders_control_tokens_on_request() {
    let tok = tiny();
    for s in ["the  the\n\t 12 é", "", "  ", "<tool>x"] {
        let ids = tok.encode(s, false, false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), s);
    }
    let ids = tok
        .encode("<|im_start|>the<|im_end|>", false, true)
        .unwrap();
    assert_eq!(
        tok.decode(&ids, false).unwrap(),
        "<|im_start|>the<|im_end|>"
    );
    assert_eq!(tok.decode(&ids, true).unwrap(), "the");
    let e = tok.decode(&[9999], false).unwrap_err().to_string();
    assert!(e.contains("9999"), "{e}");
}

#[test]
fn special_ids_and_end_of_generation() {
    let tok = tiny();
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(1), Some(2)));
    assert_eq!(tok.eog_ids(), [0, 2]);
    assert!(tok.is_eog(0) && tok.is_eog(2) && !tok.is_eog(1));
    assert_eq!(
        tok.special_ids().eot,
        Some(2),
        "<|im_end|> is found by its text"
    );
    assert_eq!(tok.vocab_size(), 4 + 256 + MERGES.len());
    assert_eq!(tok.token_to_piece(1, false), Some(&b""[..]));
    assert_eq!(tok.token_to_piece(1, true), Some(&b"<|im_start|>"[..]));
    assert_eq!(
        tok.token_to_piece(id(&tok, "Ġthe"), false),
        Some(&b" the"[..])
    );
}

#[test]
fn unsupported_models_and_pre_types_are_named() {
    let e = Tokenizer::from_gguf(&gguf(Meta {
        model: "llama",
        ..Meta::default()
    }))
    .unwrap_err()
    .to_string();
    assert!(e.contains("`llama`") && e.contains("gpt2"), "{e}");
    let e = Tokenizer::from_gguf(&gguf(Meta {
        pre: Some("klingon"),
        ..Meta::default()
    }))
    .unwrap_err()
    .to_string();
    assert!(e.contains("`klingon`") && e.contains("smollm"), "{e}");
    let e = Tokenizer::from_gguf(&gguf(Meta {
        pre: None,
        ..Meta::default()
    }))
    .unwrap_err()
    .to_string();
    assert!(e.contains("(missing)"), "{e}");
    let e = Tokenizer::from_gguf(&GgufFile::from_bytes(GgufWriter::new().finish()).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("tokenizer.ggml.model"), "{e}");
}

#[test]
fn incremental_decoder_holds_split_characters() {
    let tok = tiny();
    let (a, b) = (id(&tok, "Ã"), id(&tok, "©"));
    let mut dec = IncrementalDecoder::new(false);
    assert_eq!(dec.push(&tok, a).unwrap(), "");
    assert!(dec.has_pending());
    assert_eq!(dec.push(&tok, b).unwrap(), "é");
    assert_eq!(dec.flush(), "");
    // A lone continuation byte can never become a character: replaced at once.
    assert_eq!(dec.push(&tok, b).unwrap(), "\u{FFFD}");
    // An unfinished character at the end is replaced by flush.
    assert_eq!(dec.push(&tok, a).unwrap(), "");
    assert_eq!(dec.flush(), "\u{FFFD}");
    assert_eq!(tok.decode(&[b, a], false).unwrap(), "\u{FFFD}\u{FFFD}");
    let mut dec = IncrementalDecoder::new(true);
    assert_eq!(
        dec.push_all(&tok, &[1, id(&tok, "Ġthe"), 2]).unwrap(),
        " the"
    );
}

#[test]
fn shareable_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Tokenizer>();
    send_sync::<IncrementalDecoder>();
}

#[test]
fn first_token_rules_match_between_decode_and_streaming() {
    let tok = Tokenizer::from_gguf(&gguf(Meta {
        add_bos: true,
        space_prefix: true,
        ..Meta::default()
    }))
    .unwrap();
    let the = id(&tok, "Ġthe");
    // The first token loses its leading space, unless it follows a BOS that is skipped.
    assert_eq!(tok.decode(&[the, the], false).unwrap(), "the the");
    assert_eq!(tok.decode(&[1, the], true).unwrap(), " the");
    assert_eq!(tok.decode(&[1, the], false).unwrap(), "<|im_start|> the");
    for (ids, skip) in [
        (vec![the, the], false),
        (vec![1, the], true),
        (vec![1, the], false),
    ] {
        let mut dec = IncrementalDecoder::at_sequence_start(skip);
        let streamed = dec.push_all(&tok, &ids).unwrap() + &dec.flush();
        assert_eq!(streamed, tok.decode(&ids, skip).unwrap(), "{ids:?}");
    }
    // Mid-sequence (generated tokens after a prompt) nothing is stripped.
    let mut dec = IncrementalDecoder::new(false);
    assert_eq!(dec.push(&tok, the).unwrap(), " the");
}
