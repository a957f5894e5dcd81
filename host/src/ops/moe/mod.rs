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
//!
//! `routing` holds [`MoeRouteParams`] (and the permutation and loss helpers the FPGA backend
//! reuses on its kernel's ids), `experts` holds [`MoeExpertsParams`].

mod experts;
mod routing;

pub(crate) use experts::EXPERT_DTYPES;
pub use experts::{ExpertsShape, MoeExpertsParams};
pub use routing::{MAX_BLOCK_SIZE, MAX_EXPERTS, MoeRouteParams};
pub(crate) use routing::{align_blocks, router_losses};

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
