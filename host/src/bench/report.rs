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
    /// Seconds of each timed launch, sorted.
    pub samples_s: Vec<f64>,
}

/// How far the timed launches spread around their median, and which are outliers
/// (Tukey's fences, as criterion counts them: mild beyond 1.5 IQR of the quartiles, severe
/// beyond 3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// Mean seconds.
    pub mean_s: f64,
    /// Sample standard deviation, seconds (0 for one sample).
    pub stddev_s: f64,
    /// First quartile, seconds.
    pub q1_s: f64,
    /// Third quartile, seconds.
    pub q3_s: f64,
    /// Samples beyond 1.5 IQR of the quartiles but within 3 IQR.
    pub mild_outliers: usize,
    /// Samples beyond 3 IQR of the quartiles.
    pub severe_outliers: usize,
}

/// The spread above this share of the median makes a bench noisy.
pub const NOISY_IQR_SHARE: f64 = 0.05;

/// The `q` quantile (0..=1) of sorted `v`, linearly interpolated; NaN when empty.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    match v.len() {
        0 => f64::NAN,
        1 => v[0],
        n => {
            let pos = q.clamp(0.0, 1.0) * (n - 1) as f64;
            let lo = pos.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
        }
    }
}

impl Spread {
    /// The spread of `sorted` seconds.
    pub fn of(sorted: &[f64]) -> Spread {
        let n = sorted.len();
        let mean_s = sorted.iter().sum::<f64>() / n.max(1) as f64;
        let stddev_s = if n > 1 {
            (sorted.iter().map(|x| (x - mean_s).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
        } else {
            0.0
        };
        let (q1_s, q3_s) = (quantile(sorted, 0.25), quantile(sorted, 0.75));
        let iqr = q3_s - q1_s;
        let beyond = |k: f64| {
            sorted
                .iter()
                .filter(|&&x| x < q1_s - k * iqr || x > q3_s + k * iqr)
                .count()
        };
        let severe = beyond(3.0);
        Spread {
            mean_s,
            stddev_s,
            q1_s,
            q3_s,
            mild_outliers: beyond(1.5) - severe,
            severe_outliers: severe,
        }
    }

    /// Interquartile range, seconds.
    pub fn iqr_s(&self) -> f64 {
        self.q3_s - self.q1_s
    }
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

    /// The spread of the timed launches.
    pub fn spread(&self) -> Spread {
        Spread::of(&self.samples_s)
    }

    /// Why the figure is not to be trusted, where it is not: an interquartile range over
    /// [`NOISY_IQR_SHARE`] of the median, or severe outliers.
    pub fn noise_warning(&self) -> Option<String> {
        let s = self.spread();
        let share = s.iqr_s() / self.median_s;
        if share > NOISY_IQR_SHARE {
            Some(format!(
                "noisy: the middle half of the runs spans {:.1}% of the median (over {:.0}%); \
                 other work on this machine, or too few runs",
                share * 100.0,
                NOISY_IQR_SHARE * 100.0
            ))
        } else if s.severe_outliers > 0 {
            Some(format!(
                "{} severe outlier(s) among {} runs",
                s.severe_outliers, self.runs
            ))
        } else {
            None
        }
    }

    /// Simulated cycles per host second, where the device counts cycles.
    pub fn sim_cycles_per_s(&self) -> Option<f64> {
        self.cycles.map(|c| c / self.host_s_per_launch)
    }

    /// The report as one JSON object (what `tandem bench --json` prints; keys sorted).
    pub fn to_json(&self) -> serde_json::Value {
        let sp = self.spread();
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
            "mean_s": sp.mean_s,
            "stddev_s": sp.stddev_s,
            "q1_s": sp.q1_s,
            "q3_s": sp.q3_s,
            "outliers": {"mild": sp.mild_outliers, "severe": sp.severe_outliers},
            "noise_warning": self.noise_warning(),
            "samples_s": self.samples_s,
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
        if self.runs > 1 {
            let sp = self.spread();
            writeln!(
                f,
                "  spread: IQR {:.3} ms ({:.1}% of the median), std dev {:.3} ms; outliers {} mild, {} severe",
                sp.iqr_s() * 1e3,
                sp.iqr_s() / self.median_s * 100.0,
                sp.stddev_s * 1e3,
                sp.mild_outliers,
                sp.severe_outliers
            )?;
        }
        if let Some(w) = self.noise_warning() {
            writeln!(f, "  warning: {w}")?;
        }
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
            samples_s: vec![0.001, 0.002, 0.004],
        }
    }

    #[test]
    fn text_and_json() {
        let r = report(None);
        assert_eq!(
            r.to_string(),
            "rmsnorm 8x64 on cpu (test cpu) kernel rmsnorm_f32_cpu\n  \
             median 2.000 ms (min 1.000, max 4.000; 3 runs, 8 input sets, wall clock)\n  \
             spread: IQR 1.500 ms (75.0% of the median), std dev 1.528 ms; outliers 0 mild, 0 severe\n  \
             warning: noisy: the middle half of the runs spans 75.0% of the median (over 5%); other work on this machine, or too few runs\n  \
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

    #[test]
    fn spread_quartiles_and_outliers() {
        let mut v: Vec<f64> = (1..=20).map(f64::from).collect();
        v.push(100.0);
        let s = Spread::of(&v);
        assert_eq!((s.q1_s, s.q3_s), (6.0, 16.0));
        assert_eq!((s.mild_outliers, s.severe_outliers), (0, 1));
        let s = Spread::of(&[2.0]);
        assert_eq!((s.stddev_s, s.iqr_s()), (0.0, 0.0));
        assert!(quantile(&[], 0.5).is_nan());
        assert_eq!(quantile(&[1.0, 3.0], 0.5), 2.0);
    }
}
