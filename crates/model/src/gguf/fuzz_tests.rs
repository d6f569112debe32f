//! Fuzz targets for the GGUF reader, run as proptest tests in every `cargo test`: arbitrary bytes,
//! and the seed files of `testdata/fuzz/gguf` (and a file with every metadata type built here)
//! with bytes flipped, ranges cut or repeated, the end truncated, and counts, lengths, type ids
//! and dimensions overwritten with huge values. Every file must open or be an error (never a
//! panic), and the reader may allocate no more than a small multiple of the file's size (a
//! count of 2^60 strings is not reserved up front). A file that opens goes on through what
//! reads GGUF metadata: every getter, the model configuration, the tokenizer (then encoding and
//! decoding) and the chat template. `SPECULA_FUZZ_CASES=N` runs N cases instead of the default.
//!
//! The harness ([`fuzz`], [`seeds`], [`mutated`]) is shared with the chat template's targets.

use super::write::GgufWriter;
use super::{GgmlType, GgufFile, MetaValue};
use crate::chat_template::{ChatOptions, ChatTemplate};
use crate::config::ModelConfig;
use crate::tokenizer::Tokenizer;
pub(crate) use fuzzing::Bytes;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::json;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

// ---------------------------------------------------------------------------------------------
// The harness.

/// Runs `test` on the cases of the strategy `make` builds (the shared harness).
pub(crate) fn fuzz<S, F, T>(default: u32, make: F, test: T)
where
    S: Strategy + 'static,
    F: FnOnce() -> S + Send + 'static,
    T: Fn(S::Value) -> Result<(), TestCaseError> + Send + 'static,
{
    fuzzing::DEFAULT.run(default, make, test)
}

/// The seed files of this target's folder, in name order.
pub(crate) fn seeds(dir: &str) -> Vec<Vec<u8>> {
    fuzzing::seeds(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/fuzz")
            .join(dir),
    )
}

/// Little-endian values a count, length, type or dimension is overwritten with.
const HUGE: [u64; 10] = [
    1 << 60,
    u64::MAX,
    1 << 32,
    (1 << 32) - 1,
    1 << 31,
    1 << 20,
    0,
    1,
    13,
    0x4747_5546,
];

/// A seed with a few edits: bits flipped, bytes set, `tokens` inserted, ranges deleted or
/// repeated, the end cut off, another seed's tail spliced in, or 8 or 4 bytes overwritten with
/// one of [`HUGE`].
pub(crate) fn mutated(
    seeds: Vec<Vec<u8>>,
    tokens: &'static [&'static str],
) -> impl Strategy<Value = Bytes> {
    let with = fuzzing::Mutations {
        tokens,
        splice: true,
        huge: &HUGE,
    };
    fuzzing::mutated(seeds, with)
}

// ---------------------------------------------------------------------------------------------
// The largest allocation of this thread, for the reader's bound.

/// The system allocator, noting each thread's largest allocation since it last asked.
struct Tracking;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

/// This thread's largest allocation since the last call.
fn largest_allocation() -> usize {
    LARGEST.with(|l| l.replace(0))
}

// SAFETY: every call goes to `System` with the same arguments; noting a size allocates nothing.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` (every allocation here does) with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: as for `dealloc`, and the caller's contract for `new_size`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Tracking = Tracking;

// ---------------------------------------------------------------------------------------------
// The target.

/// A file with every metadata type (arrays of arrays too) and tensors of several types.
fn every_type() -> Vec<u8> {
    let strings =
        |v: &[&str]| MetaValue::Array(v.iter().map(|s| MetaValue::String(s.to_string())).collect());
    let mut w = GgufWriter::new();
    w.meta("general.architecture", MetaValue::String("llama".into()))
        .meta("general.alignment", MetaValue::U32(64))
        .meta("u8", MetaValue::U8(1))
        .meta("i8", MetaValue::I8(-1))
        .meta("u16", MetaValue::U16(2))
        .meta("i16", MetaValue::I16(-2))
        .meta("i32", MetaValue::I32(-3))
        .meta("u64", MetaValue::U64(1 << 40))
        .meta("i64", MetaValue::I64(-(1 << 40)))
        .meta("f64", MetaValue::F64(0.5))
        .meta("bool", MetaValue::Bool(true))
        .meta("tokenizer.ggml.tokens", strings(&["a", "é", ""]))
        .meta(
            "nested",
            MetaValue::Array(vec![
                MetaValue::Array(vec![MetaValue::F32(1.0)]),
                MetaValue::Array(vec![]),
            ]),
        );
    w.tensor_f32("norm.weight", &[4], &[1.0, 2.0, 3.0, 4.0])
        .tensor_raw("q.weight", &[32, 2], GgmlType::Q8_0, &[7u8; 68])
        .tensor_raw("k.weight", &[256], GgmlType::Q4_K, &[0u8; 144])
        .tensor_raw("h.weight", &[8], GgmlType::F16, &[0u8; 16]);
    w.finish()
}

/// Texts a tokenizer that loaded encodes.
const TEXTS: [&str; 4] = [
    "",
    "hello world",
    "<|im_start|>user\né<|im_end|>",
    "\u{0}\u{ffff}ab ab",
];

