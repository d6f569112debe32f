//! The tokenizer, built from GGUF metadata to give the same token ids as llama.cpp.
//!
//! Two vocabulary types (`tokenizer.ggml.model`):
//! - "gpt2": GPT-2-style byte-level BPE with the pre-tokenizer types in [`pre`]. The BPE itself
//!   runs in a Hugging Face [`tokenizers::Tokenizer`] (the pre-type's regexes as `Split`s,
//!   byte-level mapping, merges).
//! - "llama": SentencePiece-style (Gemma 3): spaces escaped as `▁`, score-ordered merges over each
//!   fragment of text, `<0xXX>` byte fallback ([`spm`]).
//!
//! Around either, this module does what llama.cpp does: special tokens are cut out of the text
//! first (longest first; control tokens only when `parse_special` is on, user-defined ones
//! always), BOS/EOS follow the `add_bos_token`/`add_eos_token` flags, and decoding works on bytes
//! so that streaming ([`IncrementalDecoder`]) never splits a UTF-8 character.

mod bpe;
mod error;
mod incremental;
mod pieces;
pub use pieces::byte_chars;
pub mod pre;
mod special;
mod spm;
#[cfg(test)]
mod tests;
mod vocab;

pub use error::TokenizerError;
pub use incremental::IncrementalDecoder;
pub use vocab::{SpecialIds, TokenAttr};

use crate::gguf::GgufFile;
use pieces::Pieces;
use special::{Fragment, SpecialTokens};
use vocab::Vocab;

/// `tokenizer.ggml.model` values we can build.
pub const SUPPORTED_MODELS: &[&str] = &["gpt2", "llama"];

/// A tokenizer for one model. Cheap to share (`&self` everywhere; `Send + Sync`).
pub struct Tokenizer {
    vocab: Vocab,
    merges: Merges,
    pieces: Pieces,
    /// Special tokens in the order they are cut out of text.
    specials: SpecialTokens,
    /// End-of-generation ids, sorted.
    eog: Vec<u32>,
    /// The token standing for each raw byte: its byte-level char (BPE) or `<0xXX>` (SPM).
    byte_tokens: [Option<u32>; 256],
}

/// What turns a fragment of plain text into tokens.
enum Merges {
    Bpe(Box<tokenizers::Tokenizer>),
    /// SentencePiece merges over the vocabulary's scores ([`spm`]).
    Spm,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("model", &self.vocab.model)
            .field("pre", &self.vocab.pre)
            .field("vocab_size", &self.vocab.len())
            .field("special", &self.vocab.special)
            .field("eog", &self.eog)
            .finish()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from the `tokenizer.*` metadata of a GGUF file.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self, TokenizerError> {
        let model = gguf.get_str("tokenizer.ggml.model")?;
        let pre_name = match gguf.get("tokenizer.ggml.pre") {
            None => None,
            Some(_) => Some(gguf.get_str("tokenizer.ggml.pre")?),
        };
        match model {
            "gpt2" => Self::bpe(gguf, model, pre_name),
            // llama.cpp reads no pre-tokenizer type for SentencePiece vocabularies.
            "llama" => Self::spm(gguf, model, pre_name.unwrap_or("default")),
            _ => Err(TokenizerError::UnsupportedModel(model.to_string())),
        }
    }

    fn spm(gguf: &GgufFile, model: &str, pre_name: &str) -> Result<Self, TokenizerError> {
        let mut vocab = Vocab::read_spm(gguf, model, pre_name)?;
        // Retypes some tokens (e.g. Gemma's user-defined `</s>` becomes control as well), so it
        // comes before the special-token index and the pieces are built.
        let eog = special::detect_special_tokens(&mut vocab);
        Ok(Self {
            merges: Merges::Spm,
            byte_tokens: spm::byte_tokens(&vocab),
            pieces: Pieces::spm(&vocab),
            specials: SpecialTokens::new(&vocab),
            vocab,
            eog,
        })
    }

    fn bpe(gguf: &GgufFile, model: &str, pre_name: Option<&str>) -> Result<Self, TokenizerError> {
        // llama.cpp falls back to a "default" pre-tokenizer (and warns of degraded output) when
        // the key is missing; we ask for a file that names one.
        let pre_name = pre_name.unwrap_or("(missing)");
        let spec = pre::lookup(pre_name)
            .ok_or_else(|| TokenizerError::UnsupportedPreTokenizer(pre_name.to_string()))?;
        let mut vocab = Vocab::read_bpe(gguf, model, pre_name, spec)?;
        let eog = special::detect_special_tokens(&mut vocab);
        let inner = bpe::build(&vocab)?;
        let chars = pieces::byte_chars();
        let byte_tokens = std::array::from_fn(|b| {
            vocab
                .token_to_id
                .get(chars[b].to_string().as_str())
                .copied()
        });
        Ok(Self {
            merges: Merges::Bpe(Box::new(inner)),
            pieces: Pieces::byte_level(&vocab),
            specials: SpecialTokens::new(&vocab),
            vocab,
            eog,
            byte_tokens,
        })
    }

