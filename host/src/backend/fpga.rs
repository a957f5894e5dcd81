//! The FPGA backend: runs kernels on an `FpgaDevice`. Today that is `tandem_sim::SimCard`
//! (Verilator), listed as `fpga-sim:0`; the XRT board driver will plug in behind the same
//! trait.
//!
//! Ops: `moe_route` (renormalised top-k, E <= e_max, k <= k_max of the loaded build) on the
//! router kernel, `attention` (head dim <= 128, Nkv <= 512; one launch per (batch, query
//! head), int8 per-tensor quantisation, o and lse from the kernel: see [`attention`]) on the
//! streaming attention kernel, and `linear` (no activation or ReLU; N, K <= 4096; at most 2^26 MACs so the
//! simulation stays quick) on the GEMM kernel (`linear_int8_gemm`: x per tensor and w per
//! output channel quantised to int8, int32 bias, y requantised to int8 at a scale calibrated
//! on up to 16 rows of x, dequantised on the host); everything else answers [`Support::No`]
//! so the planner keeps it on the CPU. Each kernel has its own card, loaded at first use.
//! At the boundary the f32 logits are quantised to Q7.8 int16 and the Q0.15 weights
//! dequantised back; the outputs the kernel does not make (the block-aligned permutation, the
//! expert offsets and both losses) are computed on the host from the kernel's ids and
//! histogram and the logits, which `LaunchInfo::kernel` says (`moe_router_int16+host_align`).
//! `LaunchInfo::cycles` is the simulated kernel cycles (ap_start to ap_done) and
//! `device_time` = cycles / clock (300 MHz, or `TANDEM_FPGA_CLOCK_MHZ`).

pub mod attention;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::collections::HashMap;

use tandem_fpga::FpgaError;
use tandem_fpga::core::KernelCore;
use tandem_fpga::golden::gemm as gq;
use tandem_fpga::golden::router::{WEIGHT_FRAC_BITS, quantize_logit};
use tandem_fpga::kernels::attention::AttentionCore;
use tandem_fpga::kernels::gemm::GemmCore;
use tandem_fpga::kernels::router::RouterCore;
use tandem_fpga::shell::ShellConfig;
use tandem_sim::{SimCard, SimConfig};

use super::{
    Backend, DeviceId, DeviceInfo, DeviceKind, DeviceStorage, Launch, LaunchInfo, Missing, Support,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{Activation, LinearParams, MoeRouteParams, Op};
use crate::sync::Completion;
use crate::tensor::{Tensor, TensorMeta};

/// Kernel name reported for routing.
pub const ROUTER_KERNEL: &str = "moe_router_int16+host_align";

/// Kernel name reported for linear (fused GEMM + bias + ReLU + requantisation).
pub const GEMM_KERNEL: &str = "linear_int8_gemm";

/// Largest linear (M*N*K multiply-adds) the simulated card takes: about a million cycles on
/// the 8x8 array, a second or so of simulation.
const MAX_SIM_MACS: u128 = 1 << 26;

/// Longest a simulated kernel run may take (wall clock) before it is a timeout.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);

/// Looks for simulated and real FPGA cards.
pub fn discover() -> (Vec<Arc<dyn Backend>>, Vec<Missing>) {
    let mut missing = vec![Missing {
        kind: DeviceKind::FpgaXrt,
        reason: "tandem was built without the `xrt` feature (no Alveo board driver)".into(),
    }];
    match tandem_sim::available() {
        Ok(version) => (vec![Arc::new(FpgaSimBackend::new(&version))], missing),
        Err(e) => {
            missing.push(Missing {
                kind: DeviceKind::FpgaSim,
                reason: e.to_string(),
            });
            (Vec::new(), missing)
        }
    }
}

/// Target clock in MHz: `TANDEM_FPGA_CLOCK_MHZ`, else 300.
pub fn clock_mhz() -> f64 {
    std::env::var("TANDEM_FPGA_CLOCK_MHZ")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|v| *v > 0.0)
        .unwrap_or(300.0)
}

