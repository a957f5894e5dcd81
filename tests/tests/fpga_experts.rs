//! MoE experts on the card (GEMM + vecops launches over card memory): the launch sequence on
//! the Verilator-simulated card against the golden model bit for bit (F in several chunks, K
//! passes, combine launches, odd token counts, k = 1..3), the modelled card equal to the RTL,
//! the cycle models' sum within 10% of the RTL's cycles; the `fpga-sim` backend's `moe_experts`
//! against the f64 reference within the int8 class's bound (an expert without tokens, top_k 1
//! and 2, odd T, routing ties, a slot left out of every segment); the default layer with every
//! op on the card. Prints "skipped: <reason>" and returns where Verilator is missing.

use std::time::Duration;

use ndarray::ArrayD;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem_fpga::FpgaDevice;
use tandem_fpga::drive::experts::{experts_cycles, run_experts};
use tandem_fpga::golden::experts::{Expert8, Experts8, Linear8, experts};
use tandem_fpga::golden::gemm::Requant;
use tandem_fpga::golden::vecops::table_entry;
use tandem_fpga::kernels::gemm::GemmCore;
use tandem_fpga::kernels::vecops::VecopsCore;
use tandem_fpga::shell::ShellConfig;
use tandem_fpga::timing::MemTiming;
use tandem_sim::{ModelCard, ModelConfig, SimCard, SimConfig};

const T: Duration = Duration::from_secs(300);
/// Small builds, so that F needs several chunks and T several combine launches.
const GEMM: GemmCore = GemmCore {
    rows: 4,
    k_max: 256,
    n_max: 64,
    lanes: 8,
    w_ports: false,
};
const VECOPS: VecopsCore = VecopsCore { n_max: 256 };

fn r8(rng: &mut ChaCha8Rng, len: usize) -> Vec<i8> {
    (0..len)
        .map(|_| rng.gen_range(-128i16..=127) as i8)
        .collect()
}

fn linear(rng: &mut ChaCha8Rng, n: usize, k: usize) -> Linear8 {
    // requantisation to about 3 sigma of a k-long int8 dot product
    let real = 127.0 / (3.0 * 74.0 * 74.0 * (k as f64).sqrt());
    Linear8 {
        w: r8(rng, n * k),
        bias: (0..n).map(|_| rng.gen_range(-2000..=2000)).collect(),
        rq: (0..n)
            .map(|_| Requant::from_real(real * rng.gen_range(0.5..2.0)).expect("requant"))
            .collect(),
    }
}

/// A random quantised problem: `rows[e]` slots for each expert that got any.
fn problem(
    rng: &mut ChaCha8Rng,
    h: usize,
    f: usize,
    tokens: usize,
    k: usize,
    rows: &[usize],
) -> Experts8 {
    let experts: Vec<Expert8> = rows
        .iter()
        .map(|&m| Expert8 {
            rows: m,
            x: r8(rng, m * h),
            gate: linear(rng, f, h),
            up: linear(rng, f, h),
            // gate in units of 1/64 at about 1/16 per step; output about 1/2^14 of the product
            silu: (
                rng.gen_range(40_000..65_000),
                (rng.gen_range(20_000u32..65_000) << 16) | 10,
                rng.gen_range(28..=31),
            ),
            down: linear(rng, h, f),
        })
        .collect();
    let y_rows: usize = rows.iter().sum::<usize>().max(1);
    let table = (0..tokens * k)
        .map(|s| {
            let w = if s % 11 == 5 {
                0
            } else {
                rng.gen_range(0..=32767) as i16
            };
            table_entry(rng.gen_range(0..y_rows as u32), w)
        })
        .collect();
    Experts8 {
        h,
        f,
        experts,
        tokens,
        k,
        table,
        shift: rng.gen_range(8..=14),
    }
}

/// Fills the first `bytes` of bank 0 with 0x5a and frees them: the next run's buffers lie
/// there (bump allocator), so a row the kernels never write reads back as 0x5a5a.
fn poison(dev: &mut dyn FpgaDevice, bytes: usize) {
    tandem_fpga::drive::with_scratch(dev, |dev, s| {
        s.upload(dev, &vec![0x5a; bytes])?;
        Ok(())
    })
    .expect("poison");
}

