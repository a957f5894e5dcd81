//! `attention` on the `fpga-sim` backend (the streaming attention kernel on the
//! Verilator-simulated card), through the `Backend` trait, against the f64 reference
//! (`Op::reference`) on random inputs; the planner puts a small layer's attention on the card;
//! cycles and MAC-array utilisation of the default layer's attention. Prints
//! "skipped: <reason>" and returns where Verilator is missing.
//!
//! Bounds (docs/FPGA.md, "Attention kernel", numerics; int8 per-tensor quantisation):
//! - o against f64 attention of the original inputs: relative Frobenius error < 3%, per
//!   (batch, head) plane and overall;
//! - o against f64 attention of the int8-dequantised inputs (the fixed-point softmax alone):
//!   every element within `0.01 max|v| + sv / 256` of its kv plane;
//! - lse (natural log) within 0.05 absolute per row; -inf exactly where the row sees no key.

use std::time::Duration;

use ndarray::{ArrayD, IxDyn};
use tandem::backend::{Backend, DeviceKind, LaunchInfo, Support};
use tandem::ops::{AttentionParams, Op};
use tandem::plan::BackendChoice;
use tandem::run::{RunOptions, run_graph};
use tandem::workload::{self, MixtralConfig};
use tandem::{DType, DeviceRegistry, Tensor, TensorMeta};
use tandem_fpga::golden::gemm::quantize_per_tensor;
use tandem_tests::{TestResult, rng, uniform};

fn fpga_sim() -> Option<std::sync::Arc<dyn Backend>> {
    tandem_tests::device_or_skip(DeviceKind::FpgaSim)
}

/// Runs `op` on `b`: outputs and launch info.
fn launch(b: &dyn Backend, op: &Op, inputs: &[Tensor]) -> TestResult<(Vec<Tensor>, LaunchInfo)> {
    let stored = inputs
        .iter()
        .map(|t| b.upload(t))
        .collect::<tandem::Result<Vec<_>>>()?;
    let refs: Vec<_> = stored.iter().collect();
    let l = b.launch(op, &refs)?;
    l.done.wait(Duration::from_secs(600), "attention")?;
    let outs = l
        .outputs
        .iter()
        .map(|s| b.download(s))
        .collect::<tandem::Result<Vec<_>>>()?;
    let info = l.info.lock().map_err(|e| e.to_string())?.clone();
    Ok((outs, info))
}

/// Each `[.., N, D]` plane of `x` quantised to int8 per tensor and dequantised; the scales.
fn dequantised_planes(x: &ArrayD<f64>, plane: usize) -> (ArrayD<f64>, Vec<f64>) {
    let flat: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let mut out = Vec::with_capacity(flat.len());
    let mut scales = Vec::new();
    for p in flat.chunks(plane.max(1)) {
        let (q, s) = quantize_per_tensor(p);
        out.extend(q.iter().map(|&v| f64::from(v) * f64::from(s)));
        scales.push(f64::from(s));
    }
    let a = ArrayD::from_shape_vec(IxDyn(x.shape()), out).unwrap_or_else(|e| panic!("{e}"));
    (a, scales)
}

fn frob(a: &[f64], b: &[f64]) -> f64 {
    let e: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let r: f64 = b.iter().map(|y| y * y).sum();
    if r > 0.0 { (e / r).sqrt() } else { e.sqrt() }
}

