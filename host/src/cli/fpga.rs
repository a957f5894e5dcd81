//! `tandem fpga`: emit a kernel's RTL, estimate its resources with yosys, simulate it; read
//! an xclbin (`inspect`); build one with Vivado/Vitis (`package`, `hls`), or, where they are
//! absent, write the generated files and print the exact commands.
//!
//! `tandem fpga sim` opens the card through the FPGA backend's device factory
//! (`tandem::backend::fpga::sim_factory`) and runs the kernel through the same drivers as the
//! backend (`tandem_fpga::drive`), checking the result bit for bit against the golden model.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem::options::FpgaOptions;
use tandem_fpga::core::KernelCore;
use tandem_fpga::kernels::gemm::pad8;
use tandem_fpga::kernels::router::RouterCore;
use tandem_fpga::kernels::{Build, core_for, parse_params};
use tandem_fpga::shell::ShellConfig;
use tandem_fpga::xclbin::{Summary, Xclbin};
use tandem_fpga::{FpgaDevice, drive, flow, golden};

/// Which kernel and how it is built.
#[derive(Debug, Clone, Args)]
pub struct KernelArgs {
    /// Kernel: router, gemm or attention.
    #[arg(long)]
    pub kernel: String,
    /// Build parameters, `key=value,...` (router: e_max, k_max, lanes, data_bits).
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
    /// List an xclbin's platform, UUID, kernels with their arguments and banks, memories,
    /// clocks and sections.
    Inspect {
        /// The xclbin file.
        file: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Build an xclbin: emit the RTL kernel, run Vivado's package_xo and `v++ --link` with
    /// generated connectivity (one HBM/DDR bank per AXI port), record it in the manifest.
    /// Without Vivado/Vitis: write the generated files, print the commands, exit 1.
    Package {
        /// Kernel and build parameters.
        #[command(flatten)]
        kernel: KernelArgs,
        /// Target platform: u55c, u250, or its full name.
        #[arg(long)]
        platform: String,
        /// Build folder (default: build/xclbin/<kernel>_<platform>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// The bitstream manifest to record the xclbin in (the xclbin is copied next to it).
        #[arg(long, default_value = "bitstreams/manifest.toml")]
        manifest: PathBuf,
        /// Kernel clock to ask v++ for, MHz.
        #[arg(long, default_value_t = tandem_fpga::DEFAULT_CLOCK_MHZ as u32)]
        clock_mhz: u32,
    },
    /// Run Vitis HLS on the kernel's C++ version (hls/tcl/<kernel>.tcl: csim, csynth, export
    /// of an .xo). Without vitis_hls: print the command, exit 1.
    Hls {
        /// Kernel: router, gemm or attention.
        #[arg(long)]
        kernel: String,
        /// The folder of the HLS sources and scripts.
        #[arg(long, default_value = "hls")]
        hls_dir: PathBuf,
    },
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
        /// Problem shape: gemm `M,N,K` (default 64,64,64), attention `NQ,NKV,D` (default
        /// 32,64,16; D at most the build's d_max).
        #[arg(long)]
        shape: Option<String>,
        /// Longest the simulated run may take (wall clock), in seconds.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
        /// Causal mask (attention).
        #[arg(long)]
        causal: bool,
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
pub fn run(cmd: &FpgaCmd, fpga_opts: &FpgaOptions) -> anyhow::Result<()> {
    match cmd {
        FpgaCmd::Inspect { file, json } => inspect(file, *json),
        FpgaCmd::Package {
            kernel,
            platform,
            out,
            manifest,
            clock_mhz,
        } => package(kernel, platform, out.as_deref(), manifest, *clock_mhz),
        FpgaCmd::Hls { kernel, hls_dir } => hls(kernel, hls_dir),
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
            let task = tandem::progress::Task::announce(
                "yosys",
                format!(
                    "synthesising the {} kernel with yosys synth_xilinx (a minute or more for the larger kernels)",
                    core.name()
                ),
                None,
                "",
            );
            let r = tandem_fpga::synth::synth(&e.verilog, core.name());
            drop(task);
            let r = r?;
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
            shape,
            causal,
            timeout,
            seed,
            read_latency,
            bytes_per_cycle,
            vcd,
            json,
        } => {
            let core = kernel.core()?;
            fits_build(core.as_ref(), *experts, *top_k, shape.as_deref())?;
            let mut opts = fpga_opts.clone();
            opts.sim_read_latency = Some(*read_latency);
            opts.sim_bytes_per_cycle = Some(*bytes_per_cycle);
            opts.sim_vcd = vcd.clone();
            opts.validate()?;
            let open = tandem::backend::fpga::sim_factory();
            let mut dev = open(&opts)?;
            let t_build = Instant::now();
            dev.load_core(core.as_ref(), kernel.shell())
                .with_context(|| format!("loading the {}", core.name()))?;
            let build_s = t_build.elapsed().as_secs_f64();
            let mut rng = ChaCha8Rng::seed_from_u64(*seed);
            let limit = Duration::from_secs(*timeout);
            let dev = dev.as_mut();
            let out = match core.name() {
                "router" => {
                    let Build::Router(c) = Build::of(core.as_ref())? else {
                        bail!("the router build's parameters did not parse as a router's");
                    };
                    sim_router(dev, &c, &mut rng, *tokens, *experts, *top_k, limit)?
                }
                "gemm" => sim_gemm(
                    dev,
                    &mut rng,
                    &shape_of(shape.as_deref(), [64, 64, 64])?,
                    limit,
                )?,
                "attention" => {
                    let s = shape_of(shape.as_deref(), [32, 64, 16])?;
                    sim_attention(dev, core.as_ref(), &mut rng, &s, *causal, limit)?
                }
                other => bail!("`tandem fpga sim` has no driver for kernel `{other}`"),
            };
            let clock = dev.clock_hz();
            let secs = out.cycles as f64 / clock;
            let speed = out.sim_cycles as f64 / out.sim_wall.max(1e-9);
            let per = out.cycles as f64 / out.work.max(1.0);
            let unit = out.unit;
            if *json {
                let mut v = serde_json::json!({
                    "kernel": core.name(), "params": core.params(),
                    "bit_exact": out.bit_exact, "cycles": out.cycles,
                    "projected_s": secs,
                    "sim_cycles_per_s": speed, "model_build_s": build_s,
                });
                if let Some(m) = v.as_object_mut() {
                    m.insert(format!("cycles_per_{unit}"), per.into());
                    m.insert(format!("{unit}s_per_s"), (out.work / secs).into());
                    if let serde_json::Value::Object(extra) = out.json {
                        m.extend(extra);
                    }
                }
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!(
                    "{}: {} vs golden; {} cycles ({per:.3} cycles/{unit}), projected {:.2} us at \
                     {:.0} MHz ({:.1} M {unit}s/s); simulator {:.0} cycles/s (model load \
                     {build_s:.1} s)",
                    out.label,
                    if out.bit_exact {
                        "bit-exact"
                    } else {
                        "MISMATCH"
                    },
                    out.cycles,
                    secs * 1e6,
                    clock / 1e6,
                    out.work / secs / 1e6,
                    speed
                );
            }
            if !out.bit_exact {
                bail!("the RTL does not match the golden model");
            }
            Ok(())
        }
    }
}

/// `tandem fpga inspect`.
fn inspect(file: &Path, json: bool) -> anyhow::Result<()> {
    let x = Xclbin::read(file)?;
    let s = Summary::of(&x);
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        println!("{s}");
    }
    Ok(())
}