#[test]
fn card_runs_match_the_golden_model() {
    let mut rtl = match SimCard::open(SimConfig::default()) {
        Ok(c) => c,
        Err(e) => {
            println!("skipped: {e}");
            return;
        }
    };
    let mut model = ModelCard::open(ModelConfig::default());
    let mut rng = ChaCha8Rng::seed_from_u64(0xe8e);
    // (H, F, tokens, k, rows of the experts that got slots)
    let cases: [(usize, usize, usize, usize, &[usize]); 4] = [
        (40, 150, 37, 2, &[9, 1, 30, 7]),
        (64, 64, 5, 1, &[5]),
        (21, 70, 33, 3, &[3, 17, 1, 2, 8]),
        (8, 8, 1, 2, &[]),
    ];
    for (h, f, tokens, k, rows) in cases {
        let p = problem(&mut rng, h, f, tokens, k, rows);
        let want = experts(&p).expect("golden");
        poison(&mut rtl, 1 << 20);
        let (got, st) =
            run_experts(&mut rtl, &GEMM, &VECOPS, ShellConfig::default(), &p, T).expect("RTL run");
        assert_eq!(
            got, want,
            "RTL vs golden: H {h} F {f} T {tokens} k {k} rows {rows:?}"
        );
        let (m, _) = run_experts(&mut model, &GEMM, &VECOPS, ShellConfig::default(), &p, T)
            .expect("model run");
        assert_eq!(m, got, "model vs RTL");
        let est = experts_cycles(&GEMM, &VECOPS, rows, h, f, tokens, k, &MemTiming::default());
        let err = (est as f64 - st.cycles as f64).abs() / st.cycles as f64;
        println!(
            "H {h} F {f} T {tokens} k {k} rows {rows:?}: {} cycles ({} GEMM + {} vecops \
             launches, {} loads), cycle model {est} ({:.1}%)",
            st.cycles,
            st.gemm_launches,
            st.vecops_launches,
            st.loads,
            100.0 * err
        );
        // the kernels' models are within 5% each on their own shapes; the sum here includes
        // GEMMs of 1..3 rows and K 24, where the GEMM model's fixed costs are off by a few %
        assert!(err <= 0.10, "cycle model {est} vs RTL {}", st.cycles);
        let saturated = want
            .iter()
            .filter(|&&v| v == i16::MAX || v == i16::MIN)
            .count();
        assert!(
            saturated < want.len() / 4,
            "mostly saturated: a test of nothing"
        );
    }
}

/// The sequence on GEMM builds wider than the vecops rows (16 and 64 lanes, as the card-sized
/// profile's 512-bit build): every buffer padded to the GEMM's lanes, the same bits as the
/// golden model, on the modelled card (its GEMM is bit-exact with the wide RTL builds:
/// tests/tests/fpga_modelled.rs and sim's own tests), with odd H and F and a chunk split.
#[test]
fn wide_gemm_builds_give_the_golden_bits() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x64e);
    let builds = [
        GemmCore {
            rows: 2,
            k_max: 256,
            n_max: 128,
            lanes: 16,
            w_ports: false,
        },
        GemmCore {
            rows: 2,
            k_max: 256,
            n_max: 128,
            lanes: 64,
            w_ports: false,
        },
    ];
    let cases: [(usize, usize, usize, usize, &[usize]); 4] = [
        (40, 150, 37, 2, &[9, 1, 30, 7]),
        (21, 300, 33, 3, &[3, 17, 1, 2, 8]),
        (128, 64, 5, 1, &[5]),
        (8, 8, 1, 2, &[]),
    ];
    for gemm in builds {
        for (h, f, tokens, k, rows) in cases {
            let p = problem(&mut rng, h, f, tokens, k, rows);
            let want = experts(&p).expect("golden");
            let mut model = ModelCard::open(ModelConfig::default());
            poison(&mut model, 1 << 20);
            let (got, st) = run_experts(&mut model, &gemm, &VECOPS, ShellConfig::default(), &p, T)
                .expect("model run");
            assert_eq!(
                got, want,
                "{} lanes: H {h} F {f} T {tokens} k {k} rows {rows:?}",
                gemm.lanes
            );
            let est = experts_cycles(&gemm, &VECOPS, rows, h, f, tokens, k, &MemTiming::default());
            println!(
                "{} lanes, H {h} F {f} T {tokens} k {k}: {} cycles, model sum {est}",
                gemm.lanes, st.cycles
            );
            assert_eq!(
                est, st.cycles,
                "the sequence's cycles are its launches' models"
            );
        }
    }
}

// ---- the fpga-sim backend against the f64 reference ----

