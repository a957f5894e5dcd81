//! The FPGA backend: runs kernels on `FpgaDevice`s through the one set of drivers in
//! `tandem_fpga::drive`. The cards come from an [`OpenDevice`] factory: the Verilator-simulated
//! card (`tandem_sim`, listed as `fpga-sim:0`, [`sim_factory`]) or an Alveo board through XRT
//! (`fpga:N`, [`xrt_factory`], one backend per board the XRT probe found); nothing else here
//! knows which.
//!
//! What stays here is the host's side of each op: whether a build takes it, quantising the
//! inputs and dequantising the outputs, and building the output tensors.
//!
//! - `moe_route` ([`route`]): renormalised top-k, E <= e_max, k <= k_max of the loaded build,
//!   on the router kernel; the outputs the kernel does not make are computed by `ops::moe`
//!   (`moe_router_int16+host_align`).
//! - `linear` ([`linear`]): no activation or ReLU, N, K <= 4096, at most 2^26 MACs so the
//!   simulation stays quick, on the GEMM kernel (`linear_int8_gemm`).
//! - `attention` ([`attention`]): head dim <= 128, Nkv <= 512, on the streaming attention
//!   kernel (`attention_int8_stream`).
//!
//! - `rmsnorm` (with the fused residual), `rope`, `add` ([`vecops`]): rows up to 4096
//!   elements, on the streaming vector kernel (`vecops_int16_stream`); `split_heads` /
//!   `merge_heads` are the host's layout of the card buffers (`host_layout`, zero cycles).
//!
//! - `moe_experts` ([`experts`]): hidden size <= 4096, any F, T and E, as GEMM and vecops
//!   launches over card memory on one card that loads the two kernels in turn
//!   (`moe_experts_int8_gemm+vecops`); on the simulated cards only (a board would need one
//!   xclbin holding both kernels).
//!
//! Everything else answers [`Support::No`] so the planner keeps it on the CPU. Each kernel has
//! its own card, opened and loaded at first use. `LaunchInfo::cycles` is the kernel cycles
//! (ap_start to ap_done) and `device_time` = cycles / the card's clock
//! (`FpgaDevice::clock_hz`: the build's target clock, `tandem_fpga::DEFAULT_CLOCK_MHZ`, unless
//! `FpgaOptions::clock_mhz` says otherwise).

pub mod attention;
pub mod experts;
pub mod linear;
mod quant;
pub mod route;
mod transfer;
pub mod vecops;
pub mod xrt;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tandem_fpga::core::KernelCore;
use tandem_fpga::kernels::attention::AttentionCore;
use tandem_fpga::kernels::gemm::GemmCore;
use tandem_fpga::kernels::router::RouterCore;
use tandem_fpga::kernels::vecops::VecopsCore;
use tandem_fpga::shell::ShellConfig;
use tandem_fpga::timing::{self, MemTiming, WPlacement};
use tandem_fpga::{DEFAULT_CLOCK_MHZ, FpgaDevice, FpgaError};

pub use attention::ATTENTION_KERNEL;
pub use experts::EXPERTS_KERNEL;
pub use linear::GEMM_KERNEL;
pub use route::ROUTER_KERNEL;
pub use vecops::{LAYOUT_KERNEL, VECOPS_KERNEL};

