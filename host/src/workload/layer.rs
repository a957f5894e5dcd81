//! One Mixtral decoder layer: its weights ([`MixtralWeights`]) and its graph
//! ([`mixtral_layer`]; [`add_layer`] appends a layer to a larger graph under its own names).

use std::collections::BTreeMap;

use ndarray::{Array2, ArrayD, IxDyn};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;

use super::MixtralConfig;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::limits::Limits;
use crate::ops::{
    Activation, AttentionParams, LinearParams, MoeExpertsParams, MoeRouteParams, Op, RmsNormParams,
    RopeParams, SplitHeadsParams,
};
use crate::tensor::Tensor;

/// The weights of one layer, in transformers' layout (linear weights [out, in]).
#[derive(Debug, Clone)]
pub struct MixtralWeights {
    /// q_proj [Hq*D, H].
    pub wq: Tensor,
    /// k_proj [Hkv*D, H].
    pub wk: Tensor,
    /// v_proj [Hkv*D, H].
    pub wv: Tensor,
    /// o_proj [H, Hq*D].
    pub wo: Tensor,
    /// input_layernorm `[H]`.
    pub ln1: Tensor,
    /// post_attention_layernorm `[H]`.
    pub ln2: Tensor,
    /// router gate [E, H].
    pub gate: Tensor,
    /// experts gate_up_proj [E, 2F, H].
    pub gate_up: Tensor,
    /// experts down_proj [E, H, F].
    pub down: Tensor,
}

/// Tensors past this many values are drawn in parallel (a Mixtral-sized layer has 1.4 x 10^9
/// expert weights: a minute on one thread).
const PARALLEL_DRAW: usize = 1 << 24;

/// Normal values of std `std`. Up to [`PARALLEL_DRAW`] values: drawn from `rng` in order.
/// Larger tensors take one seed from `rng` and draw blocks of 2^20 values on the rayon
/// threads, block `i` from ChaCha8 stream `i` of that seed (deterministic, whatever the
/// thread count).
pub(crate) fn normal(rng: &mut ChaCha8Rng, shape: &[usize], std: f32) -> Tensor {
    let n = Normal::new(0.0f32, std).unwrap_or_else(|_| Normal::new(0.0, 1.0).expect("std 1"));
    let len = shape.iter().product::<usize>();
    let v: Vec<f32> = if len > PARALLEL_DRAW {
        let seed = rng.next_u64();
        let mut v = vec![0f32; len];
        v.par_chunks_mut(1 << 20)
            .enumerate()
            .for_each(|(i, block)| {
                let mut r = ChaCha8Rng::seed_from_u64(seed);
                r.set_stream(i as u64);
                for x in block {
                    *x = n.sample(&mut r);
                }
            });
        v
    } else {
        (0..len).map(|_| n.sample(rng)).collect()
    };
    Tensor::from_f32(ArrayD::from_shape_vec(IxDyn(shape), v).expect("shape matches length"))
}

impl MixtralWeights {
    /// Deterministic random weights (normal, std 1/sqrt(fan_in); norms around 1).
    pub fn random(c: &MixtralConfig, rng: &mut ChaCha8Rng) -> Self {
        let (h, d, f, e) = (c.d_model, c.head_dim(), c.ffn, c.experts);
        let s = |n: usize| 1.0 / (n as f32).sqrt();
        let ln = |rng: &mut ChaCha8Rng| {
            let t = normal(rng, &[h], 0.1);
            Tensor::from_f32(t.to_f32().mapv(|x| 1.0 + x))
        };
        Self {
            wq: normal(rng, &[c.heads * d, h], s(h)),
            wk: normal(rng, &[c.kv_heads * d, h], s(h)),
            wv: normal(rng, &[c.kv_heads * d, h], s(h)),
            wo: normal(rng, &[h, c.heads * d], s(c.heads * d)),
            ln1: ln(rng),
            ln2: ln(rng),
            gate: normal(rng, &[e, h], s(h)),
            gate_up: normal(rng, &[e, 2 * f, h], s(h)),
            down: normal(rng, &[e, h, f], s(f)),
        }
    }

