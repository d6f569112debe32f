//! SGLang's `ebnf` field speaks GBNF (llama.cpp's and xgrammar's `rule ::= ...` notation);
//! llguidance reads Lark. This rewrites one into the other token by token: rules become
//! one-line Lark rules (`root` is `start`), literals are re-escaped, character classes and `.`
//! become regexes, and groups, alternatives and repetitions (`* + ? {m,n}`) carry over.
//! Text without `::=` is taken to be Lark already.

use crate::GrammarError;
use crate::limits::{MAX_GRAMMAR_BYTES, within};

/// Lark for a GBNF (or Lark) grammar. A grammar over [`MAX_GRAMMAR_BYTES`] is refused first (the
/// Lark is checked against the rest of the limits when it is compiled).
pub fn ebnf_to_lark(text: &str) -> Result<String, GrammarError> {
    within("bytes of the grammar", text.len(), MAX_GRAMMAR_BYTES)?;
    if !text.contains("::=") {
        return Ok(text.to_string());
    }
    let tokens = lex(text)?;
    let mut out = String::new();
    for (i, t) in tokens.iter().enumerate() {
        match t {
            Tok::Name(n) if matches!(tokens.get(i + 1), Some(Tok::Defines)) => {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(&rule_name(n));
            }
            Tok::Name(n) => push_item(&mut out, &rule_name(n)),
            Tok::Defines => out.push(':'),
            Tok::Literal(s) => {
                push_item(&mut out, &serde_json::Value::from(s.as_str()).to_string())
            }
            Tok::Class(c) => push_item(&mut out, &format!("/{}/", c.replace('/', "\\/"))),
            Tok::Punct(p) => push_item(&mut out, p),
        }
    }
    if !tokens.iter().any(|t| matches!(t, Tok::Defines)) {
        return Err(invalid("no rule (`name ::= ...`)"));
    }
    out.push('\n');
    Ok(out)
}

#[derive(Debug, PartialEq)]
enum Tok {
    Name(String),
    Defines,
    /// A string literal, unescaped.
    Literal(String),
    /// A regex: a character class or any character.
    Class(String),
    /// `( ) | * + ?` or a `{m,n}` repetition.
    Punct(String),
}

fn push_item(out: &mut String, item: &str) {
    let glued = matches!(item, "*" | "+" | "?" | ")") || item.starts_with('{');
    if !glued && !out.ends_with(['(', '\n']) {
        out.push(' ');
    }
    out.push_str(item);
}

/// `root` is Lark's `start`; other names get a prefix (so none clashes with `start` or
/// begins with a digit) and underscores for dashes.
fn rule_name(name: &str) -> String {
    if name == "root" {
        return "start".into();
    }
    format!("r_{}", name.replace('-', "_").to_lowercase())
}

fn invalid(why: &str) -> GrammarError {
    GrammarError::Invalid(format!("the ebnf grammar is not valid GBNF: {why}"))
}

fn lex(text: &str) -> Result<Vec<Tok>, GrammarError> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            ':' if chars[i..].starts_with(&[':', ':', '=']) => {
                tokens.push(Tok::Defines);
                i += 3;
            }
            '"' => {
                let (s, next) = literal(&chars, i + 1)?;
                tokens.push(Tok::Literal(s));
                i = next;
            }
            '[' => {
                let end = class_end(&chars, i + 1)?;
                tokens.push(Tok::Class(chars[i..=end].iter().collect()));
                i = end + 1;
            }
            '.' => {
                tokens.push(Tok::Class("(?s:.)".into()));
                i += 1;
            }
            '(' | ')' | '|' | '*' | '+' | '?' => {
                tokens.push(Tok::Punct(c.to_string()));
                i += 1;
            }
            '{' => {
                let end = chars[i..]
                    .iter()
                    .position(|&c| c == '}')
                    .ok_or_else(|| invalid("unclosed `{`"))?;
                let rep: String = chars[i..=i + end].iter().collect();
                if !rep[1..rep.len() - 1]
                    .chars()
                    .all(|c| c.is_ascii_digit() || c == ',' || c == ' ')
                {
                    return Err(invalid(&format!("bad repetition {rep}")));
                }
                tokens.push(Tok::Punct(rep.replace(' ', "")));
                i += end + 1;
            }
            c if c.is_ascii_alphanumeric() || c == '_' || c == '-' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || "_-".contains(chars[i]))
                {
                    i += 1;
                }
                tokens.push(Tok::Name(chars[start..i].iter().collect()));
            }
            other => return Err(invalid(&format!("unexpected {other:?}"))),
        }
    }
    Ok(tokens)
}

