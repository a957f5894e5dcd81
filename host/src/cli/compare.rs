//! `tandem compare`: the same workload on every device kind found, side by side.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tandem::DeviceRegistry;
use tandem::exec::ExecOptions;
use tandem::plan::BackendChoice;
use tandem::run::{RunOptions, run_graph};

use super::baselines::BaselineArgs;
use super::render::{self, Format, FormatArgs};
use super::run::{ExecArgs, WorkloadArgs};

/// Options of `tandem compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub input: WorkloadArgs,
    #[command(flatten)]
    pub exec: ExecArgs,
    #[command(flatten)]
    pub format: FormatArgs,
    /// Also write a self-contained HTML page with charts of per-op time and error per
    /// backend here.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    #[command(flatten)]
    pub baseline: BaselineArgs,
}

/// Runs the workload once per device kind and prints per-op time and error side by side.
pub fn run(args: &CompareArgs, reg: &DeviceRegistry) -> anyhow::Result<()> {
    if let Some(p) = &args.html {
        tandem::files::check_writable(p)?;
    }
    args.exec.apply_memory_limit(reg)?;
    let base = args.baseline.load()?;
    let format = args.format.get();
    let (graph, config, label) = super::run::build(&args.input, &reg.options().limits())?;
    let not_compared: Vec<String> = reg
        .missing()
        .iter()
        .map(|m| format!("{} ({})", m.kind.name(), m.reason))
        .collect();
    if format == Format::Table {
        println!("workload: {label}");
        for m in &not_compared {
            println!("not compared: {m}");
        }
    }
    let mut kinds: Vec<_> = reg.backends().iter().map(|b| b.id().kind).collect();
    kinds.dedup();
    let mut runs = Vec::new();
    for kind in kinds {
        let opts = RunOptions {
            backend: BackendChoice::Only(kind),
            placement: Default::default(),
            backend_label: kind.name().into(),
            exec: ExecOptions {
                timeout: Duration::from_secs(args.exec.timeout),
                fallback: true,
                // fused units leave intermediates unwritten: only where no op is checked
                fuse: args.exec.no_check,
                queue_ahead: args.exec.queue_ahead,
            },
            check: !args.exec.no_check,
            workload: label.clone(),
            history: Some(super::history(reg.options())),
            limits: reg.options().limits(),
            allow_nonfinite: args.exec.allow_nonfinite,
            warmup: args.exec.warmup,
        };
        runs.push(run_graph(&graph, reg, &opts)?.report);
    }
    let measured = super::baselines::compare_entries(&runs);
    let verdicts = base
        .as_ref()
        .map(|b| super::baselines::verdicts(b, &measured));
    if let Some(name) = &args.baseline.save_baseline {
        let p = super::baselines::save(name, measured.clone())?;
        eprintln!("tandem: saved baseline '{name}' to {}", p.display());
    }
    if let Some(p) = &args.html {
        let page = render::html::compare_page(&label, &runs, &not_compared);
        tandem::files::write_atomic(p, page.as_bytes())?;
    }
    match format {
        Format::Json => {
            let mut v = render::envelope("compare");
            v.insert(
                "workload".into(),
                render::workload_json(&label, Some(&config)),
            );
            v.insert("devices".into(), render::devices_json(reg));
            v.insert("runs".into(), serde_json::to_value(&runs)?);
            if let Some(vs) = &verdicts {
                v.insert(
                    "baseline".into(),
                    super::baselines::verdicts_json(&args.baseline, vs),
                );
            }
            render::print_json(&serde_json::Value::Object(v))?;
        }
        f => {
            if f == Format::Markdown {
                print!("{}", render::markdown_lines(&format!("workload: {label}")));
                println!();
            }
            print!("{}", render::compare_grid(&graph, &runs).render(f)?);
            if f != Format::Csv {
                let note = "times are device-reported where the device reports them; * = ran on the CPU (the device lacks the op)";
                if f == Format::Markdown {
                    println!();
                    print!("{}", render::markdown_lines(note));
                } else {
                    println!("{note}");
                }
                if let Some(vs) = &verdicts {
                    print!("{}", super::baselines::verdict_lines(&args.baseline, vs));
                }
                if let Some(p) = &args.html {
                    println!("html: {}", p.display());
                }
            }
        }
    }
    Ok(())
}
