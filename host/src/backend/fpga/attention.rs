//! `attention` on the streaming attention kernel (`tandem_fpga::kernels::attention`), one
//! launch per (batch, GQA group) and K/V range (`tandem_fpga::drive::run_attention_split`:
//! the query heads of a kv head in one launch sharing one K/V load; any number of keys, split
//! into ranges of the build's `nkv_max` whose parts are merged per row).
//!
//! At the boundary the tensors are quantised to int8 per tensor (symmetric, `max|x| / 127`,
//! as `fpga::golden::attention` is specified and tested): the query planes of a GQA group
//! (the heads h with the same kv head h / (Hq / Hkv)) with one scale, so they share one
//! score multiplier and one launch, and the key and value planes of each kv head (written to
//! the card once; the driver pads the head dimension to a multiple of 8). The softmax scale goes into the kernel's score multiplier
//! (`AttentionConfig::score_multiplier(scale, sq, sk)`); o comes back as int16 in units of
//! `sv / 256` and is dequantised; `lse` is computed from the kernel's per-row running
//! exponent and sum, `ln 2 (e + log2(l / 2^15))` (`AttentionOut::lse`), -inf for rows that
//! see no key, so nothing of the op is computed on the host but the (de)quantisation.

use std::time::Duration;

use tandem_fpga::golden::attention::{AttentionConfig, AttentionOut};
use tandem_fpga::golden::gemm as gq;
use tandem_fpga::kernels::attention::AttentionCore;
use tandem_fpga::kernels::gemm::pad8;
use tandem_fpga::timing::{self, MemTiming};
use tandem_fpga::{FpgaDevice, FpgaError, RunStats, drive};

use super::Support;
use crate::error::{Error, Result};
use crate::ops::AttentionParams;
use crate::ops::attention::AttentionShape;
use crate::tensor::{Tensor, TensorMeta};

/// Kernel name reported for attention (o and lse both from the kernel).
pub const ATTENTION_KERNEL: &str = "attention_int8_stream";

/// Largest attention the RTL simulation takes, in estimated kernel cycles summed over the
/// heads ([`estimate_cycles`]): a few seconds of simulation.
pub const MAX_SIM_CYCLES: u64 = 1 << 22;

/// Largest attention the modelled card takes (the golden model's time on the host: about
/// `d` operations per visible pair and head).
pub const MAX_MODEL_CYCLES: u64 = 1 << 34;

