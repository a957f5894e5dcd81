//! MoE experts: each expert's SwiGLU FFN over its slots, combined per token by the routing
//! weights.

use crate::ops::OutputMetas;
use ndarray::{Array2, ArrayD, ArrayView2, ArrayView3, Axis, Ix2, Ix3, Zip, s};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use smallvec::smallvec;

use super::super::elementwise::{Real, silu};
use super::super::linear::{matmul_bt, silu_fast};
use super::super::{CPU_PAR_MIN, metas, reference_metas};
use super::EXPERT_INPUTS;
use crate::backend::cpu::Gemm;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::sync::Deadline;
use crate::tensor::{Tensor, TensorMeta};

/// The dtypes of the experts inputs, in [`EXPERT_INPUTS`] order: x, topk_ids, topk_weights,
/// sorted_token_ids, expert_offsets, gate_up, down.
pub(crate) const EXPERT_DTYPES: [DType; 7] = [
    DType::F32,
    DType::I32,
    DType::F32,
    DType::I32,
    DType::I32,
    DType::F32,
    DType::F32,
];

/// Parameters of the MoE experts (shapes come from the inputs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MoeExpertsParams {}

/// Shape of an experts problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertsShape {
    /// Tokens.
    pub t: usize,
    /// Hidden size.
    pub h: usize,
    /// Experts.
    pub e: usize,
    /// Experts per token.
    pub k: usize,
    /// FFN size of one expert.
    pub f: usize,
    /// Length of sorted_token_ids.
    pub p: usize,
}

impl MoeExpertsParams {
    /// Reads and checks the problem shape.
    pub fn shape(&self, inputs: &[TensorMeta]) -> Result<ExpertsShape> {
        let op = "moe_experts";
        let want = EXPERT_DTYPES;
        for ((m, d), n) in inputs.iter().zip(want).zip(EXPERT_INPUTS) {
            if m.dtype != d {
                return Err(Error::invalid(
                    op,
                    format!("{n} is {}, expected {d}", m.dtype),
                ));
            }
        }
        let [x, ids, w, sorted, offsets, gate_up, down] = inputs else {
            return Err(Error::invalid(op, "takes 7 inputs"));
        };
        let bad = |msg: String| Err(Error::invalid(op, msg));
        if x.shape.len() != 2 || ids.shape.len() != 2 || gate_up.shape.len() != 3 {
            return bad(format!(
                "x {:?} must be [T, H], topk_ids {:?} [T, k], gate_up {:?} [E, 2F, H]",
                x.shape, ids.shape, gate_up.shape
            ));
        }
        let (t, h) = (x.shape[0], x.shape[1]);
        let k = ids.shape[1];
        let (e, f2) = (gate_up.shape[0], gate_up.shape[1]);
        if ids.shape[0] != t || w.shape != ids.shape {
            return bad(format!(
                "topk_ids {:?} and topk_weights {:?} must be [{t}, k]",
                ids.shape, w.shape
            ));
        }
        if gate_up.shape[2] != h || f2 % 2 != 0 || f2 == 0 {
            return bad(format!(
                "gate_up {:?} must be [E, 2F, {h}] with F > 0",
                gate_up.shape
            ));
        }
        let f = f2 / 2;
        if down.shape[..] != [e, h, f] {
            return bad(format!("down {:?} must be [{e}, {h}, {f}]", down.shape));
        }
        if offsets.shape[..] != [e + 1] || sorted.shape.len() != 1 {
            return bad(format!(
                "expert_offsets {:?} must be [{}] and sorted_token_ids {:?} 1-D",
                offsets.shape,
                e + 1,
                sorted.shape
            ));
        }
        if k == 0 || k > e || h == 0 {
            return bad(format!("k = {k} must be in 1..={e} and H = {h} > 0"));
        }
        Ok(ExpertsShape {
            t,
            h,
            e,
            k,
            f,
            p: sorted.shape[0],
        })
    }

    /// Output meta: y [T, H].
    pub fn validate(&self, inputs: &[TensorMeta]) -> Result<OutputMetas> {
        let s = self.shape(inputs)?;
        Ok(smallvec![TensorMeta::new([s.t, s.h], DType::F32)])
    }

    /// 2 * T*k * 3 * H * F (gate, up, down products).
    pub fn flops(&self, inputs: &[TensorMeta]) -> f64 {
        self.shape(inputs)
            .map(|s| 6.0 * (s.t * s.k) as f64 * s.h as f64 * s.f as f64)
            .unwrap_or(0.0)
    }

    /// CPU f32 implementation: checks the routing, gathers each expert's tokens into a matrix
    /// and runs its FFN as grouped GEMMs over those rows, then sums each token's k slots in
    /// slot order. With the CPU backend's BLAS library, experts run one after another, each
    /// GEMM on the library's threads; with the portable GEMM, experts run in parallel.
    pub fn cpu(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.cpu_within(inputs, &Deadline::NONE)
    }