/// A literal's text from just after its opening quote; returns it and the index after the
/// closing quote.
fn literal(chars: &[char], mut i: usize) -> Result<(String, usize), GrammarError> {
    let mut s = String::new();
    while i < chars.len() {
        match chars[i] {
            '"' => return Ok((s, i + 1)),
            '\\' => {
                let (c, next) = escape(chars, i + 1)?;
                s.push(c);
                i = next;
            }
            c => {
                s.push(c);
                i += 1;
            }
        }
    }
    Err(invalid("unterminated string"))
}

/// The character an escape stands for (after its backslash), and the index after it.
fn escape(chars: &[char], i: usize) -> Result<(char, usize), GrammarError> {
    let hex = |n: usize| -> Result<(char, usize), GrammarError> {
        let digits: String = chars
            .get(i + 1..i + 1 + n)
            .unwrap_or_default()
            .iter()
            .collect();
        u32::from_str_radix(&digits, 16)
            .ok()
            .and_then(char::from_u32)
            .map(|c| (c, i + 1 + n))
            .ok_or_else(|| invalid(&format!("bad escape \\{}{digits}", chars[i])))
    };
    match chars.get(i) {
        Some('n') => Ok(('\n', i + 1)),
        Some('t') => Ok(('\t', i + 1)),
        Some('r') => Ok(('\r', i + 1)),
        Some('x') => hex(2),
        Some('u') => hex(4),
        Some('U') => hex(8),
        Some(&c) => Ok((c, i + 1)),
        None => Err(invalid("a backslash ends the grammar")),
    }
}

/// The index of the `]` closing a class that opened before `i`.
fn class_end(chars: &[char], mut i: usize) -> Result<usize, GrammarError> {
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            ']' => return Ok(i),
            _ => i += 1,
        }
    }
    Err(invalid("unclosed `[`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gbnf_becomes_lark() {
        let gbnf = "# a comment\nroot ::= answer \" \" num-list\nanswer ::= (\"yes\" | \"no\")\n  | \"maybe\"\nnum-list ::= [0-9]{1,3} (\",\" [0-9]+)* .?\n";
        let lark = ebnf_to_lark(gbnf).unwrap();
        assert_eq!(
            lark,
            "start: r_answer \" \" r_num_list\nr_answer: (\"yes\" | \"no\") | \"maybe\"\nr_num_list: /[0-9]/{1,3} (\",\" /[0-9]/+)* /(?s:.)/?\n"
        );
        assert_eq!(ebnf_to_lark("start: \"x\"").unwrap(), "start: \"x\"");
    }

    #[test]
    fn escapes_are_carried_and_bad_gbnf_is_an_error() {
        let lark = ebnf_to_lark(r#"root ::= "a\"b\n\x41" [^\]/]"#).unwrap();
        assert_eq!(lark, "start: \"a\\\"b\\nA\" /[^\\]\\/]/\n");
        for bad in [
            "root ::= \"open",
            "root ::= [a-z",
            "root ::= x{1,a}",
            "root ::= @",
        ] {
            assert!(
                matches!(ebnf_to_lark(bad), Err(GrammarError::Invalid(_))),
                "{bad}"
            );
        }
    }
}
