//! Fuzz targets for the grammar front end, run as proptest tests in every `cargo test`:
//! `ebnf_to_lark` on GBNF and Lark soup, arbitrary text and mutated seed grammars; the limit
//! scans ([`GrammarLimits::check`]: the schema walk, the `$ref`-following depth and the width,
//! the regex and Lark scans) on arbitrary specs of every kind, under the default limits and tiny
//! ones; and [`Grammars::compile`] on small arbitrary specs over the tests' byte-level
//! vocabulary, each compiled grammar then walked a few tokens. Each must give a value or an
//! error, never panic or hang. The seeds are the files of `testdata/fuzz/`;
//! `SPECULA_FUZZ_CASES=N` runs N cases each instead of the default.

use crate::tests::{EOS, tokenizer};
use crate::{
    BareCalls, CallShape, GrammarConfig, GrammarError, GrammarLimits, GrammarSpec, Grammars,
    OptionalCalls, StructuralTag, TaggedStructure, ebnf_to_lark,
};
use fuzzing::replace_node;
use model::sampler::TokenConstraint;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;
use serde_json::{Value, json};
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// The harness.

/// Runs `test` on the cases of the strategy `make` builds (the shared harness).
fn fuzz<S, F, T>(default: u32, make: F, test: T)
where
    S: Strategy + 'static,
    F: FnOnce() -> S + Send + 'static,
    T: Fn(S::Value) -> Result<(), TestCaseError> + Send + 'static,
{
    fuzzing::Harness {
        // A compilation is bounded by its deadline (the config's two seconds, to wait and again
        // to run), the scans by the size of the spec.
        case_limit: Duration::from_secs(5),
        per_case: Duration::from_millis(50),
        ..fuzzing::DEFAULT
    }
    .run(default, make, test)
}

/// The seed files of this target's folder, in name order.
fn seeds(dir: &str) -> Vec<Vec<u8>> {
    fuzzing::seeds(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/fuzz")
            .join(dir),
    )
}

/// The seed texts, edited: bytes flipped or set, `PIECES` inserted, ranges deleted or repeated,
/// the end cut off (as text: broken UTF-8 is replaced).
fn mutated_text(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = String> {
    let with = fuzzing::Mutations {
        tokens: PIECES,
        splice: false,
        huge: &[],
    };
    fuzzing::mutated(seeds, with).prop_map(|b| String::from_utf8_lossy(&b.0).into_owned())
}

// ---------------------------------------------------------------------------------------------
// Specs.

/// Pieces of GBNF, Lark and regexes.
const PIECES: &[&str] = &[
    "root",
    "start",
    "x",
    "X",
    " ::= ",
    ": ",
    "::",
    "\"a\"",
    "\"\\\"\"",
    "\"\\u00e9\"",
    "\"",
    "[a-z]",
    "[^\\]]",
    "[",
    "]",
    ".",
    "(",
    ")",
    "|",
    "*",
    "+",
    "?",
    "{2,3}",
    "{99999}",
    "{",
    "}",
    "{,}",
    "\n",
    "# c\n",
    "// c\n",
    "%json {\"type\": \"integer\"}",
    "%json",
    "%regex {}",
    "%ignore",
    "/a+/",
    "/",
    "/\\/",
    "<[1]>",
    "<",
    "é",
    "\\",
    "\\p{L}",
    "(?i)",
    "^",
    "$",
    "-",
    "_",
    "!",
    "@",
    "0",
    " ",
];

/// Grammar-like text: the pieces in random order, or any text.
fn text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        5 => select(PIECES).prop_map(str::to_string),
        1 => "\\PC{0,4}",
    ];
    prop_oneof![
        4 => vec(piece, 0..24).prop_map(|p| p.concat()),
        1 => "\\PC{0,32}",
        3 => mutated_text(seeds("text")),
    ]
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        (-2i64..5).prop_map(Value::from),
        select(
            &[
                "string", "integer", "object", "array", "null", "", "#", "a", "é"
            ][..]
        )
        .prop_map(Value::from),
    ]
}

