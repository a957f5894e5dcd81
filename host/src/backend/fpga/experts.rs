//! `moe_experts` on the card as a sequence of GEMM and vecops launches whose intermediates
//! stay in card memory (`tandem_fpga::drive::experts`; semantics
//! `tandem_fpga::golden::experts`): per expert its slots' token rows through the gate and up
//! GEMMs, `silu_mul8` (vecops op 5), the down GEMM (K passes over F chunks), then the weighted
//! gather-combine back into token order (vecops op 6). The host writes the permuted token rows
//! (its layout of the card buffer, as for `split_heads`), the weights and the combine table,
//! and reads the int16 output.
//!
//! Quantisation, as `linear` (`super::linear`): x per tensor, each projection per output
//! channel to int8, int32 accumulation; each expert's gate, up, SiLU x up and down outputs
//! requantised to int8 at scales calibrated on up to 16 of its rows (f64 on the host, 25%
//! margin, `QuantLinear::calibrate_y_scale`'s rule). SiLU: the gate scale times 64 as a 16-bit
//! multiplier and shift (the sigmoid table's input), the output `s_gate s_up / (32768 s_act)`
//! likewise. The combine: output scale `s_out = max_t sum_j |w_tj| 128 s_down(e_tj) / 32767`
//! (no sum can saturate), weights `w_tj s_down / s_out` in 16 bits at a common shift (the
//! largest ratio between 2^14 and 2^15); a slot in no expert's segment gets weight 0.

use std::time::Duration;

use rayon::prelude::*;

use tandem_fpga::drive::experts::{self as dx, ExpertsStats};
use tandem_fpga::golden::experts::{Expert8, Experts8, Linear8};
use tandem_fpga::golden::gemm as gq;
use tandem_fpga::golden::vecops::{LANES, quant, table_entry, words};
use tandem_fpga::kernels::gemm::GemmCore;
use tandem_fpga::kernels::vecops::VecopsCore;
use tandem_fpga::shell::ShellConfig;
use tandem_fpga::timing::{MemTiming, WPlacement};
use tandem_fpga::{FpgaDevice, FpgaError};

use super::Support;
use crate::error::{Error, Result};
use crate::ops::MoeExpertsParams;
use crate::tensor::{Tensor, TensorMeta};

/// Kernel name reported for moe_experts (GEMM + vecops launches over card memory).
pub const EXPERTS_KERNEL: &str = "moe_experts_int8_gemm+vecops";

/// Largest experts op (`T k 3 H F` multiply-adds) the RTL simulation takes: about ten
/// million cycles of the 8-row GEMM.
pub(super) const MAX_SIM_MACS: u128 = 1 << 29;

/// Largest experts op the modelled card takes (the golden GEMMs' time on the host: ~60 G
/// multiply-adds a second on two cores, so about a minute there; Mixtral's experts at T 4096
/// are 1.44 x 10^12).
pub(super) const MAX_MODEL_MACS: u128 = 1 << 42;

/// Rows sampled per expert to calibrate the int8 scales.
const SAMPLE_ROWS: usize = 16;

/// Whether the builds take this op: H within the GEMM and vecops rows, k within the combine
/// table, at most `max_macs` multiply-adds (any F, T and E).
pub(super) fn support(
    gemm: &GemmCore,
    vecops: &VecopsCore,
    p: &MoeExpertsParams,
    inputs: &[TensorMeta],
    max_macs: u128,
) -> Support {
    let s = match p.shape(inputs) {
        Ok(s) => s,
        Err(e) => return Support::No(e.to_string()),
    };
    if let Err(why) = dx::fits(gemm, vecops, s.h, s.k) {
        return Support::No(why);
    }
    let macs = 3 * (s.t * s.k) as u128 * s.h as u128 * s.f as u128;
    if macs > max_macs {
        return Support::No(format!(
            "{macs} MACs is more than the simulated card runs quickly ({max_macs}; the \
             modelled card takes more: --fpga-sim-mode model or auto)"
        ));
    }
    Support::Native
}

/// Estimated cycles (the kernels' cycle models over the launch sequence), with the `T k`
/// slots spread evenly over the experts (the routing is not known before the run).
pub(super) fn estimate_cycles(
    gemm: &GemmCore,
    vecops: &VecopsCore,
    p: &MoeExpertsParams,
    inputs: &[TensorMeta],
    mem: &MemTiming,
    w: WPlacement,
) -> Option<u64> {
    let s = p.shape(inputs).ok()?;
    let slots = s.t * s.k;
    let rows: Vec<usize> = (0..s.e)
        .map(|e| slots / s.e + usize::from(e < slots % s.e))
        .collect();
    Some(dx::experts_cycles_placed(
        gemm,
        vecops,
        &rows,
        (s.h, s.f, s.t, s.k),
        mem,
        w,
    ))
}