    /// [`Self::cpu`], stopping with [`Error::Timeout`] once `deadline` passes (checked
    /// between the GEMM blocks of every expert).
    pub fn cpu_within(&self, inputs: &[&Tensor], deadline: &Deadline) -> Result<Vec<Tensor>> {
        let sh = self.shape(&metas(inputs))?;
        let ints = |i: usize| -> Result<Vec<i64>> {
            Ok(inputs[i].as_i32()?.iter().map(|&v| i64::from(v)).collect())
        };
        let plan = slot_plan(&sh, &ints(1)?, &ints(3)?, &ints(4)?)?;
        let x = view2(inputs[0].as_f32()?)?;
        let w: Vec<f32> = inputs[2].as_f32()?.iter().copied().collect();
        let gate_up = view3(inputs[5].as_f32()?)?;
        let down = view3(inputs[6].as_f32()?)?;
        let gemm = Gemm::current();
        let ffn = |(e, slots): (usize, &Vec<usize>)| {
            let xe = gather_rows(x, slots, sh.k);
            expert_ffn(
                &gemm,
                xe.view(),
                gate_up.slice(s![e, .., ..]),
                down.slice(s![e, .., ..]),
                deadline,
            )
        };
        let serial = gemm.blas().is_some() || sh.t * sh.k * sh.h * sh.f < CPU_PAR_MIN;
        let outs: Vec<Array2<f32>> = if serial {
            plan.iter().enumerate().map(ffn).collect()
        } else {
            plan.par_iter().enumerate().map(ffn).collect()
        };
        deadline.check("moe_experts on the CPU")?;
        let y = combine(&sh, &plan, &outs, &w);
        Ok(vec![Tensor::from_vec_f32(&[sh.t, sh.h], y)?])
    }

    /// The slots (t*k + j) each expert runs, in segment order, after the checks of the CPU
    /// path (the same errors); slots in no segment contribute nothing. For backends that run
    /// the op their own way (the FPGA's launch sequence).
    pub(crate) fn slots(&self, inputs: &[&Tensor]) -> Result<(ExpertsShape, Vec<Vec<usize>>)> {
        let sh = self.shape(&metas(inputs))?;
        let ints = |i: usize| -> Result<Vec<i64>> {
            Ok(inputs[i].as_i32()?.iter().map(|&v| i64::from(v)).collect())
        };
        let plan = slot_plan(&sh, &ints(1)?, &ints(3)?, &ints(4)?)?;
        Ok((sh, plan))
    }

    /// f64 reference: plain loops over the definition ([`super::super::textbook::moe_experts`]);
    /// `slot_plan` only validates.
    pub fn reference(&self, inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
        let sh = self.shape(&reference_metas(inputs, &EXPERT_DTYPES))?;
        let ints = |i: usize| int_values(&inputs[i], EXPERT_INPUTS[i]);
        let (ids, sorted, offsets) = (ints(1)?, ints(3)?, ints(4)?);
        // Validation only (the same errors as the fast path); the arithmetic, the dropped
        // slots included, is written separately from the definition.
        slot_plan(&sh, &ids, &sorted, &offsets)?;
        let y = super::super::textbook::moe_experts(
            &inputs[0], &ids, &inputs[2], &sorted, &offsets, &inputs[5], &inputs[6],
        )?;
        Ok(vec![y])
    }
}

/// A validated 2-D input as a 2-D view.
fn view2<T>(a: &ArrayD<T>) -> Result<ArrayView2<'_, T>> {
    a.view()
        .into_dimensionality::<Ix2>()
        .map_err(|e| Error::Internal(format!("moe_experts: {e}")))
}

/// A validated 3-D input as a 3-D view.
fn view3<T>(a: &ArrayD<T>) -> Result<ArrayView3<'_, T>> {
    a.view()
        .into_dimensionality::<Ix3>()
        .map_err(|e| Error::Internal(format!("moe_experts: {e}")))
}

/// Integer values of a reference input that stands for an i32 tensor.
fn int_values(a: &ArrayD<f64>, name: &str) -> Result<Vec<i64>> {
    a.iter()
        .map(|&v| {
            if v.fract() == 0.0 && v.abs() <= f64::from(i32::MAX) {
                Ok(v as i64)
            } else {
                Err(Error::invalid(
                    "moe_experts",
                    format!("{name} holds {v}, which is not an i32 value"),
                ))
            }
        })
        .collect()
}

