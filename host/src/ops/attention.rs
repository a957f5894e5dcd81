//! Attention forward: O = softmax(scale * Q K^T + mask) V and the log-sum-exp of each row.
//!
//! Q [B, Hq, Nq, D], K and V [B, Hkv, Nkv, D]; Hq a multiple of Hkv (MHA, GQA, MQA): query
//! head h uses kv head h / (Hq / Hkv). Causal masks are aligned bottom-right: query i sees
//! keys j <= i + Nkv - Nq. A query row that sees no key (possible when Nq > Nkv) gets O = 0
//! and LSE = -inf.

use crate::ops::OutputMetas;
use ndarray::linalg::general_mat_mul;
use ndarray::{Array2, Array3, Array4, ArrayD, ArrayView2, ArrayView4, ArrayViewMut2, Ix4, s};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use smallvec::smallvec;

use super::elementwise::{exp_shifted, max_of};
use super::linear::exp_fast;
use super::{CPU_PAR_MIN, expect_inputs, metas, reference_metas};
use crate::backend::cpu::{Blas, Gemm};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::sync::Deadline;
use crate::tensor::{Tensor, TensorMeta};

/// Parameters of attention.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AttentionParams {
    /// Apply the bottom-right causal mask.
    pub causal: bool,
    /// Softmax scale; `None` means 1/sqrt(D).
    pub scale: Option<f32>,
}

impl Default for AttentionParams {
    fn default() -> Self {
        Self {
            causal: true,
            scale: None,
        }
    }
}

/// Shape of an attention problem, read from validated inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Batch.
    pub b: usize,
    /// Query heads.
    pub hq: usize,
    /// Key/value heads.
    pub hkv: usize,
    /// Query length.
    pub nq: usize,
    /// Key/value length.
    pub nkv: usize,
    /// Head dimension.
    pub d: usize,
}

impl AttentionParams {
    /// The scale in effect for head dimension `d`.
    pub fn scale_for(&self, d: usize) -> f32 {
        self.scale.unwrap_or(1.0 / (d as f32).sqrt())
    }

