//! `tandem bench`: the flags of one op's sizes and timing, handed to `tandem::bench` (the
//! harness: inputs, rotation, warm-up, medians, FLOP/byte floors, report), and its report
//! printed as text or JSON.

use clap::Args;
use tandem::DeviceRegistry;
use tandem::backend::{CudaDType, DeviceKind};
use tandem::bench::moe_block::{MoeBlockReport, MoeBlockShape};
use tandem::bench::{self, BenchOptions, BenchShape, Problem};
use tandem::ops::{Activation, OpKind};

use super::baselines::BaselineArgs;
use super::render::{self, Format, FormatArgs};

#[path = "bench_transfer.rs"]
mod transfer;

/// What `tandem bench` times: one op, or (`transfer`) host<->GPU copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchTarget {
    /// One op.
    Op(OpKind),
    /// Host<->GPU copy bandwidth: tandem's upload and download beside the raw pinned and
    /// pageable copies, in one run.
    Transfer,
    /// The whole MoE block (router logits -> routing -> experts -> combine) on a GPU, eager
    /// and as one replayed CUDA graph.
    MoeBlock,
}

impl clap::ValueEnum for BenchTarget {
    fn value_variants<'a>() -> &'a [Self] {
        static ALL: std::sync::OnceLock<Vec<BenchTarget>> = std::sync::OnceLock::new();
        ALL.get_or_init(|| {
            <OpKind as clap::ValueEnum>::value_variants()
                .iter()
                .copied()
                .map(BenchTarget::Op)
                .chain([BenchTarget::Transfer, BenchTarget::MoeBlock])
                .collect()
        })
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        match self {
            BenchTarget::Op(k) => clap::ValueEnum::to_possible_value(k),
            BenchTarget::Transfer => Some(
                clap::builder::PossibleValue::new("transfer")
                    .help("host<->GPU copies against the raw pinned ceiling"),
            ),
            BenchTarget::MoeBlock => Some(
                clap::builder::PossibleValue::new("moe-block")
                    .help("the MoE block (router, routing, experts) eager and as one CUDA graph"),
            ),
        }
    }
}

