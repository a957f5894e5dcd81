//! Head layout changes between linear outputs and attention: [B*T, H*D] <-> [B, H, T, D].

use crate::ops::OutputMetas;
use ndarray::{ArrayD, IxDyn};
use serde::{Deserialize, Serialize};
use smallvec::smallvec;

use super::{expect_inputs, metas, reference_metas};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorMeta};

/// Parameters of split_heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitHeadsParams {
    /// Batch B (rows of x are B*T).
    pub batch: usize,
    /// Heads H (columns of x are H*D).
    pub heads: usize,
}

impl SplitHeadsParams {
    /// Output meta [B, H, T, D].
    pub fn validate(&self, inputs: &[TensorMeta]) -> Result<OutputMetas> {
        let op = "split_heads";
        expect_inputs(op, inputs.len(), &["x"])?;
        let x = &inputs[0];
        if x.dtype != DType::F32 || x.shape.len() != 2 {
            return Err(Error::invalid(
                op,
                format!("x is {x}, expected f32 [B*T, H*D]"),
            ));
        }
        if self.batch == 0 || self.heads == 0 {
            return Err(Error::invalid(op, "batch and heads must be > 0"));
        }
        let (r, c) = (x.shape[0], x.shape[1]);
        if r % self.batch != 0 || c % self.heads != 0 {
            return Err(Error::invalid(
                op,
                format!(
                    "x {:?} does not split into batch {} x heads {}",
                    x.shape, self.batch, self.heads
                ),
            ));
        }
        Ok(smallvec![TensorMeta::new(
            [self.batch, self.heads, r / self.batch, c / self.heads],
            DType::F32,
        )])
    }

    fn split<T: Clone>(&self, x: &ArrayD<T>) -> Result<ArrayD<T>> {
        let (r, c) = (x.shape()[0], x.shape()[1]);
        let (b, h) = (self.batch, self.heads);
        let (t, d) = (r / b, c / h);
        let v = x
            .to_shape(IxDyn(&[b, t, h, d]))
            .map_err(|e| Error::Internal(format!("split_heads: {e}")))?;
        Ok(v.permuted_axes(IxDyn(&[0, 2, 1, 3]))
            .as_standard_layout()
            .into_owned())
    }

    /// CPU implementation.
    pub fn cpu(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.validate(&metas(inputs))?;
        Ok(vec![Tensor::from_f32(self.split(inputs[0].as_f32()?)?)])
    }

    /// f64 reference.
    pub fn reference(&self, inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
        self.validate(&reference_metas(inputs, &[]))?;
        Ok(vec![self.split(&inputs[0])?])
    }
}

/// Output meta of merge_heads: [B*T, H*D].
pub fn validate_merge(inputs: &[TensorMeta]) -> Result<OutputMetas> {
    expect_inputs("merge_heads", inputs.len(), &["x"])?;
    let x = &inputs[0];
    if x.dtype != DType::F32 || x.shape.len() != 4 {
        return Err(Error::invalid(
            "merge_heads",
            format!("x is {x}, expected f32 [B, H, T, D]"),
        ));
    }
    let s = &x.shape;
    Ok(smallvec![TensorMeta::new(
        [s[0] * s[2], s[1] * s[3]],
        DType::F32,
    )])
}

fn merge<T: Clone>(x: &ArrayD<T>) -> Result<ArrayD<T>> {
    let s = x.shape().to_vec();
    let p = x.view().permuted_axes(IxDyn(&[0, 2, 1, 3]));
    p.as_standard_layout()
        .into_owned()
        .into_shape_with_order(IxDyn(&[s[0] * s[2], s[1] * s[3]]))
        .map_err(|e| Error::Internal(format!("merge_heads: {e}")))
}

/// CPU merge_heads.
pub fn cpu_merge(inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    validate_merge(&metas(inputs))?;
    Ok(vec![Tensor::from_f32(merge(inputs[0].as_f32()?)?)])
}

/// f64 merge_heads.
pub fn reference_merge(inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
    validate_merge(&reference_metas(inputs, &[]))?;
    Ok(vec![merge(&inputs[0])?])
}
