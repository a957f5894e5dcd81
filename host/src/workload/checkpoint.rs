//! A model folder as transformers saves it ([`Checkpoint`]): `config.json` (every size), and
//! the weights in `model.safetensors` or in shards listed by `model.safetensors.index.json`
//! (its `weight_map`: tensor name -> file), under transformers' Mixtral names. Tensors may be
//! bf16, f16 or f32 (f64 too); they are checked against config.json's sizes and held as f32.
//!
//! Every error names the file and the tensor (or the key) that is wrong.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use ndarray::{ArrayD, Axis, concatenate};
use serde_json::Value;

use super::model::{EMBED, FINAL_NORM, LM_HEAD, ModelSizes, ModelWeights};
use super::{HfConfig, MixtralWeights};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The one weights file of an unsharded checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";

/// A model folder, opened: its sizes and where each tensor is (no weights read yet).
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The folder.
    pub dir: PathBuf,
    /// Its `config.json`.
    pub config_path: PathBuf,
    /// The sizes config.json gives.
    pub sizes: ModelSizes,
    /// config.json's `tie_word_embeddings`: the LM head is the embedding matrix when the files
    /// hold no `lm_head.weight`.
    pub tied: bool,
    /// The file that lists the tensors: the index, or `model.safetensors` itself.
    pub listing: PathBuf,
    /// Tensor name -> the file (in `dir`) that holds it.
    map: BTreeMap<String, String>,
}

/// One tensor to read: its name, the shape config.json gives it, and which sizes make that
/// shape (for the error when the file disagrees).
struct Want {
    name: String,
    shape: Vec<usize>,
    why: String,
}

