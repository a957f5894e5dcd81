//! MoE routing: softmax, top-k, the histogram, the block-aligned permutation and the losses.

use crate::ops::OutputMetas;
use ndarray::{ArrayD, IxDyn};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use smallvec::smallvec;

use super::super::elementwise::{Real, exp_shifted};
use super::super::{CPU_PAR_MIN, expect_inputs, flat, metas, reference_metas};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorMeta};

/// Most experts a router takes (DeepSeek-V3 has 256; the padded permutation grows with
/// experts x block size, so an absurd count is refused before anything is allocated).
pub const MAX_EXPERTS: usize = 1 << 16;

/// Largest block size of the padded expert segments.
pub const MAX_BLOCK_SIZE: usize = 4096;

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

    /// Output metas (see [`super::ROUTE_OUTPUTS`]).
    pub fn validate(&self, inputs: &[TensorMeta]) -> Result<OutputMetas> {
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
        if e == 0 || e > MAX_EXPERTS {
            return Err(Error::invalid(
                op,
                format!("logits have {e} experts (accepted: 1..={MAX_EXPERTS})"),
            ));
        }
        if self.block_size > MAX_BLOCK_SIZE {
            return Err(Error::invalid(
                op,
                format!(
                    "block_size = {} (accepted: 1..={MAX_BLOCK_SIZE})",
                    self.block_size
                ),
            ));
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
        Ok(smallvec![
            TensorMeta::new([t, k], DType::I32),
            TensorMeta::new([t, k], DType::F32),
            TensorMeta::new([e], DType::I32),
            TensorMeta::new([self.padded_len(t, e)], DType::I32),
            TensorMeta::new([e + 1], DType::I32),
            TensorMeta::new([1], DType::F32),
            TensorMeta::new([1], DType::F32),
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

    /// f64 reference (ids, counts and offsets as f64 values): the definition written as plain
    /// loops ([`super::super::textbook::moe_route`]), sharing no code with [`Self::cpu`].
    pub fn reference(&self, inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
        let outs = self.validate(&reference_metas(inputs, &[]))?;
        let e = inputs[0].shape()[1];
        let logits: Vec<f64> = inputs[0].iter().copied().collect();
        check_finite(&logits, e)?;
        // Logits rank as values: -0 ties +0 (the lower expert first), as the f32 path's
        // comparison has it; the textbook's total order would put +0 ahead.
        let logits = inputs[0].mapv(|x| if x == 0.0 { 0.0 } else { x });
        let r = super::super::textbook::moe_route(
            &logits,
            self.top_k,
            self.renormalize,
            self.block_size,
            outs[3].shape[0],
        );
        let arr = |m: &TensorMeta, v: Vec<f64>| {
            ArrayD::from_shape_vec(IxDyn(&m.shape), v)
                .map_err(|e| Error::Internal(format!("moe_route: {e}")))
        };
        let wide = |v: Vec<i64>| v.into_iter().map(|x| x as f64).collect::<Vec<_>>();
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
        let sum = add_loss_terms(row, &mut ex, &mut prob_sums, &mut z);
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

/// Adds one row's softmax probabilities to `prob_sums` and its lse^2 to `z`; leaves
/// exp(row - max) in `ex` and returns its sum.
fn add_loss_terms<T: Real>(row: &[T], ex: &mut [T], prob_sums: &mut [f64], z: &mut f64) -> T {
    let (m, sum) = exp_shifted(row, ex);
    let lse = (m + sum.ln()).widen();
    *z += lse * lse;
    for (acc, &x) in prob_sums.iter_mut().zip(ex.iter()) {
        *acc += (x / sum).widen();
    }
    sum
}

/// (aux_loss, z_loss) of logits `[T, E]` (rows of `e`, in f64) and the expert counts of the
/// routing made from them, summed as [`MoeRouteParams`]'s reference sums them (blocks of
/// rows, in order). For devices that route but leave the losses to the host.
pub(crate) fn router_losses(logits: &[f64], e: usize, counts: &[i32]) -> (f64, f64) {
    if e == 0 {
        return (0.0, 0.0);
    }
    let partials: Vec<(Vec<f64>, f64)> = logits
        .chunks(ROUTE_ROWS * e)
        .map(|block| {
            let (mut p, mut z) = (vec![0.0f64; e], 0.0f64);
            let mut ex = vec![0.0f64; e];
            for row in block.chunks(e) {
                add_loss_terms(row, &mut ex, &mut p, &mut z);
            }
            (p, z)
        })
        .collect();
    losses(&partials, counts, logits.len() / e)
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
/// permutation (tail filled with the sentinel) and the E+1 segment offsets. Also used on ids
/// and counts that come from a device (the FPGA router): an id outside the experts, or more
/// slots than `len` holds, is left out rather than trusted.
pub(crate) fn align_blocks(
    ids: &[i32],
    counts: &[i32],
    block: usize,
    len: usize,
) -> (Vec<i32>, Vec<i32>) {
    let sentinel = ids.len() as i32;
    let mut offsets = Vec::with_capacity(counts.len() + 1);
    offsets.push(0i32);
    for &c in counts {
        let padded = (c.max(0) as usize).div_ceil(block) * block;
        offsets.push(offsets[offsets.len() - 1] + padded as i32);
    }
    let mut sorted = vec![sentinel; len];
    let mut cursor: Vec<usize> = offsets.iter().map(|&o| o as usize).collect();
    for (slot, &id) in ids.iter().enumerate() {
        if let Some(c) = usize::try_from(id).ok().and_then(|i| cursor.get_mut(i))
            && let Some(s) = sorted.get_mut(*c)
        {
            *s = slot as i32;
            *c += 1;
        }
    }
    (sorted, offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn align_pads_segments() {
        let (s, o) = align_blocks(&[1, 0, 1, 1], &[1, 3, 0], 2, 8);
        assert_eq!(o, vec![0, 2, 6, 6]);
        assert_eq!(s, vec![1, 4, 0, 2, 3, 4, 4, 4]);
    }

    #[test]
    fn align_leaves_out_ids_it_cannot_place() {
        // id 7 names no expert, -1 neither; the counts say one slot for expert 0
        let (s, o) = align_blocks(&[0, 7, -1], &[1, 0], 2, 4);
        assert_eq!(o, vec![0, 2, 2]);
        assert_eq!(s, vec![0, 3, 3, 3]);
    }

    #[test]
    fn losses_match_the_reference() {
        let (t, e) = (70, 5);
        let logits: Vec<f64> = (0..t * e)
            .map(|i| ((i * 37 % 11) as f64) * 0.3 - 1.0)
            .collect();
        let p = MoeRouteParams::default();
        let x = ArrayD::from_shape_vec(IxDyn(&[t, e]), logits.clone()).expect("array");
        let r = p.reference(&[x]).expect("reference");
        let counts: Vec<i32> = r[2].iter().map(|&c| c as i32).collect();
        let (aux, z) = router_losses(&logits, e, &counts);
        // The reference sums in another order (it is written apart): equal to f64 rounding.
        assert!((aux - r[5][[0]]).abs() <= 1e-12 * aux.abs(), "{aux}");
        assert!((z - r[6][[0]]).abs() <= 1e-12 * z.abs(), "{z}");
        assert_eq!(router_losses(&[], e, &[0; 5]), (0.0, 0.0));
    }
}
