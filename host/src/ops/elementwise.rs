//! Elementwise ops.

use ndarray::ArrayD;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorMeta};

/// a + b: same shape, f32.
pub fn validate_add(inputs: &[TensorMeta]) -> Result<Vec<TensorMeta>> {
    let (a, b) = (&inputs[0], &inputs[1]);
    if a.dtype != DType::F32 || b.dtype != DType::F32 {
        return Err(Error::invalid(
            "add",
            format!("inputs are {} and {}, expected f32", a.dtype, b.dtype),
        ));
    }
    if a.shape != b.shape {
        return Err(Error::invalid(
            "add",
            format!("shapes {:?} and {:?} differ", a.shape, b.shape),
        ));
    }
    Ok(vec![a.clone()])
}

/// CPU a + b.
pub fn cpu_add(inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let a = inputs[0].as_f32()?;
    let b = inputs[1].as_f32()?;
    Ok(vec![Tensor::from_f32(a + b)])
}

/// f64 a + b.
pub fn reference_add(inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
    Ok(vec![&inputs[0] + &inputs[1]])
}
