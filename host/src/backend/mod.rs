//! The `Backend` trait and one module per device kind.
//!
//! A backend answers: who am I (name, memory, peak rates); which ops and precisions I support;
//! allocate, upload, download, peer-copy; launch an op asynchronously and hand back a
//! completion; estimate an op's cost. The planner and executor see nothing else.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod cuda_dtype;
pub mod fpga;
mod numerics;
mod registry;

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

pub use cuda_dtype::CudaDType;
pub use numerics::Numerics;
pub use registry::{DeviceRegistry, Missing, Probe};

use crate::error::Result;
use crate::ops::Op;
use crate::sync::Completion;
use crate::tensor::{Tensor, TensorMeta};

/// The kind of a device: the one list of backend names.
///
/// [`DeviceKind::name`] is the name on the command line (`--backend`) and in reports; parsing
/// also accepts the aliases `gpu` (cuda), `sim` (fpga-sim) and `xrt` (fpga). With the `cli`
/// feature the kind is a clap `ValueEnum` with the same names and aliases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum DeviceKind {
    /// The host CPU.
    #[cfg_attr(feature = "cli", value(name = "cpu"))]
    Cpu,
    /// An NVIDIA GPU through CUDA.
    #[cfg_attr(feature = "cli", value(name = "cuda", alias = "gpu"))]
    Cuda,
    /// An FPGA kernel simulated with Verilator.
    #[cfg_attr(feature = "cli", value(name = "fpga-sim", alias = "sim"))]
    FpgaSim,
    /// An Alveo board through XRT.
    #[cfg_attr(feature = "cli", value(name = "fpga", alias = "xrt"))]
    FpgaXrt,
}

impl DeviceKind {
    /// Every device kind, the CPU first.
    pub const ALL: [DeviceKind; 4] = [
        DeviceKind::Cpu,
        DeviceKind::Cuda,
        DeviceKind::FpgaSim,
        DeviceKind::FpgaXrt,
    ];

    /// The name used on the command line (`--backend`) and in reports: `cpu`, `cuda`,
    /// `fpga-sim`, `fpga`.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
            DeviceKind::FpgaSim => "fpga-sim",
            DeviceKind::FpgaXrt => "fpga",
        }
    }

    /// Other names the kind is parsed from.
    pub fn aliases(self) -> &'static [&'static str] {
        match self {
            DeviceKind::Cpu => &[],
            DeviceKind::Cuda => &["gpu"],
            DeviceKind::FpgaSim => &["sim"],
            DeviceKind::FpgaXrt => &["xrt"],
        }
    }

    /// The accepted names, comma separated, for error messages: `cpu, cuda, fpga-sim, fpga`.
    pub fn accepted() -> String {
        DeviceKind::ALL.map(DeviceKind::name).join(", ")
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DeviceKind {
    type Err = crate::error::Error;

    /// Parses a [`DeviceKind::name`] or one of its [`DeviceKind::aliases`].
    fn from_str(s: &str) -> Result<Self> {
        DeviceKind::ALL
            .into_iter()
            .find(|k| k.name() == s || k.aliases().contains(&s))
            .ok_or_else(|| {
                crate::error::Error::invalid(
                    "backend",
                    format!(
                        "unknown backend '{s}' (accepted: {})",
                        DeviceKind::accepted()
                    ),
                )
            })
    }
}

/// One device: its kind and its index among devices of that kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct DeviceId {
    /// Kind.
    pub kind: DeviceKind,
    /// Index among devices of this kind.
    pub index: usize,
}

impl DeviceId {
    /// The host CPU.
    pub const CPU: DeviceId = DeviceId {
        kind: DeviceKind::Cpu,
        index: 0,
    };
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kind == DeviceKind::Cpu {
            f.write_str("cpu")
        } else {
            write!(f, "{}:{}", self.kind.name(), self.index)
        }
    }
}

/// What a device is and what it can do at its peak.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceInfo {
    /// Id.
    pub id: DeviceId,
    /// Human-readable name (CPU model, GPU name, card name).
    pub name: String,
    /// Memory the device can use, in bytes.
    pub memory_bytes: u64,
    /// Peak dense arithmetic rate at its main precision, FLOP/s (or int8 OP/s).
    pub peak_flops: f64,
    /// Peak memory bandwidth, bytes/s.
    pub peak_bandwidth: f64,
    /// Precision its matrix math runs in.
    pub compute_dtype: crate::dtype::DType,
    /// Further details as key/value pairs (cores, SIMD, compute capability, clock, kernels...).
    pub details: Vec<(String, String)>,
}

