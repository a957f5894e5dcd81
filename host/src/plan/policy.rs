//! The placement policy: which backends auto placement may use for an op (exact f32 only,
//! unless lossy numerics are allowed outright or within an error bound), whether it learns
//! from the op-time history, and how strictly an explicitly requested backend is held to.

use serde::Serialize;

use crate::backend::Numerics;

/// What the planner may do beyond the plain rules.
///
/// The default is the strict, reproducible one: auto placement uses only backends with exact
/// f32 numerics, estimates come from the op-time history where it has them, a requested
/// backend that is missing is an error, and ops the requested backend lacks run on the CPU
/// (with a warning).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PlacementPolicy {
    /// Auto placement may use backends with lossy numerics (bf16/f16 storage, int8 fixed
    /// point) for any op (`--allow-lossy`).
    pub allow_lossy: bool,
    /// Auto placement may use a lossy backend for an op whose relative error there is at most
    /// this (`--max-error`): the worst error measured for that device, op and shape (the
    /// history records it whenever a run checks against the reference), else the backend's
    /// declared bound ([`Numerics::declared_bound`]).
    pub max_error: Option<f64>,
    /// Plan from the backends' models alone, ignoring the history's times and errors
    /// (`--fresh`; the run's own samples are still recorded).
    pub fresh: bool,
    /// A requested backend that is missing: run on the CPU with a warning instead of failing
    /// (`--fallback`).
    pub fallback: bool,
    /// A requested backend that lacks a kernel for some op: fail instead of running those ops
    /// on the CPU (`--strict`).
    pub strict: bool,
}

impl PlacementPolicy {
    /// Whether auto placement may run an op on a backend of class `numerics`; the reason
    /// when not. `measured` is the worst error measured for this device, op and shape, with
    /// its number of runs.
    pub fn admits(&self, numerics: Numerics, measured: Option<(f64, u64)>) -> Result<(), String> {
        if !numerics.is_lossy() || self.allow_lossy {
            return Ok(());
        }
        let Some(max) = self.max_error else {
            return Err(format!(
                "{numerics}, lossy: --allow-lossy or --max-error allow it"
            ));
        };
        let (err, source) = match measured {
            Some((e, n)) => (
                e,
                format!("measured, {n} run{}", if n == 1 { "" } else { "s" }),
            ),
            None => (numerics.declared_bound(), "declared bound".to_string()),
        };
        if err <= max {
            Ok(())
        } else {
            Err(format!(
                "{numerics}: error {err:.1e} ({source}) > --max-error {max:.1e}"
            ))
        }
    }

    /// The policy of auto placement in words, for reports: `exact f32 only`, `lossy allowed`,
    /// `lossy where error <= 1.0e-2`.
    pub fn describe_auto(&self) -> String {
        if self.allow_lossy {
            "lossy allowed".into()
        } else if let Some(m) = self.max_error {
            format!("lossy where error <= {m:.1e}")
        } else {
            "exact f32 only".into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lossy_numerics_need_permission_or_a_bound_they_meet() {
        let strict = PlacementPolicy::default();
        assert!(strict.admits(Numerics::F32, None).is_ok());
        let why = strict.admits(Numerics::Int8, None).expect_err("int8");
        assert!(why.contains("--allow-lossy"), "{why}");
        let any = PlacementPolicy {
            allow_lossy: true,
            ..strict
        };
        assert!(any.admits(Numerics::Int8, Some((0.5, 1))).is_ok());
        let tol = PlacementPolicy {
            max_error: Some(1e-2),
            ..strict
        };
        // Unmeasured: the declared bound decides (bf16 1e-2 passes, int8 5e-2 does not).
        assert!(tol.admits(Numerics::Bf16, None).is_ok());
        let why = tol.admits(Numerics::Int8, None).expect_err("int8 declared");
        assert!(why.contains("declared bound"), "{why}");
        // Measured: the measurement decides, either way.
        assert!(tol.admits(Numerics::Int8, Some((4e-3, 2))).is_ok());
        let why = tol
            .admits(Numerics::Bf16, Some((2e-2, 1)))
            .expect_err("bf16");
        assert!(why.contains("measured, 1 run"), "{why}");
    }
}
