//! The limits of a Lark grammar (an `ebnf` in its Lark form), read byte by byte without
//! recursion: its bytes, rules, alternatives and nesting, each `%json` schema like any schema,
//! each `/regex/` like a regex, and each rule's size with its counted repetitions written out
//! (terminals, which llguidance inlines into one regex, with the terminals they name; a
//! reference to a rule counts once, as llguidance keeps it a reference).

use crate::GrammarError;
use crate::expand::{Expansion, regex_expansion, repetition};
use crate::limits::{GrammarLimits, within};
use crate::scan::{Totals, scan_regex, scan_schema};
use serde_json::Value;
use std::collections::HashMap;

/// A piece of a rule's body, as its size is computed.
enum Tok {
    Atom(u64),
    Ref(String),
    Open,
    Close,
    Alt,
    Rep(u64),
}

/// A rule or terminal (or a directive's line), and its body.
struct Rule {
    name: String,
    body: Vec<Tok>,
}

/// Checks `lark` against `limits`, adding its `%json` schemas to `totals`.
pub(crate) fn scan_lark(
    lark: &str,
    limits: &GrammarLimits,
    totals: &mut Totals,
) -> Result<(), GrammarError> {
    within("bytes of the grammar", lark.len(), limits.max_grammar_bytes)?;
    let rules = Lexer::new(lark, limits).run(totals)?;
    check_expansion(&rules, limits)
}

struct Lexer<'a> {
    text: &'a str,
    bytes: &'a [u8],
    limits: &'a GrammarLimits,
    rules: Vec<Rule>,
    count: usize,
    alternatives: usize,
    depth: usize,
}

impl<'a> Lexer<'a> {
    fn new(text: &'a str, limits: &'a GrammarLimits) -> Self {
        Self {
            text,
            bytes: text.as_bytes(),
            limits,
            rules: vec![Rule {
                name: String::new(),
                body: Vec::new(),
            }],
            count: 0,
            alternatives: 0,
            depth: 0,
        }
    }

    fn push(&mut self, tok: Tok) {
        if let Some(rule) = self.rules.last_mut() {
            rule.body.push(tok);
        }
    }

    fn start_rule(&mut self, name: String) {
        self.depth = 0;
        self.rules.push(Rule {
            name,
            body: Vec::new(),
        });
    }

    fn run(mut self, totals: &mut Totals) -> Result<Vec<Rule>, GrammarError> {
        let (bytes, limits) = (self.bytes, self.limits);
        let mut line_start = true;
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            if line_start && !b.is_ascii_whitespace() {
                line_start = false;
                if let Some((name, next)) = rule_head(&bytes[i..]) {
                    self.count += 1;
                    within("rules of the grammar", self.count, limits.max_grammar_rules)?;
                    self.start_rule(name);
                    i += next;
                    continue;
                }
                if b == b'%' {
                    // A directive's line (`%ignore WS`) is sized like a rule of its own.
                    self.start_rule(String::new());
                }
            }
            i = self.token(i, totals)?;
            if b == b'\n' {
                line_start = true;
            }
        }
        Ok(self.rules)
    }

    /// Reads the token at `i`; the index after it.
    fn token(&mut self, i: usize, totals: &mut Totals) -> Result<usize, GrammarError> {
        let bytes = self.bytes;
        let next = match bytes[i] {
            b'"' => {
                let end = skip_quoted(bytes, i, b'"');
                self.push(Tok::Atom(end.saturating_sub(i + 2).max(1) as u64));
                end
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => skip_line(bytes, i),
            b'#' => skip_line(bytes, i),
            b'/' => {
                let end = skip_quoted(bytes, i, b'/');
                // Without its closing `/` (a regex left open ends at the line's end).
                let closed = end > i + 1 && bytes[end - 1] == b'/';
                let rx = &self.text[i + 1..end - usize::from(closed)];
                scan_regex(
                    "bytes of a regex",
                    rx,
                    self.limits.max_regex_bytes,
                    self.limits,
                )?;
                self.push(Tok::Atom(regex_expansion(rx)));
                end
            }
            b'|' => {
                self.alternatives += 1;
                within(
                    "alternatives (|) of the grammar",
                    self.alternatives,
                    self.limits.max_grammar_alternatives,
                )?;
                self.push(Tok::Alt);
                i + 1
            }
            b'%' => self.directive(i, totals)?,
            b'(' | b'[' => {
                self.depth += 1;
                within(
                    "nesting of the grammar's groups",
                    self.depth,
                    self.limits.max_grammar_depth,
                )?;
                self.push(Tok::Open);
                i + 1
            }
            b')' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                self.push(Tok::Close);
                i + 1
            }
            b'{' => match repetition(bytes, i) {
                Some((count, end)) => {
                    self.push(Tok::Rep(count));
                    end
                }
                None => i + 1,
            },
            b'<' => {
                self.push(Tok::Atom(1));
                bytes[i..]
                    .iter()
                    .position(|&b| b == b'>' || b == b'\n')
                    .map_or(bytes.len(), |n| i + n + 1)
            }
            b if b.is_ascii_alphabetic() || b"_!?@".contains(&b) => {
                let n = name_len(&bytes[i..]).max(1);
                self.push(Tok::Ref(self.text[i..i + n].to_string()));
                i + n
            }
            _ => i + 1,
        };
        Ok(next)
    }

    /// A `%json`, `%regex` or `%llguidance` directive at `i`: the JSON after it is skipped (a
    /// `%json` schema checked; it is one item of its rule). Other directives go on as text.
    fn directive(&mut self, i: usize, totals: &mut Totals) -> Result<usize, GrammarError> {
        let rest = &self.text[i + 1..];
        let Some(word) = ["json", "regex", "llguidance"]
            .into_iter()
            .find(|w| rest.starts_with(w))
        else {
            return Ok(i + 1);
        };
        let start = i + 1 + word.len();
        let mut values =
            serde_json::Deserializer::from_str(&self.text[start..]).into_iter::<Value>();
        match values.next() {
            Some(Ok(value)) => {
                if word == "json" {
                    scan_schema(&value, self.limits, totals)?;
                }
                self.push(Tok::Atom(1));
                Ok(start + values.byte_offset())
            }
            // llguidance says what is wrong with it.
            _ => Ok(start),
        }
    }
}

