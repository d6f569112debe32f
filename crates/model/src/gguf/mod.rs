//! GGUF files: metadata, tensor directory and tensor bytes (memory-mapped, never copied).
//!
//! Every count and offset in a file is untrusted: the reader checks each against the bytes that
//! are there, so a truncated or corrupt file gives an error naming what is wrong, never a panic
//! or a huge allocation.

#[cfg(test)]
pub(crate) mod fuzz_tests;
mod reader;
pub mod write;

pub use kernels::quant::GgmlType;

use memmap2::Mmap;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {message}")]
    Io { path: String, message: String },
    #[error("not a GGUF file (magic {0:02x?}, expected \"GGUF\")")]
    BadMagic([u8; 4]),
    #[error("unsupported GGUF version {0} (supported: 2 and 3)")]
    UnsupportedVersion(u32),
    #[error("the file ends early: {0}")]
    Truncated(String),
    #[error("corrupt GGUF: {0}")]
    Corrupt(String),
    #[error("tensor `{name}` has type id {id}{}, which is not supported", kernels::quant::GgmlType::unsupported_name(*id).map(|n| format!(" ({n})")).unwrap_or_default())]
    UnsupportedType { name: String, id: u32 },
    #[error("metadata key `{0}` is missing")]
    MissingKey(String),
    #[error("metadata key `{key}` is {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("tensor `{0}` is missing")]
    MissingTensor(String),
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::U8(_) => "u8",
            Self::I8(_) => "i8",
            Self::U16(_) => "u16",
            Self::I16(_) => "i16",
            Self::U32(_) => "u32",
            Self::I32(_) => "i32",
            Self::U64(_) => "u64",
            Self::I64(_) => "i64",
            Self::F32(_) => "f32",
            Self::F64(_) => "f64",
            Self::Bool(_) => "bool",
            Self::String(_) => "a string",
            Self::Array(_) => "an array",
        }
    }

    /// Any integer type, as i128 (wide enough for every GGUF integer).
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Self::U8(v) => v.into(),
            Self::I8(v) => v.into(),
            Self::U16(v) => v.into(),
            Self::I16(v) => v.into(),
            Self::U32(v) => v.into(),
            Self::I32(v) => v.into(),
            Self::U64(v) => v.into(),
            Self::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Any number, as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            _ => self.as_int().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Where a tensor is and what it holds. `shape[0]` is the innermost (contiguous) dimension, as in
/// GGML: a weight matrix of `shape = [k, n]` has `n` rows of `k` values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: usize,
    pub n_bytes: usize,
}

impl TensorInfo {
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A tensor's info and its bytes in the file.
#[derive(Debug, Clone, Copy)]
pub struct TensorData<'a> {
    pub info: &'a TensorInfo,
    pub bytes: &'a [u8],
}

enum Storage {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// An open GGUF file.
pub struct GgufFile {
    pub version: u32,
    metadata: BTreeMap<String, MetaValue>,
    tensors: Vec<TensorInfo>,
    data_start: usize,
    storage: Storage,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens and maps a file; reads its header, metadata and tensor directory.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |e: std::io::Error| GgufError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; like every mmap user we assume nobody truncates the model
        // file while it is being served (that would be a SIGBUS, not memory unsafety in our code).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(Storage::Mapped(map))
    }

