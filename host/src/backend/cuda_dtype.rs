//! The storage precision of the CUDA backend, chosen by `TANDEM_CUDA_DTYPE` (read by
//! [`crate::options::CudaOptions`]) or `--cuda-dtype` (kept outside the `cuda` module so the
//! CLI and the options have it in builds without CUDA).

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::Op;

/// The precision a CUDA device stores logical f32 tensors in; the math accumulates in f32
/// either way (tensor-core products, reductions, softmax).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CudaDType {
    /// bfloat16 (the default): f32's range, 8 significant bits.
    #[default]
    Bf16,
    /// IEEE binary16: 11 significant bits, finite values up to 65504.
    F16,
}

impl CudaDType {
    /// Every storage precision, the default first.
    pub const ALL: [CudaDType; 2] = [CudaDType::Bf16, CudaDType::F16];

    /// The environment variable that chooses the precision when no flag does.
    pub const ENV: &'static str = "TANDEM_CUDA_DTYPE";

    /// The name used on the command line and in the environment: `bf16` or `f16`.
    pub fn name(self) -> &'static str {
        match self {
            CudaDType::Bf16 => "bf16",
            CudaDType::F16 => "f16",
        }
    }

    /// The tensor dtype of the storage.
    pub fn dtype(self) -> DType {
        match self {
            CudaDType::Bf16 => DType::BF16,
            CudaDType::F16 => DType::F16,
        }
    }

    /// Relative-error bound tandem's tests and reports hold a CUDA op to against the f64
    /// reference in this storage: 1e-2 for bf16, 5e-3 for f16.
    pub fn tolerance(self) -> f64 {
        match self {
            CudaDType::Bf16 => 1e-2,
            CudaDType::F16 => 5e-3,
        }
    }

    /// Parses `bf16` or `f16` (any case); `source` names where the value came from in the
    /// error (a flag or the environment variable).
    pub fn parse_from(value: &str, source: &str) -> Result<Self> {
        let v = value.trim().to_ascii_lowercase();
        CudaDType::ALL
            .into_iter()
            .find(|d| d.name() == v)
            .ok_or_else(|| {
                Error::invalid(
                    source,
                    format!(
                        "'{value}' is not a CUDA storage precision (accepted: {})",
                        Self::accepted()
                    ),
                )
            })
    }

    /// The device precision of input `input` of `op` uploaded from a float host tensor: the
    /// storage precision, except `moe_route`'s logits, kept f32 (routing decides where tokens
    /// go: rounded logits turn near-ties into different experts than the f32 reference picks,
    /// and the logits are small, T x E).
    pub fn input_precision(self, op: &Op, input: usize) -> DType {
        match (op, input) {
            (Op::MoeRoute(_), 0) => DType::F32,
            _ => self.dtype(),
        }
    }

    fn accepted() -> String {
        CudaDType::ALL.map(|d| d.name()).join(", ")
    }
}

impl fmt::Display for CudaDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CudaDType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse_from(s, "CUDA storage precision")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn names_parse_back() {
        for d in CudaDType::ALL {
            assert_eq!(d.name().parse::<CudaDType>().ok(), Some(d));
            assert_eq!(d.to_string(), d.name());
        }
        assert_eq!(" F16 ".parse::<CudaDType>().ok(), Some(CudaDType::F16));
        assert_eq!(CudaDType::default(), CudaDType::Bf16);
        assert_eq!(CudaDType::F16.dtype(), DType::F16);
        assert_eq!(CudaDType::Bf16.dtype(), DType::BF16);
        assert!(CudaDType::F16.tolerance() < CudaDType::Bf16.tolerance());
    }

    #[test]
    fn router_logits_stay_f32() {
        use crate::ops::{MoeRouteParams, RmsNormParams};
        let route = Op::MoeRoute(MoeRouteParams::default());
        let norm = Op::RmsNorm(RmsNormParams {
            eps: 1e-6,
            residual: false,
        });
        for d in CudaDType::ALL {
            assert_eq!(d.input_precision(&route, 0), DType::F32);
            assert_eq!(d.input_precision(&norm, 0), d.dtype());
            assert_eq!(d.input_precision(&Op::Add, 1), d.dtype());
        }
    }

    #[test]
    fn bad_values_name_the_value_and_the_accepted_ones() {
        for bad in ["f8", "f32", "fp16", "bfloat16x"] {
            let e = bad.parse::<CudaDType>().expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            let m = e.to_string();
            assert!(m.contains(&format!("'{bad}'")), "{m}");
            assert!(m.contains("accepted: bf16, f16"), "{m}");
        }
    }
}
