//! The pythonic tool-call format (Llama 3.2/3.3/4 with their pythonic templates): a Python list
//! of calls with keyword arguments, `[get_weather(city="Paris"), now()]`. Arguments are Python
//! literals (strings in either quote, numbers, `True`/`False`/`None`, lists, tuples, dicts), read
//! here into JSON; nothing is evaluated.

use serde_json::{Map, Number, Value};

/// Nesting deeper than this is refused (the reader recurses; serde_json stops at 128 too).
const MAX_DEPTH: usize = 64;

/// The calls of a pythonic list, as (name, arguments object); `None` if `text` is not one.
pub fn parse_calls(text: &str) -> Option<Vec<(String, Value)>> {
    let mut p = Reader {
        s: text.trim().as_bytes(),
        at: 0,
        depth: 0,
    };
    p.eat(b'[')?;
    let mut calls = Vec::new();
    p.ws();
    if p.peek() == Some(b']') {
        return None;
    }
    loop {
        calls.push(p.call()?);
        p.ws();
        match p.next()? {
            b',' => p.ws(),
            b']' => break,
            _ => return None,
        }
    }
    p.ws();
    (p.at == p.s.len()).then_some(calls)
}

/// Calls written as a pythonic list (for prompts and history).
pub fn write_calls(calls: &[(&str, &Value)]) -> String {
    let body: Vec<String> = calls
        .iter()
        .map(|(name, args)| {
            let kwargs: Vec<String> = args
                .as_object()
                .map(|o| {
                    o.iter()
                        .map(|(k, v)| format!("{k}={}", literal(v)))
                        .collect()
                })
                .unwrap_or_default();
            format!("{name}({})", kwargs.join(", "))
        })
        .collect();
    format!("[{}]", body.join(", "))
}

/// A JSON value as a Python literal.
fn literal(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        // JSON's string escapes are Python's too.
        Value::Number(_) | Value::String(_) => v.to_string(),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(literal).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(o) => {
            let items: Vec<String> = o
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), literal(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
    }
}

