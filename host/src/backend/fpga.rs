//! The FPGA backend: runs kernels on an `FpgaDevice`. Today that is `tandem_sim::SimCard`
//! (Verilator), listed as `fpga-sim:0`; the XRT board driver will plug in behind the same
//! trait.
//!
//! Ops: `moe_route` (renormalised top-k, E <= e_max, k <= k_max of the loaded build) on the
//! router kernel; everything else answers [`Support::No`] so the planner keeps it on the CPU.
//! At the boundary the f32 logits are quantised to Q7.8 int16 and the Q0.15 weights
//! dequantised back; the outputs the kernel does not make (the block-aligned permutation, the
//! expert offsets and both losses) are computed on the host from the kernel's ids and
//! histogram and the logits, which `LaunchInfo::kernel` says (`moe_router_int16+host_align`).
//! `LaunchInfo::cycles` is the simulated kernel cycles (ap_start to ap_done) and
//! `device_time` = cycles / clock (300 MHz, or `TANDEM_FPGA_CLOCK_MHZ`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tandem_fpga::FpgaError;
use tandem_fpga::golden::router::{WEIGHT_FRAC_BITS, quantize_logit};
use tandem_fpga::kernels::router::RouterCore;
use tandem_fpga::shell::ShellConfig;
use tandem_sim::{SimCard, SimConfig};

use super::{
    Backend, DeviceId, DeviceInfo, DeviceKind, DeviceStorage, Launch, LaunchInfo, Missing, Support,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{MoeRouteParams, Op};
use crate::sync::Completion;
use crate::tensor::{Tensor, TensorMeta};

/// Kernel name reported for routing.
pub const ROUTER_KERNEL: &str = "moe_router_int16+host_align";

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
    /// Opened and loaded at first launch (the first build of the model takes a while).
    card: Mutex<Option<SimCard>>,
}

impl FpgaSimBackend {
    /// A simulated card with the default router build.
    pub fn new(verilator: &str) -> Self {
        let router = RouterCore::default();
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
                    format!("router (e_max={}, k_max={})", router.e_max, router.k_max),
                ),
            ],
        };
        Self {
            info,
            router,
            clock_mhz,
            card: Mutex::new(None),
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
        let mut guard = self.card.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            let mut card = SimCard::open(SimConfig {
                clock_mhz: self.clock_mhz,
                ..SimConfig::default()
            })
            .map_err(|e| Error::Unavailable {
                device: "fpga-sim:0".into(),
                reason: e.to_string(),
            })?;
            card.load_core(&self.router, ShellConfig::default())
                .map_err(fpga_err)?;
            *guard = Some(card);
        }
        let card = guard
            .as_mut()
            .ok_or_else(|| Error::Internal("fpga-sim card missing".into()))?;
        let (out, stats) =
            tandem_sim::run::run_router(card, &q, t, e, k, RUN_TIMEOUT).map_err(fpga_err)?;
        drop(guard);
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
        other => Error::Device {
            device: "fpga-sim:0".into(),
            msg: other.to_string(),
        },
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
            other => Support::No(format!(
                "no FPGA kernel for {} in this build (the router is the only RTL kernel plugged in)",
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
        let Op::MoeRoute(p) = op else {
            return Err(Error::Internal(format!(
                "fpga-sim cannot launch {}",
                op.name()
            )));
        };
        let logits = host_tensor(inputs[0])?;
        let (outs, cycles) = self.run_route(p, logits)?;
        let device_time = Duration::from_secs_f64(cycles as f64 / (self.clock_mhz * 1e6));
        Ok(Launch {
            outputs: outs
                .into_iter()
                .map(|t| DeviceStorage::new(self.id(), t.meta(), t))
                .collect(),
            done: Completion::done(),
            info: Arc::new(Mutex::new(LaunchInfo {
                kernel: ROUTER_KERNEL.into(),
                device_time: Some(device_time),
                cycles: Some(cycles),
            })),
        })
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
