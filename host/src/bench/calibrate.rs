//! `tandem calibrate`: measures, on every device found, the host links (uploads and downloads
//! over a range of sizes) and the op times of the built-in layer's ops at a few sequence
//! lengths, then fits them ([`crate::plan::LinkFit`], [`crate::plan::OpFit`]) into a
//! [`Calibration`] the planner reads.

use std::time::{Duration, Instant};

use crate::backend::{Backend, DeviceRegistry, Support};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::{
    Activation, AttentionParams, LinearParams, MoeExpertsParams, MoeRouteParams, Op, RmsNormParams,
    RopeParams, SplitHeadsParams,
};
use crate::plan::{Calibration, DeviceCalibration, LinkFit, OpFit};
use crate::tensor::TensorMeta;
use crate::workload::MixtralConfig;

use super::{BenchOptions, Problem, random_tensor};

/// What to measure and how long to spend.
#[derive(Debug, Clone)]
pub struct CalibrateOptions {
    /// The layer whose ops are measured; also at 1/4 and 1/2 of its sequence length.
    pub layer: MixtralConfig,
    /// Timed launches per op and shape (after one warm-up launch).
    pub iters: usize,
    /// Transfer sizes, bytes (each timed `iters` times).
    pub transfer_sizes: Vec<usize>,
    /// Shapes whose model estimate on a device is above this are not run there (the fit
    /// covers them): keeps a slow device from taking minutes per launch.
    pub max_model_s: f64,
    /// Longest wait for one launch.
    pub timeout: Duration,
}

impl CalibrateOptions {
    /// Transfer sizes of a full calibration: 4 KiB to 64 MiB.
    pub const TRANSFER_SIZES: [usize; 6] =
        [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20];

    /// A calibration of `layer` with the default effort.
    pub fn new(layer: MixtralConfig) -> Self {
        Self {
            layer,
            iters: 5,
            transfer_sizes: Self::TRANSFER_SIZES.to_vec(),
            max_model_s: 2.0,
            timeout: Duration::from_secs(300),
        }
    }
}

/// One measured op or link, for the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// Device (`cuda:0`).
    pub device: String,
    /// What was measured (`upload 64 MiB`, `linear M4096 N4096 K4096`).
    pub what: String,
    /// Median seconds.
    pub median_s: f64,
    /// The fit's prediction for it, seconds.
    pub predicted_s: f64,
}

/// Measures every device of `reg` (or the devices `only` names) and fits the results.
pub fn calibrate(
    reg: &DeviceRegistry,
    only: Option<&[crate::backend::DeviceKind]>,
    opts: &CalibrateOptions,
    machine: &str,
) -> Result<(Calibration, Vec<Measured>)> {
    let mut cal = Calibration::new(machine);
    let mut rows = Vec::new();
    let problems = layer_grid(&opts.layer)?;
    for b in reg.backends() {
        if only.is_some_and(|k| !k.contains(&b.id().kind)) {
            continue;
        }
        let dev = b.id().to_string();
        let mut d = DeviceCalibration {
            name: b.info().name.clone(),
            ..DeviceCalibration::default()
        };
        if b.id().kind != crate::backend::DeviceKind::Cpu {
            let (up, down) = measure_links(b.as_ref(), opts)?;
            d.upload = LinkFit::fit(&up);
            d.download = LinkFit::fit(&down);
            for (dir, pts, fit) in [("upload", &up, &d.upload), ("download", &down, &d.download)] {
                for &(bytes, t) in pts.iter() {
                    rows.push(Measured {
                        device: dev.clone(),
                        what: format!("{dir} {}", human_bytes(bytes)),
                        median_s: t,
                        predicted_s: fit
                            .as_ref()
                            .map_or(f64::NAN, |f| f.time(bytes as usize).as_secs_f64()),
                    });
                }
            }
        }
        let mut per_op: std::collections::BTreeMap<&'static str, Vec<(String, f64, f64)>> =
            Default::default();
        let bench = BenchOptions {
            iters: opts.iters.max(1),
            warmup: 1,
            warmup_time: std::time::Duration::ZERO,
            sets: Some(1),
            timeout: opts.timeout,
            // one launch at a time on an idle device, as a run launches a layer's ops
            serial: true,
        };
        let mut task = crate::progress::Task::announce(
            format!("calibrate:{dev}"),
            format!("calibrating {dev}: {} op shapes", problems.len()),
            Some(problems.len() as u64),
            "shapes",
        );
        for (i, p) in problems.iter().enumerate() {
            task.set(i as u64);
            if let Support::No(_) = b.supports(&p.op, &p.inputs) {
                continue;
            }
            let model = b.estimate(&p.op, &p.inputs);
            if model.as_secs_f64() > opts.max_model_s {
                tracing::info!(
                    device = %dev, op = p.op.name(), shape = %p.label,
                    "not measured: the model puts it at {:.1} s", model.as_secs_f64()
                );
                continue;
            }
            let r = super::run(b.as_ref(), p, &bench)?;
            d.samples.insert(
                crate::plan::history_key(b.id(), &p.op, &p.inputs),
                r.median_s,
            );
            per_op.entry(p.op.name()).or_default().push((
                p.label.clone(),
                model.as_secs_f64(),
                r.median_s,
            ));
        }
        for (op, pts) in per_op {
            let xy: Vec<(f64, f64)> = pts.iter().map(|&(_, m, t)| (m, t)).collect();
            let Some(fit) = OpFit::fit(&xy) else { continue };
            for (label, m, t) in pts {
                rows.push(Measured {
                    device: dev.clone(),
                    what: format!("{op} {label}"),
                    median_s: t,
                    predicted_s: fit.time(Duration::from_secs_f64(m)).as_secs_f64(),
                });
            }
            d.ops.insert(op.to_string(), fit);
        }
        cal.devices.insert(dev, d);
    }
    Ok((cal, rows))
}

