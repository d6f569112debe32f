//! The grammars on a tiny byte-level vocabulary (every byte a token, a few merged pieces and two
//! control tokens): random walks under the masks always end in output of the language, control
//! tokens are never text, drafts are checked without moving the grammar, and bad specs fail at
//! compile time with the reason.

use crate::{GrammarError, GrammarSpec, Grammars};
use model::gguf::GgufFile;
use model::gguf::MetaValue;
use model::gguf::write::GgufWriter;
use model::sampler::TokenConstraint;
use model::tokenizer::Tokenizer;
use serde_json::{Value, json};
use std::sync::Arc;

pub(crate) const EOS: u32 = 1;
const MERGES: [&str; 4] = ["{ \"", "\" :", "Ġ \"", ", Ġ"];

pub(crate) fn tokenizer() -> Arc<Tokenizer> {
    let mut tokens = vec!["<|endoftext|>".to_string(), "<|im_end|>".to_string()];
    let mut types = vec![3, 3];
    for c in model::tokenizer::byte_chars() {
        tokens.push(c.to_string());
        types.push(1);
    }
    for m in MERGES {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    let strings = |v: Vec<String>| MetaValue::Array(v.into_iter().map(MetaValue::String).collect());
    let mut w = GgufWriter::new();
    w.meta("tokenizer.ggml.model", MetaValue::String("gpt2".into()));
    w.meta("tokenizer.ggml.pre", MetaValue::String("smollm".into()));
    w.meta("tokenizer.ggml.tokens", strings(tokens));
    w.meta(
        "tokenizer.ggml.token_type",
        MetaValue::Array(types.into_iter().map(MetaValue::I32).collect()),
    );
    w.meta(
        "tokenizer.ggml.merges",
        strings(MERGES.iter().map(|m| m.to_string()).collect()),
    );
    w.meta("tokenizer.ggml.eos_token_id", MetaValue::U32(EOS));
    let gguf = GgufFile::from_bytes(w.finish()).unwrap();
    Arc::new(Tokenizer::from_gguf(&gguf).unwrap())
}

pub(crate) fn grammars() -> (Grammars, Arc<Tokenizer>) {
    let tok = tokenizer();
    (Grammars::new(tok.clone(), &[EOS]).unwrap(), tok)
}

/// splitmix64 draws for the walk.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = model::sampler::splitmix64(self.0);
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// A random generation under `spec`: random logits (closing punctuation favoured, so the walk
/// ends), masked, the best token taken, until the end token. Returns the text, or `None` if it
/// did not end within `limit` tokens.
pub(crate) fn walk(
    g: &Grammars,
    tok: &Tokenizer,
    spec: &GrammarSpec,
    seed: u64,
    limit: usize,
) -> Option<String> {
    let mut grammar = g.compile(spec).unwrap();
    let mut rng = Rng(seed);
    let mut out = Vec::new();
    for _ in 0..limit {
        let mut logits: Vec<f32> = (0..tok.vocab_size()).map(|_| rng.next()).collect();
        for b in ["\"", "}", "]", "1", "EOS"] {
            let id = if b == "EOS" {
                EOS
            } else {
                tok.token_to_id(b).unwrap()
            };
            logits[id as usize] += 0.6;
        }
        grammar.mask(&mut logits);
        let t = model::sampler::argmax(&logits);
        assert!(logits[t as usize].is_finite(), "the mask left no token");
        if t == EOS {
            assert!(grammar.failure().is_none(), "{:?}", grammar.failure());
            return Some(String::from_utf8(tok.decode_bytes(&out, false).unwrap()).unwrap());
        }
        grammar.advance(t);
        out.push(t);
    }
    None
}

fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 150}},
            "required": ["name", "age"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"tags": {"type": "array",
            "items": {"type": "string", "enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3}},
            "required": ["tags"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z]{2}[0-9]{3}$"},
            "score": {"type": "number", "minimum": -1.5, "maximum": 2.5},
            "note": {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "null"}]}},
            "required": ["id", "score", "note"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"inner": {"type": "object",
            "properties": {"ok": {"type": "boolean"}, "n": {"type": ["integer", "null"]}},
            "required": ["ok", "n"], "additionalProperties": false}},
            "required": ["inner"], "additionalProperties": false}),
    ]
}