/// The slots (t*k + j) each expert runs, in segment order, after checking that every id is an
/// expert, the offsets are ordered and inside sorted_token_ids, and every non-sentinel entry
/// is a slot routed to the expert whose segment holds it, appearing once. Slots in no segment
/// contribute nothing.
fn slot_plan(
    sh: &ExpertsShape,
    ids: &[i64],
    sorted: &[i64],
    offsets: &[i64],
) -> Result<Vec<Vec<usize>>> {
    let op = "moe_experts";
    let bad = |msg: String| Err(Error::invalid(op, msg));
    let k = sh.k;
    if let Some(s) = ids.iter().position(|&id| id < 0 || id >= sh.e as i64) {
        return bad(format!(
            "topk_ids[{}, {}] = {} is not an expert id (E = {})",
            s / k,
            s % k,
            ids[s],
            sh.e
        ));
    }
    let ordered = offsets.windows(2).all(|w| w[0] <= w[1]);
    if offsets[0] < 0 || !ordered || offsets[sh.e] > sh.p as i64 {
        return bad(format!(
            "expert_offsets {offsets:?} must rise from >= 0 to <= {} (the length of sorted_token_ids)",
            sh.p
        ));
    }
    let slots = (sh.t * k) as i64;
    let mut seen = vec![false; sh.t * k];
    let mut plan = vec![Vec::new(); sh.e];
    for (e, segment) in plan.iter_mut().enumerate() {
        let start = offsets[e] as usize;
        let end = offsets[e + 1] as usize;
        for (pos, &s) in sorted[start..end].iter().enumerate() {
            let pos = start + pos;
            if s == slots {
                continue;
            }
            if !(0..slots).contains(&s) {
                return bad(format!(
                    "sorted_token_ids[{pos}] = {s} is neither a slot id (0..{slots}) nor the sentinel {slots}"
                ));
            }
            let su = s as usize;
            if ids[su] != e as i64 {
                return bad(format!(
                    "sorted_token_ids[{pos}] = slot {s} lies in expert {e}'s segment, but topk_ids[{}, {}] = {}",
                    su / k,
                    su % k,
                    ids[su]
                ));
            }
            if std::mem::replace(&mut seen[su], true) {
                return bad(format!("slot {s} appears twice in sorted_token_ids"));
            }
            segment.push(su);
        }
    }
    Ok(plan)
}

/// The token rows of `slots` stacked into a matrix [slots, H].
fn gather_rows(x: ArrayView2<f32>, slots: &[usize], k: usize) -> Array2<f32> {
    let mut xe = Array2::<f32>::zeros((slots.len(), x.ncols()));
    for (mut dst, &slot) in xe.rows_mut().into_iter().zip(slots) {
        dst.assign(&x.row(slot / k));
    }
    xe
}

/// One expert's FFN on its gathered tokens: down (silu(gate x) * (up x)), as three GEMMs
/// (gate and up in one) through `gemm`. `gate_up` [2F, H], `down` [H, F]; returns [rows, H].
fn expert_ffn(
    gemm: &Gemm,
    x: ArrayView2<f32>,
    gate_up: ArrayView2<f32>,
    down: ArrayView2<f32>,
    deadline: &Deadline,
) -> Array2<f32> {
    let (n, f) = (x.nrows(), gate_up.nrows() / 2);
    let mut gu = Array2::<f32>::zeros((n, 2 * f));
    matmul_bt(gemm, x, gate_up, gu.view_mut(), deadline, |_, _| {});
    let mut act = Array2::<f32>::zeros((n, f));
    for (mut dst, src) in act.rows_mut().into_iter().zip(gu.rows()) {
        let (gate, up) = src.split_at(Axis(0), f);
        let zip = Zip::from(&mut dst).and(&gate).and(&up);
        if gate.iter().all(|g| g.is_finite()) {
            zip.for_each(|d, &g, &u| *d = silu_fast(g) * u);
        } else {
            zip.for_each(|d, &g, &u| *d = silu(g) * u);
        }
    }
    let mut y = Array2::<f32>::zeros((n, down.nrows()));
    matmul_bt(gemm, act.view(), down, y.view_mut(), deadline, |_, _| {});
    y
}

/// y[t] = sum over j ascending of topk_weights[t, j] * (output of slot t*k+j), with the
/// outputs `outs[e]` row-aligned to `plan[e]`; tokens in parallel, each in a fixed order.
fn combine<T: Real>(sh: &ExpertsShape, plan: &[Vec<usize>], outs: &[Array2<T>], w: &[T]) -> Vec<T> {
    let mut loc: Vec<Option<(usize, usize)>> = vec![None; sh.t * sh.k];
    for (e, slots) in plan.iter().enumerate() {
        for (r, &slot) in slots.iter().enumerate() {
            loc[slot] = Some((e, r));
        }
    }
    let mut y = vec![T::zero(); sh.t * sh.h];
    if sh.h == 0 {
        return y;
    }
    let token = |(t, yrow): (usize, &mut [T])| {
        for j in 0..sh.k {
            let slot = t * sh.k + j;
            if let Some((e, r)) = loc[slot] {
                let wt = w[slot];
                for (acc, &v) in yrow.iter_mut().zip(outs[e].row(r)) {
                    *acc += wt * v;
                }
            }
        }
    };
    if y.len() * sh.k < CPU_PAR_MIN {
        y.chunks_mut(sh.h).enumerate().for_each(token);
    } else {
        y.par_chunks_mut(sh.h).enumerate().for_each(token);
    }
    y
}
