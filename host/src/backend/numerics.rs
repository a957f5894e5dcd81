//! What a backend's arithmetic does to results: exact f32, 16-bit storage, or int8 fixed
//! point. The planner uses a lossy backend in auto placement only where the user allows it
//! (`crate::plan::PlacementPolicy`).

use std::fmt;

use serde::Serialize;

use crate::dtype::DType;

/// The numerics class of a backend.
///
/// Each class has a declared bound on an op's relative error against the f64 reference
/// ([`Numerics::declared_bound`]): what the planner assumes for an op the backend has not
/// been measured on yet. The bounds are the tolerances the test suites hold each class to:
///
/// | class | storage / math | declared bound |
/// | --- | --- | --- |
/// | `f32` | f32 / f32 | 1e-5 (not lossy) |
/// | `f16` | f16 storage, f32 accumulate | 5e-3 |
/// | `bf16` | bf16 storage, f32 accumulate | 1e-2 |
/// | `int8` | int8 operands with scales, int32 accumulate, fixed-point softmax | 5e-2 |
/// | `fp8` | 16-bit storage, MoE experts on e4m3 operands with f32 scales | 1.5e-1 |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Numerics {
    /// f32 storage and f32 math (the CPU): the reference's own rounding only.
    F32,
    /// Tensors stored as f16, math accumulated in f32.
    F16,
    /// Tensors stored as bf16, math accumulated in f32.
    Bf16,
    /// int8 operands with per-tensor or per-row scales, int32 accumulation, fixed-point
    /// softmax (the FPGA kernels, `fpga::golden`).
    Int8,
    /// 16-bit storage, with the MoE experts on e4m3 weights and activations (per-channel and
    /// per-row f32 scales, f32 accumulation): the CUDA backend with `TANDEM_MOE_FP8`.
    Fp8,
}

impl Numerics {
    /// The class of a backend whose main precision is `dtype` (`DeviceInfo::compute_dtype`).
    pub fn of_dtype(dtype: DType) -> Self {
        match dtype {
            DType::F32 | DType::I32 => Numerics::F32,
            DType::F16 => Numerics::F16,
            DType::BF16 => Numerics::Bf16,
            DType::I8 => Numerics::Int8,
        }
    }

    /// Whether results differ from f32 arithmetic by more than f32 rounding.
    pub fn is_lossy(self) -> bool {
        self != Numerics::F32
    }

    /// The relative error against the f64 reference the planner assumes for an op of this
    /// class that was not measured (see the table on [`Numerics`]).
    pub fn declared_bound(self) -> f64 {
        match self {
            Numerics::F32 => 1e-5,
            Numerics::F16 => 5e-3,
            Numerics::Bf16 => 1e-2,
            Numerics::Int8 => 5e-2,
            Numerics::Fp8 => 1.5e-1,
        }
    }

    /// Short name: `f32`, `f16`, `bf16`, `int8`, `fp8`.
    pub fn name(self) -> &'static str {
        match self {
            Numerics::F32 => "f32",
            Numerics::F16 => "f16",
            Numerics::Bf16 => "bf16",
            Numerics::Int8 => "int8",
            Numerics::Fp8 => "fp8",
        }
    }

    /// What the class means, for messages: `exact f32`, `bf16 storage`, `int8 fixed point`.
    pub fn describe(self) -> &'static str {
        match self {
            Numerics::F32 => "exact f32",
            Numerics::F16 => "f16 storage",
            Numerics::Bf16 => "bf16 storage",
            Numerics::Int8 => "int8 fixed point",
            Numerics::Fp8 => "16-bit storage with e4m3 MoE experts",
        }
    }
}

impl fmt::Display for Numerics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_the_main_precision_and_only_f32_is_exact() {
        assert_eq!(Numerics::of_dtype(DType::F32), Numerics::F32);
        assert_eq!(Numerics::of_dtype(DType::BF16), Numerics::Bf16);
        assert_eq!(Numerics::of_dtype(DType::F16), Numerics::F16);
        assert_eq!(Numerics::of_dtype(DType::I8), Numerics::Int8);
        assert!(!Numerics::F32.is_lossy());
        for n in [Numerics::F16, Numerics::Bf16, Numerics::Int8] {
            assert!(n.is_lossy(), "{n}");
            assert!(n.declared_bound() > Numerics::F32.declared_bound(), "{n}");
        }
        assert!(Numerics::Int8.declared_bound() > Numerics::Bf16.declared_bound());
    }
}
