//! `tandem op`: runs one op on named tensors from a safetensors file and saves its outputs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use tandem::backend::CudaDType;
use tandem::exec::ExecOptions;
use tandem::graph::Graph;
use tandem::ops::{
    Activation, AttentionParams, LinearParams, MoeExpertsParams, MoeRouteParams, Op, OpKind,
    RmsNormParams, RopeParams,
};
use tandem::plan::BackendChoice;
use tandem::run::{RunOptions, run_graph};
use tandem::{DType, DeviceRegistry, Tensor};

/// Options of `tandem op`.
#[derive(Debug, Args)]
pub struct OpArgs {
    /// The op (its inputs and outputs by name below).
    #[arg(value_enum)]
    pub op: OpKind,
    /// safetensors file with the op's inputs by name (see `tandem op --help`).
    #[arg(long)]
    pub inputs: PathBuf,
    /// Where to write the outputs (safetensors).
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Device: auto, cpu, cuda, fpga-sim, fpga.
    #[arg(long, default_value = "auto", value_parser = super::backend_choice_parser())]
    pub backend: BackendChoice,
    /// Precision CUDA devices store tensors in (f32 accumulation either way); default:
    /// $TANDEM_CUDA_DTYPE, else bf16.
    #[arg(long, value_name = "DTYPE", value_parser = super::cuda_dtype_parser())]
    pub cuda_dtype: Option<CudaDType>,
    /// attention: apply the bottom-right causal mask.
    #[arg(long)]
    pub causal: bool,
    /// attention: softmax scale (default 1/sqrt(D)).
    #[arg(long)]
    pub scale: Option<f32>,
    /// moe-route: experts per token.
    #[arg(long, default_value_t = 2)]
    pub top_k: usize,
    /// moe-route: renormalise the top-k weights to sum 1.
    #[arg(long)]
    pub renormalize: bool,
    /// moe-route: block size of the padded expert segments.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// linear: activation (none, relu, gelu, silu).
    #[arg(long, default_value = "none")]
    pub act: Activation,
    /// rmsnorm: epsilon.
    #[arg(long, default_value_t = 1e-5)]
    pub eps: f32,
    /// rope: theta.
    #[arg(long, default_value_t = 10000.0)]
    pub base: f64,
    /// rope: position of the first row.
    #[arg(long, default_value_t = 0)]
    pub position_offset: usize,
    #[command(flatten)]
    pub format: super::render::FormatArgs,
    /// Longest wait for the op, in seconds (any backend: CPU and simulated-card work stops
    /// at the deadline).
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// Run even when inputs hold NaN or infinities (rejected by default); the run still fails
    /// (exit 1) if any output is not finite.
    #[arg(long)]
    pub allow_nonfinite: bool,
    #[command(flatten)]
    pub placement: super::placement::PlacementArgs,
}

/// Runs one op.
pub fn run(args: &OpArgs, reg: &DeviceRegistry) -> anyhow::Result<()> {
    args.placement.check(reg, args.backend)?;
    if let Some(p) = &args.save {
        tandem::files::check_writable(p)?;
    }
    let mut tensors = tandem::io::read_safetensors(&args.inputs)?;
    let has = |n: &str| tensors.contains_key(n);
    let op = match args.op {
        OpKind::Attention => Op::Attention(AttentionParams {
            causal: args.causal,
            scale: args.scale,
        }),
        // paged when the file holds a block table; the block size is the caches' third dim
        OpKind::AttentionDecode => Op::AttentionDecode(tandem::ops::AttentionDecodeParams {
            scale: args.scale,
            block_size: match (has("block_table"), tensors.get("k_cache")) {
                (true, Some(k)) => k.shape().get(2).copied(),
                _ => None,
            },
        }),
        OpKind::MoeRoute => Op::MoeRoute(MoeRouteParams {
            top_k: args.top_k,
            renormalize: args.renormalize,
            block_size: args.block_size,
        }),
        OpKind::MoeExperts => Op::MoeExperts(MoeExpertsParams {}),
        OpKind::Linear => Op::Linear(LinearParams {
            act: args.act,
            bias: has("b"),
            f32_out: false,
        }),
        OpKind::RmsNorm => Op::RmsNorm(RmsNormParams {
            eps: args.eps,
            residual: has("residual"),
        }),
        OpKind::Rope => Op::Rope(RopeParams {
            base: args.base,
            position_offset: args.position_offset,
        }),
        OpKind::Add | OpKind::SplitHeads | OpKind::MergeHeads | OpKind::Nop | OpKind::Embedding => {
            bail!("{} is a graph op: tandem op does not run it alone", args.op)
        }
    };
    let mut g = Graph::default();
    let mut input_names = Vec::new();
    for &name in op.input_names() {
        let t = tensors.remove(name).with_context(|| {
            format!(
                "{}: no tensor named '{name}' ({} takes {}; the file has {})",
                args.inputs.display(),
                op.name(),
                op.input_names().join(", "),
                tensors.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })?;
        // Floating-point inputs are computed in f32; ids stay i32.
        let t = if t.dtype().is_float() {
            t.cast(DType::F32)
        } else {
            t
        };
        g.constant(name, t);
        input_names.push(name);
    }
    let outs = g.add(op.name(), op.clone(), &input_names);
    g.outputs = outs.clone();
    if let Err(e) = g.validate() {
        bail!("{}: {e}", args.inputs.display());
    }
    let policy = args.placement.policy();
    let opts = RunOptions {
        backend: args.backend,
        placement: policy,
        backend_label: args.backend.name().into(),
        exec: ExecOptions {
            timeout: Duration::from_secs(args.timeout),
            fallback: !policy.strict,
            fuse: false,
            ..ExecOptions::default()
        },
        check: true,
        history: Some(super::history(reg.options())),
        limits: reg.options().limits(),
        allow_nonfinite: args.allow_nonfinite,
        warmup: 1,
        workload: format!("{} on {}", op.name(), args.inputs.display()),
    };
    let out = run_graph(&g, reg, &opts)?;
    if let Some(path) = &args.save {
        let mut saved: BTreeMap<String, Tensor> = BTreeMap::new();
        for (short, full) in op.output_names().iter().zip(&outs) {
            saved.insert((*short).to_string(), out.exec.buffers[full].to_host(reg)?);
        }
        tandem::io::write_safetensors(path, &saved)?;
    }
    use super::render::{self, Format};
    match args.format.get() {
        Format::Json => {
            let mut v = render::envelope("op");
            v.insert(
                "workload".into(),
                render::workload_json(&opts.workload, None),
            );
            v.insert("devices".into(), render::devices_json(reg));
            render::merge(&mut v, serde_json::to_value(&out.report)?);
            render::print_json(&serde_json::Value::Object(v))?;
        }
        Format::Table => {
            print!("{}", render::run_tables(&out.report, Format::Table, true)?);
            if let Some(p) = &args.save {
                println!("saved: {}", p.display());
            }
        }
        f => print!("{}", render::run_tables(&out.report, f, true)?),
    }
    Ok(())
}
