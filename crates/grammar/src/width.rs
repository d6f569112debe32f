//! How many properties one position of a schema may choose among: an object's own, plus those
//! of every object an `anyOf`, `oneOf` or `allOf` (or a `$ref`) puts at the same position. It
//! is what makes llguidance's parser rows wide (about four items a property) and its masks
//! slow, so it is held under a limit ([`MAX_SCHEMA_WIDTH`](crate::MAX_SCHEMA_WIDTH)) before
//! llguidance sees it. An upper estimate: the alternatives' nested positions are added up too,
//! and each alternative counts as 4 properties more than it has.
//!
//! The walk recurses, but only after [`check_expanded_depth`](crate::depth) has bounded how deep
//! the schema nests with its `$ref`s followed (a reference back into a schema being walked is
//! recursion and counts nothing).

use crate::GrammarError;
use crate::limits::within;
use serde_json::{Map, Value};
use std::collections::HashMap;

/// What one alternative of a union costs besides its properties.
const ALTERNATIVE_WEIGHT: usize = 4;

/// Keywords whose value is a schema at a position inside this one.
const INNER_SCHEMA: [&str; 9] = [
    "items",
    "additionalProperties",
    "unevaluatedProperties",
    "additionalItems",
    "contains",
    "not",
    "if",
    "then",
    "else",
];

/// Checks that no position of `root` chooses among more than `limit` properties.
pub(crate) fn check_width(root: &Value, limit: usize) -> Result<(), GrammarError> {
    let mut widths = Widths {
        root,
        own: HashMap::new(),
        deep: HashMap::new(),
    };
    let width = widths.width(root);
    within(
        "properties one position of the schema chooses among (alternatives added up)",
        width,
        limit,
    )
}

/// Memos by node; `None`: being computed (a cycle: recursion, which counts nothing).
struct Widths<'a> {
    root: &'a Value,
    own: HashMap<*const Value, Option<usize>>,
    deep: HashMap<*const Value, Option<usize>>,
}

impl<'a> Widths<'a> {
    /// The widest position in `s`: its own, or one inside it.
    fn width(&mut self, s: &'a Value) -> usize {
        let own = self.own(s);
        own.max(self.deep(s))
    }

    /// The properties `s`'s own position chooses among: its own, its `allOf` parts' and `$ref`'s,
    /// and each `anyOf`/`oneOf` alternative with those (siblings apply to every alternative).
    fn own(&mut self, s: &'a Value) -> usize {
        let Some(map) = s.as_object() else {
            return 0;
        };
        let key: *const Value = s;
        match self.own.get(&key) {
            Some(Some(w)) => return *w,
            Some(None) => return 0,
            None => {}
        }
        self.own.insert(key, None);
        let mut base = properties(map);
        for part in list(map, "allOf") {
            base = base.saturating_add(self.own(part));
        }
        if let Some(target) = self.reference(map) {
            base = base.saturating_add(self.own(target));
        }
        let alternatives: Vec<&'a Value> = list(map, "anyOf").chain(list(map, "oneOf")).collect();
        let w = if alternatives.is_empty() {
            base
        } else {
            alternatives.into_iter().fold(0usize, |sum, alt| {
                let each = ALTERNATIVE_WEIGHT
                    .saturating_add(base)
                    .saturating_add(self.own(alt));
                sum.saturating_add(each)
            })
        };
        self.own.insert(key, Some(w));
        w
    }

    /// The widest position inside `s`: the widest inner schema (a property's value, the
    /// items, ...), plus what its alternatives, parts and `$ref` have inside at the same time.
    fn deep(&mut self, s: &'a Value) -> usize {
        let Some(map) = s.as_object() else {
            return 0;
        };
        let key: *const Value = s;
        match self.deep.get(&key) {
            Some(Some(w)) => return *w,
            Some(None) => return 0,
            None => {}
        }
        self.deep.insert(key, None);
        let mut inner = 0;
        for name in ["properties", "patternProperties", "$defs", "definitions"] {
            if let Some(Value::Object(children)) = map.get(name) {
                for child in children.values() {
                    inner = inner.max(self.width(child));
                }
            }
        }
        for child in INNER_SCHEMA.iter().filter_map(|k| map.get(*k)) {
            inner = inner.max(match child {
                Value::Array(items) => items.iter().map(|i| self.width(i)).max().unwrap_or(0),
                _ => self.width(child),
            });
        }
        for child in list(map, "prefixItems") {
            inner = inner.max(self.width(child));
        }
        let mut combined = inner;
        let parts = list(map, "allOf")
            .chain(list(map, "anyOf"))
            .chain(list(map, "oneOf"));
        for part in parts.chain(self.reference(map)) {
            combined = combined.saturating_add(self.deep(part));
        }
        self.deep.insert(key, Some(combined));
        combined
    }

    fn reference(&self, map: &Map<String, Value>) -> Option<&'a Value> {
        let pointer = map.get("$ref")?.as_str()?.strip_prefix('#')?;
        self.root.pointer(pointer)
    }
}

fn properties(map: &Map<String, Value>) -> usize {
    ["properties", "patternProperties"]
        .iter()
        .filter_map(|k| map.get(*k)?.as_object())
        .map(Map::len)
        .sum()
}

fn list<'a>(map: &'a Map<String, Value>, key: &str) -> impl Iterator<Item = &'a Value> + use<'a> {
    map.get(key).and_then(Value::as_array).into_iter().flatten()
}
