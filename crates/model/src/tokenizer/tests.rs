//! Unit tests of the tokenizer on tiny vocabularies written as in-memory GGUFs: a byte-level BPE
//! one and a SentencePiece one.

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
        model: "bert",
        ..Meta::default()
    }))
    .unwrap_err()
    .to_string();
    assert!(e.contains("`bert`") && e.contains("gpt2, llama"), "{e}");
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

/// A tiny SentencePiece vocabulary: `<unk>`, `<s>`, `</s>` (control), byte tokens `<0x00>` to
/// `<0xFF>` (unless `bytes` is off), the normal pieces of `SPM_PIECES` with their scores, and
/// two user-defined tokens.
fn spm_gguf(space_prefix: Option<bool>, bytes: bool) -> GgufFile {
    let mut tokens = vec![
        ("<unk>".to_string(), 2, 0.0),
        ("<s>".to_string(), 3, 0.0),
        ("</s>".to_string(), 3, 0.0),
    ];
    if bytes {
        tokens.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), 6, 0.0)));
    }
    tokens.extend(
        SPM_PIECES
            .iter()
            .map(|&(t, score)| (t.to_string(), 1, score)),
    );
    tokens.extend(["<u>", "\n\n"].map(|t| (t.to_string(), 4, 0.0)));
    let mut w = GgufWriter::new();
    w.meta("tokenizer.ggml.model", MetaValue::String("llama".into()));
    w.meta("tokenizer.ggml.pre", MetaValue::String("default".into()));
    w.meta(
        "tokenizer.ggml.tokens",
        MetaValue::Array(
            tokens
                .iter()
                .map(|t| MetaValue::String(t.0.clone()))
                .collect(),
        ),
    );
    w.meta(
        "tokenizer.ggml.token_type",
        MetaValue::Array(tokens.iter().map(|t| MetaValue::I32(t.1)).collect()),
    );
    w.meta(
        "tokenizer.ggml.scores",
        MetaValue::Array(tokens.iter().map(|t| MetaValue::F32(t.2)).collect()),
    );
    if let Some(p) = space_prefix {
        w.meta("tokenizer.ggml.add_space_prefix", MetaValue::Bool(p));
    }
    GgufFile::from_bytes(w.finish()).unwrap()
}

/// Normal pieces and scores. `ab` and `bc` tie (the leftmost pair wins); `▁a` beats `ab`; `xy`
/// and `yz` differ (the better one wins wherever it is); `▁m` (-0) and `mn` (0) tie, as they do
/// for llama.cpp's `<`.
const SPM_PIECES: [(&str, f32); 22] = [
    ("\u{2581}", -1.0),
    ("a", -1.0),
    ("b", -1.0),
    ("c", -1.0),
    ("x", -1.0),
    ("y", -1.0),
    ("z", -1.0),
    ("h", -1.0),
    ("i", -1.0),
    ("ab", -5.0),
    ("bc", -5.0),
    ("\u{2581}a", -2.0),
    ("xy", -7.0),
    ("yz", -6.0),
    ("hi", 0.0),
    ("\u{2581}hi", -0.0),
    ("\u{2581}h", -0.0),
    ("é", -1.0),
    ("m", -1.0),
    ("n", -1.0),
    ("\u{2581}m", -0.0),
    ("mn", 0.0),
];

fn spm(space_prefix: Option<bool>) -> Tokenizer {
    Tokenizer::from_gguf(&spm_gguf(space_prefix, true)).unwrap()
}

#[test]
fn spm_merges_by_score_with_ties_to_the_left() {
    let tok = spm(Some(false));
    let ids = |text: &str| tok.encode(text, false, false).unwrap();
    let t = |text: &str| id(&tok, text);
    assert_eq!(ids("abc"), [t("ab"), t("c")]);
    assert_eq!(ids("xyz"), [t("x"), t("yz")]);
    assert_eq!(ids(" ab"), [t("\u{2581}a"), t("b")]);
    assert_eq!(ids("hi hi"), [t("hi"), t("\u{2581}hi")]);
    assert_eq!(ids(" mn"), [t("\u{2581}m"), t("n")]);
    assert_eq!(ids("abab"), [t("ab"), t("ab")]);
    assert_eq!(ids("aé"), [t("a"), t("é")]);
    assert_eq!(ids(""), Vec::<u32>::new());
}

