//! Decode attention: a few new queries per sequence against a KV cache.
//!
//! q [B, Hq, Nq, D] holds Nq (1..=16) new queries of each of B sequences; the keys and values
//! of every sequence are in a cache, either
//! - **contiguous**: `k_cache`, `v_cache` [B, Hkv, Nmax, D], sequence b's tokens in rows
//!   `0..seq_lens[b]`, or
//! - **paged** (vLLM's PagedAttention): `k_cache`, `v_cache` [num_blocks, Hkv, block_size, D]
//!   and `block_table` [B, max_blocks] (i32): token t of sequence b is row `t % block_size` of
//!   block `block_table[b, t / block_size]`. Entries past a sequence's last block are not read
//!   (they may be -1).
//!
//! `seq_lens` [B] (i32) gives each sequence's length *including* its Nq new tokens, which are
//! its last Nq positions; so every length must be at least Nq (a sequence of length 0 is an
//! error) and at most the cache's capacity (Nmax, or max_blocks * block_size). The mask is
//! causal within the new tokens (bottom-right): new query i of a sequence of length L sees keys
//! 0..=L-Nq+i, at least one key. Hq is a multiple of Hkv (MHA, GQA, MQA): query head h reads
//! kv head h / (Hq / Hkv). Outputs: o [B, Hq, Nq, D] and the natural-log LSE [B, Hq, Nq].
//!
//! Shapes and dtypes are checked by [`AttentionDecodeParams::validate`] (what planning sees);
//! the *values* of `seq_lens` and `block_table` by the CPU path and the reference, which refuse
//! lengths out of range and block ids outside the cache. The GPU kernels never read outside the
//! cache on such values: they write NaN for that sequence, which fails the run's finite check.

use crate::ops::OutputMetas;
use ndarray::{Array3, Array4, ArrayD};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use smallvec::smallvec;

use super::{CPU_PAR_MIN, expect_inputs, metas, reference_metas};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::sync::Deadline;
use crate::tensor::{Tensor, TensorMeta};

const OP: &str = "attention_decode";

/// Most new queries per sequence.
pub const MAX_NEW_TOKENS: usize = 16;
/// Head dimensions the op takes.
pub const HEAD_DIMS: [usize; 3] = [64, 128, 256];
/// Largest block size of a paged cache.
pub const MAX_BLOCK_SIZE: usize = 1024;

/// Parameters of decode attention.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct AttentionDecodeParams {
    /// Softmax scale; `None` means 1/sqrt(D).
    pub scale: Option<f32>,
    /// Tokens per block of a paged cache (a power of two, 1..=1024); `None`: contiguous cache.
    pub block_size: Option<usize>,
}

/// Shape of a decode problem, read from validated inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeShape {
    /// Sequences.
    pub b: usize,
    /// Query heads.
    pub hq: usize,
    /// Key/value heads.
    pub hkv: usize,
    /// New queries per sequence.
    pub nq: usize,
    /// Head dimension.
    pub d: usize,
    /// Most tokens a sequence may hold: Nmax, or max_blocks * block_size.
    pub capacity: usize,
    /// Paged: blocks in the cache (`None`: contiguous).
    pub num_blocks: Option<usize>,
    /// Paged: block-table entries per sequence.
    pub max_blocks: usize,
    /// Paged: tokens per block (contiguous: Nmax).
    pub block: usize,
}

impl DecodeShape {
    /// Query rows of one kv head of one sequence: (Hq / Hkv) * Nq.
    pub fn group_rows(&self) -> usize {
        self.hq / self.hkv * self.nq
    }
}

impl AttentionDecodeParams {
    /// The scale in effect for head dimension `d`.
    pub fn scale_for(&self, d: usize) -> f32 {
        self.scale.unwrap_or(1.0 / (d as f32).sqrt())
    }