use tandem::backend::{Backend, DeviceKind, Support};
use tandem::ops::{MoeExpertsParams, MoeRouteParams, Op};
use tandem::plan::{BackendChoice, PlacementPolicy};
use tandem::run::{RunOptions, run_graph};
use tandem::workload::{self, MixtralConfig};
use tandem::{DeviceRegistry, Tensor, TensorMeta};
use tandem_tests::TestResult;

/// The int8 class's declared bound (docs/ARCHITECTURE.md, "Placement policy").
const INT8_BOUND: f64 = 5e-2;

fn fpga_sim() -> Option<std::sync::Arc<dyn Backend>> {
    tandem_tests::device_or_skip(DeviceKind::FpgaSim)
}

fn uniform(rng: &mut ChaCha8Rng, shape: &[usize], lim: f32) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec_f32(shape, (0..n).map(|_| rng.gen_range(-lim..lim)).collect()).expect("tensor")
}

/// The experts op's inputs: x, routing of `logits` (CPU), gate_up, down.
fn inputs(
    rng: &mut ChaCha8Rng,
    logits: &Tensor,
    h: usize,
    f: usize,
    k: usize,
) -> TestResult<Vec<Tensor>> {
    let (t, e) = (logits.meta().shape[0], logits.meta().shape[1]);
    let route = Op::MoeRoute(MoeRouteParams {
        top_k: k,
        renormalize: true,
        block_size: 4,
    });
    let r = route.run_cpu(&[logits])?;
    Ok(vec![
        uniform(rng, &[t, h], 1.0),
        r[0].clone(),
        r[1].clone(),
        r[3].clone(),
        r[4].clone(),
        uniform(rng, &[e, 2 * f, h], (1.0 / h as f32).sqrt() * 1.7),
        uniform(rng, &[e, h, f], (1.0 / f as f32).sqrt() * 1.7),
    ])
}

/// Runs moe_experts on `b`: the rel. error against the f64 reference, and the kernel name.
fn check(b: &dyn Backend, ins: &[Tensor]) -> TestResult<(f64, String, u64)> {
    let op = Op::MoeExperts(MoeExpertsParams::default());
    let metas: Vec<TensorMeta> = ins.iter().map(|t| t.meta()).collect();
    assert_eq!(b.supports(&op, &metas), Support::Native);
    let st = ins
        .iter()
        .map(|t| b.upload(t))
        .collect::<tandem::Result<Vec<_>>>()?;
    let refs: Vec<_> = st.iter().collect();
    let l = b.launch(&op, &refs)?;
    l.done.wait(Duration::from_secs(600), "moe_experts")?;
    let y = b.download(&l.outputs[0])?;
    let yv: Vec<f32> = y.as_f32()?.iter().copied().collect();
    assert!(yv.iter().all(|v| v.is_finite()), "non-finite output");
    let want = op.reference(&ins.iter().map(|t| t.to_f64()).collect::<Vec<ArrayD<f64>>>())?;
    let err = tandem::tensor::rel_error(&y.to_f64(), &want[0]);
    let info = l.info.lock().map_err(|e| e.to_string())?.clone();
    Ok((err, info.kernel, info.cycles.unwrap_or(0)))
}

