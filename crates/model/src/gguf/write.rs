//! A small GGUF writer, for tests and tools that build tiny models (version 3, 32-byte alignment).

use super::{GgmlType, MetaValue};

/// Collects metadata and tensors, then lays them out as a GGUF file.
#[derive(Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

const ALIGNMENT: usize = 32;

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn meta(&mut self, key: &str, value: MetaValue) -> &mut Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// An f32 tensor; `shape[0]` is the contiguous dimension.
    pub fn tensor_f32(&mut self, name: &str, shape: &[usize], values: &[f32]) -> &mut Self {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor_raw(name, shape, GgmlType::F32, &bytes)
    }

    /// A tensor of any type from its raw (already quantised) bytes.
    pub fn tensor_raw(
        &mut self,
        name: &str,
        shape: &[usize],
        dtype: GgmlType,
        bytes: &[u8],
    ) -> &mut Self {
        self.tensor_raw_id(name, shape, dtype.id(), bytes)
    }

    /// Like `tensor_raw` with a numeric type id (to write types the reader must refuse).
    pub fn tensor_raw_id(
        &mut self,
        name: &str,
        shape: &[usize],
        type_id: u32,
        bytes: &[u8],
    ) -> &mut Self {
        let shape = shape.iter().map(|&d| d as u64).collect();
        self.tensors
            .push((name.to_string(), shape, type_id, bytes.to_vec()));
        self
    }

    pub fn finish(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut out, key);
            out.extend_from_slice(&type_id(value).to_le_bytes());
            put_value(&mut out, value);
        }
        let mut offset = 0usize;
        let mut offsets = Vec::new();
        for (name, shape, ty, bytes) in &self.tensors {
            put_str(&mut out, name);
            out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for d in shape {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + bytes.len()).next_multiple_of(ALIGNMENT);
        }
        out.resize(out.len().next_multiple_of(ALIGNMENT), 0);
        let data_start = out.len();
        for ((_, _, _, bytes), off) in self.tensors.iter().zip(offsets) {
            out.resize(data_start + off, 0);
            out.extend_from_slice(bytes);
        }
        out
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn type_id(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.push(*x as u8),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(u8::from(*x)),
        MetaValue::String(s) => put_str(out, s),
        MetaValue::Array(items) => {
            let item_type = items.first().map_or(4, type_id);
            out.extend_from_slice(&item_type.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
    }
}
