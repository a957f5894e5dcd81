//! Fused linear: y = act(x W^T + b). x `[..., K]`, W `[N, K]` (PyTorch's `[out, in]`), b `[N]`.

use crate::ops::OutputMetas;
use ndarray::linalg::general_mat_mul;
use ndarray::{Array2, ArrayD, ArrayView2, ArrayViewMut2, Axis, Ix2, IxDyn, s};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use smallvec::smallvec;

use super::elementwise::{Real, gelu_tanh, relu, silu};
use super::{expect_inputs, metas, reference_metas};
use crate::backend::cpu::{Blas, Gemm};
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
    /// Keep the output in f32 on a device that stores floats in 16 bits (the CUDA backend:
    /// cuBLASLt writes f32 from its f32 accumulators). For outputs whose rounding would change
    /// a decision downstream: the router's logits, where bf16 rounding turns near-ties into
    /// different experts. Honoured for every activation but SiLU (which runs as a 16-bit kernel
    /// after the GEMM); devices computing in f32 store f32 anyway.
    #[serde(default)]
    pub f32_out: bool,
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
            if b.shape[..] != [n] {
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
    pub fn validate(&self, inputs: &[TensorMeta]) -> Result<OutputMetas> {
        let (_, n, _) = self.mnk(inputs)?;
        let mut shape = inputs[0].shape.clone();
        let last = shape.len() - 1;
        shape[last] = n;
        Ok(smallvec![TensorMeta::new(shape, DType::F32)])
    }

    /// 2 M N K.
    pub fn flops(&self, inputs: &[TensorMeta]) -> f64 {
        self.mnk(inputs)
            .map(|(m, n, k)| 2.0 * m as f64 * n as f64 * k as f64)
            .unwrap_or(0.0)
    }

    /// CPU f32 implementation: one GEMM ([`matmul_bt`]: the BLAS library of the CPU backend,
    /// else matrixmultiply split over rayon threads) with the bias and activation applied to
    /// each block of the result while it is in cache.
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
    fn run(
        &self,
        x: &ArrayD<f32>,
        w: &ArrayD<f32>,
        b: Option<&ArrayD<f32>>,
        out_shape: &[usize],
        deadline: &Deadline,
    ) -> Result<ArrayD<f32>> {
        let (n, k) = (w.shape()[0], w.shape()[1]);
        let m = x.len() / k;
        let internal = |e: ndarray::ShapeError| Error::Internal(format!("linear: {e}"));
        let x2 = x.to_shape((m, k)).map_err(internal)?;
        let w2 = w.view().into_dimensionality::<Ix2>().map_err(internal)?;
        let bias: Option<Vec<f32>> = b.map(|b| b.iter().copied().collect());
        let act = self.act;
        let mut y = Array2::<f32>::zeros((m, n));
        let gemm = Gemm::current();
        matmul_bt(&gemm, x2.view(), w2, y.view_mut(), deadline, |blk, col0| {
            let b = bias.as_deref().map(|b| &b[col0..col0 + blk.ncols()]);
            bias_act(blk, b, act);
        });
        y.into_shape_with_order(IxDyn(out_shape)).map_err(internal)
    }
}

/// Work (multiply-adds) below which a product runs on one thread.
const PAR_MIN_WORK: usize = 1 << 18;

/// Multiply-adds per BLAS call of [`matmul_bt`] (2^32: some 50 ms on 2 cores), so the
/// deadline is looked at between calls and each row block is still in cache (L3) for its
/// epilogue.
const BLAS_BLOCK_WORK: usize = 1 << 32;
/// Bounds of the rows of one BLAS call.
const BLAS_BLOCK_ROWS: (usize, usize) = (64, 1024);

/// c = a b^T (a [M, K], b [N, K], c [M, N]), then `epilogue(block, first column)` on each
/// block of c while it is in cache.
///
/// Through `gemm`'s BLAS library when it has one: one `sgemm` per block of a few hundred rows,
/// called from this thread (the library computes with its own threads, as many as the CPU
/// backend's), the epilogue after each. Otherwise the portable GEMM: rows of c split over
/// rayon threads (columns when M is small), each block one matrixmultiply GEMM, so results do
/// not depend on the thread count.
///
/// Each block first looks at `deadline`: once it has passed, the remaining blocks are skipped
/// (the caller then reports [`Error::Timeout`] through [`Deadline::check`], so the partly
/// written `c` is never used).
pub(crate) fn matmul_bt<F>(
    gemm: &Gemm,
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    mut c: ArrayViewMut2<f32>,
    deadline: &Deadline,
    epilogue: F,
) where
    F: Fn(ArrayViewMut2<f32>, usize) + Sync,
{
    if let Some((blas, threads)) = gemm.blas() {
        if blas_matmul_bt(blas, threads, a, b, c.view_mut(), deadline, &epilogue) {
            return;
        }
    }
    portable_matmul_bt(a, b, c, deadline, epilogue);
}