/// Median upload and download times of each transfer size on `b`, (bytes, seconds).
type Points = Vec<(u64, f64)>;

fn measure_links(b: &dyn Backend, opts: &CalibrateOptions) -> Result<(Points, Points)> {
    let (mut up, mut down) = (Vec::new(), Vec::new());
    for &bytes in &opts.transfer_sizes {
        let t = random_tensor(&[bytes.div_ceil(4)], 1.0, bytes as u64)?;
        let (mut tu, mut td) = (Vec::new(), Vec::new());
        // One untimed round trip first (pools, pinned staging).
        let s = b.upload(&t)?;
        b.download(&s)?;
        for _ in 0..opts.iters.max(1) {
            b.synchronize()?;
            let t0 = Instant::now();
            let s = b.upload(&t)?;
            b.synchronize()?;
            tu.push(t0.elapsed().as_secs_f64());
            let t1 = Instant::now();
            b.download(&s)?;
            td.push(t1.elapsed().as_secs_f64());
        }
        up.push((bytes as u64, super::median(&mut tu)));
        down.push((bytes as u64, super::median(&mut td)));
    }
    Ok((up, down))
}

/// The ops of the built-in layer ([`crate::workload::mixtral_layer`]), with its parameters
/// and shapes, at 1/4, 1/2 and all of its sequence length (one problem per distinct op and
/// shape).
pub fn layer_grid(c: &MixtralConfig) -> Result<Vec<Problem>> {
    let mut out: Vec<Problem> = Vec::new();
    let mut lens = vec![c.seq_len / 4, c.seq_len / 2, c.seq_len];
    lens.retain(|&n| n > 0);
    lens.dedup();
    for n in lens {
        let at = MixtralConfig {
            seq_len: n,
            ..c.clone()
        };
        for p in layer_problems(&at)? {
            let key = crate::plan::history_key(crate::backend::DeviceId::CPU, &p.op, &p.inputs);
            if !out.iter().any(|q| {
                crate::plan::history_key(crate::backend::DeviceId::CPU, &q.op, &q.inputs) == key
            }) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

/// The ops of one built-in layer at `c`'s sizes, in graph order (the q/k/v projections, the
/// split heads and RoPE of q and k each once per distinct shape).
pub fn layer_problems(c: &MixtralConfig) -> Result<Vec<Problem>> {
    c.check()?;
    let f = |s: Vec<usize>| TensorMeta::new(s, DType::F32);
    let i32m = |s: Vec<usize>| TensorMeta::new(s, DType::I32);
    let (t, d, hd) = (c.tokens(), c.d_model, c.head_dim());
    let (hq, hkv, n, b) = (c.heads, c.kv_heads, c.seq_len, c.batch);
    let lin = Op::Linear(LinearParams {
        act: Activation::None,
        bias: false,
        f32_out: false,
    });
    let route = MoeRouteParams {
        top_k: c.top_k,
        renormalize: true,
        block_size: 16,
    };
    let norm = |residual| {
        Op::RmsNorm(RmsNormParams {
            eps: c.rms_eps,
            residual,
        })
    };
    let rope = Op::Rope(RopeParams {
        base: c.rope_theta,
        position_offset: 0,
    });
    let split = |heads| Op::SplitHeads(SplitHeadsParams { batch: b, heads });
    let p = |op: Op, inputs: Vec<TensorMeta>, label: String| Problem::new(op, inputs, label);
    let mut v = vec![
        p(
            norm(false),
            vec![f(vec![t, d]), f(vec![d])],
            format!("{t}x{d}"),
        ),
        p(
            lin.clone(),
            vec![f(vec![t, d]), f(vec![hq * hd, d])],
            format!("M{t} N{} K{d}", hq * hd),
        ),
        p(
            lin.clone(),
            vec![f(vec![t, d]), f(vec![hkv * hd, d])],
            format!("M{t} N{} K{d}", hkv * hd),
        ),
        p(
            split(hq),
            vec![f(vec![t, hq * hd])],
            format!("{t}x{} -> {hq} heads", hq * hd),
        ),
        p(
            split(hkv),
            vec![f(vec![t, hkv * hd])],
            format!("{t}x{} -> {hkv} heads", hkv * hd),
        ),
        p(
            rope.clone(),
            vec![f(vec![b, hq, n, hd])],
            format!("B{b} H{hq} T{n} D{hd}"),
        ),
        p(
            rope,
            vec![f(vec![b, hkv, n, hd])],
            format!("B{b} H{hkv} T{n} D{hd}"),
        ),
        p(
            Op::Attention(AttentionParams {
                causal: true,
                scale: None,
            }),
            vec![
                f(vec![b, hq, n, hd]),
                f(vec![b, hkv, n, hd]),
                f(vec![b, hkv, n, hd]),
            ],
            format!("B{b} Hq{hq} Hkv{hkv} N{n} D{hd} causal"),
        ),
        p(
            Op::MergeHeads,
            vec![f(vec![b, hq, n, hd])],
            format!("B{b} H{hq} T{n} D{hd}"),
        ),
        p(
            lin.clone(),
            vec![f(vec![t, hq * hd]), f(vec![d, hq * hd])],
            format!("M{t} N{d} K{}", hq * hd),
        ),
        p(
            norm(true),
            vec![f(vec![t, d]), f(vec![d]), f(vec![t, d])],
            format!("{t}x{d}+residual"),
        ),
        // the router logits, kept in f32 (as the layer's node asks)
        p(
            Op::Linear(LinearParams {
                act: Activation::None,
                bias: false,
                f32_out: true,
            }),
            vec![f(vec![t, d]), f(vec![c.experts, d])],
            format!("M{t} N{} K{d}", c.experts),
        ),
        p(
            Op::MoeRoute(route),
            vec![f(vec![t, c.experts])],
            format!("T{t} E{} k{}", c.experts, c.top_k),
        ),
        p(
            Op::MoeExperts(MoeExpertsParams {}),
            vec![
                f(vec![t, d]),
                i32m(vec![t, c.top_k]),
                f(vec![t, c.top_k]),
                i32m(vec![route.padded_len(t, c.experts)]),
                i32m(vec![c.experts + 1]),
                f(vec![c.experts, 2 * c.ffn, d]),
                f(vec![c.experts, d, c.ffn]),
            ],
            format!("T{t} H{d} F{} E{} k{}", c.ffn, c.experts, c.top_k),
        ),
        p(
            Op::Add,
            vec![f(vec![t, d]), f(vec![t, d])],
            format!("{t}x{d}"),
        ),
    ];
    // q and k project, split and rotate alike where the head counts agree.
    let mut seen = Vec::new();
    v.retain(|p| {
        let k = crate::plan::history_key(crate::backend::DeviceId::CPU, &p.op, &p.inputs);
        if seen.contains(&k) {
            false
        } else {
            seen.push(k);
            true
        }
    });
    Ok(v)
}

/// `bytes` as KiB / MiB.
fn human_bytes(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::DeviceId;

    #[test]
    fn the_grid_holds_exactly_the_layers_ops() -> Result<()> {
        let c = MixtralConfig::tiny();
        let g = crate::workload::mixtral_layer(&c, None, None)?;
        let metas = g.validate()?;
        let mut from_graph: Vec<String> = g
            .nodes
            .iter()
            .map(|n| {
                let ins: Vec<TensorMeta> = n.inputs.iter().map(|i| metas[i].clone()).collect();
                crate::plan::history_key(DeviceId::CPU, &n.op, &ins)
            })
            .collect();
        from_graph.sort();
        from_graph.dedup();
        let mut ours: Vec<String> = layer_problems(&c)?
            .iter()
            .map(|p| crate::plan::history_key(DeviceId::CPU, &p.op, &p.inputs))
            .collect();
        ours.sort();
        assert_eq!(ours, from_graph);
        // Three lengths, nothing twice.
        let grid = layer_grid(&c)?;
        assert_eq!(grid.len(), 3 * ours.len());
        Ok(())
    }

    #[test]
    fn a_cpu_calibration_fits_what_it_measured() -> Result<()> {
        let c = MixtralConfig {
            seq_len: 32,
            d_model: 64,
            heads: 4,
            kv_heads: 2,
            experts: 4,
            top_k: 2,
            ffn: 64,
            ..MixtralConfig::default()
        };
        let mut opts = CalibrateOptions::new(c);
        opts.iters = 2;
        let reg = DeviceRegistry::cpu_only();
        let (cal, rows) = calibrate(&reg, None, &opts, "test-machine")?;
        let d = cal.devices.get("cpu").expect("the cpu was calibrated");
        assert!(d.upload.is_none() && d.download.is_none());
        // Every op family of the layer has a fit, and every shape a sample.
        for op in [
            "linear",
            "attention",
            "rmsnorm",
            "rope",
            "moe_route",
            "moe_experts",
        ] {
            let f = d.ops.get(op).unwrap_or_else(|| panic!("no fit for {op}"));
            assert!(f.scale > 0.0 && f.scale.is_finite(), "{op}: {f:?}");
        }
        assert_eq!(d.samples.len(), layer_grid(&opts.layer)?.len());
        assert!(rows.iter().all(|r| r.median_s > 0.0 && r.predicted_s > 0.0));
        Ok(())
    }
}