    /// The nine weights under their short names (`wq`, ..., `down`), in [`SHORT_NAMES`]'s order.
    pub fn all(&self) -> [(&'static str, &Tensor); 9] {
        [
            ("wq", &self.wq),
            ("wk", &self.wk),
            ("wv", &self.wv),
            ("wo", &self.wo),
            ("ln1", &self.ln1),
            ("ln2", &self.ln2),
            ("gate", &self.gate),
            ("gate_up", &self.gate_up),
            ("down", &self.down),
        ]
    }

    /// The shapes `c` gives the nine weights, in [`SHORT_NAMES`]'s order.
    pub fn shapes(c: &MixtralConfig) -> [Vec<usize>; 9] {
        let (h, d, f, e) = (c.d_model, c.head_dim(), c.ffn, c.experts);
        [
            vec![c.heads * d, h],
            vec![c.kv_heads * d, h],
            vec![c.kv_heads * d, h],
            vec![h, c.heads * d],
            vec![h],
            vec![h],
            vec![e, h],
            vec![e, 2 * f, h],
            vec![e, h, f],
        ]
    }
}

/// The short names of a layer's weights, as the one-layer graph names its parameters.
pub const SHORT_NAMES: [&str; 9] = [
    "wq", "wk", "wv", "wo", "ln1", "ln2", "gate", "gate_up", "down",
];

pub(crate) fn check_weight_shapes(w: &MixtralWeights, c: &MixtralConfig) -> Result<()> {
    for ((name, t), shape) in w.all().into_iter().zip(MixtralWeights::shapes(c)) {
        if t.shape() != shape.as_slice() {
            return Err(Error::invalid(
                "workload",
                format!(
                    "weight {name} has shape {:?}, expected {shape:?}",
                    t.shape()
                ),
            ));
        }
    }
    Ok(())
}

/// Name of the layer's output tensor in the graph.
pub const OUTPUT: &str = "out.y";

/// Builds the Mixtral decoder layer graph: RMSNorm -> Q/K/V linear -> RoPE -> causal GQA
/// attention -> O linear -> residual + RMSNorm -> router -> experts (top-k) -> residual.
/// `input` is [B*T, H]; without weights or input, seeded random ones are made.
pub fn mixtral_layer(
    c: &MixtralConfig,
    weights: Option<MixtralWeights>,
    input: Option<Tensor>,
) -> Result<Graph> {
    mixtral_layer_within(c, weights, input, &Limits::host())
}

/// Checks that `x` is the [B*T, H] input `c` describes.
pub(crate) fn check_hidden_input(x: &Tensor, c: &MixtralConfig) -> Result<()> {
    if x.shape() != [c.tokens(), c.d_model] || !x.dtype().is_float() {
        return Err(Error::invalid(
            "workload",
            format!(
                "input is {}{:?}, expected a float tensor of shape [{}, {}]",
                x.dtype(),
                x.shape(),
                c.tokens(),
                c.d_model
            ),
        ));
    }
    Ok(())
}

/// `t` rounded to the workload's precision `dtype` and held as f32 (the ops' logical type).
pub(crate) fn rounded(t: &Tensor, dtype: DType) -> Tensor {
    t.cast(dtype).cast(DType::F32)
}

/// [`mixtral_layer`], refusing sizes whose weights and input would not fit `limits`.
pub fn mixtral_layer_within(
    c: &MixtralConfig,
    weights: Option<MixtralWeights>,
    input: Option<Tensor>,
    limits: &Limits,
) -> Result<Graph> {
    c.check()?;
    c.admit(limits)?;
    let mut rng = ChaCha8Rng::seed_from_u64(c.seed);
    let w = match weights {
        Some(w) => w,
        None => MixtralWeights::random(c, &mut rng),
    };
    let x = match input {
        Some(x) => {
            check_hidden_input(&x, c)?;
            x
        }
        None => normal(&mut rng, &[c.tokens(), c.d_model], 1.0),
    };
    let mut g = Graph::default();
    g.constant("x", rounded(&x, c.dtype));
    let names = LayerNames::single();
    let out = add_layer(&mut g, c, "x", &names, &w)?;
    debug_assert_eq!(out.output, OUTPUT);
    g.outputs = vec![out.output, out.aux_loss, out.z_loss];
    g.validate()?;
    Ok(g)
}

/// The names one layer's nodes and parameters get in a graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerNames {
    /// Put before every node name (`layers.3.`; empty for the one-layer graph).
    pub node_prefix: String,
    /// The parameters' names, in [`SHORT_NAMES`]'s order.
    pub params: [String; 9],
}