fn name_len(bytes: &[u8]) -> usize {
    bytes
        .iter()
        .take_while(|b| b.is_ascii_alphanumeric() || b"_-!?@".contains(b))
        .count()
}

/// Whether a name is a terminal's (upper case), which llguidance inlines into a regex.
fn is_terminal(name: &str) -> bool {
    name.trim_start_matches(['_', '!', '?', '@'])
        .starts_with(|c: char| c.is_ascii_uppercase())
}

/// A rule's or terminal's head at the start of a line: a name, maybe parameters or a priority,
/// then `:` (not `::`). Its name and the index after the colon.
fn rule_head(bytes: &[u8]) -> Option<(String, usize)> {
    let name = name_len(bytes);
    if name == 0 || bytes[0].is_ascii_digit() || bytes[0] == b'@' {
        return None;
    }
    let mut rest = &bytes[name..];
    if rest.first() == Some(&b'[') {
        let end = rest.iter().position(|&b| b == b']' || b == b'\n')?;
        rest = &rest[end + 1..];
    }
    rest = rest.trim_ascii_start();
    if let Some(priority) = rest.strip_prefix(b".") {
        let digits = priority.iter().take_while(|b| b.is_ascii_digit()).count();
        rest = priority[digits..].trim_ascii_start();
    }
    if rest.first() != Some(&b':') || rest.get(1) == Some(&b':') {
        return None;
    }
    let text = String::from_utf8_lossy(&bytes[..name]);
    let after = bytes.len() - rest.len() + 1;
    Some((text.trim_start_matches(['!', '?']).to_string(), after))
}

