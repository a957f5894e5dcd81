//! `tandem bench overhead`: the runtime's per-op cost (planner and executor) on graphs of
//! empty ops, printed in any `--format`.

use clap::Args;
use tandem::DeviceRegistry;
use tandem::bench::overhead::{self, OverheadOptions};

use super::render::{self, Format, FormatArgs, Grid};

/// Options of `tandem bench overhead`.
#[derive(Debug, Clone, Args)]
pub struct OverheadArgs {
    /// Ops per graph.
    #[arg(long, default_value_t = OverheadOptions::default().ops)]
    pub ops: usize,
    /// Measured repetitions per shape (median reported), after one untimed run.
    #[arg(long, default_value_t = OverheadOptions::default().repeats)]
    pub repeats: usize,
    #[command(flatten)]
    pub format: FormatArgs,
}

/// Measures and prints.
pub fn run(args: &OverheadArgs, reg: &DeviceRegistry) -> anyhow::Result<()> {
    let report = overhead::run(
        reg,
        &OverheadOptions {
            ops: args.ops,
            repeats: args.repeats,
        },
    )?;
    let format = args.format.get();
    if format == Format::Json {
        let mut v = render::envelope("bench_overhead");
        render::merge(&mut v, serde_json::to_value(&report)?);
        return render::print_json(&serde_json::Value::Object(v));
    }
    let mut g = Grid::new(
        &["shape", "ops", "plan us/op", "execute us/op", "total us/op"],
        &[1, 2, 3, 4],
    );
    for r in &report.rows {
        g.rows.push(vec![
            r.shape.name().to_string(),
            r.ops_run.to_string(),
            format!("{:.3}", r.plan_us_per_op),
            format!("{:.3}", r.execute_us_per_op),
            format!("{:.3}", r.total_us_per_op),
        ]);
    }
    if format == Format::Table {
        println!(
            "tandem runtime overhead: empty ops on {}, median of {} runs",
            report.device, report.repeats
        );
    }
    print!("{}", g.render(format)?);
    Ok(())
}
