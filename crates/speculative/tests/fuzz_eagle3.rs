//! Fuzz targets for the EAGLE-3 head loaders, run as proptest tests in every `cargo test`:
//! `config.json` (seed configs mutated, and random objects of its keys), the safetensors files
//! (seed heads and nasty headers mutated, read with a config that fits them), the GGUF form
//! (seed heads mutated, with and without the target's output rows to borrow), and the folder
//! loader on disk. Each must load or be an error, never panic or hang. The seeds are under
//! `testdata/fuzz/eagle3` (and the tiny reference head of `tests/data/eagle3/tiny`);
//! `SPECULA_FUZZ_CASES=N` runs N cases each instead of the default.

use fuzzing::Bytes;
use model::gguf::{GgmlType, GgufFile};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;
use serde_json::{Value, json};
use speculative::eagle3::{Eagle3Config, Eagle3Head, TargetOutput, TargetShape};
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------------
// The harness.

fn testdata(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/fuzz/eagle3")
        .join(sub)
}

/// Runs `test` on the cases of the strategy `make` builds (the shared harness).
fn fuzz<S, F, T>(default: u32, make: F, test: T)
where
    S: Strategy + 'static,
    F: FnOnce() -> S + Send + 'static,
    T: Fn(S::Value) -> Result<(), TestCaseError> + Send + 'static,
{
    fuzzing::Harness {
        stack: None,
        ..fuzzing::DEFAULT
    }
    .run(default, make, test)
}

/// The seed files of this target's folder, in name order.
fn seeds(dir: &str) -> Vec<Vec<u8>> {
    fuzzing::seeds(&testdata(dir))
}

/// Little-endian values a count, length, offset or dimension is overwritten with.
const HUGE: [u64; 9] = [
    1 << 60,
    u64::MAX,
    i64::MAX as u64,
    1 << 32,
    (1 << 31) - 1,
    1 << 20,
    0,
    1,
    27,
];

/// A seed with a few edits: bits flipped, bytes set, `tokens` inserted, ranges deleted or
/// repeated, the end cut off, or 8 or 4 bytes overwritten with one of [`HUGE`].
fn mutated(seeds: Vec<Vec<u8>>, tokens: &'static [&'static str]) -> impl Strategy<Value = Bytes> {
    let with = fuzzing::Mutations {
        tokens,
        splice: false,
        huge: &HUGE,
    };
    fuzzing::mutated(seeds, with)
}

// ---------------------------------------------------------------------------------------------
// The heads.

/// The target of every seed head.
const TARGET: TargetShape = TargetShape {
    n_layers: 8,
    hidden: 16,
    vocab: 100,
};

/// The configs that the seed safetensors heads fit: the tiny reference head's (head_dim 8) and
/// the one without `head_dim` (4).
fn head_configs() -> Vec<Eagle3Config> {
    ["tiny.json", "no_head_dim.json"]
        .iter()
        .map(|name| {
            let text = std::fs::read_to_string(testdata("config").join(name)).unwrap();
            Eagle3Config::parse(&text, TARGET).unwrap_or_else(|e| panic!("{name}: {e}"))
        })
        .collect()
}

/// The seed safetensors files: the tiny reference head and those of `testdata`.
fn safetensors_seeds() -> Vec<Vec<u8>> {
    let tiny =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/eagle3/tiny/model.safetensors");
    let mut seeds = vec![std::fs::read(tiny).unwrap()];
    seeds.extend(self::seeds("safetensors"));
    seeds
}

/// What a loaded head promises: its matrices have the config's shapes, its draft tokens lie in
/// the target's vocabulary.
fn check_head(head: &Eagle3Head) -> Result<(), TestCaseError> {
    let c = &head.config;
    prop_assert_eq!(head.fc.data.len(), c.hidden * 3 * c.target_hidden);
    prop_assert_eq!(head.lm_head.rows, c.draft_vocab);
    prop_assert_eq!(head.draft_to_target.len(), c.draft_vocab);
    prop_assert!(head.draft_to_target.iter().all(|&t| (t as usize) < c.vocab));
    prop_assert!(c.capture_layers.iter().all(|&l| l <= TARGET.n_layers));
    Ok(())
}

/// Keys of `config.json`.
const CONFIG_KEYS: &[&str] = &[
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "draft_vocab_size",
    "target_hidden_size",
    "rms_norm_eps",
    "rope_theta",
    "norm_before_residual",
    "eagle_aux_hidden_state_layer_ids",
    "eagle_config",
];