/// Options of `tandem bench`.
#[derive(Debug, Clone, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchArgs {
    /// Op to time, or `transfer` for host<->GPU copy bandwidth.
    #[arg(value_enum, required = true)]
    pub op: Option<BenchTarget>,
    /// A runtime bench instead of an op.
    #[command(subcommand)]
    pub runtime: Option<RuntimeBench>,
    /// Transfer: bytes per copy (default 256 MiB; K/M/G suffixes, powers of 1024).
    #[arg(long, value_parser = parse_size)]
    pub bytes: Option<usize>,
    /// Backend (default: cuda if present, else cpu). A backend that is not available here
    /// is an error, unless --fallback.
    #[arg(long, value_enum)]
    pub backend: Option<DeviceKind>,
    /// With --backend: time the op on the CPU (with a warning) where the backend is not
    /// available, instead of failing.
    #[arg(long, requires = "backend")]
    pub fallback: bool,
    /// Precision CUDA devices store tensors in (f32 accumulation either way); default:
    /// $TANDEM_CUDA_DTYPE, else bf16.
    #[arg(long, value_name = "DTYPE", value_parser = super::cuda_dtype_parser())]
    pub cuda_dtype: Option<CudaDType>,
    /// Attention: batch.
    #[arg(long, default_value_t = BenchShape::DEFAULT.batch)]
    pub batch: usize,
    /// Attention: query heads.
    #[arg(long, default_value_t = BenchShape::DEFAULT.heads)]
    pub heads: usize,
    /// Attention: key/value heads (default: --heads).
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// Attention: query length.
    #[arg(long, default_value_t = BenchShape::DEFAULT.seq_len)]
    pub seq_len: usize,
    /// Attention: key/value length (default: --seq-len).
    #[arg(long)]
    pub kv_len: Option<usize>,
    /// Attention: head dimension.
    #[arg(long, default_value_t = BenchShape::DEFAULT.head_dim)]
    pub head_dim: usize,
    /// Attention: bottom-right causal mask.
    #[arg(long)]
    pub causal: bool,
    /// Decode attention: tokens in each sequence's KV cache, the new ones included.
    #[arg(long, default_value_t = BenchShape::DEFAULT.context)]
    pub context: usize,
    /// Decode attention: new queries per sequence (1..=16).
    #[arg(long, default_value_t = BenchShape::DEFAULT.new_tokens)]
    pub new_tokens: usize,
    /// Decode attention: a paged KV cache with this many tokens per block (default: contiguous).
    #[arg(long)]
    pub block_size: Option<usize>,
    /// MoE: tokens (default 16384 for moe-route, 4096 for moe-experts and moe-block).
    #[arg(long)]
    pub tokens: Option<usize>,
    /// MoE: experts (default 64 for moe-route, 8 for moe-experts and moe-block).
    #[arg(long)]
    pub experts: Option<usize>,
    /// MoE: experts per token (default 8 for moe-route, 2 for moe-experts and moe-block).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// MoE experts: hidden size.
    #[arg(long, default_value_t = BenchShape::DEFAULT.hidden)]
    pub hidden: usize,
    /// MoE experts: FFN size of one expert.
    #[arg(long, default_value_t = BenchShape::DEFAULT.ffn)]
    pub ffn: usize,
    /// Linear: rows of x.
    #[arg(long, default_value_t = BenchShape::DEFAULT.m)]
    pub m: usize,
    /// Linear: output features.
    #[arg(long, default_value_t = BenchShape::DEFAULT.n)]
    pub n: usize,
    /// Linear: input features.
    #[arg(long, default_value_t = BenchShape::DEFAULT.k)]
    pub k: usize,
    /// Linear: activation (none, relu, gelu, silu).
    #[arg(long, default_value = "gelu")]
    pub act: Activation,
    /// Linear: no bias.
    #[arg(long)]
    pub no_bias: bool,
    /// RMSNorm: rows.
    #[arg(long, default_value_t = BenchShape::DEFAULT.rows)]
    pub rows: usize,
    /// RMSNorm: columns.
    #[arg(long, default_value_t = BenchShape::DEFAULT.cols)]
    pub cols: usize,
    /// Timed runs (default 50; 1 on fpga-sim, whose modelled time is the same every run).
    #[arg(long)]
    pub iters: Option<usize>,
    /// Untimed runs first (default 5; 0 on fpga-sim).
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Then untimed runs for at least this many milliseconds (default 0): a GPU at its power
    /// cap runs its first ~100 ms at boost clock, so 2000 times its steady state.
    #[arg(long, value_name = "MS")]
    pub warmup_ms: Option<u64>,
    /// Input sets rotated between runs (default: enough to exceed 256 MiB, at most 8).
    #[arg(long)]
    pub sets: Option<usize>,
    #[command(flatten)]
    pub format: FormatArgs,
    #[command(flatten)]
    pub baseline: BaselineArgs,
}

impl BenchArgs {
    /// The sizes the flags give.
    pub fn shape(&self) -> BenchShape {
        BenchShape {
            batch: self.batch,
            heads: self.heads,
            kv_heads: self.kv_heads,
            seq_len: self.seq_len,
            kv_len: self.kv_len,
            head_dim: self.head_dim,
            causal: self.causal,
            context: self.context,
            new_tokens: self.new_tokens,
            block_size: self.block_size,
            tokens: self.tokens,
            experts: self.experts,
            top_k: self.top_k,
            hidden: self.hidden,
            ffn: self.ffn,
            m: self.m,
            n: self.n,
            k: self.k,
            act: self.act,
            bias: !self.no_bias,
            rows: self.rows,
            cols: self.cols,
        }
    }

    /// The op, its input shapes and label.
    pub fn problem(&self) -> tandem::Result<Problem> {
        match self.op {
            Some(BenchTarget::Op(k)) => self.shape().problem(k),
            Some(BenchTarget::Transfer) => Err(tandem::Error::invalid(
                "bench",
                "transfer is not an op: it measures copies",
            )),
            Some(BenchTarget::MoeBlock) => Err(tandem::Error::invalid(
                "bench",
                "moe-block is not one op: it times three as a block",
            )),
            None => Err(tandem::Error::invalid("bench", "no op given")),
        }
    }

    /// The MoE block's sizes: --tokens, --hidden, --ffn, --experts, --top-k (T4096 H4096
    /// F14336 E8 k2 by default).
    pub fn moe_block_shape(&self) -> MoeBlockShape {
        let d = MoeBlockShape::DEFAULT;
        MoeBlockShape {
            tokens: self.tokens.unwrap_or(d.tokens),
            hidden: self.hidden,
            ffn: self.ffn,
            experts: self.experts.unwrap_or(d.experts),
            top_k: self.top_k.unwrap_or(d.top_k),
        }
    }

