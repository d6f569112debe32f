//! EAGLE-3 heads in llama.cpp's GGUF form: the tiny reference head (tests/data/eagle3/tiny),
//! written here as llama.cpp's converter writes it (blk.0 names, Q and K rows permuted for
//! adjacent-pair RoPE, `d2t` as absolute I64 ids, `eagle3.*` keys), loads to the very weights of
//! its SGLang folder, and so to the forward the float64 reference holds; a head without an
//! output layer borrows the target's rows; what does not fit is an error naming it.

use model::gguf::write::GgufWriter;
use model::gguf::{GgmlType, GgufFile, MetaValue};
use speculative::eagle3::{Eagle3Head, Matrix, TargetOutput, TargetShape};
use std::path::PathBuf;

const TARGET: TargetShape = TargetShape {
    n_layers: 8,
    hidden: 16,
    vocab: 100,
};

fn sglang_head() -> Eagle3Head {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/eagle3/tiny");
    Eagle3Head::load(&dir, TARGET).unwrap()
}

/// The converter's permutation, numpy's `w.reshape(heads, 2, rows/heads/2, cols)
/// .swapaxes(1, 2)` written out: output row (h, i, j) is input row (h, j, i).
fn permute(w: &Matrix, heads: usize) -> Vec<f32> {
    let half = w.rows / heads / 2;
    let mut out = Vec::with_capacity(w.data.len());
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let row = h * 2 * half + j * half + i;
                out.extend_from_slice(&w.data[row * w.cols..(row + 1) * w.cols]);
            }
        }
    }
    out
}

/// A head's GGUF as llama.cpp's converter writes it; `change` edits the keys and tensors first.
fn gguf(
    head: &Eagle3Head,
    change: impl FnOnce(&mut Vec<(String, MetaValue)>, &mut Tensors),
) -> GgufFile {
    let c = &head.config;
    let u = |v: usize| MetaValue::U32(v as u32);
    let mut keys: Vec<(String, MetaValue)> = vec![
        (
            "general.architecture".into(),
            MetaValue::String("eagle3".into()),
        ),
        ("eagle3.block_count".into(), u(1)),
        ("eagle3.embedding_length".into(), u(c.hidden)),
        ("eagle3.feed_forward_length".into(), u(c.intermediate)),
        ("eagle3.attention.head_count".into(), u(c.n_heads)),
        ("eagle3.attention.head_count_kv".into(), u(c.n_kv_heads)),
        ("eagle3.attention.key_length".into(), u(c.head_dim)),
        ("eagle3.attention.value_length".into(), u(c.head_dim)),
        (
            "eagle3.attention.layer_norm_rms_epsilon".into(),
            MetaValue::F32(c.rms_eps),
        ),
        ("eagle3.rope.freq_base".into(), MetaValue::F32(c.rope_theta)),
        ("eagle3.target_hidden_size".into(), u(c.target_hidden)),
        (
            "eagle3.target_layers".into(),
            MetaValue::Array(
                c.capture_layers
                    .iter()
                    .map(|&l| MetaValue::I32(l as i32))
                    .collect(),
            ),
        ),
        ("eagle3.norm_before_residual".into(), MetaValue::Bool(false)),
    ];
    let f32s = |m: &Matrix| m.data.clone();
    let mut tensors: Tensors = vec![
        (
            "fc.weight",
            f32s(&head.fc),
            vec![head.fc.cols, head.fc.rows],
        ),
        (
            "blk.0.attn_norm.weight",
            head.input_norm.clone(),
            vec![c.hidden],
        ),
        (
            "blk.0.attn_norm_2.weight",
            head.hidden_norm.clone(),
            vec![c.hidden],
        ),
        (
            "blk.0.attn_q.weight",
            permute(&head.wq, c.n_heads),
            vec![head.wq.cols, head.wq.rows],
        ),
        (
            "blk.0.attn_k.weight",
            permute(&head.wk, c.n_kv_heads),
            vec![head.wk.cols, head.wk.rows],
        ),
        (
            "blk.0.attn_v.weight",
            f32s(&head.wv),
            vec![head.wv.cols, head.wv.rows],
        ),
        (
            "blk.0.attn_output.weight",
            f32s(&head.wo),
            vec![head.wo.cols, head.wo.rows],
        ),
        (
            "blk.0.ffn_norm.weight",
            head.post_attention_norm.clone(),
            vec![c.hidden],
        ),
        (
            "blk.0.ffn_gate.weight",
            f32s(&head.gate),
            vec![head.gate.cols, head.gate.rows],
        ),
        (
            "blk.0.ffn_up.weight",
            f32s(&head.up),
            vec![head.up.cols, head.up.rows],
        ),
        (
            "blk.0.ffn_down.weight",
            f32s(&head.down),
            vec![head.down.cols, head.down.rows],
        ),
        ("output_norm.weight", head.norm.clone(), vec![c.hidden]),
        (
            "output.weight",
            f32s(&head.lm_head),
            vec![c.hidden, c.draft_vocab],
        ),
    ]
    .into_iter()
    .map(|(n, v, s)| (n.to_string(), Data::F32(v), s))
    .collect();
    let d2t: Vec<i64> = head.draft_to_target.iter().map(|&t| i64::from(t)).collect();
    tensors.push(("d2t".into(), Data::I64(d2t), vec![c.draft_vocab]));
    change(&mut keys, &mut tensors);
    let mut w = GgufWriter::new();
    for (k, v) in keys {
        w.meta(&k, v);
    }
    for (name, data, shape) in &tensors {
        match data {
            Data::F32(v) => w.tensor_f32(name, shape, v),
            Data::I64(v) => {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                w.tensor_raw(name, shape, GgmlType::I64, &bytes)
            }
        };
    }
    GgufFile::from_bytes(w.finish()).unwrap()
}

