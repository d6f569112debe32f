//! The vocabulary as the GGUF metadata describes it: token texts, their attributes and scores,
//! the merges, the special ids and flags, read the way llama.cpp's `llama_vocab::impl::load`
//! reads them (with its defaults for each vocabulary type).

use super::TokenizerError;
use super::pre::PreTokenizerSpec;
use crate::gguf::{GgufFile, MetaValue};
use std::collections::HashMap;

/// Token attributes, bit for bit llama.cpp's `llama_token_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenAttr(pub u16);

impl TokenAttr {
    pub const UNDEFINED: Self = Self(0);
    pub const UNKNOWN: Self = Self(1 << 0);
    pub const UNUSED: Self = Self(1 << 1);
    pub const NORMAL: Self = Self(1 << 2);
    pub const CONTROL: Self = Self(1 << 3);
    pub const USER_DEFINED: Self = Self(1 << 4);
    pub const BYTE: Self = Self(1 << 5);

    /// Whether any bit of `other` is set.
    pub fn has(self, other: Self) -> bool {
        self.0 & other.0 != 0
    }

    pub fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// From a `tokenizer.ggml.token_type` value (`llama_token_type`).
    pub fn from_token_type(t: i128) -> Self {
        match t {
            1 => Self::NORMAL,
            2 => Self::UNKNOWN,
            3 => Self::CONTROL,
            4 => Self::USER_DEFINED,
            5 => Self::UNUSED,
            6 => Self::BYTE,
            _ => Self::UNDEFINED,
        }
    }
}

/// Special token ids (`None` = the model has none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

/// Everything the tokenizer needs from the metadata.
#[derive(Debug, Clone)]
pub struct Vocab {
    /// `tokenizer.ggml.model`.
    pub model: String,
    /// `tokenizer.ggml.pre`.
    pub pre: String,
    pub spec: PreTokenizerSpec,
    pub tokens: Vec<String>,
    pub attrs: Vec<TokenAttr>,
    /// `tokenizer.ggml.scores` (0 where the key is absent): the merge priority of SentencePiece
    /// vocabularies, higher first. Unused by BPE.
    pub scores: Vec<f32>,
    pub token_to_id: HashMap<String, u32>,
    /// Merge pairs in rank order (BPE only; empty for SentencePiece).
    pub merges: Vec<(String, String)>,
    pub special: SpecialIds,
    pub add_bos: bool,
    pub add_eos: bool,
    /// Strip one leading space from the first decoded token, and (SentencePiece) add one before
    /// text that starts the input or follows a special token.
    pub add_space_prefix: bool,
}

const MERGES: &str = "tokenizer.ggml.merges";

/// What llama.cpp assumes for one vocabulary type before it reads the optional keys.
struct Defaults {
    special: SpecialIds,
    add_bos: bool,
    add_space_prefix: bool,
}

impl Vocab {
    /// Reads a GPT-2-style BPE vocabulary; `spec` comes from `tokenizer.ggml.pre`.
    pub fn read_bpe(
        gguf: &GgufFile,
        model: &str,
        pre: &str,
        spec: PreTokenizerSpec,
    ) -> Result<Self, TokenizerError> {
        let defaults = |n: usize| Defaults {
            special: SpecialIds {
                // llama.cpp's defaults for "gpt2" vocabularies, used when the keys are absent.
                bos: Some(11).filter(|&id| (id as usize) < n),
                eos: Some(11).filter(|&id| (id as usize) < n),
                ..SpecialIds::default()
            },
            add_bos: spec.add_bos_default,
            add_space_prefix: false,
        };
        let mut vocab = Self::read(gguf, model, pre, spec, defaults)?;
        vocab.merges = read_merges(gguf)?;
        Ok(vocab)
    }

