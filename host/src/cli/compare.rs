//! `tandem compare`: the same workload on every device kind found, side by side.

use std::time::Duration;

use clap::Args;
use serde::Serialize;
use tandem::DeviceRegistry;
use tandem::backend::DeviceKind;
use tandem::exec::ExecOptions;
use tandem::plan::BackendChoice;
use tandem::report::RunReport;
use tandem::run::{RunOptions, run_graph};

use super::run::RunArgs;

/// Options of `tandem compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The workload and its sizes (as for `tandem run`). `--backend auto` (the default)
    /// compares every device kind found; `--backend KIND` compares that kind with the CPU and
    /// fails if it is not available here (unless --fallback).
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Serialize)]
struct Comparison {
    workload: String,
    runs: Vec<RunReport>,
}

/// Runs the workload once per device kind and prints per-op time and error side by side.
pub fn run(args: &CompareArgs, reg: &DeviceRegistry) -> anyhow::Result<()> {
    let p = &args.run.placement;
    if p.allow_lossy || p.max_error.is_some() {
        anyhow::bail!(
            "--allow-lossy and --max-error apply to auto placement; compare runs each backend on every op it has"
        );
    }
    let mut kinds: Vec<_> = reg.backends().iter().map(|b| b.id().kind).collect();
    kinds.dedup();
    match args.run.backend {
        BackendChoice::Auto if p.fallback => {
            anyhow::bail!("--fallback applies to an explicit --backend, not to auto")
        }
        BackendChoice::Auto => {}
        BackendChoice::Only(k) => {
            super::placement::require(reg, k, p.fallback)?;
            kinds.retain(|&x| x == DeviceKind::Cpu || x == k);
        }
    }
    let policy = p.policy();
    let (graph, _, label) = super::run::build(&args.run, &reg.options().limits())?;
    let mut runs = Vec::new();
    for kind in kinds {
        let opts = RunOptions {
            backend: BackendChoice::Only(kind),
            placement: policy,
            backend_label: kind.name().into(),
            exec: ExecOptions {
                timeout: Duration::from_secs(args.run.timeout),
                fallback: !policy.strict,
            },
            check: !args.run.no_check,
            workload: label.clone(),
            history: Some(super::history(reg.options())),
            limits: reg.options().limits(),
            allow_nonfinite: args.run.allow_nonfinite,
            warmup: args.run.warmup,
        };
        runs.push(run_graph(&graph, reg, &opts)?.report);
    }
    if args.run.json {
        let c = Comparison {
            workload: label,
            runs,
        };
        println!("{}", serde_json::to_string_pretty(&c)?);
        return Ok(());
    }
    println!("workload: {label}");
    for m in reg.missing() {
        println!("not compared: {} ({})", m.kind.name(), m.reason);
    }
    let mut header = format!("{:<20} {:<12}", "node", "op");
    for r in &runs {
        header.push_str(&format!(" | {:>22}", format!("{} ms / rel.err", r.backend)));
    }
    println!("{header}\n{}", "-".repeat(header.len()));
    for (i, node) in graph.nodes.iter().enumerate() {
        let mut line = format!("{:<20} {:<12}", node.name, node.op.name());
        for r in &runs {
            let n = &r.nodes[i];
            let t = n.run.launch.device_time.unwrap_or(n.run.wall).as_secs_f64() * 1e3;
            let here = if n.run.device.kind.name() == r.backend {
                ""
            } else {
                "*"
            };
            let err = n
                .error
                .rel_error
                .map(|e| format!("{e:.1e}"))
                .unwrap_or_else(|| "-".into());
            line.push_str(&format!(" | {:>12.3}{here:1} {err:>8}", t));
        }
        println!("{line}");
    }
    let mut total = format!("{:<33}", "total wall ms / output rel.err");
    for r in &runs {
        let e = r
            .output_rel_error
            .map(|e| format!("{e:.1e}"))
            .unwrap_or_else(|| "-".into());
        total.push_str(&format!(" | {:>13.3} {e:>8}", r.wall_s * 1e3));
    }
    println!("{}\n{total}", "-".repeat(header.len()));
    println!(
        "times are device-reported where the device reports them; * = ran on the CPU (the device lacks the op)"
    );
    Ok(())
}
