//! MoE routing and experts.
//!
//! Routing: logits [T, E] -> softmax over all experts -> top-k (equal probabilities: lower
//! expert index first) -> optional renormalisation of the k weights to sum 1. It also returns
//! the per-expert counts over all T*k slots; the permutation grouping token slots by expert,
//! each expert's segment padded to `block_size` (as vLLM's moe_align_block_size: slot ids
//! `t*k + j`, padding filled with the sentinel T*k, segment starts in `expert_offsets`); the
//! load-balancing loss E * sum_i (count_i / T) * P_i (P_i the mean routing probability of
//! expert i; transformers' convention) and the router z-loss mean_t logsumexp(logits_t)^2.
//!
//! Experts: for each expert e, y_slot = down_e (silu(gate_e x) * (up_e x)) over its slots,
//! then each token sums its k slots weighted by topk_weights.

use ndarray::{Array2, ArrayD, ArrayView2, ArrayView3, Ix2, Ix3, IxDyn, s};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::elementwise::{Real, exp_shifted, silu};
use super::linear::matmul_bt;
use super::{CPU_PAR_MIN, expect_inputs, flat, metas, reference_metas};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorMeta};

/// Outputs of routing, in order.
pub const ROUTE_OUTPUTS: [&str; 7] = [
    "topk_ids",
    "topk_weights",
    "expert_counts",
    "sorted_token_ids",
    "expert_offsets",
    "aux_loss",
    "z_loss",
];

/// Inputs of the experts op, in order.
pub const EXPERT_INPUTS: [&str; 7] = [
    "x",
    "topk_ids",
    "topk_weights",
    "sorted_token_ids",
    "expert_offsets",
    "gate_up",
    "down",
];

/// Parameters of MoE routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoeRouteParams {
    /// Experts per token.
    pub top_k: usize,
    /// Renormalise the k weights to sum 1.
    pub renormalize: bool,
    /// Each expert's segment of `sorted_token_ids` is padded to a multiple of this.
    pub block_size: usize,
}

impl Default for MoeRouteParams {
    fn default() -> Self {
        Self {
            top_k: 2,
            renormalize: true,
            block_size: 16,
        }
    }
}

impl MoeRouteParams {
    /// Length of `sorted_token_ids`: the most the padded segments can need,
    /// T*k + E*(block_size - 1), rounded up to a multiple of block_size.
    pub fn padded_len(&self, tokens: usize, experts: usize) -> usize {
        let bs = self.block_size.max(1);
        let raw = tokens * self.top_k + experts * (bs - 1);
        raw.div_ceil(bs) * bs
    }

    /// Output metas (see [`ROUTE_OUTPUTS`]).
    pub fn validate(&self, inputs: &[TensorMeta]) -> Result<Vec<TensorMeta>> {
        let op = "moe_route";
        expect_inputs(op, inputs.len(), &["logits"])?;
        let l = &inputs[0];
        if l.dtype != DType::F32 {
            return Err(Error::invalid(
                op,
                format!("logits are {}, expected f32", l.dtype),
            ));
        }
        if l.shape.len() != 2 {
            return Err(Error::invalid(
                op,
                format!("logits have shape {:?}, expected [T, E]", l.shape),
            ));
        }
        let (t, e) = (l.shape[0], l.shape[1]);
        if e == 0 {
            return Err(Error::invalid(op, "logits have 0 experts"));
        }
        if self.top_k == 0 || self.top_k > e {
            return Err(Error::invalid(
                op,
                format!(
                    "top_k = {} must be in 1..={e} (the number of experts)",
                    self.top_k
                ),
            ));
        }
        if self.block_size == 0 {
            return Err(Error::invalid(op, "block_size must be > 0"));
        }
        let k = self.top_k;
        let most = t as u128 * k as u128 + e as u128 * self.block_size as u128;
        if most > i32::MAX as u128 {
            return Err(Error::invalid(
                op,
                format!("{t} tokens x top_k {k} (+ padding) do not fit i32 slot ids"),
            ));
        }
        Ok(vec![
            TensorMeta::new(vec![t, k], DType::I32),
            TensorMeta::new(vec![t, k], DType::F32),
            TensorMeta::new(vec![e], DType::I32),
            TensorMeta::new(vec![self.padded_len(t, e)], DType::I32),
            TensorMeta::new(vec![e + 1], DType::I32),
            TensorMeta::new(vec![1], DType::F32),
            TensorMeta::new(vec![1], DType::F32),
        ])
    }

    /// Softmax, top-k and losses: a handful of operations per logit.
    pub fn flops(&self, inputs: &[TensorMeta]) -> f64 {
        8.0 * inputs.first().map(|m| m.numel() as f64).unwrap_or(0.0)
    }

