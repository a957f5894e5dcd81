//! transformers' `config.json`: every size of a Mixtral model ([`HfConfig`]), and for a lone
//! layer file the settings the weights cannot tell (head count, experts per token, RoPE
//! theta, RMSNorm epsilon). [`HfConfig::model_sizes`] requires what a whole model needs.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::MixtralConfig;
use super::model::ModelSizes;
use crate::error::{Error, Result};

/// The settings of a transformers `config.json` that tandem reads; a key the file leaves out
/// (or sets to `null`) is `None` and keeps the value it is applied to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HfConfig {
    /// `num_attention_heads`.
    pub heads: Option<usize>,
    /// `num_experts_per_tok`.
    pub top_k: Option<usize>,
    /// `rope_theta` (or `rope_parameters.rope_theta`, where newer transformers put it).
    pub rope_theta: Option<f64>,
    /// `rms_norm_eps`.
    pub rms_eps: Option<f32>,
    /// `hidden_size`.
    pub hidden: Option<usize>,
    /// `num_key_value_heads`.
    pub kv_heads: Option<usize>,
    /// `intermediate_size` (one expert's FFN size).
    pub ffn: Option<usize>,
    /// `num_local_experts`.
    pub experts: Option<usize>,
    /// `num_hidden_layers`.
    pub layers: Option<usize>,
    /// `vocab_size`.
    pub vocab: Option<usize>,
    /// `head_dim` (where given; tandem needs it to be hidden_size / num_attention_heads).
    pub head_dim: Option<usize>,
    /// `tie_word_embeddings`: the LM head is the embedding matrix (no `lm_head.weight` stored).
    pub tie_word_embeddings: Option<bool>,
}

impl HfConfig {
    /// The file's name in a checkpoint's folder.
    pub const FILE_NAME: &'static str = "config.json";

    /// Where the `config.json` of a weights file would be: in the same folder.
    pub fn path_beside(weights: impl AsRef<Path>) -> PathBuf {
        weights
            .as_ref()
            .parent()
            .unwrap_or_else(|| Path::new(""))
            .join(Self::FILE_NAME)
    }