use super::{
    Backend, DeviceId, DeviceInfo, DeviceKind, DeviceStorage, Launch, LaunchInfo, Missing, Support,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::Op;
use crate::options::{FpgaOptions, SimMode, SimProfile};
use crate::sync::Deadline;
use crate::tensor::{Tensor, TensorMeta};

/// Longest a kernel run may take (wall clock) when [`Backend::launch`] is called without a
/// deadline (the executor always gives one: `--timeout`).
const DEFAULT_RUN_TIMEOUT: Duration = Duration::from_secs(300);

/// Opens an FPGA card for one kernel, configured by the options: a simulated card or a board.
pub type OpenDevice =
    Box<dyn Fn(&FpgaOptions) -> std::result::Result<Box<dyn FpgaDevice>, FpgaError> + Send + Sync>;

/// Looks for Alveo boards (through XRT, [`xrt::discover`]) and the simulated card.
pub fn discover(opts: &FpgaOptions) -> (Vec<Arc<dyn Backend>>, Vec<Missing>) {
    let (mut found, mut missing) = xrt::discover(opts);
    match simulated(opts) {
        Ok(b) => found.push(Arc::new(b)),
        Err(reason) => missing.push(Missing {
            kind: DeviceKind::FpgaSim,
            reason,
        }),
    }
    (found, missing)
}

/// The simulated card's backend (`fpga-sim:0`: Verilator-simulated cards, and the modelled
/// card), or why there is none (no usable Verilator, unless `--fpga-sim-mode model` asks for
/// the modelled card only, which needs no simulator).
pub fn simulated(opts: &FpgaOptions) -> std::result::Result<FpgaBackend, String> {
    let toolchain = tandem_sim::Toolchain {
        cache_dir: opts.sim_cache.clone(),
        cxx: opts.cxx.clone(),
    };
    let mem = sim_mem(opts);
    let memory_bytes = u64::from(mem.banks) * mem.bank_bytes;
    let (name, simulator, open) = match tandem_sim::available_with(&toolchain) {
        Ok(version) => ("Alveo (Verilator-simulated)", version, sim_factory()),
        Err(e) if opts.sim_mode == SimMode::Model => {
            // every launch runs on the modelled card; an RTL card cannot be opened
            let reason = e.to_string();
            let why = reason.clone();
            let open: OpenDevice = Box::new(move |_: &FpgaOptions| {
                Err(FpgaError::Unavailable {
                    device: "fpga-sim".into(),
                    reason: why.clone(),
                })
            });
            (
                "Alveo (modelled)",
                format!("none, modelled card only ({reason})"),
                open,
            )
        }
        Err(e) => return Err(e.to_string()),
    };
    let card = CardInfo {
        kind: DeviceKind::FpgaSim,
        index: 0,
        name: name.into(),
        memory_bytes,
        details: vec![("simulator".into(), simulator)],
    };
    Ok(FpgaBackend::new(card, opts.clone(), open).with_model(model_factory()))
}

pub use xrt::xrt_factory;

/// The factory of simulated cards: a `tandem_sim::SimCard` configured from the options (clock
/// override, build cache, C++ compiler, memory, VCD trace).
pub fn sim_factory() -> OpenDevice {
    Box::new(|o: &FpgaOptions| {
        let mem = sim_mem(o);
        let cfg = tandem_sim::SimConfig {
            mem,
            clock_mhz: o.clock_mhz,
            vcd: o.sim_vcd.clone(),
            toolchain: tandem_sim::Toolchain {
                cache_dir: o.sim_cache.clone(),
                cxx: o.cxx.clone(),
            },
        };
        let card = tandem_sim::SimCard::open(cfg)?;
        Ok(Box::new(card) as Box<dyn FpgaDevice>)
    })
}

/// The factory of modelled cards: a `tandem_sim::ModelCard` (golden-model results, analytic
/// cycles) with the simulated card's memory and clock options.
pub fn model_factory() -> OpenDevice {
    Box::new(|o: &FpgaOptions| {
        let mem = sim_mem(o);
        let cfg = tandem_sim::ModelConfig {
            mem,
            clock_mhz: o.clock_mhz,
        };
        Ok(Box::new(tandem_sim::ModelCard::open(cfg)) as Box<dyn FpgaDevice>)
    })
}

/// Estimated cycles above which `SimMode::Auto` runs a launch on the modelled card (about
/// ten seconds of RTL simulation here).
pub const AUTO_MODEL_CYCLES: u64 = 1 << 22;

/// What a kind of card is, as the backend reports it.
#[derive(Debug, Clone)]
pub struct CardInfo {
    /// Device kind (simulated or a board).
    pub kind: DeviceKind,
    /// Index among the devices of its kind (`fpga:1` is the second board).
    pub index: usize,
    /// Human-readable name.
    pub name: String,
    /// Device memory in bytes.
    pub memory_bytes: u64,
    /// Details of the card (simulator version, board, shell).
    pub details: Vec<(String, String)>,
}

/// The open cards of a backend, by kernel build and whether it is the modelled card.
type Cards = HashMap<(&'static str, bool), Box<dyn FpgaDevice>>;

/// FPGA cards as a device: one card per kernel, opened by the factory and loaded at the
/// kernel's first launch.
pub struct FpgaBackend {
    info: DeviceInfo,
    opts: FpgaOptions,
    open: OpenDevice,
    /// The modelled cards' factory, where the backend is a simulated card (not a board).
    modelled: Option<OpenDevice>,
    router: RouterCore,
    gemm: GemmCore,
    attention: [(&'static str, AttentionCore); 3],
    vecops: VecopsCore,
    /// One card per kernel build and mode (the first Verilator build of a kernel takes a
    /// while; later ones load from the cache).
    cards: Mutex<Cards>,
}

impl std::fmt::Debug for FpgaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cards = self
            .cards
            .lock()
            .map(|c| c.keys().copied().collect::<Vec<_>>())
            .unwrap_or_default();
        f.debug_struct("FpgaBackend")
            .field("info", &self.info)
            .field("opts", &self.opts)
            .field("cards", &cards)
            .finish_non_exhaustive()
    }
}

/// The GEMM build the backend loads by default (profile `ci`): an 8-row, 8-lane array on a
/// 64-bit port, K and N up to 4096 (the build the bit-exact tests of the shipped builds
/// check).
pub fn gemm_build() -> GemmCore {
    GemmCore {
        rows: 8,
        k_max: 4096,
        n_max: 4096,
        lanes: 8,
        w_ports: false,
    }
}

/// The GEMM build of a simulated card's profile: [`gemm_build`] for `ci`, the card-sized
/// [`GemmCore::u55c_wide`] (64 x 64 int8 MACs, 512-bit port) for `u55c`.
pub fn gemm_build_for(profile: SimProfile) -> GemmCore {
    match profile {
        SimProfile::Ci => gemm_build(),
        SimProfile::U55c => GemmCore::u55c_wide(),
    }
}

/// The simulated memory of the options: the simulator's default; for the `u55c` profile the
/// U55C's HBM (32 pseudo-channels of 512 MiB, each moving 14.4 GB/s, read latency from the
/// platform) behind a port of 64 bytes a cycle (the 512-bit GEMM port's peak) at the build
/// clock; then the explicit overrides.
fn sim_mem(o: &FpgaOptions) -> tandem_sim::MemConfig {
    let mut mem = tandem_sim::MemConfig::default();
    if o.sim_profile == SimProfile::U55c {
        let mhz = o.clock_mhz.unwrap_or(DEFAULT_CLOCK_MHZ);
        mem = tandem_sim::MemConfig::for_platform(&tandem_fpga::platform::U55C, mhz, 64);
    }
    if let Some(l) = o.sim_read_latency {
        mem.read_latency = l;
    }
    if let Some(b) = o.sim_bytes_per_cycle {
        mem.bytes_per_cycle = b;
    }
    mem
}

impl FpgaBackend {
    /// A backend over cards of kind `card` that `open` makes, with the default builds: the
    /// router, an 8-row GEMM (K, N up to 4096) and the attention builds.
    pub fn new(card: CardInfo, opts: FpgaOptions, open: OpenDevice) -> Self {
        let router = RouterCore::default();
        // a board runs the xclbins it has; a simulated card the builds of its profile
        let gemm = match card.kind {
            DeviceKind::FpgaSim => gemm_build_for(opts.sim_profile),
            _ => gemm_build(),
        };
        let attention = match card.kind {
            DeviceKind::FpgaSim => attention::builds_for(opts.sim_profile),
            _ => attention::builds(),
        };
        let vecops = vecops::vecops_build();
        let clock_mhz = opts.clock_mhz.unwrap_or(DEFAULT_CLOCK_MHZ);
        let clock = clock_mhz * 1e6;
        let mut details = card.details;
        if card.kind == DeviceKind::FpgaSim {
            details.push(("sim profile".into(), opts.sim_profile.name().into()));
        }
        details.extend([
            ("clock".into(), format!("{clock_mhz} MHz")),
            (
                "kernels".into(),
                format!(
                    "router (e_max={}, k_max={}, lanes={}, data_bits={}), gemm (rows={}, lanes={}, k_max={}, n_max={}), \
                     attention (d_max={}, {} and {}, nkv_max={} per launch, kv_tile={}{}), \
                     vecops (n_max={})",
                    router.e_max,
                    router.k_max,
                    router.lanes,
                    router.data_bits,
                    gemm.rows,
                    gemm.lanes,
                    gemm.k_max,
                    gemm.n_max,
                    attention[0].1.d_max,
                    attention[1].1.d_max,
                    attention[2].1.d_max,
                    attention[0].1.nkv_max,
                    attention[0].1.kv_tile,
                    if attention.iter().any(|(_, c)| c.q_rows > 1) {
                        format!(
                            ", q_rows={}, {} and {}",
                            attention[0].1.q_rows, attention[1].1.q_rows, attention[2].1.q_rows
                        )
                    } else {
                        String::new()
                    },
                    vecops.n_max
                ),
            ),
        ]);
        let info = DeviceInfo {
            id: DeviceId {
                kind: card.kind,
                index: card.index,
            },
            name: card.name,
            memory_bytes: card.memory_bytes,
            // The router: one logit per cycle, ~8 operations each.
            peak_flops: 8.0 * clock,
            // one beat of the widest port a cycle (the GEMM's: 8 bytes, 64 on a 512-bit build)
            peak_bandwidth: f64::from(gemm.lanes.max(8)) * clock,
            compute_dtype: DType::I8,
            details,
        };
        Self {
            info,
            opts,
            open,
            modelled: None,
            router,
            gemm,
            attention,
            vecops,
            cards: Mutex::new(HashMap::new()),
        }
    }

    /// Adds the modelled card (`FpgaOptions::sim_mode` decides when it runs a launch).
    pub fn with_model(mut self, open: OpenDevice) -> Self {
        self.info
            .details
            .push(("sim mode".into(), self.opts.sim_mode.name().into()));
        self.modelled = Some(open);
        self
    }

    /// Whether a launch of about `cycles` runs on the modelled card.
    fn use_model(&self, cycles: u64) -> bool {
        match (&self.modelled, self.opts.sim_mode) {
            (None, _) | (Some(_), SimMode::Rtl) => false,
            (Some(_), SimMode::Model) => true,
            (Some(_), SimMode::Auto) => cycles > AUTO_MODEL_CYCLES,
        }
    }

    /// Whether sizes past the RTL simulation's ceilings are taken (the modelled card runs them).
    fn model_sized(&self) -> bool {
        self.modelled.is_some() && self.opts.sim_mode != SimMode::Rtl
    }

    /// Estimated kernel cycles of an op this backend supports (the analytic models of
    /// `tandem_fpga::timing`).
    fn estimate_cycles(&self, op: &Op, inputs: &[TensorMeta]) -> Option<u64> {
        // the simulated card's memory (the u55c profile's HBM banks behind 64-byte beats,
        // the GEMM's W stream as the driver places it: striped over two banks of its own
        // where the card has three, `drive::w_stripe_banks`, else in one); a board: the
        // default
        let (mem, w) = if self.info.id.kind == DeviceKind::FpgaSim {
            let m = sim_mem(&self.opts);
            let w = match m.bank_bytes_per_cycle {
                Some(bank) if m.banks > 1 => WPlacement::OwnBank {
                    port_bytes_per_cycle: m.bytes_per_cycle,
                    bank_bytes_per_cycle: if tandem_fpga::drive::stripes_w(m.banks) {
                        2.0 * bank
                    } else {
                        bank
                    },
                },
                _ => WPlacement::Shared,
            };
            let mem = MemTiming {
                read_latency: m.read_latency,
                write_latency: m.write_latency,
                bytes_per_cycle: m.stream_bytes_per_cycle(),
                bank_bytes_per_cycle: m.bank_bytes_per_cycle,
            };
            (mem, w)
        } else {
            (MemTiming::default(), WPlacement::Shared)
        };
        match op {
            Op::MoeRoute(p) => {
                let l = inputs.first()?;
                let (t, e) = (*l.shape.first()? as u64, *l.shape.get(1)? as u64);
                Some(timing::router_cycles_with(
                    &self.router,
                    t,
                    e,
                    p.top_k as u64,
                    p.renormalize,
                    &mem,
                ))
            }
            Op::Linear(p) => {
                let (m, n, k) = p.mnk(inputs).ok()?;
                Some(timing::gemm_split_cycles_placed(
                    &self.gemm, m as u64, n as u64, k as u64, &mem, w,
                ))
            }
            Op::Attention(p) => {
                let s = p.shape(inputs).ok()?;
                let (_, core) = attention::pick(&self.attention, s.d)?;
                Some(attention::estimate_cycles(&core, p.causal, &s))
            }
            Op::RmsNorm(_) | Op::Rope(_) | Op::Add | Op::SplitHeads(_) | Op::MergeHeads => {
                vecops::cycles(&self.vecops, op, inputs)
            }
            Op::MoeExperts(p) => {
                experts::estimate_cycles(&self.gemm, &self.vecops, p, inputs, &mem, w)
            }
            _ => None,
        }
    }

    /// The clock the planner's estimates use, Hz: the option's, else the builds' target.
    fn nominal_clock_hz(&self) -> f64 {
        self.opts.clock_mhz.unwrap_or(DEFAULT_CLOCK_MHZ) * 1e6
    }

    /// Runs `f` on the card of build `name` (opening it and loading `core` first if needed);
    /// returns its result and the card's clock in Hz.
    fn with_card<R>(
        &self,
        name: &'static str,
        core: &dyn KernelCore,
        modelled: bool,
        f: impl FnOnce(&mut dyn FpgaDevice) -> std::result::Result<R, FpgaError>,
    ) -> Result<(R, f64)> {
        let device = self.id().to_string();
        let key = (name, modelled);
        let mut cards = self.cards.lock().unwrap_or_else(|e| e.into_inner());
        if let std::collections::hash_map::Entry::Vacant(slot) = cards.entry(key) {
            let open = match (&self.modelled, modelled) {
                (Some(m), true) => m,
                _ => &self.open,
            };
            let mut card = open(&self.opts).map_err(|e| fpga_err(&device, e))?;
            card.load_core(core, ShellConfig::default())
                .map_err(|e| fpga_err(&device, e))?;
            slot.insert(card);
        }
        let card = cards
            .get_mut(&key)
            .ok_or_else(|| Error::Internal(format!("{device} card {name} missing")))?;
        let clock = card.clock_hz();
        // A simulated card's model keeps one core busy: CPU ops starting meanwhile use one
        // thread fewer.
        let _core = (self.info.id.kind == DeviceKind::FpgaSim).then(super::cpu::SimCoreClaim::new);
        match f(card.as_mut()) {
            Ok(r) => Ok((r, clock)),
            Err(e) => {
                if matches!(e, FpgaError::Timeout { .. } | FpgaError::Device { .. }) {
                    // The kernel may still be running, or the card is in an unknown state:
                    // close it; the next launch opens and loads a fresh one.
                    cards.remove(&key);
                }
                Err(fpga_err(&device, e))
            }
        }
    }
}

/// An FPGA device error as the library's, by meaning: a bad argument or access is the
/// caller's, memory is exhausted, a run timed out, a card or its kernel is unavailable, or
/// the device failed.
fn fpga_err(device: &str, e: FpgaError) -> Error {
    match e {
        FpgaError::BadArgument { .. } | FpgaError::OutOfRange { .. } => {
            Error::bad_argument(device, e.to_string()).with_source(e)
        }
        FpgaError::OutOfMemory { bytes, free, .. } => {
            Error::out_of_memory(device, bytes, Some(free)).with_source(e)
        }
        FpgaError::Timeout {
            kernel, timeout, ..
        } => Error::Timeout {
            what: format!("{device} kernel {kernel}"),
            timeout,
        },
        FpgaError::Unavailable { reason, .. } => Error::Unavailable {
            device: device.into(),
            reason,
        },
        // A core that did not build or load (Verilator, or an xclbin on a board): the card
        // itself is fine, as with a kernel NVRTC refuses.
        FpgaError::Load {
            ref kernel,
            ref msg,
        } => Error::compile(device, kernel.clone(), msg.clone(), "").with_source(e),
        FpgaError::NotLoaded { .. } => {
            Error::Internal(format!("{device}: driven before its core was loaded: {e}"))
        }
        FpgaError::Device { ref msg, .. } => Error::device(device, msg.clone()).with_source(e),
        FpgaError::Io { path, source } => Error::file(path, source.to_string()),
    }
}

impl Backend for FpgaBackend {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn numerics(&self) -> super::Numerics {
        super::Numerics::Int8
    }

    fn supports(&self, op: &Op, inputs: &[TensorMeta]) -> Support {
        match op {
            Op::MoeRoute(p) => route::support(&self.router, p, inputs),
            Op::Linear(p) => {
                let max = if self.model_sized() {
                    linear::MAX_MODEL_MACS
                } else {
                    linear::MAX_SIM_MACS
                };
                linear::support(&self.gemm, p, inputs, max)
            }
            Op::Attention(p) => {
                let max = if self.model_sized() {
                    attention::MAX_MODEL_CYCLES
                } else {
                    attention::MAX_SIM_CYCLES
                };
                attention::support(&self.attention, p, inputs, max)
            }
            Op::RmsNorm(_) | Op::Rope(_) | Op::Add | Op::SplitHeads(_) | Op::MergeHeads => {
                let max = (!self.model_sized()).then_some(vecops::MAX_SIM_CYCLES);
                vecops::support(&self.vecops, op, inputs, max)
            }
            Op::MoeExperts(_) if self.info.id.kind != DeviceKind::FpgaSim => Support::No(
                "moe_experts runs GEMM and vecops launches over one card's memory: a board needs \
                 one xclbin holding both kernels, which the board flow does not build yet"
                    .into(),
            ),
            Op::MoeExperts(p) => {
                let max = if self.model_sized() {
                    experts::MAX_MODEL_MACS
                } else {
                    experts::MAX_SIM_MACS
                };
                experts::support(&self.gemm, &self.vecops, p, inputs, max)
            }
            Op::AttentionDecode(_) => Support::No(
                "no FPGA kernel for attention_decode: the streaming attention kernel takes dense \
                 K/V [B, H, N, D], not a KV cache with per-sequence lengths or a block table"
                    .into(),
            ),
            other => Support::No(format!(
                "no FPGA kernel for {} in this build (router, GEMM, attention, vecops \
                 (rmsnorm, rope, add; split/merge_heads as host layout) and moe_experts \
                 (GEMM + vecops) are plugged in)",
                other.name()
            )),
        }
    }

    /// The card's buffers are filled at launch (the drivers allocate them per run): storage
    /// is a host copy tagged with this device.
    fn upload(&self, host: &Tensor) -> Result<DeviceStorage> {
        Ok(DeviceStorage::new(self.id(), host.meta(), host.clone()))
    }

    fn download(&self, storage: &DeviceStorage) -> Result<Tensor> {
        storage.host_tensor("FPGA").cloned()
    }

    /// A host replica's tensor becomes this card's storage without a copy (shared): the
    /// drivers write the card's banks from it at launch.
    fn upload_storage(&self, host: &DeviceStorage) -> Result<DeviceStorage> {
        Ok(DeviceStorage::shared(
            self.id(),
            host.meta.clone(),
            host.host_shared("CPU")?,
        ))
    }

    /// The card's storage (the host tensor its banks were read back into) becomes the host
    /// replica without a copy (shared).
    fn download_storage(&self, storage: &DeviceStorage) -> Result<DeviceStorage> {
        Ok(DeviceStorage::shared(
            DeviceId::CPU,
            storage.meta.clone(),
            storage.host_shared("FPGA")?,
        ))
    }

    fn launch(&self, op: &Op, inputs: &[&DeviceStorage]) -> Result<Launch> {
        self.launch_within(op, inputs, &Deadline::after(DEFAULT_RUN_TIMEOUT))
    }

    /// Runs the op on the card, each kernel run waiting at most until `deadline` (the
    /// simulator stops at it; a card that timed out is closed and reopened at its next use).
    fn launch_within(
        &self,
        op: &Op,
        inputs: &[&DeviceStorage],
        deadline: &Deadline,
    ) -> Result<Launch> {
        let metas: Vec<TensorMeta> = inputs.iter().map(|s| s.meta.clone()).collect();
        if let Support::No(why) = self.supports(op, &metas) {
            return Err(Error::Unsupported {
                op: op.name().into(),
                device: self.id().to_string(),
                why,
            });
        }
        let tensors = inputs
            .iter()
            .map(|s| s.host_tensor("FPGA"))
            .collect::<Result<Vec<_>>>()?;
        let modelled = self.use_model(self.estimate_cycles(op, &metas).unwrap_or(0));
        let (outs, cycles, clock_hz, kernel) = match op {
            Op::MoeRoute(p) => {
                let job = route::RouteJob::new(p, tensors[0])?;
                let ((out, st), clock) =
                    self.with_card("router", &self.router, modelled, |dev| {
                        job.run(dev, &self.router, deadline.remaining())
                    })?;
                (job.outputs(out)?, st.cycles, clock, ROUTER_KERNEL)
            }
            Op::Linear(p) => {
                let job = linear::LinearJob::new(p, &tensors)?;
                let ((y, st), clock) = self.with_card("gemm", &self.gemm, modelled, |dev| {
                    job.run(dev, &self.gemm, deadline.remaining())
                })?;
                (vec![job.output(&y)?], st.cycles, clock, GEMM_KERNEL)
            }
            Op::Attention(p) => {
                let job = attention::AttentionJob::new(p, &tensors)?;
                let (heads, cycles, clock) = if job.is_empty() {
                    (Vec::new(), 0, self.nominal_clock_hz())
                } else {
                    let d = metas.first().and_then(|m| m.shape.last()).copied();
                    let (name, core) = d
                        .and_then(|d| attention::pick(&self.attention, d))
                        .ok_or_else(|| {
                            Error::Internal("no attention build for this shape".into())
                        })?;
                    let ((heads, st), clock) = self.with_card(name, &core, modelled, |dev| {
                        job.run(dev, &core, deadline.remaining())
                    })?;
                    (heads, st.cycles, clock)
                };
                (job.outputs(&heads)?, cycles, clock, ATTENTION_KERNEL)
            }
            Op::MoeExperts(p) => {
                let job = experts::ExpertsJob::new(p, &tensors)?;
                if job.is_empty() {
                    (
                        vec![job.output(&[])?],
                        0,
                        self.nominal_clock_hz(),
                        EXPERTS_KERNEL,
                    )
                } else {
                    let ((y, st), clock) =
                        self.with_card("experts", &self.gemm, modelled, |dev| {
                            job.run(dev, &self.gemm, &self.vecops, deadline.remaining())
                        })?;
                    tracing::debug!(
                        gemm = st.gemm_launches,
                        vecops = st.vecops_launches,
                        loads = st.loads,
                        "moe_experts on the card"
                    );
                    (vec![job.output(&y)?], st.cycles, clock, EXPERTS_KERNEL)
                }
            }
            Op::SplitHeads(_) | Op::MergeHeads => (
                vecops::layout(op, &tensors)?,
                0,
                self.nominal_clock_hz(),
                LAYOUT_KERNEL,
            ),
            Op::RmsNorm(_) | Op::Rope(_) | Op::Add => {
                let job = vecops::VecJob::new(&self.vecops, op, &tensors)?;
                if job.is_empty() {
                    let empty = tandem_fpga::golden::vecops::VecOut {
                        y: Vec::new(),
                        s: Vec::new(),
                    };
                    (
                        job.outputs(&empty)?,
                        0,
                        self.nominal_clock_hz(),
                        VECOPS_KERNEL,
                    )
                } else {
                    let ((out, st), clock) =
                        self.with_card("vecops", &self.vecops, modelled, |dev| {
                            job.run(dev, deadline.remaining())
                        })?;
                    (job.outputs(&out)?, st.cycles, clock, VECOPS_KERNEL)
                }
            }
            other => {
                return Err(Error::Internal(format!(
                    "{} cannot launch {}",
                    self.id(),
                    other.name()
                )));
            }
        };
        let device_time = crate::plan::duration_from_secs(cycles as f64 / clock_hz);
        Ok(Launch::finished_on_host(
            self.id(),
            outs,
            LaunchInfo {
                // The report says which card produced the figure: cycles simulated from the
                // RTL, or modelled.
                kernel: if modelled {
                    format!("{kernel} (modelled)")
                } else {
                    kernel.into()
                },
                device_time: Some(device_time),
                cycles: Some(cycles),
            },
        ))
    }

    /// The kernel's cycle model (`tandem_fpga::timing`, within 5% of the RTL's cycles) at the
    /// clock; other ops: the op's cost at the device's rates.
    fn estimate(&self, op: &Op, inputs: &[TensorMeta]) -> Duration {
        if let Some(cycles) = self.estimate_cycles(op, inputs) {
            return crate::plan::duration_from_secs(cycles as f64 / self.nominal_clock_hz())
                .saturating_add(self.launch_overhead());
        }
        let c = op.cost(inputs);
        let t = (c.flops / self.info.peak_flops.max(1.0))
            .max(c.bytes / self.info.peak_bandwidth.max(1.0));
        crate::plan::duration_from_secs(t).saturating_add(self.launch_overhead())
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
    use crate::error::ErrorKind;
    use crate::ops::MoeRouteParams;

    fn backend() -> FpgaBackend {
        let card = CardInfo {
            kind: DeviceKind::FpgaSim,
            index: 0,
            name: "test".into(),
            memory_bytes: 1 << 30,
            details: Vec::new(),
        };
        FpgaBackend::new(card, FpgaOptions::default(), sim_factory())
    }

    #[test]
    fn the_u55c_profile_picks_the_card_sized_gemm() {
        let card = |kind| CardInfo {
            kind,
            index: 0,
            name: "test".into(),
            memory_bytes: 1 << 30,
            details: Vec::new(),
        };
        let opts = FpgaOptions {
            sim_profile: SimProfile::U55c,
            ..FpgaOptions::default()
        };
        let b = FpgaBackend::new(card(DeviceKind::FpgaSim), opts.clone(), sim_factory());
        assert_eq!(b.gemm, GemmCore::u55c_wide());
        assert!(b.gemm.macs() >= 4096);
        assert_eq!(sim_mem(&opts).bytes_per_cycle, 64.0);
        assert!(
            b.info
                .details
                .iter()
                .any(|(k, v)| k == "sim profile" && v == "u55c")
        );
        // the default profile keeps CI's small build; an explicit bandwidth wins
        assert_eq!(backend().gemm, gemm_build());
        let slow = FpgaOptions {
            sim_bytes_per_cycle: Some(16.0),
            ..opts
        };
        assert_eq!(sim_mem(&slow).bytes_per_cycle, 16.0);
    }

    #[test]
    fn unsupported_ops_say_why() {
        let b = backend();
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
        assert_eq!(
            b.supports(&Op::Add, &[m.clone(), m.clone()]),
            Support::Native
        );
        assert!(matches!(
            b.supports(&Op::Add, &[m, TensorMeta::new(vec![4, 63], DType::F32)]),
            Support::No(_)
        ));
        let decode = Op::AttentionDecode(crate::ops::AttentionDecodeParams::default());
        assert!(matches!(
            b.supports(&decode, &[]),
            Support::No(why) if why.contains("attention_decode") && why.contains("KV cache")
        ));
    }

    #[test]
    fn clock_comes_from_the_options() {
        let b = backend();
        assert_eq!(b.nominal_clock_hz(), DEFAULT_CLOCK_MHZ * 1e6);
        let clock = b.info().details.iter().find(|(k, _)| k == "clock");
        let want = format!("{DEFAULT_CLOCK_MHZ} MHz");
        assert_eq!(clock.map(|(_, v)| v.as_str()), Some(want.as_str()));
    }

    #[test]
    fn device_errors_keep_their_meaning() {
        let d = "fpga-sim:0";
        let kind = |e: FpgaError| fpga_err(d, e).kind();
        let bad = FpgaError::BadArgument {
            kernel: "gemm".into(),
            msg: "m".into(),
        };
        assert_eq!(kind(bad), ErrorKind::BadArgument);
        let range = FpgaError::OutOfRange { msg: "x".into() };
        assert_eq!(kind(range), ErrorKind::BadArgument);
        let oom = FpgaError::OutOfMemory {
            bank: 0,
            bytes: 10,
            free: 1,
        };
        let e = fpga_err(d, oom);
        assert!(matches!(
            e,
            Error::OutOfMemory {
                bytes: Some(10),
                free: Some(1),
                ..
            }
        ));
        assert!(
            std::error::Error::source(&e).is_some(),
            "the FpgaError is kept"
        );
        let timeout = FpgaError::Timeout {
            kernel: "router".into(),
            timeout: Duration::from_secs(1),
            cycles: 5,
        };
        assert_eq!(kind(timeout), ErrorKind::DeadlineExceeded);
        let none = FpgaError::Unavailable {
            device: d.into(),
            reason: "no verilator".into(),
        };
        assert_eq!(kind(none), ErrorKind::Unavailable);
        let load = FpgaError::Load {
            kernel: "router".into(),
            msg: "build failed".into(),
        };
        assert_eq!(kind(load), ErrorKind::Compile);
        assert_eq!(
            kind(FpgaError::NotLoaded { device: d.into() }),
            ErrorKind::Internal
        );
        let dev = FpgaError::Device {
            device: d.into(),
            msg: "bus hang".into(),
        };
        assert!(matches!(fpga_err(d, dev), Error::Device { .. }));
    }
}
