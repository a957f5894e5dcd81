//! What a bench times: the op, its input shapes and a short label, made from the sizes
//! `tandem bench` takes.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{
    Activation, AttentionDecodeParams, AttentionParams, LinearParams, MoeExpertsParams,
    MoeRouteParams, Op, OpKind, RmsNormParams, RopeParams,
};
use crate::tensor::TensorMeta;

/// Routing block size of the MoE benches (the workload's and vLLM's default).
pub const MOE_BLOCK: usize = 16;

/// One op to time: the op with its parameters, the shapes of its inputs, and a short label
/// of the shape for reports.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// The op.
    pub op: Op,
    /// Its inputs' logical shapes and dtypes, in the op's input order.
    pub inputs: Vec<TensorMeta>,
    /// A short description of the shape, e.g. `B4 Hq32 Hkv8 Nq4096 Nkv4096 D128 causal`.
    pub label: String,
}

impl Problem {
    /// A problem of any op and shapes, labelled `label`.
    pub fn new(op: Op, inputs: Vec<TensorMeta>, label: impl Into<String>) -> Self {
        Self {
            op,
            inputs,
            label: label.into(),
        }
    }
}

/// The sizes of the benched ops; each op reads the ones it needs. [`BenchShape::DEFAULT`]
/// holds `tandem bench`'s defaults (large enough to be bound by the device, not the launch).
#[derive(Debug, Clone, PartialEq)]
pub struct BenchShape {
    /// Attention, rope: batch.
    pub batch: usize,
    /// Attention, rope: query heads.
    pub heads: usize,
    /// Attention: key/value heads (`None`: `heads`).
    pub kv_heads: Option<usize>,
    /// Attention, rope: query length.
    pub seq_len: usize,
    /// Attention: key/value length (`None`: `seq_len`).
    pub kv_len: Option<usize>,
    /// Attention, rope: head dimension.
    pub head_dim: usize,
    /// Attention: bottom-right causal mask.
    pub causal: bool,
    /// Decode attention: tokens in each sequence's KV cache, the new ones included.
    pub context: usize,
    /// Decode attention: new queries per sequence (1..=16).
    pub new_tokens: usize,
    /// Decode attention: tokens per block of a paged cache (`None`: contiguous cache).
    pub block_size: Option<usize>,
    /// MoE: tokens (`None`: 16384 for moe_route, 4096 for moe_experts).
    pub tokens: Option<usize>,
    /// MoE: experts (`None`: 64 for moe_route, 8 for moe_experts).
    pub experts: Option<usize>,
    /// MoE: experts per token (`None`: 8 for moe_route, 2 for moe_experts).
    pub top_k: Option<usize>,
    /// MoE experts: hidden size.
    pub hidden: usize,
    /// MoE experts: FFN size of one expert.
    pub ffn: usize,
    /// Linear: rows of x.
    pub m: usize,
    /// Linear: output features.
    pub n: usize,
    /// Linear: input features.
    pub k: usize,
    /// Linear: activation.
    pub act: Activation,
    /// Linear: with a bias.
    pub bias: bool,
    /// RMSNorm: rows.
    pub rows: usize,
    /// RMSNorm: columns.
    pub cols: usize,
}

impl Default for BenchShape {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl BenchShape {
    /// `tandem bench`'s default sizes.
    pub const DEFAULT: BenchShape = BenchShape {
        batch: 4,
        heads: 32,
        kv_heads: None,
        seq_len: 4096,
        kv_len: None,
        head_dim: 128,
        causal: false,
        context: 8192,
        new_tokens: 1,
        block_size: None,
        tokens: None,
        experts: None,
        top_k: None,
        hidden: 4096,
        ffn: 14336,
        m: 8192,
        n: 8192,
        k: 8192,
        act: Activation::Gelu,
        bias: true,
        rows: 16384,
        cols: 8192,
    };

    /// (tokens, experts, top-k) of a MoE op, with the op's defaults.
    pub fn moe(&self, op: OpKind) -> (usize, usize, usize) {
        let (t, e, k) = match op {
            OpKind::MoeExperts => (4096, 8, 2),
            _ => (16384, 64, 8),
        };
        (
            self.tokens.unwrap_or(t),
            self.experts.unwrap_or(e),
            self.top_k.unwrap_or(k),
        )
    }

    fn route_params(&self, op: OpKind) -> MoeRouteParams {
        MoeRouteParams {
            top_k: self.moe(op).2,
            renormalize: true,
            block_size: MOE_BLOCK,
        }
    }