    /// Names of the inputs, in order.
    pub fn input_names(&self) -> &'static [&'static str] {
        if self.block_size.is_some() {
            &["q", "k_cache", "v_cache", "seq_lens", "block_table"]
        } else {
            &["q", "k_cache", "v_cache", "seq_lens"]
        }
    }

    /// Logical dtypes of the inputs, in order.
    pub fn input_dtypes(&self) -> Vec<DType> {
        let mut v = vec![DType::F32, DType::F32, DType::F32, DType::I32];
        if self.block_size.is_some() {
            v.push(DType::I32);
        }
        v
    }

    /// Reads the problem shape from input metas (validating shapes, dtypes and parameters).
    pub fn shape(&self, inputs: &[TensorMeta]) -> Result<DecodeShape> {
        let names = self.input_names();
        expect_inputs(OP, inputs.len(), names)?;
        for ((m, n), want) in inputs.iter().zip(names).zip(self.input_dtypes()) {
            if m.dtype != want {
                return Err(Error::invalid(
                    OP,
                    format!("{n} is {}, expected {want}", m.dtype),
                ));
            }
        }
        let (q, k, v, lens) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3]);
        for (n, m) in [("q", q), ("k_cache", k), ("v_cache", v)] {
            if m.shape.len() != 4 {
                let want = if n == "q" {
                    "[B, Hq, Nq, D]"
                } else if self.block_size.is_some() {
                    "[num_blocks, Hkv, block_size, D]"
                } else {
                    "[B, Hkv, Nmax, D]"
                };
                return Err(Error::invalid(
                    OP,
                    format!("{n} has shape {:?}, expected {want}", m.shape),
                ));
            }
        }
        if k.shape != v.shape {
            return Err(Error::invalid(
                OP,
                format!(
                    "k_cache {:?} and v_cache {:?} must have one shape",
                    k.shape, v.shape
                ),
            ));
        }
        let (b, hq, nq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
        let hkv = k.shape[1];
        if b == 0 || hq == 0 || hkv == 0 {
            return Err(Error::invalid(
                OP,
                format!(
                    "zero-sized dimension in q {:?} / k_cache {:?}: B, Hq and Hkv must be > 0",
                    q.shape, k.shape
                ),
            ));
        }
        if !(1..=MAX_NEW_TOKENS).contains(&nq) {
            return Err(Error::invalid(
                OP,
                format!("{nq} new queries per sequence (accepted: 1..={MAX_NEW_TOKENS})"),
            ));
        }
        if !HEAD_DIMS.contains(&d) {
            return Err(Error::invalid(
                OP,
                format!("head dim {d} (accepted: 64, 128, 256)"),
            ));
        }
        if k.shape[3] != d {
            return Err(Error::invalid(
                OP,
                format!(
                    "q {:?} and k_cache {:?} disagree on the head dim",
                    q.shape, k.shape
                ),
            ));
        }
        if hq % hkv != 0 {
            return Err(Error::invalid(
                OP,
                format!("query heads {hq} must be a multiple of kv heads {hkv}"),
            ));
        }
        if lens.shape[..] != [b] {
            return Err(Error::invalid(
                OP,
                format!(
                    "seq_lens has shape {:?}, expected [{b}] (one per sequence)",
                    lens.shape
                ),
            ));
        }
        if let Some(s) = self.scale {
            if !s.is_finite() || s <= 0.0 {
                return Err(Error::invalid(
                    OP,
                    format!("scale {s} must be finite and > 0"),
                ));
            }
        }
        let shape = match self.block_size {
            None => {
                if k.shape[0] != b {
                    return Err(Error::invalid(
                        OP,
                        format!(
                            "k_cache {:?} holds {} sequences, q {:?} has {b}",
                            k.shape, k.shape[0], q.shape
                        ),
                    ));
                }
                DecodeShape {
                    b,
                    hq,
                    hkv,
                    nq,
                    d,
                    capacity: k.shape[2],
                    num_blocks: None,
                    max_blocks: 0,
                    block: k.shape[2],
                }
            }
            Some(bs) => {
                if !bs.is_power_of_two() || bs > MAX_BLOCK_SIZE {
                    return Err(Error::invalid(
                        OP,
                        format!("block_size {bs} (accepted: a power of two, 1..={MAX_BLOCK_SIZE})"),
                    ));
                }
                if k.shape[2] != bs {
                    return Err(Error::invalid(
                        OP,
                        format!(
                            "k_cache {:?} has blocks of {} tokens, block_size is {bs}",
                            k.shape, k.shape[2]
                        ),
                    ));
                }
                let table = &inputs[4];
                if table.shape.len() != 2 || table.shape[0] != b {
                    return Err(Error::invalid(
                        OP,
                        format!(
                            "block_table has shape {:?}, expected [{b}, max_blocks]",
                            table.shape
                        ),
                    ));
                }
                DecodeShape {
                    b,
                    hq,
                    hkv,
                    nq,
                    d,
                    capacity: table.shape[1] * bs,
                    num_blocks: Some(k.shape[0]),
                    max_blocks: table.shape[1],
                    block: bs,
                }
            }
        };
        if shape.capacity < nq {
            return Err(Error::invalid(
                OP,
                format!(
                    "the cache holds at most {} tokens per sequence, fewer than the {nq} new ones",
                    shape.capacity
                ),
            ));
        }
        Ok(shape)
    }

    /// Output metas: o [B, Hq, Nq, D] and lse [B, Hq, Nq].
    pub fn validate(&self, inputs: &[TensorMeta]) -> Result<OutputMetas> {
        let s = self.shape(inputs)?;
        Ok(smallvec![
            TensorMeta::new([s.b, s.hq, s.nq, s.d], DType::F32),
            TensorMeta::new([s.b, s.hq, s.nq], DType::F32),
        ])
    }

    /// Multiply-adds x2 of QK^T and PV with every sequence at the cache's capacity (the
    /// lengths are values, unknown to a cost model).
    pub fn flops(&self, inputs: &[TensorMeta]) -> f64 {
        let Ok(s) = self.shape(inputs) else {
            return 0.0;
        };
        let pairs: usize = (0..s.nq).map(|i| s.capacity - s.nq + i + 1).sum();
        4.0 * (s.b * s.hq) as f64 * pairs as f64 * s.d as f64
    }

    /// Bytes of the KV cache a run reads with every sequence at the cache's capacity, at
    /// `elem` bytes per element: the floor of a memory-bound decode step.
    pub fn kv_bytes(&self, inputs: &[TensorMeta], elem: usize) -> f64 {
        let Ok(s) = self.shape(inputs) else {
            return 0.0;
        };
        (2 * s.b * s.hkv * s.capacity * s.d * elem) as f64
    }

    /// CPU f32 implementation.
    pub fn cpu(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.cpu_within(inputs, &Deadline::NONE)
    }

    /// CPU f32 implementation, parallel over (sequence, kv head): all Hq/Hkv query heads and
    /// Nq rows of a group go through the cache together (each K/V row read once), with an
    /// online softmax over blocks of keys. Stops with [`Error::Timeout`] once `deadline`
    /// passes (each group looks at it before it starts).
    pub fn cpu_within(&self, inputs: &[&Tensor], deadline: &Deadline) -> Result<Vec<Tensor>> {
        let s = self.shape(&metas(inputs))?;
        let lens: Vec<i32> = inputs[3].as_i32()?.iter().copied().collect();
        let table = match self.block_size {
            Some(_) => Some(inputs[4].as_i32()?.iter().copied().collect::<Vec<i32>>()),
            None => None,
        };
        let lens = check_values(&s, &lens, table.as_deref())?;
        let q = inputs[0].as_f32()?;
        let (k, v) = (inputs[1].as_f32()?, inputs[2].as_f32()?);
        let (q, k, v) = (
            q.as_slice().ok_or_else(not_standard)?,
            k.as_slice().ok_or_else(not_standard)?,
            v.as_slice().ok_or_else(not_standard)?,
        );
        let rows = s.group_rows();
        let scale = self.scale_for(s.d);
        let mut o = vec![0f32; s.b * s.hq * s.nq * s.d];
        let mut lse = vec![0f32; s.b * s.hq * s.nq];
        let group = |bg: usize, o_g: &mut [f32], lse_g: &mut [f32]| {
            if deadline.expired() {
                return;
            }
            let (b, g) = (bg / s.hkv, bg % s.hkv);
            let offset = |t: usize| -> usize {
                match &table {
                    None => ((b * s.hkv + g) * s.capacity + t) * s.d,
                    Some(tb) => {
                        let blk = tb[b * s.max_blocks + t / s.block] as usize;
                        ((blk * s.hkv + g) * s.block + t % s.block) * s.d
                    }
                }
            };
            let q_g = &q[bg * rows * s.d..(bg + 1) * rows * s.d];
            decode_group(&s, scale, lens[b], q_g, k, v, &offset, o_g, lse_g);
        };
        let work: usize = lens.iter().sum::<usize>() * s.hq * s.nq * s.d;
        let o_chunks = o.chunks_mut(rows * s.d).zip(lse.chunks_mut(rows));
        if work < CPU_PAR_MIN {
            for (bg, (o_g, lse_g)) in o_chunks.enumerate() {
                group(bg, o_g, lse_g);
            }
        } else {
            o.par_chunks_mut(rows * s.d)
                .zip(lse.par_chunks_mut(rows))
                .enumerate()
                .for_each(|(bg, (o_g, lse_g))| group(bg, o_g, lse_g));
        }
        deadline.check("attention_decode on the CPU")?;
        Ok(vec![
            Tensor::from_vec_f32(&[s.b, s.hq, s.nq, s.d], o)?,
            Tensor::from_vec_f32(&[s.b, s.hq, s.nq], lse)?,
        ])
    }

    /// f64 reference: for each query row, its scores against every key it sees (found through
    /// the cache layout directly), their softmax and the weighted sum of the values.
    pub fn reference(&self, inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
        let s = self.shape(&reference_metas(inputs, &self.input_dtypes()))?;
        let as_ints = |a: &ArrayD<f64>, what: &str| -> Result<Vec<i32>> {
            a.iter()
                .map(|&x| {
                    if x.fract() == 0.0 && x >= i32::MIN as f64 && x <= i32::MAX as f64 {
                        Ok(x as i32)
                    } else {
                        Err(Error::invalid(OP, format!("{what} holds {x}, not an i32")))
                    }
                })
                .collect()
        };
        let lens = as_ints(&inputs[3], "seq_lens")?;
        let table = match self.block_size {
            Some(_) => Some(as_ints(&inputs[4], "block_table")?),
            None => None,
        };
        let lens = check_values(&s, &lens, table.as_deref())?;
        let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
        let scale = self.scale.map_or(1.0 / (s.d as f64).sqrt(), f64::from);
        let ratio = s.hq / s.hkv;
        let mut o = Array4::<f64>::zeros((s.b, s.hq, s.nq, s.d));
        let mut lse = Array3::<f64>::zeros((s.b, s.hq, s.nq));
        for b in 0..s.b {
            for h in 0..s.hq {
                let g = h / ratio;
                for i in 0..s.nq {
                    let seen = lens[b] - s.nq + i + 1;
                    // (block or sequence, row within it) of token t
                    let at = |t: usize| -> (usize, usize) {
                        match &table {
                            None => (b, t),
                            Some(tb) => (tb[b * s.max_blocks + t / s.block] as usize, t % s.block),
                        }
                    };
                    let mut scores = Vec::with_capacity(seen);
                    for t in 0..seen {
                        let (n, r) = at(t);
                        let mut dot = 0.0;
                        for e in 0..s.d {
                            dot += q[[b, h, i, e]] * k[[n, g, r, e]];
                        }
                        scores.push(scale * dot);
                    }
                    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
                    let sum: f64 = w.iter().sum();
                    for (t, wt) in w.iter().enumerate() {
                        let (n, r) = at(t);
                        for e in 0..s.d {
                            o[[b, h, i, e]] += wt / sum * v[[n, g, r, e]];
                        }
                    }
                    lse[[b, h, i]] = m + sum.ln();
                }
            }
        }
        Ok(vec![o.into_dyn(), lse.into_dyn()])
    }
}