    /// Reads a SentencePiece vocabulary (`tokenizer.ggml.model` = "llama"): llama.cpp's
    /// defaults for it are BOS 1, EOS 2, UNK 0, BOS added and a space prefix, each overridden by
    /// the file's keys (Gemma 3 turns the space prefix off).
    pub fn read_spm(gguf: &GgufFile, model: &str, pre: &str) -> Result<Self, TokenizerError> {
        let defaults = |n: usize| {
            let in_vocab = |id: u32| Some(id).filter(|&id| (id as usize) < n);
            Defaults {
                special: SpecialIds {
                    bos: in_vocab(1),
                    eos: in_vocab(2),
                    unk: in_vocab(0),
                    ..SpecialIds::default()
                },
                add_bos: super::pre::SPM.add_bos_default,
                add_space_prefix: true,
            }
        };
        Self::read(gguf, model, pre, super::pre::SPM, defaults)
    }

    /// What every vocabulary type shares: tokens, attributes, scores, special ids and flags.
    /// `defaults` gets the vocabulary size (a default id outside it is no id).
    fn read(
        gguf: &GgufFile,
        model: &str,
        pre: &str,
        spec: PreTokenizerSpec,
        defaults: impl FnOnce(usize) -> Defaults,
    ) -> Result<Self, TokenizerError> {
        let (tokens, token_to_id) = read_tokens(gguf)?;
        let n = tokens.len();
        let defaults = defaults(n);
        let attrs = read_attrs(gguf, n)?;
        let scores = read_scores(gguf, n)?;
        let special = read_special_ids(gguf, n, defaults.special)?;
        let add_bos = opt_bool(gguf, "tokenizer.ggml.add_bos_token")?.unwrap_or(defaults.add_bos);
        let add_eos = opt_bool(gguf, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        let add_space_prefix =
            opt_bool(gguf, "tokenizer.ggml.add_space_prefix")?.unwrap_or(defaults.add_space_prefix);
        if add_bos && special.bos.is_none() {
            return Err(TokenizerError::MissingSpecialToken("BOS"));
        }
        if add_eos && special.eos.is_none() {
            return Err(TokenizerError::MissingSpecialToken("EOS"));
        }
        Ok(Self {
            model: model.to_string(),
            pre: pre.to_string(),
            spec,
            tokens,
            attrs,
            scores,
            token_to_id,
            merges: Vec::new(),
            special,
            add_bos,
            add_eos,
            add_space_prefix,
        })
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }
}

/// The token texts and the map back to ids.
fn read_tokens(gguf: &GgufFile) -> Result<(Vec<String>, HashMap<String, u32>), TokenizerError> {
    let raw_tokens = gguf.get_str_array("tokenizer.ggml.tokens")?;
    let n = raw_tokens.len();
    if n == 0 || n > u32::MAX as usize {
        return Err(TokenizerError::Invalid(format!("{n} tokens")));
    }
    let mut tokens = Vec::with_capacity(n);
    let mut token_to_id = HashMap::with_capacity(n);
    for (i, t) in raw_tokens.iter().enumerate() {
        // llama.cpp renames empty tokens so that every text stays unique.
        let text = if t.is_empty() {
            format!("[EMPTY_{i}]")
        } else {
            t.to_string()
        };
        if token_to_id.insert(text.clone(), i as u32).is_some() {
            return Err(TokenizerError::Invalid(format!(
                "token `{text}` appears twice"
            )));
        }
        tokens.push(text);
    }
    Ok((tokens, token_to_id))
}

/// Scores from `tokenizer.ggml.scores` (f32, or i32 as llama.cpp also accepts; all 0 when the
/// key is absent). A negative zero becomes a positive one: llama.cpp compares scores with `<`,
/// for which the two are equal, and the merge orders them with a total order.
fn read_scores(gguf: &GgufFile, n: usize) -> Result<Vec<f32>, TokenizerError> {
    let key = "tokenizer.ggml.scores";
    if gguf.get(key).is_none() {
        return Ok(vec![0.0; n]);
    }
    let values = gguf.get_array(key)?;
    if values.len() < n {
        return Err(TokenizerError::Invalid(format!(
            "{key} has {} entries for {n} tokens",
            values.len()
        )));
    }
    values[..n]
        .iter()
        .map(|v| match *v {
            MetaValue::F32(x) => Ok(x + 0.0),
            MetaValue::I32(x) => Ok(x as f32),
            _ => Err(TokenizerError::Invalid(format!(
                "{key} holds {}",
                v.type_name()
            ))),
        })
        .collect()
}

fn opt_bool(gguf: &GgufFile, key: &str) -> Result<Option<bool>, TokenizerError> {
    match gguf.get(key) {
        None => Ok(None),
        Some(_) => Ok(Some(gguf.get_bool(key)?)),
    }
}

/// Attributes from `tokenizer.ggml.token_type` (all normal when the key is absent).
fn read_attrs(gguf: &GgufFile, n: usize) -> Result<Vec<TokenAttr>, TokenizerError> {
    let key = "tokenizer.ggml.token_type";
    if gguf.get(key).is_none() {
        return Ok(vec![TokenAttr::NORMAL; n]);
    }
    let types = gguf.get_array(key)?;
    if types.len() < n {
        return Err(TokenizerError::Invalid(format!(
            "{key} has {} entries for {n} tokens",
            types.len()
        )));
    }
    types[..n]
        .iter()
        .map(|v| {
            v.as_int()
                .map(TokenAttr::from_token_type)
                .ok_or_else(|| TokenizerError::Invalid(format!("{key} holds {}", v.type_name())))
        })
        .collect()
}

/// Merges as llama.cpp splits them: at the first space after the first byte.
fn read_merges(gguf: &GgufFile) -> Result<Vec<(String, String)>, TokenizerError> {
    let raw = gguf.get_str_array(MERGES)?;
    let mut merges = Vec::with_capacity(raw.len());
    for m in raw {
        // Byte offsets: a space byte is always a char boundary.
        let space = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1);
        match space {
            Some(p) => merges.push((m[..p].to_string(), m[p + 1..].to_string())),
            None => tracing::warn!("{MERGES}: skipping `{m}` (no separating space)"),
        }
    }
    Ok(merges)
}

