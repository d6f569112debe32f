//! JSON in and out of templates: JSON values as template values (objects keep their key order, as
//! Python dicts and llama.cpp's JSON do), `tojson` as llama.cpp writes it (Python's `json.dumps`
//! layout), and how `{{ … }}` prints values in llama.cpp's interpreter.

use minijinja::value::{Enumerator, Object, ObjectRepr};
use minijinja::{Error, ErrorKind, Value};
use serde_json::Value as Json;
use std::fmt::Write;
use std::sync::Arc;

/// A JSON object as a template map that iterates in insertion order.
#[derive(Debug)]
struct OrderedMap(Vec<(String, Value)>);

impl Object for OrderedMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let key = key.as_str()?;
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(
            self.0
                .iter()
                .map(|(k, _)| Value::from(k.as_str()))
                .collect(),
        )
    }
}

/// A JSON value as a template value.
pub fn to_value(json: &Json) -> Value {
    match json {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => Value::from(items.iter().map(to_value).collect::<Vec<_>>()),
        Json::Object(map) => Value::from_object(OrderedMap(
            map.iter().map(|(k, v)| (k.clone(), to_value(v))).collect(),
        )),
    }
}

/// How `tojson` formats, with Python's `json.dumps` defaults (which llama.cpp follows).
#[derive(Debug, Clone)]
pub struct DumpStyle {
    pub indent: Option<String>,
    pub item_sep: String,
    pub key_sep: String,
    pub ensure_ascii: bool,
    pub sort_keys: bool,
}

impl DumpStyle {
    /// `json.dumps` defaults: `", "` between items without indent, `","` with one; `": "`.
    pub fn python(indent: Option<String>) -> Self {
        let item_sep = if indent.is_some() { "," } else { ", " };
        Self {
            indent,
            item_sep: item_sep.to_string(),
            key_sep: ": ".to_string(),
            ensure_ascii: false,
            sort_keys: false,
        }
    }
}

/// Python's `json.dumps(value, ...)` of a template value.
pub fn dumps(value: &Value, style: &DumpStyle) -> Result<String, Error> {
    let mut out = String::new();
    dump(value, style, 0, &mut out)?;
    Ok(out)
}

fn newline(style: &DumpStyle, level: usize, out: &mut String) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

fn dump(value: &Value, style: &DumpStyle, level: usize, out: &mut String) -> Result<(), Error> {
    use minijinja::value::ValueKind as K;
    match value.kind() {
        K::Undefined | K::None => out.push_str("null"),
        K::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        K::Number => out.push_str(&number(value)),
        K::String => string(value.as_str().unwrap_or_default(), style.ensure_ascii, out),
        K::Seq | K::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(style, level + 1, out);
                dump(item, style, level + 1, out)?;
            }
            newline(style, level, out);
            out.push(']');
        }
        K::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if style.sort_keys {
                keys.sort_by_key(|k| k.to_string());
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(style, level + 1, out);
                string(&key.to_string(), style.ensure_ascii, out);
                out.push_str(&style.key_sep);
                dump(&value.get_item(key)?, style, level + 1, out)?;
            }
            newline(style, level, out);
            out.push('}');
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: cannot serialize a value of kind {other}"),
            ));
        }
    }
    Ok(())
}

/// Whether a number value is a float (minijinja writes floats with a `.`, an exponent, `inf` or
/// `NaN`, integers with digits only).
pub fn float_of(value: &Value) -> Option<f64> {
    let s = value.to_string();
    if s.parse::<i128>().is_ok() {
        return None;
    }
    s.parse::<f64>().ok()
}

/// Numbers in `tojson` as llama.cpp writes them (a C++ stream: integers as they are, floats as
/// `%g` with six significant digits, so `2.0` is `2`; Python would write `2.0`).
fn number(value: &Value) -> String {
    match float_of(value) {
        None => value.to_string(),
        Some(f) => format_g6(f),
    }
}

/// C's `%g` with the default precision of 6.
pub fn format_g6(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let sci = format!("{f:.5e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), exp.abs())
    } else {
        trim(&format!("{f:.*}", (5 - exp) as usize))
    }
}

/// A float printed by `{{ … }}` as llama.cpp prints it: `std::to_string` (six decimals) without
/// trailing zeros, keeping one (`2.0`, `0.5`, `1e-10` → `0.0`).
pub fn format_float_output(f: f64) -> String {
    let s = format!("{f:.6}");
    let s = s.trim_end_matches('0');
    if s.ends_with('.') {
        format!("{s}0")
    } else {
        s.to_string()
    }
}

/// A JSON string literal as Python writes it.
fn string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(json: &str, style: DumpStyle) -> String {
        let v = to_value(&serde_json::from_str(json).unwrap());
        dumps(&v, &style).unwrap()
    }

    #[test]
    fn dumps_like_python() {
        let j = r#"{"a": [true, null, 2.5, 3.0, "x\"y\n"], "b": 1, "é": {}}"#;
        assert_eq!(
            py(j, DumpStyle::python(None)),
            r#"{"a": [true, null, 2.5, 3, "x\"y\n"], "b": 1, "é": {}}"#
        );
        let style = DumpStyle {
            ensure_ascii: true,
            sort_keys: true,
            ..DumpStyle::python(Some("  ".into()))
        };
        assert_eq!(
            py(j, style),
            "{\n  \"a\": [\n    true,\n    null,\n    2.5,\n    3,\n    \"x\\\"y\\n\"\n  ],\n  \"b\": 1,\n  \"\\u00e9\": {}\n}"
        );
        assert_eq!(
            py(
                r#""😀""#,
                DumpStyle {
                    ensure_ascii: true,
                    ..DumpStyle::python(None)
                }
            ),
            r#""\ud83d\ude00""#
        );
        assert_eq!(py("[]", DumpStyle::python(Some(" ".into()))), "[]");
    }

    #[test]
    fn floats_print_like_cpp_streams() {
        for (f, g, out) in [
            (2.0, "2", "2.0"),
            (2.5, "2.5", "2.5"),
            (0.1, "0.1", "0.1"),
            (1e-10, "1e-10", "0.0"),
            (123456789.0, "1.23457e+08", "123456789.0"),
            (-0.000123, "-0.000123", "-0.000123"),
            (1e16, "1e+16", "10000000000000000.0"),
        ] {
            assert_eq!(format_g6(f), g, "{f}");
            assert_eq!(format_float_output(f), out, "{f}");
        }
    }

    #[test]
    fn objects_keep_the_order_of_their_json_map() {
        let json: Json = serde_json::from_str(r#"{"z": 1, "a": 2, "m": 3}"#).unwrap();
        let v = to_value(&json);
        let keys: Vec<String> = v.try_iter().unwrap().map(|k| k.to_string()).collect();
        let json_keys: Vec<&String> = json.as_object().unwrap().keys().collect();
        assert_eq!(keys.iter().collect::<Vec<_>>(), json_keys);
        assert_eq!(v.get_attr("a").unwrap().as_i64(), Some(2));
        assert!(v.get_attr("q").unwrap().is_undefined());
    }
}