/// [`matmul_bt`] through a BLAS library, one call per row block; `false` when the library
/// refused the first block's layout (c untouched: the caller multiplies another way).
fn blas_matmul_bt<F>(
    blas: &Blas,
    threads: usize,
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    mut c: ArrayViewMut2<f32>,
    deadline: &Deadline,
    epilogue: &F,
) -> bool
where
    F: Fn(ArrayViewMut2<f32>, usize) + Sync,
{
    let (k, n) = (a.ncols(), b.nrows());
    blas.use_threads(threads);
    let rows = (BLAS_BLOCK_WORK / (n * k).max(1)).clamp(BLAS_BLOCK_ROWS.0, BLAS_BLOCK_ROWS.1);
    for (i, mut cb) in c.axis_chunks_iter_mut(Axis(0), rows.max(1)).enumerate() {
        if deadline.expired() {
            return true;
        }
        let r0 = i * rows;
        let ab = a.slice(s![r0..r0 + cb.nrows(), ..]);
        if !blas.gemm(1.0, ab, b.t(), 0.0, cb.view_mut()) {
            if i == 0 {
                return false;
            }
            // A later block of the same views: the layout cannot differ; multiply it here.
            general_mat_mul(1.0, &ab, &b.t(), 0.0, &mut cb);
        }
        // The epilogue over the block's rows on the rayon threads (the library's threads
        // are idle between calls).
        let rows_per_task = cb.nrows().div_ceil(rayon::current_num_threads()).max(1);
        if cb.len() < EPILOGUE_PAR_MIN || rows_per_task == cb.nrows() {
            epilogue(cb, 0);
        } else {
            cb.axis_chunks_iter_mut(Axis(0), rows_per_task)
                .into_par_iter()
                .for_each(|blk| epilogue(blk, 0));
        }
    }
    true
}

/// Elements of a row block below which its epilogue runs on one thread.
const EPILOGUE_PAR_MIN: usize = 1 << 15;

