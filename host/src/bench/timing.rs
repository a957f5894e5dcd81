//! The timing loop: inputs uploaded once and rotated, warm-up launches, then timed launches
//! measured by the device where it reports a time, else by the wall clock.

use std::time::{Duration, Instant};

use super::inputs::make_inputs;
use super::problem::Problem;
use crate::backend::{Backend, DeviceStorage, Launch};
use crate::error::{Error, Result};
use crate::ops::Op;

/// How the timed launches were measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timing {
    /// By the device (`LaunchInfo::device_time`: CUDA events, simulated cycles / clock);
    /// launches are queued back to back.
    DeviceEvents,
    /// By the wall clock around each launch and its completion, one at a time.
    WallClock,
}

impl Timing {
    /// `device events` or `wall clock`, as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            Timing::DeviceEvents => "device events",
            Timing::WallClock => "wall clock",
        }
    }
}

/// What the first launch after warm-up showed: how to time, and which kernel runs.
#[derive(Debug, Clone, PartialEq)]
pub struct FirstLaunch {
    /// Whether the device reports its own time.
    pub timing: Timing,
    /// The kernel (or kernels, joined by '+') that ran.
    pub kernel: String,
    /// The device's time of this launch, seconds, where it reports one.
    pub device_s: Option<f64>,
    /// The device's cycles of this launch, where it counts them.
    pub cycles: Option<f64>,
    /// Host seconds from the launch until it completed.
    pub host_s: f64,
}

impl FirstLaunch {
    /// This launch as the only sample: for a device whose time is modelled, not measured
    /// (a simulation: the same inputs give the same cycles every time); `None` where the
    /// device did not time it.
    pub fn as_samples(&self) -> Option<Samples> {
        Some(Samples {
            times: vec![self.device_s?],
            cycles: self.cycles.into_iter().collect(),
            host_s_per_launch: self.host_s,
        })
    }
}

/// The measurements of the timed launches.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Samples {
    /// Seconds per launch, in launch order.
    pub times: Vec<f64>,
    /// Device cycles per launch, where the device counts them.
    pub cycles: Vec<f64>,
    /// Host seconds per launch, from the first timed launch until the device was idle again
    /// (for a simulated device: what the simulator itself costs).
    pub host_s_per_launch: f64,
}

impl Samples {
    /// The sum of the launch times (what criterion's `iter_custom` wants).
    pub fn total(&self) -> Duration {
        Duration::from_secs_f64(self.times.iter().sum::<f64>().max(0.0))
    }
}

/// One op ready to time on one backend: its input sets made (seeded) and uploaded once.
/// Launch `i` uses set `i % sets`, so consecutive launches read different memory.
pub struct Harness<'a> {
    backend: &'a dyn Backend,
    op: Op,
    inputs: Vec<Vec<DeviceStorage>>,
    timeout: Duration,
    what: String,
    progress: std::cell::RefCell<Option<crate::progress::Task>>,
}

impl std::fmt::Debug for Harness<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field("backend", &self.backend.id())
            .field("op", &self.op)
            .field("sets", &self.inputs.len())
            .finish()
    }
}

/// Warm-up runs `run(0)`, `run(1)`, ...: `count` of them, then more until `time` has passed
/// after those (none for zero); returns how many ran. `run(i)` makes run `i` and waits for it.
/// A GPU at its power cap runs its first ~100 ms at boost clock and then settles lower, so its
/// steady state needs a second or two ([`super::BenchOptions::warmup_time`]).
pub fn warm_up_runs(
    count: usize,
    time: Duration,
    mut run: impl FnMut(usize) -> Result<()>,
) -> Result<usize> {
    for i in 0..count {
        run(i)?;
    }
    let t0 = Instant::now();
    let mut n = count;
    while t0.elapsed() < time {
        run(n)?;
        n += 1;
    }
    Ok(n)
}

impl<'a> Harness<'a> {
    /// Makes `sets` input sets of `problem` (set `s` seeded with `seed + s`) and uploads them
    /// to `backend`; every wait on a launch gives up after `timeout`. The problem must be
    /// valid and supported by the backend (see [`super::check`]).
    pub fn new(
        backend: &'a dyn Backend,
        problem: &Problem,
        sets: usize,
        seed: u64,
        timeout: Duration,
    ) -> Result<Self> {
        let mut inputs = Vec::with_capacity(sets.max(1));
        for s in 0..sets.max(1) {
            let host = make_inputs(&problem.op, &problem.inputs, seed.wrapping_add(s as u64))?;
            let dev = host
                .iter()
                .enumerate()
                .map(|(i, t)| backend.upload_for(t, &problem.op, i))
                .collect::<Result<Vec<_>>>()?;
            inputs.push(dev);
        }
        Ok(Self {
            backend,
            op: problem.op.clone(),
            inputs,
            timeout,
            what: format!("bench {}", problem.op.name()),
            progress: std::cell::RefCell::new(None),
        })
    }