/// A value a config key might hold: mostly numbers near and far from the seeds'.
fn config_value() -> impl Strategy<Value = Value> {
    let number = prop_oneof![
        select(
            &[
                0u64,
                1,
                2,
                3,
                4,
                8,
                10,
                16,
                24,
                100,
                1 << 20,
                (1 << 20) + 1,
                u64::MAX
            ][..]
        )
        .prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
    ];
    let leaf = prop_oneof![
        4 => number,
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::Bool),
        1 => ".{0,4}".prop_map(Value::String),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            inner.prop_map(|v| json!({ "eagle_aux_hidden_state_layer_ids": v })),
        ]
    })
}

/// The layers a config's `eagle_aux_hidden_state_layer_ids` name (each id's output: the layer
/// after it; `None` for an id that names none).
fn layer_ids(text: &str) -> Option<Vec<Option<usize>>> {
    let v: Value = serde_json::from_str(text).ok()?;
    let ids = v
        .get("eagle_config")
        .and_then(|c| c.get("eagle_aux_hidden_state_layer_ids"))
        .or_else(|| v.get("eagle_aux_hidden_state_layer_ids"))?
        .as_array()?;
    let layer = |id: &Value| usize::try_from(id.as_u64()?).ok()?.checked_add(1);
    Some(ids.iter().map(layer).collect())
}

#[test]
fn fuzz_eagle3_config() {
    fuzz(
        2000,
        || {
            let objects = vec((select(CONFIG_KEYS), config_value()), 0..12).prop_map(|kv| {
                let base = json!({"hidden_size": 16, "intermediate_size": 24,
                    "num_attention_heads": 4, "vocab_size": 100});
                let mut v = base;
                for (k, x) in kv {
                    v[k] = x;
                }
                Bytes(v.to_string().into_bytes())
            });
            let tokens: &'static [&'static str] =
                &["\"", ",", "1e999", "-1", "null", "[", "]", "{"];
            let texts = prop_oneof![objects, mutated(seeds("config"), tokens)];
            (texts, 0usize..12, 1usize..40, 1usize..200)
        },
        |(text, layers, hidden, vocab)| {
            let text = String::from_utf8_lossy(&text.0);
            for target in [
                TARGET,
                TargetShape {
                    n_layers: layers,
                    hidden,
                    vocab,
                },
            ] {
                if let Ok(c) = Eagle3Config::parse(&text, target) {
                    prop_assert!(c.capture_layers.iter().all(|&l| l < target.n_layers.max(1)));
                    if let Some(ids) = layer_ids(&text) {
                        let got: Vec<Option<usize>> = c.capture_layers.map(Some).to_vec();
                        prop_assert_eq!(got, ids);
                    }
                    prop_assert!(c.draft_vocab <= c.vocab && c.vocab == target.vocab);
                    prop_assert!(c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0);
                }
            }
            Ok(())
        },
    );
}

/// Pieces of safetensors headers a mutation inserts.
const HEADER_TOKENS: &[&str] = &[
    "\"dtype\":\"F64\"",
    "\"shape\":[]",
    "\"shape\":[4294967296,4294967296]",
    "\"data_offsets\":[0,18446744073709551615]",
    "\"d2t\"",
    "\"fc.weight\"",
    "\"__metadata__\":{\"a\":1}",
    "{",
    "}",
    "\"",
    ",",
];

#[test]
fn fuzz_eagle3_safetensors() {
    let configs = head_configs();
    let seeds = safetensors_seeds();
    let (n, for_strategy) = (seeds.len(), seeds.clone());
    fuzz(
        2000,
        move || {
            (
                mutated(for_strategy, HEADER_TOKENS),
                proptest::option::of(0..n),
            )
        },
        move |(bytes, second)| {
            // Sometimes with a second, whole file beside it (tensors are looked up in each).
            let mut files = vec![("model.safetensors".to_string(), bytes.0.as_slice())];
            if let Some(i) = second {
                files.push(("second.safetensors".to_string(), seeds[i].as_slice()));
            }
            for config in &configs {
                if let Ok(head) = Eagle3Head::from_parts(config.clone(), &files) {
                    check_head(&head)?;
                }
            }
            Ok(())
        },
    );
}

/// Pieces of GGUF a mutation inserts.
const GGUF_TOKENS: &[&str] = &[
    "eagle3.target_layers",
    "output.weight",
    "d2t",
    "\u{1b}\0\0\0",
    "\u{9}\0\0\0",
    "blk.0.rope_freqs.weight",
];

