//! A bench's result: median time and the rates it implies, as text or one JSON object.

use std::fmt;

use serde_json::json;

use super::timing::Timing;
use crate::backend::DeviceId;
use crate::dtype::DType;

/// The result of timing one op on one backend.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchReport {
    /// The op family's name (`moe_route`).
    pub op: &'static str,
    /// The shape's label ([`super::Problem::label`]).
    pub shape: String,
    /// The device that ran it.
    pub backend: DeviceId,
    /// The device's human-readable name.
    pub device: String,
    /// The kernel (or kernels, joined by '+') that ran.
    pub kernel: String,
    /// The precision the device stores floats in (bytes are counted at it).
    pub storage: DType,
    /// How the launches were timed.
    pub timing: Timing,
    /// Timed launches that gave a time.
    pub runs: usize,
    /// Input sets rotated.
    pub sets: usize,
    /// Median seconds per launch.
    pub median_s: f64,
    /// Fastest launch, seconds.
    pub min_s: f64,
    /// Slowest launch, seconds.
    pub max_s: f64,
    /// FLOPs of one launch (`Op::cost`).
    pub flops: f64,
    /// Bytes the rate counts (see `bytes_counted`).
    pub bytes: f64,
    /// What `bytes` counts: `inputs and outputs`, or `expert weights`.
    pub bytes_counted: &'static str,
    /// Median device cycles per launch, where the device counts them.
    pub cycles: Option<f64>,
    /// Host seconds per timed launch (for a simulated device: the simulator's own cost).
    pub host_s_per_launch: f64,
}

impl BenchReport {
    /// TFLOP/s at the median time.
    pub fn tflops(&self) -> f64 {
        self.flops / self.median_s / 1e12
    }

    /// GB/s at the median time.
    pub fn gbps(&self) -> f64 {
        self.bytes / self.median_s / 1e9
    }

    /// Simulated cycles per host second, where the device counts cycles.
    pub fn sim_cycles_per_s(&self) -> Option<f64> {
        self.cycles.map(|c| c / self.host_s_per_launch)
    }

    /// The report as one JSON object (what `tandem bench --json` prints; keys sorted).
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "op": self.op,
            "shape": self.shape,
            "backend": self.backend.to_string(),
            "device": self.device,
            "kernel": self.kernel,
            "storage": self.storage.name(),
            "timing": self.timing.name(),
            "runs": self.runs,
            "sets": self.sets,
            "median_s": self.median_s,
            "min_s": self.min_s,
            "max_s": self.max_s,
            "flops": self.flops,
            "bytes": self.bytes,
            "bytes_counted": self.bytes_counted,
            "tflops": self.tflops(),
            "gbps": self.gbps(),
            "cycles": self.cycles,
            "host_s_per_launch": self.host_s_per_launch,
            "sim_cycles_per_s": self.sim_cycles_per_s(),
        })
    }
}

/// The report as `tandem bench` prints it: three lines, a fourth with cycles where counted;
/// each line ends with a newline.
impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} {} on {} ({}) kernel {}",
            self.op, self.shape, self.backend, self.device, self.kernel
        )?;
        writeln!(
            f,
            "  median {:.3} ms (min {:.3}, max {:.3}; {} runs, {} input sets, {})",
            self.median_s * 1e3,
            self.min_s * 1e3,
            self.max_s * 1e3,
            self.runs,
            self.sets,
            self.timing.name()
        )?;
        writeln!(
            f,
            "  {:.1} TFLOP/s, {:.1} GB/s ({:.3} GFLOP, {:.1} MB of {} at {} storage)",
            self.tflops(),
            self.gbps(),
            self.flops / 1e9,
            self.bytes / 1e6,
            self.bytes_counted,
            self.storage
        )?;
        if let Some(c) = self.cycles {
            writeln!(
                f,
                "  {c:.0} cycles (median); host time {:.3} ms per launch, so the simulator runs {:.2} M cycles/s",
                self.host_s_per_launch * 1e3,
                c / self.host_s_per_launch / 1e6
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(cycles: Option<f64>) -> BenchReport {
        BenchReport {
            op: "rmsnorm",
            shape: "8x64".into(),
            backend: DeviceId::CPU,
            device: "test cpu".into(),
            kernel: "rmsnorm_f32_cpu".into(),
            storage: DType::F32,
            timing: Timing::WallClock,
            runs: 3,
            sets: 8,
            median_s: 0.002,
            min_s: 0.001,
            max_s: 0.004,
            flops: 4e9,
            bytes: 8e9,
            bytes_counted: "inputs and outputs",
            cycles,
            host_s_per_launch: 0.5,
        }
    }

    #[test]
    fn text_and_json() {
        let r = report(None);
        assert_eq!(
            r.to_string(),
            "rmsnorm 8x64 on cpu (test cpu) kernel rmsnorm_f32_cpu\n  \
             median 2.000 ms (min 1.000, max 4.000; 3 runs, 8 input sets, wall clock)\n  \
             2.0 TFLOP/s, 4000.0 GB/s (4.000 GFLOP, 8000.0 MB of inputs and outputs at f32 storage)\n"
        );
        let j = r.to_json();
        assert_eq!(j["op"], "rmsnorm");
        assert_eq!(j["backend"], "cpu");
        assert_eq!(j["timing"], "wall clock");
        assert_eq!(j["tflops"], 2.0);
        assert!(j["cycles"].is_null() && j["sim_cycles_per_s"].is_null());
        let r = report(Some(1e6));
        assert!(r.to_string().ends_with(
            "  1000000 cycles (median); host time 500.000 ms per launch, so the simulator runs 2.00 M cycles/s\n"
        ));
        assert_eq!(r.to_json()["sim_cycles_per_s"], 2e6);
    }
}