    /// The problem of op family `op` at these sizes: one of [`OpKind::STANDALONE`]; the graph
    /// pieces (add, split/merge heads) are an error.
    pub fn problem(&self, op: OpKind) -> Result<Problem> {
        let f = |s: Vec<usize>| TensorMeta::new(s, DType::F32);
        let (o, inputs) = match op {
            OpKind::Attention => {
                let hkv = self.kv_heads.unwrap_or(self.heads);
                let nkv = self.kv_len.unwrap_or(self.seq_len);
                let (b, d) = (self.batch, self.head_dim);
                (
                    Op::Attention(AttentionParams {
                        causal: self.causal,
                        scale: None,
                    }),
                    vec![
                        f(vec![b, self.heads, self.seq_len, d]),
                        f(vec![b, hkv, nkv, d]),
                        f(vec![b, hkv, nkv, d]),
                    ],
                )
            }
            OpKind::AttentionDecode => {
                let hkv = self.kv_heads.unwrap_or(self.heads);
                let (b, d, ctx) = (self.batch, self.head_dim, self.context);
                let i = |s: Vec<usize>| TensorMeta::new(s, DType::I32);
                let q = f(vec![b, self.heads, self.new_tokens, d]);
                let p = AttentionDecodeParams {
                    scale: None,
                    block_size: self.block_size,
                };
                let inputs = match self.block_size {
                    None => vec![
                        q,
                        f(vec![b, hkv, ctx, d]),
                        f(vec![b, hkv, ctx, d]),
                        i(vec![b]),
                    ],
                    Some(bs) => {
                        // every sequence full: ceil(ctx / bs) blocks each
                        let per = ctx.div_ceil(bs.max(1));
                        vec![
                            q,
                            f(vec![b * per, hkv, bs, d]),
                            f(vec![b * per, hkv, bs, d]),
                            i(vec![b]),
                            i(vec![b, per]),
                        ]
                    }
                };
                (Op::AttentionDecode(p), inputs)
            }
            OpKind::MoeRoute => {
                let (t, e, _) = self.moe(op);
                (Op::MoeRoute(self.route_params(op)), vec![f(vec![t, e])])
            }
            OpKind::MoeExperts => {
                let (t, e, k) = self.moe(op);
                let (h, ffn) = (self.hidden, self.ffn);
                let i = |s: Vec<usize>| TensorMeta::new(s, DType::I32);
                (
                    Op::MoeExperts(MoeExpertsParams {}),
                    vec![
                        f(vec![t, h]),
                        i(vec![t, k]),
                        f(vec![t, k]),
                        i(vec![self.route_params(op).padded_len(t, e)]),
                        i(vec![e + 1]),
                        f(vec![e, 2 * ffn, h]),
                        f(vec![e, h, ffn]),
                    ],
                )
            }
            OpKind::Linear => {
                let mut v = vec![f(vec![self.m, self.k]), f(vec![self.n, self.k])];
                if self.bias {
                    v.push(f(vec![self.n]));
                }
                (
                    Op::Linear(LinearParams {
                        act: self.act,
                        bias: self.bias,
                        f32_out: false,
                    }),
                    v,
                )
            }
            OpKind::RmsNorm => (
                Op::RmsNorm(RmsNormParams {
                    eps: 1e-5,
                    residual: false,
                }),
                vec![f(vec![self.rows, self.cols]), f(vec![self.cols])],
            ),
            OpKind::Rope => (
                Op::Rope(RopeParams::default()),
                vec![f(vec![self.batch, self.heads, self.seq_len, self.head_dim])],
            ),
            OpKind::Add
            | OpKind::SplitHeads
            | OpKind::MergeHeads
            | OpKind::Nop
            | OpKind::Embedding => {
                return Err(Error::invalid(
                    "bench",
                    format!(
                        "{op} has no bench sizes (benched: {})",
                        OpKind::STANDALONE.map(OpKind::name).join(", ")
                    ),
                ));
            }
        };
        Ok(Problem::new(o, inputs, self.label(op)))
    }

