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

use ndarray::ArrayD;
use serde::{Deserialize, Serialize};

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
        let raw = tokens * self.top_k + experts * (self.block_size - 1);
        raw.div_ceil(self.block_size) * self.block_size
    }

    /// Output metas (see [`ROUTE_OUTPUTS`]).
    pub fn validate(&self, inputs: &[TensorMeta]) -> Result<Vec<TensorMeta>> {
        let op = "moe_route";
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

    /// CPU f32 implementation.
    pub fn cpu(&self, _inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        Err(Error::Internal("moe_route cpu pending".into()))
    }

    /// f64 reference.
    pub fn reference(&self, _inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
        Err(Error::Internal("moe_route reference pending".into()))
    }
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

    /// CPU f32 implementation.
    pub fn cpu(&self, _inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        Err(Error::Internal("moe_experts cpu pending".into()))
    }

    /// f64 reference.
    pub fn reference(&self, _inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
        Err(Error::Internal("moe_experts reference pending".into()))
    }
}
