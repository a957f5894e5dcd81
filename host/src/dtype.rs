//! Element types a tensor can hold.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// Signed 8-bit integer (FPGA operands).
    I8,
    /// Signed 32-bit integer (ids, counts, accumulators).
    I32,
}

impl DType {
    /// Every dtype, in a stable order.
    pub const ALL: [DType; 5] = [DType::F32, DType::F16, DType::BF16, DType::I8, DType::I32];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I8 => 1,
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// The lowercase name used in files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::I32 => "i32",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s.to_ascii_lowercase())
            .ok_or_else(|| format!("unknown dtype '{s}' (accepted: f32, f16, bf16, i8, i32)"))
    }
}
