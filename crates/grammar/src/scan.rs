//! The schema and regex checks behind [`GrammarLimits::check`](crate::GrammarLimits::check): a
//! schema's JSON is walked with an explicit stack (its depth costs heap, not stack) for its
//! size, counts and patterns, then for its depth with its `$ref`s followed and for its width; a
//! regex byte by byte. Each stops at the first limit passed.

use crate::GrammarError;
use crate::depth::check_expanded_depth;
use crate::expand::regex_expansion;
use crate::limits::{GrammarLimits, within};
use crate::width::check_width;
use serde_json::{Map, Value};
use std::fmt::Write;

/// What the schemas of one spec add up to.
#[derive(Debug, Default)]
pub(crate) struct Totals {
    bytes: usize,
    properties: usize,
    name_bytes: usize,
    definitions: usize,
    refs: usize,
    enum_values: usize,
}

/// How a value inside a schema is read: a schema, a map of names to schemas (`properties`,
/// `$defs`), a list of schemas (`anyOf`), or data (`enum`, `const`, `default`, ...).
#[derive(Clone, Copy, PartialEq)]
enum Role {
    Schema,
    Map,
    List,
    Data,
}

/// Keywords whose value is data, not a schema (walked for size and depth only).
const DATA_KEYWORDS: [&str; 12] = [
    "enum",
    "const",
    "default",
    "examples",
    "required",
    "type",
    "description",
    "title",
    "format",
    "$ref",
    "pattern",
    "x-guidance",
];

/// Checks one schema against `limits`, adding it to `totals` (which hold the limits over all
/// the schemas of a spec).
pub(crate) fn scan_schema(
    schema: &Value,
    limits: &GrammarLimits,
    totals: &mut Totals,
) -> Result<(), GrammarError> {
    let mut stack = vec![(schema, Role::Schema, 1usize)];
    while let Some((value, role, depth)) = stack.pop() {
        within(
            "nesting depth of the schema",
            depth,
            limits.max_schema_depth,
        )?;
        totals.bytes += scalar_bytes(value);
        match value {
            Value::Object(map) => {
                totals.bytes += 2 + map.len();
                for (key, child) in map {
                    totals.bytes += string_bytes(key) + 1;
                    let child_role = match role {
                        Role::Schema => keyword(key, child, limits, totals)?,
                        Role::Map | Role::List => Role::Schema,
                        Role::Data => Role::Data,
                    };
                    stack.push((child, child_role, depth + 1));
                }
            }
            Value::Array(items) => {
                totals.bytes += 2 + items.len();
                let child_role = match role {
                    Role::Data => Role::Data,
                    // `items` as a list (older drafts) and `type` lists are schemas or names.
                    _ => Role::Schema,
                };
                stack.extend(items.iter().map(|v| (v, child_role, depth + 1)));
            }
            _ => {}
        }
        within(
            "bytes of the JSON schemas",
            totals.bytes,
            limits.max_schema_bytes,
        )?;
    }
    // The width walk recurses, no deeper than the depth checked first (iteratively).
    check_expanded_depth(schema, limits.max_schema_depth)?;
    check_width(schema, limits.max_schema_width)
}

/// Counts what a schema's `key` adds to the totals, checks its own limits, and says how its
/// value is read.
fn keyword(
    key: &str,
    value: &Value,
    limits: &GrammarLimits,
    totals: &mut Totals,
) -> Result<Role, GrammarError> {
    match key {
        "properties" | "patternProperties" => {
            let Some(map) = value.as_object() else {
                return Ok(Role::Data);
            };
            properties(key, map, limits, totals)?;
            Ok(Role::Map)
        }
        "$defs" | "definitions" | "dependentSchemas" => {
            if key != "dependentSchemas" {
                totals.definitions += value.as_object().map_or(0, Map::len);
                within(
                    "definitions ($defs) of the schemas",
                    totals.definitions,
                    limits.max_definitions,
                )?;
            }
            Ok(if value.is_object() {
                Role::Map
            } else {
                Role::Data
            })
        }
        "anyOf" | "oneOf" | "allOf" | "prefixItems" => {
            let n = value.as_array().map_or(0, Vec::len);
            within(
                "alternatives of one anyOf, oneOf or allOf",
                n,
                limits.max_alternatives,
            )?;
            Ok(Role::List)
        }
        _ => {
            data_keyword(key, value, limits, totals)?;
            Ok(if DATA_KEYWORDS.contains(&key) {
                Role::Data
            } else {
                Role::Schema
            })
        }
    }
}

