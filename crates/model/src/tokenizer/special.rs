//! Special tokens: which ids end generation, which texts are control tokens, and how input text is
//! cut around special tokens before the BPE sees it — following llama.cpp's `llama-vocab.cpp`.

use super::vocab::{TokenAttr, Vocab};
use std::ops::Range;

/// Texts llama.cpp treats as end-of-turn when no `eot_token_id` key names one (first found wins;
/// llama.cpp walks a hash map, so where several exist its pick is arbitrary — only the EOT id
/// differs, never the end-of-generation set, which takes all of them).
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

/// Texts that end generation wherever they are in the vocabulary.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Fills in the special ids found by their text, marks them (and every end-of-generation text)
/// as control tokens, and returns the sorted end-of-generation ids.
pub fn detect_special_tokens(vocab: &mut Vocab) -> Vec<u32> {
    type Slot = fn(&mut Vocab) -> &mut Option<u32>;
    let groups: [(&[&str], Slot); 8] = [
        (EOT_TEXTS, |v| &mut v.special.eot),
        (EOM_TEXTS, |v| &mut v.special.eom),
        (FIM_PRE_TEXTS, |v| &mut v.special.fim_pre),
        (FIM_SUF_TEXTS, |v| &mut v.special.fim_suf),
        (FIM_MID_TEXTS, |v| &mut v.special.fim_mid),
        (FIM_PAD_TEXTS, |v| &mut v.special.fim_pad),
        (FIM_REP_TEXTS, |v| &mut v.special.fim_rep),
        (FIM_SEP_TEXTS, |v| &mut v.special.fim_sep),
    ];
    for (texts, slot) in groups {
        if slot(vocab).is_some() {
            continue;
        }
        if let Some(id) = texts
            .iter()
            .find_map(|t| vocab.token_to_id.get(*t).copied())
        {
            *slot(vocab) = Some(id);
            mark_control(vocab, id);
        }
    }

    let s = vocab.special.clone();
    let mut eog: Vec<u32> = [s.fim_pad, s.fim_rep, s.fim_sep]
        .into_iter()
        .flatten()
        .collect();
    for text in EOG_TEXTS {
        if let Some(&id) = vocab.token_to_id.get(*text) {
            eog.push(id);
            mark_control(vocab, id);
        }
    }
    // gpt-oss: these must always be rendered, so they are user-defined, not control.
    for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(&id) = vocab.token_to_id.get(text) {
            vocab.attrs[id as usize] = TokenAttr::USER_DEFINED;
        }
    }
    eog.extend([s.eos, s.eot, s.eom].into_iter().flatten());
    eog.sort_unstable();
    eog.dedup();

    let has = |eog: &[u32], vocab: &Vocab, text: &str| {
        eog.iter().any(|&id| vocab.tokens[id as usize] == text)
    };
    // o200k_harmony and solar-open: `<|end|>` ends a message, not the generation.
    if ((has(&eog, vocab, "<|return|>") && has(&eog, vocab, "<|call|>"))
        || (has(&eog, vocab, "<|calls|>") && has(&eog, vocab, "<|flush|>")))
        && let Some(&end) = vocab.token_to_id.get("<|end|>")
    {
        eog.retain(|&id| id != end);
        vocab.attrs[end as usize] = TokenAttr::USER_DEFINED;
    }
    // Gemma 4 and PLaMo have an ordinary `</s>`.
    if (has(&eog, vocab, "<|tool_response>") || has(&eog, vocab, "<|plamo:eos|>"))
        && let Some(&s_id) = vocab.token_to_id.get("</s>")
    {
        eog.retain(|&id| id != s_id);
        vocab.attrs[s_id as usize] = TokenAttr::NORMAL;
    }
    eog
}

fn mark_control(vocab: &mut Vocab, id: u32) {
    let a = &mut vocab.attrs[id as usize];
    if !a.has(TokenAttr::CONTROL) {
        tracing::warn!(
            "control-looking token {id} `{}` was not control-type; treating it as control",
            vocab.tokens[id as usize]
        );
        *a = a.union(TokenAttr::CONTROL);
    }
}

/// The special tokens matched in text before the BPE or SentencePiece merges run: control,
/// unknown and user-defined tokens, longest text first (ties by id; llama.cpp's unstable sort
/// leaves their order unspecified), with an index by text that finds the few of them a given
/// text holds. Gemma has 6414 of them: searching the text for each would cost more than the
/// tokenization itself.
#[derive(Debug, Clone)]
pub struct SpecialTokens {
    /// Ids in the order they are cut out.
    order: Vec<u32>,
    /// Positions in `order`, sorted by the token's text (bytes), so that the texts sharing a
    /// prefix are neighbours.
    by_text: Vec<u32>,
    /// Whether some special text starts with this byte.
    first_byte: [bool; 256],
}

