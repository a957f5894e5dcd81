//! Fused linear: y = act(x W^T + b). x `[..., K]`, W `[N, K]` (PyTorch's `[out, in]`), b `[N]`.

use ndarray::linalg::general_mat_mul;
use ndarray::{Array2, ArrayD, ArrayView2, ArrayViewMut2, Axis, Ix2, IxDyn, s};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::elementwise::{Real, gelu_tanh, relu, silu};
use super::{expect_inputs, metas, reference_metas};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::sync::Deadline;
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

impl Activation {
    /// The activation of one value.
    pub fn apply<T: Real>(self, x: T) -> T {
        match self {
            Activation::None => x,
            Activation::Relu => relu(x),
            Activation::Gelu => gelu_tanh(x),
            Activation::Silu => silu(x),
        }
    }
}

/// Parameters of the fused linear.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LinearParams {
    /// Activation after the bias.
    pub act: Activation,
    /// Whether a bias input `b` `[N]` is given.
    pub bias: bool,
}

impl LinearParams {
    /// (M, N, K) of the product, M being all leading dims of x together.
    pub fn mnk(&self, inputs: &[TensorMeta]) -> Result<(usize, usize, usize)> {
        let op = "linear";
        let names: &[&str] = if self.bias {
            &["x", "w", "b"]
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

    /// CPU f32 implementation: one GEMM (matrixmultiply, split over rayon threads) with the
    /// bias and activation applied to each block of the result while it is in cache.
    pub fn cpu(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.cpu_within(inputs, &Deadline::NONE)
    }

    /// [`Self::cpu`], stopping with [`Error::Timeout`] once `deadline` passes.
    pub fn cpu_within(&self, inputs: &[&Tensor], deadline: &Deadline) -> Result<Vec<Tensor>> {
        let out = self.validate(&metas(inputs))?;
        let b = match self.bias {
            true => Some(inputs[2].as_f32()?),
            false => None,
        };
        let y = self.run(
            inputs[0].as_f32()?,
            inputs[1].as_f32()?,
            b,
            &out[0].shape,
            deadline,
        )?;
        deadline.check("linear on the CPU")?;
        Ok(vec![Tensor::from_f32(y)])
    }

    /// f64 reference: plain loops over the definition ([`super::textbook::linear`]).
    pub fn reference(&self, inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
        self.validate(&reference_metas(inputs, &[]))?;
        let b = inputs.get(2).filter(|_| self.bias);
        Ok(vec![super::textbook::linear(
            &inputs[0], &inputs[1], b, self.act,
        )?])
    }

    /// act(x W^T + b) for validated inputs, shaped `out_shape`.
    fn run<T: Real>(
        &self,
        x: &ArrayD<T>,
        w: &ArrayD<T>,
        b: Option<&ArrayD<T>>,
        out_shape: &[usize],
        deadline: &Deadline,
    ) -> Result<ArrayD<T>> {
        let (n, k) = (w.shape()[0], w.shape()[1]);
        let m = x.len() / k;
        let internal = |e: ndarray::ShapeError| Error::Internal(format!("linear: {e}"));
        let x2 = x.to_shape((m, k)).map_err(internal)?;
        let w2 = w.view().into_dimensionality::<Ix2>().map_err(internal)?;
        let bias: Option<Vec<T>> = b.map(|b| b.iter().copied().collect());
        let act = self.act;
        let mut y = Array2::<T>::zeros((m, n));
        matmul_bt(x2.view(), w2, y.view_mut(), deadline, |mut blk, col0| {
            for mut row in blk.rows_mut() {
                for (j, v) in row.iter_mut().enumerate() {
                    let z = match &bias {
                        Some(b) => *v + b[col0 + j],
                        None => *v,
                    };
                    *v = act.apply(z);
                }
            }
        });
        y.into_shape_with_order(IxDyn(out_shape)).map_err(internal)
    }
}

/// Work (multiply-adds) below which a product runs on one thread.
const PAR_MIN_WORK: usize = 1 << 18;

/// c = a b^T (a [M, K], b [N, K], c [M, N]), then `epilogue(block, first column)` on each
/// block of c. Splits rows of c over rayon threads (columns when M is small); each block is
/// one matrixmultiply GEMM, so results do not depend on the thread count.
///
/// Each block first looks at `deadline`: once it has passed, the remaining blocks are skipped
/// (the caller then reports [`Error::Timeout`] through [`Deadline::check`], so the partly
/// written `c` is never used).
pub(crate) fn matmul_bt<T, F>(
    a: ArrayView2<T>,
    b: ArrayView2<T>,
    mut c: ArrayViewMut2<T>,
    deadline: &Deadline,
    epilogue: F,
) where
    T: Real,
    F: Fn(ArrayViewMut2<T>, usize) + Sync,
{
    let (m, k, n) = (a.nrows(), a.ncols(), b.nrows());
    let threads = rayon::current_num_threads();
    let gemm = |a: ArrayView2<T>, b: ArrayView2<T>, mut c: ArrayViewMut2<T>, col0: usize| {
        if deadline.expired() {
            return;
        }
        general_mat_mul(T::one(), &a, &b.t(), T::zero(), &mut c);
        epilogue(c, col0);
    };
    if m * n * k < PAR_MIN_WORK {
        gemm(a, b, c, 0);
    } else if threads == 1 {
        // Row blocks one after another, so a deadline is seen between them.
        let rows = m.div_ceil(8).max(64);
        for (i, cb) in c.axis_chunks_iter_mut(Axis(0), rows).enumerate() {
            let r0 = i * rows;
            gemm(a.slice(s![r0..r0 + cb.nrows(), ..]), b, cb, 0);
        }
    } else if m >= 64 * threads {
        let rows = m.div_ceil(4 * threads).max(64);
        c.axis_chunks_iter_mut(Axis(0), rows)
            .into_par_iter()
            .enumerate()
            .for_each(|(i, cb)| {
                let r0 = i * rows;
                gemm(a.slice(s![r0..r0 + cb.nrows(), ..]), b, cb, 0);
            });
    } else {
        let cols = n.div_ceil(4 * threads).max(16);
        c.axis_chunks_iter_mut(Axis(1), cols)
            .into_par_iter()
            .enumerate()
            .for_each(|(i, cb)| {
                let c0 = i * cols;
                gemm(a, b.slice(s![c0..c0 + cb.ncols(), ..]), cb, c0);
            });
    }
}