/// The attention builds the backend loads (each on its own card, at its first launch),
/// smallest first: 64 + 64, 128 + 128 and 256 + 256 MAC lanes (head dim up to 64, 128 and
/// 256), all with 512 keys on chip per launch (longer K/V runs as several launches) and
/// 16-key softmax tiles. A launch uses the smallest that takes its (padded) head dimension,
/// so the MAC arrays stay as busy as the shape allows.
pub fn builds() -> [(&'static str, AttentionCore); 3] {
    let core = |d_max| AttentionCore {
        d_max,
        nkv_max: 512,
        kv_tile: 16,
        q_rows: 1,
    };
    [
        ("attention_d64", core(64)),
        ("attention_d128", core(128)),
        ("attention_d256", core(256)),
    ]
}

/// The attention builds of a simulated card's profile: [`builds`] for `ci`; for `u55c` the
/// query-parallel card builds (2,048 MACs each: d_max 64 x 16 query rows, 128 x 8, 256 x 4;
/// 4,096 keys on chip per launch). Same numerics, so the same bits, as the `ci` builds.
pub fn builds_for(profile: crate::options::SimProfile) -> [(&'static str, AttentionCore); 3] {
    match profile {
        crate::options::SimProfile::Ci => builds(),
        crate::options::SimProfile::U55c => {
            let core = |d_max, q_rows| AttentionCore {
                d_max,
                nkv_max: 4096,
                kv_tile: 16,
                q_rows,
            };
            [
                ("attention_d64_r16", core(64, 16)),
                ("attention_d128_r8", core(128, 8)),
                ("attention_d256_r4", core(256, 4)),
            ]
        }
    }
}

/// The build head dims up to 64 (the default layer's) run on.
pub fn default_core() -> AttentionCore {
    builds()[0].1
}

/// The smallest build of `builds` whose `d_max` takes head dim `d` (padded to 8).
pub fn pick(
    builds: &[(&'static str, AttentionCore)],
    d: usize,
) -> Option<(&'static str, AttentionCore)> {
    builds
        .iter()
        .filter(|(_, c)| pad8(d) <= c.d_max as usize)
        .min_by_key(|(_, c)| c.d_max)
        .copied()
}

/// Estimated kernel cycles of the whole op on `core` as the driver runs it (one launch per
/// GQA group of at most `drive::attention::MAX_GROUP` heads and K/V range):
/// `tandem_fpga::timing::attention_split_cycles` (within 5% of the RTL's cycles).
pub fn estimate_cycles(core: &AttentionCore, causal: bool, s: &AttentionShape) -> u64 {
    let group = (s.hq / s.hkv.max(1)).max(1);
    let per = group.min(drive::attention::MAX_GROUP);
    let groups = (s.b * s.hkv * group.div_ceil(per)) as u64;
    timing::attention_split_cycles(
        core,
        s.nq as u64,
        s.nkv as u64,
        pad8(s.d) as u64,
        causal,
        groups,
        per as u64,
        &MemTiming::default(),
    )
}

/// Whether one of `builds` takes this attention.
pub fn support(
    builds: &[(&'static str, AttentionCore)],
    p: &AttentionParams,
    inputs: &[TensorMeta],
    max_cycles: u64,
) -> Support {
    let s = match p.shape(inputs) {
        Ok(s) => s,
        Err(e) => return Support::No(format!("invalid attention inputs: {e}")),
    };
    let dp = pad8(s.d);
    let Some((_, core)) = pick(builds, s.d) else {
        let largest = builds.iter().map(|(_, c)| c.d_max).max().unwrap_or(0);
        return Support::No(format!(
            "head dim {} (padded to {dp}) exceeds the largest attention build's d_max = \
             {largest}",
            s.d
        ));
    };
    // K/V longer than the build's nkv_max runs as several launches (merged per row)
    if s.nq.saturating_mul(drive::attention::MAX_GROUP) > 1 << 30 || s.nkv > 1 << 30 {
        return Support::No(format!(
            "query length {} or kv length {} is beyond the kernel's 2^30 rows per launch",
            s.nq, s.nkv
        ));
    }
    let cycles = estimate_cycles(&core, p.causal, &s);
    if cycles > max_cycles {
        return Support::No(format!(
            "about {cycles} kernel cycles is more than the simulated card runs quickly \
             ({max_cycles}; the modelled card takes more: --fpga-sim-mode model or auto)"
        ));
    }
    Support::Native
}

/// One attention op, quantised for the kernel: int8 K and V per (batch, kv head) with V's
/// scale, int8 q per (batch, query head) with its score multiplier, in output order.
pub(super) struct AttentionJob {
    outs: Vec<TensorMeta>,
    s: AttentionShape,
    causal: bool,
    /// Per (batch, kv head): int8 K and V `[Nkv][D]` and V's scale.
    kv: Vec<(Vec<i8>, Vec<i8>, f32)>,
    /// Per (batch, query head): int8 q `[Nq][D]`, its kv head, score multiplier and shift.
    heads: Vec<(Vec<i8>, usize, u16, u8)>,
}

impl AttentionJob {
    /// Quantises the op's inputs (each plane to int8 per tensor; K and V once per kv head).
    pub(super) fn new(p: &AttentionParams, inputs: &[&Tensor]) -> Result<Self> {
        let metas: Vec<TensorMeta> = inputs.iter().map(|t| t.meta()).collect();
        let outs = p.validate(&metas)?;
        let s = p.shape(&metas)?;
        let flat = |i: usize| -> Result<Vec<f32>> {
            let v: Vec<f32> = inputs[i].as_f32()?.iter().copied().collect();
            if let Some(pos) = v.iter().position(|x| !x.is_finite()) {
                let name = ["q", "k", "v"][i];
                return Err(Error::invalid(
                    "attention",
                    format!(
                        "{name} element {pos} is not finite (the int8 kernel needs finite inputs)"
                    ),
                ));
            }
            Ok(v)
        };
        let (q, k, v) = (flat(0)?, flat(1)?, flat(2)?);
        let (qp, kvp) = (s.nq * s.d, s.nkv * s.d);
        let kv: Vec<(Vec<i8>, Vec<i8>, f32, f32)> = (0..s.b * s.hkv)
            .map(|i| {
                let (kq, sk) = gq::quantize_per_tensor(&k[i * kvp..(i + 1) * kvp]);
                let (vq, sv) = gq::quantize_per_tensor(&v[i * kvp..(i + 1) * kvp]);
                (kq, vq, sk, sv)
            })
            .collect();
        let group = s.hq / s.hkv;
        let scale = f64::from(p.scale_for(s.d));
        let mut heads = Vec::with_capacity(s.b * s.hq);
        for b in 0..s.b {
            for h in 0..s.hq {
                let plane = b * s.hq + h;
                // one scale for the query planes of the group, so they share a launch
                let g0 = b * s.hq + h / group * group;
                let sq = gq::scale_of(&q[g0 * qp..(g0 + group) * qp]);
                let qq: Vec<i8> = q[plane * qp..(plane + 1) * qp]
                    .iter()
                    .map(|&x| gq::quantize_value(x, sq))
                    .collect();
                let kvi = b * s.hkv + h / group;
                let sk = kv[kvi].2;
                let (mult, shift) =
                    AttentionConfig::score_multiplier(scale, f64::from(sq), f64::from(sk))
                        .map_err(|e| {
                            Error::invalid(
                                "attention",
                                format!(
                                    "batch {b} head {h}: {e} (scale {scale} x max|q| x max|k| \
                                     is beyond the kernel's score multiplier)"
                                ),
                            )
                        })?;
                heads.push((qq, kvi, mult, shift));
            }
        }
        Ok(Self {
            outs: outs.into_vec(),
            s,
            causal: p.causal,
            kv: kv.into_iter().map(|(k, v, _, sv)| (k, v, sv)).collect(),
            heads,
        })
    }

    /// Whether there is nothing to launch: no query rows, or no keys (every row sees none).
    pub(super) fn is_empty(&self) -> bool {
        self.s.nq == 0 || self.s.nkv == 0
    }

    /// Runs every head on `dev` (loaded with the build `core`): one launch per GQA group and
    /// K/V range of at most `core.nkv_max` keys, each kv head's K and V written once.
    pub(super) fn run(
        &self,
        dev: &mut dyn FpgaDevice,
        core: &AttentionCore,
        timeout: Duration,
    ) -> std::result::Result<(Vec<AttentionOut>, RunStats), FpgaError> {
        let dims = drive::AttentionDims {
            nq: self.s.nq,
            nkv: self.s.nkv,
            d: self.s.d,
            causal: self.causal,
        };
        let kv: Vec<drive::KvHead<'_>> = self
            .kv
            .iter()
            .map(|(k, v, _)| drive::KvHead { k, v })
            .collect();
        let heads: Vec<drive::QueryHead<'_>> = self
            .heads
            .iter()
            .map(|(q, kv, score_mult, score_shift)| drive::QueryHead {
                q,
                kv: *kv,
                score_mult: *score_mult,
                score_shift: *score_shift,
            })
            .collect();
        drive::run_attention_split(dev, core.nkv_max as usize, dims, &kv, &heads, timeout)
    }

    /// o and lse from the kernel's per-head outputs (none when [`Self::is_empty`]): o
    /// dequantised (`sv / 256` per unit), lse `ln 2 (e + log2(l / 2^15))`, -inf and a zero
    /// row where a row sees no key.
    pub(super) fn outputs(&self, heads: &[AttentionOut]) -> Result<Vec<Tensor>> {
        let s = &self.s;
        let d = s.d;
        let mut o = vec![0f32; s.b * s.hq * s.nq * d];
        let mut lse = vec![f32::NEG_INFINITY; s.b * s.hq * s.nq];
        if !self.is_empty() && heads.len() != self.heads.len() {
            return Err(Error::Internal(format!(
                "attention: {} head results for {} heads",
                heads.len(),
                self.heads.len()
            )));
        }
        for (plane, (out, job)) in heads.iter().zip(&self.heads).enumerate() {
            let sv = self.kv[job.1].2;
            for i in 0..s.nq {
                let row = (plane * s.nq + i) * d;
                for c in 0..d {
                    o[row + c] = f32::from(out.o[i * d + c]) * sv / 256.0;
                }
                lse[plane * s.nq + i] = out.lse(i) as f32;
            }
        }
        Ok(vec![
            Tensor::from_vec_f32(&self.outs[0].shape, o)?,
            Tensor::from_vec_f32(&self.outs[1].shape, lse)?,
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_count_the_causal_triangle() {
        use timing::visible_pairs;
        assert_eq!(visible_pairs(false, 3, 5), 15);
        // Nq = Nkv = 4: 1 + 2 + 3 + 4.
        assert_eq!(visible_pairs(true, 4, 4), 10);
        // Nq 2 < Nkv 5: rows see 4 and 5 keys.
        assert_eq!(visible_pairs(true, 2, 5), 9);
        // Nq 5 > Nkv 2: rows 0..3 see none, then 1 and 2.
        assert_eq!(visible_pairs(true, 5, 2), 3);
    }

    #[test]
    fn support_checks_the_build() {
        use crate::dtype::DType;
        let core = builds();
        assert_eq!(pick(&core, 20).map(|b| b.1.d_max), Some(64));
        assert_eq!(pick(&core, 72).map(|b| b.1.d_max), Some(128));
        assert_eq!(pick(&core, 130).map(|b| b.1.d_max), Some(256));
        assert_eq!(pick(&core, 260), None);
        let p = AttentionParams::default();
        let m = |b, h, n, d| TensorMeta::new(vec![b, h, n, d], DType::F32);
        let ok = [m(1, 4, 24, 16), m(1, 2, 24, 16), m(1, 2, 24, 16)];
        assert_eq!(support(&core, &p, &ok, MAX_SIM_CYCLES), Support::Native);
        let wide = [m(1, 2, 8, 264), m(1, 2, 8, 264), m(1, 2, 8, 264)];
        assert!(matches!(
            support(&core, &p, &wide, MAX_SIM_CYCLES),
            Support::No(_)
        ));
        // K/V past nkv_max and head dims up to 256 are taken
        let long = [m(1, 2, 8, 16), m(1, 2, 600, 16), m(1, 2, 600, 16)];
        assert_eq!(support(&core, &p, &long, MAX_SIM_CYCLES), Support::Native);
        let d256 = [m(1, 2, 8, 256), m(1, 2, 8, 256), m(1, 2, 8, 256)];
        assert_eq!(support(&core, &p, &d256, MAX_SIM_CYCLES), Support::Native);
        let many = [m(64, 32, 512, 64), m(64, 8, 512, 64), m(64, 8, 512, 64)];
        assert!(matches!(
            support(&core, &p, &many, MAX_SIM_CYCLES),
            Support::No(_)
        ));
        // The modelled card takes it.
        assert_eq!(support(&core, &p, &many, MAX_MODEL_CYCLES), Support::Native);
    }
}