/// JSON schemas: every keyword the scans read, `$ref`s that resolve, loop or do not.
fn schema() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        select(
            &[
                "string", "integer", "number", "boolean", "null", "object", "array"
            ][..]
        )
        .prop_map(|t| json!({"type": t})),
        select(
            &[
                "#",
                "#/$defs/a",
                "#/$defs/b",
                "#/properties/x",
                "#/nope",
                "#/$defs/a/items",
                "x.json"
            ][..]
        )
        .prop_map(|r| json!({"$ref": r})),
        vec(scalar(), 0..4).prop_map(|e| json!({"enum": e})),
        scalar().prop_map(|c| json!({"const": c})),
        text().prop_map(|p| json!({"type": "string", "pattern": p})),
        (any::<i32>(), any::<i32>())
            .prop_map(|(a, b)| json!({"minLength": a, "maxItems": b, "minimum": a})),
        any::<bool>().prop_map(Value::Bool),
        scalar(),
    ];
    leaf.prop_recursive(5, 48, 5, |inner| {
        let named = vec((select(&["x", "a", "b", "é", ""][..]), inner.clone()), 0..4)
            .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.into(), v)).collect()));
        let list = vec(inner.clone(), 0..4).prop_map(Value::Array);
        let keyword = select(
            &[
                "anyOf",
                "oneOf",
                "allOf",
                "prefixItems",
                "items",
                "additionalProperties",
                "not",
                "if",
                "then",
                "contains",
                "properties",
                "patternProperties",
                "$defs",
                "definitions",
                "dependentSchemas",
                "x-guidance",
                "required",
            ][..],
        );
        let pairs = vec((keyword, prop_oneof![inner.clone(), named, list]), 1..4);
        pairs.prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.into(), v)).collect()))
    })
    .boxed()
}

fn tag() -> impl Strategy<Value = String> {
    prop_oneof![
        select(&["<f>", "<function=", "</f>", "<tool_call>", "", "\u{0}"][..])
            .prop_map(str::to_string),
        "\\PC{0,6}",
    ]
}

fn call_shape() -> impl Strategy<Value = CallShape> {
    (tag(), schema(), tag()).prop_map(|(before, parameters, after)| CallShape {
        before,
        parameters,
        after,
    })
}

/// Specs of every kind.
fn spec() -> impl Strategy<Value = GrammarSpec> {
    let bare = (
        select(&["arguments", "parameters", ""][..]),
        proptest::option::of(select(&[";", ","][..])),
        vec((select(&["f", "g", ""][..]), schema()), 0..3),
    )
        .prop_map(|(key, separator, functions)| BareCalls {
            key: key.into(),
            separator: separator.map(str::to_string),
            functions: functions.into_iter().map(|(n, s)| (n.into(), s)).collect(),
        });
    let optional = (
        proptest::option::of(tag()),
        vec(call_shape(), 0..3),
        proptest::option::of(bare),
        any::<bool>(),
        proptest::option::of(schema()),
    )
        .prop_map(|(trigger, calls, bare, parallel, answer)| OptionalCalls {
            trigger,
            calls,
            bare,
            parallel,
            answer,
        });
    let structure = (tag(), schema(), tag()).prop_map(|(begin, schema, end)| TaggedStructure {
        begin,
        schema,
        end,
    });
    let structural =
        (vec(tag(), 0..3), vec(structure, 0..3)).prop_map(|(triggers, structures)| StructuralTag {
            triggers,
            structures,
        });
    let schemas = prop_oneof![
        3 => schema(),
        1 => schema_seeds(),
    ];
    prop_oneof![
        3 => schemas.prop_map(GrammarSpec::JsonSchema),
        1 => Just(GrammarSpec::JsonObject),
        2 => text().prop_map(GrammarSpec::Regex),
        3 => text().prop_map(|t| GrammarSpec::Lark(ebnf_to_lark(&t).unwrap_or(t))),
        1 => vec(call_shape(), 0..3).prop_map(GrammarSpec::ToolCall),
        1 => optional.prop_map(GrammarSpec::OptionalToolCalls),
        1 => structural.prop_map(GrammarSpec::StructuralTag),
    ]
}

/// The seed schemas, with one node replaced by a random schema.
fn schema_seeds() -> impl Strategy<Value = Value> {
    let seeds: Vec<Value> = seeds("schema")
        .iter()
        .map(|s| serde_json::from_slice(s).expect("a seed schema is JSON"))
        .collect();
    let n = seeds.len();
    (0..n, any::<usize>(), schema()).prop_map(move |(i, at, new)| {
        let mut v = seeds[i].clone();
        replace_node(&mut v, at, new);
        v
    })
}

