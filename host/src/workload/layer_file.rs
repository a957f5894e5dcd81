//! One layer's weights from a safetensors file with transformers' Mixtral names
//! ([`load_layer`], [`load_layer_at`]; [`load_hf_layer`] with the `config.json` beside it).

use std::path::Path;

use ndarray::{ArrayD, Axis, IxDyn, concatenate};

use super::layer::check_weight_shapes;
use super::{HfConfig, MixtralConfig, MixtralWeights};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::workload::{mixtral_layer, weight_names};

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