/// One case: `[B, Hq, Hkv, Nq, Nkv, D]`, inputs uniform in +-`amp`. Returns (o error, lse error).
fn case(
    b: &dyn Backend,
    causal: bool,
    shape: [usize; 6],
    amp: f32,
    seed: u64,
) -> TestResult<(f64, f64)> {
    let [bs, hq, hkv, nq, nkv, d] = shape;
    let mut r = rng(seed);
    let q = Tensor::from_f32(uniform(&mut r, &[bs, hq, nq, d], amp));
    let k = Tensor::from_f32(uniform(&mut r, &[bs, hkv, nkv, d], amp));
    let v = Tensor::from_f32(uniform(&mut r, &[bs, hkv, nkv, d], 1.0));
    let op = Op::Attention(AttentionParams {
        causal,
        scale: None,
    });
    let metas: Vec<TensorMeta> = [&q, &k, &v].iter().map(|t| t.meta()).collect();
    assert_eq!(b.supports(&op, &metas), Support::Native, "{shape:?}");
    let (outs, info) = launch(b, &op, &[q.clone(), k.clone(), v.clone()])?;
    assert_eq!(info.kernel, "attention_int8_stream");
    let cycles = info.cycles.ok_or("no cycles")?;
    assert!(cycles > 0);
    let dt = info.device_time.ok_or("no device time")?;
    let mhz = tandem_tests::fpga_clock_mhz(b);
    assert!((dt.as_secs_f64() - cycles as f64 / (mhz * 1e6)).abs() < 1e-9);

    let inputs = [q.to_f64(), k.to_f64(), v.to_f64()];
    let want = op.reference(&inputs)?;
    let (qd, _) = dequantised_planes(&inputs[0], nq * d);
    let (kd, _) = dequantised_planes(&inputs[1], nkv * d);
    let (vd, sv) = dequantised_planes(&inputs[2], nkv * d);
    let want_q = op.reference(&[qd, kd, vd.clone()])?;
    let o = outs[0].to_f64();
    let lse = outs[1].to_f64();
    assert_eq!(o.shape(), &[bs, hq, nq, d]);
    assert_eq!(lse.shape(), &[bs, hq, nq]);
    let o = o.iter().copied().collect::<Vec<_>>();
    let (wo, wq) = (
        want[0].iter().copied().collect::<Vec<_>>(),
        want_q[0].iter().copied().collect::<Vec<_>>(),
    );
    let plane = nq * d;
    let group = hq / hkv;
    let mut worst_plane = 0f64;
    for p in 0..bs * hq {
        let range = p * plane..(p + 1) * plane;
        let e = frob(&o[range.clone()], &wo[range.clone()]);
        worst_plane = worst_plane.max(e);
        assert!(
            e < 0.03,
            "{shape:?} causal={causal} plane {p}: o rel. error {e:.3e}"
        );
        // the fixed-point softmax alone, element by element
        let kvp = (p / hq) * hkv + (p % hq) / group;
        let vmax = vd
            .iter()
            .skip(kvp * nkv * d)
            .take(nkv * d)
            .fold(0f64, |a, x| a.max(x.abs()));
        let bound = 0.01 * vmax + sv[kvp] / 256.0 + 1e-6;
        for idx in range {
            assert!(
                (o[idx] - wq[idx]).abs() <= bound,
                "{shape:?} causal={causal} o[{idx}] = {} vs {} (bound {bound})",
                o[idx],
                wq[idx]
            );
        }
    }
    let overall = frob(&o, &wo);
    assert!(overall < 0.03, "{shape:?}: o rel. error {overall:.3e}");
    let mut worst_lse = 0f64;
    for (i, (&g, &w)) in lse.iter().zip(want[1].iter()).enumerate() {
        if w.is_infinite() {
            assert!(
                g.is_infinite() && g < 0.0,
                "{shape:?} lse row {i}: {g}, want -inf"
            );
        } else {
            let e = (g - w).abs();
            worst_lse = worst_lse.max(e);
            assert!(e < 0.05, "{shape:?} lse row {i}: {g} vs {w}");
        }
    }
    println!(
        "attention {shape:?} causal={causal} amp={amp}: o rel. error {overall:.2e} (worst plane \
         {worst_plane:.2e}), lse max abs error {worst_lse:.2e}, {cycles} cycles"
    );
    Ok((overall, worst_lse))
}

#[test]
fn attention_on_the_simulated_card_matches_the_reference() -> TestResult {
    let Some(b) = fpga_sim() else {
        return Ok(());
    };
    // [B, Hq, Hkv, Nq, Nkv, D]
    // GQA, causal, Nq = Nkv off the 16-key tile
    case(&*b, true, [1, 4, 2, 37, 37, 64], 1.0, 1)?;
    // not causal, Nq < Nkv, head dim 20 (padded to 24), batch 2
    case(&*b, false, [2, 2, 2, 20, 45, 20], 1.0, 2)?;
    // causal Nq > Nkv (the first 26 rows see no key), MQA
    case(&*b, true, [1, 3, 1, 45, 19, 16], 1.0, 3)?;
    // causal Nq < Nkv, peaky scores (softmax rescales across tiles)
    case(&*b, true, [1, 2, 1, 7, 50, 64], 3.0, 4)?;
    // not causal Nq > Nkv
    case(&*b, false, [1, 2, 2, 33, 9, 8], 2.0, 5)?;
    // the shapes of the conformance suite (d 128 runs on the d_max = 128 build)
    case(&*b, true, [1, 4, 2, 37, 53, 64], 1.0, 6)?;
    case(&*b, false, [2, 2, 2, 65, 65, 128], 1.0, 7)?;
    case(&*b, true, [1, 4, 1, 80, 17, 64], 1.0, 8)?;
    // head dim 72 (d_max 128 build, lanes 72..127 idle), causal, GQA
    case(&*b, true, [1, 2, 1, 24, 30, 72], 1.0, 10)?;
    Ok(())
}

#[test]
fn attention_beyond_the_builds_is_declined_and_long_kv_is_taken() {
    let Some(b) = fpga_sim() else { return };
    let op = Op::Attention(AttentionParams::default());
    let m = |h, n, d| TensorMeta::new(vec![1, h, n, d], DType::F32);
    for (d, nkv) in [(264, 16), (512, 16)] {
        let metas = [m(2, 8, d), m(2, nkv, d), m(2, nkv, d)];
        match b.supports(&op, &metas) {
            Support::No(why) => {
                assert!(why.contains("d_max"), "{why}");
                println!("declined d={d} nkv={nkv}: {why}")
            }
            other => panic!("d={d} nkv={nkv}: {other:?}"),
        }
    }
    // head dims up to 256 and K/V past a launch's nkv_max (several launches, merged)
    for (d, nkv) in [(136, 16), (256, 16), (64, 600), (128, 513)] {
        let metas = [m(2, 8, d), m(2, nkv, d), m(2, nkv, d)];
        assert_eq!(b.supports(&op, &metas), Support::Native, "d={d} nkv={nkv}");
    }
}