/// `tandem fpga package`.
fn package(
    kernel: &KernelArgs,
    platform: &str,
    out: Option<&Path>,
    manifest: &Path,
    clock_mhz: u32,
) -> anyhow::Result<()> {
    let platform = tandem_fpga::platform::platform(platform)?;
    if clock_mhz == 0 {
        bail!("--clock-mhz 0: the kernel clock must be positive (MHz)");
    }
    let core = kernel.core()?;
    let dir = out.map_or_else(
        || PathBuf::from(format!("build/xclbin/{}_{}", core.name(), platform.key)),
        Path::to_path_buf,
    );
    let req = flow::PackageRequest {
        core: core.as_ref(),
        shell: kernel.shell(),
        platform,
        clock_mhz,
    };
    let plan = flow::prepare(req, &dir)?;
    println!(
        "{} {:?} for the {} ({}, {} x {} {} banks) at {clock_mhz} MHz",
        plan.kernel,
        plan.params,
        platform.board,
        platform.vbnv,
        platform.banks,
        human_bytes(platform.bank_bytes),
        platform.bank_prefix,
    );
    println!("  rtl      {}", plan.emitted.dir.display());
    println!("  link     {}", plan.link_cfg.display());
    for l in std::fs::read_to_string(&plan.link_cfg)?
        .lines()
        .filter(|l| l.starts_with("nk=") || l.starts_with("sp="))
    {
        println!("             {l}");
    }
    println!("  script   {}", plan.script.display());
    println!("commands:");
    for c in &plan.commands {
        println!("  {}", c.shell());
    }
    let xclbin = plan.run()?;
    let entry = plan.record(manifest)?;
    println!(
        "built {} ({} MHz, sha256 {}); recorded as `{}` in {}",
        xclbin.display(),
        entry.clock_mhz,
        entry.sha256,
        entry.name,
        manifest.display()
    );
    Ok(())
}

