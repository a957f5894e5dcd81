//! Workloads: the built-in Mixtral decoder layer, its TOML description, and weights from
//! safetensors files with transformers' Mixtral names (with the `config.json` beside them:
//! [`HfConfig`], [`load_hf_layer`]).

pub mod decode;
mod hf_config;

pub use hf_config::HfConfig;

use std::collections::BTreeMap;
use std::path::Path;

use ndarray::{Array2, ArrayD, Axis, IxDyn, concatenate};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::limits::{self, Limits};
use crate::ops::moe::MAX_EXPERTS;
use crate::ops::{
    Activation, AttentionParams, LinearParams, MoeExpertsParams, MoeRouteParams, Op, RmsNormParams,
    RopeParams, SplitHeadsParams,
};
use crate::tensor::Tensor;

/// Sizes and settings of one Mixtral decoder layer (transformers' MixtralDecoderLayer).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MixtralConfig {
    /// Sequences in the batch.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Hidden size.
    pub d_model: usize,
    /// Query heads (head dim = d_model / heads).
    pub heads: usize,
    /// Key/value heads (GQA); divides `heads`.
    pub kv_heads: usize,
    /// Experts.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// FFN size of one expert.
    pub ffn: usize,
    /// RoPE theta.
    pub rope_theta: f64,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Seed of the generated weights and input.
    pub seed: u64,
    /// Precision the inputs and weights are rounded to before the run (f32, bf16, f16).
    pub dtype: DType,
}

impl Default for MixtralConfig {
    fn default() -> Self {
        Self {
            batch: 1,
            seq_len: 128,
            d_model: 512,
            heads: 8,
            kv_heads: 2,
            experts: 8,
            top_k: 2,
            ffn: 1024,
            rope_theta: 10000.0,
            rms_eps: 1e-5,
            seed: 0,
            dtype: DType::F32,
        }
    }
}

/// A workload file: `[mixtral]` holds a [`MixtralConfig`] (any key may be left out).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadFile {
    /// Name shown in reports.
    #[serde(default)]
    pub name: Option<String>,
    /// The layer's sizes.
    #[serde(default)]
    pub mixtral: MixtralConfig,
    /// The keys the file's `[mixtral]` table sets (the others are defaults).
    #[serde(skip)]
    pub given: Vec<String>,
}

impl WorkloadFile {
    /// Reads and checks a TOML workload file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::file(path, format!("cannot read: {e}")))?;
        let mut w: WorkloadFile =
            toml::from_str(&text).map_err(|e| Error::file(path, e.to_string()))?;
        if let Ok(v) = toml::from_str::<toml::Table>(&text)
            && let Some(m) = v.get("mixtral").and_then(|m| m.as_table())
        {
            w.given = m.keys().cloned().collect();
        }
        w.mixtral
            .check()
            .map_err(|e| Error::file(path, e.to_string()))?;
        Ok(w)
    }
}