fn not_standard() -> Error {
    Error::Internal("attention_decode: array not in standard layout".into())
}

/// Checks the values of `seq_lens` (Nq..=capacity each) and, paged, of the block-table entries
/// each sequence uses (0..num_blocks); returns the lengths.
pub fn check_values(s: &DecodeShape, lens: &[i32], table: Option<&[i32]>) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(lens.len());
    for (b, &l) in lens.iter().enumerate() {
        if l < s.nq as i32 || l as i64 > s.capacity as i64 {
            return Err(Error::invalid(
                OP,
                format!(
                    "seq_lens[{b}] = {l}: a length counts the {} new tokens and fits the cache \
                     (accepted: {}..={})",
                    s.nq, s.nq, s.capacity
                ),
            ));
        }
        let l = l as usize;
        if let (Some(tb), Some(nb)) = (table, s.num_blocks) {
            for j in 0..l.div_ceil(s.block) {
                let id = tb[b * s.max_blocks + j];
                if id < 0 || id as usize >= nb {
                    return Err(Error::invalid(
                        OP,
                        format!(
                            "block_table[{b}, {j}] = {id} is not a block of the cache \
                             (accepted: 0..{nb})"
                        ),
                    ));
                }
            }
        }
        out.push(l);
    }
    Ok(out)
}

