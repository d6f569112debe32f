//! SentencePiece-style tokenization (`tokenizer.ggml.model` = "llama", llama.cpp's
//! `LLAMA_VOCAB_TYPE_SPM`), written from the description of llama.cpp's SPM session.
//!
//! One fragment of plain text (special tokens already cut out) has its spaces escaped as `▁`
//! and is split into UTF-8 characters. Every adjacent pair whose concatenation is a token goes
//! into a max-heap keyed by that token's score (ties to the leftmost pair). The best pair is
//! merged, stale entries (a side already merged elsewhere) are skipped, and the pairs the merged
//! symbol forms with its new neighbours are added. At the end each symbol becomes its token; a
//! character that no token covers becomes one `<0xXX>` byte token per UTF-8 byte (byte
//! fallback). O(n log n) in the fragment's length.

use super::TokenizerError;
use super::pieces::SPM_SPACE;
use super::vocab::Vocab;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// No neighbour / no child.
const NONE: u32 = u32::MAX;

/// The token standing for each raw byte in byte fallback: `<0xXX>`, or else the byte itself as
/// a one-character token (as llama.cpp's `byte_to_token` looks them up).
pub fn byte_tokens(vocab: &Vocab) -> [Option<u32>; 256] {
    std::array::from_fn(|b| {
        let hex = format!("<0x{b:02X}>");
        vocab.token_to_id.get(hex.as_str()).copied().or_else(|| {
            // Only an ASCII byte can be a token text of its own (texts are UTF-8).
            let byte = u8::try_from(b).ok().filter(u8::is_ascii)?;
            let text = char::from(byte).to_string();
            vocab.token_to_id.get(text.as_str()).copied()
        })
    })
}

/// A run of the escaped text: one character at first, then the union of merged neighbours.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: u32,
    /// Length in bytes; 0 once merged into its left neighbour.
    len: u32,
    prev: u32,
    next: u32,
    /// What it is made of, in the node arena.
    node: u32,
}

/// A piece of text and the two nodes it was merged from (`NONE` for an original character);
/// never changed once made, so that a merge can still be undone into its halves.
#[derive(Debug, Clone, Copy)]
struct Node {
    start: u32,
    len: u32,
    children: (u32, u32),
}

/// A candidate merge of `left` with its right neighbour `right`, valid while their lengths still
/// add up to `size`.
#[derive(Debug, Clone, Copy)]
struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    size: u32,
}

