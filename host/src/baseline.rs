//! Saved baselines (`--save-baseline NAME`, `--baseline NAME` of `tandem bench` and
//! `tandem compare`) and the regression verdict of a new measurement against one.
//!
//! A baseline is a JSON file `<dir>/<NAME>.json` (written through [`crate::files`], so a
//! killed run never leaves half a file) that maps a key (`bench/rmsnorm/8x64/cpu:0`,
//! `compare/cpu/attention`) to the seconds measured. The verdict is criterion's: the change
//! of the median, a 95% interval of it from a seeded bootstrap where both sides have
//! several samples, and "no change" while the interval holds zero or the change is within
//! the noise threshold.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Version of the baseline file.
pub const BASELINE_VERSION: u32 = 1;

/// Changes smaller than this share of the baseline are noise, whatever the interval says
/// (criterion's default noise threshold is 1%; tandem's runs share machines, so 2%).
pub const NOISE_THRESHOLD: f64 = 0.02;

/// Changes of a single measurement (no spread to judge by) below this share are noise.
pub const SINGLE_SAMPLE_THRESHOLD: f64 = 0.05;

/// Changes of less than this many seconds are noise whatever their share (timer resolution
/// and scheduling jitter of microsecond ops).
pub const MIN_CHANGE_S: f64 = 5e-6;

/// Bootstrap resamples behind the interval.
const RESAMPLES: usize = 2000;

/// One saved baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    /// [`BASELINE_VERSION`].
    pub version: u32,
    /// The name it was saved under.
    pub name: String,
    /// tandem's version and commit that measured it.
    pub tool: String,
    /// When, RFC 3339.
    pub created: String,
    /// Seconds per key, each a list of samples.
    pub entries: BTreeMap<String, Vec<f64>>,
}

/// Checks a baseline name: letters, digits, `.`, `_` and `-`, not starting with `.`.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 100
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "baseline name",
            format!("'{name}' is not accepted; use letters, digits, '.', '_' and '-'"),
        ))
    }
}

/// The file of baseline `name` in `dir`.
pub fn path(dir: &Path, name: &str) -> Result<PathBuf> {
    check_name(name)?;
    Ok(dir.join(format!("{name}.json")))
}

impl Baseline {
    /// Writes the baseline to `dir` (made if missing), replacing one of the same name.
    pub fn save(&self, dir: &Path) -> Result<PathBuf> {
        let p = path(dir, &self.name)?;
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::invalid(
                "baseline folder",
                format!("cannot create {}: {e}", dir.display()),
            )
        })?;
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| Error::Internal(format!("baseline to JSON: {e}")))?;
        crate::files::write_atomic(&p, text.as_bytes())?;
        Ok(p)
    }

    /// Reads baseline `name` from `dir`; a missing one names the baselines there.
    pub fn load(dir: &Path, name: &str) -> Result<Baseline> {
        let p = path(dir, name)?;
        let text = match std::fs::read_to_string(&p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let saved = list(dir);
                return Err(Error::invalid(
                    "--baseline",
                    format!(
                        "no baseline '{name}' in {} (saved: {}); save one with --save-baseline {name}",
                        dir.display(),
                        if saved.is_empty() {
                            "none".to_string()
                        } else {
                            saved.join(", ")
                        }
                    ),
                ));
            }
            Err(e) => {
                return Err(Error::invalid(
                    "--baseline",
                    format!("cannot read {}: {e}", p.display()),
                ));
            }
        };
        let b: Baseline = serde_json::from_str(&text).map_err(|e| {
            Error::invalid(
                "--baseline",
                format!("{} is not a tandem baseline: {e}", p.display()),
            )
        })?;
        if b.version != BASELINE_VERSION {
            return Err(Error::invalid(
                "--baseline",
                format!(
                    "{} is version {} of the baseline format; this tandem reads {BASELINE_VERSION} (save it again)",
                    p.display(),
                    b.version
                ),
            ));
        }
        Ok(b)
    }
}

/// The names of the baselines saved in `dir`, sorted.
pub fn list(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().into_string().ok()?;
            let stem = n.strip_suffix(".json")?;
            check_name(stem).ok().map(|()| stem.to_string())
        })
        .collect();
    v.sort();
    v
}

/// What a change amounts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Slower than the baseline beyond the noise.
    Regressed,
    /// Faster than the baseline beyond the noise.
    Improved,
    /// Within the noise.
    NoChange,
}

impl Change {
    /// `regressed`, `improved`, `no change`.
    pub fn name(self) -> &'static str {
        match self {
            Change::Regressed => "regressed",
            Change::Improved => "improved",
            Change::NoChange => "no change",
        }
    }
}

/// A new measurement against its baseline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// Median seconds of the baseline.
    pub base_s: f64,
    /// Median seconds now.
    pub new_s: f64,
    /// (new - base) / base.
    pub change: f64,
    /// 95% interval of `change` (bootstrap of both sides' medians), where both have at least
    /// 2 samples.
    pub interval: Option<(f64, f64)>,
    /// The threshold below which a change is noise.
    pub threshold: f64,
    /// What it amounts to.
    pub verdict: Change,
}

