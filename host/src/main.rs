//! The `tandem` command line.
//!
//! Exit codes: 0 success, 1 a run failed or its input was rejected, 2 bad command-line usage.

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tandem::DeviceRegistry;
use tandem::backend::{CudaDType, Probe};
use tandem::options::{Layered, Options, ProcessEnv};
use tracing_subscriber::EnvFilter;

/// `--version`: the version, the commit it was built from and the device kinds it drives.
#[cfg(feature = "cuda")]
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TANDEM_GIT_COMMIT"),
    ")\ndevice kinds: cpu, cuda, fpga-sim (Verilator, found at run time), fpga (XRT, found at run time)"
);
#[cfg(not(feature = "cuda"))]
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TANDEM_GIT_COMMIT"),
    ")\ndevice kinds: cpu, fpga-sim (Verilator, found at run time), fpga (XRT, found at run time); built without cuda"
);

/// tandem runs transformer work (attention, MoE, fused linear and norm ops) across the CPU,
/// NVIDIA GPUs and Alveo FPGAs (or their Verilator simulation), and compares the backends.
#[derive(Debug, Parser)]
#[command(name = "tandem", version = LONG_VERSION, about, long_about = None,
          after_help = cli::ENVIRONMENT_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List every device kind: found (with details) or missing (with the reason).
    Devices(cli::devices::DevicesArgs),
    /// Run a workload (default: one Mixtral decoder layer) and report per-op time and error.
    Run(cli::run::RunArgs),
    /// Run a workload once per device kind found and show per-op time and error side by side.
    Compare(cli::compare::CompareArgs),
    /// Show where each op of a workload would run, and why.
    Plan(cli::run::PlanArgs),
    /// Run one op on named tensors from a safetensors file.
    Op(cli::op::OpArgs),
    /// Time one op on one backend (median of many runs, inputs rotated), or the runtime's
    /// own overhead (`bench overhead`).
    Bench(cli::bench::BenchArgs),
    /// Many requests of a workload at once through one executor: throughput and latency.
    ServeBench(cli::serve_bench::ServeBenchArgs),
    /// FPGA kernels: emit Verilog + kernel.xml, synthesise with yosys, simulate with Verilator.
    #[command(subcommand)]
    Fpga(cli::fpga::FpgaCmd),
    /// Measure every device's links and op times (the built-in layer's ops at three lengths)
    /// and keep them for the planner; `--show` prints what is kept.
    Calibrate(cli::calibrate::CalibrateArgs),
    /// Model folders (config.json + safetensors): write a small test model, or describe one.
    #[command(subcommand)]
    Model(cli::model::ModelCmd),
    /// The op-time history the planner learns from: show it, or reset it.
    #[command(subcommand)]
    History(cli::history::HistoryCmd),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on stdout.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

impl Command {
    /// The `--cuda-dtype` of the commands that open devices.
    fn cuda_dtype(&self) -> Option<CudaDType> {
        match self {
            Command::Devices(a) => a.cuda_dtype,
            Command::Run(a) => a.input.cuda_dtype,
            Command::Plan(a) => a.input.cuda_dtype,
            Command::Compare(a) => a.input.cuda_dtype,
            Command::Op(a) => a.cuda_dtype,
            Command::Bench(a) => a.cuda_dtype,
            Command::Calibrate(a) => a.cuda_dtype,
            Command::ServeBench(a) => a.input.cuda_dtype,
            Command::Fpga(_)
            | Command::History(_)
            | Command::Model(_)
            | Command::Completions { .. } => None,
        }
    }

    /// Whether the command compares op times with the planner's (`run --explain`,
    /// `calibrate`): then each CUDA op is timed alone, the stream held while it queues
    /// ([`tandem::options::CudaOptions::hold_stream`]), unless `TANDEM_CUDA_HOLD_STREAM` is set.
    fn times_ops_alone(&self) -> bool {
        match self {
            Command::Run(a) => a.explain,
            Command::Calibrate(_) => true,
            _ => false,
        }
    }
}

