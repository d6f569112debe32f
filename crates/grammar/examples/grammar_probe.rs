//! Measures what a spec costs to compile and mask against a real model's vocabulary (the
//! numbers behind `src/limits.rs`): `cargo run --release -p grammar --example grammar_probe --
//! MODEL.gguf CASE SIZE [PREFIX]`. Compiles on the pool (the default config, changed by the
//! `PROBE_*` variables of [`config`]), then masks at the start and after each token of `PREFIX`
//! (default `{"`) on a thread of `PROBE_WALK_STACK_MB` (default 2, the engine's) and prints
//! each mask's time, the failure if any, and the peak RSS. `PROBE_TWICE=1` walks again from the
//! cache; `PROBE_CACHE=K` instead compiles K variants into the cache and prints the resident
//! memory each added.
//!
//! Cases (SIZE is `n`): rrec / rrecnest (a right-recursive chain of n rules, the second with
//! `PROBE_PARENS` groups in each), alts (n alternatives), regex (n random words), rx / lark /
//! schema (`PROBE_RX` / `PROBE_LARK` / `PROBE_SCHEMA` as given), larkrep / larknestrep / rxrep
//! (counted repetitions of n, nested), tool / tags / triggers (a forced call of n properties,
//! n structures of `PROBE_EACH` properties, n triggers of `PROBE_LEN` bytes), refs / refnest /
//! refdeep (chains of n `$defs`, flat, through a property, 15 levels each), props / reqprops
//! (n optional / required properties), enum / enums (n values, n enums of 1,000 in an anyOf),
//! nest / anyofnest / allofnest (n levels), bytes (n bytes of descriptions), pydantic (n
//! fields over 6 levels), anyof (n alternatives of `PROBE_EACH` properties), allof (n parts of
//! 10 alternatives), maxlen / minitems / range (bounds of n).

use grammar::{CallShape, GrammarConfig, GrammarSpec, Grammars, StructuralTag, TaggedStructure};
use model::sampler::TokenConstraint;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, path, case, size, rest @ ..] = &args[..] else {
        eprintln!("usage: grammar_probe MODEL.gguf CASE SIZE [PREFIX]");
        std::process::exit(2);
    };
    let n: usize = size.parse().expect("SIZE is a number");
    let prefix = rest.first().cloned().unwrap_or_else(|| "{\"".into());
    let gguf = model::gguf::GgufFile::open(std::path::Path::new(path)).unwrap();
    let tok = Arc::new(model::tokenizer::Tokenizer::from_gguf(&gguf).unwrap());
    let spec = spec(case, n);
    let case = case.clone();
    let probe = move || {
        let g = Grammars::with_config(tok.clone(), tok.eog_ids(), config()).unwrap();
        if let Some(k) = std::env::var("PROBE_CACHE")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
        {
            cache_growth(&g, &spec, k);
            return;
        }
        let t = Instant::now();
        let result = g.compile(&spec);
        let compiled = t.elapsed();
        match result {
            Err(e) => println!("{case} {n}: error after {compiled:.2?}: {e}"),
            Ok(mut grammar) => {
                println!("{case} {n}: compiled in {compiled:.2?}");
                walk(&mut grammar, &tok, &prefix);
                if std::env::var("PROBE_TWICE").is_ok() {
                    println!("again, from the cache:");
                    walk(&mut g.compile(&spec).unwrap(), &tok, &prefix);
                }
            }
        }
        println!("peak RSS {} MB", peak_rss_mb());
    };
    // Masks are computed on the engine's thread, whose stack is the default 2 MiB.
    let walk_stack = std::env::var("PROBE_WALK_STACK_MB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(2);
    std::thread::Builder::new()
        .stack_size(walk_stack << 20)
        .spawn(probe)
        .unwrap()
        .join()
        .unwrap();
}

