//! The sizes of a Mixtral decoder layer ([`MixtralConfig`]) and the TOML workload file that
//! gives them ([`WorkloadFile`]: a `[mixtral]` table and a layer count).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::limits::{self, Limits};
use crate::ops::moe::MAX_EXPERTS;

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

/// A workload file: `[mixtral]` holds a [`MixtralConfig`] (any key may be left out); the
/// top-level `layers = N` makes it a model of N such layers chained (default 1).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadFile {
    /// Name shown in reports.
    #[serde(default)]
    pub name: Option<String>,
    /// Decoder layers, chained (`None`: 1).
    #[serde(default)]
    pub layers: Option<usize>,
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
        if w.layers == Some(0) {
            return Err(Error::file(
                path,
                "layers = 0 is not accepted: must be at least 1",
            ));
        }
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

#[cfg(test)]
impl MixtralConfig {
    /// A small layer for unit tests: 16 tokens, d_model 64, 4 heads over 2 KV heads, 4 experts
    /// (top-2) of ffn 32.
    pub(crate) fn tiny() -> Self {
        Self {
            seq_len: 16,
            d_model: 64,
            heads: 4,
            kv_heads: 2,
            experts: 4,
            top_k: 2,
            ffn: 32,
            ..Self::default()
        }
    }
}