impl Ord for Bigram {
    /// Higher score first; on equal scores the leftmost pair (llama.cpp's `llm_bigram_spm`
    /// comparator). Scores carry no negative zero (see `vocab::read_scores`), so the total order
    /// agrees with `<` (a NaN, which no real file has, sorts above every number).
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

/// Appends the tokens of one fragment of plain text. `space_prefix`: a space goes before it
/// (the `add_space_prefix` rule, decided by the caller); `bytes`: [`byte_tokens`].
pub fn encode(
    vocab: &Vocab,
    bytes: &[Option<u32>; 256],
    text: &str,
    space_prefix: bool,
    out: &mut Vec<u32>,
) -> Result<(), TokenizerError> {
    let mut escaped = String::with_capacity(text.len() + text.len() / 2 + 3);
    if space_prefix {
        escaped.push_str(SPM_SPACE);
    }
    for c in text.chars() {
        if c == ' ' {
            escaped.push_str(SPM_SPACE);
        } else {
            escaped.push(c);
        }
    }
    if escaped.is_empty() {
        return Ok(());
    }
    // Symbols and merged nodes (at most twice the characters) are indexed by u32.
    if escaped.len() >= (u32::MAX / 2) as usize {
        return Err(TokenizerError::Invalid(format!(
            "a fragment of {} bytes is too long to tokenize",
            escaped.len()
        )));
    }
    let (symbols, nodes) = merge(vocab, &escaped);
    emit(vocab, bytes, &escaped, &symbols, &nodes, out)
}

/// Each remaining symbol as its token, else the tokens of the two it was merged from, else
/// one byte token per byte (llama.cpp's `resegment`). Since a pair is merged only when its
/// text is a token, the middle case cannot arise for UTF-8 input; it is kept for the shape of
/// the algorithm. An explicit stack keeps long chains off the call stack.
fn emit(
    vocab: &Vocab,
    bytes: &[Option<u32>; 256],
    text: &str,
    symbols: &[Symbol],
    nodes: &[Node],
    out: &mut Vec<u32>,
) -> Result<(), TokenizerError> {
    let mut stack = Vec::new();
    let mut i = 0;
    while i != NONE {
        stack.push(symbols[i as usize].node);
        while let Some(n) = stack.pop() {
            let node = nodes[n as usize];
            let piece = &text[node.start as usize..(node.start + node.len) as usize];
            if let Some(&id) = vocab.token_to_id.get(piece) {
                out.push(id);
            } else if node.children.0 != NONE {
                stack.push(node.children.1);
                stack.push(node.children.0);
            } else {
                for b in piece.bytes() {
                    out.push(bytes[usize::from(b)].ok_or_else(|| {
                        TokenizerError::Invalid(format!(
                            "no token for byte 0x{b:02X} (`<0x{b:02X}>`), which byte \
                                 fallback needs for {piece:?}"
                        ))
                    })?);
                }
            }
        }
        i = symbols[i as usize].next;
    }
    Ok(())
}

/// Runs the score-ordered merges over `text` (non-empty, under 2 GiB); returns the symbols,
/// linked from index 0 through `next`, and the nodes they are made of.
fn merge(vocab: &Vocab, text: &str) -> (Vec<Symbol>, Vec<Node>) {
    let mut nodes: Vec<Node> = text
        .char_indices()
        .map(|(start, c)| Node {
            start: start as u32,
            len: c.len_utf8() as u32,
            children: (NONE, NONE),
        })
        .collect();
    let n = nodes.len() as u32;
    let mut symbols: Vec<Symbol> = (0u32..)
        .zip(&nodes)
        .map(|(i, node)| Symbol {
            start: node.start,
            len: node.len,
            prev: if i == 0 { NONE } else { i - 1 },
            next: if i + 1 == n { NONE } else { i + 1 },
            node: i,
        })
        .collect();

    let mut heap = BinaryHeap::with_capacity(symbols.len());
    for i in 1..n {
        push_bigram(vocab, text, &symbols, i - 1, i, &mut heap);
    }
    while let Some(b) = heap.pop() {
        let (l, r) = (symbols[b.left as usize], symbols[b.right as usize]);
        // Stale: one side was merged since (its length is 0, or the sum changed).
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue;
        }
        // The right symbol joins the left one, which takes its place in the chain.
        nodes.push(Node {
            start: l.start,
            len: b.size,
            children: (l.node, r.node),
        });
        let left = &mut symbols[b.left as usize];
        left.len = b.size;
        left.next = r.next;
        left.node = (nodes.len() - 1) as u32;
        let (prev, next) = (left.prev, left.next);
        symbols[b.right as usize].len = 0;
        if next != NONE {
            symbols[next as usize].prev = b.left;
        }
        if prev != NONE {
            push_bigram(vocab, text, &symbols, prev, b.left, &mut heap);
        }
        if next != NONE {
            push_bigram(vocab, text, &symbols, b.left, next, &mut heap);
        }
    }
    (symbols, nodes)
}

/// Queues the merge of `left` with `right` if their text together is a token.
fn push_bigram(
    vocab: &Vocab,
    text: &str,
    symbols: &[Symbol],
    left: u32,
    right: u32,
    heap: &mut BinaryHeap<Bigram>,
) {
    let (l, r) = (symbols[left as usize], symbols[right as usize]);
    let size = l.len + r.len;
    let joined = &text[l.start as usize..(l.start + size) as usize];
    if let Some(&id) = vocab.token_to_id.get(joined) {
        heap.push(Bigram {
            score: vocab.scores[id as usize],
            left,
            right,
            size,
        });
    }
}