/// The default config, changed by the environment: `PROBE_NOLIMITS=1` lifts our own limits
/// (not llguidance's), `PROBE_ITEMS`, `PROBE_STEP_ITEMS` and `PROBE_LEXER_STATES` set
/// llguidance's, `PROBE_STACK_MB` the compile threads' stack.
fn config() -> GrammarConfig {
    let var = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
    };
    let mut config = GrammarConfig::default();
    if var("PROBE_NOLIMITS") == Some(1) {
        let l = &mut config.limits;
        for field in [
            &mut l.max_schema_bytes,
            &mut l.max_schema_depth,
            &mut l.max_object_properties,
            &mut l.max_schema_width,
            &mut l.max_total_properties,
            &mut l.max_property_name_bytes,
            &mut l.max_definitions,
            &mut l.max_refs,
            &mut l.max_enum_values,
            &mut l.max_total_enum_values,
            &mut l.max_alternatives,
            &mut l.max_pattern_bytes,
            &mut l.max_regex_bytes,
            &mut l.max_repetition_expansion,
            &mut l.max_grammar_bytes,
            &mut l.max_grammar_depth,
            &mut l.max_grammar_rules,
            &mut l.max_grammar_alternatives,
            &mut l.max_structures,
            &mut l.max_triggers,
            &mut l.max_tag_bytes,
            &mut l.max_tools,
        ] {
            *field = usize::MAX;
        }
    }
    if let Some(n) = var("PROBE_ITEMS") {
        config.limits.max_items_in_row = n;
    }
    if let Some(n) = var("PROBE_STEP_ITEMS") {
        config.limits.step_max_items = n;
    }
    if let Some(n) = var("PROBE_LEXER_STATES") {
        config.limits.max_lexer_states = n;
    }
    if let Some(n) = var("PROBE_STACK_MB") {
        config.stack_bytes = n << 20;
    }
    config.deadline = std::time::Duration::from_secs(60);
    config
}

/// Masks at the start, then after each token of `prefix`.
fn walk(grammar: &mut grammar::Grammar, tok: &model::tokenizer::Tokenizer, prefix: &str) {
    let ids = tok.encode(prefix, false, false).unwrap();
    let mut logits = vec![0.0; tok.vocab_size()];
    for step in 0..=ids.len() {
        let t = Instant::now();
        logits.fill(0.0);
        grammar.mask(&mut logits);
        let allowed = logits.iter().filter(|l| l.is_finite()).count();
        let next = ids.get(step).map(|&id| {
            String::from_utf8_lossy(&tok.decode_bytes(&[id], false).unwrap()).into_owned()
        });
        println!(
            "  mask {step}: {:.2?}, {allowed} allowed, next {next:?}, failure {:?}",
            t.elapsed(),
            grammar.failure()
        );
        if let Some(&id) = ids.get(step) {
            grammar.advance(id);
        }
    }
}

/// Compiles `k` variants of `spec` into the cache; prints the resident memory each added, over
/// the bytes of its spec.
fn cache_growth(g: &Grammars, spec: &GrammarSpec, k: usize) {
    let variant = |i: usize| match spec {
        GrammarSpec::JsonSchema(s) => {
            let mut s = s.clone();
            s["properties"][format!("variant_{i}")] = json!({"type": "integer"});
            GrammarSpec::JsonSchema(s)
        }
        GrammarSpec::Regex(rx) => GrammarSpec::Regex(format!("{rx}|variant{i}")),
        GrammarSpec::Lark(l) => GrammarSpec::Lark(format!("{l}\nextra{i}: \"v{i}\"\n")),
        GrammarSpec::StructuralTag(t) => {
            let mut t = t.clone();
            t.triggers.push(format!("<variant{i}"));
            GrammarSpec::StructuralTag(t)
        }
        other => other.clone(),
    };
    let bytes = match variant(0) {
        GrammarSpec::JsonSchema(s) => s.to_string().len(),
        GrammarSpec::Regex(rx) => rx.len(),
        GrammarSpec::Lark(l) => l.len(),
        GrammarSpec::StructuralTag(t) => t
            .structures
            .iter()
            .map(|s| s.schema.to_string().len() + s.begin.len() + s.end.len())
            .sum(),
        _ => 0,
    };
    drop(g.compile(&variant(k + 1)));
    let before = rss_kb();
    for i in 0..k {
        if let Err(e) = g.compile(&variant(i)) {
            println!("error: {e}");
            return;
        }
    }
    let per = (rss_kb() - before) as f64 * 1024.0 / k as f64;
    let (n, est) = g.cached();
    println!(
        "{k} grammars of {bytes} spec bytes: {:.0} kB resident each, {:.1}x the spec; cached {n}, estimated {} kB each",
        per / 1024.0,
        per / bytes as f64,
        est / n.max(1) / 1024
    );
}