fn main() -> ExitCode {
    // `tandem __xrt-probe LIBRARY`: the child that lists Alveo boards for its parent (XRT can
    // end the process it runs in); nothing else runs in it, devices are not discovered.
    let args: Vec<std::ffi::OsString> = std::env::args_os().take(3).collect();
    if args
        .get(1)
        .is_some_and(|a| a == tandem::backend::fpga::xrt::PROBE_COMMAND)
    {
        let Some(lib) = args.get(2) else {
            eprintln!(
                "tandem: {} needs the XRT library's path",
                tandem::backend::fpga::xrt::PROBE_COMMAND
            );
            return ExitCode::from(2);
        };
        let code = tandem_fpga::xrt::probe::child_main(std::path::Path::new(lib));
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    // A closed stdout (`tandem devices | head -1`) ends the program quietly, as it does
    // other command-line tools, instead of a panic in println!.
    // SAFETY: restores the default action of one signal before any thread is started.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    keep_freed_heap();
    let log_warning = init_logging();
    let cli = Cli::parse();
    if let Some(w) = log_warning {
        eprintln!("tandem: {w}");
    }
    if let Command::Completions { shell } = &cli.command {
        let mut cmd = <Cli as clap::CommandFactory>::command();
        clap_complete::generate(*shell, &mut cmd, "tandem", &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    if let Command::Model(c) = &cli.command {
        // Files only: no devices to discover.
        return finish(cli::model::run(c));
    }
    // The options, once: flags over the environment (a flag hides its variable, so a bad
    // TANDEM_CUDA_DTYPE does not matter under --cuda-dtype); a value that is not accepted
    // stops here, before any device is opened.
    let flags: Vec<(&str, &str)> = cli
        .command
        .cuda_dtype()
        .map(|d| (CudaDType::ENV, d.name()))
        .into_iter()
        .collect();
    let mut options = match Options::from_source(&Layered(&flags, &ProcessEnv)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("tandem: {e}");
            return ExitCode::from(1);
        }
    };
    // ...unless TANDEM_CUDA_HOLD_STREAM says otherwise (comparisons).
    let hold_var = tandem::options::cuda::HOLD_STREAM_VAR;
    let hold_set = !matches!(tandem::options::Env::text(&ProcessEnv, hold_var), Ok(None));
    if cli.command.times_ops_alone() && !hold_set {
        options.cuda.hold_stream = true;
    }
    // Boards are listed by this binary's `__xrt-probe` in a child process.
    options.fpga.xrt_probe = std::env::current_exe().ok();
    let mut reg = DeviceRegistry::discover_with(Probe {
        options,
        ..Probe::default()
    });
    // What `tandem calibrate` measured here, for the planner (a bad file is a warning).
    if let Some(p) = reg.options().calibration.clone() {
        match tandem::plan::Calibration::load(&p, &tandem::plan::machine_name()) {
            Ok(c) => reg.set_calibration(c),
            Err(e) => tracing::warn!("calibration not used: {e}"),
        }
    }
    let result = match &cli.command {
        Command::Devices(a) => cli::devices::run(a, &reg),
        Command::Run(a) => cli::run::run(a, &reg),
        Command::Compare(a) => cli::compare::run(a, &reg),
        Command::Plan(a) => cli::run::plan_only(a, &reg),
        Command::Op(a) => cli::op::run(a, &reg),
        Command::Bench(a) => cli::bench::run(a, &reg),
        Command::Calibrate(a) => cli::calibrate::run(a, &reg),
        Command::ServeBench(a) => cli::serve_bench::run(a, &reg),
        Command::Fpga(c) => cli::fpga::run(c, &reg.options().fpga),
        Command::History(c) => cli::history::run(c, reg.options()),
        Command::Model(c) => cli::model::run(c),
        Command::Completions { .. } => Ok(()),
    };
    finish(result)
}

/// The exit code of a command's result, its error (and causes) printed.
fn finish(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tandem: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::from(1)
        }
    }
}

/// Logs to stderr (filtered by `TANDEM_LOG`, default `warn`; colour only on a terminal) and
/// progress to stderr (bars on a terminal, lines otherwise). A `TANDEM_LOG` that is not a
/// filter gives `warn` and a warning, returned to be printed.
fn init_logging() -> Option<String> {
    use tandem::options::Env;
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let terminal = cli::render::stderr_is_terminal();
    let (filter, warning) = match ProcessEnv.text("TANDEM_LOG") {
        Ok(None) => (EnvFilter::new("warn"), None),
        Ok(Some(v)) => match EnvFilter::builder().parse(&v) {
            Ok(f) => (f, None),
            Err(e) => (
                EnvFilter::new("warn"),
                Some(format!(
                    "TANDEM_LOG='{v}' is not a log filter ({e}); using warn. Accepted: a level \
                     (error, warn, info, debug, trace) or target=level pairs joined by commas"
                )),
            ),
        },
        Err(e) => (EnvFilter::new("warn"), Some(e.to_string())),
    };
    // Progress events are the progress layer's, whatever TANDEM_LOG lets through.
    let filter = match "tandem::progress=off".parse() {
        Ok(d) => filter.add_directive(d),
        Err(_) => filter,
    };
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(terminal)
        .with_filter(filter);
    let progress = cli::render::progress::ProgressLayer::new(terminal).with_filter(
        tracing_subscriber::filter::Targets::new()
            .with_target(tandem::progress::TARGET, tracing::Level::INFO),
    );
    tracing_subscriber::registry()
        .with(fmt)
        .with(progress)
        .init();
    warning
}

/// glibc's allocator gives the top of its heap back to the system whenever more than twice
/// the largest freed large block is free there, and maps blocks over a moving threshold
/// afresh each time: planning and executing a graph allocates and frees tens of MB (per node:
/// its placement, buffers, run record), so every execution page-faulted its memory in anew,
/// which on a VM cost more than the runtime's own work (`tandem bench overhead`: 6x the page
/// faults). Fixed thresholds instead: blocks over 32 MiB (tensors) are still mapped and given
/// back when freed; up to 256 MiB of freed heap is kept for reuse.
fn keep_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets allocator parameters; called before any thread is started.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}