#[test]
fn random_walks_under_a_schema_give_valid_json() {
    let (g, tok) = grammars();
    for schema in schemas() {
        let validator = jsonschema::validator_for(&schema).unwrap();
        let spec = GrammarSpec::JsonSchema(schema.clone());
        for seed in 0..8 {
            let text = walk(&g, &tok, &spec, seed, 400).expect("the walk ends");
            let value: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"));
            assert!(
                validator.is_valid(&value),
                "{text} does not satisfy {schema}"
            );
        }
    }
}

#[test]
fn json_object_gives_an_object_and_a_regex_its_language() {
    let (g, tok) = grammars();
    for seed in 0..8 {
        let text = walk(&g, &tok, &GrammarSpec::JsonObject, seed, 400).expect("ends");
        let value: Value = serde_json::from_str(&text).unwrap();
        assert!(value.is_object(), "{text}");
        let spec = GrammarSpec::Regex("(yes|no), [0-9]{1,3}".into());
        let text = walk(&g, &tok, &spec, seed, 100).expect("ends");
        let re = regex_lite(&text);
        assert!(re, "{text}");
    }
}

/// `(yes|no), [0-9]{1,3}` by hand.
fn regex_lite(text: &str) -> bool {
    let Some(rest) = text.strip_prefix("yes, ").or(text.strip_prefix("no, ")) else {
        return false;
    };
    (1..=3).contains(&rest.len()) && rest.bytes().all(|b| b.is_ascii_digit())
}

#[test]
fn a_lark_grammar_is_followed_and_json_whitespace_is_bounded() {
    let (g, tok) = grammars();
    let spec = GrammarSpec::Lark("start: \"A\" (\"b\" | \"c\")+ \"!\"".into());
    let text = walk(&g, &tok, &spec, 3, 100).expect("ends");
    assert!(text.starts_with('A') && text.ends_with('!'), "{text}");
    // Whitespace runs up to the bound, and no further.
    let mut grammar = g.compile(&GrammarSpec::JsonObject).unwrap();
    let (open, space) = (
        tok.token_to_id("{").unwrap(),
        tok.encode(" ", false, false).unwrap()[0],
    );
    assert_eq!(grammar.valid_prefix(&[open, space]), 2);
    let mut run = vec![open];
    run.extend(std::iter::repeat_n(space, crate::JSON_MAX_WHITESPACE + 1));
    assert_eq!(grammar.valid_prefix(&run), crate::JSON_MAX_WHITESPACE + 1);
}

#[test]
fn control_tokens_are_never_text_and_end_only_where_the_language_may() {
    let (g, tok) = grammars();
    let mut grammar = g.compile(&GrammarSpec::JsonObject).unwrap();
    // Logits past the vocabulary (padded embeddings) are never allowed.
    let mut logits = vec![0.0; tok.vocab_size() + 40];
    grammar.mask(&mut logits);
    assert!(
        logits[tok.vocab_size()..]
            .iter()
            .all(|&l| l == f32::NEG_INFINITY)
    );
    assert_eq!(logits[0], f32::NEG_INFINITY, "<|endoftext|> is not text");
    assert_eq!(
        logits[EOS as usize],
        f32::NEG_INFINITY,
        "no end before the object"
    );
    let brace = tok.token_to_id("{").unwrap();
    assert!(logits[brace as usize].is_finite());
    for t in tok.encode("{}", false, false).unwrap() {
        grammar.advance(t);
    }
    let mut logits = vec![0.0; tok.vocab_size()];
    grammar.mask(&mut logits);
    let allowed: Vec<usize> = (0..logits.len())
        .filter(|&t| logits[t].is_finite())
        .collect();
    assert_eq!(
        allowed,
        [EOS as usize],
        "only the end after a complete object"
    );
    grammar.advance(EOS);
    assert_eq!(
        grammar.failure(),
        None,
        "the end token is taken after the end"
    );
}