/// Everything that reads a GGUF file, on `bytes`: errors are fine, panics and allocations far
/// past the file's size are not.
fn open(bytes: &[u8]) -> Result<(), TestCaseError> {
    let owned = bytes.to_vec();
    largest_allocation();
    let parsed = GgufFile::from_bytes(owned);
    let largest = largest_allocation();
    let bound = 256 * bytes.len() + (1 << 20);
    prop_assert!(
        largest <= bound,
        "{largest} bytes allocated for a file of {}",
        bytes.len()
    );
    let Ok(f) = parsed else {
        return Ok(());
    };
    for t in f.tensors() {
        // By name: the first tensor of that name (a file may repeat one).
        let data = f
            .tensor(&t.name)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(data.bytes.len(), data.info.n_bytes);
        let range = f.data_range(t);
        prop_assert!(range.len() == t.n_bytes && range.end <= f.file_size());
    }
    for key in f.metadata().keys() {
        let _ = (
            f.get_str(key),
            f.get_u32(key),
            f.get_f32(key),
            f.get_bool(key),
        );
        let _ = f.get_str_array(key);
    }
    let _ = ModelConfig::from_gguf(&f);
    let Ok(tok) = Tokenizer::from_gguf(&f) else {
        return Ok(());
    };
    for text in TEXTS {
        for (add, parse) in [(false, false), (true, true)] {
            if let Ok(ids) = tok.encode(text, add, parse) {
                let _ = tok.decode(&ids, false);
            }
        }
    }
    let _ = tok.decode(&[0, 1, u32::MAX, tok.vocab_size() as u32], true);
    if let Ok(t) = ChatTemplate::from_gguf(&f, &tok) {
        let _ = t.render(
            &[json!({"role": "user", "content": "hi"})],
            &ChatOptions::default(),
        );
    }
    Ok(())
}

/// Pieces a mutation inserts.
const GGUF_TOKENS: &[&str] = &[
    "GGUF",
    "\u{3}\u{0}\u{0}\u{0}",
    "\u{8}\u{0}\u{0}\u{0}",
    "\u{9}\u{0}\u{0}\u{0}",
    "\u{ff}\u{ff}\u{ff}\u{ff}\u{ff}\u{ff}\u{ff}\u{f}",
    "general.architecture",
    "tokenizer.ggml.tokens",
    "tokenizer.chat_template",
    "{% for m in messages %}",
];

#[test]
fn fuzz_gguf_bytes() {
    fuzz(
        2000,
        || {
            let mut seeds = seeds("gguf");
            seeds.push(every_type());
            prop_oneof![
                1 => vec(any::<u8>(), 0..96).prop_map(|mut b| {
                    // Past the magic and version, most of the time.
                    if b.len() >= 8 && b[0] % 4 != 0 {
                        b[..8].copy_from_slice(b"GGUF\x03\0\0\0");
                    }
                    Bytes(b)
                }),
                6 => mutated(seeds, GGUF_TOKENS),
            ]
        },
        |b| open(&b.0),
    );
}

/// A GGUF header (version 3) declaring `tensors` and `metadata` entries, then `rest`.
fn header(tensors: u64, metadata: u64, rest: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF\x03\0\0\0".to_vec();
    b.extend_from_slice(&tensors.to_le_bytes());
    b.extend_from_slice(&metadata.to_le_bytes());
    b.extend_from_slice(rest);
    b
}

/// A metadata key, as the file writes it.
fn key(name: &str) -> Vec<u8> {
    let mut b = (name.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(name.as_bytes());
    b
}

#[test]
fn huge_declared_counts_are_errors_without_huge_allocations() {
    let huge = 1u64 << 60;
    let array = |item_type: u32, n: u64| {
        let mut b = key("a");
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&item_type.to_le_bytes());
        b.extend_from_slice(&n.to_le_bytes());
        b.extend_from_slice(&[0u8; 64]);
        b
    };
    let mut tensor = key("t");
    tensor.extend_from_slice(&4u32.to_le_bytes());
    for d in [huge, huge, 1, 1] {
        tensor.extend_from_slice(&d.to_le_bytes());
    }
    let files = [
        header(huge, 0, &[]),
        header(0, huge, &[0; 64]),
        header(0, 1, &(huge.to_le_bytes())),
        header(0, 1, &array(8, huge)),
        header(0, 1, &array(9, huge)),
        header(0, 1, &array(0, u64::MAX)),
        header(1, 0, &tensor),
        header(u64::MAX, u64::MAX, &[0xff; 64]),
    ];
    for (i, bytes) in files.iter().enumerate() {
        let owned = bytes.clone();
        largest_allocation();
        assert!(GgufFile::from_bytes(owned).is_err(), "file {i} opened");
        let largest = largest_allocation();
        assert!(largest < 1 << 20, "file {i}: {largest} bytes allocated");
    }
}

#[test]
fn the_seeds_that_should_open_do() {
    for name in ["bpe_llama.gguf", "spm_gemma3.gguf", "every_type.gguf"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/fuzz/gguf")
            .join(name);
        let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        if name != "every_type.gguf" {
            Tokenizer::from_gguf(&f).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
    assert!(GgufFile::from_bytes(every_type()).is_ok());
}