    /// How many runs, and how many input sets, on a device of `kind`: a simulated device is
    /// deterministic (its time is cycles / clock), so one run unless more are asked for.
    pub fn options(&self, kind: DeviceKind) -> BenchOptions {
        let simulated = kind == DeviceKind::FpgaSim;
        let d = BenchOptions::DEFAULT;
        BenchOptions {
            iters: self.iters.unwrap_or(if simulated { 1 } else { d.iters }),
            warmup: self.warmup.unwrap_or(if simulated { 0 } else { d.warmup }),
            warmup_time: std::time::Duration::from_millis(self.warmup_ms.unwrap_or(0)),
            sets: self.sets,
            ..BenchOptions::DEFAULT
        }
    }
}

/// Benches of the runtime itself rather than of one op.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum RuntimeBench {
    /// Per-op cost of the planner and executor: chains and fans of empty ops (on the CPU).
    Overhead(super::overhead::OverheadArgs),
}

/// Times one op and prints the result.
pub fn run(args: &BenchArgs, reg: &DeviceRegistry) -> anyhow::Result<()> {
    match &args.runtime {
        Some(RuntimeBench::Overhead(a)) => return super::overhead::run(a, reg),
        None => {}
    }
    if args.op == Some(BenchTarget::Transfer) {
        return transfer::run(reg, args.bytes, args.iters, args.format.get());
    }
    if args.op == Some(BenchTarget::MoeBlock) {
        return moe_block(args, reg);
    }
    let base = args.baseline.load()?;
    let mut kind = args.backend;
    if let Some(k) = kind {
        super::placement::require(reg, k, args.fallback)?;
        if reg.of_kind(k).is_empty() {
            kind = Some(DeviceKind::Cpu);
        }
    }
    let be = bench::pick_backend(reg, kind)?;
    let report = bench::run(be.as_ref(), &args.problem()?, &args.options(be.id().kind))?;
    let measured = super::baselines::bench_entries(&report);
    let verdicts = base
        .as_ref()
        .map(|b| super::baselines::verdicts(b, &measured));
    if let Some(name) = &args.baseline.save_baseline {
        let p = super::baselines::save(name, measured)?;
        eprintln!("tandem: saved baseline '{name}' to {}", p.display());
    }
    match args.format.get() {
        Format::Json => {
            let mut v = render::envelope("bench");
            v.insert("devices".into(), render::devices_json(reg));
            render::merge(&mut v, report.to_json());
            if let Some(vs) = &verdicts {
                v.insert(
                    "baseline".into(),
                    super::baselines::verdicts_json(&args.baseline, vs),
                );
            }
            render::print_json(&serde_json::Value::Object(v))?;
        }
        Format::Table => {
            print!("{report}");
            if let Some(vs) = &verdicts {
                print!("{}", super::baselines::verdict_lines(&args.baseline, vs));
            }
        }
        f => {
            print!("{}", render::bench_grid(&report).render(f)?);
            if let (Some(vs), Format::Markdown) = (&verdicts, f) {
                println!();
                print!(
                    "{}",
                    render::markdown_lines(&super::baselines::verdict_lines(&args.baseline, vs))
                );
            }
        }
    }
    Ok(())
}

/// `tandem bench moe-block`: the block on the first CUDA device (opened again with the
/// registry's options), eager and as a replayed graph, printed as text or JSON.
fn moe_block(args: &BenchArgs, reg: &DeviceRegistry) -> anyhow::Result<()> {
    if matches!(args.backend, Some(k) if k != DeviceKind::Cuda) {
        anyhow::bail!("bench moe-block runs on a CUDA device only (--backend cuda)");
    }
    let shape = args.moe_block_shape();
    shape.check()?;
    let report = measure_moe_block(args, reg, shape)?;
    print_moe_block(reg, &report, args.format.get())
}

#[cfg(feature = "cuda")]
fn measure_moe_block(
    args: &BenchArgs,
    reg: &DeviceRegistry,
    shape: MoeBlockShape,
) -> anyhow::Result<MoeBlockReport> {
    let Some(d) = reg.of_kind(DeviceKind::Cuda).into_iter().next() else {
        let why = reg
            .missing()
            .iter()
            .find(|m| m.kind == DeviceKind::Cuda)
            .map_or_else(|| "not found".to_string(), |m| m.reason.clone());
        anyhow::bail!("bench moe-block needs a CUDA device: {why}");
    };
    let be = tandem::backend::cuda::CudaBackend::open(d.id().index, reg.options().cuda.clone())?;
    let o = args.options(DeviceKind::Cuda);
    Ok(tandem::bench::moe_block::run(
        &be,
        shape,
        o.iters,
        (o.warmup, o.warmup_time),
        o.timeout,
    )?)
}

