//! The timing harness behind `tandem bench` and the criterion benches: times one op on one
//! backend through the [`Backend`] trait only, so every backend (cpu, cuda, fpga-sim) is
//! measured the same way.
//!
//! Inputs are made once (seeded random, never zeros) and uploaded once; several input sets
//! are rotated so that caches do not flatter the figure; warm-up launches come first
//! (compilation, plans); each timed launch is measured by the device
//! (`LaunchInfo::device_time`, CUDA events) where the backend gives it, else by the wall
//! clock around launch and completion. The median of the timed runs gives time, TFLOP/s and
//! GB/s from `Op::cost` (bytes counted at the device's storage precision: bf16 or f16 on a
//! GPU), and cycles where the device counts them.
//!
//! [`run`] does all of it and returns a [`BenchReport`]; [`Harness`] gives the steps to
//! callers that time launches themselves (criterion's `iter_custom`).
//!
//! ```no_run
//! use tandem::bench::{self, BenchOptions, BenchShape};
//! use tandem::{DeviceRegistry, ops::OpKind};
//!
//! let reg = DeviceRegistry::discover();
//! let backend = bench::pick_backend(&reg, None)?;
//! let problem = BenchShape { rows: 4096, cols: 4096, ..BenchShape::DEFAULT }.problem(OpKind::RmsNorm)?;
//! let report = bench::run(backend.as_ref(), &problem, &BenchOptions::DEFAULT)?;
//! print!("{report}");
//! # Ok::<(), tandem::Error>(())
//! ```

mod bytes;
pub mod calibrate;
mod inputs;
pub mod moe_block;
pub mod overhead;
mod problem;
mod report;
mod timing;
pub mod transfer;

use std::sync::Arc;
use std::time::Duration;

pub use bytes::{
    MAX_SETS, ROTATION_BYTES, counted_bytes, default_sets, device_bytes, storage_dtype,
};
pub use inputs::{make_inputs, random_tensor};
pub use problem::{BenchShape, MOE_BLOCK, Problem};
pub use report::{BenchReport, Spread, quantile};
pub use timing::{FirstLaunch, Harness, Samples, Timing, median};

use crate::backend::{Backend, DeviceKind, DeviceRegistry, Support};
use crate::error::{Error, Result};

/// Seed of input set 0; set `s` is seeded with `SEED + s`.
pub const SEED: u64 = 0x7a6d_0000;

/// How many launches to time and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchOptions {
    /// Timed launches.
    pub iters: usize,
    /// Untimed launches first.
    pub warmup: usize,
    /// After those, untimed launches until this much time has passed: a GPU at its power cap
    /// runs its first ~100 ms at boost clock and then settles lower, so figures of its steady
    /// state need a second or two of warm-up (`--warmup-ms 2000`).
    pub warmup_time: Duration,
    /// Input sets rotated between launches (`None`: [`default_sets`]; at least 1).
    pub sets: Option<usize>,
    /// Longest wait for one launch.
    pub timeout: Duration,
    /// Each timed launch waits for the one before, so it starts on an idle device, its time
    /// including whatever of its own queueing the device waits for, as in a run, where a
    /// layer's launches do not queue ahead of the device (`tandem calibrate`). Otherwise the
    /// timed launches are queued back to back: the device's time alone (`tandem bench`).
    pub serial: bool,
}

