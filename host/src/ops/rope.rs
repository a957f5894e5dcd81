//! Rotary position embedding, rotate-half form, on x [B, H, T, D] (D even): position of row t is
//! `position_offset + t`; inv_freq_i = base^(-2i/D); y = x * cos + rotate_half(x) * sin with
//! rotate_half(x) = [-x2, x1].

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
    pub fn validate(&self, inputs: &[TensorMeta]) -> Result<OutputMetas> {
        let op = "rope";
        expect_inputs(op, inputs.len(), &["x"])?;
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
        Ok(smallvec![x.clone()])
    }

    /// CPU f32 implementation: cos/sin tables computed in f64 and rounded to f32, then rows
    /// rotated in parallel.
    pub fn cpu(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.validate(&metas(inputs))?;
        Ok(vec![Tensor::from_f32(self.run(inputs[0].as_f32()?)?)])
    }

    /// f64 reference: plain loops over the definition ([`super::textbook::rope`]).
    pub fn reference(&self, inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
        self.validate(&reference_metas(inputs, &[]))?;
        Ok(vec![super::textbook::rope(
            &inputs[0],
            self.base,
            self.position_offset,
        )?])
    }

    /// cos and sin of the angles of rows 0..t, each [t, d/2] row-major, computed in f64.
    pub fn tables<T: Real>(&self, t: usize, d: usize) -> (Vec<T>, Vec<T>) {
        let half = d / 2;
        let inv_freq: Vec<f64> = (0..half)
            .map(|i| self.base.powf(-((2 * i) as f64) / d as f64))
            .collect();
        let mut cos = Vec::with_capacity(t * half);
        let mut sin = Vec::with_capacity(t * half);
        for row in 0..t {
            let p = self.position_offset as f64 + row as f64;
            for f in &inv_freq {
                let (s, c) = (p * f).sin_cos();
                cos.push(T::of(c));
                sin.push(T::of(s));
            }
        }
        (cos, sin)
    }

    /// RoPE of a validated x [B, H, T, D].
    fn run<T: Real>(&self, x: &ArrayD<T>) -> Result<ArrayD<T>> {
        let (t, d) = (x.shape()[2], x.shape()[3]);
        let half = d / 2;
        let (cos, sin) = self.tables::<T>(t, d);
        let xs = x.as_standard_layout();
        let xs = flat(&xs)?;
        let mut y = vec![T::zero(); xs.len()];
        let rows_per_task = (ROPE_TASK_ELEMS / d).max(1);
        let chunk = rows_per_task * d;
        let rotate = |(task, (yc, xc)): (usize, (&mut [T], &[T]))| {
            for (r, (yr, xr)) in yc.chunks_mut(d).zip(xc.chunks(d)).enumerate() {
                let pos = (task * rows_per_task + r) % t;
                let c = &cos[pos * half..(pos + 1) * half];
                let s = &sin[pos * half..(pos + 1) * half];
                rotate_row(xr, c, s, yr);
            }
        };
        if xs.len() < CPU_PAR_MIN {
            y.chunks_mut(chunk)
                .zip(xs.chunks(chunk))
                .enumerate()
                .for_each(rotate);
        } else {
            y.par_chunks_mut(chunk)
                .zip(xs.par_chunks(chunk))
                .enumerate()
                .for_each(rotate);
        }
        ArrayD::from_shape_vec(IxDyn(x.shape()), y)
            .map_err(|e| Error::Internal(format!("rope: {e}")))
    }
}

/// Elements each rayon task rotates (whole rows, at least one).
const ROPE_TASK_ELEMS: usize = 1 << 14;

/// y = x * [c, c] + rotate_half(x) * [s, s], rotate_half(x) = [-x2, x1].
fn rotate_row<T: Real>(x: &[T], c: &[T], s: &[T], y: &mut [T]) {
    let half = c.len();
    let (x1, x2) = x.split_at(half);
    let (y1, y2) = y.split_at_mut(half);
    for i in 0..half {
        y1[i] = x1[i] * c[i] - x2[i] * s[i];
        y2[i] = x2[i] * c[i] + x1[i] * s[i];
    }
}