/// The special-id keys and the field each one sets; later entries (the deprecated FIM names) win
/// over earlier ones, as in llama.cpp.
fn read_special_ids(
    gguf: &GgufFile,
    n: usize,
    defaults: SpecialIds,
) -> Result<SpecialIds, TokenizerError> {
    type Slot = fn(&mut SpecialIds) -> &mut Option<u32>;
    let keys: [(&str, Slot); 17] = [
        ("bos_token_id", |s| &mut s.bos),
        ("eos_token_id", |s| &mut s.eos),
        ("eot_token_id", |s| &mut s.eot),
        ("eom_token_id", |s| &mut s.eom),
        ("unknown_token_id", |s| &mut s.unk),
        ("seperator_token_id", |s| &mut s.sep),
        ("padding_token_id", |s| &mut s.pad),
        ("mask_token_id", |s| &mut s.mask),
        ("fim_pre_token_id", |s| &mut s.fim_pre),
        ("fim_suf_token_id", |s| &mut s.fim_suf),
        ("fim_mid_token_id", |s| &mut s.fim_mid),
        ("fim_pad_token_id", |s| &mut s.fim_pad),
        ("fim_rep_token_id", |s| &mut s.fim_rep),
        ("fim_sep_token_id", |s| &mut s.fim_sep),
        ("prefix_token_id", |s| &mut s.fim_pre),
        ("suffix_token_id", |s| &mut s.fim_suf),
        ("middle_token_id", |s| &mut s.fim_mid),
    ];
    let mut ids = defaults;
    for (suffix, slot) in keys {
        let key = format!("tokenizer.ggml.{suffix}");
        let Some(value) = gguf.get(&key) else {
            continue;
        };
        let id = value
            .as_int()
            .ok_or_else(|| TokenizerError::Invalid(format!("{key} is {}", value.type_name())))?;
        match u32::try_from(id) {
            Ok(id) if (id as usize) < n => *slot(&mut ids) = Some(id),
            // llama.cpp warns and keeps the default for ids outside the vocabulary.
            _ => tracing::warn!("{key} = {id} is outside the vocabulary of {n}; ignored"),
        }
    }
    Ok(ids)
}
