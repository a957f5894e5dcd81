//! `attention` on the streaming attention kernel (`tandem_fpga::kernels::attention`), one
//! (batch, query head) problem per launch.
//!
//! At the boundary each launch's tensors are quantised to int8 per tensor (symmetric,
//! `max|x| / 127`, as `fpga::golden::attention` is specified and tested): the query plane of
//! head h, and the key and value planes of its kv head h / (Hq / Hkv) (quantised once per kv
//! head and shared by its query group). The head dimension is padded with zeros to a
//! multiple of 8 (a zero column changes no score and gives a zero output column, dropped
//! here). The softmax scale goes into the kernel's score multiplier
//! (`AttentionConfig::score_multiplier(scale, sq, sk)`); o comes back as int16 in units of
//! `sv / 256` and is dequantised; `lse` is computed from the kernel's per-row running
//! exponent and sum, `ln 2 (e + log2(l / 2^15))` (`AttentionOut::lse`), -inf for rows that
//! see no key, so nothing of the op is computed on the host but the (de)quantisation.

use std::time::Duration;

use tandem_fpga::golden::attention::{AttentionConfig, AttentionOut, MAX_NKV};
use tandem_fpga::golden::gemm as gq;
use tandem_fpga::kernels::attention::AttentionCore;
use tandem_fpga::kernels::gemm::pad8;
use tandem_fpga::{DeviceBuffer, FpgaDevice, FpgaError};

use super::Support;
use crate::error::{Error, Result};
use crate::ops::AttentionParams;
use crate::ops::attention::AttentionShape;
use crate::tensor::{Tensor, TensorMeta};

/// Kernel name reported for attention (o and lse both from the kernel).
pub const ATTENTION_KERNEL: &str = "attention_int8_stream";

/// Largest attention the simulated card takes, in estimated kernel cycles summed over the
/// heads ([`estimate_cycles`]): a few seconds of simulation.
pub const MAX_SIM_CYCLES: u64 = 1 << 22;

