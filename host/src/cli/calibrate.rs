//! `tandem calibrate`: measures the links and op times of every device here and keeps them
//! for the planner (`tandem::bench::calibrate`, `tandem::plan::Calibration`).

use std::time::Duration;

use clap::Args;
use tandem::DeviceKind;
use tandem::backend::CudaDType;
use tandem::bench::calibrate::{self, CalibrateOptions};
use tandem::plan::{Calibration, machine_name};
use tandem::workload::MixtralConfig;

use anyhow::Context;
use tandem::DeviceRegistry;

use super::run::SizeArgs;

/// Options of `tandem calibrate`.
#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Only these device kinds (repeatable); default: every device found.
    #[arg(long = "backend", value_name = "KIND", value_enum)]
    pub backends: Vec<DeviceKind>,
    /// Timed launches per op and shape (after one warm-up).
    #[arg(long, default_value_t = 5)]
    pub iters: usize,
    /// Shapes the model puts above this many seconds on a device are not run there (the
    /// fit of their op family covers them).
    #[arg(long, default_value_t = 2.0, value_name = "SECONDS")]
    pub max_op_seconds: f64,
    /// Longest wait for one launch, in seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// Print the stored calibration instead of measuring.
    #[arg(long)]
    pub show: bool,
    /// Precision CUDA devices store tensors in; default: $TANDEM_CUDA_DTYPE, else bf16.
    #[arg(long, value_name = "DTYPE", value_parser = super::cuda_dtype_parser())]
    pub cuda_dtype: Option<CudaDType>,
    /// The layer whose ops are measured (at 1/4, 1/2 and all of --seq-len); default: the
    /// built-in layer's sizes.
    #[command(flatten)]
    pub sizes: SizeArgs,
}

/// Runs `tandem calibrate`.
pub fn run(args: &CalibrateArgs, reg: &DeviceRegistry) -> anyhow::Result<()> {
    let machine = machine_name();
    let path = reg.options().calibration.clone();
    if args.show {
        let Some(path) = path else {
            println!("calibration: none (TANDEM_CALIBRATION=off, or no cache folder)");
            return Ok(());
        };
        match Calibration::load(&path, &machine)? {
            None => println!(
                "calibration: none at {} (run `tandem calibrate`)",
                path.display()
            ),
            Some(c) => print_fits(&c, &path.display().to_string()),
        }
        return Ok(());
    }
    if !(args.max_op_seconds > 0.0 && args.max_op_seconds.is_finite()) {
        anyhow::bail!(
            "--max-op-seconds {} is not accepted: a positive number of seconds",
            args.max_op_seconds
        );
    }
    let mut layer = MixtralConfig::default();
    args.sizes.apply(&mut layer);
    let opts = CalibrateOptions {
        iters: args.iters.max(1),
        max_model_s: args.max_op_seconds,
        timeout: Duration::from_secs(args.timeout.max(1)),
        ..CalibrateOptions::new(layer)
    };
    let only = (!args.backends.is_empty()).then_some(args.backends.as_slice());
    let (cal, rows) = calibrate::calibrate(reg, only, &opts, &machine)
        .context("calibration failed; nothing was stored")?;
    println!(
        "{:<10} {:<44} {:>12} {:>12} {:>8}",
        "device", "measured", "median ms", "fit ms", "fit err"
    );
    for r in &rows {
        println!(
            "{:<10} {:<44} {:>12.4} {:>12.4} {:>7.1}%",
            r.device,
            r.what,
            r.median_s * 1e3,
            r.predicted_s * 1e3,
            100.0 * (r.predicted_s - r.median_s) / r.median_s
        );
    }
    match path {
        Some(p) => {
            cal.save(&p)?;
            print_fits(&cal, &p.display().to_string());
        }
        None => {
            print_fits(
                &cal,
                "not stored (TANDEM_CALIBRATION=off, or no cache folder)",
            );
        }
    }
    Ok(())
}

/// The fits of a calibration, one line per link and op family.
fn print_fits(c: &Calibration, where_: &str) {
    println!(
        "calibration of `{}` (version {}): {where_}",
        c.machine, c.version
    );
    for (dev, d) in &c.devices {
        for (what, l) in [("upload", &d.upload), ("download", &d.download)] {
            if let Some(l) = l {
                println!(
                    "  {dev:<10} {what:<12} {:>8.1} GB/s, {:>7.1} us latency",
                    l.bytes_per_s / 1e9,
                    l.latency_s * 1e6
                );
            }
        }
        for (op, f) in &d.ops {
            println!(
                "  {dev:<10} {op:<12} {:>8.3} x model + {:>7.1} us  ({} shapes, worst fit error {:.1}%)",
                f.scale,
                f.overhead_s * 1e6,
                f.n,
                100.0 * f.max_rel_error
            );
        }
        println!("  {dev:<10} {} measured shapes", d.samples.len());
    }
}
