//! `tandem bench`: times one op on one backend, through the `Backend` trait only, so every
//! backend (cpu, cuda, fpga-sim) is measured the same way.
//!
//! Inputs are made once (seeded random, never zeros) and uploaded once; several input sets are
//! rotated so that caches do not flatter the figure; warm-up launches come first (compilation,
//! plans); each timed launch is measured by the device (`LaunchInfo::device_time`, CUDA
//! events) where the backend gives it, else by the wall clock around launch and completion.
//! The median of the timed runs gives time, TFLOP/s and GB/s from `Op::cost` (bytes counted at
//! the device's storage precision: bf16 or f16 on a GPU, `--cuda-dtype`), and cycles where the
//! device counts them.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use serde_json::json;
use tandem::backend::{Backend, CudaDType, DeviceKind, DeviceStorage};
use tandem::ops::{
    Activation, AttentionParams, LinearParams, MoeExpertsParams, MoeRouteParams, RmsNormParams,
    RopeParams,
};
use tandem::{DType, DeviceRegistry, Op, Tensor, TensorMeta};

/// The ops `tandem bench` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchOp {
    /// Attention forward (q, k, v -> o, lse).
    Attention,
    /// MoE routing: top-k softmax and the align/permute.
    MoeRoute,
    /// MoE experts: SwiGLU FFN of each token's top-k experts, weighted sum (routing made on the
    /// host beforehand, block size 16).
    MoeExperts,
    /// Fused linear: act(x W^T + b).
    Linear,
    /// RMSNorm.
    Rmsnorm,
    /// Rotary embedding.
    Rope,
}

/// Options of `tandem bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Op to time.
    #[arg(value_enum)]
    pub op: BenchOp,
    /// Backend: cpu, cuda or fpga-sim (default: cuda if present, else cpu).
    #[arg(long)]
    pub backend: Option<String>,
    /// Precision CUDA devices store tensors in (f32 accumulation either way); default:
    /// $TANDEM_CUDA_DTYPE, else bf16.
    #[arg(long, value_name = "DTYPE", value_parser = super::cuda_dtype_parser())]
    pub cuda_dtype: Option<CudaDType>,
    /// Attention: batch.
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// Attention: query heads.
    #[arg(long, default_value_t = 32)]
    pub heads: usize,
    /// Attention: key/value heads (default: --heads).
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// Attention: query length.
    #[arg(long, default_value_t = 4096)]
    pub seq_len: usize,
    /// Attention: key/value length (default: --seq-len).
    #[arg(long)]
    pub kv_len: Option<usize>,
    /// Attention: head dimension.
    #[arg(long, default_value_t = 128)]
    pub head_dim: usize,
    /// Attention: bottom-right causal mask.
    #[arg(long)]
    pub causal: bool,
    /// MoE: tokens (default 16384 for moe-route, 4096 for moe-experts).
    #[arg(long)]
    pub tokens: Option<usize>,
    /// MoE: experts (default 64 for moe-route, 8 for moe-experts).
    #[arg(long)]
    pub experts: Option<usize>,
    /// MoE: experts per token (default 8 for moe-route, 2 for moe-experts).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// MoE experts: hidden size.
    #[arg(long, default_value_t = 4096)]
    pub hidden: usize,
    /// MoE experts: FFN size of one expert.
    #[arg(long, default_value_t = 14336)]
    pub ffn: usize,
    /// Linear: rows of x.
    #[arg(long, default_value_t = 8192)]
    pub m: usize,
    /// Linear: output features.
    #[arg(long, default_value_t = 8192)]
    pub n: usize,
    /// Linear: input features.
    #[arg(long, default_value_t = 8192)]
    pub k: usize,
    /// Linear: activation (none, relu, gelu, silu).
    #[arg(long, default_value = "gelu")]
    pub act: Activation,
    /// Linear: no bias.
    #[arg(long)]
    pub no_bias: bool,
    /// RMSNorm: rows.
    #[arg(long, default_value_t = 16384)]
    pub rows: usize,
    /// RMSNorm: columns.
    #[arg(long, default_value_t = 8192)]
    pub cols: usize,
    /// Timed runs.
    #[arg(long, default_value_t = 50)]
    pub iters: usize,
    /// Untimed runs first.
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Input sets rotated between runs (default: enough to exceed 256 MiB, at most 8).
    #[arg(long)]
    pub sets: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Routing block size of the MoE benches (the workload's and vLLM's default).
const MOE_BLOCK: usize = 16;