/// Data that lives on a device. The backend that made it knows its concrete type.
#[derive(Clone)]
pub struct DeviceStorage {
    /// Device holding the data.
    pub device: DeviceId,
    /// Logical shape and dtype.
    pub meta: TensorMeta,
    inner: Arc<dyn Any + Send + Sync>,
}

impl fmt::Debug for DeviceStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceStorage({} on {})", self.meta, self.device)
    }
}

impl DeviceStorage {
    /// Wraps backend-specific storage.
    pub fn new<T: Any + Send + Sync>(device: DeviceId, meta: TensorMeta, inner: T) -> Self {
        Self {
            device,
            meta,
            inner: Arc::new(inner),
        }
    }

    /// Wraps backend-specific storage that is already shared (e.g. a graph's host tensor, so
    /// that an execution holds it without copying it).
    pub fn shared<T: Any + Send + Sync>(device: DeviceId, meta: TensorMeta, inner: Arc<T>) -> Self {
        Self {
            device,
            meta,
            inner,
        }
    }

    /// Whether `self` and `other` hold the very same data (not equal data: the same value).
    pub fn same_data(&self, other: &DeviceStorage) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// A weak reference to the data, to recognise it later without keeping it alive.
    pub fn downgrade(&self) -> std::sync::Weak<dyn Any + Send + Sync> {
        Arc::downgrade(&self.inner)
    }

    /// The backend-specific storage, if it is a `T`.
    pub fn downcast<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.inner.downcast_ref::<T>()
    }

    /// How many values hold this storage (the buffer's replica, launches in flight, callers):
    /// 1 when only its buffer does, so that evicting the replica frees the memory.
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// The host tensor, shared rather than borrowed (no copy), for host replicas.
    pub fn host_shared(&self, who: &str) -> Result<Arc<Tensor>> {
        Arc::downcast::<Tensor>(self.inner.clone())
            .map_err(|_| crate::error::Error::Internal(format!("{self:?} is not {who} storage")))
    }

    /// The host tensor of a backend that keeps its storage in host memory (the CPU, and the
    /// simulated card until a launch writes its banks); `who` names the backend in the error.
    pub fn host_tensor(&self, who: &str) -> Result<&Tensor> {
        self.downcast::<Tensor>()
            .ok_or_else(|| crate::error::Error::Internal(format!("{self:?} is not {who} storage")))
    }
}

/// How an op was run: which kernel, and what the device itself measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LaunchInfo {
    /// Kernel (or kernels, joined by '+') that ran, e.g. `mha_bf16_fwd`.
    pub kernel: String,
    /// Time the device reports for the op itself (events, or simulated cycles / clock).
    pub device_time: Option<Duration>,
    /// Simulated or counted device cycles, where the device counts them.
    pub cycles: Option<u64>,
}

/// Graph nodes a device may run as one unit ([`Backend::launch_fused`]; the executor fuses
/// them where `crate::exec::ExecOptions::fuse` allows and nothing outside the unit reads what
/// stays inside it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FusedUnit {
    /// The MoE block: router logits (a linear without bias or activation) -> routing (these
    /// parameters) -> experts. Inputs: x [T, H], the router weight [E, H], gate_up [E, 2F, H],
    /// down [E, H, F]; outputs: the experts' output [T, H] and the routing's aux and z losses.
    /// The logits and the routing's other outputs stay inside.
    MoeBlock(crate::ops::MoeRouteParams),
}

impl FusedUnit {
    /// Short name, for reports.
    pub fn name(&self) -> &'static str {
        match self {
            FusedUnit::MoeBlock(_) => "moe block",
        }
    }
}

/// An op handed to a device: its outputs (valid once `done` completes) and how it ran.
#[derive(Debug)]
pub struct Launch {
    /// Output storage, in the op's output order.
    pub outputs: Vec<DeviceStorage>,
    /// Completes when the outputs are written.
    pub done: Completion,
    /// Kernel and device timing; device timing is filled in once `done` completes.
    pub info: std::sync::Arc<std::sync::Mutex<LaunchInfo>>,
}