impl LayerNames {
    /// The one-layer graph's names: nodes as they are, parameters by their short names.
    pub fn single() -> Self {
        Self {
            node_prefix: String::new(),
            params: SHORT_NAMES.map(str::to_string),
        }
    }

    /// Layer `i` of a model: nodes `layers.{i}.*`, parameters under transformers' Mixtral
    /// names ([`model_param_names`]).
    pub fn model(i: usize) -> Self {
        Self {
            node_prefix: format!("layers.{i}."),
            params: model_param_names(i),
        }
    }
}

/// The graph names of layer `i`'s parameters in a model: transformers' Mixtral names
/// (`model.layers.{i}.self_attn.q_proj.weight`, `...input_layernorm.weight`,
/// `...block_sparse_moe.gate.weight`); the experts' weights, which the experts op takes
/// stacked, are `...block_sparse_moe.experts.gate_up_proj` (every expert's w1 rows then its
/// w3 rows, [E, 2F, H]) and `...block_sparse_moe.experts.down_proj` (every expert's w2,
/// [E, H, F]).
pub fn model_param_names(i: usize) -> [String; 9] {
    [
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        "block_sparse_moe.gate.weight",
        "block_sparse_moe.experts.gate_up_proj",
        "block_sparse_moe.experts.down_proj",
    ]
    .map(|s| format!("model.layers.{i}.{s}"))
}

/// The tensors of one layer in a graph that the caller goes on from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerOutputs {
    /// The layer's output [B*T, H] (the next layer's input).
    pub output: String,
    /// The router's load-balancing loss (a scalar).
    pub aux_loss: String,
    /// The router's z-loss (a scalar).
    pub z_loss: String,
}