struct Reader<'a> {
    s: &'a [u8],
    at: usize,
    /// Containers open around the value being read.
    depth: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    fn eat(&mut self, b: u8) -> Option<()> {
        (self.next()? == b).then_some(())
    }

    fn ws(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    /// A Python identifier (ASCII), possibly dotted (`module.function`).
    fn ident(&mut self) -> Option<String> {
        let start = self.at;
        while self
            .peek()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
        {
            self.at += 1;
        }
        let id = std::str::from_utf8(&self.s[start..self.at]).ok()?;
        id.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            .then(|| id.to_string())
    }

    fn call(&mut self) -> Option<(String, Value)> {
        let name = self.ident()?;
        self.ws();
        self.eat(b'(')?;
        let mut args = Map::new();
        self.ws();
        if self.peek() == Some(b')') {
            self.at += 1;
            return Some((name, Value::Object(args)));
        }
        loop {
            self.ws();
            let key = self.ident()?;
            self.ws();
            self.eat(b'=')?;
            self.ws();
            let value = self.value()?;
            args.insert(key, value);
            self.ws();
            match self.next()? {
                b',' => {
                    self.ws();
                    if self.peek() == Some(b')') {
                        self.at += 1;
                        break;
                    }
                }
                b')' => break,
                _ => return None,
            }
        }
        Some((name, Value::Object(args)))
    }

    fn value(&mut self) -> Option<Value> {
        match self.peek()? {
            b'"' | b'\'' => self.string().map(Value::String),
            b'[' | b'(' | b'{' if self.depth >= MAX_DEPTH => None,
            b'[' | b'(' | b'{' => {
                self.depth += 1;
                let v = match self.peek()? {
                    b'[' => self.sequence(b']'),
                    b'(' => self.sequence(b')'),
                    _ => self.dict(),
                };
                self.depth -= 1;
                v
            }
            b'-' | b'+' | b'.' | b'0'..=b'9' => self.number(),
            _ => match self.ident()?.as_str() {
                "True" | "true" => Some(Value::Bool(true)),
                "False" | "false" => Some(Value::Bool(false)),
                "None" | "null" => Some(Value::Null),
                _ => None,
            },
        }
    }

    fn sequence(&mut self, close: u8) -> Option<Value> {
        self.at += 1;
        let mut items = Vec::new();
        loop {
            self.ws();
            if self.peek()? == close {
                self.at += 1;
                return Some(Value::Array(items));
            }
            items.push(self.value()?);
            self.ws();
            match self.next()? {
                b',' => {}
                b if b == close => return Some(Value::Array(items)),
                _ => return None,
            }
        }
    }

    fn dict(&mut self) -> Option<Value> {
        self.at += 1;
        let mut map = Map::new();
        loop {
            self.ws();
            if self.peek()? == b'}' {
                self.at += 1;
                return Some(Value::Object(map));
            }
            let key = match self.value()? {
                Value::String(s) => s,
                Value::Number(n) => n.to_string(),
                _ => return None,
            };
            self.ws();
            self.eat(b':')?;
            self.ws();
            map.insert(key, self.value()?);
            self.ws();
            match self.next()? {
                b',' => {}
                b'}' => return Some(Value::Object(map)),
                _ => return None,
            }
        }
    }

    fn number(&mut self) -> Option<Value> {
        let start = self.at;
        while self
            .peek()
            .is_some_and(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E'))
        {
            self.at += 1;
        }
        let text = std::str::from_utf8(&self.s[start..self.at]).ok()?;
        let text = text.strip_prefix('+').unwrap_or(text);
        if let Ok(i) = text.parse::<i64>() {
            return Some(Value::Number(i.into()));
        }
        let f: f64 = text.parse().ok()?;
        Number::from_f64(f).map(Value::Number)
    }

    /// A quoted string with Python's common escapes.
    fn string(&mut self) -> Option<String> {
        let quote = self.next()?;
        let mut out: Vec<u8> = Vec::new();
        loop {
            let b = self.next()?;
            if b == quote {
                return String::from_utf8(out).ok();
            }
            if b != b'\\' {
                out.push(b);
                continue;
            }
            let e = self.next()?;
            let ch = match e {
                b'n' => '\n',
                b't' => '\t',
                b'r' => '\r',
                b'0' => '\0',
                b'\\' | b'\'' | b'"' => e as char,
                b'u' | b'x' => {
                    let n = if e == b'u' { 4 } else { 2 };
                    let hex = std::str::from_utf8(self.s.get(self.at..self.at + n)?).ok()?;
                    self.at += n;
                    char::from_u32(u32::from_str_radix(hex, 16).ok()?)?
                }
                // An unknown escape stays as written, as in Python.
                other => {
                    out.push(b'\\');
                    other as char
                }
            };
            let mut buf = [0; 4];
            out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn calls_with_literal_arguments_become_json() {
        let calls = parse_calls(
            r#"[get_weather(city="Zürich", days=3, metric=True), now(), f(x=[1, 2.5, None], d={'k': (1,)}, s='it\'s',)]"#,
        )
        .unwrap();
        assert_eq!(
            calls,
            vec![
                (
                    "get_weather".into(),
                    json!({"city": "Zürich", "days": 3, "metric": true})
                ),
                ("now".into(), json!({})),
                (
                    "f".into(),
                    json!({"x": [1, 2.5, null], "d": {"k": [1]}, "s": "it's"})
                ),
            ]
        );
    }

    #[test]
    fn what_is_not_a_call_list_is_refused() {
        for text in [
            "[1, 2]",
            "[]",
            "[f(1)]",
            "[f(x=)]",
            "[f(x=os.system('ls'))]",
            "[f(x=1)] trailing",
            "[f(x='open]",
        ] {
            assert_eq!(parse_calls(text), None, "{text}");
        }
        // Deep nesting is refused, not a stack overflow.
        let deep = format!("[f(x={}{})]", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(parse_calls(&deep), None);
        let ok = format!("[f(x={}{})]", "[".repeat(60), "]".repeat(60));
        assert!(parse_calls(&ok).is_some());
    }

    #[test]
    fn written_calls_read_back() {
        let args = json!({"q": "a \"b\"\n", "n": -2, "ok": false, "l": [null], "o": {"x": 1.5}});
        let text = write_calls(&[("search", &args), ("now", &json!({}))]);
        assert_eq!(
            parse_calls(&text).unwrap(),
            vec![("search".into(), args), ("now".into(), json!({}))]
        );
    }
}
