//! The KV store's element types: f32, and f16 at half the bytes (rounded to nearest once, when
//! a key or value is written; widened exactly when read).

use half::f16;

/// What the KV store holds (`--kv-cache-dtype`): f32 by default, the store whose every read is
/// the value computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvDtype {
    #[default]
    F32,
    F16,
}

/// A `--kv-cache-dtype` name that is not one of [`KvDtype::NAMES`].
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown KV cache dtype {0:?} (expected f32 or f16)")]
pub struct UnknownKvDtype(pub String);

impl KvDtype {
    /// Every dtype by name, as flags and configs spell them.
    pub const NAMES: [(&'static str, KvDtype); 2] = [("f32", KvDtype::F32), ("f16", KvDtype::F16)];

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
        }
    }

    /// Bytes of one element.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvDtype {
    type Err = UnknownKvDtype;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::NAMES
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(s))
            .map(|&(_, d)| d)
            .ok_or_else(|| UnknownKvDtype(s.to_string()))
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
}

/// An element of the KV store: [`f32`] or [`f16`] (the kernels read each by its [`KvDtype`]).
pub trait KvElem:
    Copy + Default + Send + Sync + std::fmt::Debug + 'static + sealed::Sealed
{
    const DTYPE: KvDtype;
    /// The stored form of `x` (f16: rounded to nearest, ties to even).
    fn from_f32(x: f32) -> Self;
    /// The stored value, exactly.
    fn to_f32(self) -> f32;
    /// Writes the element's little-endian bytes into `out` ([`KvDtype::bytes`] long).
    fn put_le(self, out: &mut [u8]);
    /// The element from [`KvDtype::bytes`] little-endian bytes.
    fn from_le(bytes: &[u8]) -> Self;
}

impl KvElem for f32 {
    const DTYPE: KvDtype = KvDtype::F32;
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    fn put_le(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_le_bytes());
    }
    fn from_le(b: &[u8]) -> Self {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl KvElem for f16 {
    const DTYPE: KvDtype = KvDtype::F16;
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn put_le(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_le_bytes());
    }
    fn from_le(b: &[u8]) -> Self {
        f16::from_le_bytes([b[0], b[1]])
    }
}

/// `src` as little-endian bytes into `out` (`src.len() × E::DTYPE.bytes()` long): a copy.
pub fn write_le<E: KvElem>(src: &[E], out: &mut [u8]) {
    assert_eq!(out.len(), src.len() * E::DTYPE.bytes(), "whole elements");
    #[cfg(target_endian = "little")]
    {
        // SAFETY: f32 and f16 (the only `KvElem`s) are plain bytes with no padding, laid out in
        // memory as their little-endian encoding here; the length was checked.
        let bytes = unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), out.len()) };
        out.copy_from_slice(bytes);
    }
    #[cfg(not(target_endian = "little"))]
    for (b, &x) in out.chunks_exact_mut(E::DTYPE.bytes()).zip(src) {
        x.put_le(b);
    }
}

/// The inverse of [`write_le`]: `data` (little-endian) into `dst`.
pub fn read_le<E: KvElem>(data: &[u8], dst: &mut [E]) {
    assert_eq!(data.len(), dst.len() * E::DTYPE.bytes(), "whole elements");
    #[cfg(target_endian = "little")]
    {
        // SAFETY: as in `write_le`; every bit pattern is a valid f32 or f16.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<u8>(), data.len()) };
        bytes.copy_from_slice(data);
    }
    #[cfg(not(target_endian = "little"))]
    for (x, b) in dst.iter_mut().zip(data.chunks_exact(E::DTYPE.bytes())) {
        *x = E::from_le(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_errors() {
        for (name, d) in KvDtype::NAMES {
            assert_eq!(name.parse::<KvDtype>().unwrap(), d);
            assert_eq!(d.name(), name);
        }
        assert_eq!("F16".parse::<KvDtype>().unwrap(), KvDtype::F16);
        let e = "fp8".parse::<KvDtype>().unwrap_err().to_string();
        assert!(e.contains("fp8") && e.contains("f32 or f16"), "{e}");
    }

    #[test]
    fn f16_rounds_to_nearest_and_reads_back_exactly() {
        // 1 + 2⁻¹¹ lies halfway between f16's 1 and 1 + 2⁻¹⁰: ties go to the even (1).
        assert_eq!(f16::from_f32(1.0 + 2f32.powi(-11)).to_f32(), 1.0);
        assert_eq!(
            <f16 as KvElem>::from_f32(1.0 + 3.0 * 2f32.powi(-11)).to_f32(),
            1.0 + 2.0 * 2f32.powi(-10)
        );
        for x in [0.0f32, -2.5, 65504.0, 6.1e-5, 1e-7] {
            let h = <f16 as KvElem>::from_f32(x);
            let mut bytes = [0u8; 2];
            assert_eq!(bytes.len(), KvDtype::F16.bytes());
            h.put_le(&mut bytes);
            assert_eq!(<f16 as KvElem>::from_le(&bytes), h);
        }
    }

    #[test]
    fn slices_copy_as_the_elements_little_endian_bytes() {
        let xs = [1.5f32, -0.0, f32::MAX, 3e-41];
        let mut bytes = [0u8; 16];
        write_le(&xs, &mut bytes);
        let mut want = [0u8; 16];
        for (b, x) in want.chunks_exact_mut(4).zip(xs) {
            x.put_le(b);
        }
        assert_eq!(bytes, want);
        let mut back = [0.0f32; 4];
        read_le(&bytes, &mut back);
        assert_eq!(back.map(f32::to_bits), xs.map(f32::to_bits));
        let hs = xs.map(<f16 as KvElem>::from_f32);
        let mut hb = [0u8; 8];
        write_le(&hs, &mut hb);
        assert_eq!(&hb[..2], &hs[0].to_le_bytes());
        let mut hback = [f16::ZERO; 4];
        read_le(&hb, &mut hback);
        assert_eq!(hback.map(f16::to_bits), hs.map(f16::to_bits));
    }
}