    /// Reads the problem shape from input metas (validating them).
    pub fn shape(&self, inputs: &[TensorMeta]) -> Result<AttentionShape> {
        let op = "attention";
        expect_inputs(op, inputs.len(), &["q", "k", "v"])?;
        let [q, k, v] = inputs else {
            return Err(Error::invalid(op, "takes q, k, v"));
        };
        for (n, m) in [("q", q), ("k", k), ("v", v)] {
            if m.dtype != DType::F32 {
                return Err(Error::invalid(
                    op,
                    format!("{n} is {}, expected f32", m.dtype),
                ));
            }
            if m.shape.len() != 4 {
                return Err(Error::invalid(
                    op,
                    format!("{n} has shape {:?}, expected [B, H, N, D]", m.shape),
                ));
            }
        }
        if k.shape != v.shape {
            return Err(Error::invalid(
                op,
                format!("k {:?} and v {:?} must have one shape", k.shape, v.shape),
            ));
        }
        let (b, hq, nq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
        let (hkv, nkv) = (k.shape[1], k.shape[2]);
        if k.shape[0] != b || k.shape[3] != d {
            return Err(Error::invalid(
                op,
                format!(
                    "q {:?} and k {:?} disagree on batch or head dim",
                    q.shape, k.shape
                ),
            ));
        }
        if b == 0 || hq == 0 || hkv == 0 || d == 0 {
            return Err(Error::invalid(
                op,
                format!(
                    "zero-sized dimension in q {:?} / k {:?}: B, H and D must be > 0",
                    q.shape, k.shape
                ),
            ));
        }
        if hq % hkv != 0 {
            return Err(Error::invalid(
                op,
                format!("query heads {hq} must be a multiple of kv heads {hkv}"),
            ));
        }
        if nkv == 0 && nq > 0 {
            return Err(Error::invalid(op, "kv length is 0 but there are queries"));
        }
        if let Some(s) = self.scale {
            if !s.is_finite() || s <= 0.0 {
                return Err(Error::invalid(
                    op,
                    format!("scale {s} must be finite and > 0"),
                ));
            }
        }
        Ok(AttentionShape {
            b,
            hq,
            hkv,
            nq,
            nkv,
            d,
        })
    }

    /// Output metas: o [B, Hq, Nq, D] and lse [B, Hq, Nq].
    pub fn validate(&self, inputs: &[TensorMeta]) -> Result<OutputMetas> {
        let s = self.shape(inputs)?;
        Ok(smallvec![
            TensorMeta::new([s.b, s.hq, s.nq, s.d], DType::F32),
            TensorMeta::new([s.b, s.hq, s.nq], DType::F32),
        ])
    }

    /// Multiply-adds x2 of QK^T and PV, counting only unmasked pairs when causal.
    pub fn flops(&self, inputs: &[TensorMeta]) -> f64 {
        let Ok(s) = self.shape(inputs) else {
            return 0.0;
        };
        let pairs = visible_pairs(self.causal, s.nq, s.nkv) as f64;
        4.0 * (s.b * s.hq) as f64 * pairs * s.d as f64
    }

    /// CPU f32 implementation: parallel over (batch, head, block of queries); each block runs
    /// an online softmax over blocks of keys (two GEMMs per key block), so no more than a
    /// [BLOCK_Q, BLOCK_K] tile of scores exists at a time.
    pub fn cpu(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.cpu_within(inputs, &Deadline::NONE)
    }

    /// [`Self::cpu`], stopping with [`Error::Timeout`] once `deadline` passes (each block of
    /// queries looks at it before it starts).
    pub fn cpu_within(&self, inputs: &[&Tensor], deadline: &Deadline) -> Result<Vec<Tensor>> {
        let sh = self.shape(&metas(inputs))?;
        let (q, k, v) = (
            view4(inputs[0].as_f32()?)?,
            view4(inputs[1].as_f32()?)?,
            view4(inputs[2].as_f32()?)?,
        );
        let geo = Geometry {
            causal: self.causal,
            nq: sh.nq,
            nkv: sh.nkv,
            scale: self.scale_for(sh.d),
        };
        let d = sh.d;
        let group = sh.hq / sh.hkv;
        // The blocks' products go through the BLAS library when the CPU backend has one, one
        // library thread per call: the blocks are spread over rayon's threads already.
        let gemm = Gemm::current();
        let blas = gemm.blas().map(|(b, _)| b);
        if let Some(b) = blas {
            b.use_threads(1);
        }
        let mut o = vec![0f32; sh.b * sh.hq * sh.nq * d];
        let mut lse = vec![f32::NEG_INFINITY; sh.b * sh.hq * sh.nq];
        // One work item: query block `blk` of plane `plane` (= b * Hq + h).
        let block = |plane: usize, blk: usize, o_b: &mut [f32], lse_b: &mut [f32]| {
            if deadline.expired() {
                return;
            }
            let (b, h) = (plane / sh.hq, plane % sh.hq);
            let kh = k.slice(s![b, h / group, .., ..]);
            let vh = v.slice(s![b, h / group, .., ..]);
            let i0 = blk * BLOCK_Q;
            let qb = q.slice(s![b, h, i0..i0 + lse_b.len(), ..]);
            query_block(&geo, blas, i0, qb, kh, vh, o_b, lse_b);
        };
        let plane_len = (sh.nq * d).max(1);
        let small = sh.b * sh.hq * sh.nq * sh.nkv * d < CPU_PAR_MIN;
        if sh.nq == 0 {
            // Nothing to compute: empty outputs.
        } else if small {
            let planes = o.chunks_mut(plane_len).zip(lse.chunks_mut(sh.nq));
            for (plane, (o_p, lse_p)) in planes.enumerate() {
                let blocks = o_p.chunks_mut(BLOCK_Q * d).zip(lse_p.chunks_mut(BLOCK_Q));
                for (blk, (o_b, lse_b)) in blocks.enumerate() {
                    block(plane, blk, o_b, lse_b);
                }
            }
        } else {
            let planes = o.par_chunks_mut(plane_len).zip(lse.par_chunks_mut(sh.nq));
            planes.enumerate().for_each(|(plane, (o_p, lse_p))| {
                let blocks = o_p
                    .par_chunks_mut(BLOCK_Q * d)
                    .zip(lse_p.par_chunks_mut(BLOCK_Q));
                blocks
                    .enumerate()
                    .for_each(|(blk, (o_b, lse_b))| block(plane, blk, o_b, lse_b));
            });
        }
        deadline.check("attention on the CPU")?;
        Ok(vec![
            Tensor::from_vec_f32(&[sh.b, sh.hq, sh.nq, d], o)?,
            Tensor::from_vec_f32(&[sh.b, sh.hq, sh.nq], lse)?,
        ])
    }

    /// f64 reference: each row's scores, softmax and weighted sum of V, computed directly.
    pub fn reference(&self, inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
        let sh = self.shape(&reference_metas(inputs, &[]))?;
        let (q, k, v) = (view4(&inputs[0])?, view4(&inputs[1])?, view4(&inputs[2])?);
        let scale = self.scale.map_or(1.0 / (sh.d as f64).sqrt(), f64::from);
        let group = sh.hq / sh.hkv;
        let mut o = Array4::<f64>::zeros((sh.b, sh.hq, sh.nq, sh.d));
        let mut lse = Array3::<f64>::from_elem((sh.b, sh.hq, sh.nq), f64::NEG_INFINITY);
        let mut p = vec![0.0; sh.nkv];
        for b in 0..sh.b {
            for h in 0..sh.hq {
                let kh = k.slice(s![b, h / group, .., ..]);
                let vh = v.slice(s![b, h / group, .., ..]);
                for i in 0..sh.nq {
                    let n = visible_keys(self.causal, i, sh.nq, sh.nkv);
                    if n == 0 {
                        continue;
                    }
                    let qi = q.slice(s![b, h, i, ..]);
                    let scores: Vec<f64> = (0..n).map(|j| scale * qi.dot(&kh.row(j))).collect();
                    let (m, sum) = exp_shifted(&scores, &mut p[..n]);
                    let mut oi = o.slice_mut(s![b, h, i, ..]);
                    for (j, &pj) in p[..n].iter().enumerate() {
                        oi.scaled_add(pj / sum, &vh.row(j));
                    }
                    lse[[b, h, i]] = m + sum.ln();
                }
            }
        }
        Ok(vec![o.into_dyn(), lse.into_dyn()])
    }
}

/// A validated 4-D input as a 4-D view.
fn view4<T>(a: &ArrayD<T>) -> Result<ArrayView4<'_, T>> {
    a.view()
        .into_dimensionality::<Ix4>()
        .map_err(|e| Error::Internal(format!("attention: {e}")))
}

