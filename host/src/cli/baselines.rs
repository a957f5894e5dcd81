//! `--save-baseline NAME` and `--baseline NAME` of `bench` and `compare`: baselines kept in
//! the user's cache (`$TANDEM_CACHE_DIR/baselines`, else `$XDG_CACHE_HOME/tandem/baselines`,
//! else `~/.cache/tandem/baselines`), and the verdicts printed against one.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde_json::{Value, json};
use tandem::baseline::{BASELINE_VERSION, Baseline, Change, Verdict, check_name, verdict};
use tandem::bench::BenchReport;
use tandem::options::ProcessEnv;
use tandem::report::RunReport;

/// Baseline flags.
#[derive(Debug, Clone, Args)]
pub struct BaselineArgs {
    /// Save the times measured as baseline NAME (replacing one of that name).
    #[arg(long, value_name = "NAME")]
    pub save_baseline: Option<String>,
    /// Compare the times measured with baseline NAME and say, per entry, whether they
    /// regressed, improved or did not change beyond the noise.
    #[arg(long, value_name = "NAME")]
    pub baseline: Option<String>,
}

/// Where baselines are kept.
pub fn dir() -> anyhow::Result<PathBuf> {
    tandem::options::user_cache_dir(&ProcessEnv)
        .map(|d| d.join("baselines"))
        .context("no folder for baselines: set TANDEM_CACHE_DIR, XDG_CACHE_HOME or HOME")
}

impl BaselineArgs {
    /// The baseline asked for by `--baseline`, read before any work (a wrong name fails
    /// at once); names checked.
    pub fn load(&self) -> anyhow::Result<Option<Baseline>> {
        if let Some(n) = &self.save_baseline {
            check_name(n)?;
        }
        match &self.baseline {
            None => Ok(None),
            Some(n) => Ok(Some(Baseline::load(&dir()?, n)?)),
        }
    }
}

/// Saves `entries` as baseline `name`.
pub fn save(name: &str, entries: BTreeMap<String, Vec<f64>>) -> anyhow::Result<PathBuf> {
    let b = Baseline {
        version: BASELINE_VERSION,
        name: name.to_string(),
        tool: format!(
            "tandem {} ({})",
            env!("CARGO_PKG_VERSION"),
            super::render::GIT_COMMIT
        ),
        created: super::render::timestamp(),
        entries,
    };
    Ok(b.save(&dir()?)?)
}

/// The entries of a compare: per backend, each node's time (device-reported where there
/// is one) and the whole run's wall time.
pub fn compare_entries(runs: &[RunReport]) -> BTreeMap<String, Vec<f64>> {
    let mut m = BTreeMap::new();
    for r in runs {
        for n in &r.nodes {
            let t = n.run.launch.device_time.unwrap_or(n.run.wall).as_secs_f64();
            m.insert(format!("compare/{}/{}", r.backend, n.run.node), vec![t]);
        }
        m.insert(format!("compare/{}/total", r.backend), vec![r.wall_s]);
    }
    m
}

/// The entry of a bench: every timed run's seconds.
pub fn bench_entries(r: &BenchReport) -> BTreeMap<String, Vec<f64>> {
    [(
        format!("bench/{}/{}/{}", r.op, r.shape, r.backend),
        r.samples_s.clone(),
    )]
    .into()
}

/// Per key measured now: the verdict against the baseline, `None` where the baseline has
/// no such key.
pub fn verdicts(
    base: &Baseline,
    measured: &BTreeMap<String, Vec<f64>>,
) -> Vec<(String, Option<Verdict>)> {
    measured
        .iter()
        .map(|(k, v)| (k.clone(), base.entries.get(k).and_then(|b| verdict(b, v))))
        .collect()
}

fn counts(vs: &[(String, Option<Verdict>)]) -> (usize, usize, usize, usize) {
    let n = |c: Change| {
        vs.iter()
            .filter(|(_, v)| v.as_ref().is_some_and(|v| v.verdict == c))
            .count()
    };
    let absent = vs.iter().filter(|(_, v)| v.is_none()).count();
    (
        n(Change::Regressed),
        n(Change::Improved),
        n(Change::NoChange),
        absent,
    )
}

/// The verdicts as text: one line per entry, then the count of each.
pub fn verdict_lines(args: &BaselineArgs, vs: &[(String, Option<Verdict>)]) -> String {
    let name = args.baseline.as_deref().unwrap_or("");
    let mut s = format!("against baseline '{name}':\n");
    for (k, v) in vs {
        match v {
            Some(v) => s.push_str(&format!("  {k}: {v}\n")),
            None => s.push_str(&format!("  {k}: not in the baseline\n")),
        }
    }
    let (r, i, n, a) = counts(vs);
    s.push_str(&format!(
        "verdict: {r} regressed, {i} improved, {n} no change{}\n",
        if a > 0 {
            format!(", {a} not in the baseline")
        } else {
            String::new()
        }
    ));
    s
}

/// The verdicts as JSON.
pub fn verdicts_json(args: &BaselineArgs, vs: &[(String, Option<Verdict>)]) -> Value {
    let (r, i, n, a) = counts(vs);
    json!({
        "name": args.baseline,
        "entries": vs.iter().map(|(k, v)| json!({"key": k, "verdict": v})).collect::<Vec<_>>(),
        "regressed": r, "improved": i, "no_change": n, "not_in_baseline": a,
    })
}