fn median_of(v: &mut [f64]) -> f64 {
    crate::bench::median(v)
}

/// `new` against `base` (seconds, any order; neither empty).
pub fn verdict(base: &[f64], new: &[f64]) -> Option<Verdict> {
    if base.is_empty() || new.is_empty() {
        return None;
    }
    let base_s = median_of(&mut base.to_vec());
    let new_s = median_of(&mut new.to_vec());
    let change = (new_s - base_s) / base_s;
    let several = base.len() > 1 && new.len() > 1;
    let interval = several.then(|| {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x7a6d);
        let mut draws: Vec<f64> = (0..RESAMPLES)
            .map(|_| {
                let mut b: Vec<f64> = (0..base.len())
                    .map(|_| base[rng.gen_range(0..base.len())])
                    .collect();
                let mut n: Vec<f64> = (0..new.len())
                    .map(|_| new[rng.gen_range(0..new.len())])
                    .collect();
                let (mb, mn) = (median_of(&mut b), median_of(&mut n));
                (mn - mb) / mb
            })
            .collect();
        draws.sort_by(|a, b| a.total_cmp(b));
        (
            crate::bench::quantile(&draws, 0.025),
            crate::bench::quantile(&draws, 0.975),
        )
    });
    let threshold = if several {
        NOISE_THRESHOLD
    } else {
        SINGLE_SAMPLE_THRESHOLD
    };
    let holds_zero = interval.is_some_and(|(lo, hi)| lo <= 0.0 && hi >= 0.0);
    let tiny = (new_s - base_s).abs() < MIN_CHANGE_S;
    let v = if !change.is_finite() || change.abs() < threshold || holds_zero || tiny {
        Change::NoChange
    } else if change > 0.0 {
        Change::Regressed
    } else {
        Change::Improved
    };
    Some(Verdict {
        base_s,
        new_s,
        change,
        interval,
        threshold,
        verdict: v,
    })
}

impl std::fmt::Display for Verdict {
    /// `+12.3% [+10.1%, +14.0%] regressed (1.234 ms -> 1.386 ms)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:+.1}%", self.change * 100.0)?;
        if let Some((lo, hi)) = self.interval {
            write!(f, " [{:+.1}%, {:+.1}%]", lo * 100.0, hi * 100.0)?;
        }
        write!(
            f,
            " {} ({:.3} ms -> {:.3} ms)",
            self.verdict.name(),
            self.base_s * 1e3,
            self.new_s * 1e3
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() -> Result<()> {
        let base: Vec<f64> = (0..30).map(|i| 1.0 + 0.001 * f64::from(i % 5)).collect();
        let slower: Vec<f64> = base.iter().map(|x| x * 1.2).collect();
        let v = verdict(&base, &slower).ok_or_else(|| Error::Internal("none".into()))?;
        assert_eq!(v.verdict, Change::Regressed, "{v}");
        assert!((v.change - 0.2).abs() < 1e-9);
        let (lo, hi) = v
            .interval
            .ok_or_else(|| Error::Internal("no interval".into()))?;
        assert!(lo > 0.1 && hi < 0.3, "{v}");
        let faster: Vec<f64> = base.iter().map(|x| x * 0.5).collect();
        assert_eq!(
            verdict(&base, &faster).map(|v| v.verdict),
            Some(Change::Improved)
        );
        let same: Vec<f64> = base.iter().map(|x| x * 1.001).collect();
        assert_eq!(
            verdict(&base, &same).map(|v| v.verdict),
            Some(Change::NoChange)
        );
        // one sample each: the fixed threshold decides
        assert_eq!(
            verdict(&[1.0], &[1.03]).map(|v| v.verdict),
            Some(Change::NoChange)
        );
        // a microsecond op twice as slow by 2 us: jitter
        assert_eq!(
            verdict(&[2e-6], &[4e-6]).map(|v| v.verdict),
            Some(Change::NoChange)
        );
        assert_eq!(
            verdict(&[1.0], &[1.10]).map(|v| v.verdict),
            Some(Change::Regressed)
        );
        assert!(verdict(&[], &[1.0]).is_none());
        Ok(())
    }

    #[test]
    fn saved_and_loaded_and_bad_names_refused() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Internal(e.to_string()))?;
        let b = Baseline {
            version: BASELINE_VERSION,
            name: "main-1".into(),
            tool: "tandem 0.1.0".into(),
            created: "2026-11-23T00:00:00Z".into(),
            entries: [("bench/x".to_string(), vec![1.0, 2.0])].into(),
        };
        b.save(dir.path())?;
        assert_eq!(Baseline::load(dir.path(), "main-1")?, b);
        assert_eq!(list(dir.path()), vec!["main-1".to_string()]);
        let e = Baseline::load(dir.path(), "other").expect_err("missing");
        assert!(e.to_string().contains("saved: main-1"), "{e}");
        for bad in ["", "../x", ".hidden", "a/b", "a b"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        Ok(())
    }
}