#[test]
fn spm_byte_fallback_spells_unknown_characters() {
    let tok = spm(Some(false));
    let byte = |b: u8| tok.byte_to_token(b).unwrap();
    assert_eq!(byte(0), 3);
    assert_eq!(tok.encode("q", false, false).unwrap(), [byte(b'q')]);
    let ids = tok.encode("aü😀", false, false).unwrap();
    let mut expected = vec![id(&tok, "a")];
    expected.extend("ü😀".bytes().map(byte));
    assert_eq!(ids, expected);
    assert_eq!(tok.decode(&ids, false).unwrap(), "aü😀");
    assert_eq!(tok.token_to_piece(byte(0xff), false), Some(&[0xff_u8][..]));
    // Without byte tokens there is nothing to fall back on: an error, not a panic.
    let bare = Tokenizer::from_gguf(&spm_gguf(Some(false), false)).unwrap();
    let e = bare.encode("aq", false, false).unwrap_err().to_string();
    assert!(e.contains("0x71"), "{e}");
    assert_eq!(bare.byte_to_token(b'a'), Some(id(&bare, "a")));
}

#[test]
fn spm_special_tokens_and_the_space_prefix() {
    // Defaults for a "llama" vocabulary: BOS 1, EOS 2, UNK 0, BOS added, space prefix on.
    let tok = spm(None);
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(1), Some(2)));
    assert_eq!(tok.special_ids().unk, Some(0));
    assert!(tok.add_bos() && !tok.add_eos() && tok.add_space_prefix());
    assert_eq!(tok.kind(), ("llama", "default"));
    let (hi, s_hi) = (id(&tok, "hi"), id(&tok, "\u{2581}hi"));
    let (u, nn) = (id(&tok, "<u>"), id(&tok, "\n\n"));
    // A space goes before text at the start and after every special token, not elsewhere.
    assert_eq!(tok.encode("hi", true, false).unwrap(), [1, s_hi]);
    assert_eq!(
        tok.encode("hi<u>hi", false, false).unwrap(),
        [s_hi, u, s_hi]
    );
    assert_eq!(tok.encode("<s>hi", false, true).unwrap(), [1, s_hi]);
    // User-defined tokens are cut out without parse_special, control tokens only with it.
    assert_eq!(tok.encode("\n\n", false, false).unwrap(), [nn]);
    assert!(!tok.encode("<s>", false, false).unwrap().contains(&1));
    // Decoding strips the first leading space, unless a skipped BOS came first.
    assert_eq!(tok.decode(&[s_hi, s_hi], false).unwrap(), "hi hi");
    assert_eq!(tok.decode(&[1, s_hi], true).unwrap(), " hi");
    assert_eq!(tok.decode(&[1, s_hi, 2], false).unwrap(), "<s> hi</s>");
    assert_eq!(tok.decode(&[hi, u, nn, 2], true).unwrap(), "hi<u>\n\n");
    for (ids, skip) in [(vec![s_hi, s_hi], false), (vec![1, s_hi], true)] {
        let mut dec = IncrementalDecoder::at_sequence_start(skip);
        let streamed = dec.push_all(&tok, &ids).unwrap() + &dec.flush();
        assert_eq!(streamed, tok.decode(&ids, skip).unwrap(), "{ids:?}");
    }
    // With the flag off (Gemma) nothing is added or stripped.
    let tok = spm(Some(false));
    assert_eq!(tok.encode("hi", true, false).unwrap(), [1, hi]);
    assert_eq!(tok.decode(&[s_hi], false).unwrap(), " hi");
}

#[test]
fn spm_long_inputs_stay_fast_and_exact() {
    let tok = spm(Some(false));
    let text = "abc xyz hi é q ".repeat(20_000);
    let ids = tok.encode(&text, false, true).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    assert!(ids.len() < text.chars().count(), "{}", ids.len());
}