#[test]
fn backend_experts_are_within_the_int8_bound() -> TestResult {
    let Some(b) = fpga_sim() else {
        return Ok(());
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0xe9);
    // (T, H, E, k, F, logits): random; expert 2 gets no token; ties (all-equal rows)
    let cases: Vec<(usize, usize, usize, usize, usize, &str)> = vec![
        (37, 64, 4, 2, 96, "random"),
        (16, 48, 8, 1, 40, "no token for expert 2"),
        (9, 32, 4, 2, 24, "ties"),
        (1, 16, 4, 2, 16, "one token"),
    ];
    for (t, h, e, k, f, kind) in cases {
        let mut logits = uniform(&mut rng, &[t, e], 2.0);
        let lv: Vec<f32> = logits.as_f32()?.iter().copied().collect();
        let lv: Vec<f32> = match kind {
            "no token for expert 2" => lv
                .iter()
                .enumerate()
                .map(|(i, &v)| if i % e == 2 { -100.0 } else { v })
                .collect(),
            // every other row all equal: the lowest experts win
            "ties" => lv
                .iter()
                .enumerate()
                .map(|(i, &v)| if (i / e) % 2 == 0 { 0.5 } else { v })
                .collect(),
            _ => lv,
        };
        logits = Tensor::from_vec_f32(&[t, e], lv)?;
        let ins = inputs(&mut rng, &logits, h, f, k)?;
        let (err, kernel, cycles) = check(&*b, &ins)?;
        println!(
            "moe_experts T {t} H {h} E {e} k {k} F {f} ({kind}): rel. error {err:.2e}, {cycles} cycles, {kernel}"
        );
        assert!(err < INT8_BOUND, "{kind}: rel. error {err}");
        assert!(kernel.starts_with("moe_experts_int8"), "{kernel}");
        assert!(cycles > 0);
    }
    // a slot in no segment (the last token's second slot dropped from sorted_token_ids)
    // contributes nothing, as on the CPU
    let logits = uniform(&mut rng, &[7, 4], 2.0);
    let mut ins = inputs(&mut rng, &logits, 24, 32, 2)?;
    let mut sorted: Vec<i32> = ins[3].as_i32()?.iter().copied().collect();
    let dropped = 7 * 2 - 1;
    for v in sorted.iter_mut().filter(|v| **v == dropped) {
        *v = 14; // the sentinel T*k
    }
    ins[3] = Tensor::from_vec_i32(&[sorted.len()], sorted)?;
    let (err, _, _) = check(&*b, &ins)?;
    println!("moe_experts with a dropped slot: rel. error {err:.2e}");
    assert!(err < INT8_BOUND, "dropped slot: rel. error {err}");
    // no tokens: an empty output, nothing launched
    let logits = Tensor::from_vec_f32(&[0, 4], Vec::new())?;
    let ins = inputs(&mut rng, &logits, 16, 16, 2)?;
    let (err, _, cycles) = check(&*b, &ins)?;
    assert_eq!((err, cycles), (0.0, 0));
    // bad routing: the CPU path's error, no panic
    let logits = uniform(&mut rng, &[5, 4], 2.0);
    let mut ins = inputs(&mut rng, &logits, 16, 16, 2)?;
    ins[1] = Tensor::from_vec_i32(&[5, 2], vec![9; 10])?;
    let op = Op::MoeExperts(MoeExpertsParams::default());
    let st = ins
        .iter()
        .map(|t| b.upload(t))
        .collect::<tandem::Result<Vec<_>>>()?;
    let refs: Vec<_> = st.iter().collect();
    let e = b.launch(&op, &refs).err().ok_or("bad topk_ids accepted")?;
    assert!(e.to_string().contains("topk_ids"), "{e}");
    // declined with the reason: hidden size past the builds
    let metas = [
        TensorMeta::new(vec![4, 8192], tandem::DType::F32),
        TensorMeta::new(vec![4, 2], tandem::DType::I32),
        TensorMeta::new(vec![4, 2], tandem::DType::F32),
        TensorMeta::new(vec![16], tandem::DType::I32),
        TensorMeta::new(vec![5], tandem::DType::I32),
        TensorMeta::new(vec![4, 64, 8192], tandem::DType::F32),
        TensorMeta::new(vec![4, 8192, 32], tandem::DType::F32),
    ];
    match b.supports(&op, &metas) {
        Support::No(why) => assert!(why.contains("hidden size"), "{why}"),
        Support::Native => panic!("H 8192 accepted"),
    }
    Ok(())
}

/// The default layer on `--backend fpga-sim`: every op, moe_experts included, is placed on the
/// card (planned at the default size, `--strict` too); a small layer runs with every op on the
/// card (no CPU fallback) within the int8 bound.
#[test]
fn default_layer_runs_every_op_on_the_card() -> TestResult {
    if fpga_sim().is_none() {
        return Ok(());
    }
    let reg = DeviceRegistry::discover();
    let choice: BackendChoice = "fpga-sim".parse()?;
    let g = workload::mixtral_layer(&MixtralConfig::default(), None, None)?;
    let strict = PlacementPolicy {
        strict: true,
        ..PlacementPolicy::default()
    };
    let plan = tandem::plan::plan_with(&g, &reg, choice, None, &strict)?;
    let off: Vec<String> = g
        .nodes
        .iter()
        .zip(&plan.placements)
        .filter(|(_, p)| p.device.to_string() != "fpga-sim:0")
        .map(|(n, p)| format!("{} ({}): {}", n.name, n.op.name(), p.reason))
        .collect();
    assert!(off.is_empty(), "off the card: {off:?}");

    let c = MixtralConfig {
        seq_len: 16,
        d_model: 64,
        heads: 4,
        kv_heads: 2,
        ffn: 32,
        ..MixtralConfig::default()
    };
    let g = workload::mixtral_layer(&c, None, None)?;
    let opts = RunOptions {
        backend: choice,
        placement: strict,
        backend_label: "fpga-sim".into(),
        exec: Default::default(),
        check: true,
        workload: "small".into(),
        history: None,
        limits: tandem::limits::Limits::default(),
        allow_nonfinite: false,
        warmup: 0,
    };
    let out = run_graph(&g, &reg, &opts)?;
    for n in &out.report.nodes {
        println!(
            "{} ({}) on {} [{}]: rel. error {:?}",
            n.run.node, n.run.op, n.run.device, n.run.launch.kernel, n.error.rel_error
        );
        assert_eq!(
            n.run.device.kind,
            DeviceKind::FpgaSim,
            "{} ran on {} ({:?})",
            n.run.node,
            n.run.device,
            n.run.fallback
        );
        assert!(
            n.run.fallback.is_none(),
            "{}: {:?}",
            n.run.node,
            n.run.fallback
        );
        let e = n.error.rel_error.ok_or("no error measured")?;
        assert!(e < INT8_BOUND, "{}: rel. error {e:.3e}", n.run.node);
    }
    println!("layer output rel. error {:?}", out.report.output_rel_error);
    Ok(())
}

