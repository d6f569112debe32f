//! GGML tensor types: ids as GGUF stores them and block geometry.

use std::fmt;

/// A tensor element type. Quantised types store `block_size` values in `type_size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    /// 4-bit indices into a fixed non-linear table of 16 values, an f16 scale per 32.
    IQ4_NL,
    /// IQ4_NL's values with a 6-bit scale per 32 under an f16 scale per 256.
    IQ4_XS,
    BF16,
    /// Integers (index tensors such as an EAGLE-3 head's `d2t`), never weights of a product.
    I32,
    I64,
}

impl GgmlType {
    /// The type for a GGUF type id, or `None` for ids we do not know (or no longer exist).
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            9 => Self::Q8_1,
            10 => Self::Q2_K,
            11 => Self::Q3_K,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            15 => Self::Q8_K,
            20 => Self::IQ4_NL,
            23 => Self::IQ4_XS,
            26 => Self::I32,
            27 => Self::I64,
            30 => Self::BF16,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q8_1 => 9,
            Self::Q2_K => 10,
            Self::Q3_K => 11,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
            Self::Q8_K => 15,
            Self::IQ4_NL => 20,
            Self::IQ4_XS => 23,
            Self::BF16 => 30,
            Self::I32 => 26,
            Self::I64 => 27,
        }
    }

    /// GGML's name for a type id that exists but has no [`GgmlType`] here (the IQ1–IQ3 lattice
    /// types, the ternary and integer ones), for errors that say what a file holds.
    pub fn unsupported_name(id: u32) -> Option<&'static str> {
        Some(match id {
            16 => "IQ2_XXS",
            17 => "IQ2_XS",
            18 => "IQ3_XXS",
            19 => "IQ1_S",
            21 => "IQ3_S",
            22 => "IQ2_S",
            24 => "I8",
            25 => "I16",
            28 => "F64",
            29 => "IQ1_M",
            34 => "TQ1_0",
            35 => "TQ2_0",
            39 => "MXFP4",
            _ => return None,
        })
    }

    /// An integer type (indices, not weights).
    pub fn is_integer(self) -> bool {
        matches!(self, Self::I32 | Self::I64)
    }

    /// Values per block.
    pub fn block_size(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 | Self::I32 | Self::I64 => 1,
            Self::Q4_0
            | Self::Q4_1
            | Self::Q5_0
            | Self::Q5_1
            | Self::Q8_0
            | Self::Q8_1
            | Self::IQ4_NL => 32,
            Self::Q2_K
            | Self::Q3_K
            | Self::Q4_K
            | Self::Q5_K
            | Self::Q6_K
            | Self::Q8_K
            | Self::IQ4_XS => 256,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            Self::F32 | Self::I32 => 4,
            Self::I64 => 8,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q8_1 => 36,
            Self::Q2_K => 84,
            Self::Q3_K => 110,
            Self::Q4_K => 144,
            Self::Q5_K => 176,
            Self::Q6_K => 210,
            Self::Q8_K => 292,
            Self::IQ4_NL => 18,
            Self::IQ4_XS => 136,
        }
    }

    /// Bytes for `n` values (which must be a whole number of blocks).
    pub fn bytes_for(self, n: usize) -> Option<usize> {
        n.is_multiple_of(self.block_size())
            .then(|| (n / self.block_size()).checked_mul(self.type_size()))
            .flatten()
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for id in 0..64 {
            if let Some(t) = GgmlType::from_id(id) {
                assert_eq!(t.id(), id);
            }
        }
        assert_eq!(GgmlType::from_id(4), None, "Q4_2 was removed from GGML");
        for id in 0..64 {
            assert!(
                GgmlType::from_id(id).is_none() || GgmlType::unsupported_name(id).is_none(),
                "type id {id} is both supported and named unsupported"
            );
        }
    }

    #[test]
    fn block_bytes() {
        assert_eq!(GgmlType::Q4_1.bytes_for(64), Some(40));
        assert_eq!(GgmlType::Q6_K.bytes_for(512), Some(420));
        assert_eq!(GgmlType::Q8_0.bytes_for(33), None);
        assert_eq!(GgmlType::F32.bytes_for(3), Some(12));
    }
}
