//! Token pieces: the bytes each token stands for (GPT-2 byte-level decoding, or SentencePiece's
//! `▁` for a space), precomputed once, and llama.cpp's `clean_spaces` pass over decoded text.

use super::vocab::{TokenAttr, Vocab};
use std::collections::HashMap;
use std::ops::Range;

/// GPT-2's byte-to-char table (`bytes_to_unicode`): printable Latin-1 bytes stand for
/// themselves, the others for U+0100 onwards in byte order.
pub fn byte_chars() -> [char; 256] {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    let mut table = ['\0'; 256];
    let mut next = 256;
    for b in 0u32..256 {
        let c = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        table[b as usize] = char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER);
    }
    table
}

/// The table inverted: the byte each byte-level char stands for.
fn unicode_to_byte() -> HashMap<char, u8> {
    (0u8..=255).zip(byte_chars()).map(|(b, c)| (c, b)).collect()
}

/// The bytes of every token, in one buffer. A piece may be a fragment of a UTF-8 character.
#[derive(Debug, Clone)]
pub struct Pieces {
    bytes: Vec<u8>,
    ranges: Vec<Range<usize>>,
}

impl Pieces {
    /// Pieces as llama.cpp's `token_to_piece` gives them with `special` on, for a GPT-2
    /// byte-level vocabulary: control, unknown and user-defined tokens as their text, normal ones
    /// byte-decoded, byte tokens (`<0xXX>`) as the byte, anything else (unused, undefined) as
    /// nothing.
    pub fn byte_level(vocab: &Vocab) -> Self {
        let table = unicode_to_byte();
        Self::build(vocab, |text, bytes| {
            for c in text.chars() {
                match table.get(&c) {
                    Some(&b) => bytes.push(b),
                    // What llama.cpp's `llama_decode_text` writes for a char outside the byte
                    // table (a vocabulary that is not really byte-level).
                    None => {
                        let mut utf8 = [0u8; 4];
                        let hex: String = c
                            .encode_utf8(&mut utf8)
                            .bytes()
                            .map(|b| format!("{b:02x}"))
                            .collect();
                        bytes.extend_from_slice(format!("[UNK_BYTE_0x{hex}{text}]").as_bytes());
                    }
                }
            }
        })
    }

    /// Pieces of a SentencePiece vocabulary, as llama.cpp's `token_to_piece` gives them with
    /// `special` on: as [`byte_level`](Self::byte_level), except that a normal token is its text
    /// with every `▁` (U+2581) turned back into a space.
    pub fn spm(vocab: &Vocab) -> Self {
        Self::build(vocab, |text, bytes| {
            bytes.extend_from_slice(text.replace(SPM_SPACE, " ").as_bytes());
        })
    }

    /// Every token's piece, with `normal` writing the piece of a normal token.
    fn build(vocab: &Vocab, mut normal: impl FnMut(&str, &mut Vec<u8>)) -> Self {
        let verbatim = TokenAttr::CONTROL
            .union(TokenAttr::UNKNOWN)
            .union(TokenAttr::USER_DEFINED);
        let mut bytes = Vec::new();
        let mut ranges = Vec::with_capacity(vocab.len());
        for (text, &attr) in vocab.tokens.iter().zip(&vocab.attrs) {
            let start = bytes.len();
            if attr.has(verbatim) {
                bytes.extend_from_slice(text.as_bytes());
            } else if attr.has(TokenAttr::NORMAL) {
                normal(text, &mut bytes);
            } else if attr.has(TokenAttr::BYTE)
                && let Some(b) = parse_byte_token(text)
            {
                bytes.push(b);
            }
            ranges.push(start..bytes.len());
        }
        Self { bytes, ranges }
    }

    /// The piece of a token (`None` for an id outside the vocabulary).
    pub fn get(&self, id: u32) -> Option<&[u8]> {
        self.ranges.get(id as usize).map(|r| &self.bytes[r.clone()])
    }
}

/// SentencePiece's stand-in for a space (U+2581, "lower one eighth block").
pub const SPM_SPACE: &str = "\u{2581}";

/// `<0xAB>` → 0xAB.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

/// llama.cpp's `clean_spaces` (`clean_up_tokenization_spaces`) on decoded bytes: drops the space
/// before `?!.,`, around a lone `'`, and before `'s`, `'m`, `'re`, `'ve`. A literal port of the
/// three in-place passes at the end of `llama_vocab::impl::detokenize`, quirks included.
pub fn clean_spaces(text: &[u8]) -> Vec<u8> {
    let mut t = text.to_vec();
    // First pass: " ?", " !", " .", " ,".
    let n = t.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = t[i];
        if t[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        t[total] = x;
        total += 1;
    }
    // Second pass: " ' " becomes "'" (the skipped space is overwritten with NUL, as in C).
    let n = total;
    total = usize::from(n > 0);
    let mut i = 1;
    while i < n {
        let x = t[i];
        if x == b'\'' && i + 1 < n && t[i - 1] == b' ' && t[i + 1] == b' ' {
            total -= 1;
            i += 1;
            t[i] = 0;
        }
        t[total] = x;
        total += 1;
        i += 1;
    }
    // Third pass: " 's", " 'm", " 're", " 've" lose their space.
    let n = total;
    total = usize::from(n > 0);
    for i in 1..n {
        let x = t[i];
        if t[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let drop = match t[i + 1] {
                b's' | b'm' => true,
                b't' | b'd' => false,
                x1 => i + 2 < n && matches!((x1, t[i + 2]), (b'r', b'e') | (b'v', b'e')),
            };
            if drop {
                total -= 1;
            }
        }
        t[total] = x;
        total += 1;
    }
    t.truncate(total);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_a_bijection_with_gpt2_landmarks() {
        let t = unicode_to_byte();
        assert_eq!(t.len(), 256);
        assert_eq!(t[&'Ġ'], b' ');
        assert_eq!(t[&'Ċ'], b'\n');
        assert_eq!(t[&'ĉ'], b'\t');
        assert_eq!(t[&'!'], b'!');
        assert_eq!(t[&'Ā'], 0);
        let mut seen: Vec<u8> = t.values().copied().collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 256);
    }

    #[test]
    fn byte_tokens_parse() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(10));
        assert_eq!(parse_byte_token("<0xff>"), Some(255));
        assert_eq!(parse_byte_token("0x0A"), None);
    }

    #[test]
    fn clean_spaces_matches_llama_cpp_passes() {
        let c = |s: &str| String::from_utf8(clean_spaces(s.as_bytes())).unwrap();
        assert_eq!(c("Hello , world !"), "Hello, world!");
        assert_eq!(c("a ' b"), "a'b");
        assert_eq!(c("it 's I 'm we 're they 've"), "it's I'm we're they've");
        assert_eq!(c("don 't I 'd we 'll"), "don 't I 'd we 'll");
        assert_eq!(c(""), "");
        assert_eq!(c(" ."), ".");
        // The skipped space of " ' " is not seen as a space by the next character.
        assert_eq!(c("a ' ' b"), "a'' b");
    }
}