#[test]
fn drafts_are_checked_without_moving_the_grammar() {
    let (g, tok) = grammars();
    let schema =
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    let mut grammar = g.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    let good = tok.encode("{\"n\": 12}", false, false).unwrap();
    let bad = tok.encode("{\"n\": x}", false, false).unwrap();
    assert_eq!(grammar.valid_prefix(&good), good.len());
    let cut = tok.encode("{\"n\": ", false, false).unwrap().len();
    assert_eq!(grammar.valid_prefix(&bad), cut);
    // Nothing was consumed: the grammar still starts at the opening brace.
    let mut logits = vec![0.0; tok.vocab_size()];
    grammar.mask(&mut logits);
    assert!(logits[good[0] as usize].is_finite());
    assert!(grammar.failure().is_none());
}

#[test]
fn forced_tokens_spell_the_schema_key_and_leave_the_grammar_in_place() {
    let (g, tok) = grammars();
    let schema = json!({"type": "object", "properties": {"temperature": {"type": "integer"}},
        "required": ["temperature"], "additionalProperties": false});
    let mut grammar = g.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    for t in tok.encode("{\"", false, false).unwrap() {
        grammar.advance(t);
    }
    let forced = grammar.forced();
    let text = String::from_utf8(tok.decode_bytes(&forced, false).unwrap()).unwrap();
    // The key is the only continuation (its closing quote may be left to the next token).
    assert!(text.len() >= "temperature".len(), "{text:?}");
    assert!("temperature\":".starts_with(&text), "{text:?}");
    assert_eq!(grammar.valid_prefix(&forced), forced.len());
    assert_eq!(grammar.forced(), forced, "asking again gives the same");
    // Nothing was consumed: the forced tokens are still the next ones, then a value.
    for &t in &forced {
        grammar.advance(t);
    }
    let rest = tok
        .encode(&"temperature\": 3}"[text.len()..], false, false)
        .unwrap();
    assert_eq!(grammar.valid_prefix(&rest), rest.len());
    assert!(grammar.failure().is_none());
    // Where the model chooses (a value's digits), nothing is forced.
    for &t in &tok
        .encode(&"temperature\": "[text.len()..], false, false)
        .unwrap()
    {
        grammar.advance(t);
    }
    assert_eq!(grammar.forced(), Vec::<u32>::new());
}

#[test]
fn a_cached_grammar_starts_fresh_for_each_sequence() {
    let (g, tok) = grammars();
    let mut first = g.compile(&GrammarSpec::JsonObject).unwrap();
    for t in tok.encode("{\"a\"", false, false).unwrap() {
        first.advance(t);
    }
    let mut second = g.compile(&GrammarSpec::JsonObject).unwrap();
    let mut logits = vec![0.0; tok.vocab_size()];
    second.mask(&mut logits);
    assert!(logits[tok.token_to_id("{").unwrap() as usize].is_finite());
}

#[test]
fn bad_specs_are_errors_naming_the_problem() {
    let (g, _) = grammars();
    let cases = [
        GrammarSpec::JsonSchema(json!({"type": "integr"})),
        GrammarSpec::JsonSchema(json!({"type": "integer", "minimum": 5, "maximum": 1})),
        GrammarSpec::JsonSchema(json!({"type": "string", "pattern": "(unclosed"})),
        GrammarSpec::Regex("(a".into()),
        GrammarSpec::Lark("start: undefined_rule".into()),
    ];
    for spec in cases {
        match g.compile(&spec) {
            Err(GrammarError::Invalid(m)) => assert!(!m.is_empty() && !m.contains('\n'), "{m}"),
            other => panic!("{spec:?} gave {other:?}"),
        }
    }
}

#[test]
fn a_gbnf_grammar_compiles_through_its_lark_form() {
    let (g, tok) = grammars();
    let gbnf = "root ::= answer \", \" num\nanswer ::= \"yes\" | \"no\"\nnum ::= [0-9]{1,3}\n";
    let spec = GrammarSpec::Lark(crate::ebnf_to_lark(gbnf).unwrap());
    for seed in 0..4 {
        let text = walk(&g, &tok, &spec, seed, 100).expect("ends");
        assert!(regex_lite(&text), "{text}");
    }
}

