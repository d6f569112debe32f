//! Rewrites of a JSON schema before it is compiled: OpenAI's strict mode closes every object
//! ([`close_objects`]), emails, dates and times take only values validators accept
//! ([`validated_formats`]), and `uniqueItems`, which no grammar can enforce (whether an item
//! repeats an earlier one is not context-free), is accepted best-effort: dropped before
//! compiling ([`drop_unique_items`]) and reported to the client ([`unique_items_paths`]). Pydantic writes
//! it for every `set[...]` field, and vLLM and SGLang accept it the same way. The walks follow
//! the schema's keywords only (a property named `properties` is a name, not a keyword) and use
//! an explicit stack, so a deep schema cannot exhaust the thread's stack.

use serde_json::{Map, Value};

/// Where a keyword keeps subschemas: one, a list of them, or a map of names to them.
#[derive(Clone, Copy)]
enum Holds {
    One,
    List,
    Map,
}

/// The keywords whose values are (or hold) schemas; `items` is one schema or, in draft 4, a
/// list of them (told apart by the value).
fn holds(keyword: &str) -> Option<Holds> {
    Some(match keyword {
        "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => {
            Holds::Map
        }
        "prefixItems" | "anyOf" | "oneOf" | "allOf" => Holds::List,
        "items"
        | "additionalItems"
        | "additionalProperties"
        | "not"
        | "if"
        | "then"
        | "else"
        | "contains"
        | "propertyNames"
        | "unevaluatedProperties"
        | "unevaluatedItems" => Holds::One,
        _ => return None,
    })
}

/// The subschemas directly under `schema`, each with its path's segments below `schema`.
fn children(schema: &Map<String, Value>) -> Vec<(String, Option<String>, &Value)> {
    let mut out = Vec::new();
    for (key, value) in schema {
        let Some(kind) = holds(key) else { continue };
        let here = escape(key);
        match (kind, value) {
            (Holds::Map, Value::Object(map)) => out.extend(
                map.iter()
                    .map(|(name, s)| (here.clone(), Some(escape(name)), s)),
            ),
            (Holds::List, Value::Array(list)) | (Holds::One, Value::Array(list)) => out.extend(
                list.iter()
                    .enumerate()
                    .map(|(i, s)| (here.clone(), Some(i.to_string()), s)),
            ),
            (Holds::One, s @ Value::Object(_)) => out.push((here, None, s)),
            _ => {}
        }
    }
    out
}

/// [`children`], mutable (without paths).
fn children_mut(schema: &mut Map<String, Value>) -> Vec<&mut Value> {
    let mut out = Vec::new();
    for (key, value) in schema.iter_mut() {
        let Some(kind) = holds(key) else { continue };
        match (kind, value) {
            (Holds::Map, Value::Object(map)) => out.extend(map.values_mut()),
            (Holds::List, Value::Array(list)) | (Holds::One, Value::Array(list)) => {
                out.extend(list.iter_mut())
            }
            (Holds::One, s @ Value::Object(_)) => out.push(s),
            _ => {}
        }
    }
    out
}

/// A JSON pointer's escaping of one key (`~` and `/`).
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Calls `visit` on every schema object in `root`, parents before children.
fn each_schema_mut(root: &mut Value, mut visit: impl FnMut(&mut Map<String, Value>)) {
    let mut stack = vec![root];
    while let Some(v) = stack.pop() {
        if let Value::Object(map) = v {
            visit(map);
            stack.extend(children_mut(map));
        }
    }
}

/// OpenAI's strict mode: every object schema (one with `"type": "object"` or `properties`)
/// that does not say otherwise gets `"additionalProperties": false`, so no key the schema does
/// not name can appear. A `dict[str, T]` (its `additionalProperties` a schema) is left as is.
pub fn close_objects(schema: &mut Value) {
    each_schema_mut(schema, |map| {
        let object = map.get("type").is_some_and(|t| match t {
            Value::String(t) => t == "object",
            Value::Array(ts) => ts.iter().any(|t| t == "object"),
            _ => false,
        }) || map.contains_key("properties");
        if object && !map.contains_key("additionalProperties") {
            map.insert("additionalProperties".into(), Value::Bool(false));
        }
    });
}

/// Removes every `uniqueItems` keyword (see the module docs).
pub fn drop_unique_items(schema: &mut Value) {
    each_schema_mut(schema, |map| {
        map.remove("uniqueItems");
    });
}

