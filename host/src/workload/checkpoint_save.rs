//! Writing a model folder as transformers saves one ([`save_checkpoint`]): config.json, and
//! the weights under transformers' Mixtral names (per-expert `w1`/`w2`/`w3`) in one
//! `model.safetensors` or in shards `model-0000K-of-0000N.safetensors` with
//! `model.safetensors.index.json`. [`make_test_model`] makes a small one of seeded random
//! weights, for tests and demos (`tandem model make-test`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ndarray::{Axis, s};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use super::checkpoint::{INDEX_FILE, SINGLE_FILE};
use super::layer::normal;
use super::model::{EMBED, FINAL_NORM, LM_HEAD, ModelSizes, ModelWeights};
use super::{HfConfig, MixtralConfig, MixtralWeights};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// How a model folder is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveOptions {
    /// Weight files: 1 writes `model.safetensors` (no index); more split the layers among
    /// that many shards (in order; the embedding in the first, norm and head in the last).
    pub shards: usize,
    /// The dtype the tensors are stored in (bf16, f16 or f32).
    pub dtype: DType,
    /// Write `tie_word_embeddings: true` and no `lm_head.weight`: the head is the embedding
    /// matrix (the weights' head must be absent or equal to it).
    pub tie_word_embeddings: bool,
}

impl Default for SaveOptions {
    fn default() -> Self {
        Self {
            shards: 1,
            dtype: DType::BF16,
            tie_word_embeddings: false,
        }
    }
}

/// The config.json of a Mixtral model of `sizes`, as transformers writes it (the keys tandem
/// reads, and the ones transformers needs to load the model).
pub fn config_json(sizes: &ModelSizes, dtype: DType, tied: bool) -> serde_json::Value {
    let torch = match dtype {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        _ => "float32",
    };
    json!({
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "hidden_size": sizes.hidden,
        "intermediate_size": sizes.ffn,
        "num_attention_heads": sizes.heads,
        "num_key_value_heads": sizes.kv_heads,
        "head_dim": sizes.hidden / sizes.heads.max(1),
        "num_hidden_layers": sizes.layers,
        "num_local_experts": sizes.experts,
        "num_experts_per_tok": sizes.top_k,
        // The f32's shortest decimal (1e-5, not 9.99999974e-6).
        "rms_norm_eps": sizes.rms_eps.to_string().parse::<f64>().unwrap_or(f64::from(sizes.rms_eps)),
        "rope_theta": sizes.rope_theta,
        "vocab_size": sizes.vocab,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "tie_word_embeddings": tied,
        "sliding_window": null,
        "torch_dtype": torch,
    })
}

/// The tensors of one layer under transformers' per-expert names (`model.layers.{i}.*`).
fn layer_tensors(i: usize, w: &MixtralWeights, out: &mut BTreeMap<String, Tensor>) {
    let p = format!("model.layers.{i}.");
    for (name, t) in [
        ("self_attn.q_proj.weight", &w.wq),
        ("self_attn.k_proj.weight", &w.wk),
        ("self_attn.v_proj.weight", &w.wv),
        ("self_attn.o_proj.weight", &w.wo),
        ("input_layernorm.weight", &w.ln1),
        ("post_attention_layernorm.weight", &w.ln2),
        ("block_sparse_moe.gate.weight", &w.gate),
    ] {
        out.insert(format!("{p}{name}"), t.clone());
    }
    let gu = w.gate_up.to_f32();
    let dn = w.down.to_f32();
    let f = gu.shape().get(1).copied().unwrap_or(0) / 2;
    for (e, (g, d)) in gu.axis_iter(Axis(0)).zip(dn.axis_iter(Axis(0))).enumerate() {
        let w1 = g.slice(s![..f, ..]).to_owned().into_dyn();
        let w3 = g.slice(s![f.., ..]).to_owned().into_dyn();
        let n = |x: &str| format!("{p}block_sparse_moe.experts.{e}.{x}.weight");
        out.insert(n("w1"), Tensor::from_f32(w1));
        out.insert(n("w3"), Tensor::from_f32(w3));
        out.insert(n("w2"), Tensor::from_f32(d.to_owned()));
    }
}