/// Appends one decoder layer reading `input` ([B*T, H] f32) to `g`: its weights `w` (checked
/// against `c`, rounded to `c.dtype`) become parameters under `names.params`, its nodes are
/// named with `names.node_prefix`.
pub fn add_layer(
    g: &mut Graph,
    c: &MixtralConfig,
    input: &str,
    names: &LayerNames,
    w: &MixtralWeights,
) -> Result<LayerOutputs> {
    check_weight_shapes(w, c)?;
    for ((_, t), name) in w.all().into_iter().zip(&names.params) {
        g.param(name, rounded(t, c.dtype));
    }
    let [wq, wk, wv, wo, ln1, ln2, gate, gate_up, down] =
        names.params.each_ref().map(String::as_str);
    let n = |s: &str| format!("{}{s}", names.node_prefix);
    let lin = Op::Linear(LinearParams {
        act: Activation::None,
        bias: false,
        f32_out: false,
    });
    let split = |heads| {
        Op::SplitHeads(SplitHeadsParams {
            batch: c.batch,
            heads,
        })
    };
    let rope = Op::Rope(RopeParams {
        base: c.rope_theta,
        position_offset: 0,
    });
    let h1 = g.add(
        &n("input_norm"),
        Op::RmsNorm(RmsNormParams {
            eps: c.rms_eps,
            residual: false,
        }),
        &[input, ln1],
    );
    let q = g.add(&n("q_proj"), lin.clone(), &[&h1[0], wq]);
    let k = g.add(&n("k_proj"), lin.clone(), &[&h1[0], wk]);
    let v = g.add(&n("v_proj"), lin.clone(), &[&h1[0], wv]);
    let q4 = g.add(&n("q_heads"), split(c.heads), &[&q[0]]);
    let k4 = g.add(&n("k_heads"), split(c.kv_heads), &[&k[0]]);
    let v4 = g.add(&n("v_heads"), split(c.kv_heads), &[&v[0]]);
    let qr = g.add(&n("q_rope"), rope.clone(), &[&q4[0]]);
    let kr = g.add(&n("k_rope"), rope, &[&k4[0]]);
    let att = g.add(
        &n("attention"),
        Op::Attention(AttentionParams {
            causal: true,
            scale: None,
        }),
        &[&qr[0], &kr[0], &v4[0]],
    );
    let merged = g.add(&n("merge_heads"), Op::MergeHeads, &[&att[0]]);
    let o = g.add(&n("o_proj"), lin.clone(), &[&merged[0], wo]);
    let h2 = g.add(
        &n("post_attention_norm"),
        Op::RmsNorm(RmsNormParams {
            eps: c.rms_eps,
            residual: true,
        }),
        &[&o[0], ln2, input],
    );
    // f32 logits wherever the storage is 16-bit: routing decides on near-ties.
    let router_lin = Op::Linear(LinearParams {
        act: Activation::None,
        bias: false,
        f32_out: true,
    });
    let logits = g.add(&n("router_logits"), router_lin, &[&h2[0], gate]);
    let r = g.add(
        &n("router"),
        Op::MoeRoute(MoeRouteParams {
            top_k: c.top_k,
            renormalize: true,
            block_size: 16,
        }),
        &[&logits[0]],
    );
    let moe = g.add(
        &n("experts"),
        Op::MoeExperts(MoeExpertsParams {}),
        &[&h2[0], &r[0], &r[1], &r[3], &r[4], gate_up, down],
    );
    let out = g.add(&n("out"), Op::Add, &[&h2[1], &moe[0]]);
    Ok(LayerOutputs {
        output: out[0].clone(),
        aux_loss: r[5].clone(),
        z_loss: r[6].clone(),
    })
}

/// Reshapes a [B*T, X] output (a layer's hidden state, or logits) to [B, T, X] for saving.
pub fn output_as_btd(t: &Tensor, c: &MixtralConfig) -> Result<Tensor> {
    let a: Array2<f32> = t
        .to_f32()
        .into_dimensionality()
        .map_err(|e| Error::Internal(format!("layer output: {e}")))?;
    let x = a.ncols();
    let a = a
        .into_shape_with_order(IxDyn(&[c.batch, c.seq_len, x]))
        .map_err(|e| Error::Internal(format!("layer output: {e}")))?;
    Ok(Tensor::from_f32(a))
}

/// Names of the weights and what transformers calls them (for error messages and docs).
pub fn weight_names() -> BTreeMap<&'static str, &'static str> {
    BTreeMap::from([
        ("wq", "self_attn.q_proj.weight"),
        ("wk", "self_attn.k_proj.weight"),
        ("wv", "self_attn.v_proj.weight"),
        ("wo", "self_attn.o_proj.weight"),
        ("ln1", "input_layernorm.weight"),
        ("ln2", "post_attention_layernorm.weight"),
        ("gate", "mlp.gate.weight"),
        ("gate_up", "mlp.experts.gate_up_proj"),
        ("down", "mlp.experts.down_proj"),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_router_logits_are_kept_in_f32() -> Result<()> {
        let c = MixtralConfig::tiny();
        let g = mixtral_layer(&c, None, None)?;
        let kept: Vec<&str> = g
            .nodes
            .iter()
            .filter(|n| matches!(n.op, Op::Linear(p) if p.f32_out))
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(kept, ["router_logits"]);
        Ok(())
    }

    #[test]
    fn linear_params_written_before_f32_out_read_as_16_bit_outputs() {
        let p = LinearParams {
            act: Activation::Gelu,
            bias: true,
            f32_out: true,
        };
        let mut v = serde_json::to_value(p).expect("serialises");
        v.as_object_mut().expect("object").remove("f32_out");
        let old: LinearParams = serde_json::from_value(v).expect("reads without f32_out");
        assert_eq!(
            old,
            LinearParams {
                f32_out: false,
                ..p
            }
        );
    }
}
