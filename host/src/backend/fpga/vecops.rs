//! `rmsnorm` (with or without the residual), `rope` and `add` on the vecops kernel
//! (`tandem_fpga::kernels::vecops`), and the layout ops `split_heads` / `merge_heads`.
//!
//! Quantisation (host): int16, symmetric, per tensor (`fpga::golden::vecops::quant`):
//! - add: a and b at one scale `(max|a| + max|b|) / 32767` (the sum cannot saturate);
//! - rmsnorm: x (and the residual) at one scale `s` as for add (at least `sqrt(eps / 2^31)`
//!   so that `eps_q = round(eps / s^2)` plus the mean square stays below the 32-bit clamp), w at `max|w| / 32767`; the
//!   output shift `15 + g` with `2^g >= 1.002 sqrt(n)` (`|t| / rms <= sqrt(n)`: y cannot
//!   saturate); y is in units of `sw 2^g`, the sum in units of `s`;
//! - rope: x at `1.42 max|x| / 32767` (a rotation grows no element beyond `sqrt 2 max|x|`),
//!   cos/sin in Q1.14 from the f64 angles of the reference (`pos * base^(-2i/D)`), one table
//!   row per position `t` (period T); each half of a row is padded to a multiple of 4
//!   elements by the driver's layout, so any even head dim runs.
//!
//! Layout ops: the FPGA backend's tensors live on the host between launches and every driver
//! writes its card buffers in the order its kernel reads (`tandem_fpga::drive`), so
//! `split_heads` / `merge_heads` are that host-side layout: a strided copy (exact), reported as
//! kernel `host_layout` with zero device cycles. On a board they are the order in which the
//! next kernel's buffer is written over PCIe, never a pass over card memory.

use std::time::Duration;

use tandem_fpga::golden::vecops::{
    self as gv, LANES, OP_ADD, OP_RMSNORM, OP_RMSNORM_RES, OP_ROPE, VecArgs, quant, words,
};
use tandem_fpga::kernels::vecops::VecopsCore;
use tandem_fpga::{FpgaDevice, FpgaError, RunStats, drive};

use super::Support;
use crate::error::{Error, Result};
use crate::ops::{Op, RmsNormParams, RopeParams};
use crate::tensor::{Tensor, TensorMeta};

/// Kernel name reported for rmsnorm / rope / add.
pub const VECOPS_KERNEL: &str = "vecops_int16_stream";
/// Kernel name reported for the layout ops (done by the host as it lays out card buffers).
pub const LAYOUT_KERNEL: &str = "host_layout";

/// Largest estimated run the simulated card takes (about ten seconds of simulation).
pub(super) const MAX_SIM_CYCLES: u64 = 1 << 24;

/// The vecops build the backend loads: rows up to 4096 elements (Mixtral's d_model).
pub fn vecops_build() -> VecopsCore {
    VecopsCore { n_max: 4096 }
}

/// The kernel arguments of an op on inputs `inputs` (shapes only), or why it does not run.
fn plan(op: &Op, inputs: &[TensorMeta], n_max: usize) -> std::result::Result<VecArgs, String> {
    op.validate(inputs).map_err(|e| e.to_string())?;
    let numel = |m: &TensorMeta| m.shape.iter().product::<usize>();
    let args = match op {
        Op::RmsNorm(p) => {
            let x = &inputs[0];
            let n = x.shape.last().copied().unwrap_or(0);
            if n > n_max {
                return Err(format!(
                    "rows of {n} elements exceed the vecops build (n_max = {n_max})"
                ));
            }
            VecArgs {
                op: if p.residual {
                    OP_RMSNORM_RES
                } else {
                    OP_RMSNORM
                },
                rows: numel(x) / n.max(1),
                n,
                ..VecArgs::default()
            }
        }
        Op::Rope(_) => {
            let s = &inputs[0].shape;
            let half = s[3] / 2;
            let n = 2 * LANES * words(half);
            if n > n_max {
                return Err(format!(
                    "head dim {} (padded to {n}) exceeds the vecops build (n_max = {n_max})",
                    s[3]
                ));
            }
            VecArgs {
                op: OP_ROPE,
                rows: s[0] * s[1] * s[2],
                n,
                c0: u32::try_from(s[2]).map_err(|_| format!("T = {} is too large", s[2]))?,
                ..VecArgs::default()
            }
        }
        Op::Add => {
            let total = numel(&inputs[0]);
            let n = total.clamp(1, n_max);
            VecArgs {
                op: OP_ADD,
                rows: total.div_ceil(n),
                n,
                ..VecArgs::default()
            }
        }
        other => return Err(format!("{} is not a vecops op", other.name())),
    };
    if u32::try_from(args.rows).is_err() || u32::try_from(args.rows * words(args.n)).is_err() {
        return Err(format!("{} rows exceed the 32-bit registers", args.rows));
    }
    Ok(args)
}