/// `tandem fpga hls`.
fn hls(kernel: &str, hls_dir: &Path) -> anyhow::Result<()> {
    if !tandem_fpga::kernels::KERNELS.contains(&kernel) {
        bail!(
            "unknown kernel `{kernel}` (known: {})",
            tandem_fpga::kernels::KERNELS.join(", ")
        );
    }
    let cmd = flow::hls::hls_command(hls_dir, kernel)?;
    println!("command:");
    println!("  {}", cmd.shell());
    flow::hls::run_hls(&cmd)?;
    println!(
        "exported {}",
        cmd.cwd.join(flow::hls::hls_xo(kernel)).display()
    );
    Ok(())
}

/// `n` bytes as `512 MiB` or `16 GiB`.
fn human_bytes(n: u64) -> String {
    if n >= 1 << 30 && n.trailing_zeros() >= 30 {
        format!("{} GiB", n >> 30)
    } else {
        format!("{} MiB", n >> 20)
    }
}

/// What a simulated run found.
struct SimOutcome {
    /// The problem, e.g. `router T=256 E=64 k=8`.
    label: String,
    /// Whether the card's result equals the golden model's.
    bit_exact: bool,
    /// Kernel cycles (ap_start to ap_done, summed over launches).
    cycles: u64,
    /// Work done (logits, multiply-adds, visible query-key pairs) ...
    work: f64,
    /// ... and its unit.
    unit: &'static str,
    /// Cycles the simulator ran for the driver call, and the wall time it took.
    sim_cycles: u64,
    sim_wall: f64,
    /// The problem's sizes, for `--json`.
    json: serde_json::Value,
}

/// Runs `f` (a driver call) on `dev`, measuring the simulated cycles and the wall time.
fn timed<T>(
    dev: &mut dyn FpgaDevice,
    f: impl FnOnce(&mut dyn FpgaDevice) -> Result<T, tandem_fpga::FpgaError>,
) -> anyhow::Result<(T, u64, f64)> {
    let c0 = dev.stats().total_cycles;
    let t0 = Instant::now();
    let r = f(dev)?;
    let wall = t0.elapsed().as_secs_f64();
    Ok((r, dev.stats().total_cycles - c0, wall))
}

