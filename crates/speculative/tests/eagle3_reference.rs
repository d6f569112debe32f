//! The EAGLE-3 head's forward pass against an exact float64 NumPy one
//! (scripts/reference/eagle3_reference.py): a tiny head in SGLang's layout, five rows (three fed
//! the captured target states through `fc`, two fed the head's own carried output), logits and
//! carries within f32 rounding.

use speculative::eagle3::reference::HeadCache;
use speculative::eagle3::{Eagle3Head, TargetShape};
use std::path::PathBuf;

fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

#[test]
fn the_heads_forward_matches_the_float64_reference() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/eagle3/tiny");
    let target = TargetShape {
        n_layers: 8,
        hidden: 16,
        vocab: 100,
    };
    let head = Eagle3Head::load(&dir, target).unwrap();
    assert_eq!(head.draft_to_target[2], 2 * 8 + 3, "target id = i + d2t[i]");
    let case: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
    let mut cache = HeadCache::default();
    let mut carry = Vec::new();
    for r in 0..5 {
        let embedding = floats(&case["embeddings"][r]);
        let feature = match case["features"][r].as_str().unwrap() {
            "state" => floats(&case["states"][r]),
            _ => carry.clone(),
        };
        let out = head.step(&mut cache, &embedding, &feature);
        for (what, got, want) in [
            ("logits", &out.logits, floats(&case["logits"][r])),
            ("carry", &out.carry, floats(&case["carries"][r])),
        ] {
            assert_eq!(got.len(), want.len());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 + 1e-5 * w.abs(),
                    "row {r} {what}[{i}]: {g} vs {w}"
                );
            }
        }
        carry = out.carry;
    }
    assert_eq!(cache.len(&head), 5);
    // Rejected drafts leave the cache; the position after is the next row's.
    cache.truncate(&head, 3);
    assert_eq!(cache.len(&head), 3);
}