/// [`matmul_bt`] through matrixmultiply over the current rayon pool.
fn portable_matmul_bt<F>(
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    mut c: ArrayViewMut2<f32>,
    deadline: &Deadline,
    epilogue: F,
) where
    F: Fn(ArrayViewMut2<f32>, usize) + Sync,
{
    let (m, k, n) = (a.nrows(), a.ncols(), b.nrows());
    let threads = rayon::current_num_threads();
    let gemm = |a: ArrayView2<f32>, b: ArrayView2<f32>, mut c: ArrayViewMut2<f32>, col0: usize| {
        if deadline.expired() {
            return;
        }
        general_mat_mul(1.0, &a, &b.t(), 0.0, &mut c);
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

/// act(v + bias) over every row of `block` in place (`bias` already offset to the block's
/// first column): one pass per row while it is in cache, vectorised (AVX2 where the CPU has
/// it). GELU and SiLU use [`exp_fast`]; a row holding a non-finite value takes the scalar
/// formulas instead, so infinities and NaN come out as [`Activation::apply`] gives them.
pub(crate) fn bias_act(mut block: ArrayViewMut2<f32>, bias: Option<&[f32]>, act: Activation) {
    if bias.is_none() && act == Activation::None {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe { bias_act_avx2(block.view_mut(), bias, act) };
        return;
    }
    bias_act_rows(block, bias, act);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn bias_act_avx2(block: ArrayViewMut2<f32>, bias: Option<&[f32]>, act: Activation) {
    bias_act_rows(block, bias, act);
}

#[inline(always)]
fn bias_act_rows(mut block: ArrayViewMut2<f32>, bias: Option<&[f32]>, act: Activation) {
    for mut row in block.rows_mut() {
        match row.as_slice_mut() {
            Some(r) => bias_act_row(r, bias, act),
            None => {
                for (j, v) in row.iter_mut().enumerate() {
                    let z = bias.map_or(*v, |b| *v + b[j]);
                    *v = act.apply(z);
                }
            }
        }
    }
}

#[inline(always)]
fn bias_act_row(row: &mut [f32], bias: Option<&[f32]>, act: Activation) {
    if let Some(b) = bias {
        for (v, &b) in row.iter_mut().zip(b) {
            *v += b;
        }
    }
    match act {
        Activation::None => {}
        Activation::Relu => {
            for v in row.iter_mut() {
                *v = relu(*v);
            }
        }
        Activation::Gelu | Activation::Silu => {
            let finite = row.iter().fold(true, |ok, v| ok & v.is_finite());
            if !finite {
                for v in row.iter_mut() {
                    *v = act.apply(*v);
                }
            } else if act == Activation::Gelu {
                for v in row.iter_mut() {
                    *v = gelu_fast(*v);
                }
            } else {
                for v in row.iter_mut() {
                    *v = silu_fast(*v);
                }
            }
        }
    }
}

/// GELU (tanh form) of a finite value: 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), with
/// u = sqrt(2/pi) (x + 0.044715 x^3); within a few ulp of [`gelu_tanh`].
#[inline(always)]
pub(crate) fn gelu_fast(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    let u = C * (x + 0.044_715 * x * x * x);
    x / (1.0 + exp_fast(-2.0 * u))
}

/// SiLU of a finite value: x / (1 + exp(-x)); within a few ulp of [`silu`].
#[inline(always)]
pub(crate) fn silu_fast(x: f32) -> f32 {
    x / (1.0 + exp_fast(-x))
}

/// exp(x) for x that is not NaN, without branches (so loops of it vectorise): x clamped to
/// [-87.3, 88.3] (the result stays a normal f32), split as n ln 2 + r with |r| <= ln(2)/2,
/// Cephes' degree-6 polynomial for exp(r) (about 1 ulp), scaled by 2^n through the exponent
/// bits.
#[inline(always)]
pub(crate) fn exp_fast(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 * 2^23: adding it rounds to an integer, which lands in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.3);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    let n_bits = t.to_bits().wrapping_sub(ROUND.to_bits());
    let scale = f32::from_bits(n_bits.wrapping_add(127) << 23);
    e * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_activations_match_the_scalar_formulas() {
        let mut worst = [0f64; 3];
        for i in -200_000..=200_000 {
            let x = i as f32 * 1e-3 * if i % 7 == 0 { 10.0 } else { 1.0 };
            let exact = f64::from(x).exp();
            if (-87.0..88.0).contains(&x) {
                let e = (f64::from(exp_fast(x)) - exact).abs() / exact;
                worst[0] = worst[0].max(e);
            }
            let xd = f64::from(x);
            let g = 0.5
                * xd
                * (1.0
                    + ((2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3))).tanh());
            let s = xd / (1.0 + (-xd).exp());
            let scale = xd.abs().max(1e-30);
            worst[1] = worst[1].max((f64::from(gelu_fast(x)) - g).abs() / scale);
            worst[2] = worst[2].max((f64::from(silu_fast(x)) - s).abs() / scale);
        }
        assert!(worst[0] < 4e-7, "exp {:e}", worst[0]);
        assert!(worst[1] < 1e-6, "gelu {:e}", worst[1]);
        assert!(worst[2] < 1e-6, "silu {:e}", worst[2]);
        assert!(exp_fast(-1000.0) == exp_fast(-87.3) && exp_fast(-1000.0) > 0.0);
        assert!(exp_fast(1000.0).is_finite());
    }

    #[test]
    fn non_finite_rows_take_the_scalar_formulas() {
        let mut a = ndarray::arr2(&[[f32::INFINITY, 1.0], [f32::NAN, -1.0], [2.0, -3.0]]);
        bias_act(a.view_mut(), Some(&[0.5, 0.0]), Activation::Gelu);
        assert_eq!(a[[0, 0]], gelu_tanh(f32::INFINITY));
        assert!(a[[1, 0]].is_nan());
        assert_eq!(a[[0, 1]], gelu_tanh(1.0f32));
        assert!((a[[2, 0]] - gelu_tanh(2.5f32)).abs() < 1e-6);
        assert!((a[[2, 1]] - gelu_tanh(-3.0f32)).abs() < 1e-6);
    }
}