fn rss_kb() -> i64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        .unwrap_or(0)
}

fn peak_rss_mb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024)
}

fn props(n: usize, required: bool) -> Value {
    let properties: serde_json::Map<String, Value> = (0..n)
        .map(|i| (format!("field_{i}"), json!({"type": "string"})))
        .collect();
    let names: Vec<String> = (0..n).map(|i| format!("field_{i}")).collect();
    let mut schema = json!({"type": "object", "properties": properties});
    if required {
        schema["required"] = json!(names);
        schema["additionalProperties"] = json!(false);
    }
    schema
}

/// GBNF in its Lark form (converted past the size limit too, for probing).
fn ebnf(gbnf: &str) -> String {
    match grammar::ebnf_to_lark(gbnf) {
        Ok(lark) => lark,
        Err(e) => {
            println!("ebnf_to_lark: {e}");
            gbnf.replace("root ::=", "start:").replace("::=", ":")
        }
    }
}

fn props_named(n: usize, prefix: &str) -> Value {
    let properties: serde_json::Map<String, Value> = (0..n)
        .map(|i| (format!("{prefix}{i}"), json!({"type": "string"})))
        .collect();
    json!({"type": "object", "properties": properties})
}

/// The spec of a case (see the module).
fn spec(case: &str, n: usize) -> GrammarSpec {
    if [
        "rrec",
        "alts",
        "rrecnest",
        "rx",
        "lark",
        "larkrep",
        "larknestrep",
        "rxrep",
        "regex",
    ]
    .contains(&case)
    {
        return grammar_case(case, n);
    }
    if ["tool", "tags", "triggers"].contains(&case) {
        return tagged_case(case, n);
    }
    if [
        "anyofnest",
        "allofnest",
        "refdeep",
        "schema",
        "maxlen",
        "minitems",
        "range",
        "allof",
        "anyof",
    ]
    .contains(&case)
    {
        return combinator_case(case, n);
    }
    schema_case(case, n)
}

