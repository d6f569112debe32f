//! The specs that crashed or exhausted the server (issue 43), replayed on the tests' tiny
//! vocabulary: each is now an error naming the limit it passes, or compiles and masks off the
//! caller's stack; a large realistic schema still compiles and its walks end valid.

use crate::tests::{EOS, grammars, tokenizer, walk};
use crate::{
    BareCalls, CallShape, GrammarConfig, GrammarError, GrammarSpec, Grammars, OptionalCalls,
    StructuralTag, TaggedStructure, ebnf_to_lark,
};
use model::sampler::TokenConstraint;
use serde_json::{Map, Value, json};

/// The limit `spec` passes, by its description (and a message that names it).
fn limit_of(g: &Grammars, spec: &GrammarSpec) -> &'static str {
    match g.compile(spec) {
        Err(e @ GrammarError::Limit { what, .. }) => {
            assert!(e.to_string().contains("over the limit of"), "{e}");
            what
        }
        other => panic!("expected a limit, got {other:?}"),
    }
}

fn object(n: usize, prefix: &str) -> Value {
    let properties: Map<String, Value> = (0..n)
        .map(|i| (format!("{prefix}{i}"), json!({"type": "integer"})))
        .collect();
    json!({"type": "object", "properties": properties})
}

fn right_recursive_gbnf(rules: usize) -> String {
    let mut g = String::from("root ::= r0\n");
    for i in 0..rules {
        g.push_str(&format!("r{i} ::= \"a\" r{}\n", i + 1));
    }
    g.push_str(&format!("r{rules} ::= \"a\"\n"));
    g
}

#[test]
fn a_right_recursive_grammar_compiles_off_the_callers_stack_or_is_refused() {
    let (g, tok) = grammars();
    // 998 rules and `root`: the most allowed. It needs more than this test thread's 2 MiB of
    // stack to compile (800 overflowed a tokio blocking thread's).
    let spec = GrammarSpec::Lark(ebnf_to_lark(&right_recursive_gbnf(997)).unwrap());
    let mut grammar = g.compile(&spec).unwrap();
    let mut ids = tok.encode(&"a".repeat(998), false, false).unwrap();
    ids.push(EOS);
    // Masks run on the caller's (the engine's) small stack.
    assert_eq!(grammar.valid_prefix(&ids), ids.len());
    let too_many = GrammarSpec::Lark(ebnf_to_lark(&right_recursive_gbnf(1000)).unwrap());
    assert_eq!(limit_of(&g, &too_many), "rules of the grammar");
}