/// An address of the form validators accept as deliverable (Pydantic's `EmailStr`, through
/// `email-validator`): dot-separated atoms of at most 64 characters before the `@`, and a
/// domain of dotted labels ending in a top-level domain of letters. The `email` format as
/// llguidance compiles it is RFC 5321's, which also allows a domain without a dot
/// (`ana@localhost`) and parts of any length, which those validators refuse.
const DELIVERABLE_EMAIL: &str = concat!(
    r"^[A-Za-z0-9_%+\-]{1,32}(\.[A-Za-z0-9_%+\-]{1,15}){0,2}",
    r"@([A-Za-z0-9]([A-Za-z0-9\-]{0,30}[A-Za-z0-9])?\.){1,3}[A-Za-z]{2,12}$"
);

/// A calendar date of the years 1000-9999, February's 29th only in leap years: the dates
/// Python's `datetime.date` (and so Pydantic) accepts. RFC 3339's form, as llguidance compiles
/// `date`, also allows 29 February of any year.
macro_rules! calendar_date {
    () => {
        concat!(
            r"([1-9][0-9]{3}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])",
            r"|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))",
            r"|([1-9][0-9](0[48]|[2468][048]|[13579][26])|(1[26]|[2468][048]|[3579][26])00)-02-29)"
        )
    };
}