impl MixtralConfig {
    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.heads.max(1)
    }

    /// Tokens in the batch.
    pub fn tokens(&self) -> usize {
        self.batch.saturating_mul(self.seq_len)
    }

    /// Bytes of the layer's weights in f32, or `None` when the sizes overflow.
    pub fn weight_bytes(&self) -> Option<u64> {
        let (h, f, e) = (self.d_model as u64, self.ffn as u64, self.experts as u64);
        let d = (self.d_model / self.heads.max(1)) as u64;
        let (hq, hkv) = (self.heads as u64, self.kv_heads as u64);
        let m = |a: u64, b: u64| a.checked_mul(b);
        let elems = limits::sum([
            m(hq, d).and_then(|x| m(x, h)),                        // wq
            m(hkv, d).and_then(|x| m(x, h)).and_then(|x| m(x, 2)), // wk, wv
            m(hq, d).and_then(|x| m(x, h)),                        // wo
            m(h, 2),                                               // ln1, ln2
            m(e, h),                                               // gate
            m(e, f).and_then(|x| m(x, h)).and_then(|x| m(x, 3)),   // gate_up, down
        ])?;
        elems.checked_mul(4)
    }

    /// Bytes of the layer's input `[B*T, H]` in f32, or `None` when they overflow.
    pub fn input_bytes(&self) -> Option<u64> {
        limits::numel(&[self.batch, self.seq_len, self.d_model])?.checked_mul(4)
    }

    /// Bytes that building the layer allocates (weights and input), or `None` on overflow.
    pub fn host_bytes(&self) -> Option<u64> {
        limits::sum([self.weight_bytes(), self.input_bytes()])
    }

    /// Checks that building the layer fits `limits` (run after [`MixtralConfig::check`]).
    pub fn admit(&self, limits: &Limits) -> Result<()> {
        limits.admit("workload", self.host_bytes())
    }

    /// Checks that the sizes make a layer; errors name the key, the value and what is accepted.
    pub fn check(&self) -> Result<()> {
        let bad = |key: &str, val: String, accepted: &str| {
            Err(Error::invalid(
                "workload",
                format!("{key} = {val} is not accepted: {accepted}"),
            ))
        };
        for (k, v) in [
            ("batch", self.batch),
            ("seq_len", self.seq_len),
            ("d_model", self.d_model),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("experts", self.experts),
            ("top_k", self.top_k),
            ("ffn", self.ffn),
        ] {
            if v == 0 {
                return bad(k, v.to_string(), "must be at least 1");
            }
        }
        if self.d_model % self.heads != 0 {
            return bad(
                "heads",
                self.heads.to_string(),
                &format!("must divide d_model = {}", self.d_model),
            );
        }
        if self.head_dim() % 2 != 0 {
            return bad(
                "heads",
                self.heads.to_string(),
                &format!("d_model / heads = {} must be even (RoPE)", self.head_dim()),
            );
        }
        if self.heads % self.kv_heads != 0 {
            return bad(
                "kv_heads",
                self.kv_heads.to_string(),
                &format!("must divide heads = {}", self.heads),
            );
        }
        if self.experts > MAX_EXPERTS {
            return bad(
                "experts",
                self.experts.to_string(),
                &format!("at most {MAX_EXPERTS}"),
            );
        }
        if self.host_bytes().is_none() {
            return Err(Error::invalid(
                "workload",
                format!(
                    "batch = {}, seq_len = {}, d_model = {}, experts = {}, ffn = {}: the \
                     layer's weights and input would need more than 16 EiB (their sizes \
                     overflow)",
                    self.batch, self.seq_len, self.d_model, self.experts, self.ffn
                ),
            ));
        }
        if self.top_k > self.experts {
            return bad(
                "top_k",
                self.top_k.to_string(),
                &format!("must be at most experts = {}", self.experts),
            );
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return bad("rope_theta", self.rope_theta.to_string(), "must be > 1");
        }
        if !(self.rms_eps.is_finite() && self.rms_eps >= 0.0) {
            return bad("rms_eps", self.rms_eps.to_string(), "must be >= 0");
        }
        if !self.dtype.is_float() {
            return bad("dtype", self.dtype.to_string(), "one of f32, bf16, f16");
        }
        Ok(())
    }
}

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

