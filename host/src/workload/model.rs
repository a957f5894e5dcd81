//! A whole model: N decoder layers chained (layer i's output is layer i+1's input), with an
//! optional embedding lookup before them (token ids in) and an optional final RMSNorm and LM
//! head after them (logits out). [`model_graph`] builds its graph; [`ModelSizes`] are the
//! sizes a transformers `config.json` gives.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::MixtralConfig;
use super::layer::{LayerNames, MixtralWeights, add_layer, check_hidden_input, normal, rounded};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::limits::{self, Limits};
use crate::ops::{Activation, EmbeddingParams, LinearParams, Op, RmsNormParams, embedding};
use crate::tensor::Tensor;

/// The graph name of the embedding table.
pub const EMBED: &str = "model.embed_tokens.weight";
/// The graph name of the final RMSNorm's weight.
pub const FINAL_NORM: &str = "model.norm.weight";
/// The graph name of the LM head.
pub const LM_HEAD: &str = "lm_head.weight";
/// The graph name of the token ids input ([B*T], i32) of a model with an embedding.
pub const INPUT_IDS: &str = "input_ids";
/// The graph name of the hidden-state input ([B*T, H], f32) of a model without one.
pub const INPUT_HIDDEN: &str = "x";

/// Every size of a Mixtral model, as transformers' `config.json` gives them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSizes {
    /// `hidden_size`.
    pub hidden: usize,
    /// `num_attention_heads`.
    pub heads: usize,
    /// `num_key_value_heads`.
    pub kv_heads: usize,
    /// `intermediate_size`.
    pub ffn: usize,
    /// `num_local_experts`.
    pub experts: usize,
    /// `num_experts_per_tok`.
    pub top_k: usize,
    /// `num_hidden_layers`.
    pub layers: usize,
    /// `rms_norm_eps`.
    pub rms_eps: f32,
    /// `rope_theta`.
    pub rope_theta: f64,
    /// `vocab_size`.
    pub vocab: usize,
}

impl ModelSizes {
    /// `base` (batch, sequence length, seed, precision) with every layer size from these.
    pub fn layer_config(&self, base: &MixtralConfig) -> MixtralConfig {
        MixtralConfig {
            d_model: self.hidden,
            heads: self.heads,
            kv_heads: self.kv_heads,
            experts: self.experts,
            top_k: self.top_k,
            ffn: self.ffn,
            rope_theta: self.rope_theta,
            rms_eps: self.rms_eps,
            ..base.clone()
        }
    }
}

/// The weights of a model: its layers, and the optional embedding, final norm and LM head.
#[derive(Debug, Clone)]
pub struct ModelWeights {
    /// One entry per decoder layer, in order.
    pub layers: Vec<MixtralWeights>,
    /// `model.embed_tokens.weight` [V, H]: with it the model takes token ids.
    pub embed: Option<Tensor>,
    /// `model.norm.weight` [H]: the RMSNorm after the last layer.
    pub final_norm: Option<Tensor>,
    /// `lm_head.weight` [V, H]: with it the model gives logits (after the final norm, which
    /// it requires).
    pub lm_head: Option<Tensor>,
}

impl ModelWeights {
    /// `layers` layers of deterministic random weights ([`MixtralWeights::random`], one after
    /// the other from `rng`), without embedding or head.
    pub fn random(c: &MixtralConfig, layers: usize, rng: &mut ChaCha8Rng) -> Self {
        Self {
            layers: (0..layers)
                .map(|_| MixtralWeights::random(c, rng))
                .collect(),
            embed: None,
            final_norm: None,
            lm_head: None,
        }
    }

    /// Bytes of all the weights in f32, or `None` on overflow.
    pub fn bytes(&self) -> Option<u64> {
        let layers = self.layers.iter().flat_map(|w| w.all().map(|(_, t)| t));
        let extra = [&self.embed, &self.final_norm, &self.lm_head]
            .into_iter()
            .flatten();
        limits::sum(
            layers
                .chain(extra)
                .map(|t| (t.numel() as u64).checked_mul(4)),
        )
    }
}