/// A time of day with seconds 00-59 (Python has no leap second), at most microseconds, and a
/// zone; RFC 3339's, as llguidance compiles `time`, allows a 60th second.
macro_rules! clock_time {
    () => {
        r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?([zZ]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
    };
}

/// Each string `format` whose RFC form admits values Pydantic's validators refuse, and the
/// pattern it is compiled as instead.
const VALIDATED_FORMATS: &[(&str, &str)] = &[
    ("email", DELIVERABLE_EMAIL),
    ("date", concat!("^", calendar_date!(), "$")),
    ("time", concat!("^", clock_time!(), "$")),
    (
        "date-time",
        concat!("^", calendar_date!(), "[tT]", clock_time!(), "$"),
    ),
];

/// Each `format` of [`VALIDATED_FORMATS`] as its pattern, where the schema sets no `pattern`
/// of its own (then the format stays as llguidance knows it).
pub fn validated_formats(schema: &mut Value) {
    each_schema_mut(schema, |map| {
        let Some(format) = map.get("format").and_then(Value::as_str) else {
            return;
        };
        let Some((_, pattern)) = VALIDATED_FORMATS.iter().find(|(f, _)| *f == format) else {
            return;
        };
        if !map.contains_key("pattern") {
            map.remove("format");
            map.insert("pattern".into(), Value::String((*pattern).into()));
        }
    });
}

/// The JSON pointers of the first `most` arrays in `schema` (depth first) that ask for
/// `uniqueItems` (not enforced), sorted. Depth first, the path kept as one list of segments, so
/// a deep schema costs its size, not its size times its depth.
pub fn unique_items_paths(schema: &Value, most: usize) -> Vec<String> {
    let mut found = Vec::new();
    let mut path: Vec<String> = Vec::new();
    // (the number of segments above the value, the value's own segments, the value)
    let mut stack: Vec<(usize, Vec<String>, &Value)> = vec![(0, Vec::new(), schema)];
    while let Some((above, segments, v)) = stack.pop() {
        if found.len() == most {
            break;
        }
        path.truncate(above);
        path.extend(segments);
        let Value::Object(map) = v else { continue };
        if map.get("uniqueItems") == Some(&Value::Bool(true)) {
            found.push(format!("/{}", path.join("/")));
        }
        for (key, name, child) in children(map) {
            stack.push((
                path.len(),
                std::iter::once(key).chain(name).collect(),
                child,
            ));
        }
    }
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strict_closes_every_object_but_not_maps_of_values() {
        let mut s = json!({
            "type": "object",
            "properties": {
                "properties": {"type": "object", "properties": {"a": {"type": "string"}}},
                "tags": {"type": "object", "additionalProperties": {"type": "integer"}},
                "open": {"type": "object", "additionalProperties": true},
                "either": {"anyOf": [{"type": "object"}, {"type": "null"}]},
                "list": {"type": "array", "items": {"properties": {"x": {"const": 1}}}}
            },
            "$defs": {"Node": {"type": ["object", "null"]}},
            "default": {"type": "object"}
        });
        close_objects(&mut s);
        let closed = |p: &str| s.pointer(p).unwrap()["additionalProperties"].clone();
        assert_eq!(closed(""), json!(false));
        assert_eq!(closed("/properties/properties"), json!(false));
        assert_eq!(closed("/properties/either/anyOf/0"), json!(false));
        assert_eq!(closed("/properties/list/items"), json!(false));
        assert_eq!(closed("/$defs/Node"), json!(false));
        assert_eq!(closed("/properties/tags"), json!({"type": "integer"}));
        assert_eq!(closed("/properties/open"), json!(true));
        // Neither the map of property names nor an annotation's value is a schema.
        assert!(s["properties"].get("additionalProperties").is_none());
        assert_eq!(s["default"], json!({"type": "object"}));
        assert!(
            s["properties"]["either"]["anyOf"][1]
                .get("additionalProperties")
                .is_none()
        );
    }

    #[test]
    fn unique_items_are_found_where_they_are_and_dropped_everywhere() {
        let mut s = json!({
            "type": "object",
            "properties": {
                "a/b": {"type": "array", "uniqueItems": true, "items": {"type": "string"}},
                "nested": {"items": [{"type": "array", "uniqueItems": true}]},
                "off": {"type": "array", "uniqueItems": false}
            },
            "$defs": {"Tags": {"type": "array", "uniqueItems": true}},
            "examples": [{"uniqueItems": true}]
        });
        assert_eq!(
            unique_items_paths(&s, 8),
            [
                "/$defs/Tags",
                "/properties/a~1b",
                "/properties/nested/items/0"
            ]
        );
        assert_eq!(unique_items_paths(&s, 1).len(), 1);
        drop_unique_items(&mut s);
        assert!(unique_items_paths(&s, 8).is_empty());
        assert!(!s["properties"].to_string().contains("uniqueItems"));
        // Only schemas lose the keyword, not an annotation's value.
        assert_eq!(s["examples"], json!([{"uniqueItems": true}]));
    }

    #[test]
    fn formats_take_the_values_validators_accept_unless_the_schema_has_its_own_pattern() {
        let mut s = json!({"properties": {
            "email": {"type": "string", "format": "email"},
            "date": {"type": "string", "format": "date"},
            "time": {"type": "string", "format": "time"},
            "date-time": {"type": "string", "format": "date-time"},
            "mine": {"type": "string", "format": "email", "pattern": "@x\\.org$"},
            "uuid": {"type": "string", "format": "uuid"}}});
        validated_formats(&mut s);
        let p = &s["properties"];
        assert_eq!(p["mine"]["format"], "email");
        assert_eq!(p["uuid"]["format"], "uuid");
        let cases: &[(&str, &[&str], &[&str])] = &[
            (
                "email",
                &["ana@example.com", "a.b+c@mail.co.uk", "x_1@a-b.io"],
                &[
                    "ana@localhost",
                    "ana@host.1",
                    ".ana@x.com",
                    "a..b@x.com",
                    "ana@-x.com",
                ],
            ),
            (
                "date",
                &["2024-02-29", "2000-02-29", "1999-12-31", "2023-02-28"],
                &[
                    "2023-02-29",
                    "1900-02-29",
                    "2023-04-31",
                    "0999-01-01",
                    "2023-13-01",
                ],
            ),
            (
                "time",
                &["20:00:00Z", "23:59:59.123456+05:30"],
                &["12:32:60Z", "24:00:00Z", "12:00:00", "12:00:00.1234567Z"],
            ),
            (
                "date-time",
                &["2022-01-01T00:00:00Z", "2024-02-29t12:00:00-01:00"],
                &[
                    "2023-02-29T00:00:00Z",
                    "2022-01-01T00:00:60Z",
                    "2022-01-01 00:00:00Z",
                ],
            ),
        ];
        for (format, good, bad) in cases {
            assert!(p[format].get("format").is_none(), "{format}");
            let rx = regex::Regex::new(p[format]["pattern"].as_str().unwrap()).unwrap();
            for v in *good {
                assert!(rx.is_match(v), "{format}: {v}");
            }
            for v in *bad {
                assert!(!rx.is_match(v), "{format}: {v}");
            }
        }
    }

    #[test]
    fn a_deep_schema_is_walked_without_recursion() {
        let mut s = json!({"type": "string"});
        for _ in 0..2_000 {
            s = json!({"type": "array", "uniqueItems": true, "items": s});
        }
        assert_eq!(unique_items_paths(&s, usize::MAX).len(), 2_000);
        drop_unique_items(&mut s);
        close_objects(&mut s);
        assert!(unique_items_paths(&s, usize::MAX).is_empty());
    }
}
