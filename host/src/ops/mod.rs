//! The ops tandem runs: parameters, shape/dtype validation, the CPU f32 implementation and
//! the f64 reference of each op family, one file per family.
//!
//! Validation happens here, once; backends assume valid input. Tensors crossing this API are
//! *logical* tensors: floating-point data is f32, ids and counts i32. A backend may store them
//! in another precision (bf16 on a GPU, int8 on an FPGA) but reads and writes them as these.

pub mod attention;
pub mod elementwise;
pub mod layout;
pub mod linear;
pub mod moe;
pub mod norm;
pub mod rope;
pub mod textbook;

use ndarray::ArrayD;
use serde::{Deserialize, Serialize};

pub use attention::AttentionParams;
pub use layout::SplitHeadsParams;
pub use linear::{Activation, LinearParams};
pub use moe::{MoeExpertsParams, MoeRouteParams};
pub use norm::RmsNormParams;
pub use rope::RopeParams;

use crate::error::Result;
use crate::tensor::{Tensor, TensorMeta};

/// One op with its parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Attention forward: q, k, v -> o, lse.
    Attention(AttentionParams),
    /// MoE routing: logits -> topk_ids, topk_weights, expert_counts, sorted_token_ids,
    /// expert_offsets, aux_loss, z_loss.
    MoeRoute(MoeRouteParams),
    /// MoE experts: x, topk_ids, topk_weights, sorted_token_ids, expert_offsets, gate_up, down -> y.
    MoeExperts(MoeExpertsParams),
    /// Fused linear: x, w (, b) -> act(x w^T + b).
    Linear(LinearParams),
    /// RMSNorm: x, w (, residual) -> y (, x + residual).
    RmsNorm(RmsNormParams),
    /// Rotary position embedding (rotate-half) on [B, H, T, D].
    Rope(RopeParams),
    /// Elementwise a + b.
    Add,
    /// [B*T, H*D] -> [B, H, T, D].
    SplitHeads(SplitHeadsParams),
    /// [B, H, T, D] -> [B*T, H*D].
    MergeHeads,
}

/// The arithmetic and the fewest bytes an op must move: its floor on any device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct OpCost {
    /// Floating-point (or integer multiply-add) operations.
    pub flops: f64,
    /// Bytes read plus bytes written, each input and output once, at logical precision.
    pub bytes: f64,
}

