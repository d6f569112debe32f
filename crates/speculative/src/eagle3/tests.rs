//! Tiny heads written here in SGLang's layout: they load with their shapes and `d2t` mapping, and
//! every way a checkpoint can be wrong is an error naming what.

use super::*;
use safetensors::tensor::TensorView;

const TARGET: TargetShape = TargetShape {
    n_layers: 8,
    hidden: 16,
    vocab: 100,
};

const CONFIG: &str = r#"{"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 16,
    "intermediate_size": 24, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 100, "draft_vocab_size": 10, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}"#;

/// A tensor to write: name, dtype, shape, bytes.
type Tensor = (String, Dtype, Vec<usize>, Vec<u8>);

/// The tensors of a head for `CONFIG`, values `seed + index / 64`.
fn tensors(dtype: Dtype) -> Vec<Tensor> {
    let shapes: [(&str, Vec<usize>); 12] = [
        ("fc.weight", vec![16, 48]),
        ("midlayer.input_layernorm.weight", vec![16]),
        ("midlayer.hidden_norm.weight", vec![16]),
        ("midlayer.self_attn.q_proj.weight", vec![16, 32]),
        ("midlayer.self_attn.k_proj.weight", vec![8, 32]),
        ("midlayer.self_attn.v_proj.weight", vec![8, 32]),
        ("midlayer.self_attn.o_proj.weight", vec![16, 16]),
        ("midlayer.post_attention_layernorm.weight", vec![16]),
        ("midlayer.mlp.gate_proj.weight", vec![24, 16]),
        ("midlayer.mlp.up_proj.weight", vec![24, 16]),
        ("midlayer.mlp.down_proj.weight", vec![16, 24]),
        ("norm.weight", vec![16]),
    ];
    let mut out: Vec<_> = shapes
        .into_iter()
        .enumerate()
        .map(|(seed, (name, shape))| {
            let n: usize = shape.iter().product();
            let values = (0..n).map(|i| seed as f32 + i as f32 / 64.0);
            let bytes = match dtype {
                Dtype::F16 => values
                    .flat_map(|x| half::f16::from_f32(x).to_le_bytes())
                    .collect(),
                Dtype::BF16 => values
                    .flat_map(|x| half::bf16::from_f32(x).to_le_bytes())
                    .collect(),
                _ => values.flat_map(f32::to_le_bytes).collect(),
            };
            (name.to_string(), dtype, shape, bytes)
        })
        .collect();
    out.push((
        "lm_head.weight".into(),
        Dtype::F32,
        vec![10, 16],
        vec![0; 640],
    ));
    // Draft token i is target token 3·i: offsets 2·i.
    let d2t: Vec<u8> = (0..10i64).flat_map(|i| (2 * i).to_le_bytes()).collect();
    out.push(("d2t".into(), Dtype::I64, vec![10], d2t));
    out.push(("t2d".into(), Dtype::BOOL, vec![100], vec![0; 100]));
    out
}

/// A checkpoint folder of `config` and `tensors` (all in one file).
fn write(config: &str, tensors: &[Tensor]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
    dir
}

#[test]
fn a_head_loads_with_its_shapes_values_and_vocabulary_map() {
    for dtype in [Dtype::F32, Dtype::F16, Dtype::BF16] {
        let dir = write(CONFIG, &tensors(dtype));
        let h = Eagle3Head::load(dir.path(), TARGET).unwrap();
        assert_eq!((h.fc.rows, h.fc.cols), (16, 48));
        assert_eq!((h.wq.rows, h.wq.cols), (16, 32));
        assert_eq!((h.wk.rows, h.down.cols, h.lm_head.rows), (8, 24, 10));
        assert_eq!(h.config.capture_layers, [2, 4, 5]);
        // Each value as its dtype holds it: fc is tensor 0 (value i / 64 at index i), norm 11.
        let held = |x: f32| match dtype {
            Dtype::F16 => half::f16::from_f32(x).to_f32(),
            Dtype::BF16 => half::bf16::from_f32(x).to_f32(),
            _ => x,
        };
        assert_eq!(h.fc.data[5], 5.0 / 64.0, "{dtype:?}");
        assert_eq!(h.norm[3], held(11.0 + 3.0 / 64.0), "{dtype:?}");
        assert_eq!(h.wq.data[40], held(3.0 + 40.0 / 64.0), "{dtype:?}");
        assert_eq!(
            h.draft_to_target,
            (0..10).map(|i| 3 * i).collect::<Vec<u32>>()
        );
        assert!(
            h.embed.is_none(),
            "no embedding shipped: the target's is borrowed"
        );
    }
}

#[test]
fn names_with_a_model_prefix_and_a_shipped_embedding_load_too() {
    let mut t = tensors(Dtype::F32);
    for (name, ..) in t.iter_mut().filter(|(n, ..)| n.starts_with("midlayer")) {
        *name = format!("model.{name}");
    }
    t.push((
        "embed_tokens.weight".into(),
        Dtype::F32,
        vec![100, 16],
        vec![0; 6400],
    ));
    let dir = write(CONFIG, &t);
    let h = Eagle3Head::load(dir.path(), TARGET).unwrap();
    assert_eq!(h.embed.map(|e| (e.rows, e.cols)), Some((100, 16)));
}

#[test]
fn a_broken_checkpoint_is_an_error_naming_what() {
    type Breakage = Box<dyn Fn(&mut Vec<Tensor>)>;
    let cases: Vec<(&str, Breakage)> = vec![
        (
            "norm.weight is missing",
            Box::new(|t| t.retain(|(n, ..)| n != "norm.weight")),
        ),
        (
            "midlayer.self_attn.q_proj.weight has shape [16, 16]",
            Box::new(|t| {
                let q = t.iter_mut().find(|(n, ..)| n.contains("q_proj")).unwrap();
                q.2 = vec![16, 16];
                q.3.truncate(16 * 16 * 4);
            }),
        ),
        (
            "outside the target's 100 tokens",
            Box::new(|t| {
                let d = t.iter_mut().find(|(n, ..)| n == "d2t").unwrap();
                d.3[72..80].copy_from_slice(&95i64.to_le_bytes());
            }),
        ),
        (
            "d2t is F32",
            Box::new(|t| {
                let d = t.iter_mut().find(|(n, ..)| n == "d2t").unwrap();
                (d.1, d.3) = (Dtype::F32, vec![0; 40]);
            }),
        ),
    ];
    for (want, break_it) in cases {
        let mut t = tensors(Dtype::F32);
        break_it(&mut t);
        let dir = write(CONFIG, &t);
        let e = Eagle3Head::load(dir.path(), TARGET)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{want}: {e}");
    }
    // A head for a wider target, and a folder without weights.
    let wide = TargetShape {
        hidden: 32,
        ..TARGET
    };
    let dir = write(CONFIG, &tensors(Dtype::F32));
    let e = Eagle3Head::load(dir.path(), wide).unwrap_err().to_string();
    assert!(e.contains("does not fit the target"), "{e}");
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let e = Eagle3Head::load(dir.path(), TARGET)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no .safetensors"), "{e}");
    // A truncated file.
    let dir = write(CONFIG, &tensors(Dtype::F32));
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    assert!(Eagle3Head::load(dir.path(), TARGET).is_err());
}
