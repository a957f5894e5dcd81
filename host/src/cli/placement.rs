//! The placement flags of `run`, `plan`, `op` and `compare`, and the checks that a requested
//! backend exists (or `--fallback` lets the CPU stand in) before any work starts.

use anyhow::bail;
use clap::Args;
use tandem::DeviceRegistry;
use tandem::backend::DeviceKind;
use tandem::plan::{BackendChoice, PlacementPolicy};

/// How ops are placed: which numerics auto placement may use, whether it learns from the
/// op-time history, and how strictly an explicit `--backend` is held to.
#[derive(Debug, Clone, Default, Args)]
pub struct PlacementArgs {
    /// With --backend auto: also use backends with lossy numerics (GPU bf16/f16 storage,
    /// FPGA int8 fixed point). Without it (or --max-error) auto placement uses exact f32
    /// backends only.
    #[arg(long)]
    pub allow_lossy: bool,
    /// With --backend auto: use a lossy backend for an op whose relative error there is at
    /// most E: the worst error measured for that device, op and shape (recorded by runs that
    /// check against the reference), else the backend's declared bound (bf16 1e-2, f16 5e-3,
    /// int8 5e-2).
    #[arg(long, value_name = "E", value_parser = parse_max_error)]
    pub max_error: Option<f64>,
    /// Plan without the op-time history (`tandem history show`); the run's own times are
    /// still recorded (TANDEM_HISTORY=off neither reads nor writes it).
    #[arg(long)]
    pub fresh: bool,
    /// With an explicit --backend that is not available here: run on the CPU (with a
    /// warning) instead of failing.
    #[arg(long)]
    pub fallback: bool,
    /// With an explicit --backend: fail if it has no kernel for some op, instead of running
    /// those ops on the CPU (with a warning).
    #[arg(long)]
    pub strict: bool,
}

/// `--max-error`: a finite number > 0.
fn parse_max_error(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(e) if e.is_finite() && e > 0.0 => Ok(e),
        _ => Err(format!(
            "'{s}' is not accepted: a relative error > 0, e.g. 1e-2"
        )),
    }
}

impl PlacementArgs {
    /// The policy the flags ask for.
    pub fn policy(&self) -> PlacementPolicy {
        PlacementPolicy {
            allow_lossy: self.allow_lossy,
            max_error: self.max_error,
            fresh: self.fresh,
            fallback: self.fallback,
            strict: self.strict,
        }
    }

    /// Refuses flags that do nothing with this `--backend`, then checks that the backend
    /// exists ([`require`]).
    pub fn check(&self, reg: &DeviceRegistry, choice: BackendChoice) -> anyhow::Result<()> {
        match choice {
            BackendChoice::Auto => {
                for (given, flag) in [(self.fallback, "--fallback"), (self.strict, "--strict")] {
                    if given {
                        bail!(
                            "{flag} applies to an explicit --backend (cpu, cuda, fpga-sim, fpga), not to auto"
                        );
                    }
                }
                Ok(())
            }
            BackendChoice::Only(kind) => {
                for (given, flag) in [
                    (self.allow_lossy, "--allow-lossy"),
                    (self.max_error.is_some(), "--max-error"),
                ] {
                    if given {
                        bail!(
                            "{flag} applies to --backend auto; an explicit --backend {} runs every op it can, whatever its numerics",
                            kind.name()
                        );
                    }
                }
                require(reg, kind, self.fallback)
            }
        }
    }
}

/// An explicitly requested backend must exist: the error names it, says why it is missing
/// (as `tandem devices` does) and how to go on; with `fallback` a warning instead, and the
/// work runs on the CPU.
pub fn require(reg: &DeviceRegistry, kind: DeviceKind, fallback: bool) -> anyhow::Result<()> {
    if kind == DeviceKind::Cpu || !reg.of_kind(kind).is_empty() {
        return Ok(());
    }
    let reason = reg
        .missing()
        .iter()
        .find(|m| m.kind == kind)
        .map(|m| m.reason.clone())
        .unwrap_or_else(|| "not found".into());
    if fallback {
        tracing::warn!(
            "--backend {} is unavailable ({reason}); running on the CPU (--fallback)",
            kind.name()
        );
        return Ok(());
    }
    bail!(
        "--backend {k} is unavailable: {reason}\n  fix: {fix}; `tandem devices` lists what is found; or pass --fallback to run on the CPU instead",
        k = kind.name(),
        fix = fix(kind)
    )
}

/// What makes a kind of device available.
fn fix(kind: DeviceKind) -> &'static str {
    match kind {
        DeviceKind::Cpu => "nothing (the CPU is always there)",
        DeviceKind::Cuda => {
            "build with the `cuda` feature and run where an NVIDIA driver and GPU are present"
        }
        DeviceKind::FpgaSim => {
            "install Verilator 5.006 or newer on PATH (Debian/Ubuntu: apt-get install verilator; .ci/setup does it)"
        }
        DeviceKind::FpgaXrt => {
            "install XRT (or point TANDEM_XRT_LIB at libxrt_coreutil) and an Alveo board with its xclbins (TANDEM_XCLBIN_DIR)"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_error_takes_a_positive_number_only() {
        assert_eq!(parse_max_error("1e-2"), Ok(1e-2));
        for bad in ["0", "-1", "NaN", "inf", "x", ""] {
            let e = parse_max_error(bad).expect_err(bad);
            assert!(e.contains("relative error > 0"), "{e}");
        }
    }

    #[test]
    fn flags_that_do_nothing_with_the_backend_are_refused() {
        let reg = DeviceRegistry::cpu_only();
        let auto = BackendChoice::Auto;
        let cpu = BackendChoice::Only(DeviceKind::Cpu);
        let a = |f: fn(&mut PlacementArgs)| {
            let mut p = PlacementArgs::default();
            f(&mut p);
            p
        };
        assert!(a(|p| p.allow_lossy = true).check(&reg, auto).is_ok());
        assert!(a(|p| p.strict = true).check(&reg, cpu).is_ok());
        let e = a(|p| p.fallback = true)
            .check(&reg, auto)
            .expect_err("fallback");
        assert!(e.to_string().contains("--fallback applies"), "{e}");
        let e = a(|p| p.max_error = Some(1e-2))
            .check(&reg, cpu)
            .expect_err("max-error");
        assert!(e.to_string().contains("--max-error applies"), "{e}");
    }

    #[test]
    fn a_missing_backend_is_an_error_unless_the_cpu_may_stand_in() {
        let reg = DeviceRegistry::cpu_only();
        let e = require(&reg, DeviceKind::FpgaSim, false).expect_err("missing");
        let m = e.to_string();
        assert!(m.contains("--backend fpga-sim is unavailable"), "{m}");
        assert!(m.contains("Verilator") && m.contains("--fallback"), "{m}");
        assert!(require(&reg, DeviceKind::FpgaSim, true).is_ok());
        assert!(require(&reg, DeviceKind::Cpu, false).is_ok());
    }
}