impl BenchArgs {
    /// (tokens, experts, top-k) with the op's defaults.
    fn moe(&self) -> (usize, usize, usize) {
        let (t, e, k) = match self.op {
            BenchOp::MoeExperts => (4096, 8, 2),
            _ => (16384, 64, 8),
        };
        (
            self.tokens.unwrap_or(t),
            self.experts.unwrap_or(e),
            self.top_k.unwrap_or(k),
        )
    }

    fn route_params(&self) -> MoeRouteParams {
        MoeRouteParams {
            top_k: self.moe().2,
            renormalize: true,
            block_size: MOE_BLOCK,
        }
    }

    /// The op and its input metas.
    pub fn problem(&self) -> (Op, Vec<TensorMeta>) {
        let f = |s: Vec<usize>| TensorMeta::new(s, DType::F32);
        match self.op {
            BenchOp::Attention => {
                let hkv = self.kv_heads.unwrap_or(self.heads);
                let nkv = self.kv_len.unwrap_or(self.seq_len);
                let (b, d) = (self.batch, self.head_dim);
                (
                    Op::Attention(AttentionParams {
                        causal: self.causal,
                        scale: None,
                    }),
                    vec![
                        f(vec![b, self.heads, self.seq_len, d]),
                        f(vec![b, hkv, nkv, d]),
                        f(vec![b, hkv, nkv, d]),
                    ],
                )
            }
            BenchOp::MoeRoute => {
                let (t, e, _) = self.moe();
                (Op::MoeRoute(self.route_params()), vec![f(vec![t, e])])
            }
            BenchOp::MoeExperts => {
                let (t, e, k) = self.moe();
                let (h, ffn) = (self.hidden, self.ffn);
                let i = |s: Vec<usize>| TensorMeta::new(s, DType::I32);
                (
                    Op::MoeExperts(MoeExpertsParams {}),
                    vec![
                        f(vec![t, h]),
                        i(vec![t, k]),
                        f(vec![t, k]),
                        i(vec![self.route_params().padded_len(t, e)]),
                        i(vec![e + 1]),
                        f(vec![e, 2 * ffn, h]),
                        f(vec![e, h, ffn]),
                    ],
                )
            }
            BenchOp::Linear => {
                let mut v = vec![f(vec![self.m, self.k]), f(vec![self.n, self.k])];
                if !self.no_bias {
                    v.push(f(vec![self.n]));
                }
                (
                    Op::Linear(LinearParams {
                        act: self.act,
                        bias: !self.no_bias,
                    }),
                    v,
                )
            }
            BenchOp::Rmsnorm => (
                Op::RmsNorm(RmsNormParams {
                    eps: 1e-5,
                    residual: false,
                }),
                vec![f(vec![self.rows, self.cols]), f(vec![self.cols])],
            ),
            BenchOp::Rope => (
                Op::Rope(RopeParams::default()),
                vec![f(vec![self.batch, self.heads, self.seq_len, self.head_dim])],
            ),
        }
    }

    /// A short description of the shape.
    pub fn shape_label(&self) -> String {
        match self.op {
            BenchOp::Attention => format!(
                "B{} Hq{} Hkv{} Nq{} Nkv{} D{}{}",
                self.batch,
                self.heads,
                self.kv_heads.unwrap_or(self.heads),
                self.seq_len,
                self.kv_len.unwrap_or(self.seq_len),
                self.head_dim,
                if self.causal { " causal" } else { "" }
            ),
            BenchOp::MoeRoute => {
                let (t, e, k) = self.moe();
                format!("T{t} E{e} k{k}")
            }
            BenchOp::MoeExperts => {
                let (t, e, k) = self.moe();
                format!("T{t} H{} F{} E{e} k{k}", self.hidden, self.ffn)
            }
            BenchOp::Linear => format!(
                "M{} N{} K{} {:?}{}",
                self.m,
                self.n,
                self.k,
                self.act,
                if self.no_bias { "" } else { "+bias" }
            ),
            BenchOp::Rmsnorm => format!("{}x{}", self.rows, self.cols),
            BenchOp::Rope => format!(
                "B{} H{} T{} D{}",
                self.batch, self.heads, self.seq_len, self.head_dim
            ),
        }
    }
}