/// Whether the vecops build `core` takes this op (and, `max_cycles`, how long a run may be).
pub(super) fn support(
    core: &VecopsCore,
    op: &Op,
    inputs: &[TensorMeta],
    max_cycles: Option<u64>,
) -> Support {
    match op {
        Op::SplitHeads(_) | Op::MergeHeads => match op.validate(inputs) {
            Ok(_) => Support::Native,
            Err(e) => Support::No(e.to_string()),
        },
        _ => match plan(op, inputs, core.n_max as usize) {
            Err(why) => Support::No(why),
            Ok(args) => {
                let cycles = estimate_cycles(core, &args);
                match max_cycles {
                    Some(max) if cycles > max => Support::No(format!(
                        "about {cycles} cycles is more than the simulated card runs quickly \
                         ({max}; the modelled card takes more: --fpga-sim-mode model or auto)"
                    )),
                    _ => Support::Native,
                }
            }
        },
    }
}

fn estimate_cycles(core: &VecopsCore, args: &VecArgs) -> u64 {
    tandem_fpga::timing::vecops_cycles(core, args, &tandem_fpga::timing::MemTiming::default())
}

/// Estimated cycles of a supported vecops op (0 for the layout ops).
pub(super) fn cycles(core: &VecopsCore, op: &Op, inputs: &[TensorMeta]) -> Option<u64> {
    match op {
        Op::SplitHeads(_) | Op::MergeHeads => Some(0),
        _ => plan(op, inputs, core.n_max as usize)
            .ok()
            .map(|a| estimate_cycles(core, &a)),
    }
}

/// How the kernel's padded output rows become the op's outputs.
enum Unpack {
    /// Flat elements (add): the first `len` of the rows, times the scale.
    Flat { len: usize, scale: f64 },
    /// Rows of `n` elements (rmsnorm): y times `y_scale`, the sum times `s_scale`.
    Rows {
        n: usize,
        y_scale: f64,
        s_scale: f64,
    },
    /// RoPE rows: two halves of `half` elements, each padded to `hp`.
    Halves { half: usize, hp: usize, scale: f64 },
}

/// One rmsnorm / rope / add, quantised for the kernel.
pub(super) struct VecJob {
    args: VecArgs,
    a: Vec<i16>,
    b: Vec<i16>,
    p: Vec<i16>,
    unpack: Unpack,
    outs: Vec<TensorMeta>,
}

fn values(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.as_f32()?.iter().copied().collect())
}

impl VecJob {
    /// Quantises the inputs of `op` (validated against the build `core`).
    pub(super) fn new(core: &VecopsCore, op: &Op, inputs: &[&Tensor]) -> Result<Self> {
        let metas: Vec<TensorMeta> = inputs.iter().map(|t| t.meta()).collect();
        let outs = op.validate(&metas)?.into_vec();
        let mut args =
            plan(op, &metas, core.n_max as usize).map_err(|why| Error::invalid(op.name(), why))?;
        match op {
            Op::RmsNorm(p) => Self::rmsnorm(p, &mut args, inputs, outs),
            Op::Rope(p) => Self::rope(p, args, inputs, outs),
            _ => Self::add(args, inputs, outs),
        }
    }

    fn add(args: VecArgs, inputs: &[&Tensor], outs: Vec<TensorMeta>) -> Result<Self> {
        let (a, b) = (values(inputs[0])?, values(inputs[1])?);
        let s = quant::scale_for(quant::max_abs(&a) + quant::max_abs(&b), 1.0, 0.0);
        let lay = |v: &[f32]| {
            let mut q = quant::quantize(v, s);
            q.resize(args.rows * args.n, 0);
            gv::pad_rows(&q, args.rows, args.n)
        };
        Ok(Self {
            a: lay(&a),
            b: lay(&b),
            p: Vec::new(),
            unpack: Unpack::Flat {
                len: a.len(),
                scale: s,
            },
            args,
            outs,
        })
    }

