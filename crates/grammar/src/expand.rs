//! How large a regex (or a rule) is once its counted repetitions are written out: `a{100}` is
//! 100, `(ab|c){10}` 30, nested repetitions multiply. llguidance's lexer builds a regex's
//! derivatives from that form (`((a{100}){100}){100}`, 21 bytes, took 0.8 s and 280 MB to
//! compile, then failed mid-generation), so it is what the limits bound. Alternatives are added
//! (an estimate from above); `*`, `+` and `?` count once.

/// A group being summed: its size so far, and that of its last item (which a repetition
/// multiplies).
#[derive(Clone, Copy, Default)]
pub(crate) struct Group {
    total: u64,
    last: u64,
}

/// Sizes summed through nested groups, without recursion.
#[derive(Default)]
pub(crate) struct Expansion {
    open: Vec<Group>,
    current: Group,
}

impl Expansion {
    pub(crate) fn atom(&mut self, size: u64) {
        self.current.total = self.current.total.saturating_add(size);
        self.current.last = size;
    }

    /// The last item `count` times.
    pub(crate) fn repeat(&mut self, count: u64) {
        let extra = self.current.last.saturating_mul(count.saturating_sub(1));
        self.current.total = self.current.total.saturating_add(extra);
        self.current.last = self.current.last.saturating_mul(count);
    }

    /// `|`: no repetition applies to what came before.
    pub(crate) fn alternative(&mut self) {
        self.current.last = 0;
    }

    pub(crate) fn open(&mut self) {
        self.open.push(std::mem::take(&mut self.current));
    }

    /// Closes the innermost group (an unmatched one is ignored: llguidance refuses it).
    pub(crate) fn close(&mut self) {
        if let Some(parent) = self.open.pop() {
            let group = std::mem::replace(&mut self.current, parent);
            self.atom(group.total);
        }
    }

    /// The size of everything so far (groups left open included).
    pub(crate) fn total(&self) -> u64 {
        self.open
            .iter()
            .fold(self.current.total, |sum, g| sum.saturating_add(g.total))
    }
}

/// A regex's written-out size (see the module).
pub(crate) fn regex_expansion(rx: &str) -> u64 {
    let bytes = rx.as_bytes();
    let mut e = Expansion::default();
    let mut i = 0;
    while i < bytes.len() {
        i = match bytes[i] {
            b'\\' => {
                e.atom(1);
                escape_end(bytes, i)
            }
            b'[' => {
                e.atom(1);
                class_end(bytes, i)
            }
            b'(' => {
                e.open();
                i + 1
            }
            b')' => {
                e.close();
                i + 1
            }
            b'|' => {
                e.alternative();
                i + 1
            }
            b'{' => match repetition(bytes, i) {
                Some((count, next)) => {
                    e.repeat(count);
                    next
                }
                None => {
                    e.atom(1);
                    i + 1
                }
            },
            b'*' | b'+' | b'?' => i + 1,
            _ => {
                e.atom(1);
                i + 1
            }
        };
    }
    e.total()
}

/// The index after an escape at `i` (`\x{...}`, `\p{...}` and their like up to the brace).
fn escape_end(bytes: &[u8], i: usize) -> usize {
    let braced = bytes.get(i + 1).is_some_and(|b| b"pPxuU".contains(b));
    if braced && bytes.get(i + 2) == Some(&b'{') {
        return bytes[i..]
            .iter()
            .position(|&b| b == b'}')
            .map_or(bytes.len(), |n| i + n + 1);
    }
    (i + 2).min(bytes.len())
}

/// The index after a character class opened at `i`.
fn class_end(bytes: &[u8], mut i: usize) -> usize {
    i += 1;
    if bytes.get(i) == Some(&b'^') {
        i += 1;
    }
    if bytes.get(i) == Some(&b']') {
        i += 1;
    }
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'[' if bytes.get(i + 1) == Some(&b':') => {
                // A POSIX class, `[:alpha:]`.
                i = bytes[i + 1..]
                    .iter()
                    .position(|&b| b == b']')
                    .map_or(bytes.len(), |n| i + n + 2);
            }
            b']' => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// A counted repetition at `i` (`{m}`, `{m,}`, `{m,n}`): the most it repeats (`m + 1` for
/// `{m,}`, whose rest is a star), and the index after it.
pub(crate) fn repetition(bytes: &[u8], i: usize) -> Option<(u64, usize)> {
    let end = i + 1 + bytes[i + 1..].iter().position(|&b| b == b'}')?;
    let inner = std::str::from_utf8(&bytes[i + 1..end])
        .ok()?
        .replace(' ', "");
    let (low, high) = match inner.split_once(',') {
        Some((low, high)) => (low, Some(high)),
        None => (inner.as_str(), None),
    };
    let number = |s: &str| -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(s.parse::<u64>().unwrap_or(u64::MAX))
    };
    let count = match high {
        None => number(low)?,
        Some("") => number(low)?.saturating_add(1),
        Some(high) => {
            let low = if low.is_empty() { 0 } else { number(low)? };
            low.max(number(high)?)
        }
    };
    Some((count, end + 1))
}

#[cfg(test)]
mod tests {
    use super::regex_expansion;

    #[test]
    fn repetitions_multiply_and_alternatives_add() {
        for (rx, size) in [
            ("abc", 3),
            ("a{100}", 100),
            ("(ab|c){10}", 30),
            ("((a{100}){100}){100}", 1_000_000),
            ("[a-z]{3,5}x", 6),
            ("a{2,}", 3),
            (r"\d{4}-\d{2}", 7),
            (r"\p{L}{10}", 10),
            ("[]{}]{2}", 2),
            ("a{x}", 4),
        ] {
            assert_eq!(regex_expansion(rx), size, "{rx}");
        }
    }
}