/// Grammars and regexes.
fn grammar_case(case: &str, n: usize) -> GrammarSpec {
    match case {
        "rrec" => {
            let mut g = String::from("root ::= r0\n");
            for i in 0..n {
                g.push_str(&format!("r{i} ::= \"a\" r{}\n", i + 1));
            }
            g.push_str(&format!("r{n} ::= \"a\"\n"));
            GrammarSpec::Lark(ebnf(&g))
        }
        "alts" => {
            let alts: Vec<String> = (0..n).map(|i| format!("\"a{i}\"")).collect();
            GrammarSpec::Lark(ebnf(&format!("root ::= {}\n", alts.join(" | "))))
        }
        "regex" => {
            let mut seed = 7u64;
            let words: Vec<String> = (0..n)
                .map(|_| {
                    (0..8)
                        .map(|_| {
                            seed = model::sampler::splitmix64(seed);
                            (b'a' + (seed % 26) as u8) as char
                        })
                        .collect()
                })
                .collect();
            GrammarSpec::Regex(words.join("|"))
        }
        "rrecnest" => {
            let depth: usize = std::env::var("PROBE_PARENS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(40);
            let (open, close) = ("(".repeat(depth), ")".repeat(depth));
            let mut g = String::from("start: r0\n");
            for i in 0..n {
                g.push_str(&format!("r{i}: {open}\"a\" r{}{close}\n", i + 1));
            }
            g.push_str(&format!("r{n}: \"a\"\n"));
            GrammarSpec::Lark(g)
        }
        "rx" => GrammarSpec::Regex(std::env::var("PROBE_RX").unwrap_or_default()),
        "lark" => GrammarSpec::Lark(std::env::var("PROBE_LARK").unwrap_or_default()),
        "larkrep" => GrammarSpec::Lark(format!("start: \"a\"{{0,{n}}}")),
        "larknestrep" => GrammarSpec::Lark(format!("start: ((\"a\"{{{n}}}){{{n}}}){{{n}}}")),
        "rxrep" => GrammarSpec::Regex(format!("((a{{{n}}}){{{n}}}){{{n}}}")),
        other => panic!("unknown case {other}"),
    }
}

/// Tool calls and structural tags.
fn tagged_case(case: &str, n: usize) -> GrammarSpec {
    match case {
        "tool" => GrammarSpec::ToolCall(vec![CallShape {
            before: String::new(),
            parameters: props(n, false),
            after: String::new(),
        }]),
        "tags" => {
            let each = std::env::var("PROBE_EACH")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(8);
            GrammarSpec::StructuralTag(StructuralTag {
                triggers: vec!["<function=".into()],
                structures: (0..n)
                    .map(|i| TaggedStructure {
                        begin: format!("<function=f{i}>"),
                        schema: props_named(each, &format!("s{i}_")),
                        end: "</function>".into(),
                    })
                    .collect(),
            })
        }
        "triggers" => {
            // `n` triggers of PROBE_LEN bytes, a structure each.
            let len = std::env::var("PROBE_LEN")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(16);
            let triggers: Vec<String> = (0..n)
                .map(|i| format!("<{i:0>width$}", width = len - 1))
                .collect();
            GrammarSpec::StructuralTag(StructuralTag {
                structures: triggers
                    .iter()
                    .map(|t| TaggedStructure {
                        begin: t.clone(),
                        schema: props(4, false),
                        end: "</f>".into(),
                    })
                    .collect(),
                triggers,
            })
        }
        other => panic!("unknown case {other}"),
    }
}

/// Schemas of combinators, references and bounds.
fn combinator_case(case: &str, n: usize) -> GrammarSpec {
    match case {
        "anyofnest" => {
            let mut schema = json!({"type": "string"});
            for _ in 0..n {
                schema = json!({"anyOf": [schema, {"type": "null"}]});
            }
            GrammarSpec::JsonSchema(schema)
        }
        "allofnest" => {
            let mut schema = json!({"type": "object", "properties": {"a": {"type": "string"}}});
            for i in 0..n {
                schema = json!({"allOf": [schema, {"type": "object", "properties": {format!("p{i}"): {"type": "integer"}}}]});
            }
            GrammarSpec::JsonSchema(schema)
        }
        "refdeep" => {
            // Each definition nests 30 levels inline before referring to the next.
            let mut defs = serde_json::Map::new();
            for i in 0..n {
                let mut inner = json!({"$ref": format!("#/$defs/def{}", i + 1)});
                for _ in 0..15 {
                    inner = json!({"type": "object", "properties": {"x": inner}});
                }
                defs.insert(format!("def{i}"), inner);
            }
            defs.insert(format!("def{n}"), json!({"type": "string"}));
            GrammarSpec::JsonSchema(json!({"$ref": "#/$defs/def0", "$defs": defs}))
        }
        "schema" => GrammarSpec::JsonSchema(
            serde_json::from_str(&std::env::var("PROBE_SCHEMA").unwrap_or_default()).unwrap(),
        ),
        "maxlen" => {
            GrammarSpec::JsonSchema(json!({"type": "string", "maxLength": n, "minLength": n / 2}))
        }
        "minitems" => GrammarSpec::JsonSchema(
            json!({"type": "array", "items": {"type": "integer"}, "minItems": n, "maxItems": n}),
        ),
        "range" => {
            GrammarSpec::JsonSchema(json!({"type": "integer", "minimum": 123456789, "maximum": n}))
        }
        "allof" => {
            let parts: Vec<Value> = (0..n)
                .map(|k| {
                    let alts: Vec<Value> = (0..10)
                        .map(|j| json!({"type": "object", "properties": {format!("k{k}"): {"const": j}}, "required": [format!("k{k}")]}))
                        .collect();
                    json!({"anyOf": alts})
                })
                .collect();
            GrammarSpec::JsonSchema(json!({"allOf": parts}))
        }
        "anyof" => {
            let each = std::env::var("PROBE_EACH")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(20);
            let alts: Vec<Value> = (0..n)
                .map(|i| props_named(each, &format!("a{i}_")))
                .collect();
            GrammarSpec::JsonSchema(json!({"anyOf": alts}))
        }
        other => panic!("unknown case {other}"),
    }
}

/// Schemas of many properties, definitions, values or bytes.
fn schema_case(case: &str, n: usize) -> GrammarSpec {
    match case {
        "refs" => {
            let mut defs = serde_json::Map::new();
            for i in 0..n {
                defs.insert(
                    format!("def{i}"),
                    json!({"$ref": format!("#/$defs/def{}", i + 1)}),
                );
            }
            defs.insert(format!("def{n}"), json!({"type": "object"}));
            GrammarSpec::JsonSchema(json!({"$ref": "#/$defs/def0", "$defs": defs}))
        }
        "refnest" => {
            let mut defs = serde_json::Map::new();
            for i in 0..n {
                let next = format!("#/$defs/def{}", i + 1);
                defs.insert(
                    format!("def{i}"),
                    json!({"type": "object", "properties": {"x": {"$ref": next}}}),
                );
            }
            defs.insert(format!("def{n}"), json!({"type": "string"}));
            GrammarSpec::JsonSchema(json!({"$ref": "#/$defs/def0", "$defs": defs}))
        }
        "props" => GrammarSpec::JsonSchema(props(n, false)),
        "reqprops" => GrammarSpec::JsonSchema(props(n, true)),
        "enums" => {
            // anyOf of `n` enums of 1,000 values each, all starting alike.
            let alts: Vec<Value> = (0..n)
                .map(|k| {
                    let values: Vec<String> = (0..1000).map(|i| format!("v{i}_{k}")).collect();
                    json!({"enum": values})
                })
                .collect();
            GrammarSpec::JsonSchema(json!({"type": "object", "properties": {"e": {"anyOf": alts}}}))
        }
        "enum" => {
            let values: Vec<String> = (0..n).map(|i| format!("value number {i}")).collect();
            GrammarSpec::JsonSchema(
                json!({"type": "object", "properties": {"e": {"enum": values}}}),
            )
        }
        "nest" => {
            let mut schema = json!({"type": "string"});
            for _ in 0..n {
                schema = json!({"type": "object", "properties": {"x": schema}, "required": ["x"]});
            }
            GrammarSpec::JsonSchema(schema)
        }
        "bytes" => {
            let mut schema = props(100, false);
            let each = n / 100;
            for (_, p) in schema["properties"].as_object_mut().unwrap().iter_mut() {
                p["description"] = json!("d".repeat(each));
            }
            GrammarSpec::JsonSchema(schema)
        }
        "pydantic" => GrammarSpec::JsonSchema(pydantic(n)),
        other => panic!("unknown case {other}"),
    }
}

/// `n` properties of mixed kinds, spread over objects nested 6 deep, 50-value enums.
fn pydantic(n: usize) -> Value {
    let values: Vec<String> = (0..50).map(|i| format!("kind_{i}")).collect();
    let leaf = |i: usize| match i % 5 {
        0 => json!({"type": "string", "maxLength": 40}),
        1 => json!({"type": "integer", "minimum": 0}),
        2 => json!({"enum": values}),
        3 => json!({"type": "array", "items": {"type": "number"}, "maxItems": 4}),
        _ => json!({"anyOf": [{"type": "string"}, {"type": "null"}]}),
    };
    let per_level = n / 6;
    let mut inner = Value::Null;
    for level in (0..6).rev() {
        let mut properties = serde_json::Map::new();
        for i in 0..per_level {
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