    /// The `config.json` beside a weights file: `None` when there is none; an error naming
    /// the file (and the key) when it cannot be read or holds a bad value.
    pub fn beside(weights: impl AsRef<Path>) -> Result<Option<Self>> {
        let path = Self::path_beside(weights);
        match std::fs::read_to_string(&path) {
            Ok(text) => Self::parse(&text, &path).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::file(&path, format!("cannot read: {e}"))),
        }
    }

    /// Reads a `config.json`.
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::file(path, format!("cannot read: {e}")))?;
        Self::parse(&text, path)
    }

    /// Parses the text of a `config.json`; `path` names the file in errors. Unknown keys are
    /// ignored (the file describes the whole model).
    pub fn parse(text: &str, path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let v: Value = serde_json::from_str(text)
            .map_err(|e| Error::file(path, format!("not valid JSON: {e}")))?;
        if !v.is_object() {
            return Err(Error::file(path, "not a JSON object"));
        }
        let get = |key: &str| v.get(key).filter(|x| !x.is_null());
        let bad = |key: &str, value: &Value, accepted: &str| {
            Error::file(path, format!("{key} = {value} is not accepted: {accepted}"))
        };
        let count = |key: &str| -> Result<Option<usize>> {
            let Some(x) = get(key) else { return Ok(None) };
            whole(x)
                .filter(|n| *n >= 1)
                .map(Some)
                .ok_or_else(|| bad(key, x, "must be a whole number >= 1"))
        };
        let theta = match get("rope_theta") {
            Some(x) => Some(("rope_theta", x)),
            None => v
                .get("rope_parameters")
                .and_then(|p| p.get("rope_theta"))
                .filter(|x| !x.is_null())
                .map(|x| ("rope_parameters.rope_theta", x)),
        };
        let rope_theta = match theta {
            None => None,
            Some((key, x)) => Some(
                x.as_f64()
                    .filter(|t| t.is_finite() && *t > 1.0)
                    .ok_or_else(|| bad(key, x, "must be a number > 1"))?,
            ),
        };
        let rms_eps = match get("rms_norm_eps") {
            None => None,
            Some(x) => Some(
                x.as_f64()
                    .map(|e| e as f32)
                    .filter(|e| e.is_finite() && *e >= 0.0)
                    .ok_or_else(|| bad("rms_norm_eps", x, "must be a number >= 0"))?,
            ),
        };
        let tie_word_embeddings = match get("tie_word_embeddings") {
            None => None,
            Some(x) => Some(
                x.as_bool()
                    .ok_or_else(|| bad("tie_word_embeddings", x, "must be true or false"))?,
            ),
        };
        Ok(Self {
            tie_word_embeddings,
            heads: count("num_attention_heads")?,
            top_k: count("num_experts_per_tok")?,
            rope_theta,
            rms_eps,
            hidden: count("hidden_size")?,
            kv_heads: count("num_key_value_heads")?,
            ffn: count("intermediate_size")?,
            experts: count("num_local_experts")?,
            layers: count("num_hidden_layers")?,
            vocab: count("vocab_size")?,
            head_dim: count("head_dim")?,
        })
    }

    /// Every size of a whole model, as [`ModelSizes`]: a key the file lacks is an error
    /// naming the file and the key (`path` names the file).
    pub fn model_sizes(&self, path: impl AsRef<Path>) -> Result<ModelSizes> {
        let path = path.as_ref();
        fn need<T: Copy>(path: &Path, key: &str, v: Option<T>) -> Result<T> {
            v.ok_or_else(|| {
                Error::file(
                    path,
                    format!(
                        "missing key '{key}' (a Mixtral model's config.json gives hidden_size, \
                         num_attention_heads, num_key_value_heads, intermediate_size, \
                         num_local_experts, num_experts_per_tok, num_hidden_layers, \
                         rms_norm_eps, rope_theta and vocab_size)"
                    ),
                )
            })
        }
        let s = ModelSizes {
            hidden: need(path, "hidden_size", self.hidden)?,
            heads: need(path, "num_attention_heads", self.heads)?,
            kv_heads: need(path, "num_key_value_heads", self.kv_heads)?,
            ffn: need(path, "intermediate_size", self.ffn)?,
            experts: need(path, "num_local_experts", self.experts)?,
            top_k: need(path, "num_experts_per_tok", self.top_k)?,
            layers: need(path, "num_hidden_layers", self.layers)?,
            rms_eps: need(path, "rms_norm_eps", self.rms_eps)?,
            rope_theta: need(path, "rope_theta", self.rope_theta)?,
            vocab: need(path, "vocab_size", self.vocab)?,
        };
        if let Some(d) = self.head_dim
            && d * s.heads != s.hidden
        {
            return Err(Error::file(
                path,
                format!(
                    "head_dim = {d} is not accepted: tandem needs head_dim * num_attention_heads \
                     = hidden_size ({} * {} != {})",
                    d, s.heads, s.hidden
                ),
            ));
        }
        Ok(s)
    }

    /// Sets the values the file gave in `c`, leaving the others.
    pub fn apply(&self, c: &mut MixtralConfig) {
        if let Some(h) = self.heads {
            c.heads = h;
        }
        if let Some(k) = self.top_k {
            c.top_k = k;
        }
        if let Some(t) = self.rope_theta {
            c.rope_theta = t;
        }
        if let Some(e) = self.rms_eps {
            c.rms_eps = e;
        }
    }
}

