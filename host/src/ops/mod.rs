//! The ops tandem runs: parameters, shape/dtype validation, the CPU f32 implementation and
//! the f64 reference of each op family, one file per family.
//!
//! Validation happens here, once; backends assume valid input. Tensors crossing this API are
//! *logical* tensors: floating-point data is f32, ids and counts i32. A backend may store them
//! in another precision (bf16 on a GPU, int8 on an FPGA) but reads and writes them as these.

pub mod attention;
pub mod attention_decode;
pub mod elementwise;
pub mod embedding;
pub mod layout;
pub mod linear;
pub mod moe;
pub mod norm;
pub mod rope;
pub mod textbook;

use ndarray::ArrayD;
use serde::{Deserialize, Serialize};

pub use attention::AttentionParams;
pub use attention_decode::AttentionDecodeParams;
pub use embedding::EmbeddingParams;
pub use layout::SplitHeadsParams;
pub use linear::{Activation, LinearParams};
pub use moe::{MoeExpertsParams, MoeRouteParams};
pub use norm::RmsNormParams;
pub use rope::RopeParams;

use crate::error::Result;
use crate::sync::Deadline;
use crate::tensor::{Tensor, TensorMeta};

/// The output metas of an op ([`Op::validate`]): inline for up to two outputs, so checking
/// a node allocates nothing (the planner and the executor validate every node).
pub type OutputMetas = smallvec::SmallVec<[TensorMeta; 2]>;

/// One op with its parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Attention forward: q, k, v -> o, lse.
    Attention(AttentionParams),
    /// Decode attention against a KV cache (contiguous or paged): q, k_cache, v_cache,
    /// seq_lens (, block_table) -> o, lse.
    AttentionDecode(AttentionDecodeParams),
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
    /// No work: reads one tensor of any shape (`after`, which orders it after that tensor's
    /// producer) and writes a token of no elements. The runtime-overhead bench
    /// ([`crate::bench::overhead`]) schedules chains and fans of it; it is internal: not
    /// offered on the command line, not accepted in workload files.
    #[serde(skip_deserializing)]
    Nop,
    /// Embedding lookup: ids (i32), table [V, H] -> y [..., H].
    Embedding(EmbeddingParams),
}

/// The family of an [`Op`], without its parameters: the one list of op names.
///
/// [`OpKind::name`] is the name in reports, JSON and graphs (`moe_route`); parsing accepts it
/// and its kebab-case form (`moe-route`), which is what the command line shows. With the
/// `cli` feature the kind is a clap `ValueEnum` offering the [`OpKind::STANDALONE`] families
/// (the ones `tandem op` and `tandem bench` run from flags alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum OpKind {
    /// Attention forward: q, k, v -> o, lse.
    #[cfg_attr(feature = "cli", value(name = "attention"))]
    Attention,
    /// Decode attention, Nq (1..=16) new queries per sequence against a KV cache, contiguous
    /// or paged: q, k_cache, v_cache, seq_lens (, block_table) -> o, lse.
    #[cfg_attr(
        feature = "cli",
        value(name = "attention-decode", alias = "attention_decode")
    )]
    AttentionDecode,
    /// MoE routing (top-k softmax, align, losses): logits -> topk_ids, topk_weights,
    /// expert_counts, sorted_token_ids, expert_offsets, aux_loss, z_loss.
    #[cfg_attr(feature = "cli", value(name = "moe-route", alias = "moe_route"))]
    MoeRoute,
    /// MoE experts (SwiGLU FFN of each token's top-k experts, weighted sum): x, topk_ids,
    /// topk_weights, sorted_token_ids, expert_offsets, gate_up, down -> y.
    #[cfg_attr(feature = "cli", value(name = "moe-experts", alias = "moe_experts"))]
    MoeExperts,
    /// Fused linear, act(x w^T + b): x, w (, b) -> y.
    #[cfg_attr(feature = "cli", value(name = "linear"))]
    Linear,
    /// RMSNorm: x, w (, residual) -> y (, x + residual).
    #[cfg_attr(feature = "cli", value(name = "rmsnorm"))]
    RmsNorm,
    /// Rotary position embedding (rotate-half): x [B, H, T, D] -> y.
    #[cfg_attr(feature = "cli", value(name = "rope"))]
    Rope,
    /// Elementwise a + b (a graph op: not offered on the command line).
    #[cfg_attr(feature = "cli", value(skip))]
    Add,
    /// [B*T, H*D] -> [B, H, T, D] (a graph op: not offered on the command line).
    #[cfg_attr(feature = "cli", value(skip))]
    SplitHeads,
    /// [B, H, T, D] -> [B*T, H*D] (a graph op: not offered on the command line).
    #[cfg_attr(feature = "cli", value(skip))]
    MergeHeads,
    /// No work, a token out (the runtime-overhead bench's op: not offered on the command line).
    #[cfg_attr(feature = "cli", value(skip))]
    Nop,
    /// Embedding lookup: ids (i32) `[...]`, table `[V, H]` -> y `[..., H]` (a graph op: not
    /// offered on the command line).
    #[cfg_attr(feature = "cli", value(skip))]
    Embedding,
}