    /// CPU f32 implementation: rows in parallel (softmax, top-k, per-row loss terms), then the
    /// histogram and the padded permutation. Loss sums are f64 and reduced in a fixed order.
    pub fn cpu(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let outs = self.validate(&metas(inputs))?;
        let logits = inputs[0].as_f32()?;
        let r = self.route(&logits.as_standard_layout(), &outs)?;
        let i32s = |m: &TensorMeta, v: Vec<i32>| Tensor::from_vec_i32(&m.shape, v);
        Ok(vec![
            i32s(&outs[0], r.ids)?,
            Tensor::from_vec_f32(&outs[1].shape, r.weights)?,
            i32s(&outs[2], r.counts)?,
            i32s(&outs[3], r.sorted)?,
            i32s(&outs[4], r.offsets)?,
            Tensor::from_vec_f32(&[1], vec![r.aux_loss as f32])?,
            Tensor::from_vec_f32(&[1], vec![r.z_loss as f32])?,
        ])
    }

    /// f64 reference (ids, counts and offsets as f64 values).
    pub fn reference(&self, inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
        let outs = self.validate(&reference_metas(inputs, &[]))?;
        let r = self.route(&inputs[0].as_standard_layout(), &outs)?;
        let arr = |m: &TensorMeta, v: Vec<f64>| {
            ArrayD::from_shape_vec(IxDyn(&m.shape), v)
                .map_err(|e| Error::Internal(format!("moe_route: {e}")))
        };
        let wide = |v: Vec<i32>| v.into_iter().map(f64::from).collect::<Vec<_>>();
        Ok(vec![
            arr(&outs[0], wide(r.ids))?,
            arr(&outs[1], r.weights)?,
            arr(&outs[2], wide(r.counts))?,
            arr(&outs[3], wide(r.sorted))?,
            arr(&outs[4], wide(r.offsets))?,
            arr(&outs[5], vec![r.aux_loss])?,
            arr(&outs[6], vec![r.z_loss])?,
        ])
    }

    /// Routing of validated logits [T, E] whose output metas are `outs`.
    fn route<T: Real>(
        &self,
        logits: &ndarray::CowArray<'_, T, IxDyn>,
        outs: &[TensorMeta],
    ) -> Result<Routed<T>> {
        let (t, e) = (logits.shape()[0], logits.shape()[1]);
        let k = self.top_k;
        let l = flat(logits)?;
        check_finite(l, e)?;
        let mut ids = vec![0i32; t * k];
        let mut weights = vec![T::zero(); t * k];
        // Per block of rows: (sum over rows of each expert's probability, sum of lse^2).
        let rows = |((lc, ic), wc): ((&[T], &mut [i32]), &mut [T])| {
            route_rows(lc, e, k, self.renormalize, ic, wc)
        };
        let (lc, kc) = (ROUTE_ROWS * e, ROUTE_ROWS * k);
        let partials: Vec<(Vec<f64>, f64)> = if l.len() < CPU_PAR_MIN {
            let chunks = l.chunks(lc).zip(ids.chunks_mut(kc));
            chunks.zip(weights.chunks_mut(kc)).map(rows).collect()
        } else {
            let chunks = l.par_chunks(lc).zip(ids.par_chunks_mut(kc));
            chunks.zip(weights.par_chunks_mut(kc)).map(rows).collect()
        };
        let mut counts = vec![0i32; e];
        for &id in &ids {
            counts[id as usize] += 1;
        }
        let (sorted, offsets) = align_blocks(&ids, &counts, self.block_size, outs[3].shape[0]);
        let (aux_loss, z_loss) = losses(&partials, &counts, t);
        Ok(Routed {
            ids,
            weights,
            counts,
            sorted,
            offsets,
            aux_loss,
            z_loss,
        })
    }
}

/// Rows of logits each rayon task routes. Fixed (not tied to the thread count), so the loss
/// sums are reduced in the same order on every machine.
const ROUTE_ROWS: usize = 64;

/// Everything routing produces, before it is shaped into tensors.
struct Routed<T> {
    ids: Vec<i32>,
    weights: Vec<T>,
    counts: Vec<i32>,
    sorted: Vec<i32>,
    offsets: Vec<i32>,
    aux_loss: f64,
    z_loss: f64,
}

/// (aux_loss, z_loss) from the per-block partial sums (reduced in block order), the expert
/// counts and the number of tokens: E * sum_i (count_i / T) * mean_t p[t, i] and
/// mean_t lse_t^2, both 0 when T = 0.
fn losses(partials: &[(Vec<f64>, f64)], counts: &[i32], t: usize) -> (f64, f64) {
    if t == 0 {
        return (0.0, 0.0);
    }
    let mut prob_sums = vec![0.0f64; counts.len()];
    let mut z_sum = 0.0f64;
    for (p, z) in partials {
        prob_sums.iter_mut().zip(p).for_each(|(a, b)| *a += b);
        z_sum += z;
    }
    let tf = t as f64;
    let aux: f64 = counts
        .iter()
        .zip(&prob_sums)
        .map(|(&c, &p)| f64::from(c) / tf * (p / tf))
        .sum();
    (counts.len() as f64 * aux, z_sum / tf)
}