/// The backend named on the command line, or cuda if present, else the CPU.
fn pick(name: Option<&str>, reg: &DeviceRegistry) -> anyhow::Result<std::sync::Arc<dyn Backend>> {
    let kind = match name {
        None => {
            return Ok(reg
                .of_kind(DeviceKind::Cuda)
                .into_iter()
                .next()
                .unwrap_or_else(|| reg.cpu()));
        }
        Some("cpu") => return Ok(reg.cpu()),
        Some("cuda") => DeviceKind::Cuda,
        Some("fpga-sim") => DeviceKind::FpgaSim,
        Some("fpga") => DeviceKind::FpgaXrt,
        Some(other) => bail!("unknown backend '{other}' (accepted: cpu, cuda, fpga-sim, fpga)"),
    };
    if let Some(b) = reg.of_kind(kind).into_iter().next() {
        return Ok(b);
    }
    let why = reg
        .missing()
        .iter()
        .find(|m| m.kind == kind)
        .map(|m| m.reason.clone())
        .unwrap_or_else(|| "not found".into());
    bail!("backend {} is not available: {why}", kind.name())
}

/// A random f32 tensor uniform in [-scale, scale), made in parallel chunks so large problems
/// are quick to set up.
fn random(shape: &[usize], scale: f32, seed: u64) -> anyhow::Result<Tensor> {
    let n: usize = shape.iter().product();
    let mut v = vec![0f32; n];
    v.par_chunks_mut(1 << 16).enumerate().for_each(|(c, ch)| {
        let mut r = ChaCha8Rng::seed_from_u64(seed ^ c as u64);
        for x in ch {
            *x = r.gen_range(-1.0f32..1.0) * scale;
        }
    });
    Tensor::from_vec_f32(shape, v).context("making inputs")
}

/// Random inputs for one set: floats uniform in [-1, 1) (scaled for matrix operands, 1/sqrt of
/// the reduced size). The experts' routing inputs come from routing random logits on the host.
fn make_inputs(op: &Op, metas: &[TensorMeta], seed: u64) -> anyhow::Result<Vec<Tensor>> {
    let seed_of = |i: usize| seed ^ ((i as u64) << 40);
    if let Op::MoeExperts(_) = op {
        let (t, k) = (metas[1].shape[0], metas[1].shape[1]);
        let e = metas[5].shape[0];
        let route = MoeRouteParams {
            top_k: k,
            renormalize: true,
            block_size: MOE_BLOCK,
        };
        let logits = random(&[t, e], 3.0, seed_of(9))?;
        let r = Op::MoeRoute(route)
            .run_cpu(&[&logits])
            .context("routing the bench tokens")?;
        let (h, f) = (metas[0].shape[1], metas[6].shape[2]);
        return Ok(vec![
            random(&metas[0].shape, 1.0, seed_of(0))?,
            r[0].clone(),
            r[1].clone(),
            r[3].clone(),
            r[4].clone(),
            random(&metas[5].shape, 1.0 / (h as f32).sqrt(), seed_of(5))?,
            random(&metas[6].shape, 1.0 / (f as f32).sqrt(), seed_of(6))?,
        ]);
    }
    metas
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let scale = match (op, i) {
                (Op::Linear(_), 1) => 1.0 / (m.shape[1] as f32).sqrt(),
                (Op::MoeRoute(_), _) => 3.0,
                _ => 1.0,
            };
            random(&m.shape, scale, seed_of(i))
        })
        .collect()
}

/// Bytes the figure of merit counts: the expert weights for moe-experts (what a decode step
/// must stream), else every input and output once at the device's storage precision.
fn counted_bytes(op: &Op, metas: &[TensorMeta], storage: DType) -> (f64, &'static str) {
    match op {
        Op::MoeExperts(_) => {
            let size = if storage.size() < 4 {
                storage.size()
            } else {
                4
            };
            let w = metas[5].numel() + metas[6].numel();
            ((w * size) as f64, "expert weights")
        }
        _ => (device_bytes(op, metas, storage), "inputs and outputs"),
    }
}