impl OpKind {
    /// Every op family, in [`Op`]'s order.
    pub const ALL: [OpKind; 12] = [
        OpKind::Attention,
        OpKind::AttentionDecode,
        OpKind::MoeRoute,
        OpKind::MoeExperts,
        OpKind::Linear,
        OpKind::RmsNorm,
        OpKind::Rope,
        OpKind::Add,
        OpKind::SplitHeads,
        OpKind::MergeHeads,
        OpKind::Nop,
        OpKind::Embedding,
    ];

    /// The families that run alone with parameters from flags (`tandem op`, `tandem bench`);
    /// the others are pieces of a graph.
    pub const STANDALONE: [OpKind; 7] = [
        OpKind::Attention,
        OpKind::AttentionDecode,
        OpKind::MoeRoute,
        OpKind::MoeExperts,
        OpKind::Linear,
        OpKind::RmsNorm,
        OpKind::Rope,
    ];

    /// The name in reports, JSON and graphs: `attention`, `attention_decode`, `moe_route`,
    /// `moe_experts`, `linear`, `rmsnorm`, `rope`, `add`, `split_heads`, `merge_heads`, `nop`,
    /// `embedding`.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Attention => "attention",
            OpKind::AttentionDecode => "attention_decode",
            OpKind::MoeRoute => "moe_route",
            OpKind::MoeExperts => "moe_experts",
            OpKind::Linear => "linear",
            OpKind::RmsNorm => "rmsnorm",
            OpKind::Rope => "rope",
            OpKind::Add => "add",
            OpKind::SplitHeads => "split_heads",
            OpKind::MergeHeads => "merge_heads",
            OpKind::Nop => "nop",
            OpKind::Embedding => "embedding",
        }
    }
}

impl std::fmt::Display for OpKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for OpKind {
    type Err = crate::error::Error;