    /// Parses a GGUF image held in memory (tests, small files).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::parse(Storage::Owned(bytes))
    }

    fn parse(storage: Storage) -> Result<Self, GgufError> {
        let parsed = reader::parse(storage.bytes())?;
        Ok(Self {
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            data_start: parsed.data_start,
            storage,
        })
    }

    pub fn metadata(&self) -> &BTreeMap<String, MetaValue> {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    fn require(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.metadata
            .get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    fn wrong(&self, key: &str, expected: &'static str) -> GgufError {
        GgufError::WrongType {
            key: key.to_string(),
            expected,
            found: self
                .metadata
                .get(key)
                .map_or("missing", MetaValue::type_name),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        self.require(key)?
            .as_str()
            .ok_or_else(|| self.wrong(key, "a string"))
    }

    /// An integer key that must fit a `u32`.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.require(key)?
            .as_int()
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| self.wrong(key, "an integer in u32 range"))
    }

    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        self.require(key)?
            .as_f64()
            .map(|v| v as f32)
            .ok_or_else(|| self.wrong(key, "a number"))
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            MetaValue::Bool(b) => Ok(*b),
            _ => Err(self.wrong(key, "a bool")),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<&[MetaValue], GgufError> {
        self.require(key)?
            .as_array()
            .ok_or_else(|| self.wrong(key, "an array"))
    }

    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        self.get_array(key)?
            .iter()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.wrong(key, "an array of strings"))
            })
            .collect()
    }

    /// `general.architecture` (e.g. "llama").
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// A tensor's bytes (bounds were checked when the file was opened).
    pub fn tensor(&self, name: &str) -> Result<TensorData<'_>, GgufError> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))?;
        Ok(TensorData {
            info,
            bytes: &self.storage.bytes()[self.data_range(info)],
        })
    }

    /// Bytes of the whole file (mapped).
    pub fn file_size(&self) -> usize {
        self.storage.bytes().len()
    }

    /// The whole file's bytes; with [`GgufFile::data_range`] this lets a model keep plain ranges
    /// instead of borrowing the file.
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// Drops this process's resident pages of `range` (of [`GgufFile::bytes`]), for tensors
    /// copied elsewhere at load: they stop counting towards resident memory, and a later read
    /// faults them back in from the file unchanged.
    pub fn release(&self, range: std::ops::Range<usize>) {
        if let Storage::Mapped(map) = &self.storage
            && range.end <= map.len()
            && !range.is_empty()
        {
            // SAFETY: the map is a read-only mapping of a file nobody writes (see `open`), so
            // the pages that come back on the next read hold the same bytes: no borrow of the
            // map observes a change.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    range.start,
                    range.len(),
                )
            };
        }
    }

    /// Where a tensor's bytes lie in [`GgufFile::bytes`].
    pub fn data_range(&self, info: &TensorInfo) -> std::ops::Range<usize> {
        let start = self.data_start + info.offset;
        start..start + info.n_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::write::GgufWriter;
    use super::*;

    fn sample() -> Vec<u8> {
        let mut w = GgufWriter::new();
        w.meta("general.architecture", MetaValue::String("llama".into()));
        w.meta("llama.block_count", MetaValue::U32(2));
        w.meta("llama.rope.freq_base", MetaValue::F32(10000.0));
        w.meta("tokenizer.ggml.add_bos_token", MetaValue::Bool(true));
        w.meta(
            "tokenizer.ggml.tokens",
            MetaValue::Array(vec![
                MetaValue::String("a".into()),
                MetaValue::String("b".into()),
            ]),
        );
        w.tensor_f32("norm.weight", &[4], &[1.0, 2.0, 3.0, 4.0]);
        w.tensor_raw("q.weight", &[32, 2], GgmlType::Q8_0, &[7u8; 68]);
        w.finish()
    }

    #[test]
    fn reads_metadata_and_tensors() {
        let f = GgufFile::from_bytes(sample()).unwrap();
        assert_eq!(f.version, 3);
        assert_eq!(f.architecture().unwrap(), "llama");
        assert_eq!(f.get_u32("llama.block_count").unwrap(), 2);
        assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), 10000.0);
        assert!(f.get_bool("tokenizer.ggml.add_bos_token").unwrap());
        assert_eq!(
            f.get_str_array("tokenizer.ggml.tokens").unwrap(),
            ["a", "b"]
        );
        let norm = f.tensor("norm.weight").unwrap();
        assert_eq!(norm.info.shape, [4]);
        assert_eq!(norm.bytes.len(), 16);
        assert_eq!(
            f32::from_le_bytes(norm.bytes[4..8].try_into().unwrap()),
            2.0
        );
        let q = f.tensor("q.weight").unwrap();
        assert_eq!(
            (q.info.dtype, q.info.n_elements(), q.bytes.len()),
            (GgmlType::Q8_0, 64, 68)
        );
        assert_eq!(q.bytes, &[7u8; 68]);
    }

    #[test]
    fn wrong_and_missing_keys_are_named() {
        let f = GgufFile::from_bytes(sample()).unwrap();
        let e = f.get_u32("general.architecture").unwrap_err().to_string();
        assert!(
            e.contains("general.architecture") && e.contains("a string"),
            "{e}"
        );
        let e = f.get_str("nope").unwrap_err().to_string();
        assert_eq!(e, "metadata key `nope` is missing");
        assert!(matches!(f.tensor("x"), Err(GgufError::MissingTensor(_))));
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let bytes = sample();
        for cut in 0..bytes.len() {
            let r = GgufFile::from_bytes(bytes[..cut].to_vec());
            assert!(r.is_err(), "a file cut at {cut} of {} parsed", bytes.len());
        }
    }

    #[test]
    fn a_truncated_or_misshapen_k_quant_tensor_is_an_error_naming_it() {
        for dtype in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q2_K] {
            let data = vec![0x5au8; 2 * dtype.type_size()];
            let mut w = GgufWriter::new();
            w.tensor_raw("blk.0.ffn_down.weight", &[256, 2], dtype, &data);
            let bytes = w.finish();
            for cut in bytes.len() - data.len()..bytes.len() {
                let e = GgufFile::from_bytes(bytes[..cut].to_vec())
                    .unwrap_err()
                    .to_string();
                assert!(
                    e.contains("`blk.0.ffn_down.weight`"),
                    "{dtype} cut at {cut}: {e}"
                );
            }
            let mut w = GgufWriter::new();
            w.tensor_raw("odd", &[100], dtype, &data);
            let e = GgufFile::from_bytes(w.finish()).unwrap_err().to_string();
            assert!(e.contains("`odd`") && e.contains("blocks"), "{e}");
        }
    }

    #[test]
    fn corrupt_bytes_never_panic() {
        let bytes = sample();
        // Flip each byte of the header and directory in turn; any outcome but a panic is fine.
        for i in 0..bytes.len().min(400) {
            for v in [0x00, 0xff, 0x80] {
                let mut b = bytes.clone();
                b[i] = v;
                let _ = GgufFile::from_bytes(b);
            }
        }
    }

    #[test]
    fn bad_magic_version_and_type_are_named() {
        let mut b = sample();
        b[0] = b'X';
        assert!(matches!(
            GgufFile::from_bytes(b),
            Err(GgufError::BadMagic(_))
        ));
        let mut b = sample();
        b[4] = 9;
        assert!(matches!(
            GgufFile::from_bytes(b),
            Err(GgufError::UnsupportedVersion(9))
        ));
        let mut w = GgufWriter::new();
        w.tensor_raw_id("odd", &[32], 16, &[0u8; 8]);
        let e = GgufFile::from_bytes(w.finish()).unwrap_err().to_string();
        assert_eq!(
            e,
            "tensor `odd` has type id 16 (IQ2_XXS), which is not supported"
        );
        let mut w = GgufWriter::new();
        w.tensor_raw_id("odd", &[32], 60, &[0u8; 8]);
        let e = GgufFile::from_bytes(w.finish()).unwrap_err().to_string();
        assert_eq!(e, "tensor `odd` has type id 60, which is not supported");
    }

    #[test]
    fn opens_files_from_disk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, sample()).unwrap();
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.tensors().len(), 2);
        let e = GgufFile::open(&dir.path().join("none.gguf"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("cannot read ") && e.contains("none.gguf"),
            "{e}"
        );
    }
}
