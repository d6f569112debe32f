//! Our dequantisation against the `gguf` Python package's, on random blocks of every type
//! (fixture made by scripts/kernels/make_dequant_reference.py).

use kernels::quant::{GgmlType, dequantize};
use serde_json::Value;

fn ggml_type(name: &str) -> GgmlType {
    (0..64)
        .filter_map(GgmlType::from_id)
        .find(|t| t.to_string() == name)
        .unwrap_or_else(|| panic!("unknown type {name}"))
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn dequantisation_matches_the_gguf_package_bit_for_bit() {
    let fixture: Value = serde_json::from_str(include_str!("data/dequant_reference.json")).unwrap();
    let cases = fixture.as_object().unwrap();
    assert!(cases.len() >= 13, "every supported type is covered");
    for (name, case) in cases {
        let dtype = ggml_type(name);
        let bytes = hex(case["bytes"].as_str().unwrap());
        let expected: Vec<f32> = case["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let mut got = vec![0f32; expected.len()];
        dequantize(dtype, &bytes, &mut got).unwrap();
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert!(
                g.to_bits() == e.to_bits() || (g - e).abs() <= 1e-6 * e.abs().max(1.0),
                "{name} value {i}: ours {g}, gguf {e}"
            );
        }
    }
}
