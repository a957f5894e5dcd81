//! Rotary position embedding, rotate-half form, on x [B, H, T, D] (D even): position of row t is
//! `position_offset + t`; inv_freq_i = base^(-2i/D); y = x * cos + rotate_half(x) * sin with
//! rotate_half(x) = [-x2, x1].

use ndarray::ArrayD;
use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorMeta};

/// Parameters of RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RopeParams {
    /// theta (10000 in Llama/Mixtral).
    pub base: f64,
    /// Position of the first row.
    pub position_offset: usize,
}

impl Default for RopeParams {
    fn default() -> Self {
        Self {
            base: 10000.0,
            position_offset: 0,
        }
    }
}

impl RopeParams {
    /// Output meta: x's.
    pub fn validate(&self, inputs: &[TensorMeta]) -> Result<Vec<TensorMeta>> {
        let op = "rope";
        let x = &inputs[0];
        if x.dtype != DType::F32 {
            return Err(Error::invalid(
                op,
                format!("x is {}, expected f32", x.dtype),
            ));
        }
        if x.shape.len() != 4 {
            return Err(Error::invalid(
                op,
                format!("x has shape {:?}, expected [B, H, T, D]", x.shape),
            ));
        }
        let d = x.shape[3];
        if d == 0 || d % 2 != 0 {
            return Err(Error::invalid(
                op,
                format!("head dim {d} must be even and > 0"),
            ));
        }
        if !(self.base.is_finite() && self.base > 1.0) {
            return Err(Error::invalid(
                op,
                format!("base {} must be finite and > 1", self.base),
            ));
        }
        Ok(vec![x.clone()])
    }

    /// CPU f32 implementation.
    pub fn cpu(&self, _inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        Err(Error::Internal("rope cpu pending".into()))
    }

    /// f64 reference.
    pub fn reference(&self, _inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
        Err(Error::Internal("rope reference pending".into()))
    }
}
