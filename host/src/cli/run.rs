//! `tandem run`: the default Mixtral layer, or a TOML workload, on the devices found.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tandem::backend::CudaDType;
use tandem::exec::ExecOptions;
use tandem::plan::{self, BackendChoice};
use tandem::run::{RunOptions, run_graph};
use tandem::workload::{self, HfConfig, MixtralConfig, WorkloadFile};

use anyhow::bail;
use tandem::{DType, DeviceRegistry, Tensor};

use super::render::{self, Format, FormatArgs};

/// Options of `tandem run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub input: WorkloadArgs,
    /// Devices to use: auto (the planner chooses per op), cpu, cuda, fpga-sim, fpga.
    #[arg(long, default_value = "auto", value_parser = super::backend_choice_parser())]
    pub backend: BackendChoice,
    #[command(flatten)]
    pub format: FormatArgs,
    /// Print where each op goes and why (per device its op-time estimate) before running,
    /// and after the run the predicted against the measured time of every op (stderr).
    #[arg(long)]
    pub explain: bool,
    #[command(flatten)]
    pub exec: ExecArgs,
    /// Write the layer output (`output` [B, T, H]) and the router's results here.
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Write a Chrome/Perfetto trace of the run (one track per device, and one of the
    /// modelled or device-reported time per device that reports it) here.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    #[command(flatten)]
    pub placement: super::placement::PlacementArgs,
}

/// Options of `tandem plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub input: WorkloadArgs,
    /// Devices to use: auto (the planner chooses per op), cpu, cuda, fpga-sim, fpga.
    #[arg(long, default_value = "auto", value_parser = super::backend_choice_parser())]
    pub backend: BackendChoice,
    #[command(flatten)]
    pub format: FormatArgs,
    #[command(flatten)]
    pub placement: super::placement::PlacementArgs,
}

/// The workload: a file or the built-in layer, its weights and sizes, and the devices'
/// storage precision (`run`, `plan`, `compare`).
#[derive(Debug, Args)]
pub struct WorkloadArgs {
    /// A TOML workload file; without one, the built-in Mixtral decoder layer.
    pub workload: Option<PathBuf>,
    /// The layer's weights (and `input`, if present) from a safetensors file with transformers'
    /// Mixtral names. The head count comes from the config.json beside it, else --heads is
    /// required (the weights cannot tell heads from head size).
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// With --weights: the layer to load from a file that holds several (the N of
    /// `model.layers.N.`); required for such files.
    #[arg(long, value_name = "N", requires = "weights")]
    pub layer: Option<usize>,
    /// Precision CUDA devices store tensors in (f32 accumulation either way); default:
    /// $TANDEM_CUDA_DTYPE, else bf16.
    #[arg(long, value_name = "DTYPE", value_parser = super::cuda_dtype_parser())]
    pub cuda_dtype: Option<CudaDType>,
    #[command(flatten)]
    pub sizes: SizeArgs,
    #[command(flatten)]
    pub decode: super::decode::DecodeArgs,
}

/// How a workload is executed and checked (`run`, `compare`).
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Skip the comparison with the f64 reference.
    #[arg(long)]
    pub no_check: bool,
    /// Untimed runs of the workload before the measured one (keeps kernel compilation and
    /// other first-use costs out of the figures).
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Longest wait for one op, in seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// Run even when inputs or weights hold NaN or infinities (rejected by default); the run
    /// still fails (exit 1) if any output is not finite.
    #[arg(long)]
    pub allow_nonfinite: bool,
}

/// Size overrides of the Mixtral layer.
#[derive(Debug, Args, Default)]
pub struct SizeArgs {
    /// Sequences in the batch.
    #[arg(long)]
    pub batch: Option<usize>,
    /// Tokens per sequence.
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Hidden size.
    #[arg(long)]
    pub d_model: Option<usize>,
    /// Query heads.
    #[arg(long)]
    pub heads: Option<usize>,
    /// Key/value heads.
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// Experts.
    #[arg(long)]
    pub experts: Option<usize>,
    /// Experts per token.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// FFN size of one expert.
    #[arg(long)]
    pub ffn: Option<usize>,
    /// Seed of the generated weights and input.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Precision inputs and weights are rounded to: f32, bf16, f16.
    #[arg(long, ignore_case = true, value_parser = super::float_dtype_parser())]
    pub dtype: Option<DType>,
}

