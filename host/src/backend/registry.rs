//! Discovery of the devices present on this machine.

use std::sync::Arc;

use serde::Serialize;

use super::{Backend, CudaDType, DeviceId, DeviceKind};

/// A device kind that was looked for and not found, with the reason.
#[derive(Debug, Clone, Serialize)]
pub struct Missing {
    /// Kind looked for.
    pub kind: DeviceKind,
    /// Why it is not usable, with a hint to fix it where there is one.
    pub reason: String,
}

/// Every backend found on this machine, and the kinds that were not.
#[derive(Debug, Clone)]
pub struct DeviceRegistry {
    backends: Vec<Arc<dyn Backend>>,
    missing: Vec<Missing>,
}

/// Which device kinds discovery probes.
#[derive(Debug, Clone, Copy)]
pub struct Probe {
    /// Look for CUDA GPUs.
    pub cuda: bool,
    /// Look for simulated and real FPGA cards.
    pub fpga: bool,
    /// Storage precision of the CUDA devices opened (`--cuda-dtype`); `None`: from
    /// `TANDEM_CUDA_DTYPE`, else bf16.
    pub cuda_dtype: Option<CudaDType>,
}

impl Default for Probe {
    fn default() -> Self {
        Self {
            cuda: true,
            fpga: true,
            cuda_dtype: None,
        }
    }
}

impl DeviceRegistry {
    /// Looks for every device kind. Never fails: what is missing is recorded with its reason.
    pub fn discover() -> Self {
        Self::discover_with(Probe::default())
    }

    /// Looks for the device kinds `probe` names; the CPU is always there.
    pub fn discover_with(probe: Probe) -> Self {
        let mut r = Self::cpu_only();
        if probe.cuda {
            let (found, missing) = discover_cuda(probe.cuda_dtype);
            r.backends.extend(found);
            r.missing.extend(missing);
        }
        if probe.fpga {
            let (found, missing) =
                super::fpga::discover(&crate::options::FpgaOptions::from_env().unwrap_or_default());
            r.backends.extend(found);
            r.missing.extend(missing);
        }
        for m in &r.missing {
            tracing::info!(kind = m.kind.name(), reason = %m.reason, "device not available");
        }
        r
    }

    /// Only the host CPU.
    pub fn cpu_only() -> Self {
        Self {
            backends: vec![Arc::new(super::cpu::CpuBackend::new())],
            missing: Vec::new(),
        }
    }

    /// Adds a backend (tests, and devices opened by hand).
    pub fn add(&mut self, b: Arc<dyn Backend>) {
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
fn discover_cuda(dtype: Option<CudaDType>) -> (Vec<Arc<dyn Backend>>, Vec<Missing>) {
    super::cuda::discover_with(dtype)
}

#[cfg(not(feature = "cuda"))]
fn discover_cuda(_dtype: Option<CudaDType>) -> (Vec<Arc<dyn Backend>>, Vec<Missing>) {
    (
        Vec::new(),
        vec![Missing {
            kind: DeviceKind::Cuda,
            reason: "tandem was built without the `cuda` feature".into(),
        }],
    )
}
