//! Finding where a call's body ends in text that is still arriving: a closing tag outside JSON
//! strings, or the closing bracket of a JSON object or array or a Python list (whose strings may
//! use either quote). The scan is resumable: each push of text continues where the last one
//! stopped, so a long body costs linear time, not a rescan per token.

/// Which strings a scan skips over (tags and brackets inside them do not count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quotes {
    /// JSON: `"…"` with backslash escapes.
    Json,
    /// Python: `"…"` and `'…'` with backslash escapes.
    Python,
}

/// The state of one body's scan. The text it is given must only grow between calls.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    /// Bytes already read.
    at: usize,
    /// Open brackets (bracket scans).
    depth: usize,
    quote: Option<u8>,
    escaped: bool,
}

impl Scan {
    /// Tracks strings; true if byte `b` is outside one (and is not the quote that opens one).
    fn outside(&mut self, b: u8, quotes: Quotes) -> bool {
        if let Some(q) = self.quote {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == q {
                self.quote = None;
            }
            return false;
        }
        if b == b'"' || (b == b'\'' && quotes == Quotes::Python) {
            self.quote = Some(b);
            return false;
        }
        true
    }

    /// The first of `tags` in `text` outside JSON strings: (where it starts, which). `None`
    /// until one arrives; a tag's beginning at the end of the text is left to the next call.
    pub fn find_tag(&mut self, text: &str, tags: &[&'static str]) -> Option<(usize, &'static str)> {
        let bytes = text.as_bytes();
        while self.at < bytes.len() {
            let rest = &bytes[self.at..];
            if self.quote.is_none() {
                if let Some(&tag) = tags.iter().find(|t| rest.starts_with(t.as_bytes())) {
                    return Some((self.at, tag));
                }
                if tags
                    .iter()
                    .any(|t| rest.len() < t.len() && t.as_bytes().starts_with(rest))
                {
                    return None;
                }
            }
            self.outside(bytes[self.at], Quotes::Json);
            self.at += 1;
        }
        None
    }

    /// The end (exclusive) of the bracketed value that `text[start..]` begins with, after
    /// leading whitespace; `None` while it is still open or if it does not begin with a bracket
    /// (then it never will: the caller sees `None` for good). Brackets of every kind (`{}`,
    /// `[]`, `()`) nest. `start` must be the same on every call of one scan.
    pub fn balanced(&mut self, text: &str, start: usize, quotes: Quotes) -> Option<usize> {
        let bytes = text.as_bytes();
        self.at = self.at.max(start);
        while self.at < bytes.len() {
            let b = bytes[self.at];
            self.at += 1;
            if !self.outside(b, quotes) {
                continue;
            }
            match b {
                b'{' | b'[' | b'(' => self.depth += 1,
                b'}' | b']' | b')' if self.depth == 1 => return Some(self.at),
                b'}' | b']' | b')' if self.depth > 1 => self.depth -= 1,
                _ if self.depth == 0 && !b.is_ascii_whitespace() => {
                    // Not a bracketed value: stay here, so every later call says so too.
                    self.at -= 1;
                    return None;
                }
                _ => {}
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn balanced_end(text: &str, quotes: Quotes) -> Option<usize> {
        Scan::default().balanced(text, 0, quotes)
    }

    #[test]
    fn values_end_at_their_closing_bracket_not_inside_strings() {
        assert_eq!(balanced_end(r#"{"a": "}"} tail"#, Quotes::Json), Some(10));
        assert_eq!(balanced_end(r#"  [{"x": [1, 2]}]"#, Quotes::Json), Some(17));
        assert_eq!(balanced_end(r#"{"a": "\"}"#, Quotes::Json), None);
        assert_eq!(balanced_end(r#"{"a": "\\"}"#, Quotes::Json), Some(11));
        assert_eq!(balanced_end("[f(x=')]')]", Quotes::Python), Some(11));
        assert_eq!(balanced_end("[f(x=')]')]", Quotes::Json), Some(8));
        assert_eq!(balanced_end("{", Quotes::Json), None);
        assert_eq!(balanced_end("x{}", Quotes::Json), None);
        assert_eq!(balanced_end("}", Quotes::Json), None);
    }

    #[test]
    fn scans_resume_where_they_stopped() {
        let text = r#"{"k": "a}b", "l": [1, {"m": 2}]} after"#;
        for cut in 0..text.len() {
            let mut s = Scan::default();
            let first = s.balanced(&text[..cut], 0, Quotes::Json);
            let end = first.or_else(|| s.balanced(text, 0, Quotes::Json));
            assert_eq!(end, Some(32), "cut at {cut}");
        }
        let text = "{\"a\": \"</end>\"}</end>";
        for cut in 0..text.len() {
            let mut s = Scan::default();
            let first = s.find_tag(&text[..cut], &["</end>"]);
            let found = first.or_else(|| s.find_tag(text, &["</end>"]));
            assert_eq!(found, Some((15, "</end>")), "cut at {cut}");
        }
        // Non-ASCII text before a tag.
        let mut s = Scan::default();
        assert_eq!(s.find_tag("é<e", &["<end>"]), None);
        assert_eq!(s.find_tag("é<end>", &["<end>"]), Some(("é".len(), "<end>")));
    }
}