/// Limits small enough that random specs pass each of them.
fn tiny_limits() -> GrammarLimits {
    GrammarLimits {
        max_schema_bytes: 300,
        max_schema_depth: 6,
        max_object_properties: 3,
        max_schema_width: 6,
        max_total_properties: 8,
        max_property_name_bytes: 10,
        max_definitions: 2,
        max_refs: 2,
        max_enum_values: 2,
        max_total_enum_values: 3,
        max_alternatives: 2,
        max_pattern_bytes: 8,
        max_regex_bytes: 16,
        max_repetition_expansion: 20,
        max_grammar_bytes: 64,
        max_grammar_depth: 2,
        max_grammar_rules: 3,
        max_grammar_alternatives: 3,
        max_structures: 1,
        max_triggers: 1,
        max_tag_bytes: 4,
        max_tools: 1,
        ..GrammarLimits::default()
    }
}

/// A refusal names what is wrong: invalid, or past a limit.
fn refusal(e: &GrammarError) -> Result<(), TestCaseError> {
    prop_assert!(
        matches!(e, GrammarError::Invalid(_) | GrammarError::Limit { .. }),
        "{:?}",
        e
    );
    prop_assert!(!e.to_string().is_empty());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The targets.

#[test]
fn fuzz_ebnf_to_lark() {
    fuzz(2000, text, |text| {
        match ebnf_to_lark(&text) {
            Ok(lark) => {
                if !text.contains("::=") {
                    prop_assert_eq!(&lark, &text);
                }
                for limits in [GrammarLimits::default(), tiny_limits()] {
                    if let Err(e) = limits.check(&GrammarSpec::Lark(lark.clone())) {
                        refusal(&e)?;
                    }
                }
            }
            Err(e) => refusal(&e)?,
        }
        Ok(())
    });
}

#[test]
fn fuzz_grammar_limits() {
    fuzz(2000, spec, |spec| {
        for limits in [GrammarLimits::default(), tiny_limits()] {
            if let Err(e) = limits.check(&spec) {
                refusal(&e)?;
            }
        }
        Ok(())
    });
}

/// Compiles `spec` and walks the grammar a few tokens (one allowed by each mask, picked by
/// `n`), checking drafts and forced tokens on the way.
fn compile_and_walk(
    g: &Grammars,
    vocab: usize,
    spec: &GrammarSpec,
    n: usize,
) -> Result<(), TestCaseError> {
    let mut grammar = match g.compile(spec) {
        Ok(grammar) => grammar,
        Err(e @ (GrammarError::Deadline(_) | GrammarError::Panicked(_))) => {
            // Costly or broken specs are the request's fault, answered as such.
            prop_assert!(!e.to_string().is_empty());
            return Ok(());
        }
        Err(e) => return refusal(&e),
    };
    for step in 0..8 {
        let mut logits = vec![0.0f32; vocab];
        grammar.mask(&mut logits);
        let allowed: Vec<u32> = (0..vocab as u32)
            .filter(|&t| logits[t as usize].is_finite())
            .collect();
        prop_assert!(!allowed.is_empty(), "the mask left no token");
        let _ = grammar.valid_prefix(&[allowed[0], EOS, allowed[(n + step) % allowed.len()]]);
        let _ = grammar.forced();
        let t = allowed[(n.wrapping_mul(7) + step) % allowed.len()];
        if t == EOS || grammar.failure().is_some() {
            break;
        }
        grammar.advance(t);
    }
    Ok(())
}

#[test]
fn fuzz_grammar_compile() {
    fuzz(
        300,
        || (spec(), any::<usize>()),
        |(spec, n)| {
            thread_local! {
                static GRAMMARS: (Grammars, usize) = {
                    let tok = tokenizer();
                    let config = GrammarConfig {
                        deadline: Duration::from_secs(2),
                        ..GrammarConfig::default()
                    };
                    let vocab = tok.vocab_size();
                    let g = Grammars::with_config(tok, &[EOS], config).expect("grammars");
                    (g, vocab)
                };
            }
            GRAMMARS.with(|(g, vocab)| compile_and_walk(g, *vocab, &spec, n))
        },
    );
}

#[test]
fn the_seeds_are_what_they_say() {
    for seed in seeds("schema") {
        let schema: Value = serde_json::from_slice(&seed).unwrap();
        let _ = GrammarLimits::default().check(&GrammarSpec::JsonSchema(schema));
    }
    for name in ["json.gbnf", "arithmetic.gbnf", "chain.gbnf"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/fuzz/text")
            .join(name);
        let text = std::fs::read_to_string(path).unwrap();
        let lark = ebnf_to_lark(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        GrammarLimits::default()
            .check(&GrammarSpec::Lark(lark))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