enum Data {
    F32(Vec<f32>),
    I64(Vec<i64>),
}

type Tensors = Vec<(String, Data, Vec<usize>)>;

fn error(file: &GgufFile) -> String {
    Eagle3Head::from_gguf(file, TARGET, None)
        .unwrap_err()
        .to_string()
}

#[test]
fn the_gguf_form_loads_to_the_same_head_as_the_sglang_folder() {
    let want = sglang_head();
    let got = Eagle3Head::from_gguf(&gguf(&want, |_, _| {}), TARGET, None).unwrap();
    assert_eq!(got.config, want.config);
    for (name, g, w) in [
        ("fc", &got.fc, &want.fc),
        ("q", &got.wq, &want.wq),
        ("k", &got.wk, &want.wk),
        ("v", &got.wv, &want.wv),
        ("o", &got.wo, &want.wo),
        ("gate", &got.gate, &want.gate),
        ("up", &got.up, &want.up),
        ("down", &got.down, &want.down),
        ("lm_head", &got.lm_head, &want.lm_head),
    ] {
        assert_eq!(g, w, "{name}");
    }
    assert_eq!(
        (
            &got.input_norm,
            &got.hidden_norm,
            &got.post_attention_norm,
            &got.norm
        ),
        (
            &want.input_norm,
            &want.hidden_norm,
            &want.post_attention_norm,
            &want.norm
        )
    );
    assert_eq!(got.draft_to_target, want.draft_to_target);
    assert_eq!(got.draft_to_target[2], 2 * 8 + 3);
    assert!(got.embed.is_none(), "the embedding is the target's");
}

#[test]
fn a_head_without_an_output_layer_borrows_the_targets_rows() {
    let head = sglang_head();
    let file = gguf(&head, |_, t| t.retain(|(n, _, _)| n != "output.weight"));
    // A target output whose row r holds r + column / 100.
    let rows: Vec<f32> = (0..100 * 16)
        .map(|i| (i / 16) as f32 + (i % 16) as f32 / 100.0)
        .collect();
    let bytes: Vec<u8> = rows.iter().flat_map(|v| v.to_le_bytes()).collect();
    let output = TargetOutput {
        dtype: GgmlType::F32,
        cols: 16,
        data: &bytes,
    };
    let got = Eagle3Head::from_gguf(&file, TARGET, Some(output)).unwrap();
    for (i, &id) in head.draft_to_target.iter().enumerate() {
        assert_eq!(got.lm_head.data[i * 16 + 5], id as f32 + 0.05);
    }
    assert!(error(&file).contains("output.weight"), "{}", error(&file));
}

#[test]
fn what_does_not_fit_is_an_error_naming_it() {
    let head = sglang_head();
    let set = |key: &'static str, value: MetaValue| {
        move |k: &mut Vec<(String, MetaValue)>, _: &mut Tensors| {
            k.retain(|(n, _)| n != key);
            k.push((key.to_string(), value));
        }
    };
    let cases: Vec<(GgufFile, &str)> = vec![
        (
            gguf(
                &head,
                set("general.architecture", MetaValue::String("llama".into())),
            ),
            "llama",
        ),
        (
            gguf(&head, set("eagle3.norm_before_fc", MetaValue::Bool(true))),
            "norm_before_fc",
        ),
        (
            gguf(&head, set("eagle3.target_hidden_size", MetaValue::U32(24))),
            "24",
        ),
        (
            gguf(
                &head,
                set(
                    "eagle3.target_layers",
                    MetaValue::Array(vec![
                        MetaValue::I32(2),
                        MetaValue::I32(9),
                        MetaValue::I32(5),
                    ]),
                ),
            ),
            "target_layers",
        ),
        (
            gguf(&head, |_, t| {
                for (n, d, _) in t.iter_mut() {
                    if n == "d2t" {
                        *d = Data::I64((0..10).map(|i| i * 20).collect());
                    }
                }
            }),
            "d2t maps draft token 5 to 100",
        ),
        (
            gguf(&head, |_, t| {
                t.retain(|(n, _, _)| n != "blk.0.ffn_up.weight")
            }),
            "blk.0.ffn_up.weight",
        ),
    ];
    for (file, needle) in cases {
        let e = error(&file);
        assert!(e.contains(needle) && !e.contains('\n'), "{needle}: {e}");
    }
}