/// Rejects NaN and infinite logits, naming the first token row that holds one.
fn check_finite<T: Real>(l: &[T], e: usize) -> Result<()> {
    for (t, row) in l.chunks(e).enumerate() {
        if let Some((i, v)) = row.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(Error::invalid(
                "moe_route",
                format!(
                    "logits row {t} (token {t}) holds {v} at expert {i}; logits must be finite"
                ),
            ));
        }
    }
    Ok(())
}

/// Routes rows of logits (each of length `e`): writes each row's top-k ids and weights, and
/// returns the rows' summed softmax probabilities per expert and their summed lse^2.
fn route_rows<T: Real>(
    logits: &[T],
    e: usize,
    k: usize,
    renormalize: bool,
    ids: &mut [i32],
    weights: &mut [T],
) -> (Vec<f64>, f64) {
    let mut prob_sums = vec![0.0f64; e];
    let mut z = 0.0f64;
    let mut ex = vec![T::zero(); e];
    let mut top = vec![0usize; k];
    for ((row, id_row), w_row) in logits
        .chunks(e)
        .zip(ids.chunks_mut(k))
        .zip(weights.chunks_mut(k))
    {
        let (m, sum) = exp_shifted(row, &mut ex);
        let lse = (m + sum.ln()).widen();
        z += lse * lse;
        for (acc, &x) in prob_sums.iter_mut().zip(&ex) {
            *acc += (x / sum).widen();
        }
        top_k(row, &mut top);
        let denom = if renormalize {
            top.iter().map(|&i| ex[i]).sum::<T>()
        } else {
            sum
        };
        for ((id, w), &i) in id_row.iter_mut().zip(w_row.iter_mut()).zip(&top) {
            *id = i as i32;
            *w = ex[i] / denom;
        }
    }
    (prob_sums, z)
}

/// The indices of the `top.len()` largest values of `row`, largest first; equal values keep
/// the lower index first. Compares the logits themselves (softmax is monotone), so values that
/// round to one probability in f32 still rank as they would exactly. `row` holds no NaN.
fn top_k<T: PartialOrd + Copy>(row: &[T], top: &mut [usize]) {
    let k = top.len();
    let mut filled = 0;
    for (i, &v) in row.iter().enumerate() {
        if filled == k && v <= row[top[k - 1]] {
            continue;
        }
        // First position holding a strictly smaller value: ties stay ahead of `i`.
        let pos = top[..filled]
            .iter()
            .position(|&j| row[j] < v)
            .unwrap_or(filled);
        let end = filled.min(k - 1);
        top.copy_within(pos..end, pos + 1);
        top[pos] = i;
        filled = (filled + 1).min(k);
    }
}