/// A JSON number that is a whole, non-negative value (`32` or `32.0`).
fn whole(x: &Value) -> Option<usize> {
    if let Some(n) = x.as_u64() {
        return usize::try_from(n).ok();
    }
    let f = x.as_f64()?;
    (f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f <= u32::MAX as f64).then_some(f as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    const MIXTRAL: &str = r#"{
        "architectures": ["MixtralForCausalLM"],
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_experts_per_tok": 2,
        "num_local_experts": 8,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-05,
        "rope_scaling": null
    }"#;

    #[test]
    fn reads_the_settings_the_weights_cannot_tell() -> Result<()> {
        let h = HfConfig::parse(MIXTRAL, "m/config.json")?;
        assert_eq!(
            h,
            HfConfig {
                heads: Some(32),
                top_k: Some(2),
                rope_theta: Some(1e6),
                rms_eps: Some(1e-5),
                hidden: Some(4096),
                kv_heads: Some(8),
                experts: Some(8),
                ..HfConfig::default()
            }
        );
        let mut c = MixtralConfig::default();
        h.apply(&mut c);
        assert_eq!(
            (c.heads, c.top_k, c.rope_theta, c.rms_eps),
            (32, 2, 1e6, 1e-5)
        );
        assert_eq!(c.d_model, MixtralConfig::default().d_model);
        // Left out or null: nothing changes.
        let h = HfConfig::parse(r#"{"rope_theta": null}"#, "config.json")?;
        assert_eq!(h, HfConfig::default());
        let mut c2 = MixtralConfig::default();
        h.apply(&mut c2);
        assert_eq!(c2, MixtralConfig::default());
        // Newer transformers nest the theta; whole floats count as whole numbers.
        let h = HfConfig::parse(
            r#"{"num_attention_heads": 16.0, "rope_parameters": {"rope_theta": 5e5}}"#,
            "config.json",
        )?;
        assert_eq!((h.heads, h.rope_theta), (Some(16), Some(5e5)));
        Ok(())
    }

    #[test]
    fn a_whole_model_needs_every_size() -> Result<()> {
        let full = r#"{"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 96, "num_local_experts": 8, "num_experts_per_tok": 2,
            "num_hidden_layers": 3, "rms_norm_eps": 1e-6, "vocab_size": 100,
            "rope_parameters": {"rope_theta": 1e6}, "head_dim": 16}"#;
        let s = HfConfig::parse(full, "m/config.json")?.model_sizes("m/config.json")?;
        assert_eq!((s.hidden, s.heads, s.kv_heads, s.ffn), (64, 4, 2, 96));
        assert_eq!((s.experts, s.top_k, s.layers, s.vocab), (8, 2, 3, 100));
        assert_eq!((s.rms_eps, s.rope_theta), (1e-6, 1e6));
        let m = HfConfig::parse(
            &full.replace("\"head_dim\": 16", "\"head_dim\": 32"),
            "m/config.json",
        )?
        .model_sizes("m/config.json")
        .expect_err("head_dim 32")
        .to_string();
        assert!(m.contains("m/config.json: head_dim = 32"), "{m}");
        let m = HfConfig::parse(MIXTRAL, "m/config.json")?
            .model_sizes("m/config.json")
            .expect_err("no intermediate_size")
            .to_string();
        assert!(
            m.contains("m/config.json: missing key 'intermediate_size'"),
            "{m}"
        );
        Ok(())
    }

    #[test]
    fn bad_values_name_the_file_and_the_key() {
        for (text, key) in [
            (r#"{"num_attention_heads": 0}"#, "num_attention_heads = 0"),
            (
                r#"{"num_attention_heads": 32.5}"#,
                "num_attention_heads = 32.5",
            ),
            (
                r#"{"num_attention_heads": "32"}"#,
                "num_attention_heads = \"32\"",
            ),
            (r#"{"num_experts_per_tok": -2}"#, "num_experts_per_tok = -2"),
            (r#"{"rope_theta": 0.5}"#, "rope_theta = 0.5"),
            (
                r#"{"rope_parameters": {"rope_theta": "big"}}"#,
                "rope_parameters.rope_theta = \"big\"",
            ),
            (r#"{"rms_norm_eps": -1e-6}"#, "rms_norm_eps = -1e-6"),
        ] {
            let e = HfConfig::parse(text, "ckpt/config.json").expect_err(text);
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            let m = e.to_string();
            assert!(m.starts_with("ckpt/config.json: "), "{m}");
            assert!(m.contains(key) && m.contains("is not accepted"), "{m}");
        }
        for text in ["{", "[1, 2]"] {
            let m = HfConfig::parse(text, "ckpt/config.json")
                .expect_err(text)
                .to_string();
            assert!(m.starts_with("ckpt/config.json: not"), "{m}");
        }
    }

    #[test]
    fn found_beside_the_weights_or_not_at_all()
    -> std::result::Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let weights = dir.path().join("layer.safetensors");
        assert_eq!(HfConfig::beside(&weights)?, None);
        std::fs::write(dir.path().join("config.json"), MIXTRAL)?;
        assert_eq!(HfConfig::beside(&weights)?.and_then(|h| h.heads), Some(32));
        assert_eq!(
            HfConfig::read(dir.path().join("config.json"))?.top_k,
            Some(2)
        );
        assert_eq!(
            HfConfig::path_beside("layer.safetensors"),
            Path::new("config.json")
        );
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"rms_norm_eps": "tiny"}"#,
        )?;
        let m = HfConfig::beside(&weights).expect_err("bad eps").to_string();
        assert!(m.contains("config.json: rms_norm_eps = \"tiny\""), "{m}");
        Ok(())
    }
}