/// `--shape a,b,c`, or `default`.
fn shape_of(s: Option<&str>, default: [usize; 3]) -> anyhow::Result<[usize; 3]> {
    let Some(s) = s else { return Ok(default) };
    let v: Vec<usize> = s
        .split(',')
        .map(|x| x.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .with_context(|| format!("--shape `{s}`: expected three positive integers a,b,c"))?;
    match v.as_slice() {
        &[a, b, c] if a > 0 && b > 0 && c > 0 => Ok([a, b, c]),
        _ => bail!("--shape `{s}`: expected three positive integers a,b,c"),
    }
}

/// Refuses a `tandem fpga sim` problem the loaded build cannot take (the kernel would finish
/// at once without touching memory, and the comparison would report a mismatch instead of the
/// reason), naming the build's limit.
fn fits_build(
    core: &dyn KernelCore,
    e: usize,
    k: usize,
    shape: Option<&str>,
) -> anyhow::Result<()> {
    let too_big = |what: &str, v: usize, limit: u32, param: &str| -> anyhow::Result<()> {
        if v > limit as usize {
            bail!(
                "{what} = {v} exceeds this {} build's {param} = {limit} (pass a larger one with \
                 --params {param}=...)",
                core.name()
            );
        }
        Ok(())
    };
    match Build::of(core)? {
        Build::Router(c) => {
            too_big("experts", e, c.e_max, "e_max")?;
            too_big("top_k", k, c.k_max, "k_max")
        }
        Build::Gemm(c) => {
            let [_, n, k] = shape_of(shape, [64, 64, 64])?;
            too_big("N (padded to 8)", pad8(n), c.n_max, "n_max")?;
            too_big("K (padded to 8)", pad8(k), c.k_max, "k_max")
        }
        Build::Attention(c) => {
            let [_, nkv, d] = shape_of(shape, [32, 64, 16])?;
            too_big("Nkv", nkv, c.nkv_max, "nkv_max")?;
            too_big("D (padded to 8)", pad8(d), c.d_max, "d_max")
        }
        Build::Vecops(_) => Ok(()),
    }
}

fn sim_router(
    dev: &mut dyn FpgaDevice,
    core: &RouterCore,
    rng: &mut ChaCha8Rng,
    t: usize,
    e: usize,
    k: usize,
    limit: Duration,
) -> anyhow::Result<SimOutcome> {
    let x: Vec<i16> = (0..t * e).map(|_| rng.gen_range(-2048..2048)).collect();
    let want = golden::router::route(&x, t, e, k)?;
    let ((got, st), sim_cycles, sim_wall) =
        timed(dev, |d| drive::run_router(d, core, &x, t, e, k, limit))?;
    Ok(SimOutcome {
        label: format!("router T={t} E={e} k={k}"),
        bit_exact: got == want,
        cycles: st.cycles,
        work: (t * e) as f64,
        unit: "logit",
        sim_cycles,
        sim_wall,
        json: serde_json::json!({"tokens": t, "experts": e, "top_k": k}),
    })
}

fn sim_gemm(
    dev: &mut dyn FpgaDevice,
    rng: &mut ChaCha8Rng,
    &[m, n, k]: &[usize; 3],
    limit: Duration,
) -> anyhow::Result<SimOutcome> {
    let d = golden::gemm::GemmDims { m, n, k };
    let p = golden::gemm::GemmProblem::random(rng, d, 20..=25);
    let want = p.golden(false)?;
    let ((got, st), sim_cycles, sim_wall) = timed(dev, |dv| {
        drive::run_gemm(dv, &p.x, &p.w, &p.bias, &p.rq, false, d, limit)
    })?;
    Ok(SimOutcome {
        label: format!("gemm M={m} N={n} K={k}"),
        bit_exact: got == want,
        cycles: st.cycles,
        work: (m * n * k) as f64,
        unit: "MAC",
        sim_cycles,
        sim_wall,
        json: serde_json::json!({"m": m, "n": n, "k": k}),
    })
}

fn sim_attention(
    dev: &mut dyn FpgaDevice,
    core: &dyn KernelCore,
    rng: &mut ChaCha8Rng,
    &[nq, nkv, d]: &[usize; 3],
    causal: bool,
    limit: Duration,
) -> anyhow::Result<SimOutcome> {
    use golden::attention::AttentionConfig;
    let kv_tile = core
        .params()
        .iter()
        .find(|(k, _)| k == "kv_tile")
        .and_then(|(_, v)| usize::try_from(*v).ok())
        .context("the attention build has no kv_tile")?;
    let mut g = |n: usize| -> Vec<i8> { (0..n).map(|_| rng.r#gen()).collect() };
    let (q, k, v) = (g(nq * d), g(nkv * d), g(nkv * d));
    let (score_mult, score_shift) = AttentionConfig::score_multiplier(0.25, 0.02, 0.02)?;
    let cfg = AttentionConfig {
        nq,
        nkv,
        d,
        kv_tile,
        causal,
        score_mult,
        score_shift,
    };
    let want = golden::attention::attention(&q, &k, &v, &cfg)?;
    let ((got, st), sim_cycles, sim_wall) = timed(dev, |dv| {
        drive::run_attention_head(dv, &q, &k, &v, &cfg, limit)
    })?;
    let pairs = (0..nq)
        .map(|i| (0..nkv).filter(|&j| cfg.visible(i, j)).count())
        .sum::<usize>();
    Ok(SimOutcome {
        label: format!("attention Nq={nq} Nkv={nkv} d={d} causal={causal}"),
        bit_exact: got == want,
        cycles: st.cycles,
        work: pairs as f64,
        unit: "pair",
        sim_cycles,
        sim_wall,
        json: serde_json::json!({"nq": nq, "nkv": nkv, "d": d, "causal": causal}),
    })
}