#[test]
fn fuzz_eagle3_gguf() {
    // The target's output rows (F16) that a head without its own borrows.
    let rows = vec![0u8; TARGET.vocab * TARGET.hidden * 2];
    fuzz(
        2000,
        || (mutated(seeds("gguf"), GGUF_TOKENS), any::<bool>()),
        move |(bytes, lend)| {
            let Ok(file) = GgufFile::from_bytes(bytes.0) else {
                return Ok(());
            };
            let output = lend.then_some(TargetOutput {
                dtype: GgmlType::F16,
                cols: TARGET.hidden,
                data: &rows,
            });
            if let Ok(head) = Eagle3Head::from_gguf(&file, TARGET, output) {
                check_head(&head)?;
            }
            Ok(())
        },
    );
}

#[test]
fn fuzz_eagle3_folder_on_disk() {
    fuzz(
        200,
        || {
            const TOKENS: &[&str] = &["\"", "1", "[", "x"];
            let read = |sub: &str| std::fs::read(testdata(sub)).unwrap();
            let tiny = safetensors_seeds().swap_remove(0);
            // One of the two edited, the other as it is.
            let pair = |config: Vec<u8>, weights: Vec<u8>| {
                prop_oneof![
                    (
                        mutated(vec![config.clone()], TOKENS),
                        Just(Bytes(weights.clone()))
                    ),
                    (Just(Bytes(config)), mutated(vec![weights], HEADER_TOKENS)),
                ]
            };
            // A config and the weights that fit it, or any two.
            let folders = prop_oneof![
                pair(read("config/tiny.json"), tiny),
                pair(
                    read("config/no_head_dim.json"),
                    read("safetensors/head_f16.safetensors")
                ),
                (
                    mutated(seeds("config"), TOKENS),
                    mutated(safetensors_seeds(), HEADER_TOKENS)
                ),
            ];
            (folders, proptest::bool::weighted(0.1))
        },
        |((config, weights), as_file)| {
            let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
            std::fs::write(dir.path().join("config.json"), &config.0).unwrap();
            std::fs::write(dir.path().join("model.safetensors"), &weights.0).unwrap();
            let path = if as_file {
                dir.path().join("model.safetensors")
            } else {
                dir.path().to_path_buf()
            };
            if let Ok(head) = Eagle3Head::open(&path, TARGET, None) {
                check_head(&head)?;
            }
            Ok(())
        },
    );
}

#[test]
fn the_seed_heads_load() {
    let configs = head_configs();
    let seeds = safetensors_seeds();
    let tiny = Eagle3Head::from_parts(configs[0].clone(), &[("tiny".into(), &seeds[0])]);
    tiny.unwrap_or_else(|e| panic!("the tiny head: {e}"));
    let f16 = std::fs::read(testdata("safetensors/head_f16.safetensors")).unwrap();
    let head = Eagle3Head::from_parts(configs[1].clone(), &[("f16".into(), &f16)]).unwrap();
    assert!(head.embed.is_some());
    for (name, lend) in [("head.gguf", false), ("head_no_output.gguf", true)] {
        let file = GgufFile::open(&testdata("gguf").join(name)).unwrap();
        let rows = vec![0u8; TARGET.vocab * TARGET.hidden * 2];
        let output = lend.then_some(TargetOutput {
            dtype: GgmlType::F16,
            cols: TARGET.hidden,
            data: &rows,
        });
        Eagle3Head::from_gguf(&file, TARGET, output).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn d2t_offsets_that_overflow_and_ids_that_wrap_are_errors() {
    use safetensors::SafeTensors;
    use safetensors::tensor::TensorView;
    let configs = head_configs();
    let tiny = safetensors_seeds().swap_remove(0);
    let st = SafeTensors::deserialize(&tiny).unwrap();
    // Draft token 1 at offset i64::MAX: past every vocabulary, not a wrapped-around id.
    let mut d2t: Vec<u8> = (0..10i64).flat_map(|i| (2 * i).to_le_bytes()).collect();
    d2t[8..16].copy_from_slice(&i64::MAX.to_le_bytes());
    let views: Vec<(String, TensorView<'_>)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| match name.as_str() {
            "d2t" => (
                name,
                TensorView::new(safetensors::Dtype::I64, vec![10], &d2t).unwrap(),
            ),
            _ => (name, view),
        })
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    let e = Eagle3Head::from_parts(configs[0].clone(), &[("d2t".into(), &bytes)]).unwrap_err();
    assert!(e.to_string().contains("d2t maps draft token 1"), "{e}");
    // A layer id of u64::MAX is no layer (its + 1 does not wrap around to layer 0).
    let text = std::fs::read_to_string(testdata("config").join("wrapping_id.json")).unwrap();
    assert!(Eagle3Config::parse(&text, TARGET).is_err());
}