    /// Parses a name of [`OpKind::name`] or its kebab-case form (`moe-route`).
    fn from_str(s: &str) -> Result<Self> {
        let want = s.replace('-', "_");
        OpKind::ALL
            .into_iter()
            .find(|k| k.name() == want)
            .ok_or_else(|| {
                crate::error::Error::invalid(
                    "op",
                    format!(
                        "unknown op '{s}' (accepted: {})",
                        OpKind::ALL.map(OpKind::name).join(", ")
                    ),
                )
            })
    }
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
    /// The op's family.
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Attention(_) => OpKind::Attention,
            Op::AttentionDecode(_) => OpKind::AttentionDecode,
            Op::MoeRoute(_) => OpKind::MoeRoute,
            Op::MoeExperts(_) => OpKind::MoeExperts,
            Op::Linear(_) => OpKind::Linear,
            Op::RmsNorm(_) => OpKind::RmsNorm,
            Op::Rope(_) => OpKind::Rope,
            Op::Add => OpKind::Add,
            Op::SplitHeads(_) => OpKind::SplitHeads,
            Op::MergeHeads => OpKind::MergeHeads,
            Op::Nop => OpKind::Nop,
            Op::Embedding(_) => OpKind::Embedding,
        }
    }

    /// The op family's name as used in reports ([`OpKind::name`]).
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// Names of the inputs this op takes, in order (static: asking costs no allocation).
    pub fn input_names(&self) -> &'static [&'static str] {
        match self {
            Op::Attention(_) => &["q", "k", "v"],
            Op::AttentionDecode(p) => p.input_names(),
            Op::MoeRoute(_) => &["logits"],
            Op::MoeExperts(_) => &moe::EXPERT_INPUTS,
            Op::Linear(p) => {
                if p.bias {
                    &["x", "w", "b"]
                } else {
                    &["x", "w"]
                }
            }
            Op::RmsNorm(p) => {
                if p.residual {
                    &["x", "w", "residual"]
                } else {
                    &["x", "w"]
                }
            }
            Op::Rope(_) => &["x"],
            Op::Add => &["a", "b"],
            Op::SplitHeads(_) | Op::MergeHeads => &["x"],
            Op::Nop => &["after"],
            Op::Embedding(_) => &embedding::INPUTS,
        }
    }

    /// Names of the outputs this op produces, in order.
    pub fn output_names(&self) -> Vec<&'static str> {
        match self {
            Op::Attention(_) | Op::AttentionDecode(_) => vec!["o", "lse"],
            Op::MoeRoute(_) => moe::ROUTE_OUTPUTS.to_vec(),
            Op::MoeExperts(_) => vec!["y"],
            Op::RmsNorm(p) if p.residual => vec!["y", "sum"],
            _ => vec!["y"],
        }
    }

    /// Whether output `index` may hold -inf as a correct value: attention's LSE of a row
    /// that sees no key (causal with Nq > Nkv, an empty cache) is -inf by definition.
    pub fn output_may_be_neg_inf(&self, index: usize) -> bool {
        matches!(self, Op::Attention(_) | Op::AttentionDecode(_)) && index == 1
    }

    /// Checks the inputs' shapes and dtypes and returns the outputs'.
    pub fn validate(&self, inputs: &[TensorMeta]) -> Result<OutputMetas> {
        check_arity(self, inputs.len())?;
        match self {
            Op::Attention(p) => p.validate(inputs),
            Op::AttentionDecode(p) => p.validate(inputs),
            Op::MoeRoute(p) => p.validate(inputs),
            Op::MoeExperts(p) => p.validate(inputs),
            Op::Linear(p) => p.validate(inputs),
            Op::RmsNorm(p) => p.validate(inputs),
            Op::Rope(p) => p.validate(inputs),
            Op::Add => elementwise::validate_add(inputs),
            Op::SplitHeads(p) => p.validate(inputs),
            Op::MergeHeads => layout::validate_merge(inputs),
            Op::Nop => Ok(smallvec::smallvec![nop_token()]),
            Op::Embedding(p) => p.validate(inputs),
        }
    }

    /// Runs the op on the CPU in f32 (validating first).
    pub fn run_cpu(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.run_cpu_within(inputs, &Deadline::NONE)
    }

    /// [`Op::run_cpu`] that stops at `deadline`: the compute-bound ops (attention, linear,
    /// experts) check it between blocks of work, the others before and after their one pass;
    /// past it, the result is [`crate::Error::Timeout`], never a partial output.
    pub fn run_cpu_within(&self, inputs: &[&Tensor], deadline: &Deadline) -> Result<Vec<Tensor>> {
        let metas: Vec<TensorMeta> = inputs.iter().map(|t| t.meta()).collect();
        let outs = self.validate(&metas)?;
        if outs.iter().all(|m| m.numel() == 0) {
            // Nothing to write: no work, however large the other dimensions are.
            return Ok(outs.iter().map(Tensor::zeros).collect());
        }
        let what = format!("{} on the CPU", self.name());
        deadline.check(&what)?;
        let outs = match self {
            Op::Attention(p) => p.cpu_within(inputs, deadline),
            Op::AttentionDecode(p) => p.cpu_within(inputs, deadline),
            Op::MoeExperts(p) => p.cpu_within(inputs, deadline),
            Op::Linear(p) => p.cpu_within(inputs, deadline),
            _ => self.run_cpu_unbounded(inputs),
        }?;
        deadline.check(&what)?;
        Ok(outs)
    }

    /// The memory-bound ops, one pass each (bounded by their sizes, which admission control
    /// checked).
    fn run_cpu_unbounded(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        match self {
            Op::Attention(p) => p.cpu(inputs),
            Op::AttentionDecode(p) => p.cpu(inputs),
            Op::MoeRoute(p) => p.cpu(inputs),
            Op::MoeExperts(p) => p.cpu(inputs),
            Op::Linear(p) => p.cpu(inputs),
            Op::RmsNorm(p) => p.cpu(inputs),
            Op::Rope(p) => p.cpu(inputs),
            Op::Add => elementwise::cpu_add(inputs),
            Op::SplitHeads(p) => p.cpu(inputs),
            Op::MergeHeads => layout::cpu_merge(inputs),
            Op::Nop => Ok(vec![Tensor::zeros(&nop_token())]),
            Op::Embedding(p) => p.cpu(inputs),
        }
    }

    /// The f64 reference of the op, used for error reports. Integer outputs (ids, counts)
    /// come back as f64 values.
    pub fn reference(&self, inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
        check_arity(self, inputs.len())?;
        let decode_dtypes;
        let dtypes: &[crate::dtype::DType] = match self {
            Op::MoeExperts(_) => &moe::EXPERT_DTYPES,
            Op::Embedding(_) => &embedding::DTYPES,
            Op::AttentionDecode(p) => {
                decode_dtypes = p.input_dtypes();
                &decode_dtypes
            }
            _ => &[],
        };
        let outs = self.validate(&reference_metas(inputs, dtypes))?;
        if outs.iter().all(|m| m.numel() == 0) {
            return Ok(outs
                .iter()
                .map(|m| ArrayD::zeros(ndarray::IxDyn(&m.shape)))
                .collect());
        }
        match self {
            Op::Attention(p) => p.reference(inputs),
            Op::AttentionDecode(p) => p.reference(inputs),
            Op::MoeRoute(p) => p.reference(inputs),
            Op::MoeExperts(p) => p.reference(inputs),
            Op::Linear(p) => p.reference(inputs),
            Op::RmsNorm(p) => p.reference(inputs),
            Op::Rope(p) => p.reference(inputs),
            Op::Add => elementwise::reference_add(inputs),
            Op::SplitHeads(p) => p.reference(inputs),
            Op::MergeHeads => layout::reference_merge(inputs),
            Op::Nop => Ok(vec![ArrayD::zeros(ndarray::IxDyn(&[0]))]),
            Op::Embedding(p) => p.reference(inputs),
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
            Op::AttentionDecode(p) => p.flops(inputs),
            Op::MoeRoute(p) => p.flops(inputs),
            Op::MoeExperts(p) => p.flops(inputs),
            Op::Linear(p) => p.flops(inputs),
            Op::RmsNorm(_) | Op::Rope(_) | Op::Add => {
                4.0 * inputs.first().map(|m| m.numel() as f64).unwrap_or(0.0)
            }
            Op::SplitHeads(_) | Op::MergeHeads | Op::Nop => 0.0,
            Op::Embedding(p) => p.flops(inputs),
        };
        OpCost { flops, bytes }
    }
}