/// Queries per CPU task.
const BLOCK_Q: usize = 64;
/// Keys per step of the online softmax.
const BLOCK_K: usize = 128;

/// What a query block needs to know about the whole problem.
struct Geometry {
    causal: bool,
    nq: usize,
    nkv: usize,
    scale: f32,
}

/// c = alpha a b + beta c, through `blas` when given (and it takes the views' layouts), else
/// matrixmultiply.
fn product(
    blas: Option<&Blas>,
    alpha: f32,
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    beta: f32,
    mut c: ArrayViewMut2<f32>,
) {
    if blas.is_some_and(|l| l.gemm(alpha, a, b, beta, c.view_mut())) {
        return;
    }
    general_mat_mul(alpha, &a, &b, beta, &mut c);
}

/// One block of queries `q` [rows, D] starting at query `i0` against all keys it may see:
/// online softmax over key blocks (the two products through `blas` when given), writing O
/// rows into `o` and their LSE into `lse`.
#[allow(clippy::too_many_arguments)]
fn query_block(
    geo: &Geometry,
    blas: Option<&Blas>,
    i0: usize,
    q: ArrayView2<f32>,
    k: ArrayView2<f32>,
    v: ArrayView2<f32>,
    o: &mut [f32],
    lse: &mut [f32],
) {
    let (rows, d) = (q.nrows(), q.ncols());
    let visible = |r: usize| visible_keys(geo.causal, i0 + r, geo.nq, geo.nkv);
    let kv_end = visible(rows - 1);
    let mut acc = Array2::<f32>::zeros((rows, d));
    let mut scores = Array2::<f32>::zeros((rows, BLOCK_K.min(kv_end.max(1))));
    let mut m = vec![f32::NEG_INFINITY; rows];
    let mut l = vec![0f32; rows];
    for j0 in (0..kv_end).step_by(BLOCK_K) {
        let bk = BLOCK_K.min(kv_end - j0);
        let kb = k.slice(s![j0..j0 + bk, ..]);
        let vb = v.slice(s![j0..j0 + bk, ..]);
        let mut sv = scores.slice_mut(s![.., ..bk]);
        product(blas, geo.scale, q, kb.t(), 0.0, sv.view_mut());
        for (r, mut srow) in sv.rows_mut().into_iter().enumerate() {
            let seen = visible(r).saturating_sub(j0).min(bk);
            let corr = match srow.as_slice_mut() {
                Some(sr) => online_step(sr, seen, &mut m[r], &mut l[r]),
                None => f32::NAN,
            };
            if corr != 1.0 {
                acc.row_mut(r).mapv_inplace(|x| x * corr);
            }
        }
        product(blas, 1.0, sv.view(), vb, 1.0, acc.view_mut());
    }
    for (r, (orow, lse_r)) in o.chunks_mut(d).zip(lse.iter_mut()).enumerate() {
        if l[r] == 0.0 {
            // No visible key (NaN sums fall through, so NaN inputs show in the output).
            orow.fill(0.0);
            *lse_r = f32::NEG_INFINITY;
        } else {
            let inv = 1.0 / l[r];
            for (dst, &a) in orow.iter_mut().zip(acc.row(r)) {
                *dst = a * inv;
            }
            *lse_r = m[r] + l[r].ln();
        }
    }
}