#[test]
fn a_forced_tool_call_has_valid_arguments_for_one_of_its_functions() {
    let (g, tok) = grammars();
    let weather = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}},
        "required": ["city"], "additionalProperties": false});
    let time = json!({"type": "object", "properties": {}, "additionalProperties": false});
    let spec = GrammarSpec::ToolCall(vec![
        crate::CallShape {
            before: "get_weather\", \"arguments\": ".into(),
            parameters: weather.clone(),
            after: "}\n</tool_call>".into(),
        },
        crate::CallShape {
            before: "get_time\", \"arguments\": ".into(),
            parameters: time.clone(),
            after: "}\n</tool_call>".into(),
        },
    ]);
    let mut seen = Vec::new();
    for seed in 0..12 {
        let text = walk(&g, &tok, &spec, seed, 200).expect("ends");
        let (name, rest) = text.split_once("\", \"arguments\": ").expect("a call");
        let args = rest.strip_suffix("}\n</tool_call>").expect("closed");
        let schema = if name == "get_weather" {
            &weather
        } else {
            &time
        };
        assert!(name == "get_weather" || name == "get_time", "{text}");
        let value: Value = serde_json::from_str(args).unwrap();
        assert!(
            jsonschema::validator_for(schema).unwrap().is_valid(&value),
            "{text}"
        );
        seen.push(name.to_string());
    }
    assert!(seen.iter().any(|n| n == "get_time") && seen.iter().any(|n| n == "get_weather"));
}

#[test]
fn optional_tool_calls_allow_text_or_calls_valid_for_their_function() {
    let (g, tok) = grammars();
    let weather = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}},
        "required": ["city"], "additionalProperties": false});
    let spec = |answer: Option<Value>, parallel| {
        GrammarSpec::OptionalToolCalls(crate::OptionalCalls {
            trigger: Some("<tool_call>".into()),
            calls: vec![crate::CallShape {
                before: "\n{\"name\": \"get_weather\", \"arguments\": ".into(),
                parameters: weather.clone(),
                after: "}\n</tool_call>".into(),
            }],
            bare: Some(crate::BareCalls {
                key: "arguments".into(),
                separator: None,
                functions: vec![("get_weather".into(), weather.clone())],
            }),
            parallel,
            answer,
        })
    };
    let whole = |spec: &GrammarSpec, text: &str| {
        let mut ids = tok.encode(text, false, false).unwrap();
        ids.push(EOS);
        g.compile(spec).unwrap().valid_prefix(&ids) == ids.len()
    };
    let call = |city: &str| {
        format!(
            "<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"{city}\"}}}}\n</tool_call>"
        )
    };
    let text = spec(None, true);
    for ok in [
        "It is sunny, and 3 < 4.".to_string(),
        String::new(),
        format!("Let me look. {}", call("Paris")),
        format!("{}\n{}", call("Paris"), call("Rome")),
        r#"{"name": "get_weather", "arguments": {"city": "Oslo"}}"#.to_string(),
    ] {
        assert!(whole(&text, &ok), "{ok:?} is refused");
    }
    for bad in [
        call("Londonderry"),
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>".to_string(),
        r#"{"name": "get_weather", "arguments": {"town": "Oslo"}}"#.to_string(),
        r#"{"a": 1}"#.to_string(),
        format!("{} and then more text", call("Paris")),
    ] {
        assert!(!whole(&text, &bad), "{bad:?} is accepted");
    }
    let two = format!("{}\n{}", call("Paris"), call("Rome"));
    assert!(!whole(&spec(None, false), &two), "one call at most");
    let answer =
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    let json_answer = spec(Some(answer), true);
    assert!(whole(&json_answer, "{\"n\": 3}") && whole(&json_answer, &call("Paris")));
    assert!(!whole(&json_answer, "The answer is 3."));
    // After the marker the call's opening is forced: the model only writes the arguments.
    let mut grammar = g.compile(&text).unwrap();
    for t in tok.encode("Sure. <tool_call>", false, false).unwrap() {
        grammar.advance(t);
    }
    let forced = grammar.forced();
    let forced = String::from_utf8(tok.decode_bytes(&forced, false).unwrap()).unwrap();
    assert!(
        forced.starts_with("\n{\"name\": \"get_weather\""),
        "{forced:?}"
    );
    // Llama 3's form: no marker, JSON calls at the start joined by `;`.
    let llama = GrammarSpec::OptionalToolCalls(crate::OptionalCalls {
        trigger: None,
        calls: Vec::new(),
        bare: Some(crate::BareCalls {
            key: "parameters".into(),
            separator: Some(";".into()),
            functions: vec![("get_weather".into(), weather.clone())],
        }),
        parallel: true,
        answer: None,
    });
    let bare = |city: &str| {
        format!("{{\"name\": \"get_weather\", \"parameters\": {{\"city\": \"{city}\"}}}}")
    };
    assert!(whole(&llama, "No call <tool_call> here."));
    assert!(whole(
        &llama,
        &format!("{}; {}", bare("Oslo"), bare("Rome"))
    ));
    assert!(!whole(&llama, &bare("Londonderry")));
}