impl Launch {
    /// A launch that has already finished, its outputs host tensors kept as `device`'s
    /// storage (the CPU, and the simulated card, which run an op before returning).
    pub fn finished_on_host(device: DeviceId, outputs: Vec<Tensor>, info: LaunchInfo) -> Self {
        Self {
            outputs: outputs
                .into_iter()
                .map(|t| DeviceStorage::new(device, t.meta(), t))
                .collect(),
            done: Completion::done(),
            info: Arc::new(std::sync::Mutex::new(info)),
        }
    }
}

/// Whether a device runs an op, and how well.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    /// Runs it natively.
    Native,
    /// Does not run it, with the reason.
    No(String),
}

/// A device that can hold tensors and run ops.
pub trait Backend: Send + Sync + fmt::Debug {
    /// Identity, memory and peak rates.
    fn info(&self) -> &DeviceInfo;

    /// The device id (shorthand for `info().id`).
    fn id(&self) -> DeviceId {
        self.info().id
    }

    /// What the device's arithmetic does to results (exact f32, 16-bit storage, int8 fixed
    /// point); by default the class of `info().compute_dtype`. Auto placement uses a lossy
    /// device only where the user allows it (`crate::plan::PlacementPolicy`).
    fn numerics(&self) -> Numerics {
        Numerics::of_dtype(self.info().compute_dtype)
    }

    /// Whether this device runs `op` on inputs of these shapes.
    fn supports(&self, op: &Op, inputs: &[TensorMeta]) -> Support;

    /// Bytes a tensor of `meta` takes on this device (what its memory limit is charged):
    /// by default the logical size; a backend storing floats in 16 bits says so.
    fn stored_bytes(&self, meta: &TensorMeta) -> u64 {
        meta.bytes() as u64
    }

    /// Bytes the device keeps beside input `input` of `op` (on inputs of these shapes) for as
    /// long as that input's storage stays on the device: forms it derives from a weight at
    /// first use and charges to its memory accounts ([`Backend::attach_memory`]), such as the
    /// CUDA backend's e4m3 copies of the MoE experts' weights (one byte a weight and an f32
    /// scale an output channel) when the FP8 experts run. The planner counts them with the
    /// weights resident on the device, once per weight like the weights themselves, so a
    /// `--memory-limit` holds them too. By default a device derives nothing: 0.
    fn derived_weight_bytes(&self, _op: &Op, _inputs: &[TensorMeta], _input: usize) -> u64 {
        0
    }

    /// Hands the device its registry's memory accounts, which it charges for what it keeps
    /// on the device beyond the storage it is handed (forms derived from a replica, such as
    /// the CUDA backend's e4m3 expert weights). By default a device keeps nothing more.
    fn attach_memory(&self, _accounts: &std::sync::Arc<crate::memory::DeviceMemory>) {}

    /// Copies a host tensor to the device.
    fn upload(&self, host: &Tensor) -> Result<DeviceStorage>;

    /// Copies the host tensor held by `host` (a CPU replica) to the device. A backend may use
    /// the storage's identity (the same tensor uploaded again: the CUDA backend then copies
    /// from its pages pinned in place); by default [`Backend::upload`].
    fn upload_storage(&self, host: &DeviceStorage) -> Result<DeviceStorage> {
        self.upload(host.host_tensor("CPU")?)
    }

    /// Copies a host tensor that will be input `input` of `op` to the device: a backend may
    /// store it in another precision for that op (the CUDA backend keeps `moe_route`'s logits
    /// f32 whatever its storage precision: [`CudaDType::input_precision`]). By default
    /// [`Backend::upload`].
    fn upload_for(&self, host: &Tensor, _op: &Op, _input: usize) -> Result<DeviceStorage> {
        self.upload(host)
    }

    /// Copies device data back to a host tensor of the logical dtype.
    fn download(&self, storage: &DeviceStorage) -> Result<Tensor>;