    fn rmsnorm(
        p: &RmsNormParams,
        args: &mut VecArgs,
        inputs: &[&Tensor],
        outs: Vec<TensorMeta>,
    ) -> Result<Self> {
        let (x, w) = (values(inputs[0])?, values(inputs[1])?);
        let r = if p.residual {
            values(inputs[2])?
        } else {
            Vec::new()
        };
        let eps = f64::from(p.eps);
        // eps_q <= 2^31 and m < 2^30 (|t| <= 32767): m + eps_q never reaches the clamp
        let floor = (eps / f64::from(1u32 << 31)).sqrt();
        let s = quant::scale_for(quant::max_abs(&x) + quant::max_abs(&r), 1.0, floor);
        let sw = quant::scale_for(quant::max_abs(&w), 1.0, 0.0);
        let n = args.n;
        let g = (1.002 * (n as f64).sqrt()).log2().ceil().max(0.0) as u32;
        args.shift = 15 + g;
        args.c0 = (eps / (s * s)).round().min(f64::from(u32::MAX)) as u32;
        args.c1 = ((1u64 << 32) as f64 / n as f64)
            .round()
            .min(f64::from(u32::MAX)) as u32;
        let rows = args.rows;
        Ok(Self {
            a: gv::pad_rows(&quant::quantize(&x, s), rows, n),
            b: if p.residual {
                gv::pad_rows(&quant::quantize(&r, s), rows, n)
            } else {
                Vec::new()
            },
            p: gv::pad_rows(&quant::quantize(&w, sw), 1, n),
            unpack: Unpack::Rows {
                n,
                y_scale: sw * f64::from(g).exp2(),
                s_scale: s,
            },
            args: *args,
            outs,
        })
    }

    fn rope(
        p: &RopeParams,
        args: VecArgs,
        inputs: &[&Tensor],
        outs: Vec<TensorMeta>,
    ) -> Result<Self> {
        let x = values(inputs[0])?;
        let shape = &outs[0].shape;
        let (t, d) = (shape[2], shape[3]);
        let half = d / 2;
        let hp = args.n / 2;
        let s = quant::scale_for(quant::max_abs(&x), 1.42, 0.0);
        let xq = quant::quantize(&x, s);
        let mut a = vec![0i16; args.rows * args.n];
        for (row, src) in a.chunks_exact_mut(args.n).zip(xq.chunks_exact(d)) {
            row[..half].copy_from_slice(&src[..half]);
            row[hp..hp + half].copy_from_slice(&src[half..]);
        }
        let one = f64::from(1u32 << gv::ROPE_FRAC);
        let mut table = vec![0i16; t * args.n];
        for (tt, row) in table.chunks_exact_mut(args.n).enumerate() {
            let pos = (p.position_offset + tt) as f64;
            for i in 0..half {
                let ang = pos * p.base.powf(-2.0 * i as f64 / d as f64);
                let (sin, cos) = ang.sin_cos();
                row[i] = (cos * one).round() as i16;
                row[hp + i] = (sin * one).round() as i16;
            }
        }
        Ok(Self {
            args,
            a,
            b: Vec::new(),
            p: table,
            unpack: Unpack::Halves { half, hp, scale: s },
            outs,
        })
    }

    /// Whether the op has no elements (nothing to run; the outputs are empty).
    pub(super) fn is_empty(&self) -> bool {
        self.args.rows == 0
    }

    /// Runs the kernel on `dev`.
    pub(super) fn run(
        &self,
        dev: &mut dyn FpgaDevice,
        timeout: Duration,
    ) -> std::result::Result<(gv::VecOut, RunStats), FpgaError> {
        drive::run_vecops(dev, &self.args, &self.a, &self.b, &self.p, timeout)
    }

    /// The op's outputs, dequantised.
    pub(super) fn outputs(&self, out: &gv::VecOut) -> Result<Vec<Tensor>> {
        let deq = |v: &[i16], sc: f64| -> Vec<f32> {
            v.iter().map(|&q| (f64::from(q) * sc) as f32).collect()
        };
        let tensors: Vec<Vec<f32>> = match self.unpack {
            Unpack::Flat { len, scale } => {
                let flat = gv::unpad_rows(&out.y, self.args.n);
                vec![deq(&flat[..len.min(flat.len())], scale)]
            }
            Unpack::Rows {
                n,
                y_scale,
                s_scale,
            } => {
                let mut v = vec![deq(&gv::unpad_rows(&out.y, n), y_scale)];
                if self.args.op == OP_RMSNORM_RES {
                    v.push(deq(&gv::unpad_rows(&out.s, n), s_scale));
                }
                v
            }
            Unpack::Halves { half, hp, scale } => {
                let mut y = Vec::with_capacity(self.args.rows * 2 * half);
                for row in out.y.chunks_exact(2 * hp) {
                    y.extend(deq(&row[..half], scale));
                    y.extend(deq(&row[hp..hp + half], scale));
                }
                vec![y]
            }
        };
        if tensors.len() != self.outs.len() {
            return Err(Error::Internal(format!(
                "vecops made {} outputs, the op has {}",
                tensors.len(),
                self.outs.len()
            )));
        }
        tensors
            .into_iter()
            .zip(&self.outs)
            .map(|(v, m)| Tensor::from_vec_f32(&m.shape, v))
            .collect()
    }
}

/// The layout ops, as the host lays out card buffers: an exact strided copy.
pub(super) fn layout(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    op.run_cpu(inputs)
}