impl Op {
    /// The op family's name as used on the command line and in reports.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Attention(_) => "attention",
            Op::MoeRoute(_) => "moe_route",
            Op::MoeExperts(_) => "moe_experts",
            Op::Linear(_) => "linear",
            Op::RmsNorm(_) => "rmsnorm",
            Op::Rope(_) => "rope",
            Op::Add => "add",
            Op::SplitHeads(_) => "split_heads",
            Op::MergeHeads => "merge_heads",
        }
    }

    /// Names of the inputs this op takes, in order.
    pub fn input_names(&self) -> Vec<&'static str> {
        match self {
            Op::Attention(_) => vec!["q", "k", "v"],
            Op::MoeRoute(_) => vec!["logits"],
            Op::MoeExperts(_) => moe::EXPERT_INPUTS.to_vec(),
            Op::Linear(p) => {
                if p.bias {
                    vec!["x", "w", "b"]
                } else {
                    vec!["x", "w"]
                }
            }
            Op::RmsNorm(p) => {
                if p.residual {
                    vec!["x", "w", "residual"]
                } else {
                    vec!["x", "w"]
                }
            }
            Op::Rope(_) => vec!["x"],
            Op::Add => vec!["a", "b"],
            Op::SplitHeads(_) | Op::MergeHeads => vec!["x"],
        }
    }

    /// Names of the outputs this op produces, in order.
    pub fn output_names(&self) -> Vec<&'static str> {
        match self {
            Op::Attention(_) => vec!["o", "lse"],
            Op::MoeRoute(_) => moe::ROUTE_OUTPUTS.to_vec(),
            Op::MoeExperts(_) => vec!["y"],
            Op::RmsNorm(p) if p.residual => vec!["y", "sum"],
            _ => vec!["y"],
        }
    }

    /// Checks the inputs' shapes and dtypes and returns the outputs'.
    pub fn validate(&self, inputs: &[TensorMeta]) -> Result<Vec<TensorMeta>> {
        check_arity(self, inputs.len())?;
        match self {
            Op::Attention(p) => p.validate(inputs),
            Op::MoeRoute(p) => p.validate(inputs),
            Op::MoeExperts(p) => p.validate(inputs),
            Op::Linear(p) => p.validate(inputs),
            Op::RmsNorm(p) => p.validate(inputs),
            Op::Rope(p) => p.validate(inputs),
            Op::Add => elementwise::validate_add(inputs),
            Op::SplitHeads(p) => p.validate(inputs),
            Op::MergeHeads => layout::validate_merge(inputs),
        }
    }

    /// Runs the op on the CPU in f32 (validating first).
    pub fn run_cpu(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let metas: Vec<TensorMeta> = inputs.iter().map(|t| t.meta()).collect();
        self.validate(&metas)?;
        match self {
            Op::Attention(p) => p.cpu(inputs),
            Op::MoeRoute(p) => p.cpu(inputs),
            Op::MoeExperts(p) => p.cpu(inputs),
            Op::Linear(p) => p.cpu(inputs),
            Op::RmsNorm(p) => p.cpu(inputs),
            Op::Rope(p) => p.cpu(inputs),
            Op::Add => elementwise::cpu_add(inputs),
            Op::SplitHeads(p) => p.cpu(inputs),
            Op::MergeHeads => layout::cpu_merge(inputs),
        }
    }

    /// The f64 reference of the op, used for error reports. Integer outputs (ids, counts)
    /// come back as f64 values.
    pub fn reference(&self, inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
        check_arity(self, inputs.len())?;
        match self {
            Op::Attention(p) => p.reference(inputs),
            Op::MoeRoute(p) => p.reference(inputs),
            Op::MoeExperts(p) => p.reference(inputs),
            Op::Linear(p) => p.reference(inputs),
            Op::RmsNorm(p) => p.reference(inputs),
            Op::Rope(p) => p.reference(inputs),
            Op::Add => elementwise::reference_add(inputs),
            Op::SplitHeads(p) => p.reference(inputs),
            Op::MergeHeads => layout::reference_merge(inputs),
        }
    }

    /// FLOPs and bytes of the op on these inputs (validated shapes).
    pub fn cost(&self, inputs: &[TensorMeta]) -> OpCost {
        let io_bytes = |outs: &[TensorMeta]| -> f64 {
            inputs
                .iter()
                .chain(outs.iter())
                .map(|m| m.bytes() as f64)
                .sum()
        };
        let outs = self.validate(inputs).unwrap_or_default();
        let bytes = io_bytes(&outs);
        let flops = match self {
            Op::Attention(p) => p.flops(inputs),
            Op::MoeRoute(p) => p.flops(inputs),
            Op::MoeExperts(p) => p.flops(inputs),
            Op::Linear(p) => p.flops(inputs),
            Op::RmsNorm(_) | Op::Rope(_) | Op::Add => {
                4.0 * inputs.first().map(|m| m.numel() as f64).unwrap_or(0.0)
            }
            Op::SplitHeads(_) | Op::MergeHeads => 0.0,
        };
        OpCost { flops, bytes }
    }
}

fn check_arity(op: &Op, n: usize) -> Result<()> {
    let names = op.input_names();
    if n != names.len() {
        return Err(crate::error::Error::invalid(
            op.name(),
            format!(
                "takes {} inputs ({}), {} given",
                names.len(),
                names.join(", "),
                n
            ),
        ));
    }
    Ok(())
}

/// Checks that `inputs` holds exactly `names.len()` inputs, naming them when it does not, so
/// an op's own `validate`, `cpu` and `reference` never index past what they were given.
pub(crate) fn expect_inputs(op: &str, given: usize, names: &[&str]) -> Result<()> {
    if given != names.len() {
        return Err(crate::error::Error::invalid(
            op,
            format!(
                "takes {} inputs ({}), {given} given",
                names.len(),
                names.join(", ")
            ),
        ));
    }
    Ok(())
}

/// Metas of host tensors.
pub(crate) fn metas(inputs: &[&Tensor]) -> Vec<TensorMeta> {
    inputs.iter().map(|t| t.meta()).collect()
}

/// Metas of f64 reference inputs: input `i` stands for a tensor of dtype `dtypes[i]` (f32 where
/// `dtypes` is shorter), so a reference validates exactly as the CPU path does.
pub(crate) fn reference_metas(
    inputs: &[ArrayD<f64>],
    dtypes: &[crate::dtype::DType],
) -> Vec<TensorMeta> {
    inputs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let dtype = dtypes.get(i).copied().unwrap_or(crate::dtype::DType::F32);
            TensorMeta::new(a.shape().to_vec(), dtype)
        })
        .collect()
}

/// The elements of a standard-layout array as one row-major slice.
pub(crate) fn flat<'a, T>(a: &'a ndarray::CowArray<'_, T, ndarray::IxDyn>) -> Result<&'a [T]> {
    a.as_slice()
        .ok_or_else(|| crate::error::Error::Internal("array not in standard layout".into()))
}

/// Elements (or multiply-adds) below which a CPU op runs on the calling thread: handing a
/// small job to the rayon pool costs more (a wake-up and a hand-off) than it saves.
pub(crate) const CPU_PAR_MIN: usize = 1 << 17;
