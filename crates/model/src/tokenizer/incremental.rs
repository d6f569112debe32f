//! Streaming detokenization: token ids in, complete UTF-8 text out.
//!
//! Tokens are bytes, not characters: in byte-level BPE an emoji or a CJK character often spans two
//! or three tokens, and SentencePiece's byte fallback spells a character it has no token for as
//! one `<0xXX>` token per byte, so decoding each token alone would emit broken characters. The decoder keeps the
//! bytes of an unfinished character until the tokens that complete it arrive. Bytes that can never
//! become a character become U+FFFD exactly where [`Tokenizer::decode`] puts them, so the chunks
//! always add up to `decode` of the same ids (for vocabularies without llama.cpp's `clean_spaces`
//! pass, which looks ahead across tokens; llama.cpp's server streams raw pieces in that case too).

use super::{Tokenizer, TokenizerError};

/// Per-sequence state. It holds no reference to the tokenizer, so that an engine can keep one per
/// sequence next to a shared [`Tokenizer`]; pass the same tokenizer to every call.
#[derive(Debug, Clone, Default)]
pub struct IncrementalDecoder {
    skip_special: bool,
    /// Bytes not yet returned: at most the start of one unfinished UTF-8 character.
    pending: Vec<u8>,
    /// Apply `decode`'s first-token rules (leading BOS, leading space) to the next token.
    at_start: bool,
}

impl IncrementalDecoder {
    /// A decoder for tokens that continue a sequence (the usual case: generated tokens after a
    /// prompt), where no first-token rule applies. `skip_special`: control tokens give no text.
    pub fn new(skip_special: bool) -> Self {
        Self {
            skip_special,
            pending: Vec::new(),
            at_start: false,
        }
    }

    /// A decoder for a whole sequence from its first token: its output adds up to
    /// `tok.decode(ids, skip_special)` (models with `add_space_prefix` lose the first token's
    /// leading space, as there).
    pub fn at_sequence_start(skip_special: bool) -> Self {
        Self {
            at_start: true,
            ..Self::new(skip_special)
        }
    }

    /// Adds one token; returns the text it completes (often empty, never a broken character).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        let mut piece = tok.piece_or_err(id, !self.skip_special)?;
        if self.at_start {
            self.at_start = false;
            let is_added_bos = tok.add_bos() && Some(id) == tok.bos_id();
            if self.skip_special && is_added_bos {
                // As in `decode`: the BOS goes, and the next token keeps its leading space.
                return Ok(String::new());
            }
            if tok.add_space_prefix() {
                piece = piece.strip_prefix(b" ").unwrap_or(piece);
            }
        }
        self.pending.extend_from_slice(piece);
        Ok(self.take_complete())
    }

    /// Adds several tokens; returns the text they complete.
    pub fn push_all(&mut self, tok: &Tokenizer, ids: &[u32]) -> Result<String, TokenizerError> {
        let mut out = String::new();
        for &id in ids {
            out.push_str(&self.push(tok, id)?);
        }
        Ok(out)
    }

    /// Ends the stream: an unfinished character left over becomes U+FFFD (as in `decode`).
    pub fn flush(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    /// Whether bytes of an unfinished character are waiting.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Returns every complete character of `pending` (invalid bytes as U+FFFD, grouped as
    /// `String::from_utf8_lossy` groups them) and keeps an unfinished tail.
    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut pos = 0;
        while pos < self.pending.len() {
            match std::str::from_utf8(&self.pending[pos..]) {
                Ok(s) => {
                    out.push_str(s);
                    pos = self.pending.len();
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // `valid_up_to` marks a valid prefix: lossy decoding replaces nothing here.
                    out.push_str(&String::from_utf8_lossy(&self.pending[pos..pos + valid]));
                    pos += valid;
                    match e.error_len() {
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            pos += n;
                        }
                        // The tail may still become a character: wait for more bytes.
                        None => break,
                    }
                }
            }
        }
        self.pending.drain(..pos);
        out
    }
}
