//! The GGUF parser: a bounds-checked cursor over the file's bytes.

use super::{GgmlType, GgufError, MetaValue, TensorInfo};
use std::collections::BTreeMap;

pub(super) struct Parsed {
    pub version: u32,
    pub metadata: BTreeMap<String, MetaValue>,
    pub tensors: Vec<TensorInfo>,
    pub data_start: usize,
}

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: usize = 32;
/// Arrays nest (an array of arrays); real files never go deeper than 2.
const MAX_DEPTH: usize = 4;

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| GgufError::Truncated(format!("{what} at byte {}", self.pos)))?;
        let slice = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        Ok(self.take(N, what)?.try_into().expect("took N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count that must not promise more items than bytes remain (each item takes ≥ 1 byte).
    fn count(&mut self, what: &str) -> Result<usize, GgufError> {
        let n = self.u64(what)?;
        let left = (self.bytes.len() - self.pos) as u64;
        if n > left {
            return Err(GgufError::Corrupt(format!(
                "{what} is {n}, but only {left} bytes follow"
            )));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let n = self.count(what)?;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| GgufError::Corrupt(format!("{what} is not UTF-8")))
    }

    fn value(&mut self, type_id: u32, key: &str, depth: usize) -> Result<MetaValue, GgufError> {
        let v = match type_id {
            0 => MetaValue::U8(self.array::<1>(key)?[0]),
            1 => MetaValue::I8(self.array::<1>(key)?[0] as i8),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(key)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(key)?)),
            4 => MetaValue::U32(self.u32(key)?),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(key)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(key)?)),
            7 => MetaValue::Bool(self.array::<1>(key)?[0] != 0),
            8 => MetaValue::String(self.string(key)?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(GgufError::Corrupt(format!(
                        "`{key}`: arrays nested too deep"
                    )));
                }
                let item_type = self.u32(key)?;
                let n = self.count(key)?;
                let mut items = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    items.push(self.value(item_type, key, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(self.u64(key)?),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(key)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(key)?)),
            t => {
                return Err(GgufError::Corrupt(format!(
                    "metadata `{key}` has unknown value type {t}"
                )));
            }
        };
        Ok(v)
    }
}

pub(super) fn parse(bytes: &[u8]) -> Result<Parsed, GgufError> {
    let mut c = Cursor { bytes, pos: 0 };
    let magic: [u8; 4] = c.array("the magic number")?;
    if &magic != MAGIC {
        return Err(GgufError::BadMagic(magic));
    }
    let version = c.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let n_tensors = c.count("the tensor count")?;
    let n_meta = c.count("the metadata count")?;

    let mut metadata = BTreeMap::new();
    for i in 0..n_meta {
        let key = c.string(&format!("metadata key {i}"))?;
        let type_id = c.u32(&key)?;
        let value = c.value(type_id, &key, 0)?;
        metadata.insert(key, value);
    }

    // The count is checked against the bytes left, not against memory: grow as entries parse.
    let mut tensors = Vec::with_capacity(n_tensors.min(1 << 16));
    for i in 0..n_tensors {
        let name = c.string(&format!("tensor name {i}"))?;
        let n_dims = c.u32(&name)? as usize;
        if n_dims == 0 || n_dims > 4 {
            return Err(GgufError::Corrupt(format!(
                "tensor `{name}` has {n_dims} dimensions"
            )));
        }
        let mut shape = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            let d = c.u64(&name)?;
            shape.push(usize::try_from(d).map_err(|_| {
                GgufError::Corrupt(format!("tensor `{name}` dimension {d} is too large"))
            })?);
        }
        let type_id = c.u32(&name)?;
        let dtype = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnsupportedType {
            name: name.clone(),
            id: type_id,
        })?;
        let offset = c.u64(&name)?;
        let n_elements = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| GgufError::Corrupt(format!("tensor `{name}` is impossibly large")))?;
        let n_bytes = dtype.bytes_for(n_elements).ok_or_else(|| {
            GgufError::Corrupt(format!(
                "tensor `{name}` has {n_elements} values, not a whole number of {dtype} blocks"
            ))
        })?;
        let offset = usize::try_from(offset)
            .map_err(|_| GgufError::Corrupt(format!("tensor `{name}` offset is too large")))?;
        tensors.push(TensorInfo {
            name,
            shape,
            dtype,
            offset,
            n_bytes,
        });
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => v
            .as_int()
            .and_then(|a| usize::try_from(a).ok())
            .filter(|a| a.is_power_of_two())
            .ok_or_else(|| GgufError::Corrupt("general.alignment is not a power of two".into()))?,
    };
    let data_start = c.pos.next_multiple_of(alignment);
    for t in &tensors {
        let end = data_start
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.n_bytes));
        if end.is_none_or(|end| end > bytes.len()) {
            return Err(GgufError::Truncated(format!(
                "tensor `{}` needs bytes up to {} but the file has {}",
                t.name,
                end.map_or("beyond usize".to_string(), |e| e.to_string()),
                bytes.len()
            )));
        }
    }
    Ok(Parsed {
        version,
        metadata,
        tensors,
        data_start,
    })
}