/// Checks a model's layer count: at least 1.
fn check_layers(layers: usize) -> Result<()> {
    if layers == 0 {
        return Err(Error::invalid(
            "workload",
            "layers = 0 is not accepted: must be at least 1",
        ));
    }
    Ok(())
}

/// Bytes that building `layers` random layers of `c` allocates (weights and input), or `None`
/// on overflow.
pub fn random_model_bytes(c: &MixtralConfig, layers: usize) -> Option<u64> {
    limits::sum([
        c.weight_bytes()?.checked_mul(layers as u64),
        c.input_bytes(),
    ])
}

/// Checks that `layers` random layers of `c` fit `limits`, before any is made.
pub fn admit_random_model(c: &MixtralConfig, layers: usize, limits: &Limits) -> Result<()> {
    check_layers(layers)?;
    limits.admit("workload", random_model_bytes(c, layers))
}

/// Builds the graph of a model of `c`'s layers with `weights` (seeded random layers when
/// `None`: `layers` of them). Its first output is the model's output: the logits [B*T, V]
/// with an LM head, the normed hidden state with only a final norm, else the last layer's
/// output [B*T, H]; the routers' aux and z losses follow, layer by layer.
///
/// The input is token ids [B*T] (i32) when the weights have an embedding (an id outside the
/// vocabulary is refused, naming it), else a hidden state [B*T, H]; `None` makes seeded random
/// ones from `c.seed`.
pub fn model_graph(
    c: &MixtralConfig,
    layers: usize,
    weights: Option<ModelWeights>,
    input: Option<Tensor>,
    limits: &Limits,
) -> Result<Graph> {
    c.check()?;
    let mut rng = ChaCha8Rng::seed_from_u64(c.seed);
    let w = match weights {
        Some(w) => {
            check_layers(w.layers.len())?;
            limits.admit("workload", limits::sum([w.bytes(), c.input_bytes()]))?;
            w
        }
        None => {
            admit_random_model(c, layers, limits)?;
            ModelWeights::random(c, layers, &mut rng)
        }
    };
    let mut g = Graph::default();
    let (h, tokens) = (c.d_model, c.tokens());
    let mut x = match &w.embed {
        Some(table) => {
            let [vocab, th] = table.shape()[..] else {
                return Err(Error::invalid(
                    "workload",
                    format!(
                        "embedding table has shape {:?}, expected [vocab, {h}]",
                        table.shape()
                    ),
                ));
            };
            if th != h {
                return Err(Error::invalid(
                    "workload",
                    format!(
                        "embedding table is [{vocab}, {th}], expected [vocab, {h}] (hidden size {h})"
                    ),
                ));
            }
            let ids = match input {
                Some(ids) => {
                    if ids.dtype() != DType::I32 || ids.shape() != [tokens] {
                        return Err(Error::invalid(
                            "workload",
                            format!(
                                "the model takes token ids: input is {}{:?}, expected i32 [{tokens}] \
                                 (batch * seq_len)",
                                ids.dtype(),
                                ids.shape()
                            ),
                        ));
                    }
                    embedding::check_ids(&ids, vocab)?;
                    ids
                }
                None => {
                    let v: Vec<i32> = (0..tokens)
                        .map(|_| rng.gen_range(0..vocab.min(i32::MAX as usize)) as i32)
                        .collect();
                    Tensor::from_vec_i32(&[tokens], v)?
                }
            };
            g.constant(INPUT_IDS, ids);
            g.param(EMBED, rounded(table, c.dtype));
            g.add(
                "embed_tokens",
                Op::Embedding(EmbeddingParams {}),
                &[INPUT_IDS, EMBED],
            )
            .remove(0)
        }
        None => {
            let x = match input {
                Some(x) => {
                    check_hidden_input(&x, c)?;
                    x
                }
                None => normal(&mut rng, &[tokens, h], 1.0),
            };
            g.constant(INPUT_HIDDEN, rounded(&x, c.dtype))
        }
    };
    let mut losses = Vec::new();
    for (i, lw) in w.layers.iter().enumerate() {
        let out = add_layer(&mut g, c, &x, &LayerNames::model(i), lw)
            .map_err(|e| Error::invalid("workload", format!("layer {i}: {e}")))?;
        x = out.output;
        losses.push(out.aux_loss);
        losses.push(out.z_loss);
    }
    if let Some(norm) = &w.final_norm {
        g.param(FINAL_NORM, rounded(norm, c.dtype));
        x = g
            .add(
                "final_norm",
                Op::RmsNorm(RmsNormParams {
                    eps: c.rms_eps,
                    residual: false,
                }),
                &[&x, FINAL_NORM],
            )
            .remove(0);
    }
    if let Some(head) = &w.lm_head {
        if w.final_norm.is_none() {
            return Err(Error::invalid(
                "workload",
                format!(
                    "{LM_HEAD} without {FINAL_NORM}: the LM head reads the final norm's output"
                ),
            ));
        }
        g.param(LM_HEAD, rounded(head, c.dtype));
        x = g
            .add(
                "lm_head",
                Op::Linear(LinearParams {
                    act: Activation::None,
                    bias: false,
                    f32_out: false,
                }),
                &[&x, LM_HEAD],
            )
            .remove(0);
    }
    g.outputs = std::iter::once(x).chain(losses).collect();
    g.validate()?;
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> MixtralConfig {
        MixtralConfig {
            d_model: 32,
            heads: 4,
            kv_heads: 2,
            experts: 4,
            top_k: 2,
            ffn: 16,
            seq_len: 5,
            batch: 2,
            ..MixtralConfig::default()
        }
    }

    #[test]
    fn layers_chain_under_their_own_names() -> Result<()> {
        let g = model_graph(&small(), 3, None, None, &Limits::host())?;
        for i in 0..3 {
            assert!(g.is_param(&format!("model.layers.{i}.self_attn.q_proj.weight")));
            assert!(g.is_param(&format!(
                "model.layers.{i}.block_sparse_moe.experts.gate_up_proj"
            )));
        }
        let first = |name: &str| {
            g.nodes
                .iter()
                .find(|n| n.name == name)
                .map(|n| n.inputs[0].clone())
        };
        assert_eq!(first("layers.0.input_norm").as_deref(), Some(INPUT_HIDDEN));
        assert_eq!(
            first("layers.1.input_norm").as_deref(),
            Some("layers.0.out.y")
        );
        assert_eq!(
            first("layers.2.input_norm").as_deref(),
            Some("layers.1.out.y")
        );
        assert_eq!(g.outputs[0], "layers.2.out.y");
        assert_eq!(g.outputs.len(), 1 + 2 * 3);
        Ok(())
    }

    #[test]
    fn zero_layers_and_bad_ids_are_refused() -> Result<()> {
        let m = model_graph(&small(), 0, None, None, &Limits::host())
            .expect_err("0 layers")
            .to_string();
        assert!(m.contains("layers = 0"), "{m}");
        let c = small();
        let mut w = ModelWeights::random(&c, 1, &mut ChaCha8Rng::seed_from_u64(1));
        w.embed = Some(Tensor::from_vec_f32(&[11, 32], vec![0.5; 11 * 32])?);
        let ids = Tensor::from_vec_i32(&[10], vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 11])?;
        let m = model_graph(&c, 1, Some(w.clone()), Some(ids), &Limits::host())
            .expect_err("id 11")
            .to_string();
        assert!(
            m.contains("token id 11 at position 9") && m.contains("11 tokens"),
            "{m}"
        );
        let g = model_graph(&c, 1, Some(w.clone()), None, &Limits::host())?;
        assert_eq!(g.constants[INPUT_IDS].shape(), [10]);
        w.lm_head = Some(Tensor::from_vec_f32(&[11, 32], vec![0.5; 11 * 32])?);
        let m = model_graph(&c, 1, Some(w), None, &Limits::host())
            .expect_err("head without norm")
            .to_string();
        assert!(m.contains("without model.norm.weight"), "{m}");
        Ok(())
    }
}