impl SizeArgs {
    pub(super) fn apply(&self, c: &mut MixtralConfig) {
        let set = |dst: &mut usize, v: Option<usize>| {
            if let Some(v) = v {
                *dst = v;
            }
        };
        set(&mut c.batch, self.batch);
        set(&mut c.seq_len, self.seq_len);
        set(&mut c.d_model, self.d_model);
        set(&mut c.heads, self.heads);
        set(&mut c.kv_heads, self.kv_heads);
        set(&mut c.experts, self.experts);
        set(&mut c.top_k, self.top_k);
        set(&mut c.ffn, self.ffn);
        if let Some(s) = self.seed {
            c.seed = s;
        }
        if let Some(d) = self.dtype {
            c.dtype = d;
        }
    }
}

/// Builds the graph `args` describe, with its config.
pub fn build(
    args: &WorkloadArgs,
    limits: &tandem::limits::Limits,
) -> anyhow::Result<(tandem::graph::Graph, MixtralConfig, String)> {
    if let Some(t) = args.decode.decode {
        return super::decode::build(args, t, limits);
    }
    let (mut c, mut name, toml_heads) = match &args.workload {
        Some(p) => {
            let w = WorkloadFile::load(p)?;
            let name = w.name.clone().unwrap_or_else(|| p.display().to_string());
            let heads = w.given.iter().any(|k| k == "heads");
            (w.mixtral, name, heads)
        }
        None => (
            MixtralConfig::default(),
            "built-in Mixtral decoder layer".into(),
            false,
        ),
    };
    let (weights, input) = match &args.weights {
        Some(p) => {
            // config.json beside the weights first, then the flags over it.
            let hf = HfConfig::beside(p)?;
            let hf_heads = hf.as_ref().and_then(|h| h.heads).is_some();
            if let Some(hf) = &hf {
                hf.apply(&mut c);
            }
            if !hf_heads && !toml_heads {
                // Unknown unless --heads gives it: the loader then refuses, naming the flag.
                c.heads = 0;
            }
            args.sizes.apply(&mut c);
            let l = workload::load_layer_at(p, &c, args.layer)?;
            if let Some(kv) = args.sizes.kv_heads
                && kv != l.config.kv_heads
            {
                bail!(
                    "{}: --kv-heads {kv} does not match the weights: k_proj gives {} key/value heads                      with --heads {} (head size {})",
                    p.display(),
                    l.config.kv_heads,
                    l.config.heads,
                    l.config.head_dim()
                );
            }
            c = l.config;
            let input = l.input.map(|(t, b, s)| {
                c.batch = b;
                c.seq_len = s;
                t
            });
            name = match &args.workload {
                Some(_) => format!("{name}, weights {} ({}*)", p.display(), l.prefix),
                None => format!(
                    "Mixtral decoder layer, weights {} ({}*)",
                    p.display(),
                    l.prefix
                ),
            };
            (Some(l.weights), input)
        }
        None => {
            args.sizes.apply(&mut c);
            (None, None)
        }
    };
    c.check()?;
    // Loaded weights have no seed: it only makes the input, where the file has none.
    let seed = if args.weights.is_none() || input.is_none() {
        format!(" seed={}", c.seed)
    } else {
        String::new()
    };
    let g = workload::mixtral_layer_within(&c, weights, input, limits)?;
    let label = format!(
        "{name}: B={} T={} d_model={} heads={}/{} head_dim={} experts={} top-{} ffn={}{seed} {}",
        c.batch,
        c.seq_len,
        c.d_model,
        c.heads,
        c.kv_heads,
        c.head_dim(),
        c.experts,
        c.top_k,
        c.ffn,
        c.dtype
    );
    Ok((g, c, label))
}

