//! Attention forward: O = softmax(scale * Q K^T + mask) V and the log-sum-exp of each row.
//!
//! Q [B, Hq, Nq, D], K and V [B, Hkv, Nkv, D]; Hq a multiple of Hkv (MHA, GQA, MQA): query
//! head h uses kv head h / (Hq / Hkv). Causal masks are aligned bottom-right: query i sees
//! keys j <= i + Nkv - Nq. A query row that sees no key (possible when Nq > Nkv) gets O = 0
//! and LSE = -inf.

use ndarray::ArrayD;
use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorMeta};

/// Parameters of attention.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AttentionParams {
    /// Apply the bottom-right causal mask.
    pub causal: bool,
    /// Softmax scale; `None` means 1/sqrt(D).
    pub scale: Option<f32>,
}

impl Default for AttentionParams {
    fn default() -> Self {
        Self {
            causal: true,
            scale: None,
        }
    }
}

/// Shape of an attention problem, read from validated inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Batch.
    pub b: usize,
    /// Query heads.
    pub hq: usize,
    /// Key/value heads.
    pub hkv: usize,
    /// Query length.
    pub nq: usize,
    /// Key/value length.
    pub nkv: usize,
    /// Head dimension.
    pub d: usize,
}

impl AttentionParams {
    /// The scale in effect for head dimension `d`.
    pub fn scale_for(&self, d: usize) -> f32 {
        self.scale.unwrap_or(1.0 / (d as f32).sqrt())
    }

    /// Reads the problem shape from input metas (validating them).
    pub fn shape(&self, inputs: &[TensorMeta]) -> Result<AttentionShape> {
        let op = "attention";
        let [q, k, v] = inputs else {
            return Err(Error::invalid(op, "takes q, k, v"));
        };
        for (n, m) in [("q", q), ("k", k), ("v", v)] {
            if m.dtype != DType::F32 {
                return Err(Error::invalid(
                    op,
                    format!("{n} is {}, expected f32", m.dtype),
                ));
            }
            if m.shape.len() != 4 {
                return Err(Error::invalid(
                    op,
                    format!("{n} has shape {:?}, expected [B, H, N, D]", m.shape),
                ));
            }
        }
        if k.shape != v.shape {
            return Err(Error::invalid(
                op,
                format!("k {:?} and v {:?} must have one shape", k.shape, v.shape),
            ));
        }
        let (b, hq, nq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
        let (hkv, nkv) = (k.shape[1], k.shape[2]);
        if k.shape[0] != b || k.shape[3] != d {
            return Err(Error::invalid(
                op,
                format!(
                    "q {:?} and k {:?} disagree on batch or head dim",
                    q.shape, k.shape
                ),
            ));
        }
        if b == 0 || hq == 0 || hkv == 0 || d == 0 {
            return Err(Error::invalid(
                op,
                format!(
                    "zero-sized dimension in q {:?} / k {:?}: B, H and D must be > 0",
                    q.shape, k.shape
                ),
            ));
        }
        if hq % hkv != 0 {
            return Err(Error::invalid(
                op,
                format!("query heads {hq} must be a multiple of kv heads {hkv}"),
            ));
        }
        if nkv == 0 && nq > 0 {
            return Err(Error::invalid(op, "kv length is 0 but there are queries"));
        }
        if let Some(s) = self.scale {
            if !s.is_finite() || s <= 0.0 {
                return Err(Error::invalid(
                    op,
                    format!("scale {s} must be finite and > 0"),
                ));
            }
        }
        Ok(AttentionShape {
            b,
            hq,
            hkv,
            nq,
            nkv,
            d,
        })
    }

    /// Output metas: o [B, Hq, Nq, D] and lse [B, Hq, Nq].
    pub fn validate(&self, inputs: &[TensorMeta]) -> Result<Vec<TensorMeta>> {
        let s = self.shape(inputs)?;
        Ok(vec![
            TensorMeta::new(vec![s.b, s.hq, s.nq, s.d], DType::F32),
            TensorMeta::new(vec![s.b, s.hq, s.nq], DType::F32),
        ])
    }

    /// Multiply-adds x2 of QK^T and PV, counting only unmasked pairs when causal.
    pub fn flops(&self, inputs: &[TensorMeta]) -> f64 {
        let Ok(s) = self.shape(inputs) else {
            return 0.0;
        };
        let pairs = visible_pairs(self.causal, s.nq, s.nkv) as f64;
        4.0 * (s.b * s.hq) as f64 * pairs * s.d as f64
    }

    /// CPU f32 implementation.
    pub fn cpu(&self, _inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        Err(Error::Internal("attention cpu pending".into()))
    }

    /// f64 reference.
    pub fn reference(&self, _inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
        Err(Error::Internal("attention reference pending".into()))
    }
}

/// Number of (query, key) pairs a mask lets through.
pub fn visible_pairs(causal: bool, nq: usize, nkv: usize) -> usize {
    if !causal {
        return nq * nkv;
    }
    (0..nq)
        .map(|i| (i + nkv + 1).saturating_sub(nq).min(nkv))
        .sum()
}