/// The attention builds the backend loads (each on its own card, at its first launch),
/// smallest first: 64 + 64 and 128 + 128 MAC lanes (head dim up to 64 and 128), both with
/// 512 keys on chip and 16-key softmax tiles. A launch uses the smallest that takes its
/// (padded) head dimension, so the MAC arrays stay as busy as the shape allows.
pub fn builds() -> [(&'static str, AttentionCore); 2] {
    let core = |d_max| AttentionCore {
        d_max,
        nkv_max: 512,
        kv_tile: 16,
    };
    [("attention_d64", core(64)), ("attention_d128", core(128))]
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

/// (query, key) pairs a query row set sees: all of them, or the bottom-right causal ones.
pub fn visible_pairs(causal: bool, nq: usize, nkv: usize) -> u64 {
    if !causal {
        return nq as u64 * nkv as u64;
    }
    (0..nq)
        .map(|i| (i + 1 + nkv).saturating_sub(nq).min(nkv) as u64)
        .sum()
}

/// Cycle estimate of one head (the documented cycle model): K/V load `2 Nkv dp / 8` and Q
/// `Nq dp / 8` words, one cycle per visible pair, about one per row more, and a fixed
/// latency and drain. Within 2% of the simulated cycles on the default layer (a little
/// high).
fn head_cycles(causal: bool, nq: usize, nkv: usize, dp: usize) -> u64 {
    let load = 2 * (nkv * dp / 8) as u64 + (nq * dp / 8) as u64;
    load + visible_pairs(causal, nq, nkv) + nq as u64 + 100
}

/// Estimated kernel cycles of the whole op (all heads, run one after another).
pub fn estimate_cycles(causal: bool, s: &AttentionShape) -> u64 {
    (s.b * s.hq) as u64 * head_cycles(causal, s.nq, s.nkv, pad8(s.d))
}

/// Whether one of `builds` takes this attention.
pub fn support(
    builds: &[(&'static str, AttentionCore)],
    p: &AttentionParams,
    inputs: &[TensorMeta],
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
    if s.nkv > core.nkv_max as usize || s.nkv > MAX_NKV {
        return Support::No(format!(
            "kv length {} exceeds the attention build's nkv_max = {}",
            s.nkv, core.nkv_max
        ));
    }
    if u32::try_from(s.nq).is_err() {
        return Support::No(format!("query length {} does not fit 32 bits", s.nq));
    }
    let cycles = estimate_cycles(p.causal, &s);
    if cycles > MAX_SIM_CYCLES {
        return Support::No(format!(
            "about {cycles} kernel cycles is more than the simulator runs quickly ({MAX_SIM_CYCLES})"
        ));
    }
    Support::Native
}

/// One launch: a query head against its kv head.
struct HeadJob {
    /// Index into the quantised kv planes.
    kv: usize,
    /// int8 `[Nq][dp]`.
    q: Vec<u8>,
    score_mult: u16,
    score_shift: u8,
}

/// Quantised inputs of the whole op.
struct Quantised {
    /// Per (batch, kv head): int8 K and V `[Nkv][dp]` and V's scale.
    kv: Vec<(Vec<u8>, Vec<u8>, f32)>,
    /// Per (batch, query head), in output order.
    heads: Vec<HeadJob>,
}

/// int8 plane `[rows][d]` padded to `[rows][dp]`, per-tensor scale.
fn quantise_plane(x: &[f32], rows: usize, d: usize, dp: usize) -> (Vec<u8>, f32) {
    let (q, s) = gq::quantize_per_tensor(x);
    let mut out = vec![0u8; rows * dp];
    for r in 0..rows {
        for c in 0..d {
            out[r * dp + c] = q[r * d + c] as u8;
        }
    }
    (out, s)
}

fn quantise(p: &AttentionParams, s: &AttentionShape, inputs: &[&Tensor]) -> Result<Quantised> {
    let flat = |i: usize| -> Result<Vec<f32>> {
        let v: Vec<f32> = inputs[i].as_f32()?.iter().copied().collect();
        if let Some(pos) = v.iter().position(|x| !x.is_finite()) {
            let name = ["q", "k", "v"][i];
            return Err(Error::invalid(
                "attention",
                format!("{name} element {pos} is not finite (the int8 kernel needs finite inputs)"),
            ));
        }
        Ok(v)
    };
    let (q, k, v) = (flat(0)?, flat(1)?, flat(2)?);
    let (d, dp) = (s.d, pad8(s.d));
    let (qp, kvp) = (s.nq * d, s.nkv * d);
    let kv: Vec<(Vec<u8>, Vec<u8>, f32, f32)> = (0..s.b * s.hkv)
        .map(|i| {
            let (kq, sk) = quantise_plane(&k[i * kvp..(i + 1) * kvp], s.nkv, d, dp);
            let (vq, sv) = quantise_plane(&v[i * kvp..(i + 1) * kvp], s.nkv, d, dp);
            (kq, vq, sk, sv)
        })
        .collect();
    let group = s.hq / s.hkv;
    let scale = f64::from(p.scale_for(d));
    let mut heads = Vec::with_capacity(s.b * s.hq);
    for b in 0..s.b {
        for h in 0..s.hq {
            let plane = b * s.hq + h;
            let (qq, sq) = quantise_plane(&q[plane * qp..(plane + 1) * qp], s.nq, d, dp);
            let kvi = b * s.hkv + h / group;
            let sk = kv[kvi].2;
            let (score_mult, score_shift) =
                AttentionConfig::score_multiplier(scale, f64::from(sq), f64::from(sk)).map_err(
                    |e| {
                        Error::invalid(
                            "attention",
                            format!(
                                "batch {b} head {h}: {e} (scale {scale} x max|q| x max|k| is \
                                 beyond the kernel's score multiplier)"
                            ),
                        )
                    },
                )?;
            heads.push(HeadJob {
                kv: kvi,
                q: qq,
                score_mult,
                score_shift,
            });
        }
    }
    Ok(Quantised {
        kv: kv.into_iter().map(|(k, v, _, sv)| (k, v, sv)).collect(),
        heads,
    })
}

/// Kernel output of one head: int16 o `[Nq][dp]`, per row (e, l).
type HeadOut = (Vec<i16>, Vec<i32>, Vec<u32>);

/// Runs every head on `dev` (which must have the attention core loaded), one after another.
/// K and V of each kv head are written once; returns the outputs and the summed cycles.
fn run_heads(
    dev: &mut dyn FpgaDevice,
    qd: &Quantised,
    causal: bool,
    nq: usize,
    nkv: usize,
    dp: usize,
    timeout: Duration,
) -> std::result::Result<(Vec<HeadOut>, u64), FpgaError> {
    let bad = |msg: String| FpgaError::BadArgument {
        kernel: "attention".into(),
        msg,
    };
    let to32 =
        |v: usize, what: &str| u32::try_from(v).map_err(|_| bad(format!("{what} = {v} too large")));
    let (nq32, nkv32, d32) = (to32(nq, "nq")?, to32(nkv, "nkv")?, to32(dp, "d")?);
    let mut bufs: Vec<DeviceBuffer> = Vec::new();
    let result = (|| -> std::result::Result<(Vec<HeadOut>, u64), FpgaError> {
        let mut alloc = |dev: &mut dyn FpgaDevice, bytes: usize| {
            let b = dev.alloc(0, bytes.max(8) as u64)?;
            bufs.push(b);
            Ok::<_, FpgaError>(b)
        };
        let mut kvb = Vec::with_capacity(qd.kv.len());
        for (k, v, _) in &qd.kv {
            let kb = alloc(dev, k.len())?;
            let vb = alloc(dev, v.len())?;
            dev.write(&kb, 0, k)?;
            dev.write(&vb, 0, v)?;
            kvb.push((kb, vb));
        }
        let qb = alloc(dev, nq * dp)?;
        let ob = alloc(dev, nq * dp * 2)?;
        let sb = alloc(dev, nq * 8)?;
        let mut outs = Vec::with_capacity(qd.heads.len());
        let mut cycles = 0u64;
        for job in &qd.heads {
            let (kb, vb) = kvb
                .get(job.kv)
                .ok_or_else(|| bad(format!("kv plane {} missing", job.kv)))?;
            dev.write(&qb, 0, &job.q)?;
            for (name, b) in [("q", &qb), ("k", kb), ("v", vb), ("o", &ob), ("stats", &sb)] {
                dev.set_pointer(name, b)?;
            }
            for (name, val) in [
                ("nq", nq32),
                ("nkv", nkv32),
                ("d", d32),
                ("causal", u32::from(causal)),
                ("score_mult", u32::from(job.score_mult)),
                ("score_shift", u32::from(job.score_shift)),
            ] {
                dev.set_scalar(name, val)?;
            }
            dev.start()?;
            let st = dev.wait(timeout)?;
            cycles += st.cycles;
            let mut o = vec![0u8; nq * dp * 2];
            dev.read(&ob, 0, &mut o)?;
            let mut s = vec![0u8; nq * 8];
            dev.read(&sb, 0, &mut s)?;
            let o: Vec<i16> = o
                .chunks_exact(2)
                .map(|b| i16::from_le_bytes([b[0], b[1]]))
                .collect();
            let (mut e, mut l) = (Vec::with_capacity(nq), Vec::with_capacity(nq));
            for w in s.chunks_exact(8) {
                let word = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
                e.push(word as u32 as i32);
                l.push((word >> 32) as u32);
            }
            outs.push((o, e, l));
        }
        Ok((outs, cycles))
    })();
    let mut freed = Ok(());
    for b in bufs.into_iter().rev() {
        if let Err(e) = dev.free(b) {
            freed = Err(e);
        }
    }
    let r = result?;
    freed?;
    Ok(r)
}

/// Runs attention on the card: quantise, one launch per (batch, query head), dequantise.
/// `with_card` runs a closure on the loaded attention card. Returns o, lse and the cycles.
pub(super) fn run(
    p: &AttentionParams,
    inputs: &[&Tensor],
    timeout: Duration,
    with_card: impl FnOnce(
        &mut dyn FnMut(&mut dyn FpgaDevice) -> std::result::Result<(Vec<HeadOut>, u64), FpgaError>,
    ) -> Result<(Vec<HeadOut>, u64)>,
) -> Result<(Vec<Tensor>, u64)> {
    let metas: Vec<TensorMeta> = inputs.iter().map(|t| t.meta()).collect();
    let outs = p.validate(&metas)?;
    let s = p.shape(&metas)?;
    let (d, dp) = (s.d, pad8(s.d));
    let mut o = vec![0f32; s.b * s.hq * s.nq * d];
    let mut lse = vec![f32::NEG_INFINITY; s.b * s.hq * s.nq];
    if s.nq == 0 {
        return Ok((
            vec![
                Tensor::from_vec_f32(&outs[0].shape, o)?,
                Tensor::from_vec_f32(&outs[1].shape, lse)?,
            ],
            0,
        ));
    }
    let qd = quantise(p, &s, inputs)?;
    let (heads, cycles) =
        with_card(&mut |dev| run_heads(dev, &qd, p.causal, s.nq, s.nkv, dp, timeout))?;
    if heads.len() != qd.heads.len() {
        return Err(Error::Internal(format!(
            "attention: {} head results for {} heads",
            heads.len(),
            qd.heads.len()
        )));
    }
    for (plane, ((oq, e, l), job)) in heads.into_iter().zip(&qd.heads).enumerate() {
        let sv = qd.kv[job.kv].2;
        let out = AttentionOut { o: oq, e, l };
        for i in 0..s.nq {
            let row = (plane * s.nq + i) * d;
            for c in 0..d {
                o[row + c] = f32::from(out.o[i * dp + c]) * sv / 256.0;
            }
            lse[plane * s.nq + i] = out.lse(i) as f32;
        }
    }
    Ok((
        vec![
            Tensor::from_vec_f32(&outs[0].shape, o)?,
            Tensor::from_vec_f32(&outs[1].shape, lse)?,
        ],
        cycles,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_count_the_causal_triangle() {
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
        assert_eq!(pick(&core, 130), None);
        let p = AttentionParams::default();
        let m = |b, h, n, d| TensorMeta::new(vec![b, h, n, d], DType::F32);
        let ok = [m(1, 4, 24, 16), m(1, 2, 24, 16), m(1, 2, 24, 16)];
        assert_eq!(support(&core, &p, &ok), Support::Native);
        let wide = [m(1, 2, 8, 136), m(1, 2, 8, 136), m(1, 2, 8, 136)];
        assert!(matches!(support(&core, &p, &wide), Support::No(_)));
        let long = [m(1, 2, 8, 16), m(1, 2, 600, 16), m(1, 2, 600, 16)];
        assert!(matches!(support(&core, &p, &long), Support::No(_)));
        let many = [m(64, 32, 512, 64), m(64, 8, 512, 64), m(64, 8, 512, 64)];
        assert!(matches!(support(&core, &p, &many), Support::No(_)));
    }
}