/// One attention problem of the default layer (B 1, 8 query heads, 2 kv heads, N 128, d 64,
/// causal): cycles and utilisation of the 64 + 64 MAC arrays, projected time.
#[test]
fn default_layer_attention_cycles() -> TestResult {
    let Some(b) = fpga_sim() else {
        return Ok(());
    };
    let c = MixtralConfig::default();
    let (hq, hkv, n, d) = (c.heads, c.kv_heads, c.seq_len, c.head_dim());
    let (_, worst_lse) = case(&*b, true, [c.batch, hq, hkv, n, n, d], 1.0, 9)?;
    let mut r = rng(9);
    let q = Tensor::from_f32(uniform(&mut r, &[c.batch, hq, n, d], 1.0));
    let k = Tensor::from_f32(uniform(&mut r, &[c.batch, hkv, n, d], 1.0));
    let v = Tensor::from_f32(uniform(&mut r, &[c.batch, hkv, n, d], 1.0));
    let op = Op::Attention(AttentionParams::default());
    let metas: Vec<TensorMeta> = [&q, &k, &v].iter().map(|t| t.meta()).collect();
    let (_, info) = launch(&*b, &op, &[q, k, v])?;
    let cycles = info.cycles.ok_or("no cycles")?;
    // the planner's estimate (the cycle model) is close to the simulated time
    let est = b.estimate(&op, &metas).as_secs_f64();
    let dt = info.device_time.ok_or("no device time")?.as_secs_f64();
    println!("estimate {:.1} us, simulated {:.1} us", est * 1e6, dt * 1e6);
    assert!((est / dt - 1.0).abs() < 0.15, "estimate {est} vs {dt}");
    let heads = (c.batch * hq) as u64;
    let pairs: u64 = (0..n).map(|i| i as u64 + 1).sum::<u64>() * heads;
    let d_max = tandem::backend::fpga::attention::default_core().d_max as f64;
    let util = pairs as f64 * d as f64 / (cycles as f64 * d_max);
    let mhz = tandem_tests::fpga_clock_mhz(&*b);
    println!(
        "default layer attention (B {}, Hq {hq}, Hkv {hkv}, N {n}, d {d}, causal): {cycles} cycles \
         ({} per head), {pairs} visible pairs, MAC utilisation {:.1}%, {:.1} us at {mhz} MHz; \
         lse max abs error {worst_lse:.2e}",
        c.batch,
        cycles / heads,
        100.0 * util,
        cycles as f64 / mhz
    );
    assert!(util > 0.5, "utilisation {util}");
    Ok(())
}

/// `tandem run --backend fpga-sim --seq-len 24 --d-model 64 --heads 4 --kv-heads 2 --ffn 32`
/// puts attention on fpga-sim:0 (and it runs there, within the int8 bound).
#[test]
fn small_layer_runs_attention_on_the_card() -> TestResult {
    if fpga_sim().is_none() {
        return Ok(());
    }
    let c = MixtralConfig {
        seq_len: 24,
        d_model: 64,
        heads: 4,
        kv_heads: 2,
        ffn: 32,
        ..MixtralConfig::default()
    };
    let g = workload::mixtral_layer(&c, None, None)?;
    let reg = DeviceRegistry::discover();
    let choice: BackendChoice = "fpga-sim".parse()?;
    let opts = RunOptions {
        backend: choice,
        placement: Default::default(),
        backend_label: "fpga-sim".into(),
        exec: Default::default(),
        check: true,
        workload: "default".into(),
        history: None,
        limits: tandem::limits::Limits::default(),
        allow_nonfinite: false,
        warmup: 0,
    };
    let plan = tandem::plan::plan(&g, &reg, choice)?;
    let att: Vec<usize> = g
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| matches!(n.op, Op::Attention(_)))
        .map(|(i, _)| i)
        .collect();
    assert!(!att.is_empty(), "no attention node");
    for &i in &att {
        let p = &plan.placements[i];
        assert_eq!(
            p.device.to_string(),
            "fpga-sim:0",
            "{}: {}",
            g.nodes[i].name,
            p.reason
        );
    }
    let out = run_graph(&g, &reg, &opts)?;
    for n in &out.report.nodes {
        if n.run.op == "attention" {
            assert_eq!(
                n.run.device.to_string(),
                "fpga-sim:0",
                "{:?}",
                n.run.fallback
            );
            assert_eq!(n.run.launch.kernel, "attention_int8_stream");
            let e = n.error.rel_error.ok_or("no error measured")?;
            println!(
                "{} on {}: rel. error {e:.2e}, {:?} cycles",
                n.run.node, n.run.device, n.run.launch.cycles
            );
            assert!(e < 0.05, "attention rel. error {e:.3e}");
        }
    }
    println!(
        "layer output rel. error {:?}; on the card: {}",
        out.report.output_rel_error,
        out.report
            .nodes
            .iter()
            .filter(|n| n.run.device.kind == DeviceKind::FpgaSim)
            .map(|n| &*n.run.node)
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}