/// f64 `x [m, k] w^T` for `w [n, k]`: blocks of W's rows over the rayon threads, each W row
/// read once for all `m` rows of x (W is the large operand: a row of x at a time would stream
/// all of W from memory `m` times); each dot product in eight partial sums, which vectorise.
fn matmul(x: &[f64], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
    if k == 0 || m == 0 || n == 0 {
        return vec![0f64; m * n];
    }
    /// W rows per task.
    const ROWS: usize = 16;
    // y^T [n, m], then transposed
    let mut yt = vec![0f64; n * m];
    yt.par_chunks_mut(ROWS * m)
        .zip(w.par_chunks(ROWS * k))
        .for_each(|(yc, wc)| {
            for (yr, wr) in yc.chunks_exact_mut(m).zip(wc.chunks_exact(k)) {
                for (o, xr) in yr.iter_mut().zip(x.chunks_exact(k)) {
                    *o = dot(xr, wr);
                }
            }
        });
    let mut y = vec![0f64; m * n];
    for (j, col) in yt.chunks_exact(m).enumerate() {
        for (i, &v) in col.iter().enumerate() {
            y[i * n + j] = v;
        }
    }
    y
}

/// `a . b` in f64, over eight partial sums.
fn dot(a: &[f64], b: &[f32]) -> f64 {
    let mut acc = [0f64; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(&p, &q)| p * f64::from(q))
        .sum();
    for (pa, pb) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += pa[i] * f64::from(pb[i]);
        }
    }
    acc.iter().sum::<f64>() + tail
}

/// The int8 scale of values whose largest magnitude is `m` (25% margin; 1 for none).
fn y_scale(v: &[f64]) -> f32 {
    let m = v.iter().fold(0f64, |a, &b| a.max(b.abs()));
    if m > 0.0 {
        (1.25 * m / 127.0) as f32
    } else {
        1.0
    }
}

fn linear8(q: gq::QuantLinear) -> Linear8 {
    Linear8 {
        w: q.w,
        bias: q.bias,
        rq: q.requant,
    }
}

/// One moe_experts, quantised for the card.
pub(super) struct ExpertsJob {
    p: Experts8,
    out: TensorMeta,
    s_out: f64,
}