#[test]
fn a_chain_of_refs_is_refused_by_its_depth_and_recursion_is_not_depth() {
    let (g, tok) = grammars();
    for nested in [false, true] {
        let mut defs = Map::new();
        for i in 0..300 {
            let next = json!({"$ref": format!("#/$defs/def{}", i + 1)});
            let def = match nested {
                false => next,
                true => json!({"type": "object", "properties": {"x": next}}),
            };
            defs.insert(format!("def{i}"), def);
        }
        defs.insert("def300".into(), json!({"type": "integer"}));
        let spec = GrammarSpec::JsonSchema(json!({"$ref": "#/$defs/def0", "$defs": defs}));
        assert_eq!(
            limit_of(&g, &spec),
            "nesting depth of the schema, its $refs followed"
        );
    }
    let tree = json!({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
        "properties": {"v": {"type": "integer", "maximum": 9},
            "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["v"], "additionalProperties": false}}});
    let spec = GrammarSpec::JsonSchema(tree.clone());
    let validator = jsonschema::validator_for(&tree).unwrap();
    for seed in 0..4 {
        let text = walk(&g, &tok, &spec, seed, 2000).expect("the walk ends");
        assert!(
            validator.is_valid(&serde_json::from_str(&text).unwrap()),
            "{text}"
        );
    }
}

#[test]
fn too_many_properties_are_refused_as_a_schema_and_as_tools() {
    let (g, _) = grammars();
    let wide = object(7000, "p");
    let shape = |parameters: &Value| CallShape {
        before: "{\"name\": \"f\", \"arguments\": ".into(),
        parameters: parameters.clone(),
        after: "}".into(),
    };
    let optional = OptionalCalls {
        trigger: Some("<tool_call>".into()),
        calls: vec![shape(&wide)],
        bare: Some(BareCalls {
            key: "arguments".into(),
            separator: None,
            functions: vec![("f".into(), wide.clone())],
        }),
        parallel: false,
        answer: None,
    };
    for spec in [
        GrammarSpec::JsonSchema(wide.clone()),
        GrammarSpec::ToolCall(vec![shape(&wide)]),
        GrammarSpec::OptionalToolCalls(optional),
    ] {
        assert_eq!(limit_of(&g, &spec), "properties of one object");
    }
    // Spread over objects, they add up.
    let many: Map<String, Value> = (0..6)
        .map(|k| (format!("o{k}"), object(900, &format!("o{k}_"))))
        .collect();
    let spec = GrammarSpec::JsonSchema(json!({"type": "object", "properties": many}));
    assert_eq!(limit_of(&g, &spec), "properties of all objects");
    // So do the alternatives one position chooses among.
    let alternatives: Vec<Value> = (0..250).map(|k| object(1, &format!("a{k}_"))).collect();
    let spec = GrammarSpec::JsonSchema(json!({"anyOf": alternatives}));
    assert!(limit_of(&g, &spec).contains("one position"));
}

#[test]
fn an_object_of_the_most_properties_allowed_masks_inside_it() {
    let (g, tok) = grammars();
    // llguidance's default row limit failed on the second mask of 500 optional properties.
    let spec = GrammarSpec::JsonSchema(object(1000, "p_"));
    let mut grammar = g.compile(&spec).unwrap();
    let mut logits = vec![0.0; tok.vocab_size()];
    for piece in [
        "{\"",
        "p_5",
        "\": 1, \"",
        "p_7",
        "\": 23, \"p_9",
        "99\": 4}",
    ] {
        grammar.mask(&mut logits);
        assert!(logits.iter().any(|l| l.is_finite()), "before {piece:?}");
        assert_eq!(grammar.failure(), None, "before {piece:?}");
        for t in tok.encode(piece, false, false).unwrap() {
            grammar.advance(t);
        }
    }
    grammar.advance(EOS);
    assert_eq!(grammar.failure(), None);
    assert_eq!(
        limit_of(&g, &GrammarSpec::JsonSchema(object(1001, "p_"))),
        "properties of one object"
    );
}

#[test]
fn huge_specs_are_refused_by_their_bytes() {
    let (g, _) = grammars();
    let schema = json!({"type": "object", "description": "d".repeat(5 << 20)});
    assert_eq!(
        limit_of(&g, &GrammarSpec::JsonSchema(schema)),
        "bytes of the JSON schemas"
    );
    let words: Vec<String> = (0..110_000).map(|i| format!("w{i:06}")).collect();
    let spec = GrammarSpec::Regex(words.join("|"));
    assert_eq!(limit_of(&g, &spec), "bytes of the regex");
    let big = format!("root ::= {}\n", vec!["\"abcdefgh\""; 40_000].join(" "));
    match ebnf_to_lark(&big) {
        Err(GrammarError::Limit { what, .. }) => assert_eq!(what, "bytes of the grammar"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn many_alternatives_structures_and_repetitions_are_refused() {
    let (g, _) = grammars();
    let alternatives: Vec<String> = (0..10_000).map(|i| format!("\"a{i}\"")).collect();
    let gbnf = format!("root ::= {}\n", alternatives.join(" | "));
    let spec = GrammarSpec::Lark(ebnf_to_lark(&gbnf).unwrap());
    assert_eq!(limit_of(&g, &spec), "alternatives (|) of the grammar");
    let tag = |n: usize, trigger: &str| {
        GrammarSpec::StructuralTag(StructuralTag {
            triggers: vec![trigger.into()],
            structures: (0..n)
                .map(|i| TaggedStructure {
                    begin: format!("{trigger}f{i}>"),
                    schema: json!({"type": "object"}),
                    end: "</function>".into(),
                })
                .collect(),
        })
    };
    assert_eq!(
        limit_of(&g, &tag(10_000, "<function=")),
        "structures of the structural tag"
    );
    assert!(limit_of(&g, &tag(1, &"<".repeat(300))).contains("trigger"));
    g.compile(&tag(128, "<function=")).unwrap();
    let repeated = "size of a regex with its repetitions written out";
    assert_eq!(
        limit_of(&g, &GrammarSpec::Regex("((a{100}){100}){100}".into())),
        repeated
    );
    let pattern = json!({"type": "string", "pattern": "^(x{1000}){1000}$"});
    assert_eq!(limit_of(&g, &GrammarSpec::JsonSchema(pattern)), repeated);
    let terminals = GrammarSpec::Lark("start: A\nA: B{100}\nB: C{100}\nC: \"a\"{100}\n".into());
    assert_eq!(
        limit_of(&g, &terminals),
        "size of a grammar rule with its repetitions written out"
    );
}

/// `n` fields of mixed kinds over objects nested 6 deep, 50-value enums among them.
fn realistic_schema(n: usize) -> Value {
    let values: Vec<String> = (0..50).map(|i| format!("kind_{i}")).collect();
    let leaf = |i: usize| match i % 5 {
        0 => json!({"type": "string", "maxLength": 6}),
        1 => json!({"type": "integer", "minimum": 0, "maximum": 99}),
        2 => json!({"enum": values}),
        3 => json!({"type": "array", "items": {"type": "boolean"}, "maxItems": 2}),
        _ => json!({"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]}),
    };
    let mut inner = Value::Null;
    for level in (0..6).rev() {
        let mut properties = Map::new();
        for i in 0..n / 6 {
            properties.insert(format!("l{level}_f{i}"), leaf(i));
        }
        if !inner.is_null() {
            properties.insert(format!("child{level}"), inner);
        }
        let required: Vec<&String> = properties.keys().collect();
        inner = json!({"type": "object", "properties": properties, "required": required,
            "additionalProperties": false});
    }
    inner
}

#[test]
fn a_large_realistic_schema_compiles_and_its_walks_end_valid() {
    let (g, tok) = grammars();
    let schema = realistic_schema(300);
    let validator = jsonschema::validator_for(&schema).unwrap();
    let spec = GrammarSpec::JsonSchema(schema);
    for seed in 0..2 {
        let text = walk(&g, &tok, &spec, seed, 40_000).expect("the walk ends");
        let value: Value = serde_json::from_str(&text).unwrap();
        assert!(validator.is_valid(&value), "{text}");
    }
}

#[test]
fn the_cache_is_bounded_in_bytes_and_skips_large_specs() {
    let tok = tokenizer();
    let spec = |n: usize| GrammarSpec::JsonSchema(object(n, "q"));
    // Room for one grammar of this size, not two.
    let one = crate::estimated_bytes(spec_bytes(&object(40, "q")));
    let config = GrammarConfig {
        cache_bytes: one + one / 2,
        ..GrammarConfig::default()
    };
    let g = Grammars::with_config(tok.clone(), &[EOS], config).unwrap();
    g.compile(&spec(40)).unwrap();
    g.compile(&spec(41)).unwrap();
    let (kept, bytes) = g.cached();
    assert_eq!(kept, 1);
    assert!(bytes <= one + one / 2, "{bytes}");
    let config = GrammarConfig {
        max_cached_spec_bytes: 100,
        ..GrammarConfig::default()
    };
    let g = Grammars::with_config(tok, &[EOS], config).unwrap();
    g.compile(&spec(40)).unwrap();
    assert_eq!(g.cached(), (0, 0));
}

/// The bytes of a JSON schema's cache key.
fn spec_bytes(schema: &Value) -> usize {
    "json_schema\u{0}".len() + schema.to_string().len()
}
