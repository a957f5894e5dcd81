//! `tandem fpga`: emit a kernel's RTL, estimate its resources with yosys, simulate it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use rand::{Rng, SeedableRng};
use tandem_fpga::FpgaDevice;
use tandem_fpga::core::KernelCore;
use tandem_fpga::kernels::{core_for, parse_params};
use tandem_fpga::shell::ShellConfig;

/// Which kernel and how it is built.
#[derive(Debug, Clone, Args)]
pub struct KernelArgs {
    /// Kernel: router, gemm or attention.
    #[arg(long)]
    pub kernel: String,
    /// Build parameters, `key=value,...` (router: e_max, k_max).
    #[arg(long, default_value = "")]
    pub params: String,
    /// Longest AXI burst in beats (power of two, 2..=256).
    #[arg(long, default_value_t = 64)]
    pub max_burst: u32,
}

impl KernelArgs {
    fn core(&self) -> anyhow::Result<Box<dyn KernelCore>> {
        let p = parse_params(&self.params)?;
        Ok(core_for(&self.kernel, &p)?)
    }

    fn shell(&self) -> ShellConfig {
        ShellConfig {
            max_burst: self.max_burst,
        }
    }
}

/// `tandem fpga` subcommands.
#[derive(Debug, Subcommand)]
pub enum FpgaCmd {
    /// Write the kernel's Verilog, kernel.xml and manifest.json to a folder.
    Emit {
        /// Kernel and build parameters.
        #[command(flatten)]
        kernel: KernelArgs,
        /// Output folder (created).
        #[arg(long)]
        out: PathBuf,
    },
    /// Run yosys synth_xilinx on the kernel and print LUT/FF/DSP/BRAM use.
    Synth {
        /// Kernel and build parameters.
        #[command(flatten)]
        kernel: KernelArgs,
        /// Keep the emitted files here (default: a temporary folder).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Simulate a random problem on the Verilator card and check it against the golden model.
    Sim {
        /// Kernel and build parameters.
        #[command(flatten)]
        kernel: KernelArgs,
        /// Tokens (router).
        #[arg(long, default_value_t = 256)]
        tokens: usize,
        /// Experts (router).
        #[arg(long, default_value_t = 64)]
        experts: usize,
        /// Experts per token (router).
        #[arg(long, default_value_t = 8)]
        top_k: usize,
        /// Random seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Memory read latency in cycles.
        #[arg(long, default_value_t = 40)]
        read_latency: u64,
        /// Memory bandwidth in bytes per cycle.
        #[arg(long, default_value_t = 8.0)]
        bytes_per_cycle: f64,
        /// Write a VCD trace here.
        #[arg(long)]
        vcd: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs a `tandem fpga` subcommand.
pub fn run(cmd: &FpgaCmd) -> anyhow::Result<()> {
    match cmd {
        FpgaCmd::Emit { kernel, out } => {
            let core = kernel.core()?;
            let e = tandem_fpga::emit::emit(core.as_ref(), kernel.shell(), out)?;
            println!("{}", e.verilog.display());
            println!("{}", e.kernel_xml.display());
            println!("{}", e.manifest_path.display());
            for s in &e.manifest.args {
                println!("  {:#06x}  {:<8} {:?}", s.offset, s.arg.name, s.arg.kind);
            }
            Ok(())
        }
        FpgaCmd::Synth { kernel, out, json } => {
            let core = kernel.core()?;
            let tmp;
            let dir = match out {
                Some(d) => d.clone(),
                None => {
                    tmp = std::env::temp_dir().join(format!("tandem-synth-{}", std::process::id()));
                    tmp
                }
            };
            let e = tandem_fpga::emit::emit(core.as_ref(), kernel.shell(), &dir)?;
            let t0 = Instant::now();
            let r = tandem_fpga::synth::synth(&e.verilog, core.name())?;
            if out.is_none() {
                let _ = std::fs::remove_dir_all(&dir);
            }
            if *json {
                let v = serde_json::json!({
                    "kernel": core.name(), "params": core.params(), "resources": r,
                    "seconds": t0.elapsed().as_secs_f64(),
                });
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!(
                    "{} {:?}: LUT {}  FF {}  DSP {}  BRAM18 {}  LUTRAM {}  CARRY {}  ({:.1} s, yosys synth_xilinx -family xcup)",
                    core.name(),
                    core.params(),
                    r.lut,
                    r.ff,
                    r.dsp,
                    r.bram18,
                    r.lutram,
                    r.carry,
                    t0.elapsed().as_secs_f64()
                );
            }
            Ok(())
        }
        FpgaCmd::Sim {
            kernel,
            tokens,
            experts,
            top_k,
            seed,
            read_latency,
            bytes_per_cycle,
            vcd,
            json,
        } => {
            if kernel.kernel != "router" {
                // core_for explains why gemm/attention cannot be simulated yet.
                kernel.core()?;
                bail!("`tandem fpga sim` drives the router only so far");
            }
            let core = kernel.core()?;
            let cfg = tandem_sim::SimConfig {
                mem: tandem_sim::MemConfig {
                    read_latency: *read_latency,
                    bytes_per_cycle: *bytes_per_cycle,
                    ..Default::default()
                },
                clock_mhz: tandem::backend::fpga::clock_mhz(),
                vcd: vcd.clone(),
            };
            let mut card = tandem_sim::SimCard::open(cfg)?;
            let t_build = Instant::now();
            card.load_core(core.as_ref(), kernel.shell())
                .context("loading the router")?;
            let build_s = t_build.elapsed().as_secs_f64();
            let (t, e, k) = (*tokens, *experts, *top_k);
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(*seed);
            let x: Vec<i16> = (0..t * e).map(|_| rng.gen_range(-2048..2048)).collect();
            let want = tandem_fpga::golden::router::route(&x, t, e, k)?;
            let cycles0 = card.stats().total_cycles;
            let wall0 = card.sim_wall();
            let (got, st) =
                tandem_sim::run::run_router(&mut card, &x, t, e, k, Duration::from_secs(600))?;
            let sim_cycles = card.stats().total_cycles - cycles0;
            let sim_wall = (card.sim_wall() - wall0).as_secs_f64();
            let ok = got == want;
            let clock = card.clock_hz();
            let per = st.cycles as f64 / (t * e).max(1) as f64;
            let speed = sim_cycles as f64 / sim_wall.max(1e-9);
            if *json {
                let v = serde_json::json!({
                    "kernel": "router", "params": core.params(), "tokens": t, "experts": e, "top_k": k,
                    "bit_exact": ok, "cycles": st.cycles, "cycles_per_logit": per,
                    "projected_s": st.cycles as f64 / clock,
                    "logits_per_s": (t * e) as f64 / (st.cycles as f64 / clock),
                    "sim_cycles_per_s": speed, "model_build_s": build_s,
                });
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!(
                    "router T={t} E={e} k={k}: {} vs golden; {} cycles ({per:.3} cycles/logit), \
                     projected {:.2} us at {:.0} MHz ({:.1} M logits/s); simulator {:.0} cycles/s \
                     (model load {build_s:.1} s)",
                    if ok { "bit-exact" } else { "MISMATCH" },
                    st.cycles,
                    st.cycles as f64 / clock * 1e6,
                    clock / 1e6,
                    (t * e) as f64 / (st.cycles as f64 / clock) / 1e6,
                    speed
                );
            }
            if !ok {
                bail!("the RTL does not match the golden model");
            }
            Ok(())
        }
    }
}