impl ExpertsJob {
    /// Checks the routing (the CPU path's errors) and quantises.
    pub(super) fn new(p: &MoeExpertsParams, inputs: &[&Tensor]) -> Result<Self> {
        let metas: Vec<TensorMeta> = inputs.iter().map(|t| t.meta()).collect();
        let out = p
            .validate(&metas)?
            .into_iter()
            .next()
            .ok_or_else(|| Error::Internal("moe_experts has no output".into()))?;
        let (sh, plan) = p.slots(inputs)?;
        let (h, f, k) = (sh.h, sh.f, sh.k);
        // the weights are large: borrowed where they are contiguous
        let vals = |i: usize| -> Result<std::borrow::Cow<'_, [f32]>> {
            let a = inputs[i].as_f32()?;
            Ok(match a.as_slice() {
                Some(s) => std::borrow::Cow::Borrowed(s),
                None => std::borrow::Cow::Owned(a.iter().copied().collect()),
            })
        };
        let x = vals(0)?;
        let w = vals(2)?;
        let gate_up = vals(5)?;
        let down = vals(6)?;
        let sx = super::quant::scale_of(&x);
        let xq: Vec<i8> = super::quant::quantize(&x, sx);
        let bad = |e: gq::GemmError| Error::invalid("moe_experts", e.to_string());
        // each expert with slots, quantised and calibrated on its own (in parallel: the
        // calibration's f64 products and the weights' quantisation are the host's work)
        let quantise = |e: usize, slots: &[usize]| -> Result<(Expert8, f64)> {
            let m = slots.len();
            let gu = &gate_up[e * 2 * f * h..(e + 1) * 2 * f * h];
            let (wg, wu) = gu.split_at(f * h);
            let wd = &down[e * h * f..(e + 1) * h * f];
            let mut xe = Vec::with_capacity(m * h);
            for &s in slots {
                let t = s / k;
                xe.extend_from_slice(&xq[t * h..(t + 1) * h]);
            }
            // calibration on up to SAMPLE_ROWS of the expert's rows, in f64
            let step = m.div_ceil(SAMPLE_ROWS).max(1);
            let sample: Vec<f64> = slots
                .iter()
                .step_by(step)
                .flat_map(|&s| {
                    x[(s / k) * h..(s / k + 1) * h]
                        .iter()
                        .map(|&v| f64::from(v))
                })
                .collect();
            let ms = sample.len() / h;
            let g = matmul(&sample, wg, ms, f, h);
            let u = matmul(&sample, wu, ms, f, h);
            let act: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(&a, &b)| a / (1.0 + (-a).exp()) * b)
                .collect();
            let yd = matmul(&act, wd, ms, h, f);
            let (sg, su, sa, sd) = (y_scale(&g), y_scale(&u), y_scale(&act), y_scale(&yd));
            let gate = gq::QuantLinear::new(wg, None, f, h, sx, sg).map_err(bad)?;
            let up = gq::QuantLinear::new(wu, None, f, h, sx, su).map_err(bad)?;
            let dn = gq::QuantLinear::new(wd, None, h, f, sa, sd).map_err(bad)?;
            let (c0, c1g) = quant::mult_shift(f64::from(sg) * 64.0);
            let r = f64::from(sg) * f64::from(su) / (32768.0 * f64::from(sa));
            let (mo, so) = quant::mult_shift(r);
            let ex = Expert8 {
                rows: m,
                x: xe,
                gate: linear8(gate),
                up: linear8(up),
                silu: (c0, (mo << 16) | c1g, so),
                down: linear8(dn),
            };
            Ok((ex, f64::from(sd)))
        };
        let busy: Vec<(usize, &Vec<usize>)> = plan
            .iter()
            .enumerate()
            .filter(|(_, slots)| !slots.is_empty())
            .collect();
        let quantised: Vec<(Expert8, f64)> = busy
            .par_iter()
            .map(|&(e, slots)| quantise(e, slots))
            .collect::<Result<_>>()?;
        // per slot: (row of Y, the expert's down scale)
        let mut loc: Vec<Option<(usize, f64)>> = vec![None; sh.t * k];
        let mut row0 = 0usize;
        let mut experts = Vec::with_capacity(quantised.len());
        for ((_, slots), (ex, sd)) in busy.iter().zip(quantised) {
            for (i, &s) in slots.iter().enumerate() {
                loc[s] = Some((row0 + i, sd));
            }
            row0 += slots.len();
            experts.push(ex);
        }
        // the combine: output scale, weights at a common shift
        let bound = (0..sh.t)
            .map(|t| {
                (0..k)
                    .filter_map(|j| {
                        loc[t * k + j].map(|(_, sd)| f64::from(w[t * k + j]).abs() * 128.0 * sd)
                    })
                    .sum::<f64>()
            })
            .fold(0f64, f64::max);
        let s_out = quant::scale_for(bound, 1.0, 0.0);
        let ratio = |slot: usize| loc[slot].map_or(0.0, |(_, sd)| f64::from(w[slot]) * sd / s_out);
        let rmax = (0..sh.t * k).map(|s| ratio(s).abs()).fold(0f64, f64::max);
        let shift = if rmax > 0.0 {
            (32767.0 / rmax).log2().floor().clamp(0.0, 47.0) as u32
        } else {
            0
        };
        let table = (0..sh.t * k)
            .map(|s| {
                let wq = (ratio(s) * f64::from(shift).exp2())
                    .round()
                    .clamp(-32768.0, 32767.0) as i16;
                let row = loc[s].map_or(0, |(r, _)| r);
                u32::try_from(row)
                    .map(|row| table_entry(row, wq))
                    .map_err(|_| {
                        Error::invalid("moe_experts", format!("{row} slots exceed 32 bits"))
                    })
            })
            .collect::<Result<Vec<u64>>>()?;
        Ok(Self {
            p: Experts8 {
                h,
                f,
                experts,
                tokens: sh.t,
                k,
                table,
                shift,
            },
            out,
            s_out,
        })
    }

    /// Whether there is nothing to run (no tokens).
    pub(super) fn is_empty(&self) -> bool {
        self.p.tokens == 0
    }

    /// Runs the launch sequence on `dev`.
    pub(super) fn run(
        &self,
        dev: &mut dyn FpgaDevice,
        gemm: &GemmCore,
        vecops: &VecopsCore,
        timeout: Duration,
    ) -> std::result::Result<(Vec<i16>, ExpertsStats), FpgaError> {
        dx::run_experts(dev, gemm, vecops, ShellConfig::default(), &self.p, timeout)
    }

    /// The output `[T, H]`, dequantised.
    pub(super) fn output(&self, y: &[i16]) -> Result<Tensor> {
        let h = self.p.h;
        let np = LANES * words(h);
        let v: Vec<f32> = y
            .chunks_exact(np.max(1))
            .flat_map(|r| r[..h].iter().map(|&q| (f64::from(q) * self.s_out) as f32))
            .collect();
        Tensor::from_vec_f32(&self.out.shape, v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_equals_the_plain_loop_on_odd_shapes() {
        for (m, n, k) in [
            (1, 1, 1),
            (3, 37, 19),
            (16, 40, 9),
            (5, 17, 33),
            (2, 0, 4),
            (0, 3, 4),
        ] {
            let x: Vec<f64> = (0..m * k)
                .map(|i| ((i * 7919) % 97) as f64 - 48.5)
                .collect();
            let w: Vec<f32> = (0..n * k)
                .map(|i| ((i * 104_729) % 89) as f32 * 0.25 - 11.0)
                .collect();
            let y = matmul(&x, &w, m, n, k);
            assert_eq!(y.len(), m * n);
            for i in 0..m {
                for j in 0..n {
                    let want = dot(&x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
                    assert_eq!(
                        y[i * n + j].to_bits(),
                        want.to_bits(),
                        "{m}x{n}x{k} at {i},{j}"
                    );
                }
            }
        }
    }
}