/// The index after a string or regex opened by `quote` at `i` (escapes skipped), or at the end
/// of the line if it is not closed there.
fn skip_quoted(bytes: &[u8], mut i: usize, quote: u8) -> usize {
    i += 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'\n' => return i,
            b if b == quote => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

fn skip_line(bytes: &[u8], i: usize) -> usize {
    bytes[i..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(bytes.len(), |n| i + n)
}

#[derive(Clone, Copy)]
enum Size {
    Unknown,
    Computing,
    Known(u64),
}

/// Every rule's size with its repetitions written out and its terminals inlined (a terminal
/// that names itself, through others or not, counts once there), each under the limit.
fn check_expansion(rules: &[Rule], limits: &GrammarLimits) -> Result<(), GrammarError> {
    let index: HashMap<&str, usize> = rules
        .iter()
        .enumerate()
        .filter(|(_, r)| is_terminal(&r.name))
        .map(|(i, r)| (r.name.as_str(), i))
        .collect();
    let terminal_refs = |r: usize| {
        rules[r].body.iter().filter_map(|t| match t {
            Tok::Ref(name) => index.get(name.as_str()).copied(),
            _ => None,
        })
    };
    let mut sizes = vec![Size::Unknown; rules.len()];
    for root in 0..rules.len() {
        let mut stack = vec![(root, false)];
        while let Some((r, ready)) = stack.pop() {
            if !ready {
                if !matches!(sizes[r], Size::Unknown) {
                    continue;
                }
                sizes[r] = Size::Computing;
                stack.push((r, true));
                stack.extend(terminal_refs(r).map(|c| (c, false)));
                continue;
            }
            let size = rule_size(&rules[r].body, &index, &sizes);
            within(
                "size of a grammar rule with its repetitions written out",
                usize::try_from(size).unwrap_or(usize::MAX),
                limits.max_repetition_expansion,
            )?;
            sizes[r] = Size::Known(size);
        }
    }
    Ok(())
}

fn rule_size(body: &[Tok], index: &HashMap<&str, usize>, sizes: &[Size]) -> u64 {
    let mut e = Expansion::default();
    for tok in body {
        match tok {
            Tok::Atom(size) => e.atom(*size),
            Tok::Ref(name) => match index.get(name.as_str()).map(|&i| sizes[i]) {
                Some(Size::Known(size)) => e.atom(size),
                _ => e.atom(1),
            },
            Tok::Open => e.open(),
            Tok::Close => e.close(),
            Tok::Alt => e.alternative(),
            Tok::Rep(count) => e.repeat(*count),
        }
    }
    e.total()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(lark: &str) -> Result<(), GrammarError> {
        scan_lark(lark, &GrammarLimits::default(), &mut Totals::default())
    }

    #[test]
    fn terminals_multiply_and_rules_do_not() {
        let chain = "start: A\nA: B{100}\nB: C{100}\nC: \"a\"{100}\n";
        let e = check(chain).unwrap_err().to_string();
        assert!(e.contains("repetitions written out: 1000000"), "{e}");
        check("start: a{100}\na: b{100}\nb: /[a-z]{1,50}/\n").unwrap();
        assert!(check("start: /(a{100}){1000}/").is_err());
        // Recursion counts once.
        check("start: A\nA: \"(\" A? \")\" | /[0-9]{1,9}/\n").unwrap();
    }

    #[test]
    fn rules_alternatives_and_nesting_are_counted_outside_strings() {
        let limits = GrammarLimits {
            max_grammar_rules: 2,
            max_grammar_alternatives: 2,
            ..GrammarLimits::default()
        };
        let scan = |lark: &str| scan_lark(lark, &limits, &mut Totals::default());
        scan("start: a | b\n// c: d | e\na: \"x|y|z\"\n").unwrap();
        assert!(scan("start: a\na: \"x\"\nb: \"y\"\n").is_err());
        assert!(scan("start: \"a\" | \"b\" | /c|d/ | \"e\"\n").is_err());
        let deep = format!("start: {}\"a\"{}", "(".repeat(17), ")".repeat(17));
        assert!(check(&deep).unwrap_err().to_string().contains("nesting"));
    }

    #[test]
    fn a_regex_left_open_before_a_wide_char_is_scanned_not_sliced_mid_char() {
        // Found by the fuzz targets: the open regex's last character was cut as if it were `/`.
        for lark in [
            "start: /é",
            "start: /aé\nb: \"c\"",
            "start: /\\é",
            "start: /ab/",
        ] {
            check(lark).unwrap();
        }
    }

    #[test]
    fn a_json_schema_inside_is_held_to_the_schema_limits() {
        let properties: serde_json::Map<String, Value> = (0..1001)
            .map(|i| (format!("p{i}"), serde_json::json!({"type": "string"})))
            .collect();
        let schema = serde_json::json!({"type": "object", "properties": properties});
        let e = check(&format!("start: %json {schema}\n")).unwrap_err();
        assert!(e.to_string().contains("properties of one object"), "{e}");
    }
}