/// The limits of `enum`, `const`, `$ref` and `pattern`.
fn data_keyword(
    key: &str,
    value: &Value,
    limits: &GrammarLimits,
    totals: &mut Totals,
) -> Result<(), GrammarError> {
    match key {
        "enum" => {
            let n = value.as_array().map_or(1, Vec::len);
            within("values of one enum", n, limits.max_enum_values)?;
            totals.enum_values += n;
        }
        "const" => totals.enum_values += 1,
        "$ref" => {
            totals.refs += 1;
            return within("$refs of the schemas", totals.refs, limits.max_refs);
        }
        "pattern" => {
            let rx = value.as_str().unwrap_or_default();
            return scan_regex("bytes of one pattern", rx, limits.max_pattern_bytes, limits);
        }
        _ => return Ok(()),
    }
    within(
        "enum and const values of the schemas",
        totals.enum_values,
        limits.max_total_enum_values,
    )
}

fn properties(
    key: &str,
    map: &Map<String, Value>,
    limits: &GrammarLimits,
    totals: &mut Totals,
) -> Result<(), GrammarError> {
    within(
        "properties of one object",
        map.len(),
        limits.max_object_properties,
    )?;
    totals.properties += map.len();
    within(
        "properties of all objects",
        totals.properties,
        limits.max_total_properties,
    )?;
    for name in map.keys() {
        totals.name_bytes += name.len();
        if key == "patternProperties" {
            scan_regex(
                "bytes of one pattern",
                name,
                limits.max_pattern_bytes,
                limits,
            )?;
        }
    }
    within(
        "bytes of property names",
        totals.name_bytes,
        limits.max_property_name_bytes,
    )
}

/// A string's length in JSON: quotes and escapes (a control character as `\u00XX`).
fn string_bytes(s: &str) -> usize {
    let escapes: usize = s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' => 1,
            0..0x20 => 5,
            _ => 0,
        })
        .sum();
    s.len() + 2 + escapes
}

/// The serialized length of a scalar (0 for objects and arrays, counted by their walk).
fn scalar_bytes(value: &Value) -> usize {
    match value {
        Value::Null => 4,
        Value::Bool(b) => 4 + usize::from(!b),
        Value::Number(n) => {
            let mut count = Counter(0);
            let _ = write!(count, "{n}");
            count.0
        }
        Value::String(s) => string_bytes(s),
        Value::Array(_) | Value::Object(_) => 0,
    }
}

/// Counts what is written to it.
struct Counter(usize);

impl Write for Counter {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0 += s.len();
        Ok(())
    }
}

/// Checks a regex: its bytes, how deep its groups nest, and its size with its counted
/// repetitions written out.
pub(crate) fn scan_regex(
    what: &'static str,
    rx: &str,
    max_bytes: usize,
    limits: &GrammarLimits,
) -> Result<(), GrammarError> {
    within(what, rx.len(), max_bytes)?;
    let bytes = rx.as_bytes();
    let (mut depth, mut in_class, mut i) = (0usize, false, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 1,
            b'[' => in_class = true,
            b']' => in_class = false,
            b'(' if !in_class => {
                depth += 1;
                within(
                    "nesting of a regex's groups",
                    depth,
                    limits.max_grammar_depth,
                )?;
            }
            b')' if !in_class => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    let size = usize::try_from(regex_expansion(rx)).unwrap_or(usize::MAX);
    within(
        "size of a regex with its repetitions written out",
        size,
        limits.max_repetition_expansion,
    )
}
