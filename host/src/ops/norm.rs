//! RMSNorm: y = t * rsqrt(mean(t^2) + eps) * w over the last dim, where t = x, or, with the
//! fused residual add, t = x + residual (then also returned as `sum`).

use crate::ops::OutputMetas;
use ndarray::{ArrayD, IxDyn};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use smallvec::smallvec;

use super::elementwise::Real;
use super::{CPU_PAR_MIN, expect_inputs, flat, metas, reference_metas};
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
    pub fn validate(&self, inputs: &[TensorMeta]) -> Result<OutputMetas> {
        let op = "rmsnorm";
        let names: &[&str] = if self.residual {
            &["x", "w", "residual"]
        } else {
            &["x", "w"]
        };
        expect_inputs(op, inputs.len(), names)?;
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
        if inputs[1].shape[..] != [h] {
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
            smallvec![y.clone(), y]
        } else {
            smallvec![y]
        })
    }

    /// CPU f32 implementation, parallel over blocks of rows (mean square accumulated in f64).
    pub fn cpu(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.validate(&metas(inputs))?;
        let arrays = inputs
            .iter()
            .map(|t| t.as_f32())
            .collect::<Result<Vec<_>>>()?;
        let outs = self.run(&arrays, self.eps)?;
        Ok(outs.into_iter().map(Tensor::from_f32).collect())
    }

    /// f64 reference: plain loops over the definition ([`super::textbook::rmsnorm`]).
    pub fn reference(&self, inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
        self.validate(&reference_metas(inputs, &[]))?;
        let residual = inputs.get(2).filter(|_| self.residual);
        super::textbook::rmsnorm(&inputs[0], &inputs[1], residual, f64::from(self.eps))
    }

    /// y (and the sum) for validated inputs x, w (, residual).
    fn run<T: Real>(&self, inputs: &[&ArrayD<T>], eps: T) -> Result<Vec<ArrayD<T>>> {
        let std: Vec<_> = inputs.iter().map(|a| a.as_standard_layout()).collect();
        let x = flat(&std[0])?;
        let w = flat(&std[1])?;
        let h = w.len();
        let chunk = h * (ROWS_PER_TASK_ELEMS / h).max(1);
        let mut y = vec![T::zero(); x.len()];
        let mut sum = Vec::new();
        let small = x.len() < CPU_PAR_MIN;
        if self.residual {
            let r = flat(&std[2])?;
            sum = vec![T::zero(); x.len()];
            let add_norm = |((yc, sc), (xc, rc)): ResidualChunks<'_, T>| {
                for ((s, &a), &b) in sc.iter_mut().zip(xc).zip(rc) {
                    *s = a + b;
                }
                norm_rows(sc, w, eps, yc);
            };
            if small {
                let xr = x.chunks(chunk).zip(r.chunks(chunk));
                y.chunks_mut(chunk)
                    .zip(sum.chunks_mut(chunk))
                    .zip(xr)
                    .for_each(add_norm);
            } else {
                let xr = x.par_chunks(chunk).zip(r.par_chunks(chunk));
                y.par_chunks_mut(chunk)
                    .zip(sum.par_chunks_mut(chunk))
                    .zip(xr)
                    .for_each(add_norm);
            }
        } else {
            let norm = |(yc, xc): (&mut [T], &[T])| norm_rows(xc, w, eps, yc);
            if small {
                y.chunks_mut(chunk).zip(x.chunks(chunk)).for_each(norm);
            } else {
                y.par_chunks_mut(chunk)
                    .zip(x.par_chunks(chunk))
                    .for_each(norm);
            }
        }
        let shape = IxDyn(inputs[0].shape());
        let shaped = |v: Vec<T>| {
            ArrayD::from_shape_vec(shape.clone(), v)
                .map_err(|e| Error::Internal(format!("rmsnorm: {e}")))
        };
        let mut outs = vec![shaped(y)?];
        if self.residual {
            outs.push(shaped(sum)?);
        }
        Ok(outs)
    }
}

/// One block of rows with a residual: ((y, sum), (x, residual)).
type ResidualChunks<'a, T> = ((&'a mut [T], &'a mut [T]), (&'a [T], &'a [T]));

/// Elements each rayon task normalises (whole rows, at least one).
const ROWS_PER_TASK_ELEMS: usize = 1 << 14;

/// Sum of squares in f64, over 8 interleaved partial sums (so the adds pipeline and
/// vectorise instead of waiting on one another).
fn sum_squares<T: Real>(row: &[T]) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = row.chunks_exact(8);
    let tail: f64 = chunks
        .remainder()
        .iter()
        .map(|v| v.widen() * v.widen())
        .sum();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v.widen() * v.widen();
        }
    }
    acc.iter().sum::<f64>() + tail
}

/// Normalises each row (of w's length) of `t` into `y`: t * 1/sqrt(mean(t^2) + eps) * w.
fn norm_rows<T: Real>(t: &[T], w: &[T], eps: T, y: &mut [T]) {
    let h = w.len();
    for (tr, yr) in t.chunks(h).zip(y.chunks_mut(h)) {
        let ms = sum_squares(tr) / h as f64;
        let inv = T::of(1.0 / (ms + eps.widen()).sqrt());
        for ((o, &v), &g) in yr.iter_mut().zip(tr).zip(w) {
            *o = v * inv * g;
        }
    }
}