impl SpecialTokens {
    pub fn new(vocab: &Vocab) -> Self {
        let mask = TokenAttr::CONTROL
            .union(TokenAttr::USER_DEFINED)
            .union(TokenAttr::UNKNOWN);
        let mut order: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&id| vocab.attrs[id as usize].has(mask))
            .collect();
        order.sort_by_key(|&id| (std::cmp::Reverse(vocab.tokens[id as usize].len()), id));
        let text = |pos: u32| vocab.tokens[order[pos as usize] as usize].as_bytes();
        let mut by_text: Vec<u32> = (0..order.len() as u32).collect();
        by_text.sort_by(|&a, &b| text(a).cmp(text(b)));
        let mut first_byte = [false; 256];
        for &id in &order {
            if let Some(&b) = vocab.tokens[id as usize].as_bytes().first() {
                first_byte[usize::from(b)] = true;
            }
        }
        Self {
            order,
            by_text,
            first_byte,
        }
    }

    /// The ids of `order` whose text occurs somewhere in `text`, in that order. For each start
    /// position this walks the sorted texts as a trie: the range of texts that share the bytes
    /// read so far narrows by binary search until it is empty.
    fn present(&self, text: &str, vocab: &Vocab) -> Vec<u32> {
        let bytes = text.as_bytes();
        let token = |pos: u32| vocab.tokens[self.order[pos as usize] as usize].as_bytes();
        let mut found = vec![false; self.order.len()];
        for start in 0..bytes.len() {
            if !self.first_byte[usize::from(bytes[start])] {
                continue;
            }
            let mut range = &self.by_text[..];
            for (depth, &b) in bytes[start..].iter().enumerate() {
                // Every text left in `range` is longer than `depth` and matches the bytes before.
                let lo = range.partition_point(|&p| token(p)[depth] < b);
                let hi = range.partition_point(|&p| token(p)[depth] <= b);
                range = &range[lo..hi];
                // The text that ends here sorts first among those sharing this prefix.
                if let Some((&p, rest)) = range.split_first()
                    && token(p).len() == depth + 1
                {
                    found[p as usize] = true;
                    range = rest;
                }
                if range.is_empty() {
                    break;
                }
            }
        }
        (0..self.order.len())
            .filter(|&p| found[p])
            .map(|p| self.order[p])
            .collect()
    }
}

/// A piece of input: text still to tokenize, or a special token already recognised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fragment {
    Text(Range<usize>),
    Token(u32),
}

/// Cuts `text` around special tokens, one token at a time in their order, as llama.cpp's
/// `tokenizer_st_partition` does. Control and unknown tokens are only recognised when
/// `parse_special` is set; user-defined tokens always are. Only the tokens that occur in `text`
/// are tried: a token absent from the whole text is absent from every fragment of it, so the
/// result is the same as trying them all.
pub fn partition(
    text: &str,
    vocab: &Vocab,
    specials: &SpecialTokens,
    parse_special: bool,
) -> Vec<Fragment> {
    if text.is_empty() {
        return Vec::new();
    }
    let mut frags = vec![Fragment::Text(0..text.len())];
    let skip_unless_parsing = TokenAttr::CONTROL.union(TokenAttr::UNKNOWN);
    for id in specials.present(text, vocab) {
        if !parse_special && vocab.attrs[id as usize].has(skip_unless_parsing) {
            continue;
        }
        let needle = vocab.tokens[id as usize].as_str();
        if !frags
            .iter()
            .any(|f| matches!(f, Fragment::Text(r) if text[r.clone()].contains(needle)))
        {
            continue;
        }
        let mut next = Vec::with_capacity(frags.len() + 2);
        for f in frags {
            let Fragment::Text(r) = f else {
                next.push(f);
                continue;
            };
            let mut start = r.start;
            while let Some(pos) = text[start..r.end].find(needle) {
                let at = start + pos;
                if at > start {
                    next.push(Fragment::Text(start..at));
                }
                next.push(Fragment::Token(id));
                start = at + needle.len();
            }
            if start < r.end {
                next.push(Fragment::Text(start..r.end));
            }
        }
        frags = next;
    }
    frags
}