/// Bytes an op moves at the device's storage precision (floats as bf16 on a bf16 device).
fn device_bytes(op: &Op, metas: &[TensorMeta], storage: DType) -> f64 {
    let outs = op.validate(metas).unwrap_or_default();
    metas
        .iter()
        .chain(outs.iter())
        .map(|m| {
            let size = if m.dtype == DType::F32 && storage.size() < 4 {
                storage.size()
            } else {
                m.dtype.size()
            };
            (m.numel() * size) as f64
        })
        .sum()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// Times one op and prints the result.
pub fn run(args: &BenchArgs, reg: &DeviceRegistry) -> anyhow::Result<()> {
    let be = pick(args.backend.as_deref(), reg)?;
    let (op, metas) = args.problem();
    op.validate(&metas).context("bench shape")?;
    if let tandem::backend::Support::No(why) = be.supports(&op, &metas) {
        bail!("{} does not run {}: {why}", be.id(), op.name());
    }
    let info = be.info();
    let cost = op.cost(&metas);
    let storage = if info.compute_dtype == DType::F32 || info.compute_dtype == DType::I8 {
        DType::F32
    } else {
        info.compute_dtype
    };
    let (bytes, bytes_what) = counted_bytes(&op, &metas, storage);
    let in_bytes: f64 = metas
        .iter()
        .map(|m| (m.numel() * storage.size().min(m.dtype.size())) as f64)
        .sum();
    let sets = args
        .sets
        .unwrap_or_else(|| ((256.0 * 1048576.0 / in_bytes.max(1.0)).ceil() as usize).clamp(1, 8))
        .max(1);
    let mut inputs: Vec<Vec<DeviceStorage>> = Vec::with_capacity(sets);
    for s in 0..sets {
        let host = make_inputs(&op, &metas, 0x7a6d_0000 + s as u64)?;
        let dev = host
            .iter()
            .map(|t| be.upload(t))
            .collect::<Result<Vec<_>, _>>()
            .context("uploading inputs")?;
        inputs.push(dev);
    }
    let timeout = Duration::from_secs(600);
    let what = format!("bench {}", op.name());
    let launch = |i: usize| -> anyhow::Result<tandem::backend::Launch> {
        let set: Vec<&DeviceStorage> = inputs[i % sets].iter().collect();
        Ok(be.launch(&op, &set)?)
    };
    for i in 0..args.warmup {
        let l = launch(i)?;
        l.done.wait(timeout, &what)?;
    }
    // Device-timed backends: keep launches queued back to back (outputs freed at once; the
    // stream orders their reuse). Others: one at a time, wall clock around each.
    let probe = launch(0)?;
    let t0 = Instant::now();
    probe.done.wait(timeout, &what)?;
    let device_timed = probe
        .info
        .lock()
        .map(|i| i.device_time.is_some())
        .unwrap_or(false);
    let kernel = probe
        .info
        .lock()
        .map(|i| i.kernel.clone())
        .unwrap_or_default();
    let _ = t0;
    let mut times = Vec::with_capacity(args.iters);
    let mut cycles = Vec::new();
    let host_t0 = Instant::now();
    if device_timed {
        let mut pending = Vec::with_capacity(args.iters);
        for i in 0..args.iters {
            let mut l = launch(i + 1)?;
            l.outputs.clear();
            pending.push(l);
        }
        for l in pending {
            l.done.wait(timeout, &what)?;
            let inf = l
                .info
                .lock()
                .map_err(|_| anyhow::anyhow!("launch info poisoned"))?;
            if let Some(t) = inf.device_time {
                times.push(t.as_secs_f64());
            }
            if let Some(c) = inf.cycles {
                cycles.push(c as f64);
            }
        }
    } else {
        for i in 0..args.iters {
            let t = Instant::now();
            let l = launch(i + 1)?;
            l.done.wait(timeout, &what)?;
            times.push(t.elapsed().as_secs_f64());
            if let Some(c) = l.info.lock().ok().and_then(|i| i.cycles) {
                cycles.push(c as f64);
            }
        }
    }
    be.synchronize()?;
    // Host time per launch: for a simulated device, what the simulator itself costs.
    let host_per_launch = host_t0.elapsed().as_secs_f64() / args.iters.max(1) as f64;
    let runs = times.len();
    let mut sorted = times.clone();
    let med = median(&mut sorted);
    let (min, max) = (
        sorted.first().copied().unwrap_or(f64::NAN),
        sorted.last().copied().unwrap_or(f64::NAN),
    );
    let tflops = cost.flops / med / 1e12;
    let gbs = bytes / med / 1e9;
    let cyc = if cycles.is_empty() {
        None
    } else {
        Some(median(&mut cycles))
    };
    if args.json {
        let v = json!({
            "op": op.name(),
            "shape": args.shape_label(),
            "backend": be.id().to_string(),
            "device": info.name,
            "kernel": kernel,
            "storage": storage.name(),
            "timing": if device_timed { "device events" } else { "wall clock" },
            "runs": runs,
            "sets": sets,
            "median_s": med,
            "min_s": min,
            "max_s": max,
            "flops": cost.flops,
            "bytes": bytes,
            "bytes_counted": bytes_what,
            "tflops": tflops,
            "gbps": gbs,
            "cycles": cyc,
            "host_s_per_launch": host_per_launch,
            "sim_cycles_per_s": cyc.map(|c| c / host_per_launch),
        });
        println!("{v}");
    } else {
        println!(
            "{} {} on {} ({}) kernel {}",
            op.name(),
            args.shape_label(),
            be.id(),
            info.name,
            kernel
        );
        println!(
            "  median {:.3} ms (min {:.3}, max {:.3}; {} runs, {} input sets, {})",
            med * 1e3,
            min * 1e3,
            max * 1e3,
            runs,
            sets,
            if device_timed {
                "device events"
            } else {
                "wall clock"
            }
        );
        println!(
            "  {:.1} TFLOP/s, {:.1} GB/s ({:.3} GFLOP, {:.1} MB of {bytes_what} at {} storage)",
            tflops,
            gbs,
            cost.flops / 1e9,
            bytes / 1e6,
            storage
        );
        if let Some(c) = cyc {
            println!(
                "  {c:.0} cycles (median); host time {:.3} ms per launch, so the simulator runs {:.2} M cycles/s",
                host_per_launch * 1e3,
                c / host_per_launch / 1e6
            );
        }
    }
    Ok(())
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
    fn flags_parse_into_the_problem() {
        let t = T::parse_from([
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
        ]);
        let (op, metas) = t.b.problem();
        assert_eq!(op.name(), "attention");
        assert_eq!(metas[0].shape, vec![2, 8, 100, 64]);
        assert_eq!(metas[1].shape, vec![2, 2, 300, 64]);
        let t = T::parse_from([
            "x", "linear", "--m", "3", "--n", "5", "--k", "7", "--act", "silu",
        ]);
        let (op, metas) = t.b.problem();
        assert_eq!(op.name(), "linear");
        assert_eq!(metas.len(), 3);
        let t = T::parse_from([
            "x",
            "moe-route",
            "--tokens",
            "9",
            "--experts",
            "4",
            "--top-k",
            "2",
        ]);
        assert_eq!(t.b.problem().1[0].shape, vec![9, 4]);
        let t = T::parse_from([
            "x",
            "moe-experts",
            "--tokens",
            "5",
            "--hidden",
            "16",
            "--ffn",
            "24",
            "--experts",
            "4",
            "--top-k",
            "2",
        ]);
        let (op, metas) = t.b.problem();
        assert_eq!(op.name(), "moe_experts");
        op.validate(&metas).expect("valid experts shape");
        assert_eq!(metas[5].shape, vec![4, 48, 16]);
        assert_eq!(metas[6].shape, vec![4, 16, 24]);
        assert_eq!(t.b.shape_label(), "T5 H16 F24 E4 k2");
        let t = T::parse_from(["x", "moe-route"]);
        assert_eq!(t.b.problem().1[0].shape, vec![16384, 64]);
    }

    #[test]
    fn moe_experts_bench_runs_on_the_cpu() {
        let reg = DeviceRegistry::cpu_only();
        let t = T::parse_from([
            "x",
            "moe-experts",
            "--backend",
            "cpu",
            "--tokens",
            "7",
            "--hidden",
            "16",
            "--ffn",
            "8",
            "--experts",
            "4",
            "--top-k",
            "2",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--sets",
            "2",
        ]);
        run(&t.b, &reg).expect("moe-experts bench on cpu");
        let (op, metas) = t.b.problem();
        let (bytes, what) = counted_bytes(&op, &metas, DType::BF16);
        assert_eq!(what, "expert weights");
        assert_eq!(bytes, (2 * (4 * 16 * 16 + 4 * 16 * 8)) as f64);
    }

    #[test]
    fn bench_runs_on_the_cpu() {
        let reg = DeviceRegistry::cpu_only();
        let t = T::parse_from([
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
        ]);
        run(&t.b, &reg).expect("bench on cpu");
    }

    #[test]
    fn bf16_devices_count_half_the_float_bytes() {
        let op = Op::RmsNorm(RmsNormParams::default());
        let m = vec![
            TensorMeta::new(vec![4, 8], DType::F32),
            TensorMeta::new(vec![8], DType::F32),
        ];
        assert_eq!(
            device_bytes(&op, &m, DType::F32),
            ((32 + 8 + 32) * 4) as f64
        );
        assert_eq!(
            device_bytes(&op, &m, DType::BF16),
            ((32 + 8 + 32) * 2) as f64
        );
    }
}