impl Checkpoint {
    /// Opens a model folder: reads config.json (every size is required) and the index (or the
    /// header of `model.safetensors`).
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            return Err(Error::file(
                dir,
                format!(
                    "not a model folder (a folder with {} and {SINGLE_FILE} or {INDEX_FILE})",
                    HfConfig::FILE_NAME
                ),
            ));
        }
        let config_path = dir.join(HfConfig::FILE_NAME);
        if !config_path.is_file() {
            return Err(Error::file(
                &config_path,
                "missing: a model folder needs the config.json transformers saves beside the \
                 weights (it gives every size)",
            ));
        }
        let config = HfConfig::read(&config_path)?;
        let sizes = config.model_sizes(&config_path)?;
        // Mixtral's default (transformers' MixtralConfig) is untied.
        let tied = config.tie_word_embeddings.unwrap_or(false);
        let index = dir.join(INDEX_FILE);
        let single = dir.join(SINGLE_FILE);
        let (listing, map) = if index.is_file() {
            let map = read_index(&index)?;
            (index, map)
        } else if single.is_file() {
            let map = crate::io::safetensors_names(&single)?
                .into_iter()
                .map(|n| (n, SINGLE_FILE.to_string()))
                .collect();
            (single, map)
        } else {
            return Err(Error::file(
                dir,
                format!("holds neither {INDEX_FILE} (sharded weights) nor {SINGLE_FILE}"),
            ));
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            config_path,
            sizes,
            tied,
            listing,
            map,
        })
    }

    /// Whether the listing names tensor `name`.
    pub fn has(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// The weight files the listing names, each once.
    pub fn files(&self) -> BTreeSet<&str> {
        self.map.values().map(String::as_str).collect()
    }

    /// The layer numbers whose q_proj the listing names, in order.
    pub fn layers_listed(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .map
            .keys()
            .filter_map(|k| {
                k.strip_prefix("model.layers.")?
                    .strip_suffix(".self_attn.q_proj.weight")?
                    .parse()
                    .ok()
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// Reads the weights of the first `layers` layers (and the embedding, final norm and LM
    /// head where the files hold them), checking each tensor's shape against config.json.
    /// `layers` beyond config.json's `num_hidden_layers`, or beyond what the files hold, is
    /// an error naming both.
    pub fn load(&self, layers: usize) -> Result<ModelWeights> {
        let s = &self.sizes;
        if layers == 0 || layers > s.layers {
            return Err(Error::file(
                &self.config_path,
                format!(
                    "{layers} layers asked for, but num_hidden_layers = {} (accepted: 1 to {})",
                    s.layers, s.layers
                ),
            ));
        }
        let listed = self.layers_listed();
        for i in 0..layers {
            let q = format!("model.layers.{i}.self_attn.q_proj.weight");
            if !self.has(&q) {
                return Err(Error::file(
                    &self.listing,
                    format!(
                        "no tensor '{q}': {} gives num_hidden_layers = {}, but the files hold \
                         layers {}",
                        HfConfig::FILE_NAME,
                        s.layers,
                        ranges(&listed)
                    ),
                ));
            }
        }
        let mut wants: Vec<Want> = Vec::new();
        let fused: Vec<bool> = (0..layers)
            .map(|i| {
                !self.has(&format!("model.layers.{i}.block_sparse_moe.gate.weight"))
                    && self.has(&format!("model.layers.{i}.mlp.experts.gate_up_proj"))
            })
            .collect();
        for (i, &f) in fused.iter().enumerate() {
            wants.extend(self.layer_wants(i, f));
        }
        let extras = [
            (EMBED, vec![s.vocab, s.hidden], "vocab_size, hidden_size"),
            (FINAL_NORM, vec![s.hidden], "hidden_size"),
            (LM_HEAD, vec![s.vocab, s.hidden], "vocab_size, hidden_size"),
        ];
        for (name, shape, why) in &extras {
            if self.has(name) {
                wants.push(Want {
                    name: (*name).to_string(),
                    shape: shape.clone(),
                    why: self.why(why),
                });
            }
        }
        let mut got = self.read(&wants)?;
        let mut take = |name: &str| -> Result<Tensor> {
            got.remove(name)
                .ok_or_else(|| Error::Internal(format!("checkpoint: '{name}' not read")))
        };
        let mut out = Vec::with_capacity(layers);
        for (i, &f) in fused.iter().enumerate() {
            let p = format!("model.layers.{i}.");
            let mut t = |suffix: &str| take(&format!("{p}{suffix}"));
            let (wq, wk, wv, wo) = (
                t("self_attn.q_proj.weight")?,
                t("self_attn.k_proj.weight")?,
                t("self_attn.v_proj.weight")?,
                t("self_attn.o_proj.weight")?,
            );
            let (ln1, ln2) = (
                t("input_layernorm.weight")?,
                t("post_attention_layernorm.weight")?,
            );
            let (gate, gate_up, down) = if f {
                (
                    t("mlp.gate.weight")?,
                    t("mlp.experts.gate_up_proj")?,
                    t("mlp.experts.down_proj")?,
                )
            } else {
                let gate = t("block_sparse_moe.gate.weight")?;
                let mut gu = Vec::with_capacity(s.experts);
                let mut dn = Vec::with_capacity(s.experts);
                for e in 0..s.experts {
                    let w1 = t(&format!("block_sparse_moe.experts.{e}.w1.weight"))?.to_f32();
                    let w3 = t(&format!("block_sparse_moe.experts.{e}.w3.weight"))?.to_f32();
                    let w2 = t(&format!("block_sparse_moe.experts.{e}.w2.weight"))?.to_f32();
                    gu.push(stack(&[w1.view(), w3.view()], Axis(0))?.insert_axis(Axis(0)));
                    dn.push(w2.insert_axis(Axis(0)));
                }
                let gu: Vec<_> = gu.iter().map(ArrayD::view).collect();
                let dn: Vec<_> = dn.iter().map(ArrayD::view).collect();
                (
                    gate,
                    Tensor::from_f32(stack(&gu, Axis(0))?),
                    Tensor::from_f32(stack(&dn, Axis(0))?),
                )
            };
            out.push(MixtralWeights {
                wq,
                wk,
                wv,
                wo,
                ln1,
                ln2,
                gate,
                gate_up,
                down,
            });
        }
        let mut opt = |name: &str| -> Result<Option<Tensor>> {
            if self.has(name) {
                take(name).map(Some)
            } else {
                Ok(None)
            }
        };
        let embed = opt(EMBED)?;
        let final_norm = opt(FINAL_NORM)?;
        let lm_head = match opt(LM_HEAD)? {
            Some(h) => Some(h),
            // Tied: the head is the embedding matrix ([vocab, hidden] both).
            None if self.tied => embed.clone(),
            None => None,
        };
        Ok(ModelWeights {
            layers: out,
            embed,
            final_norm,
            lm_head,
        })
    }

    /// The sizes named by `keys` (config.json's names, comma-separated) with their values.
    fn why(&self, keys: &str) -> String {
        let s = &self.sizes;
        keys.split(", ")
            .map(|k| {
                let v = match k {
                    "hidden_size" => s.hidden,
                    "num_attention_heads" => s.heads,
                    "num_key_value_heads" => s.kv_heads,
                    "intermediate_size" => s.ffn,
                    "num_local_experts" => s.experts,
                    "vocab_size" => s.vocab,
                    _ => 0,
                };
                format!("{k} = {v}")
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The tensors of layer `i`, in per-expert (`block_sparse_moe.experts.N.w1`) or fused
    /// (`mlp.experts.gate_up_proj`) layout, with their shapes.
    fn layer_wants(&self, i: usize, fused: bool) -> Vec<Want> {
        let s = &self.sizes;
        let (h, f, e) = (s.hidden, s.ffn, s.experts);
        let d = h / s.heads.max(1);
        let p = format!("model.layers.{i}.");
        let mut v = vec![
            (
                "self_attn.q_proj.weight".to_string(),
                vec![s.heads * d, h],
                "hidden_size, num_attention_heads",
            ),
            (
                "self_attn.k_proj.weight".into(),
                vec![s.kv_heads * d, h],
                "hidden_size, num_attention_heads, num_key_value_heads",
            ),
            (
                "self_attn.v_proj.weight".into(),
                vec![s.kv_heads * d, h],
                "hidden_size, num_attention_heads, num_key_value_heads",
            ),
            (
                "self_attn.o_proj.weight".into(),
                vec![h, s.heads * d],
                "hidden_size, num_attention_heads",
            ),
            ("input_layernorm.weight".into(), vec![h], "hidden_size"),
            (
                "post_attention_layernorm.weight".into(),
                vec![h],
                "hidden_size",
            ),
        ];
        if fused {
            v.push((
                "mlp.gate.weight".into(),
                vec![e, h],
                "num_local_experts, hidden_size",
            ));
            v.push((
                "mlp.experts.gate_up_proj".into(),
                vec![e, 2 * f, h],
                "num_local_experts, intermediate_size, hidden_size",
            ));
            v.push((
                "mlp.experts.down_proj".into(),
                vec![e, h, f],
                "num_local_experts, hidden_size, intermediate_size",
            ));
        } else {
            v.push((
                "block_sparse_moe.gate.weight".into(),
                vec![e, h],
                "num_local_experts, hidden_size",
            ));
            for x in 0..e {
                let n = |w: &str| format!("block_sparse_moe.experts.{x}.{w}.weight");
                v.push((n("w1"), vec![f, h], "intermediate_size, hidden_size"));
                v.push((n("w3"), vec![f, h], "intermediate_size, hidden_size"));
                v.push((n("w2"), vec![h, f], "hidden_size, intermediate_size"));
            }
        }
        v.into_iter()
            .map(|(n, shape, why)| Want {
                name: format!("{p}{n}"),
                shape,
                why: self.why(why),
            })
            .collect()
    }

    /// Reads `wants`, one file at a time (each file once), as f32, checking shapes and dtypes.
    fn read(&self, wants: &[Want]) -> Result<BTreeMap<String, Tensor>> {
        let listing = self
            .listing
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut by_file: BTreeMap<&str, Vec<&Want>> = BTreeMap::new();
        for w in wants {
            let file = self.map.get(&w.name).ok_or_else(|| {
                Error::file(&self.listing, format!("no tensor '{}' is listed", w.name))
            })?;
            by_file.entry(file.as_str()).or_default().push(w);
        }
        let mut out = BTreeMap::new();
        for (file, ws) in by_file {
            let path = self.dir.join(file);
            if !path.is_file() {
                return Err(Error::file(
                    &path,
                    format!(
                        "missing shard: {listing} maps {} tensor(s) to it (the first: '{}')",
                        ws.len(),
                        ws[0].name
                    ),
                ));
            }
            let names: Vec<&str> = ws.iter().map(|w| w.name.as_str()).collect();
            let mut got =
                crate::io::read_safetensors_named(&path, &names).map_err(|e| match e {
                    Error::File { path, msg } if msg.starts_with("no tensor") => Error::File {
                        path,
                        msg: format!("{msg}; {listing} maps it to this file"),
                    },
                    e => e,
                })?;
            for w in ws {
                let t = got
                    .remove(&w.name)
                    .ok_or_else(|| Error::Internal(format!("'{}' not read", w.name)))?;
                if !t.dtype().is_float() {
                    return Err(Error::file(
                        &path,
                        format!(
                            "tensor '{}' is {}, expected a float type (bf16, f16, f32)",
                            w.name,
                            t.dtype()
                        ),
                    ));
                }
                if t.shape() != w.shape.as_slice() {
                    return Err(Error::file(
                        &path,
                        format!(
                            "tensor '{}' has shape {:?}, but {} ({}) makes it {:?}",
                            w.name,
                            t.shape(),
                            HfConfig::FILE_NAME,
                            w.why,
                            w.shape
                        ),
                    ));
                }
                out.insert(w.name.clone(), t.cast(DType::F32));
            }
        }
        Ok(out)
    }
}

/// `[0, 1, 2, 5]` -> `0 to 2, 5`; empty -> `none`.
fn ranges(v: &[usize]) -> String {
    if v.is_empty() {
        return "none".into();
    }
    let mut parts = Vec::new();
    let mut start = v[0];
    let mut prev = v[0];
    for &x in &v[1..] {
        if x != prev + 1 {
            parts.push((start, prev));
            start = x;
        }
        prev = x;
    }
    parts.push((start, prev));
    parts
        .into_iter()
        .map(|(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a} to {b}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn stack(views: &[ndarray::ArrayViewD<'_, f32>], axis: Axis) -> Result<ArrayD<f32>> {
    concatenate(axis, views).map_err(|e| Error::Internal(format!("checkpoint: stacking: {e}")))
}

/// Reads `model.safetensors.index.json`: its `weight_map`, each file a plain name inside the
/// folder.
fn read_index(path: &Path) -> Result<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::file(path, format!("cannot read: {e}")))?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| Error::file(path, format!("not valid JSON: {e}")))?;
    let Some(map) = v.get("weight_map").and_then(Value::as_object) else {
        return Err(Error::file(
            path,
            "no 'weight_map' object (an index maps each tensor name to its file)",
        ));
    };
    let mut out = BTreeMap::new();
    for (name, file) in map {
        let Some(file) = file.as_str() else {
            return Err(Error::file(
                path,
                format!("weight_map['{name}'] = {file} is not a file name"),
            ));
        };
        let plain = Path::new(file)
            .components()
            .all(|c| matches!(c, Component::Normal(_)));
        if !plain || file.is_empty() {
            return Err(Error::file(
                path,
                format!(
                    "weight_map['{name}'] = '{file}' is not accepted: a file name inside the \
                     model folder"
                ),
            ));
        }
        out.insert(name.clone(), file.to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_lists_read_as_ranges() {
        assert_eq!(ranges(&[]), "none");
        assert_eq!(ranges(&[0, 1, 2]), "0 to 2");
        assert_eq!(ranges(&[0, 1, 2, 5, 7, 8]), "0 to 2, 5, 7 to 8");
    }

    #[test]
    fn an_index_naming_files_outside_the_folder_is_refused()
    -> std::result::Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let p = dir.path().join(INDEX_FILE);
        for (text, want) in [
            (
                r#"{"weight_map": {"a": "../x.safetensors"}}"#,
                "a file name inside",
            ),
            (r#"{"weight_map": {"a": "/etc/x"}}"#, "a file name inside"),
            (r#"{"weight_map": {"a": 3}}"#, "is not a file name"),
            (r#"{"metadata": {}}"#, "no 'weight_map'"),
            ("{", "not valid JSON"),
        ] {
            std::fs::write(&p, text)?;
            let m = read_index(&p).expect_err(text).to_string();
            assert!(m.contains(INDEX_FILE) && m.contains(want), "{m}");
        }
        Ok(())
    }
}