#[test]
fn a_structural_tag_keeps_text_free_and_each_tagged_part_valid() {
    let (g, tok) = grammars();
    let weather = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}},
        "required": ["city"], "additionalProperties": false});
    let spec = GrammarSpec::StructuralTag(crate::StructuralTag {
        triggers: vec!["<function=".into()],
        structures: vec![crate::TaggedStructure {
            begin: "<function=get_weather>".into(),
            schema: weather,
            end: "</function>".into(),
        }],
    });
    let whole = |text: &str| {
        let mut ids = tok.encode(text, false, false).unwrap();
        ids.push(EOS);
        g.compile(&spec).unwrap().valid_prefix(&ids) == ids.len()
    };
    let tagged = |city: &str| format!("<function=get_weather>{{\"city\": \"{city}\"}}</function>");
    for ok in [
        String::new(),
        "Plain text, <b>tags</b> and {braces}.".to_string(),
        format!(
            "Let me see. {} Then {} and done.",
            tagged("Oslo"),
            tagged("Rome")
        ),
    ] {
        assert!(whole(&ok), "{ok:?} is refused");
    }
    for bad in [
        "<function=get_time>{}</function>".to_string(),
        tagged("Londonderry"),
        "<function=get_weather>{\"city\": \"Oslo\"} and no end".to_string(),
    ] {
        assert!(!whole(&bad), "{bad:?} is accepted");
    }
}

#[test]
fn a_call_marker_that_is_a_control_token_opens_calls_as_that_token() {
    let (g, tok) = grammars();
    let args = json!({"type": "object", "properties": {"n": {"type": "integer"}},
        "required": ["n"], "additionalProperties": false});
    let spec = GrammarSpec::OptionalToolCalls(crate::OptionalCalls {
        trigger: Some("<|endoftext|>".into()),
        calls: vec![crate::CallShape {
            before: "f(".into(),
            parameters: args,
            after: ")".into(),
        }],
        bare: None,
        parallel: true,
        answer: None,
    });
    let valid = |pieces: &[&str]| {
        let mut ids = Vec::new();
        for p in pieces {
            match *p {
                "MARK" => ids.push(0),
                text => ids.extend(tok.encode(text, false, false).unwrap()),
            }
        }
        ids.push(EOS);
        g.compile(&spec).unwrap().valid_prefix(&ids) == ids.len()
    };
    assert!(valid(&["Some text."]));
    assert!(valid(&[
        "Some text.",
        "MARK",
        "f({\"n\": 3})",
        "\n",
        "MARK",
        "f({\"n\": 4})"
    ]));
    assert!(!valid(&["Some text.", "MARK", "f({\"n\": \"x\"})"]));
    // Its text spelled in ordinary tokens is not a way around the grammar.
    assert!(!valid(&["Some text <|endoftext|>f({\"n\": \"x\"})"]));
}