/// Writes `weights` as a model folder `dir` (created if missing) with config.json of `sizes`
/// (whose `layers` must be the weights' layer count); returns the files written. Tensors are
/// rounded to `opts.dtype`.
pub fn save_checkpoint(
    dir: impl AsRef<Path>,
    sizes: &ModelSizes,
    weights: &ModelWeights,
    opts: SaveOptions,
) -> Result<Vec<PathBuf>> {
    let dir = dir.as_ref();
    let n = weights.layers.len();
    if sizes.layers != n {
        return Err(Error::invalid(
            "checkpoint",
            format!(
                "num_hidden_layers = {} but {n} layers of weights",
                sizes.layers
            ),
        ));
    }
    if opts.shards == 0 || opts.shards > n.max(1) {
        return Err(Error::invalid(
            "checkpoint",
            format!(
                "shards = {} is not accepted: 1 to the layer count ({n})",
                opts.shards
            ),
        ));
    }
    if !opts.dtype.is_float() {
        return Err(Error::invalid(
            "checkpoint",
            format!("dtype {} is not accepted: bf16, f16 or f32", opts.dtype),
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::file(dir, format!("cannot create: {e}")))?;
    let mut files: Vec<BTreeMap<String, Tensor>> = vec![BTreeMap::new(); opts.shards];
    for (i, w) in weights.layers.iter().enumerate() {
        layer_tensors(i, w, &mut files[i * opts.shards / n]);
    }
    if let Some(t) = &weights.embed {
        files[0].insert(EMBED.into(), t.clone());
    }
    let last = opts.shards - 1;
    if let Some(t) = &weights.final_norm {
        files[last].insert(FINAL_NORM.into(), t.clone());
    }
    if opts.tie_word_embeddings {
        match (&weights.embed, &weights.lm_head) {
            (Some(e), Some(h)) if e != h => {
                return Err(Error::invalid(
                    "checkpoint",
                    "tie_word_embeddings: the LM head differs from the embedding matrix (tied \
                     heads are the embedding itself)",
                ));
            }
            (None, _) => {
                return Err(Error::invalid(
                    "checkpoint",
                    "tie_word_embeddings needs an embedding matrix (the head is the embedding)",
                ));
            }
            _ => {}
        }
    } else if let Some(t) = &weights.lm_head {
        files[last].insert(LM_HEAD.into(), t.clone());
    }
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    let mut written = Vec::new();
    let mut weight_map = serde_json::Map::new();
    let mut total = 0u64;
    for (k, tensors) in files.iter_mut().enumerate() {
        for t in tensors.values_mut() {
            *t = t.cast(opts.dtype);
            total += t.meta().bytes() as u64;
        }
        let name = if opts.shards == 1 {
            SINGLE_FILE.to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", k + 1, opts.shards)
        };
        for t in tensors.keys() {
            weight_map.insert(t.clone(), name.clone().into());
        }
        let path = dir.join(&name);
        crate::io::write_safetensors_with(&path, tensors, Some(&meta))?;
        written.push(path);
    }
    if opts.shards > 1 {
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let path = dir.join(INDEX_FILE);
        write_json(&path, &index)?;
        written.push(path);
    }
    let config = config_json(sizes, opts.dtype, opts.tie_word_embeddings);
    let path = dir.join(HfConfig::FILE_NAME);
    write_json(&path, &config)?;
    written.push(path);
    Ok(written)
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v)
        .map_err(|e| Error::Internal(format!("{}: {e}", path.display())))?;
    crate::files::write_atomic(path, format!("{text}\n").as_bytes())
}

/// The sizes of the small test model: 3 layers, hidden 32, 4 heads (2 key/value), 4 experts
/// (top 2) of FFN 64, a vocabulary of 128.
pub fn test_model_sizes() -> ModelSizes {
    ModelSizes {
        hidden: 32,
        heads: 4,
        kv_heads: 2,
        ffn: 64,
        experts: 4,
        top_k: 2,
        layers: 3,
        rms_eps: 1e-5,
        rope_theta: 1e6,
        vocab: 128,
    }
}

/// Seeded random weights of a whole model of `sizes`: the layers as
/// [`MixtralWeights::random`] makes them, an embedding (normal, std 1), a final norm (around
/// 1) and an LM head (std 1/sqrt(hidden)).
pub fn random_model(sizes: &ModelSizes, seed: u64) -> Result<ModelWeights> {
    let c = sizes.layer_config(&MixtralConfig::default());
    c.check()?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut w = ModelWeights::random(&c, sizes.layers, &mut rng);
    let h = sizes.hidden;
    w.embed = Some(normal(&mut rng, &[sizes.vocab, h], 1.0));
    let norm = normal(&mut rng, &[h], 0.1).to_f32().mapv(|x| 1.0 + x);
    w.final_norm = Some(Tensor::from_f32(norm));
    w.lm_head = Some(normal(&mut rng, &[sizes.vocab, h], 1.0 / (h as f32).sqrt()));
    Ok(w)
}

/// Writes a test model of `sizes` with seeded random weights ([`random_model`]) to `dir`.
pub fn make_test_model(
    dir: impl AsRef<Path>,
    sizes: &ModelSizes,
    seed: u64,
    opts: SaveOptions,
) -> Result<Vec<PathBuf>> {
    let mut w = random_model(sizes, seed)?;
    if opts.tie_word_embeddings {
        w.lm_head = w.embed.clone();
    }
    save_checkpoint(dir, sizes, &w, opts)
}