/// The planner's estimate of moe_experts comes from the kernels' cycle models over the launch
/// sequence (slots spread evenly over the experts), at the default layer's size and at
/// Mixtral's (T 4096, H 4096, E 8, top-2, F 14336), and is no faster than the GEMM array's
/// multiply-adds allow (rows x 8 per cycle, three projections).
#[test]
fn estimates_come_from_the_cycle_models() -> TestResult {
    let Some(b) = fpga_sim() else {
        return Ok(());
    };
    let gemm = tandem::backend::fpga::gemm_build();
    let vecops = tandem::backend::fpga::vecops::vecops_build();
    let op = Op::MoeExperts(MoeExpertsParams::default());
    for (t, h, e, k, f) in [(128, 512, 8, 2, 1024), (4096, 4096, 8, 2, 14336)] {
        let p = t * k + e * 15;
        let metas = [
            TensorMeta::new(vec![t, h], tandem::DType::F32),
            TensorMeta::new(vec![t, k], tandem::DType::I32),
            TensorMeta::new(vec![t, k], tandem::DType::F32),
            TensorMeta::new(vec![p], tandem::DType::I32),
            TensorMeta::new(vec![e + 1], tandem::DType::I32),
            TensorMeta::new(vec![e, 2 * f, h], tandem::DType::F32),
            TensorMeta::new(vec![e, h, f], tandem::DType::F32),
        ];
        let rows: Vec<usize> = (0..e)
            .map(|i| t * k / e + usize::from(i < t * k % e))
            .collect();
        let cycles = experts_cycles(&gemm, &vecops, &rows, h, f, t, k, &MemTiming::default());
        let clock = tandem_fpga::DEFAULT_CLOCK_MHZ * 1e6;
        let want = cycles as f64 / clock + 20e-6;
        let got = b.estimate(&op, &metas).as_secs_f64();
        assert!(
            (got - want).abs() <= 1e-9 + 1e-9 * want,
            "estimate {got} s vs {want} s"
        );
        let macs = 3.0 * (t * k) as f64 * h as f64 * f as f64;
        let peak = f64::from(gemm.rows) * 8.0;
        assert!(
            cycles as f64 >= macs / peak,
            "{cycles} cycles beat the array"
        );
        println!(
            "moe_experts T {t} H {h} E {e} k {k} F {f}: {cycles} cycles, {:.3} ms at {} MHz, \
             {:.1}% of the array's peak ({} GMAC)",
            1e3 * cycles as f64 / clock,
            tandem_fpga::DEFAULT_CLOCK_MHZ,
            100.0 * macs / peak / cycles as f64,
            macs / 1e9
        );
        // the same launch sequence with the U55C-sized GEMM build (rows 64 = 512 MACs)
        let big = GemmCore::u55c();
        let c = experts_cycles(&big, &vecops, &rows, h, f, t, k, &MemTiming::default());
        let peak = f64::from(big.rows) * 8.0;
        assert!(
            c as f64 >= macs / peak && c < cycles,
            "{c} cycles on the rows-64 build"
        );
        println!(
            "  with GemmCore::u55c(): {c} cycles, {:.3} ms, {:.1}% of its peak",
            1e3 * c as f64 / clock,
            100.0 * macs / peak / c as f64
        );
    }
    Ok(())
}