impl BenchOptions {
    /// `tandem bench`'s defaults: 50 timed launches after 5 warm-up ones (no warm-up time),
    /// default sets, a 600 s timeout.
    pub const DEFAULT: BenchOptions = BenchOptions {
        iters: 50,
        warmup: 5,
        warmup_time: Duration::ZERO,
        sets: None,
        timeout: Duration::from_secs(600),
        serial: false,
    };
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The backend of kind `kind` (the first of its kind), or without a kind the first CUDA
/// device if there is one, else the CPU. A missing kind is [`Error::Unavailable`] with the
/// reason the registry gave.
pub fn pick_backend(reg: &DeviceRegistry, kind: Option<DeviceKind>) -> Result<Arc<dyn Backend>> {
    let kind = match kind {
        None => {
            return Ok(reg
                .of_kind(DeviceKind::Cuda)
                .into_iter()
                .next()
                .unwrap_or_else(|| reg.cpu()));
        }
        Some(DeviceKind::Cpu) => return Ok(reg.cpu()),
        Some(k) => k,
    };
    if let Some(b) = reg.of_kind(kind).into_iter().next() {
        return Ok(b);
    }
    let reason = reg
        .missing()
        .iter()
        .find(|m| m.kind == kind)
        .map(|m| m.reason.clone())
        .unwrap_or_else(|| "not found".into());
    Err(Error::Unavailable {
        device: format!("backend {}", kind.name()),
        reason,
    })
}

/// Checks that `problem` is valid and that `backend` runs it.
pub fn check(backend: &dyn Backend, problem: &Problem) -> Result<()> {
    problem.op.validate(&problem.inputs)?;
    if let Support::No(why) = backend.supports(&problem.op, &problem.inputs) {
        return Err(Error::Unsupported {
            op: problem.op.name().into(),
            device: backend.id().to_string(),
            why,
        });
    }
    Ok(())
}

/// Times `problem` on `backend`: checks it, makes and uploads the input sets, warms up,
/// times `opts.iters` launches and reduces them to a [`BenchReport`].
pub fn run(backend: &dyn Backend, problem: &Problem, opts: &BenchOptions) -> Result<BenchReport> {
    check(backend, problem)?;
    let (op, metas) = (&problem.op, problem.inputs.as_slice());
    let info = backend.info();
    let cost = op.cost(metas);
    let storage = storage_dtype(info.compute_dtype);
    // One launch only where that is all that was asked (a simulated device: its time is
    // modelled, the same every run): the first launch is the sample, on one input set.
    let once = opts.iters == 1 && opts.warmup == 0;
    let sets = opts
        .sets
        .unwrap_or_else(|| {
            if once {
                1
            } else {
                default_sets(metas, storage)
            }
        })
        .max(1);
    let h = Harness::new(backend, problem, sets, SEED, opts.timeout)?;
    let launches = if once {
        1
    } else {
        opts.warmup + 1 + opts.iters
    };
    let what = format!(
        "timing {} {} on {}: {}",
        op.name(),
        problem.label,
        backend.id(),
        if once {
            "1 run".to_string()
        } else {
            format!("{} untimed + {} timed runs", opts.warmup + 1, opts.iters)
        }
    );
    h.report_progress(crate::progress::Task::announce(
        "bench",
        what,
        Some(launches as u64),
        "runs",
    ));
    h.warm_up(opts.warmup, opts.warmup_time)?;
    let first = h.first_launch()?;
    // The weights count at one byte where the e4m3 kernels ran (FP8 asked for, and the shape
    // and device took that path), else at the storage precision.
    let fp8 = first.kernel.contains("e4m3");
    let (bytes, bytes_counted) = counted_bytes(op, metas, storage, fp8);
    let mut samples = match (once, first.timing, first.as_samples()) {
        (true, Timing::DeviceEvents, Some(s)) => s,
        _ => h.measure(opts.iters, first.timing, opts.serial)?,
    };
    let runs = samples.times.len();
    let median_s = median(&mut samples.times);
    let cycles = if samples.cycles.is_empty() {
        None
    } else {
        Some(median(&mut samples.cycles))
    };
    Ok(BenchReport {
        op: op.name(),
        shape: problem.label.clone(),
        backend: backend.id(),
        device: info.name.clone(),
        kernel: first.kernel,
        storage,
        timing: first.timing,
        runs,
        sets,
        median_s,
        min_s: samples.times.first().copied().unwrap_or(f64::NAN),
        max_s: samples.times.last().copied().unwrap_or(f64::NAN),
        flops: cost.flops,
        bytes,
        bytes_counted,
        cycles,
        host_s_per_launch: samples.host_s_per_launch,
        samples_s: samples.times,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::ops::OpKind;

    fn quick() -> BenchOptions {
        BenchOptions {
            iters: 3,
            warmup: 1,
            sets: Some(2),
            ..BenchOptions::DEFAULT
        }
    }

    /// The CPU backend and an 8 x 64 RMSNorm problem.
    fn cpu_rmsnorm() -> Result<(Arc<dyn Backend>, Problem)> {
        let reg = DeviceRegistry::cpu_only();
        let be = pick_backend(&reg, Some(DeviceKind::Cpu))?;
        let p = BenchShape {
            rows: 8,
            cols: 64,
            ..BenchShape::DEFAULT
        }
        .problem(OpKind::RmsNorm)?;
        Ok((be, p))
    }

    #[test]
    fn rmsnorm_bench_runs_on_the_cpu() -> Result<()> {
        let (be, p) = cpu_rmsnorm()?;
        let r = run(be.as_ref(), &p, &quick())?;
        assert_eq!((r.op, r.shape.as_str()), ("rmsnorm", "8x64"));
        assert_eq!(r.backend, crate::DeviceId::CPU);
        assert_eq!((r.runs, r.sets), (3, 2));
        assert!(r.min_s <= r.median_s && r.median_s <= r.max_s, "{r:?}");
        assert_eq!(r.bytes, ((8 * 64 * 2 + 64) * 4) as f64);
        assert_eq!(r.bytes_counted, "inputs and outputs");
        assert!(r.to_string().contains("rmsnorm 8x64 on cpu"));
        Ok(())
    }

    #[test]
    fn a_warm_up_time_runs_untimed_launches_first_and_times_as_many() -> Result<()> {
        let (be, p) = cpu_rmsnorm()?;
        let mut seen = Vec::new();
        let n = timing::warm_up_runs(2, Duration::from_millis(20), |i| {
            seen.push(i);
            Ok(())
        })?;
        // the counted runs, then at least one more for the time, numbered on
        assert!(n >= 3);
        assert_eq!(seen, (0..n).collect::<Vec<_>>());
        let h = Harness::new(be.as_ref(), &p, 2, SEED, Duration::from_secs(60))?;
        assert!(h.warm_up(1, Duration::from_millis(20))? >= 2);
        let opts = BenchOptions {
            warmup_time: Duration::from_millis(20),
            ..quick()
        };
        assert_eq!(run(be.as_ref(), &p, &opts)?.runs, 3);
        Ok(())
    }

    #[test]
    fn moe_experts_bench_runs_on_the_cpu() -> Result<()> {
        let reg = DeviceRegistry::cpu_only();
        let be = pick_backend(&reg, None)?;
        let p = BenchShape {
            tokens: Some(7),
            hidden: 16,
            ffn: 8,
            experts: Some(4),
            top_k: Some(2),
            ..BenchShape::DEFAULT
        }
        .problem(OpKind::MoeExperts)?;
        let r = run(be.as_ref(), &p, &quick())?;
        assert_eq!(r.bytes_counted, "expert weights");
        assert_eq!(r.bytes, ((4 * 16 * 16 + 4 * 16 * 8) * 4) as f64);
        Ok(())
    }

    #[test]
    fn a_missing_backend_says_why_and_a_bad_shape_is_rejected() -> Result<()> {
        let reg = DeviceRegistry::cpu_only();
        let e = pick_backend(&reg, Some(DeviceKind::FpgaXrt)).expect_err("no board");
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(
            e.to_string().starts_with("backend fpga is unavailable"),
            "{e}"
        );
        let mut p = BenchShape::DEFAULT.problem(OpKind::RmsNorm)?;
        p.inputs.pop();
        let e = run(reg.cpu().as_ref(), &p, &quick()).expect_err("one input");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        Ok(())
    }

    #[test]
    fn the_harness_rotates_sets_and_times_each_launch() -> Result<()> {
        let reg = DeviceRegistry::cpu_only();
        let cpu = reg.cpu();
        let p = BenchShape {
            m: 4,
            n: 8,
            k: 16,
            ..BenchShape::DEFAULT
        }
        .problem(OpKind::Linear)?;
        check(cpu.as_ref(), &p)?;
        let h = Harness::new(cpu.as_ref(), &p, 3, SEED, Duration::from_secs(60))?;
        assert_eq!(h.sets(), 3);
        assert_eq!(h.warm_up(2, Duration::ZERO)?, 2);
        let first = h.first_launch()?;
        assert!(!first.kernel.is_empty());
        let s = h.measure(4, first.timing, false)?;
        assert_eq!(s.times.len(), 4);
        assert!(s.total() > Duration::ZERO);
        Ok(())
    }
}