/// What [`Op::Nop`] writes: an f32 tensor of no elements.
fn nop_token() -> TensorMeta {
    TensorMeta::new([0], crate::dtype::DType::F32)
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
            TensorMeta::new(a.shape(), dtype)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_kind_names_parse_back_in_both_spellings() {
        for k in OpKind::ALL {
            assert_eq!(k.name().parse::<OpKind>().ok(), Some(k));
            assert_eq!(k.name().replace('_', "-").parse::<OpKind>().ok(), Some(k));
            assert_eq!(k.to_string(), k.name());
        }
        let e = "matmul".parse::<OpKind>().expect_err("matmul");
        let m = e.to_string();
        assert!(m.contains("'matmul'"), "{m}");
        assert!(
            m.contains("accepted: attention, attention_decode, moe_route, moe_experts, linear"),
            "{m}"
        );
    }

    #[test]
    fn every_op_has_its_kind() {
        let ops = [
            Op::Attention(AttentionParams::default()),
            Op::AttentionDecode(AttentionDecodeParams::default()),
            Op::MoeRoute(MoeRouteParams::default()),
            Op::MoeExperts(MoeExpertsParams {}),
            Op::Linear(LinearParams::default()),
            Op::RmsNorm(RmsNormParams::default()),
            Op::Rope(RopeParams::default()),
            Op::Add,
            Op::SplitHeads(SplitHeadsParams { batch: 1, heads: 1 }),
            Op::MergeHeads,
            Op::Nop,
            Op::Embedding(EmbeddingParams {}),
        ];
        let kinds: Vec<OpKind> = ops.iter().map(Op::kind).collect();
        assert_eq!(kinds, OpKind::ALL);
        assert_eq!(Op::MoeRoute(MoeRouteParams::default()).name(), "moe_route");
    }

    #[cfg(feature = "cli")]
    #[test]
    fn the_command_line_offers_the_standalone_kinds_in_kebab_case() {
        use clap::ValueEnum;
        assert_eq!(OpKind::value_variants(), OpKind::STANDALONE);
        for k in OpKind::STANDALONE {
            let v = k.to_possible_value().expect("offered");
            assert_eq!(v.get_name(), k.name().replace('_', "-"));
            assert!(v.matches(k.name(), false), "{k}");
        }
    }
}
