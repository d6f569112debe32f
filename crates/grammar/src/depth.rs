//! How deep a schema nests with its `$ref`s followed, as llguidance compiles it: depth first,
//! each definition once (a reference back into one being compiled is recursion, which the
//! grammar keeps as a rule, not as depth). Computed with explicit stacks, each referenced
//! schema walked once.

use crate::GrammarError;
use crate::limits::within;
use serde_json::Value;
use std::collections::HashMap;

/// A schema being walked: what it is, what is left of it, and its deepest level so far.
struct Frame<'a> {
    target: *const Value,
    work: Vec<Item<'a>>,
    deepest: usize,
}

/// A value at a depth; `seen`: its children are already in the work list (it waits for the
/// schema its `$ref` points to).
struct Item<'a> {
    value: &'a Value,
    depth: usize,
    seen: bool,
}

enum Known {
    Walking,
    Depth(usize),
}

/// Checks that `root`, its `$ref`s (`#...` pointers into it) followed, nests at most `limit`
/// levels of objects and arrays (each `$ref` followed is a level too).
pub(crate) fn check_expanded_depth(root: &Value, limit: usize) -> Result<(), GrammarError> {
    const WHAT: &str = "nesting depth of the schema, its $refs followed";
    let mut known: HashMap<*const Value, Known> = HashMap::new();
    known.insert(root, Known::Walking);
    let mut frames = vec![frame(root)];
    while let Some(top) = frames.last_mut() {
        let Some(item) = top.work.pop() else {
            // The parent's `$ref` item is back on its list and reads this depth next.
            if let Some(done) = frames.pop() {
                known.insert(done.target, Known::Depth(done.deepest));
            }
            continue;
        };
        if !item.seen {
            top.deepest = top.deepest.max(item.depth);
            within(WHAT, top.deepest, limit)?;
            push_children(&mut top.work, item.value, item.depth);
        }
        let Some(target) = reference(root, item.value) else {
            continue;
        };
        match known.get(&(target as *const Value)) {
            Some(Known::Depth(d)) => {
                // A `$ref` is a level of its own (llguidance recurses through it).
                top.deepest = top.deepest.max(item.depth + d);
                within(WHAT, top.deepest, limit)?;
            }
            Some(Known::Walking) => {}
            None => {
                top.work.push(Item { seen: true, ..item });
                known.insert(target, Known::Walking);
                frames.push(frame(target));
            }
        }
    }
    Ok(())
}

fn frame(target: &Value) -> Frame<'_> {
    Frame {
        target,
        work: vec![Item {
            value: target,
            depth: 1,
            seen: false,
        }],
        deepest: 0,
    }
}

fn push_children<'a>(work: &mut Vec<Item<'a>>, value: &'a Value, depth: usize) {
    let item = |value| Item {
        value,
        depth: depth + 1,
        seen: false,
    };
    match value {
        Value::Object(map) => work.extend(map.values().map(item)),
        Value::Array(items) => work.extend(items.iter().map(item)),
        _ => {}
    }
}

/// The schema a value's `$ref` points to inside `root` (`#` and JSON pointers after it); `None`
/// for no `$ref`, or one that does not resolve here (llguidance refuses those).
fn reference<'a>(root: &'a Value, value: &Value) -> Option<&'a Value> {
    let pointer = value.get("$ref")?.as_str()?.strip_prefix('#')?;
    root.pointer(pointer)
}