fn normal(rng: &mut ChaCha8Rng, shape: &[usize], std: f32) -> Tensor {
    let n = Normal::new(0.0f32, std).unwrap_or_else(|_| Normal::new(0.0, 1.0).expect("std 1"));
    let v: Vec<f32> = (0..shape.iter().product::<usize>())
        .map(|_| n.sample(rng))
        .collect();
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

    fn all(&self) -> [(&'static str, &Tensor); 9] {
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
}

/// What a safetensors file gave: the layer's weights, the sizes they imply, and the input if
/// the file holds one.
#[derive(Debug, Clone)]
pub struct LoadedLayer {
    /// Weights.
    pub weights: MixtralWeights,
    /// `config` with d_model, kv_heads, experts and ffn replaced by what the weights say.
    pub config: MixtralConfig,
    /// The `input` tensor as [B*T, H], with (B, T), if present.
    pub input: Option<(Tensor, usize, usize)>,
    /// The prefix of the layer's tensor names in the file (`model.layers.3.`).
    pub prefix: String,
}

/// Reads one Mixtral layer's weights from a safetensors file with transformers' names (any
/// prefix, e.g. `layer.` or `model.layers.0.`). Both the fused expert layout
/// (`mlp.experts.gate_up_proj` [E, 2F, H], `mlp.experts.down_proj` [E, H, F]) and the per-expert
/// layout (`block_sparse_moe.experts.N.w1/w2/w3.weight`) are accepted. `config.heads` must be
/// right (the weights cannot tell heads from head dim; 0 means unknown and is refused, naming
/// `--heads`); the other sizes come from the file. `config.json` is not read here:
/// [`load_hf_layer`] reads it. A file holding several layers
/// is refused, naming them: [`load_layer_at`] picks one.
pub fn load_layer(path: impl AsRef<Path>, config: &MixtralConfig) -> Result<LoadedLayer> {
    load_layer_at(path, config, None)
}

/// The layer number of a name prefix: the last dot-separated part that is a number
/// (`model.layers.3.` -> 3).
fn layer_number(prefix: &str) -> Option<usize> {
    prefix
        .trim_end_matches('.')
        .rsplit('.')
        .find_map(|p| p.parse::<usize>().ok())
}

/// [`load_layer`] of layer `layer` (the number in its names, `model.layers.N.`), for files
/// that hold several: `None` is accepted only for a file of one layer; a number the file
/// does not hold is refused, listing the layers it does.
pub fn load_layer_at(
    path: impl AsRef<Path>,
    config: &MixtralConfig,
    layer: Option<usize>,
) -> Result<LoadedLayer> {
    const Q: &str = "self_attn.q_proj.weight";
    let path = path.as_ref();
    let mut all = crate::io::read_safetensors(path)?;
    let mut prefixes: Vec<String> = all
        .keys()
        .filter_map(|k| k.strip_suffix(Q))
        .map(str::to_string)
        .collect();
    prefixes.sort_by_key(|p| (layer_number(p), p.clone()));
    if prefixes.is_empty() {
        return Err(Error::file(
            path,
            format!(
                "no tensor named '*{Q}': not a Mixtral layer (expected transformers' Mixtral names)"
            ),
        ));
    }
    let listed = || {
        prefixes
            .iter()
            .map(|p| match layer_number(p) {
                Some(n) => format!("{n} ({p}*)"),
                None => format!("{p}*"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let prefix = match layer {
        None if prefixes.len() == 1 => prefixes[0].clone(),
        None => {
            return Err(Error::file(
                path,
                format!(
                    "holds {} layers: {}; pick one with --layer N",
                    prefixes.len(),
                    listed()
                ),
            ));
        }
        Some(n) => prefixes
            .iter()
            .find(|p| {
                layer_number(p) == Some(n)
                    || (n == 0 && prefixes.len() == 1 && layer_number(p).is_none())
            })
            .cloned()
            .ok_or_else(|| {
                Error::file(path, format!("has no layer {n}; it holds: {}", listed()))
            })?,
    };
    let fused = all.contains_key(&format!("{prefix}mlp.experts.gate_up_proj"));
    let mut take = |suffix: &str| -> Result<Tensor> {
        let key = format!("{prefix}{suffix}");
        let t = all
            .remove(&key)
            .ok_or_else(|| Error::file(path, format!("missing tensor '{key}'")))?;
        if !t.dtype().is_float() {
            return Err(Error::file(
                path,
                format!("tensor '{key}' is {}, expected a float type", t.dtype()),
            ));
        }
        Ok(t.cast(DType::F32))
    };
    let wq = take("self_attn.q_proj.weight")?;
    let wk = take("self_attn.k_proj.weight")?;
    let wv = take("self_attn.v_proj.weight")?;
    let wo = take("self_attn.o_proj.weight")?;
    let ln1 = take("input_layernorm.weight")?;
    let ln2 = take("post_attention_layernorm.weight")?;
    let (gate, gate_up, down) = if fused {
        (
            take("mlp.gate.weight")?,
            take("mlp.experts.gate_up_proj")?,
            take("mlp.experts.down_proj")?,
        )
    } else {
        let gate = take("block_sparse_moe.gate.weight")?;
        let e = gate.shape()[0];
        let mut gu = Vec::new();
        let mut dn = Vec::new();
        for i in 0..e {
            let w1 = take(&format!("block_sparse_moe.experts.{i}.w1.weight"))?;
            let w3 = take(&format!("block_sparse_moe.experts.{i}.w3.weight"))?;
            let w2 = take(&format!("block_sparse_moe.experts.{i}.w2.weight"))?;
            let cat = concatenate(Axis(0), &[w1.to_f32().view(), w3.to_f32().view()])
                .map_err(|e| Error::file(path, format!("expert {i}: w1/w3 shapes differ: {e}")))?;
            gu.push(cat.insert_axis(Axis(0)));
            dn.push(w2.to_f32().insert_axis(Axis(0)));
        }
        let stack = |v: Vec<ArrayD<f32>>, what: &str| {
            let views: Vec<_> = v.iter().map(|a| a.view()).collect();
            concatenate(Axis(0), &views)
                .map(Tensor::from_f32)
                .map_err(|e| Error::file(path, format!("experts' {what} shapes differ: {e}")))
        };
        (gate, stack(gu, "w1/w3")?, stack(dn, "w2")?)
    };
    let dim = |t: &Tensor, i: usize| t.shape().get(i).copied().unwrap_or(0);
    let mut c = config.clone();
    c.d_model = dim(&wq, 1);
    let qdim = dim(&wq, 0);
    if c.heads == 0 {
        return Err(Error::file(
            path,
            format!(
                "the head count is not known: no {} with num_attention_heads beside the weights \
                 (looked for {}), and the weights cannot tell heads from head size; pass the \
                 model's --heads (--kv-heads is then checked against k_proj)",
                HfConfig::FILE_NAME,
                HfConfig::path_beside(path).display()
            ),
        ));
    }
    if qdim % c.heads != 0 {
        return Err(Error::file(
            path,
            format!(
                "q_proj has {qdim} rows, which heads = {} does not divide (pass the model's head count with --heads)",
                c.heads
            ),
        ));
    }
    let d = qdim / c.heads;
    if qdim != c.d_model {
        return Err(Error::file(
            path,
            format!(
                "q_proj is [{qdim}, {}]: head_dim * heads != hidden size is not supported",
                c.d_model
            ),
        ));
    }
    c.kv_heads = dim(&wk, 0) / d.max(1);
    c.experts = dim(&gate, 0);
    c.ffn = dim(&gate_up, 1) / 2;
    c.top_k = c.top_k.min(c.experts.max(1));
    c.check().map_err(|e| Error::file(path, e.to_string()))?;
    let weights = MixtralWeights {
        wq,
        wk,
        wv,
        wo,
        ln1,
        ln2,
        gate,
        gate_up,
        down,
    };
    check_weight_shapes(&weights, &c).map_err(|e| Error::file(path, e.to_string()))?;
    let input = match all.remove("input") {
        None => None,
        Some(t) => {
            let s = t.shape().to_vec();
            let (b, tl) = match s.as_slice() {
                [b, tl, h] if *h == c.d_model => (*b, *tl),
                [tl, h] if *h == c.d_model => (1, *tl),
                _ => {
                    return Err(Error::file(
                        path,
                        format!(
                            "tensor 'input' has shape {s:?}, expected [B, T, {}] or [T, {}]",
                            c.d_model, c.d_model
                        ),
                    ));
                }
            };
            let flat = t
                .to_f32()
                .into_shape_with_order(IxDyn(&[b * tl, c.d_model]))
                .map_err(|e| Error::file(path, format!("tensor 'input': {e}")))?;
            Some((Tensor::from_f32(flat), b, tl))
        }
    };
    Ok(LoadedLayer {
        weights,
        config: c,
        input,
        prefix,
    })
}

/// Reads one Mixtral layer as transformers saves a checkpoint: the settings of the
/// `config.json` beside the weights, if there is one ([`HfConfig`]: heads, experts per
/// token, RoPE theta, RMSNorm epsilon), over `base`, then the weights ([`load_layer`]). To
/// let other settings win over the file's, apply [`HfConfig::beside`] to a config, change it,
/// and call [`load_layer`].
pub fn load_hf_layer(path: impl AsRef<Path>, base: &MixtralConfig) -> Result<LoadedLayer> {
    let path = path.as_ref();
    let mut c = base.clone();
    if let Some(hf) = HfConfig::beside(path)? {
        hf.apply(&mut c);
    }
    load_layer(path, &c)
}

fn check_weight_shapes(w: &MixtralWeights, c: &MixtralConfig) -> Result<()> {
    let (h, d, f, e) = (c.d_model, c.head_dim(), c.ffn, c.experts);
    let want: [(&str, Vec<usize>); 9] = [
        ("wq", vec![c.heads * d, h]),
        ("wk", vec![c.kv_heads * d, h]),
        ("wv", vec![c.kv_heads * d, h]),
        ("wo", vec![h, c.heads * d]),
        ("ln1", vec![h]),
        ("ln2", vec![h]),
        ("gate", vec![e, h]),
        ("gate_up", vec![e, 2 * f, h]),
        ("down", vec![e, h, f]),
    ];
    for ((name, t), (_, shape)) in w.all().into_iter().zip(want) {
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
    check_weight_shapes(&w, c)?;
    let x = match input {
        Some(x) => {
            if x.shape() != [c.tokens(), c.d_model] {
                return Err(Error::invalid(
                    "workload",
                    format!(
                        "input has shape {:?}, expected [{}, {}]",
                        x.shape(),
                        c.tokens(),
                        c.d_model
                    ),
                ));
            }
            x
        }
        None => normal(&mut rng, &[c.tokens(), c.d_model], 1.0),
    };
    let round = |t: &Tensor| t.cast(c.dtype).cast(DType::F32);
    let mut g = Graph::default();
    g.constant("x", round(&x));
    for (name, t) in w.all() {
        g.param(name, round(t));
    }
    let lin = Op::Linear(LinearParams {
        act: Activation::None,
        bias: false,
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
        "input_norm",
        Op::RmsNorm(RmsNormParams {
            eps: c.rms_eps,
            residual: false,
        }),
        &["x", "ln1"],
    );
    let q = g.add("q_proj", lin.clone(), &[&h1[0], "wq"]);
    let k = g.add("k_proj", lin.clone(), &[&h1[0], "wk"]);
    let v = g.add("v_proj", lin.clone(), &[&h1[0], "wv"]);
    let q4 = g.add("q_heads", split(c.heads), &[&q[0]]);
    let k4 = g.add("k_heads", split(c.kv_heads), &[&k[0]]);
    let v4 = g.add("v_heads", split(c.kv_heads), &[&v[0]]);
    let qr = g.add("q_rope", rope.clone(), &[&q4[0]]);
    let kr = g.add("k_rope", rope, &[&k4[0]]);
    let att = g.add(
        "attention",
        Op::Attention(AttentionParams {
            causal: true,
            scale: None,
        }),
        &[&qr[0], &kr[0], &v4[0]],
    );
    let merged = g.add("merge_heads", Op::MergeHeads, &[&att[0]]);
    let o = g.add("o_proj", lin.clone(), &[&merged[0], "wo"]);
    let h2 = g.add(
        "post_attention_norm",
        Op::RmsNorm(RmsNormParams {
            eps: c.rms_eps,
            residual: true,
        }),
        &[&o[0], "ln2", "x"],
    );
    let logits = g.add("router_logits", lin, &[&h2[0], "gate"]);
    let r = g.add(
        "router",
        Op::MoeRoute(MoeRouteParams {
            top_k: c.top_k,
            renormalize: true,
            block_size: 16,
        }),
        &[&logits[0]],
    );
    let moe = g.add(
        "experts",
        Op::MoeExperts(MoeExpertsParams {}),
        &[&h2[0], &r[0], &r[1], &r[3], &r[4], "gate_up", "down"],
    );
    let out = g.add("out", Op::Add, &[&h2[1], &moe[0]]);
    debug_assert_eq!(out[0], OUTPUT);
    g.outputs = vec![out[0].clone(), r[5].clone(), r[6].clone()];
    g.validate()?;
    Ok(g)
}

/// Reshapes the layer output [B*T, H] to [B, T, H] for saving.
pub fn output_as_btd(t: &Tensor, c: &MixtralConfig) -> Result<Tensor> {
    let a: Array2<f32> = t
        .to_f32()
        .into_dimensionality()
        .map_err(|e| Error::Internal(format!("layer output: {e}")))?;
    let a = a
        .into_shape_with_order(IxDyn(&[c.batch, c.seq_len, c.d_model]))
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

    /// A small layer's weights saved under transformers' fused names, in a folder of its own.
    fn save_layer(
        dir: &Path,
        c: &MixtralConfig,
    ) -> std::result::Result<std::path::PathBuf, Box<dyn std::error::Error>> {
        let w = MixtralWeights::random(c, &mut ChaCha8Rng::seed_from_u64(3));
        let names = weight_names();
        let mut t = BTreeMap::new();
        for (short, tensor) in w.all() {
            let long = names.get(short).ok_or("name")?;
            t.insert(format!("model.layers.0.{long}"), tensor.clone());
        }
        let path = dir.join("layer.safetensors");
        crate::io::write_safetensors(&path, &t)?;
        Ok(path)
    }

    #[test]
    fn the_config_json_beside_the_weights_sets_what_they_cannot_tell()
    -> std::result::Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let small = MixtralConfig {
            d_model: 32,
            heads: 4,
            kv_heads: 2,
            experts: 4,
            top_k: 2,
            ffn: 16,
            seq_len: 4,
            ..MixtralConfig::default()
        };
        let path = save_layer(dir.path(), &small)?;
        // Without config.json the base's heads are taken as they are.
        let base = MixtralConfig {
            heads: 2,
            ..MixtralConfig::default()
        };
        let l = load_hf_layer(&path, &base)?;
        assert_eq!((l.config.heads, l.config.kv_heads), (2, 1));
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"num_attention_heads": 4, "num_experts_per_tok": 1, "rope_theta": 1e6,
                "rms_norm_eps": 1e-6, "hidden_size": 32}"#,
        )?;
        let l = load_hf_layer(&path, &base)?;
        let c = &l.config;
        assert_eq!((c.d_model, c.heads, c.kv_heads), (32, 4, 2));
        assert_eq!((c.experts, c.top_k, c.ffn), (4, 1, 16));
        assert_eq!((c.rope_theta, c.rms_eps), (1e6, 1e-6));
        mixtral_layer(c, Some(l.weights), None)?;
        // A bad value stops the load, naming the file and the key.
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"num_attention_heads": 0}"#,
        )?;
        let m = load_hf_layer(&path, &base)
            .expect_err("heads 0")
            .to_string();
        assert!(m.contains("config.json: num_attention_heads = 0"), "{m}");
        Ok(())
    }

    #[test]
    fn a_file_of_several_layers_needs_the_layer_named()
    -> std::result::Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let small = MixtralConfig {
            d_model: 32,
            heads: 4,
            kv_heads: 2,
            experts: 4,
            top_k: 2,
            ffn: 16,
            seq_len: 4,
            ..MixtralConfig::default()
        };
        let names = weight_names();
        let mut t = BTreeMap::new();
        for (layer, seed) in [(0, 3), (1, 4)] {
            let w = MixtralWeights::random(&small, &mut ChaCha8Rng::seed_from_u64(seed));
            for (short, tensor) in w.all() {
                let long = names.get(short).ok_or("name")?;
                t.insert(format!("model.layers.{layer}.{long}"), tensor.clone());
            }
        }
        let path = dir.path().join("two.safetensors");
        crate::io::write_safetensors(&path, &t)?;
        let m = load_layer(&path, &small)
            .expect_err("two layers")
            .to_string();
        assert!(
            m.contains("holds 2 layers: 0 (model.layers.0.*), 1 (model.layers.1.*)"),
            "{m}"
        );
        assert!(m.contains("--layer"), "{m}");
        let l1 = load_layer_at(&path, &small, Some(1))?;
        assert_eq!(l1.prefix, "model.layers.1.");
        let l0 = load_layer_at(&path, &small, Some(0))?;
        assert_ne!(l0.weights.wq.to_f32(), l1.weights.wq.to_f32());
        let m = load_layer_at(&path, &small, Some(2))
            .expect_err("no layer 2")
            .to_string();
        assert!(m.contains("has no layer 2"), "{m}");
        // An unknown head count is refused, naming the flag.
        let unknown = MixtralConfig { heads: 0, ..small };
        let m = load_layer_at(&path, &unknown, Some(0))
            .expect_err("heads unknown")
            .to_string();
        assert!(
            m.contains("head count is not known") && m.contains("--heads"),
            "{m}"
        );
        Ok(())
    }
}