/// The Verilator-simulated card as a device.
#[derive(Debug)]
pub struct FpgaSimBackend {
    info: DeviceInfo,
    router: RouterCore,
    clock_mhz: f64,
    gemm: GemmCore,
    attention: [(&'static str, AttentionCore); 2],
    /// One card per kernel, opened and loaded at its first launch (the first Verilator build
    /// of a kernel takes a while; later ones load from the cache).
    cards: Mutex<HashMap<&'static str, SimCard>>,
}

impl FpgaSimBackend {
    /// A simulated card with the default router build.
    pub fn new(verilator: &str) -> Self {
        let router = RouterCore::default();
        let gemm = GemmCore {
            rows: 8,
            k_max: 4096,
            n_max: 4096,
        };
        let attention = attention::builds();
        let clock_mhz = clock_mhz();
        let clock = clock_mhz * 1e6;
        let mem = tandem_sim::MemConfig::default();
        let info = DeviceInfo {
            id: DeviceId {
                kind: DeviceKind::FpgaSim,
                index: 0,
            },
            name: "Alveo (Verilator-simulated)".into(),
            memory_bytes: u64::from(mem.banks) * mem.bank_bytes,
            // The router: one logit per cycle, ~8 operations each.
            peak_flops: 8.0 * clock,
            peak_bandwidth: 8.0 * clock,
            compute_dtype: DType::I8,
            details: vec![
                ("simulator".into(), verilator.to_string()),
                ("clock".into(), format!("{clock_mhz} MHz")),
                (
                    "kernels".into(),
                    format!(
                        "router (e_max={}, k_max={}), gemm (rows={}, k_max={}, n_max={}), \
                         attention (d_max={} and {}, nkv_max={}, kv_tile={})",
                        router.e_max,
                        router.k_max,
                        gemm.rows,
                        gemm.k_max,
                        gemm.n_max,
                        attention[0].1.d_max,
                        attention[1].1.d_max,
                        attention[0].1.nkv_max,
                        attention[0].1.kv_tile
                    ),
                ),
            ],
        };
        Self {
            info,
            router,
            clock_mhz,
            gemm,
            attention,
            cards: Mutex::new(HashMap::new()),
        }
    }

    fn route_support(&self, p: &MoeRouteParams, inputs: &[TensorMeta]) -> Support {
        let Some(l) = inputs.first() else {
            return Support::No("moe_route takes logits".into());
        };
        let e = l.shape.get(1).copied().unwrap_or(0);
        if !p.renormalize {
            return Support::No(
                "the router kernel renormalises over the k selected experts only".into(),
            );
        }
        if e > self.router.e_max as usize || p.top_k > self.router.k_max as usize {
            return Support::No(format!(
                "E = {e}, k = {} exceed the router build (e_max = {}, k_max = {})",
                p.top_k, self.router.e_max, self.router.k_max
            ));
        }
        Support::Native
    }

    /// Runs `f` on the card of kernel `name`, opening and loading it first if needed.
    fn with_card<R>(
        &self,
        name: &'static str,
        core: &dyn KernelCore,
        f: impl FnOnce(&mut SimCard) -> std::result::Result<R, FpgaError>,
    ) -> Result<R> {
        let mut cards = self.cards.lock().unwrap_or_else(|e| e.into_inner());
        if !cards.contains_key(name) {
            let mut card = SimCard::open(SimConfig {
                clock_mhz: self.clock_mhz,
                ..SimConfig::default()
            })
            .map_err(|e| Error::Unavailable {
                device: "fpga-sim:0".into(),
                reason: e.to_string(),
            })?;
            card.load_core(core, ShellConfig::default())
                .map_err(fpga_err)?;
            cards.insert(name, card);
        }
        let card = cards
            .get_mut(name)
            .ok_or_else(|| Error::Internal(format!("fpga-sim card {name} missing")))?;
        f(card).map_err(fpga_err)
    }

    fn linear_support(&self, p: &LinearParams, inputs: &[TensorMeta]) -> Support {
        let Ok((m, n, k)) = p.mnk(inputs) else {
            return Support::No("invalid linear inputs".into());
        };
        if !matches!(p.act, Activation::None | Activation::Relu) {
            return Support::No(format!("the GEMM kernel has ReLU only, not {:?}", p.act));
        }
        if n > self.gemm.n_max as usize || k > self.gemm.k_max as usize {
            return Support::No(format!(
                "N = {n}, K = {k} exceed the GEMM build (n_max = {}, k_max = {})",
                self.gemm.n_max, self.gemm.k_max
            ));
        }
        if (m as u128) * (n as u128) * (k as u128) > MAX_SIM_MACS {
            return Support::No(format!(
                "{m}x{n}x{k} MACs is more than the simulator runs quickly ({MAX_SIM_MACS})"
            ));
        }
        Support::Native
    }

    /// x per tensor and w per output channel to int8, bias to int32, y per tensor (scale
    /// calibrated on up to 16 rows of x, 25% margin): `fpga::golden::gemm::QuantLinear`.
    fn run_linear(&self, p: &LinearParams, inputs: &[&Tensor]) -> Result<(Tensor, u64)> {
        let metas: Vec<TensorMeta> = inputs.iter().map(|t| t.meta()).collect();
        let outs = p.validate(&metas)?;
        let (m, n, k) = p.mnk(&metas)?;
        let x: Vec<f32> = inputs[0].as_f32()?.iter().copied().collect();
        let w: Vec<f32> = inputs[1].as_f32()?.iter().copied().collect();
        let b: Option<Vec<f32>> = if p.bias {
            Some(inputs[2].as_f32()?.iter().copied().collect())
        } else {
            None
        };
        let relu = p.act == Activation::Relu;
        let step = m.div_ceil(16).max(1);
        let sample: Vec<f32> = (0..m)
            .step_by(step)
            .flat_map(|r| x[r * k..(r + 1) * k].iter().copied())
            .collect();
        let x_scale = gq::scale_of(&x);
        let y_scale = gq::QuantLinear::calibrate_y_scale(&sample, &w, b.as_deref(), n, k, relu);
        let ql = gq::QuantLinear::new(&w, b.as_deref(), n, k, x_scale, y_scale)
            .map_err(|e| Error::invalid("linear", e.to_string()))?;
        let xq: Vec<i8> = x.iter().map(|&v| gq::quantize_value(v, x_scale)).collect();
        let d = gq::GemmDims { m, n, k };
        let (yq, stats) = self.with_card("gemm", &self.gemm, |card| {
            tandem_sim::run::run_gemm(
                card,
                &xq,
                &ql.w,
                &ql.bias,
                &ql.requant,
                relu,
                d,
                RUN_TIMEOUT,
            )
        })?;
        let y: Vec<f32> = yq.iter().map(|&v| f32::from(v) * y_scale).collect();
        Ok((Tensor::from_vec_f32(&outs[0].shape, y)?, stats.cycles))
    }

    fn run_route(&self, p: &MoeRouteParams, logits: &Tensor) -> Result<(Vec<Tensor>, u64)> {
        let metas = p.validate(&[logits.meta()])?;
        let x = logits.as_f32()?;
        let (t, e, k) = (x.shape()[0], x.shape()[1], p.top_k);
        let flat: Vec<f32> = x.iter().copied().collect();
        if let Some(i) = flat.iter().position(|v| !v.is_finite()) {
            return Err(Error::invalid(
                "moe_route",
                format!("logit of token {} is not finite", i / e.max(1)),
            ));
        }
        let q: Vec<i16> = flat.iter().map(|&v| quantize_logit(v)).collect();
        let (out, stats) = self.with_card("router", &self.router, |card| {
            tandem_sim::run::run_router(card, &q, t, e, k, RUN_TIMEOUT)
        })?;
        let ids: Vec<i32> = out.ids.iter().map(|&v| i32::from(v)).collect();
        let scale = f32::from(1u16 << (WEIGHT_FRAC_BITS - 1)) * 2.0;
        let weights: Vec<f32> = out.weights.iter().map(|&w| f32::from(w) / scale).collect();
        let counts: Vec<i32> = out.hist.iter().map(|&c| c as i32).collect();
        let (sorted, offsets) = align_blocks(&ids, &counts, p.block_size, metas[3].shape[0]);
        let (aux, z) = losses(&flat, t, e, &counts);
        let outs = vec![
            Tensor::from_vec_i32(&metas[0].shape, ids)?,
            Tensor::from_vec_f32(&metas[1].shape, weights)?,
            Tensor::from_vec_i32(&metas[2].shape, counts)?,
            Tensor::from_vec_i32(&metas[3].shape, sorted)?,
            Tensor::from_vec_i32(&metas[4].shape, offsets)?,
            Tensor::from_vec_f32(&[1], vec![aux as f32])?,
            Tensor::from_vec_f32(&[1], vec![z as f32])?,
        ];
        Ok((outs, stats.cycles))
    }
}

fn fpga_err(e: FpgaError) -> Error {
    match e {
        FpgaError::Timeout {
            kernel, timeout, ..
        } => Error::Timeout {
            what: format!("fpga-sim:0 kernel {kernel}"),
            timeout,
        },
        FpgaError::Unavailable { reason, .. } => Error::Unavailable {
            device: "fpga-sim:0".into(),
            reason,
        },
        other => Error::device("fpga-sim:0", other.to_string()),
    }
}

/// Groups slot ids by expert, each segment padded with the sentinel T*k to a multiple of
/// `block` (vLLM's moe_align_block_size; the same rule as `ops::moe`).
fn align_blocks(ids: &[i32], counts: &[i32], block: usize, len: usize) -> (Vec<i32>, Vec<i32>) {
    let sentinel = ids.len() as i32;
    let mut offsets = Vec::with_capacity(counts.len() + 1);
    offsets.push(0i32);
    for &c in counts {
        let padded = (c.max(0) as usize).div_ceil(block) * block;
        offsets.push(offsets[offsets.len() - 1] + padded as i32);
    }
    let mut sorted = vec![sentinel; len];
    let mut cursor: Vec<usize> = offsets.iter().map(|&o| o as usize).collect();
    for (slot, &id) in ids.iter().enumerate() {
        if let Some(c) = cursor.get_mut(id as usize)
            && let Some(s) = sorted.get_mut(*c)
        {
            *s = slot as i32;
            *c += 1;
        }
    }
    (sorted, offsets)
}

/// Load-balancing loss E * sum_i (count_i / T) * P_i and z-loss mean_t lse_t^2, in f64 from
/// the f32 logits (host side: the kernel does not compute the full softmax).
fn losses(x: &[f32], t: usize, e: usize, counts: &[i32]) -> (f64, f64) {
    if t == 0 {
        return (0.0, 0.0);
    }
    let mut p = vec![0.0f64; e];
    let mut z = 0.0f64;
    for row in x.chunks(e) {
        let m = row
            .iter()
            .fold(f64::NEG_INFINITY, |a, &v| a.max(f64::from(v)));
        let s: f64 = row.iter().map(|&v| (f64::from(v) - m).exp()).sum();
        let lse = m + s.ln();
        z += lse * lse;
        for (acc, &v) in p.iter_mut().zip(row) {
            *acc += (f64::from(v) - m).exp() / s;
        }
    }
    let tf = t as f64;
    let aux: f64 = counts
        .iter()
        .zip(&p)
        .map(|(&c, &pi)| f64::from(c) / tf * (pi / tf))
        .sum();
    (e as f64 * aux, z / tf)
}

fn host_tensor(s: &DeviceStorage) -> Result<&Tensor> {
    s.downcast::<Tensor>()
        .ok_or_else(|| Error::Internal(format!("{s:?} is not fpga-sim storage")))
}

impl Backend for FpgaSimBackend {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn supports(&self, op: &Op, inputs: &[TensorMeta]) -> Support {
        match op {
            Op::MoeRoute(p) => self.route_support(p, inputs),
            Op::Linear(p) => self.linear_support(p, inputs),
            Op::Attention(p) => attention::support(&self.attention, p, inputs),
            other => Support::No(format!(
                "no FPGA kernel for {} in this build (router, GEMM and attention are plugged in)",
                other.name()
            )),
        }
    }

    /// The simulated card's banks are filled at launch: storage is a host copy tagged with
    /// this device (the card's memory is the simulator's own address space).
    fn upload(&self, host: &Tensor) -> Result<DeviceStorage> {
        Ok(DeviceStorage::new(self.id(), host.meta(), host.clone()))
    }

    fn download(&self, storage: &DeviceStorage) -> Result<Tensor> {
        host_tensor(storage).cloned()
    }

    fn launch(&self, op: &Op, inputs: &[&DeviceStorage]) -> Result<Launch> {
        let metas: Vec<TensorMeta> = inputs.iter().map(|s| s.meta.clone()).collect();
        if let Support::No(why) = self.supports(op, &metas) {
            return Err(Error::Unsupported {
                op: op.name().into(),
                device: self.id().to_string(),
                why,
            });
        }
        let (outs, cycles, kernel) = match op {
            Op::MoeRoute(p) => {
                let (o, c) = self.run_route(p, host_tensor(inputs[0])?)?;
                (o, c, ROUTER_KERNEL)
            }
            Op::Linear(p) => {
                let t = inputs
                    .iter()
                    .map(|s| host_tensor(s))
                    .collect::<Result<Vec<_>>>()?;
                let (o, c) = self.run_linear(p, &t)?;
                (vec![o], c, GEMM_KERNEL)
            }
            Op::Attention(p) => {
                let t = inputs
                    .iter()
                    .map(|s| host_tensor(s))
                    .collect::<Result<Vec<_>>>()?;
                let d = metas.first().and_then(|m| m.shape.last()).copied();
                let (name, core) = d
                    .and_then(|d| attention::pick(&self.attention, d))
                    .ok_or_else(|| Error::Internal("no attention build for this shape".into()))?;
                let (o, c) = attention::run(p, &t, RUN_TIMEOUT, |f| {
                    self.with_card(name, &core, |card| f(card))
                })?;
                (o, c, attention::ATTENTION_KERNEL)
            }
            other => {
                return Err(Error::Internal(format!(
                    "fpga-sim cannot launch {}",
                    other.name()
                )));
            }
        };
        let device_time = Duration::from_secs_f64(cycles as f64 / (self.clock_mhz * 1e6));
        Ok(Launch {
            outputs: outs
                .into_iter()
                .map(|t| DeviceStorage::new(self.id(), t.meta(), t))
                .collect(),
            done: Completion::done(),
            info: Arc::new(Mutex::new(LaunchInfo {
                kernel: kernel.into(),
                device_time: Some(device_time),
                cycles: Some(cycles),
            })),
        })
    }

    /// Attention: the kernel's cycle model (`attention::estimate_cycles`, within a few percent
    /// of the simulated cycles) at the clock; other ops: the op's cost at the device's rates.
    fn estimate(&self, op: &Op, inputs: &[TensorMeta]) -> Duration {
        if let Op::Attention(p) = op
            && let Ok(s) = p.shape(inputs)
        {
            let cycles = attention::estimate_cycles(p.causal, &s);
            return Duration::from_secs_f64(cycles as f64 / (self.clock_mhz * 1e6))
                + self.launch_overhead();
        }
        let c = op.cost(inputs);
        let t = (c.flops / self.info.peak_flops.max(1.0))
            .max(c.bytes / self.info.peak_bandwidth.max(1.0));
        Duration::from_secs_f64(t) + self.launch_overhead()
    }

    fn launch_overhead(&self) -> Duration {
        Duration::from_micros(20)
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn align_pads_segments() {
        let (s, o) = align_blocks(&[1, 0, 1, 1], &[1, 3, 0], 2, 8);
        assert_eq!(o, vec![0, 2, 6, 6]);
        assert_eq!(s, vec![1, 4, 0, 2, 3, 4, 4, 4]);
    }

    #[test]
    fn unsupported_ops_say_why() {
        let b = FpgaSimBackend::new("test");
        let m = TensorMeta::new(vec![4, 512], DType::F32);
        let p = MoeRouteParams::default();
        assert!(matches!(
            b.supports(&Op::MoeRoute(p), std::slice::from_ref(&m)),
            Support::No(_)
        ));
        let m = TensorMeta::new(vec![4, 64], DType::F32);
        assert_eq!(
            b.supports(&Op::MoeRoute(p), std::slice::from_ref(&m)),
            Support::Native
        );
        assert!(matches!(
            b.supports(&Op::Add, &[m.clone(), m]),
            Support::No(_)
        ));
    }
}
