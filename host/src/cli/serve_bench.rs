//! `tandem serve-bench`: many requests of a workload at once through one executor service
//! (`tandem::serve`), throughput and latency per device mix, in any `--format`.

use std::time::Duration;

use clap::Args;
use tandem::DeviceRegistry;
use tandem::exec::ExecOptions;
use tandem::plan::{self, BackendChoice, PlacementPolicy};
use tandem::serve::{ServeBenchOptions, ServeBenchReport, serve_bench};

use super::render::{self, Format, FormatArgs, Grid};
use super::run::WorkloadArgs;

/// Options of `tandem serve-bench`.
#[derive(Debug, Args)]
pub struct ServeBenchArgs {
    #[command(flatten)]
    pub input: WorkloadArgs,
    /// Requests in all (per device mix).
    #[arg(long, default_value_t = 64)]
    pub requests: usize,
    /// Client threads submitting at once.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Requests in flight at most (default: --concurrency); a client beyond it waits.
    #[arg(long)]
    pub queue_depth: Option<usize>,
    /// Device mixes to measure, comma-separated: auto or device kinds (one row each).
    #[arg(long, value_delimiter = ',', default_value = "auto",
          value_parser = super::backend_choice_parser())]
    pub backend: Vec<BackendChoice>,
    /// Distinct input sets rotated among the requests.
    #[arg(long, default_value_t = 4)]
    pub input_sets: usize,
    /// Untimed requests first (kernel compilation, weight upload).
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Longest wait for one op, in seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    #[command(flatten)]
    pub format: FormatArgs,
}

/// Runs the bench for each device mix and prints one row per mix.
pub fn run(args: &ServeBenchArgs, reg: &DeviceRegistry) -> anyhow::Result<()> {
    let (graph, config, label) = super::run::build(&args.input, &reg.options().limits())?;
    let opts = ServeBenchOptions {
        requests: args.requests,
        concurrency: args.concurrency,
        queue_depth: args.queue_depth.unwrap_or(args.concurrency),
        input_sets: args.input_sets,
        warmup: args.warmup,
        exec: ExecOptions {
            timeout: Duration::from_secs(args.timeout),
            fallback: true,
            // no op is checked: the MoE block may run as one unit
            fuse: true,
            ..ExecOptions::default()
        },
    };
    let tokens = config.batch * config.seq_len;
    let mut reports: Vec<ServeBenchReport> = Vec::new();
    for &choice in &args.backend {
        let p = plan::plan_with(&graph, reg, choice, None, &PlacementPolicy::default())?;
        reports.push(serve_bench(reg, &graph, &p, choice.name(), tokens, &opts)?);
    }
    let format = args.format.get();
    if format == Format::Json {
        let mut v = render::envelope("serve_bench");
        v.insert(
            "workload".into(),
            render::workload_json(&label, Some(&config)),
        );
        v.insert("devices".into(), render::devices_json(reg));
        v.insert("results".into(), serde_json::to_value(&reports)?);
        return render::print_json(&serde_json::Value::Object(v));
    }
    if format == Format::Table {
        println!("workload: {label}");
        println!(
            "{} requests per mix from {} client threads, at most {} in flight",
            opts.requests, opts.concurrency, opts.queue_depth
        );
    }
    print!("{}", grid(&reports).render(format)?);
    Ok(())
}

fn grid(reports: &[ServeBenchReport]) -> Grid {
    let mut g = Grid::new(
        &[
            "backend", "mix", "requests", "clients", "req/s", "tokens/s", "p50 ms", "p99 ms",
            "max ms",
        ],
        &[2, 3, 4, 5, 6, 7, 8],
    );
    let ms = |s: f64| format!("{:.2}", s * 1e3);
    for r in reports {
        g.rows.push(vec![
            r.backend.clone(),
            r.mix.clone(),
            r.requests.to_string(),
            r.concurrency.to_string(),
            format!("{:.1}", r.requests_per_s),
            format!("{:.0}", r.tokens_per_s),
            ms(r.p50_s),
            ms(r.p99_s),
            ms(r.max_s),
        ]);
    }
    g
}
