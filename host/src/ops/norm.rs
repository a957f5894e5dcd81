//! RMSNorm: y = t * rsqrt(mean(t^2) + eps) * w over the last dim, where t = x, or, with the
//! fused residual add, t = x + residual (then also returned as `sum`).

use ndarray::ArrayD;
use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorMeta};

/// Parameters of RMSNorm.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RmsNormParams {
    /// Added to the mean square.
    pub eps: f32,
    /// Whether a residual input is added first (and the sum returned).
    pub residual: bool,
}

impl Default for RmsNormParams {
    fn default() -> Self {
        Self {
            eps: 1e-5,
            residual: false,
        }
    }
}

impl RmsNormParams {
    /// Output metas: y (and sum) of x's shape.
    pub fn validate(&self, inputs: &[TensorMeta]) -> Result<Vec<TensorMeta>> {
        let op = "rmsnorm";
        for (i, m) in inputs.iter().enumerate() {
            if m.dtype != DType::F32 {
                return Err(Error::invalid(
                    op,
                    format!("input {i} is {}, expected f32", m.dtype),
                ));
            }
        }
        let x = &inputs[0];
        let Some(&h) = x.shape.last() else {
            return Err(Error::invalid(op, "x must have at least one dimension"));
        };
        if h == 0 {
            return Err(Error::invalid(
                op,
                format!("x {:?} has an empty last dimension", x.shape),
            ));
        }
        if inputs[1].shape != [h] {
            return Err(Error::invalid(
                op,
                format!("w has shape {:?}, expected [{h}]", inputs[1].shape),
            ));
        }
        if self.residual && inputs[2].shape != x.shape {
            return Err(Error::invalid(
                op,
                format!(
                    "residual {:?} must have x's shape {:?}",
                    inputs[2].shape, x.shape
                ),
            ));
        }
        if !(self.eps >= 0.0 && self.eps.is_finite()) {
            return Err(Error::invalid(
                op,
                format!("eps {} must be finite and >= 0", self.eps),
            ));
        }
        let y = TensorMeta::new(x.shape.clone(), DType::F32);
        Ok(if self.residual {
            vec![y.clone(), y]
        } else {
            vec![y]
        })
    }

    /// CPU f32 implementation.
    pub fn cpu(&self, _inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        Err(Error::Internal("rmsnorm cpu pending".into()))
    }

    /// f64 reference.
    pub fn reference(&self, _inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
        Err(Error::Internal("rmsnorm reference pending".into()))
    }
}