/// One online-softmax step on a row of scores whose first `seen` entries are visible: turns
/// the row into probabilities relative to the running max `m` (masked entries 0), updates
/// `m` and the running sum `l`, and returns the factor the row's accumulator must be scaled by.
fn online_step(row: &mut [f32], seen: usize, m: &mut f32, l: &mut f32) -> f32 {
    let mx = max_of(&row[..seen]);
    let m_new = if mx > *m || mx.is_nan() { mx } else { *m };
    if m_new == f32::NEG_INFINITY {
        row.fill(0.0);
        return 1.0;
    }
    let corr = (*m - m_new).exp();
    let mut sum = 0.0;
    let visible = &mut row[..seen];
    if m_new.is_finite() && visible.iter().fold(true, |ok, x| ok & x.is_finite()) {
        // Finite scores: the branch-free exp (vectorised), every argument <= 0.
        for x in visible.iter_mut() {
            *x = exp_fast(*x - m_new);
        }
        sum = visible.iter().sum();
    } else {
        for x in visible.iter_mut() {
            *x = (*x - m_new).exp();
            sum += *x;
        }
    }
    row[seen..].fill(0.0);
    *l = *l * corr + sum;
    *m = m_new;
    corr
}

/// Keys query `i` sees: all `nkv`, or with the bottom-right causal mask those j <= i + nkv - nq.
pub fn visible_keys(causal: bool, i: usize, nq: usize, nkv: usize) -> usize {
    if causal {
        (i + nkv + 1).saturating_sub(nq).min(nkv)
    } else {
        nkv
    }
}

/// Number of (query, key) pairs a mask lets through.
pub fn visible_pairs(causal: bool, nq: usize, nkv: usize) -> usize {
    if !causal {
        return nq * nkv;
    }
    (0..nq).map(|i| visible_keys(true, i, nq, nkv)).sum()
}