    /// Counts every launch from now on in `task` (progress of a long bench).
    pub fn report_progress(&self, task: crate::progress::Task) {
        *self.progress.borrow_mut() = Some(task);
    }

    /// The number of input sets rotated.
    pub fn sets(&self) -> usize {
        self.inputs.len()
    }

    /// Starts launch `i` (on input set `i % sets`).
    pub fn launch(&self, i: usize) -> Result<Launch> {
        let set: Vec<&DeviceStorage> = self.inputs[i % self.inputs.len()].iter().collect();
        if let Some(t) = self.progress.borrow_mut().as_mut() {
            t.inc();
        }
        self.backend.launch(&self.op, &set)
    }

    /// Runs launches one after the other, untimed (compilation, plans, caches): `n`, then more
    /// for `time` ([`warm_up_runs`]); returns how many ran.
    pub fn warm_up(&self, n: usize, time: Duration) -> Result<usize> {
        warm_up_runs(n, time, |i| {
            self.launch(i)?.done.wait(self.timeout, &self.what)?;
            Ok(())
        })
    }

    /// Runs launch 0 once more and reports whether the device timed it, and its kernel.
    pub fn first_launch(&self) -> Result<FirstLaunch> {
        let t0 = Instant::now();
        let l = self.launch(0)?;
        l.done.wait(self.timeout, &self.what)?;
        let host_s = t0.elapsed().as_secs_f64();
        let info = l
            .info
            .lock()
            .map_err(|_| Error::Internal("launch info poisoned".into()))?;
        Ok(FirstLaunch {
            timing: if info.device_time.is_some() {
                Timing::DeviceEvents
            } else {
                Timing::WallClock
            },
            kernel: info.kernel.clone(),
            device_s: info.device_time.map(|t| t.as_secs_f64()),
            cycles: info.cycles.map(|c| c as f64),
            host_s,
        })
    }

    /// Times `iters` launches (1..=iters). Device-timed: all queued back to back (outputs
    /// freed at once; the stream orders their reuse), then read; with `serial`, each queued
    /// on an idle device (the host waits for the one before). Wall clock: one at a time, the
    /// clock around each. Waits for the device to be idle before returning.
    pub fn measure(&self, iters: usize, timing: Timing, serial: bool) -> Result<Samples> {
        let mut s = Samples {
            times: Vec::with_capacity(iters),
            ..Samples::default()
        };
        let host_t0 = Instant::now();
        match timing {
            Timing::DeviceEvents => {
                let mut pending = Vec::with_capacity(iters);
                for i in 0..iters {
                    if serial {
                        self.backend.synchronize()?;
                    }
                    let mut l = self.launch(i + 1)?;
                    l.outputs.clear();
                    pending.push(l);
                }
                for l in pending {
                    l.done.wait(self.timeout, &self.what)?;
                    let info = l
                        .info
                        .lock()
                        .map_err(|_| Error::Internal("launch info poisoned".into()))?;
                    if let Some(t) = info.device_time {
                        s.times.push(t.as_secs_f64());
                    }
                    if let Some(c) = info.cycles {
                        s.cycles.push(c as f64);
                    }
                }
            }
            Timing::WallClock => {
                for i in 0..iters {
                    let t = Instant::now();
                    let l = self.launch(i + 1)?;
                    l.done.wait(self.timeout, &self.what)?;
                    s.times.push(t.elapsed().as_secs_f64());
                    if let Some(c) = l.info.lock().ok().and_then(|i| i.cycles) {
                        s.cycles.push(c as f64);
                    }
                }
            }
        }
        self.backend.synchronize()?;
        s.host_s_per_launch = host_t0.elapsed().as_secs_f64() / iters.max(1) as f64;
        Ok(s)
    }
}

/// The median of `v` (sorted in place); NaN when empty.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert!(median(&mut []).is_nan());
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        let s = Samples {
            times: vec![0.5, 0.25],
            ..Samples::default()
        };
        assert_eq!(s.total(), Duration::from_millis(750));
    }
}
