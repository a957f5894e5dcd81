//! Fused linear: y = act(x W^T + b). x [..., K], W [N, K] (PyTorch's [out, in]), b [N].

use ndarray::ArrayD;
use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorMeta};

/// Activation applied after the bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// Identity.
    #[default]
    None,
    /// max(x, 0).
    Relu,
    /// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
    Gelu,
    /// x * sigmoid(x).
    Silu,
}

impl std::str::FromStr for Activation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "none" | "identity" => Ok(Activation::None),
            "relu" => Ok(Activation::Relu),
            "gelu" => Ok(Activation::Gelu),
            "silu" | "swish" => Ok(Activation::Silu),
            _ => Err(format!(
                "unknown activation '{s}' (accepted: none, relu, gelu, silu)"
            )),
        }
    }
}

/// Parameters of the fused linear.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LinearParams {
    /// Activation after the bias.
    pub act: Activation,
    /// Whether a bias input `b` [N] is given.
    pub bias: bool,
}

impl LinearParams {
    /// (M, N, K) of the product, M being all leading dims of x together.
    pub fn mnk(&self, inputs: &[TensorMeta]) -> Result<(usize, usize, usize)> {
        let op = "linear";
        for (i, m) in inputs.iter().enumerate() {
            if m.dtype != DType::F32 {
                return Err(Error::invalid(
                    op,
                    format!("input {i} is {}, expected f32", m.dtype),
                ));
            }
        }
        let x = &inputs[0];
        let w = &inputs[1];
        if x.shape.is_empty() || w.shape.len() != 2 {
            return Err(Error::invalid(
                op,
                format!(
                    "x {:?} must be [..., K] and w {:?} must be [N, K]",
                    x.shape, w.shape
                ),
            ));
        }
        let k = x.shape[x.shape.len() - 1];
        let (n, wk) = (w.shape[0], w.shape[1]);
        if k != wk {
            return Err(Error::invalid(
                op,
                format!("x has K = {k} but w {:?} has K = {wk}", w.shape),
            ));
        }
        if k == 0 || n == 0 {
            return Err(Error::invalid(
                op,
                format!("zero-sized K or N: x {:?}, w {:?}", x.shape, w.shape),
            ));
        }
        if self.bias {
            let b = &inputs[2];
            if b.shape != [n] {
                return Err(Error::invalid(
                    op,
                    format!("bias has shape {:?}, expected [{n}]", b.shape),
                ));
            }
        }
        let m = x.shape[..x.shape.len() - 1].iter().product();
        Ok((m, n, k))
    }

    /// Output meta: [..., N].
    pub fn validate(&self, inputs: &[TensorMeta]) -> Result<Vec<TensorMeta>> {
        let (_, n, _) = self.mnk(inputs)?;
        let mut shape = inputs[0].shape.clone();
        let last = shape.len() - 1;
        shape[last] = n;
        Ok(vec![TensorMeta::new(shape, DType::F32)])
    }

    /// 2 M N K.
    pub fn flops(&self, inputs: &[TensorMeta]) -> f64 {
        self.mnk(inputs)
            .map(|(m, n, k)| 2.0 * m as f64 * n as f64 * k as f64)
            .unwrap_or(0.0)
    }

    /// CPU f32 implementation.
    pub fn cpu(&self, _inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        Err(Error::Internal("linear cpu pending".into()))
    }

    /// f64 reference.
    pub fn reference(&self, _inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
        Err(Error::Internal("linear reference pending".into()))
    }
}
