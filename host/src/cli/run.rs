//! `tandem run`: the default Mixtral layer, or a TOML workload, on the devices found.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tandem::backend::CudaDType;
use tandem::exec::ExecOptions;
use tandem::ops::OpKind;
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
    /// and after the run the predicted against the measured time of every op (stderr). Each
    /// CUDA op is then timed alone: the stream is held while the op queues its work, so its
    /// time is device time, as calibration's is (a few microseconds more wall time an op).
    #[arg(long)]
    pub explain: bool,
    #[command(flatten)]
    pub exec: ExecArgs,
    /// Write the output (`output` [B, T, H], or [B, T, vocab] logits of a model with an LM
    /// head), a model's `input_ids` and each router's results (`layers.N.topk_ids`... in a
    /// model) here.
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
    /// A model folder as transformers saves it (config.json, and model.safetensors or shards
    /// listed by model.safetensors.index.json): its first --layers layers (default: all), with
    /// the embedding (token ids in) and the final norm + LM head (logits out) where present.
    /// Or one safetensors file of one layer's weights (and `input`, if present) with
    /// transformers' Mixtral names; the head count comes from the config.json beside it, else
    /// --heads is required (the weights cannot tell heads from head size).
    #[arg(long, value_name = "DIR|FILE")]
    pub weights: Option<PathBuf>,
    /// With --weights FILE: the layer to load from a file that holds several (the N of
    /// `model.layers.N.`); required for such files.
    #[arg(long, value_name = "N", requires = "weights")]
    pub layer: Option<usize>,
    /// Decoder layers, chained (layer i's output is layer i+1's input). Default: 1 for the
    /// built-in layer (or the workload file's `layers`), all of a model folder's.
    #[arg(long, value_name = "N")]
    pub layers: Option<usize>,
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
    /// Launches a GPU may have queued before the host waits for the oldest: a node's
    /// dependents on the same GPU are launched behind it without a round trip through the
    /// host. 0 waits for each node before launching its dependents (and keeps every node
    /// movable to the CPU should it fail while it runs).
    #[arg(long, value_name = "N", default_value_t = tandem::exec::QUEUE_AHEAD)]
    pub queue_ahead: usize,
    /// Run even when inputs or weights hold NaN or infinities (rejected by default); the run
    /// still fails (exit 1) if any output is not finite.
    #[arg(long)]
    pub allow_nonfinite: bool,
    /// Memory each device may hold, e.g. `cuda:0=8GiB,fpga-sim:0=2GiB,cpu=32G` (a kind alone,
    /// `cuda=8G`, for each of its devices; sizes in bytes or with K/M/G/T, powers of 1024);
    /// default: $TANDEM_MEMORY_LIMIT, else each device's capacity. Weights over a device's
    /// limit are evicted to the host and fetched again; nodes that do not fit go to another
    /// device (whole layers where names carry them).
    #[arg(long, value_name = "DEVICE=SIZE,...")]
    pub memory_limit: Option<String>,
}

impl ExecArgs {
    /// Applies `--memory-limit` to the devices of `reg` (over $TANDEM_MEMORY_LIMIT).
    pub fn apply_memory_limit(&self, reg: &DeviceRegistry) -> anyhow::Result<()> {
        if let Some(text) = &self.memory_limit {
            reg.set_memory_limits(tandem::options::MemoryLimits::parse(
                text,
                "--memory-limit",
            )?);
        }
        Ok(())
    }
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
    /// Sets the sizes given on the command line in `c`.
    pub fn apply(&self, c: &mut MixtralConfig) {
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
    let (mut c, mut name, toml_heads, toml_layers) = match &args.workload {
        Some(p) => {
            let w = WorkloadFile::load(p)?;
            let name = w.name.clone().unwrap_or_else(|| p.display().to_string());
            let heads = w.given.iter().any(|k| k == "heads");
            (w.mixtral, name, heads, w.layers)
        }
        None => (
            MixtralConfig::default(),
            "built-in Mixtral decoder layer".into(),
            false,
            None,
        ),
    };
    if args.layers == Some(0) {
        bail!("--layers 0 is not accepted: must be at least 1");
    }
    if let Some(dir) = args.weights.as_deref().filter(|p| p.is_dir()) {
        return super::model::build_from_folder(args, dir, c, args.layers.or(toml_layers), limits);
    }
    let layers = args.layers.or(toml_layers).unwrap_or(1);
    if layers > 1 {
        if args.weights.is_some() {
            bail!(
                "--layers {layers} with --weights FILE: a file gives one layer; pass a model \
                 folder (config.json + safetensors) for several"
            );
        }
        args.sizes.apply(&mut c);
        c.check()?;
        let g = workload::model_graph(&c, layers, None, None, limits)?;
        let label = format!(
            "{name}, {layers} layers: {} seed={} {}",
            layer_sizes(&c),
            c.seed,
            c.dtype
        );
        return Ok((g, c, label));
    }
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
    let label = format!("{name}: {}{seed} {}", layer_sizes(&c), c.dtype);
    Ok((g, c, label))
}

/// A layer's sizes for labels: `B=1 T=128 d_model=512 heads=8/2 head_dim=64 experts=8 top-2
/// ffn=1024`.
pub fn layer_sizes(c: &MixtralConfig) -> String {
    format!(
        "B={} T={} d_model={} heads={}/{} head_dim={} experts={} top-{} ffn={}",
        c.batch,
        c.seq_len,
        c.d_model,
        c.heads,
        c.kv_heads,
        c.head_dim(),
        c.experts,
        c.top_k,
        c.ffn,
    )
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
    args.exec.apply_memory_limit(reg)?;
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
            // fused units leave intermediates unwritten: only where no op is checked
            fuse: args.exec.no_check,
            queue_ahead: args.exec.queue_ahead,
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
        let fetch = |n: &str| -> anyhow::Result<Tensor> {
            match out.exec.buffers.get(n) {
                Some(b) => Ok(b.to_host(reg)?),
                None => bail!("the run kept no tensor '{n}' to save"),
            }
        };
        let Some(output) = graph.outputs.first() else {
            bail!("the workload has no output to save");
        };
        t.insert(
            "output".into(),
            workload::output_as_btd(&fetch(output)?, &config)?,
        );
        // A model's token ids, so the run can be repeated elsewhere (transformers).
        if let Some(ids) = graph.constants.get(workload::model::INPUT_IDS) {
            t.insert("input_ids".into(), ids.as_ref().clone());
        }
        // Every router's results: `topk_ids` etc. for one layer, `layers.N.topk_ids` in a model.
        for node in graph
            .nodes
            .iter()
            .filter(|n| n.op.kind() == OpKind::MoeRoute)
        {
            let prefix = node.name.strip_suffix("router").unwrap_or(&node.name);
            for what in [
                "topk_ids",
                "topk_weights",
                "expert_counts",
                "aux_loss",
                "z_loss",
            ] {
                t.insert(
                    format!("{prefix}{what}"),
                    fetch(&format!("{}.{what}", node.name))?,
                );
            }
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