/// Keys per step of the CPU online softmax.
const BLOCK_K: usize = 64;

/// One (sequence, kv head) group on the CPU: `q` holds its `rows` query rows ([Hq/Hkv, Nq, D]
/// flattened), `offset(t)` the element offset of token t's K/V row in `k`/`v`.
#[allow(clippy::too_many_arguments)]
fn decode_group(
    s: &DecodeShape,
    scale: f32,
    len: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    offset: &dyn Fn(usize) -> usize,
    o: &mut [f32],
    lse: &mut [f32],
) {
    let (d, rows) = (s.d, s.group_rows());
    // keys row r sees: its query index is r % Nq
    let seen = |r: usize| len - s.nq + r % s.nq + 1;
    let mut m = vec![f32::NEG_INFINITY; rows];
    let mut l = vec![0f32; rows];
    let mut acc = vec![0f32; rows * d];
    let mut scores = vec![0f32; rows * BLOCK_K];
    let mut offs = vec![0usize; BLOCK_K];
    for j0 in (0..len).step_by(BLOCK_K) {
        let n = BLOCK_K.min(len - j0);
        for (t, off) in offs[..n].iter_mut().enumerate() {
            *off = offset(j0 + t);
        }
        for r in 0..rows {
            let visible = seen(r).saturating_sub(j0).min(n);
            if visible == 0 {
                continue;
            }
            let qr = &q[r * d..(r + 1) * d];
            let sr = &mut scores[r * BLOCK_K..r * BLOCK_K + visible];
            for (x, &off) in sr.iter_mut().zip(&offs[..visible]) {
                *x = scale * dot(qr, &k[off..off + d]);
            }
            let mx = sr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let m_new = m[r].max(mx);
            let corr = (m[r] - m_new).exp();
            let mut sum = 0f32;
            for x in sr.iter_mut() {
                *x = (*x - m_new).exp();
                sum += *x;
            }
            l[r] = l[r] * corr + sum;
            m[r] = m_new;
            let ar = &mut acc[r * d..(r + 1) * d];
            if corr != 1.0 {
                ar.iter_mut().for_each(|a| *a *= corr);
            }
            for (&p, &off) in sr.iter().zip(&offs[..visible]) {
                for (a, &vv) in ar.iter_mut().zip(&v[off..off + d]) {
                    *a += p * vv;
                }
            }
        }
    }
    for r in 0..rows {
        let inv = 1.0 / l[r];
        for (dst, &a) in o[r * d..(r + 1) * d]
            .iter_mut()
            .zip(&acc[r * d..(r + 1) * d])
        {
            *dst = a * inv;
        }
        lse[r] = m[r] + l[r].ln();
    }
}