    /// Token ids for `text`. `add_special` adds BOS/EOS where the model asks for them;
    /// `parse_special` lets control-token texts such as `<|im_start|>` become their ids (off: they
    /// are tokenized as plain text). User-defined tokens are recognised either way, as in
    /// llama.cpp's `llama_tokenize`.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.vocab.add_bos {
            ids.extend(self.vocab.special.bos);
        }
        // SentencePiece: text at the start or right after a special token gets a space before
        // it when the model has `add_space_prefix` (llama.cpp's `is_prev_special`).
        let mut after_special = true;
        for frag in special::partition(text, &self.vocab, &self.specials, parse_special) {
            match frag {
                Fragment::Token(id) => {
                    ids.push(id);
                    after_special = true;
                }
                Fragment::Text(r) => {
                    match &self.merges {
                        Merges::Bpe(inner) => bpe::encode_plain(inner, &text[r], &mut ids)?,
                        Merges::Spm => {
                            let prefix = self.vocab.add_space_prefix && after_special;
                            let (vocab, bytes) = (&self.vocab, &self.byte_tokens);
                            spm::encode(vocab, bytes, &text[r], prefix, &mut ids)?;
                        }
                    }
                    after_special = false;
                }
            }
        }
        if add_special && self.vocab.add_eos {
            ids.extend(self.vocab.special.eos);
        }
        Ok(ids)
    }

    /// Text for `ids`, as llama.cpp's `llama_detokenize`: with `skip_special`, control tokens
    /// give nothing and a leading BOS / trailing EOS that the model adds itself are dropped;
    /// without it, control tokens give their text. Bytes that are not UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        let bytes = self.decode_bytes(ids, skip_special)?;
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// The bytes [`decode`](Self::decode) turns into text (may end inside a UTF-8 character).
    pub fn decode_bytes(&self, ids: &[u32], skip_special: bool) -> Result<Vec<u8>, TokenizerError> {
        let mut ids = ids;
        let mut strip_space = self.vocab.add_space_prefix;
        if skip_special
            && self.vocab.add_bos
            && let Some((&first, rest)) = ids.split_first()
            && Some(first) == self.vocab.special.bos
        {
            // llama.cpp keeps the leading space of the token after a removed BOS.
            strip_space = false;
            ids = rest;
        }
        if skip_special
            && self.vocab.add_eos
            && let Some((&last, rest)) = ids.split_last()
            && Some(last) == self.vocab.special.eos
        {
            ids = rest;
        }
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            let piece = self.piece_or_err(id, !skip_special)?;
            let piece = if strip_space {
                piece.strip_prefix(b" ").unwrap_or(piece)
            } else {
                piece
            };
            strip_space = false;
            out.extend_from_slice(piece);
        }
        if self.vocab.spec.clean_spaces {
            out = pieces::clean_spaces(&out);
        }
        Ok(out)
    }

    /// The bytes of one token, as llama.cpp's `token_to_piece`: with `special` off, control and
    /// unknown tokens give nothing. A piece may be part of a UTF-8 character. `None` for an id
    /// outside the vocabulary.
    pub fn token_to_piece(&self, id: u32, special: bool) -> Option<&[u8]> {
        let piece = self.pieces.get(id)?;
        let attr = self.vocab.attrs[id as usize];
        if !special && attr.has(TokenAttr::CONTROL.union(TokenAttr::UNKNOWN)) {
            return Some(&[]);
        }
        Some(piece)
    }

    fn piece_or_err(&self, id: u32, special: bool) -> Result<&[u8], TokenizerError> {
        self.token_to_piece(id, special)
            .ok_or(TokenizerError::IdOutOfRange {
                id,
                vocab_size: self.vocab.len(),
            })
    }

    /// The token for one raw byte, or `None` where the vocabulary has none. Byte-level BPE: its
    /// char (bytes without one are dropped from the input, as llama.cpp drops them).
    /// SentencePiece: its `<0xXX>` byte-fallback token.
    pub fn byte_to_token(&self, byte: u8) -> Option<u32> {
        self.byte_tokens[usize::from(byte)]
    }

    /// The token's text as the vocabulary stores it (byte-level characters, e.g. `Ġthe`, or
    /// SentencePiece's `▁the`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of a vocabulary text (as [`token_text`](Self::token_text) gives it), e.g.
    /// `<|im_end|>`.
    pub fn token_to_id(&self, text: &str) -> Option<u32> {
        self.vocab.token_to_id.get(text).copied()
    }

    /// llama.cpp's attributes of a token (control, user-defined, …).
    pub fn token_attr(&self, id: u32) -> Option<TokenAttr> {
        self.vocab.attrs.get(id as usize).copied()
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.vocab.special.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.vocab.special.eos
    }

    /// Every special id the metadata names or llama.cpp finds by text (EOT, FIM …).
    pub fn special_ids(&self) -> &SpecialIds {
        &self.vocab.special
    }

    /// Ids that end a generation: EOS, EOT, EOM and the texts llama.cpp recognises
    /// (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, FIM pad/repo/sep …), sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Whether `encode(…, add_special = true, …)` starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos
    }

    /// Whether `encode(…, add_special = true, …)` ends with EOS.
    pub fn add_eos(&self) -> bool {
        self.vocab.add_eos
    }

    /// Whether decoding strips one leading space from the first token (and SentencePiece
    /// encoding adds one before text at the start or after a special token).
    pub fn add_space_prefix(&self) -> bool {
        self.vocab.add_space_prefix
    }

    /// `tokenizer.ggml.model` and `tokenizer.ggml.pre`.
    pub fn kind(&self) -> (&str, &str) {
        (&self.vocab.model, &self.vocab.pre)
    }

    /// The Hugging Face tokenizer inside a BPE tokenizer (`None` for SentencePiece). Its own
    /// `encode` recognises every special token (as `parse_special` on) and never adds BOS/EOS;
    /// prefer [`encode`](Self::encode).
    pub fn inner(&self) -> Option<&tokenizers::Tokenizer> {
        match &self.merges {
            Merges::Bpe(inner) => Some(inner),
            Merges::Spm => None,
        }
    }
}