    /// A short description of op `op`'s shape at these sizes.
    pub fn label(&self, op: OpKind) -> String {
        match op {
            OpKind::Attention => format!(
                "B{} Hq{} Hkv{} Nq{} Nkv{} D{}{}",
                self.batch,
                self.heads,
                self.kv_heads.unwrap_or(self.heads),
                self.seq_len,
                self.kv_len.unwrap_or(self.seq_len),
                self.head_dim,
                if self.causal { " causal" } else { "" }
            ),
            OpKind::AttentionDecode => format!(
                "B{} Hq{} Hkv{} ctx{} Nq{} D{} {}",
                self.batch,
                self.heads,
                self.kv_heads.unwrap_or(self.heads),
                self.context,
                self.new_tokens,
                self.head_dim,
                match self.block_size {
                    Some(bs) => format!("paged bs{bs}"),
                    None => "contiguous".into(),
                }
            ),
            OpKind::MoeRoute => {
                let (t, e, k) = self.moe(op);
                format!("T{t} E{e} k{k}")
            }
            OpKind::MoeExperts => {
                let (t, e, k) = self.moe(op);
                format!("T{t} H{} F{} E{e} k{k}", self.hidden, self.ffn)
            }
            OpKind::Linear => format!(
                "M{} N{} K{} {:?}{}",
                self.m,
                self.n,
                self.k,
                self.act,
                if self.bias { "+bias" } else { "" }
            ),
            OpKind::RmsNorm => format!("{}x{}", self.rows, self.cols),
            OpKind::Rope => format!(
                "B{} H{} T{} D{}",
                self.batch, self.heads, self.seq_len, self.head_dim
            ),
            OpKind::Add
            | OpKind::SplitHeads
            | OpKind::MergeHeads
            | OpKind::Nop
            | OpKind::Embedding => op.name().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_make_the_problem() -> Result<()> {
        let s = BenchShape {
            batch: 2,
            heads: 8,
            kv_heads: Some(2),
            seq_len: 100,
            kv_len: Some(300),
            head_dim: 64,
            causal: true,
            ..BenchShape::DEFAULT
        };
        let p = s.problem(OpKind::Attention)?;
        assert_eq!(p.op.name(), "attention");
        assert_eq!(p.inputs[0].shape.to_vec(), vec![2, 8, 100, 64]);
        assert_eq!(p.inputs[1].shape.to_vec(), vec![2, 2, 300, 64]);
        assert_eq!(p.label, "B2 Hq8 Hkv2 Nq100 Nkv300 D64 causal");
        let s = BenchShape {
            m: 3,
            n: 5,
            k: 7,
            act: Activation::Silu,
            ..BenchShape::DEFAULT
        };
        let p = s.problem(OpKind::Linear)?;
        assert_eq!(p.inputs.len(), 3);
        assert_eq!(p.label, "M3 N5 K7 Silu+bias");
        let s = BenchShape {
            batch: 3,
            heads: 8,
            kv_heads: Some(2),
            context: 100,
            new_tokens: 4,
            head_dim: 64,
            block_size: Some(16),
            ..BenchShape::DEFAULT
        };
        let p = s.problem(OpKind::AttentionDecode)?;
        assert_eq!(p.inputs[1].shape.to_vec(), vec![21, 2, 16, 64]);
        assert_eq!(p.inputs[4].shape.to_vec(), vec![3, 7]);
        assert_eq!(p.label, "B3 Hq8 Hkv2 ctx100 Nq4 D64 paged bs16");
        let p = BenchShape::DEFAULT.problem(OpKind::MoeRoute)?;
        assert_eq!(p.inputs[0].shape.to_vec(), vec![16384, 64]);
        let s = BenchShape {
            tokens: Some(5),
            hidden: 16,
            ffn: 24,
            experts: Some(4),
            top_k: Some(2),
            ..BenchShape::DEFAULT
        };
        let p = s.problem(OpKind::MoeExperts)?;
        assert_eq!(p.op.name(), "moe_experts");
        p.op.validate(&p.inputs)?;
        assert_eq!(p.inputs[5].shape.to_vec(), vec![4, 48, 16]);
        assert_eq!(p.inputs[6].shape.to_vec(), vec![4, 16, 24]);
        assert_eq!(p.label, "T5 H16 F24 E4 k2");
        Ok(())
    }

    #[test]
    fn every_standalone_kind_has_a_valid_problem_and_graph_pieces_have_none() -> Result<()> {
        let small = BenchShape {
            batch: 1,
            heads: 2,
            seq_len: 8,
            head_dim: 64,
            context: 40,
            tokens: Some(8),
            experts: Some(4),
            top_k: Some(2),
            hidden: 16,
            ffn: 8,
            m: 4,
            n: 4,
            k: 4,
            rows: 4,
            cols: 8,
            ..BenchShape::DEFAULT
        };
        for k in OpKind::STANDALONE {
            let p = small.problem(k)?;
            assert_eq!(p.op.kind(), k);
            p.op.validate(&p.inputs)?;
        }
        let e = small.problem(OpKind::Add).expect_err("add");
        assert!(e.to_string().contains("benched: attention"), "{e}");
        Ok(())
    }
}