/// Dot product in 8 lanes (so the compiler vectorises it).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(shape: &[usize], dtype: DType) -> TensorMeta {
        TensorMeta::new(shape, dtype)
    }

    #[test]
    fn shapes_are_checked_with_the_accepted_values_named() {
        let f = |s: &[usize]| meta(s, DType::F32);
        let i = |s: &[usize]| meta(s, DType::I32);
        let p = AttentionDecodeParams::default();
        let ok = [
            f(&[2, 8, 1, 64]),
            f(&[2, 2, 40, 64]),
            f(&[2, 2, 40, 64]),
            i(&[2]),
        ];
        let s = p.shape(&ok).expect("valid");
        assert_eq!((s.capacity, s.group_rows()), (40, 4));
        let bad = |ins: &[TensorMeta], p: AttentionDecodeParams, want: &str| {
            let e = p.shape(ins).expect_err(want).to_string();
            assert!(e.contains(want), "{e}");
        };
        bad(
            &[
                f(&[2, 8, 17, 64]),
                f(&[2, 2, 40, 64]),
                f(&[2, 2, 40, 64]),
                i(&[2]),
            ],
            p,
            "accepted: 1..=16",
        );
        bad(
            &[
                f(&[2, 8, 1, 96]),
                f(&[2, 2, 40, 96]),
                f(&[2, 2, 40, 96]),
                i(&[2]),
            ],
            p,
            "accepted: 64, 128, 256",
        );
        bad(
            &[
                f(&[2, 6, 1, 64]),
                f(&[2, 4, 40, 64]),
                f(&[2, 4, 40, 64]),
                i(&[2]),
            ],
            p,
            "multiple of kv heads",
        );
        bad(
            &[
                f(&[2, 8, 1, 64]),
                f(&[2, 2, 40, 64]),
                f(&[2, 2, 40, 64]),
                f(&[2]),
            ],
            p,
            "seq_lens is f32, expected i32",
        );
        bad(&ok[..3], p, "takes 4 inputs");
        let paged = AttentionDecodeParams {
            block_size: Some(16),
            ..p
        };
        let pin = [
            f(&[2, 8, 3, 64]),
            f(&[9, 2, 16, 64]),
            f(&[9, 2, 16, 64]),
            i(&[2]),
            i(&[2, 5]),
        ];
        let s = paged.shape(&pin).expect("paged");
        assert_eq!((s.capacity, s.num_blocks, s.max_blocks), (80, Some(9), 5));
        bad(
            &pin,
            AttentionDecodeParams {
                block_size: Some(12),
                ..p
            },
            "power of two",
        );
        bad(
            &pin,
            AttentionDecodeParams {
                block_size: Some(32),
                ..p
            },
            "blocks of 16 tokens",
        );
    }

    #[test]
    fn values_out_of_range_are_refused() {
        let s = DecodeShape {
            b: 2,
            hq: 2,
            hkv: 1,
            nq: 3,
            d: 64,
            capacity: 32,
            num_blocks: Some(4),
            max_blocks: 2,
            block: 16,
        };
        let table = [0, 1, 2, -1];
        assert_eq!(
            check_values(&s, &[17, 16], Some(&table)).expect("valid"),
            vec![17, 16]
        );
        let e = check_values(&s, &[2, 16], Some(&table)).expect_err("short");
        assert!(e.to_string().contains("seq_lens[0] = 2"), "{e}");
        let e = check_values(&s, &[3, 33], Some(&table)).expect_err("long");
        assert!(e.to_string().contains("accepted: 3..=32"), "{e}");
        let e = check_values(&s, &[3, 17], Some(&table)).expect_err("block -1");
        assert!(e.to_string().contains("block_table[1, 1] = -1"), "{e}");
        let e = check_values(&s, &[3, 3], Some(&[0, 0, 4, 0])).expect_err("block 4");
        assert!(e.to_string().contains("accepted: 0..4"), "{e}");
    }
}