    /// Copies device data back as a host replica (storage of [`DeviceId::CPU`] holding a
    /// [`Tensor`]). Backends may land it in reused host memory that the link writes at its
    /// full rate (the CUDA backend's registered landings), so a result fetched run after run
    /// costs no page faults; the default wraps [`Backend::download`].
    fn download_storage(&self, storage: &DeviceStorage) -> Result<DeviceStorage> {
        Ok(DeviceStorage::new(
            DeviceId::CPU,
            storage.meta.clone(),
            self.download(storage)?,
        ))
    }

    /// Copies device data of another device of the same kind directly, if the link allows.
    /// Returns `Ok(None)` when no direct path exists (the caller then stages through host).
    fn copy_peer(&self, _src: &DeviceStorage) -> Result<Option<DeviceStorage>> {
        Ok(None)
    }

    /// Starts `op` on validated inputs that live on this device.
    fn launch(&self, op: &Op, inputs: &[&DeviceStorage]) -> Result<Launch>;

    /// [`Backend::launch`] with the deadline of the wait that follows. Backends that do the
    /// work inside the call (the CPU, the simulated card) stop at the deadline with
    /// [`crate::Error::Timeout`]; the others start the work, and the caller's wait on the
    /// returned completion enforces it.
    fn launch_within(
        &self,
        op: &Op,
        inputs: &[&DeviceStorage],
        _deadline: &crate::sync::Deadline,
    ) -> Result<Launch> {
        self.launch(op, inputs)
    }

    /// Whether the work of this device's launches runs in launch order: a launch's outputs
    /// may be read by a later launch on this device before the first one completed, and every
    /// copy off the device (download, peer copy) waits for the launches queued before it.
    /// The executor then queues a node's dependents on the same device behind it without
    /// waiting for it (`crate::exec::ExecOptions::queue_ahead`). By default a device does
    /// not promise this.
    fn orders_launches(&self) -> bool {
        false
    }

    /// Whether this device runs `unit` as one piece of work ([`Backend::launch_fused`]);
    /// asked before the unit's inputs are moved here. By default no device fuses.
    fn fuses(&self, _unit: &FusedUnit) -> bool {
        false
    }

    /// Starts `unit` (several graph nodes as one piece of work, see [`FusedUnit`]) on inputs
    /// that live on this device; called only where [`Backend::fuses`] says it runs the unit
    /// (by default it does not: an error).
    fn launch_fused(&self, unit: &FusedUnit, _inputs: &[&DeviceStorage]) -> Result<Launch> {
        Err(crate::error::Error::Unsupported {
            op: unit.name().into(),
            device: self.id().to_string(),
            why: "this device runs the unit's nodes one by one".into(),
        })
    }

    /// Estimated time of `op` on this device (from the op's cost and the device's rates,
    /// refined by calibration where the backend has it).
    fn estimate(&self, op: &Op, inputs: &[TensorMeta]) -> Duration {
        let c = op.cost(inputs);
        let info = self.info();
        let t = (c.flops / info.peak_flops.max(1.0)).max(c.bytes / info.peak_bandwidth.max(1.0));
        crate::plan::duration_from_secs(t).saturating_add(self.launch_overhead())
    }

    /// Fixed cost of one launch on this device.
    fn launch_overhead(&self) -> Duration {
        Duration::from_micros(5)
    }

    /// Blocks until all work submitted to the device has finished.
    fn synchronize(&self) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_kind_names_and_aliases_parse() {
        for k in DeviceKind::ALL {
            assert_eq!(k.name().parse::<DeviceKind>().ok(), Some(k));
            for a in k.aliases() {
                assert_eq!(a.parse::<DeviceKind>().ok(), Some(k));
            }
            assert_eq!(k.to_string(), k.name());
        }
        let e = "tpu".parse::<DeviceKind>().expect_err("tpu");
        assert_eq!(
            e.to_string(),
            "backend: unknown backend 'tpu' (accepted: cpu, cuda, fpga-sim, fpga)"
        );
    }

    #[cfg(feature = "cli")]
    #[test]
    fn the_command_line_offers_the_same_names() {
        use clap::ValueEnum;
        assert_eq!(DeviceKind::value_variants(), DeviceKind::ALL);
        for k in DeviceKind::ALL {
            let v = k.to_possible_value().expect("offered");
            assert_eq!(v.get_name(), k.name());
            for a in k.aliases() {
                assert!(v.matches(a, false), "{k}: {a}");
            }
        }
    }
}
