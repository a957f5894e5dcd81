//! The CPU backend: always present; runs every op with the f32 implementations in `ops`.

use std::time::Instant;

use super::{Backend, DeviceId, DeviceInfo, DeviceStorage, Launch, LaunchInfo, Support};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::Op;
use crate::sync::Deadline;
use crate::tensor::{Tensor, TensorMeta};

/// The host CPU as a device.
#[derive(Debug)]
pub struct CpuBackend {
    info: DeviceInfo,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    /// Describes this machine's CPU.
    pub fn new() -> Self {
        let cores = num_cpus::get();
        let model = cpu_model().unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let simd = simd_features();
        // Peak: cores x 2 FMA units x SIMD f32 lanes x 2 flops; a lead, refined by calibration.
        let lanes = if simd.contains("avx512f") {
            16.0
        } else if simd.contains("avx2") {
            8.0
        } else {
            4.0
        };
        let peak_flops = cores as f64 * 2.0 * lanes * 2.0 * 2.5e9;
        let info = DeviceInfo {
            id: DeviceId::CPU,
            name: model,
            memory_bytes: total_memory().unwrap_or(0),
            peak_flops,
            peak_bandwidth: 20e9,
            compute_dtype: DType::F32,
            details: vec![
                ("cores".into(), cores.to_string()),
                ("simd".into(), simd),
                ("threads".into(), rayon::current_num_threads().to_string()),
            ],
        };
        Self { info }
    }
}

fn cpu_model() -> Option<String> {
    let s = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    s.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|m| m.trim().to_string())
}

fn total_memory() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = s
        .lines()
        .find(|l| l.starts_with("MemTotal"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

fn simd_features() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let mut v = Vec::new();
        if std::arch::is_x86_feature_detected!("sse4.2") {
            v.push("sse4.2");
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            v.push("avx2");
        }
        if std::arch::is_x86_feature_detected!("fma") {
            v.push("fma");
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            v.push("avx512f");
        }
        v.join(",")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        String::from("neon")
    }
}

impl Backend for CpuBackend {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn numerics(&self) -> super::Numerics {
        super::Numerics::F32
    }

    fn supports(&self, _op: &Op, _inputs: &[TensorMeta]) -> Support {
        Support::Native
    }

    fn upload(&self, host: &Tensor) -> Result<DeviceStorage> {
        Ok(DeviceStorage::new(self.id(), host.meta(), host.clone()))
    }

    fn download(&self, storage: &DeviceStorage) -> Result<Tensor> {
        storage.host_tensor("CPU").cloned()
    }

    fn launch(&self, op: &Op, inputs: &[&DeviceStorage]) -> Result<Launch> {
        self.launch_within(op, inputs, &Deadline::NONE)
    }

    fn launch_within(
        &self,
        op: &Op,
        inputs: &[&DeviceStorage],
        deadline: &Deadline,
    ) -> Result<Launch> {
        let tensors = inputs
            .iter()
            .map(|s| s.host_tensor("CPU"))
            .collect::<Result<Vec<_>>>()?;
        let t0 = Instant::now();
        let outs = op.run_cpu_within(&tensors, deadline)?;
        let elapsed = t0.elapsed();
        Ok(Launch::finished_on_host(
            self.id(),
            outs,
            LaunchInfo {
                kernel: format!("{}_f32_cpu", op.name()),
                device_time: Some(elapsed),
                cycles: None,
            },
        ))
    }

    fn launch_overhead(&self) -> std::time::Duration {
        std::time::Duration::from_micros(2)
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}
