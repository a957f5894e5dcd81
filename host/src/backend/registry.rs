//! Discovery of the devices present on this machine.

use std::sync::Arc;

use serde::Serialize;

use super::{Backend, DeviceId, DeviceKind};
use crate::options::{CudaOptions, Options};
use crate::plan::Calibration;

/// A device kind that was looked for and not found, with the reason.
#[derive(Debug, Clone, Serialize)]
pub struct Missing {
    /// Kind looked for.
    pub kind: DeviceKind,
    /// Why it is not usable, with a hint to fix it where there is one.
    pub reason: String,
}

/// Every backend found on this machine, the kinds that were not, and the options the devices
/// were opened with.
#[derive(Debug, Clone)]
pub struct DeviceRegistry {
    backends: Vec<Arc<dyn Backend>>,
    missing: Vec<Missing>,
    options: Options,
    calibration: Option<Arc<Calibration>>,
    memory: Arc<crate::memory::DeviceMemory>,
}

/// Which device kinds discovery probes, and the options it opens them with.
#[derive(Debug, Clone)]
pub struct Probe {
    /// Look for CUDA GPUs.
    pub cuda: bool,
    /// Look for simulated and real FPGA cards.
    pub fpga: bool,
    /// The options devices are opened with ([`Options::from_env`] where the program starts,
    /// or built by hand).
    pub options: Options,
}

impl Default for Probe {
    /// Every kind, with [`Options::default`] (nothing read from the environment).
    fn default() -> Self {
        Self {
            cuda: true,
            fpga: true,
            options: Options::default(),
        }
    }
}

impl DeviceRegistry {
    /// Looks for every device kind with the default options (nothing read from the
    /// environment). Never fails: what is missing is recorded with its reason.
    pub fn discover() -> Self {
        Self::discover_with(Probe::default())
    }

    /// Looks for the device kinds `probe` names, opening them with its options; the CPU is
    /// always there.
    pub fn discover_with(probe: Probe) -> Self {
        let mut r = Self::cpu_only();
        if probe.cuda {
            let (found, missing) = discover_cuda(&probe.options.cuda);
            r.backends.extend(found);
            r.missing.extend(missing);
        }
        if probe.fpga {
            let (found, missing) = super::fpga::discover(&probe.options.fpga);
            r.backends.extend(found);
            r.missing.extend(missing);
        }
        for m in &r.missing {
            tracing::info!(kind = m.kind.name(), reason = %m.reason, "device not available");
        }
        // The CPU as the options configure it (its BLAS, its threads).
        r.backends[0] = Arc::new(super::cpu::CpuBackend::with_options(&probe.options.cpu));
        r.memory.set_limits(probe.options.memory_limits.clone());
        for b in &r.backends {
            b.attach_memory(&r.memory);
        }
        r.options = probe.options;
        r
    }

    /// Only the host CPU (default options).
    pub fn cpu_only() -> Self {
        Self {
            backends: vec![Arc::new(super::cpu::CpuBackend::new())],
            missing: Vec::new(),
            options: Options::default(),
            calibration: None,
            memory: crate::memory::DeviceMemory::new(Default::default()),
        }
    }

    /// The options the devices were opened with (and the rest of the run's options, such as
    /// where the planner's history is kept).
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// What `tandem calibrate` measured on these devices, for the planner's estimates.
    pub fn set_calibration(&mut self, c: Option<Calibration>) {
        self.calibration = c.map(Arc::new);
    }

    /// The calibration the planner uses, if one was set.
    pub fn calibration(&self) -> Option<&Calibration> {
        self.calibration.as_deref()
    }

    /// What each device holds against its memory limit (`--memory-limit`, else its capacity),
    /// shared by every clone of this registry.
    pub fn memory(&self) -> &Arc<crate::memory::DeviceMemory> {
        &self.memory
    }

    /// The bytes `id` may hold: its memory limit, else its capacity (`None`: no such device).
    pub fn memory_limit(&self, id: DeviceId) -> Option<u64> {
        self.get(id)
            .map(|b| self.memory.limit(id, b.info().memory_bytes))
    }

    /// Sets the devices' memory limits (tests, and registries built by hand; discovery
    /// applies [`Options::memory_limits`]).
    pub fn set_memory_limits(&self, limits: crate::options::MemoryLimits) {
        self.memory.set_limits(limits);
    }

    /// Adds a backend (tests, and devices opened by hand).
    pub fn add(&mut self, b: Arc<dyn Backend>) {
        b.attach_memory(&self.memory);
        self.backends.push(b);
    }

    /// All backends found, the CPU first.
    pub fn backends(&self) -> &[Arc<dyn Backend>] {
        &self.backends
    }

    /// Kinds looked for and not found.
    pub fn missing(&self) -> &[Missing] {
        &self.missing
    }

    /// The backend of a device.
    pub fn get(&self, id: DeviceId) -> Option<&Arc<dyn Backend>> {
        self.backends.iter().find(|b| b.id() == id)
    }

    /// The backends of one kind.
    pub fn of_kind(&self, kind: DeviceKind) -> Vec<Arc<dyn Backend>> {
        self.backends
            .iter()
            .filter(|b| b.id().kind == kind)
            .cloned()
            .collect()
    }

    /// The CPU backend.
    pub fn cpu(&self) -> Arc<dyn Backend> {
        // The constructors always put the CPU first.
        self.backends[0].clone()
    }
}

#[cfg(feature = "cuda")]
fn discover_cuda(opts: &CudaOptions) -> (Vec<Arc<dyn Backend>>, Vec<Missing>) {
    super::cuda::discover_with(opts)
}

#[cfg(not(feature = "cuda"))]
fn discover_cuda(_opts: &CudaOptions) -> (Vec<Arc<dyn Backend>>, Vec<Missing>) {
    (
        Vec::new(),
        vec![Missing {
            kind: DeviceKind::Cuda,
            reason: "tandem was built without the `cuda` feature".into(),
        }],
    )
}