/// Runs the workload.
pub fn run(args: &RunArgs, reg: &DeviceRegistry) -> anyhow::Result<()> {
    for p in args.save.iter().chain(&args.trace) {
        tandem::files::check_writable(p)?;
    }
    if args.input.decode.decode.is_some() && args.save.is_some() {
        bail!(
            "--save writes the Mixtral layer's output and router results; a --decode step has no router"
        );
    }
    let backend = args.backend;
    args.placement.check(reg, backend)?;
    let policy = args.placement.policy();
    let format = args.format.get();
    let (graph, config, label) = build(&args.input, &reg.options().limits())?;
    let history = super::history(reg.options());
    if format == Format::Table {
        // The header before the long work.
        render::print_run_header(&label, backend.name(), reg)?;
    }
    if args.explain {
        let h = history.lock().unwrap_or_else(|e| e.into_inner());
        let p = plan::plan_with(&graph, reg, backend, Some(&h), &policy)?;
        eprint!("{}", plan::explain(&graph, &p));
    }
    let opts = RunOptions {
        backend,
        placement: policy,
        backend_label: backend.name().into(),
        exec: ExecOptions {
            timeout: Duration::from_secs(args.exec.timeout),
            // --strict: a node that fails on the requested device fails the run.
            fallback: !policy.strict,
        },
        check: !args.exec.no_check,
        workload: label.clone(),
        history: Some(history),
        limits: reg.options().limits(),
        allow_nonfinite: args.exec.allow_nonfinite,
        warmup: args.exec.warmup,
    };
    let out = run_graph(&graph, reg, &opts)?;
    if args.explain {
        eprint!(
            "{}",
            plan::explain_measured(&graph, &out.plan, &out.exec.runs)
        );
    }
    if let Some(path) = &args.save {
        let mut t: BTreeMap<String, Tensor> = BTreeMap::new();
        let fetch = |n: &str| -> anyhow::Result<Tensor> { Ok(out.exec.buffers[n].to_host(reg)?) };
        t.insert(
            "output".into(),
            workload::output_as_btd(&fetch(workload::OUTPUT)?, &config)?,
        );
        for (file_name, graph_name) in [
            ("topk_ids", "router.topk_ids"),
            ("topk_weights", "router.topk_weights"),
            ("expert_counts", "router.expert_counts"),
            ("aux_loss", "router.aux_loss"),
            ("z_loss", "router.z_loss"),
        ] {
            t.insert(file_name.into(), fetch(graph_name)?);
        }
        tandem::io::write_safetensors(path, &t)?;
    }
    if let Some(path) = &args.trace {
        let text = serde_json::to_string(&tandem::report::chrome_trace(&out.report))?;
        tandem::files::write_atomic(path, text.as_bytes())?;
    }
    match format {
        Format::Json => {
            let mut v = render::envelope("run");
            v.insert(
                "workload".into(),
                render::workload_json(&label, Some(&config)),
            );
            v.insert("devices".into(), render::devices_json(reg));
            render::merge(&mut v, serde_json::to_value(&out.report)?);
            render::print_json(&serde_json::Value::Object(v))?;
        }
        Format::Table => {
            print!("{}", render::run_tables(&out.report, Format::Table, false)?);
            if let Some(p) = &args.trace {
                println!("trace: {}", p.display());
            }
            if let Some(p) = &args.save {
                println!("saved: {}", p.display());
            }
        }
        f => print!("{}", render::run_tables(&out.report, f, true)?),
    }
    Ok(())
}

/// `tandem plan`: where each op of the workload would run, and why.
pub fn plan_only(args: &PlanArgs, reg: &DeviceRegistry) -> anyhow::Result<()> {
    let backend = args.backend;
    args.placement.check(reg, backend)?;
    let (graph, config, label) = build(&args.input, &reg.options().limits())?;
    let h = super::history(reg.options());
    let h = h.lock().unwrap_or_else(|e| e.into_inner());
    let p = plan::plan_with(&graph, reg, backend, Some(&h), &args.placement.policy())?;
    match args.format.get() {
        Format::Json => {
            let mut v = render::envelope("plan");
            v.insert(
                "workload".into(),
                render::workload_json(&label, Some(&config)),
            );
            v.insert("devices".into(), render::devices_json(reg));
            v.insert("backend".into(), backend.name().into());
            v.insert("placement".into(), p.summary(backend).into());
            render::merge(&mut v, render::plan_json(&graph, &p)?);
            render::print_json(&serde_json::Value::Object(v))?;
        }
        Format::Table => {
            println!("workload: {label}");
            println!("placement: {}", p.summary(backend));
            print!("{}", plan::explain(&graph, &p));
        }
        f => print!("{}", render::plan_tables(&label, &graph, &p, f)?),
    }
    Ok(())
}
