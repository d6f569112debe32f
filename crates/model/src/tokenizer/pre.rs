//! Pre-tokenizer types (`tokenizer.ggml.pre`): the split regexes and flags llama.cpp uses for each.
//!
//! The regexes are copied verbatim from llama.cpp's `llm_tokenizer_bpe` constructor
//! (`src/llama-vocab.cpp`), and the flags from `llama_vocab::impl::load` in the same file. llama.cpp
//! applies the regexes one after the other: each splits every piece left by the previous one into
//! matches and the text between them (the `Isolated` behaviour of a Hugging Face `Split`). It runs
//! hand-written matchers for the GPT-2, Llama 3 and Qwen2 regexes; those follow the regex semantics
//! (checked against `llama-tokenize` for the SmolLM group, see `tests/tokenizer_llamacpp.rs`).

/// The GPT-2 regex, as llama.cpp writes it (without the final `|\s+`: text the regex leaves out
/// becomes a piece of its own anyway, which is what `\s+` would have matched).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3's regex, with the case-insensitive group spelled out as llama.cpp adapts it.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's regex (Llama 3's with single digits).
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How one pre-tokenizer type splits text and how its vocabulary behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreTokenizerSpec {
    /// llama.cpp's name for the group (`LLAMA_VOCAB_PRE_TYPE_*`, lower case).
    pub kind: &'static str,
    /// Applied in order, each with the `Isolated` split behaviour.
    pub regexes: &'static [&'static str],
    /// Words found whole in the vocabulary skip the merges (`ignore_merges`).
    pub ignore_merges: bool,
    /// Decoding removes spaces before `?!.,` and in some contractions (`clean_spaces`).
    pub clean_spaces: bool,
    /// The `add_bos` default before `tokenizer.ggml.add_bos_token` is read.
    pub add_bos_default: bool,
}

const SMOLLM: PreTokenizerSpec = PreTokenizerSpec {
    kind: "smollm",
    regexes: &[r"\p{N}", GPT2],
    ignore_merges: false,
    clean_spaces: false,
    add_bos_default: false,
};

/// `tokenizer.ggml.pre` names accepted, with the spec llama.cpp gives each.
const TABLE: &[(&str, PreTokenizerSpec)] = &[
    ("smollm", SMOLLM),
    (
        "starcoder",
        PreTokenizerSpec {
            kind: "starcoder",
            clean_spaces: true,
            ..SMOLLM
        },
    ),
    (
        "refact",
        PreTokenizerSpec {
            kind: "refact",
            clean_spaces: true,
            ..SMOLLM
        },
    ),
    (
        "codeshell",
        PreTokenizerSpec {
            kind: "codeshell",
            clean_spaces: true,
            ..SMOLLM
        },
    ),
    (
        "command-r",
        PreTokenizerSpec {
            kind: "command_r",
            ..SMOLLM
        },
    ),
    ("gpt-2", GPT2_SPEC),
    ("phi-2", GPT2_SPEC),
    ("mpt", GPT2_SPEC),
    ("olmo", GPT2_SPEC),
    ("qwen2", QWEN2_SPEC),
    ("deepseek-r1-qwen", QWEN2_SPEC),
    ("llama3", LLAMA3_SPEC),
    ("llama-v3", LLAMA3_SPEC),
    ("llama-bpe", LLAMA3_SPEC),
];

const GPT2_SPEC: PreTokenizerSpec = PreTokenizerSpec {
    kind: "gpt2",
    regexes: &[GPT2],
    ignore_merges: false,
    clean_spaces: true,
    add_bos_default: false,
};

const QWEN2_SPEC: PreTokenizerSpec = PreTokenizerSpec {
    kind: "qwen2",
    regexes: &[QWEN2],
    ignore_merges: false,
    clean_spaces: false,
    add_bos_default: false,
};

const LLAMA3_SPEC: PreTokenizerSpec = PreTokenizerSpec {
    kind: "llama3",
    regexes: &[LLAMA3],
    ignore_merges: true,
    clean_spaces: true,
    add_bos_default: true,
};

/// SentencePiece vocabularies (`tokenizer.ggml.model` = "llama"): llama.cpp ignores
/// `tokenizer.ggml.pre` for them (always its "default" type); there is no regex split, since the
/// merge runs over each whole fragment of text, and BOS is added unless the file says otherwise.
pub const SPM: PreTokenizerSpec = PreTokenizerSpec {
    kind: "default",
    regexes: &[],
    ignore_merges: false,
    clean_spaces: false,
    add_bos_default: true,
};

/// The spec for a `tokenizer.ggml.pre` value, or `None` when we do not support it.
pub fn lookup(name: &str) -> Option<PreTokenizerSpec> {
    TABLE.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// Every accepted name (for error messages).
pub fn supported_names() -> Vec<&'static str> {
    TABLE.iter().map(|(n, _)| *n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smollm_splits_digits_then_gpt2() {
        let s = lookup("smollm").unwrap();
        assert_eq!(s.regexes, [r"\p{N}", GPT2]);
        assert!(!s.clean_spaces && !s.ignore_merges && !s.add_bos_default);
    }

    #[test]
    fn unknown_names_are_none_and_listed_names_resolve() {
        assert!(lookup("nonsense").is_none());
        for name in supported_names() {
            assert!(lookup(name).is_some(), "{name}");
        }
        assert!(lookup("llama3").unwrap().ignore_merges);
    }

    #[test]
    fn every_regex_compiles() {
        for name in supported_names() {
            for re in lookup(name).unwrap().regexes {
                let split = tokenizers::pre_tokenizers::split::Split::new(
                    tokenizers::pre_tokenizers::split::SplitPattern::Regex(re.to_string()),
                    tokenizers::SplitDelimiterBehavior::Isolated,
                    false,
                );
                assert!(split.is_ok(), "{name}: {re}");
            }
        }
    }
}