/// Groups slot ids t*k+j by expert (ascending expert, then ascending slot), padding each
/// expert's segment with the sentinel T*k to a multiple of `block`; returns the `len`-long
/// permutation (tail filled with the sentinel) and the E+1 segment offsets.
fn align_blocks(ids: &[i32], counts: &[i32], block: usize, len: usize) -> (Vec<i32>, Vec<i32>) {
    let sentinel = ids.len() as i32;
    let mut offsets = Vec::with_capacity(counts.len() + 1);
    offsets.push(0i32);
    for &c in counts {
        let padded = (c as usize).div_ceil(block) * block;
        offsets.push(offsets[offsets.len() - 1] + padded as i32);
    }
    let mut sorted = vec![sentinel; len];
    let mut cursor: Vec<usize> = offsets.iter().map(|&o| o as usize).collect();
    for (slot, &id) in ids.iter().enumerate() {
        let c = &mut cursor[id as usize];
        sorted[*c] = slot as i32;
        *c += 1;
    }
    (sorted, offsets)
}

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
        let want = [
            DType::F32,
            DType::I32,
            DType::F32,
            DType::I32,
            DType::I32,
            DType::F32,
            DType::F32,
        ];
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
        if down.shape != [e, h, f] {
            return bad(format!("down {:?} must be [{e}, {h}, {f}]", down.shape));
        }
        if offsets.shape != [e + 1] || sorted.shape.len() != 1 {
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
    pub fn validate(&self, inputs: &[TensorMeta]) -> Result<Vec<TensorMeta>> {
        let s = self.shape(inputs)?;
        Ok(vec![TensorMeta::new(vec![s.t, s.h], DType::F32)])
    }

    /// 2 * T*k * 3 * H * F (gate, up, down products).
    pub fn flops(&self, inputs: &[TensorMeta]) -> f64 {
        self.shape(inputs)
            .map(|s| 6.0 * (s.t * s.k) as f64 * s.h as f64 * s.f as f64)
            .unwrap_or(0.0)
    }

    /// CPU f32 implementation: checks the routing, gathers each expert's tokens into a matrix
    /// and runs its FFN as GEMMs (experts in parallel), then sums each token's k slots in
    /// slot order.
    pub fn cpu(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let sh = self.shape(&metas(inputs))?;
        let ints = |i: usize| -> Result<Vec<i64>> {
            Ok(inputs[i].as_i32()?.iter().map(|&v| i64::from(v)).collect())
        };
        let plan = slot_plan(&sh, &ints(1)?, &ints(3)?, &ints(4)?)?;
        let x = view2(inputs[0].as_f32()?)?;
        let w: Vec<f32> = inputs[2].as_f32()?.iter().copied().collect();
        let gate_up = view3(inputs[5].as_f32()?)?;
        let down = view3(inputs[6].as_f32()?)?;
        let ffn = |(e, slots): (usize, &Vec<usize>)| {
            let xe = gather_rows(x, slots, sh.k);
            expert_ffn(
                xe.view(),
                gate_up.slice(s![e, .., ..]),
                down.slice(s![e, .., ..]),
            )
        };
        let outs: Vec<Array2<f32>> = if sh.t * sh.k * sh.h * sh.f < CPU_PAR_MIN {
            plan.iter().enumerate().map(ffn).collect()
        } else {
            plan.par_iter().enumerate().map(ffn).collect()
        };
        let y = combine(&sh, &plan, &outs, &w);
        Ok(vec![Tensor::from_vec_f32(&[sh.t, sh.h], y)?])
    }

    /// f64 reference: every slot's FFN as direct dot products, then the same slot-order sum.
    pub fn reference(&self, inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
        let dtypes = [
            DType::F32,
            DType::I32,
            DType::F32,
            DType::I32,
            DType::I32,
            DType::F32,
            DType::F32,
        ];
        let sh = self.shape(&reference_metas(inputs, &dtypes))?;
        let ints = |i: usize| int_values(&inputs[i], EXPERT_INPUTS[i]);
        let plan = slot_plan(&sh, &ints(1)?, &ints(3)?, &ints(4)?)?;
        let x = view2(&inputs[0])?;
        let w: Vec<f64> = inputs[2].iter().copied().collect();
        let gate_up = view3(&inputs[5])?;
        let down = view3(&inputs[6])?;
        let outs: Vec<Array2<f64>> = plan
            .iter()
            .enumerate()
            .map(|(e, slots)| {
                let (gu, dn) = (gate_up.slice(s![e, .., ..]), down.slice(s![e, .., ..]));
                let mut ye = Array2::<f64>::zeros((slots.len(), sh.h));
                for (r, &slot) in slots.iter().enumerate() {
                    let xt = x.row(slot / sh.k);
                    let act: Vec<f64> = (0..sh.f)
                        .map(|i| silu(gu.row(i).dot(&xt)) * gu.row(sh.f + i).dot(&xt))
                        .collect();
                    for (o, drow) in ye.row_mut(r).iter_mut().zip(dn.rows()) {
                        *o = drow.iter().zip(&act).map(|(a, b)| a * b).sum();
                    }
                }
                ye
            })
            .collect();
        let y = combine(&sh, &plan, &outs, &w);
        let y = ArrayD::from_shape_vec(IxDyn(&[sh.t, sh.h]), y)
            .map_err(|e| Error::Internal(format!("moe_experts: {e}")))?;
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
fn gather_rows<T: Real>(x: ArrayView2<T>, slots: &[usize], k: usize) -> Array2<T> {
    let mut xe = Array2::<T>::zeros((slots.len(), x.ncols()));
    for (mut dst, &slot) in xe.rows_mut().into_iter().zip(slots) {
        dst.assign(&x.row(slot / k));
    }
    xe
}

/// One expert's FFN on its gathered tokens: down (silu(gate x) * (up x)), as three GEMMs
/// (gate and up in one). `gate_up` [2F, H], `down` [H, F]; returns [rows, H].
fn expert_ffn<T: Real>(x: ArrayView2<T>, gate_up: ArrayView2<T>, down: ArrayView2<T>) -> Array2<T> {
    let (n, f) = (x.nrows(), gate_up.nrows() / 2);
    let mut gu = Array2::<T>::zeros((n, 2 * f));
    matmul_bt(x, gate_up, gu.view_mut(), |_, _| {});
    let act = Array2::from_shape_fn((n, f), |(r, i)| silu(gu[[r, i]]) * gu[[r, f + i]]);
    let mut y = Array2::<T>::zeros((n, down.nrows()));
    matmul_bt(act.view(), down, y.view_mut(), |_, _| {});
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
