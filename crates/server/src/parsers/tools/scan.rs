//! Finding where a bracketed value ends in text that is still arriving: JSON objects and arrays,
//! and Python lists (whose strings may use either quote).

/// Which strings a scan skips over (brackets inside them do not count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quotes {
    /// JSON: `"…"` with backslash escapes.
    Json,
    /// Python: `"…"` and `'…'` with backslash escapes.
    Python,
}

/// The byte length of the bracketed value `text` starts with (after leading whitespace), up to
/// and including its closing bracket; `None` while it is still open, or when `text` does not
/// start with an opening bracket. Brackets of every kind (`{}`, `[]`, `()`) nest.
pub fn balanced_end(text: &str, quotes: Quotes) -> Option<usize> {
    let start = text.len() - text.trim_start().len();
    let mut depth = 0usize;
    let mut quote: Option<u8> = None;
    let mut escaped = false;
    for (i, &b) in text.as_bytes().iter().enumerate().skip(start) {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == q {
                quote = None;
            }
            continue;
        }
        match b {
            b'"' => quote = Some(b),
            b'\'' if quotes == Quotes::Python => quote = Some(b),
            b'{' | b'[' | b'(' => depth += 1,
            b'}' | b']' | b')' => {
                if depth <= 1 {
                    // A closer before any opener is not a value.
                    return (depth == 1).then_some(i + 1);
                }
                depth -= 1;
            }
            _ if depth == 0 => return None,
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