#[cfg(not(feature = "cuda"))]
fn measure_moe_block(
    _args: &BenchArgs,
    _reg: &DeviceRegistry,
    _shape: MoeBlockShape,
) -> anyhow::Result<MoeBlockReport> {
    anyhow::bail!(
        "bench moe-block needs a CUDA device: tandem was built without the `cuda` feature"
    )
}

fn print_moe_block(reg: &DeviceRegistry, r: &MoeBlockReport, format: Format) -> anyhow::Result<()> {
    match format {
        Format::Json => {
            let mut v = render::envelope("bench-moe-block");
            v.insert("devices".into(), render::devices_json(reg));
            render::merge(&mut v, r.to_json());
            render::print_json(&serde_json::Value::Object(v))?;
        }
        _ => print!("{r}"),
    }
    Ok(())
}

/// A byte count, optionally with a K, M, G or T suffix (powers of 1024).
fn parse_size(s: &str) -> Result<usize, String> {
    tandem::limits::parse_bytes(s)
        .filter(|&b| b > 0)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| format!("'{s}' is not a byte count (e.g. 256M, 1G, 4096)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct T {
        #[command(flatten)]
        b: BenchArgs,
    }

    #[test]
    fn flags_parse_into_the_problem() -> anyhow::Result<()> {
        let t = T::try_parse_from([
            "x",
            "attention",
            "--batch",
            "2",
            "--heads",
            "8",
            "--kv-heads",
            "2",
            "--seq-len",
            "100",
            "--kv-len",
            "300",
            "--head-dim",
            "64",
            "--causal",
        ])?;
        let p = t.b.problem()?;
        assert_eq!(p.op.name(), "attention");
        assert_eq!(p.inputs[0].shape.to_vec(), vec![2, 8, 100, 64]);
        assert_eq!(p.inputs[1].shape.to_vec(), vec![2, 2, 300, 64]);
        let t = T::try_parse_from([
            "x", "linear", "--m", "3", "--n", "5", "--k", "7", "--act", "silu",
        ])?;
        let p = t.b.problem()?;
        assert_eq!(p.op.name(), "linear");
        assert_eq!(p.inputs.len(), 3);
        let t = T::try_parse_from(["x", "linear", "--no-bias"])?;
        assert_eq!(t.b.problem()?.inputs.len(), 2);
        let t = T::try_parse_from([
            "x",
            "moe-route",
            "--tokens",
            "9",
            "--experts",
            "4",
            "--top-k",
            "2",
        ])?;
        assert_eq!(t.b.problem()?.inputs[0].shape.to_vec(), vec![9, 4]);
        let t = T::try_parse_from(["x", "moe_experts", "--tokens", "5", "--hidden", "16"])?;
        let p = t.b.problem()?;
        assert_eq!(p.op.name(), "moe_experts");
        assert_eq!(p.label, "T5 H16 F14336 E8 k2");
        let t = T::try_parse_from([
            "x",
            "attention-decode",
            "--batch",
            "64",
            "--kv-heads",
            "8",
            "--context",
            "8192",
            "--block-size",
            "16",
        ])?;
        let p = t.b.problem()?;
        assert_eq!(p.op.name(), "attention_decode");
        assert_eq!(p.inputs[0].shape.to_vec(), vec![64, 32, 1, 128]);
        assert_eq!(p.inputs[1].shape.to_vec(), vec![64 * 512, 8, 16, 128]);
        assert_eq!(p.label, "B64 Hq32 Hkv8 ctx8192 Nq1 D128 paged bs16");
        let t = T::try_parse_from(["x", "moe-route"])?;
        assert_eq!(t.b.shape(), BenchShape::DEFAULT);
        assert_eq!(t.b.options(DeviceKind::Cpu), BenchOptions::DEFAULT);
        let sim = t.b.options(DeviceKind::FpgaSim);
        assert_eq!((sim.iters, sim.warmup), (1, 0));
        let t = T::try_parse_from(["x", "rope", "--iters", "7"])?;
        assert_eq!(t.b.options(DeviceKind::FpgaSim).iters, 7);
        assert_eq!(t.b.backend, None);
        let t = T::try_parse_from(["x", "rope", "--warmup-ms", "2000"])?;
        let o = t.b.options(DeviceKind::Cuda);
        assert_eq!(o.warmup_time, std::time::Duration::from_secs(2));
        assert_eq!(o.warmup, BenchOptions::DEFAULT.warmup);
        Ok(())
    }

    #[test]
    fn bad_names_are_usage_errors_listing_the_accepted_ones() {
        for (args, listed) in [
            (
                vec!["x", "add"],
                "attention, attention-decode, moe-route, moe-experts, linear, rmsnorm, rope",
            ),
            (
                vec!["x", "rope", "--backend", "tpu"],
                "cpu, cuda, fpga-sim, fpga",
            ),
        ] {
            let e = T::try_parse_from(&args).expect_err("bad name");
            assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue);
            assert_eq!(e.exit_code(), 2);
            assert!(e.to_string().contains(listed), "{e}");
        }
        let t = T::try_parse_from(["x", "rope", "--backend", "sim"]).expect("alias");
        assert_eq!(t.b.backend, Some(DeviceKind::FpgaSim));
        let e = T::try_parse_from(["x", "add"]).expect_err("bad name");
        assert!(e.to_string().contains("rope, transfer"), "{e}");
    }

    #[test]
    fn transfer_parses_and_says_why_it_cannot_run_without_a_gpu() -> anyhow::Result<()> {
        let t = T::try_parse_from(["x", "transfer", "--bytes", "64M", "--iters", "3"])?;
        assert_eq!(t.b.op, Some(BenchTarget::Transfer));
        assert_eq!(t.b.bytes, Some(64 << 20));
        assert!(t.b.problem().is_err());
        let e = T::try_parse_from(["x", "transfer", "--bytes", "lots"]).expect_err("size");
        assert!(e.to_string().contains("'lots' is not a byte count"), "{e}");
        // No GPU or card in a CPU-only registry: an error naming why, not a panic.
        let e = run(&t.b, &DeviceRegistry::cpu_only()).expect_err("no device");
        assert!(e.to_string().contains("found no device to measure"), "{e}");
        Ok(())
    }

    #[test]
    fn moe_block_parses_its_sizes_and_says_why_it_cannot_run_without_a_gpu() -> anyhow::Result<()> {
        let t = T::try_parse_from(["x", "moe-block"])?;
        assert_eq!(t.b.op, Some(BenchTarget::MoeBlock));
        assert_eq!(t.b.moe_block_shape(), MoeBlockShape::DEFAULT);
        assert!(t.b.problem().is_err(), "not one op");
        let t = T::try_parse_from([
            "x",
            "moe-block",
            "--tokens",
            "64",
            "--hidden",
            "256",
            "--ffn",
            "512",
            "--experts",
            "4",
            "--top-k",
            "1",
            "--iters",
            "3",
            "--json",
        ])?;
        let s = t.b.moe_block_shape();
        assert_eq!(s.label(), "T64 H256 F512 E4 k1");
        assert_eq!(t.b.options(DeviceKind::Cuda).iters, 3);
        let e = run(&t.b, &DeviceRegistry::cpu_only()).expect_err("no GPU");
        assert!(e.to_string().contains("needs a CUDA device"), "{e}");
        let t = T::try_parse_from(["x", "moe-block", "--backend", "cpu"])?;
        let e = run(&t.b, &DeviceRegistry::cpu_only()).expect_err("cpu");
        assert!(e.to_string().contains("CUDA device only"), "{e}");
        let t = T::try_parse_from(["x", "moe-block", "--top-k", "9"])?;
        let e = run(&t.b, &DeviceRegistry::cpu_only()).expect_err("k > E");
        assert!(e.to_string().contains("top-k 9"), "{e}");
        Ok(())
    }

    #[test]
    fn bench_runs_on_the_cpu() -> anyhow::Result<()> {
        let reg = DeviceRegistry::cpu_only();
        let t = T::try_parse_from([
            "x",
            "rmsnorm",
            "--backend",
            "cpu",
            "--rows",
            "8",
            "--cols",
            "64",
            "--iters",
            "3",
            "--warmup",
            "1",
            "--json",
        ])?;
        run(&t.b, &reg)
    }
}
