//! The two ways to run the simulated card through the host backend: `SimMode::Rtl` (Verilator)
//! and `SimMode::Model` (golden results, analytic cycles). On the same ops both give the same
//! outputs bit for bit, and cycles within 5%; the modelled card takes shapes far past what
//! the RTL simulation runs quickly; `Auto` picks by size and the report says which ran.
//! Skipped where Verilator is missing (the RTL side).

use std::time::Duration;

use rand::{Rng, SeedableRng};
use tandem::backend::fpga::{CardInfo, FpgaBackend, model_factory, sim_factory};
use tandem::backend::{Backend, DeviceKind, LaunchInfo, Support};
use tandem::ops::{Activation, AttentionParams, LinearParams, MoeRouteParams, Op};
use tandem::options::{FpgaOptions, SimMode, SimProfile};
use tandem::{Tensor, TensorMeta};

fn backend(mode: SimMode) -> FpgaBackend {
    let card = CardInfo {
        kind: DeviceKind::FpgaSim,
        index: 0,
        name: format!("simulated card ({})", mode.name()),
        memory_bytes: 4 << 30,
        details: Vec::new(),
    };
    let opts = FpgaOptions {
        sim_mode: mode,
        ..FpgaOptions::default()
    };
    FpgaBackend::new(card, opts, sim_factory()).with_model(model_factory())
}

fn run(b: &FpgaBackend, op: &Op, inputs: &[Tensor]) -> (Vec<Tensor>, LaunchInfo) {
    let metas: Vec<TensorMeta> = inputs.iter().map(Tensor::meta).collect();
    assert_eq!(b.supports(op, &metas), Support::Native, "{}", op.name());
    let st: Vec<_> = inputs
        .iter()
        .map(|t| b.upload(t).expect("upload"))
        .collect();
    let refs: Vec<_> = st.iter().collect();
    let l = b.launch(op, &refs).expect("launch");
    l.done
        .wait(Duration::from_secs(600), op.name())
        .expect("done");
    let outs = l
        .outputs
        .iter()
        .map(|o| b.download(o).expect("download"))
        .collect();
    let info = l.info.lock().expect("info").clone();
    (outs, info)
}

fn random(rng: &mut rand_chacha::ChaCha8Rng, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    Tensor::from_vec_f32(shape, v).expect("tensor")
}

/// The ops of a small layer: routing, a projection, GQA attention.
fn ops(rng: &mut rand_chacha::ChaCha8Rng) -> Vec<(Op, Vec<Tensor>)> {
    vec![
        (
            Op::MoeRoute(MoeRouteParams {
                top_k: 2,
                renormalize: true,
                block_size: 16,
            }),
            vec![random(rng, &[96, 8])],
        ),
        (
            // the default router build's 8 lanes: E off a multiple of 8, k = k_max, the
            // softmax over all experts
            Op::MoeRoute(MoeRouteParams {
                top_k: 8,
                renormalize: false,
                block_size: 16,
            }),
            vec![random(rng, &[33, 70])],
        ),
        (
            Op::Linear(LinearParams {
                act: Activation::Relu,
                bias: true,
                f32_out: false,
            }),
            vec![
                random(rng, &[40, 200]),
                random(rng, &[72, 200]),
                random(rng, &[72]),
            ],
        ),
        (
            Op::Attention(AttentionParams {
                causal: true,
                scale: None,
            }),
            vec![
                random(rng, &[1, 4, 48, 64]),
                random(rng, &[1, 2, 48, 64]),
                random(rng, &[1, 2, 48, 64]),
            ],
        ),
    ]
}

#[test]
fn modelled_and_rtl_cards_agree_on_results_and_cycles() {
    if let Err(e) = tandem_sim::available() {
        println!("SKIP: the RTL side needs Verilator: {e}");
        return;
    }
    let (rtl, model) = (backend(SimMode::Rtl), backend(SimMode::Model));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(99);
    for (op, inputs) in ops(&mut rng) {
        let (a, ia) = run(&rtl, &op, &inputs);
        let (b, ib) = run(&model, &op, &inputs);
        assert_eq!(a, b, "{}: outputs differ", op.name());
        let (ca, cb) = (ia.cycles.expect("cycles"), ib.cycles.expect("cycles"));
        let rel = (cb as f64 - ca as f64).abs() / ca as f64;
        println!(
            "{}: RTL {ca} cycles, model {cb} ({:.2}%)",
            op.name(),
            100.0 * rel
        );
        assert!(rel <= 0.05, "{}: model {cb} vs RTL {ca}", op.name());
        assert!(!ia.kernel.contains("modelled"), "{}", ia.kernel);
        assert!(ib.kernel.ends_with("(modelled)"), "{}", ib.kernel);
    }
}

#[test]
fn the_modelled_card_takes_what_the_rtl_simulation_declines() {
    let (rtl, model, auto) = (
        backend(SimMode::Rtl),
        backend(SimMode::Model),
        backend(SimMode::Auto),
    );
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    // 512 x 1024 x 1024: 2^29 MACs, past the RTL ceiling (2^26).
    let op = Op::Linear(LinearParams {
        act: Activation::None,
        bias: false,
        f32_out: false,
    });
    let inputs = vec![
        random(&mut rng, &[512, 1024]),
        random(&mut rng, &[1024, 1024]),
    ];
    let metas: Vec<TensorMeta> = inputs.iter().map(Tensor::meta).collect();
    match rtl.supports(&op, &metas) {
        Support::No(why) => assert!(why.contains("--fpga-sim-mode"), "{why}"),
        s => panic!("RTL mode took it: {s:?}"),
    }
    let (outs, info) = run(&model, &op, &inputs);
    assert!(info.kernel.ends_with("(modelled)"));
    // The int8 GEMM's documented bound against the f64 reference.
    let reference = op
        .reference(&inputs.iter().map(Tensor::to_f64).collect::<Vec<_>>())
        .expect("reference");
    let err = tandem::tensor::rel_error(&outs[0].to_f64(), &reference[0]);
    assert!(err < 3e-2, "rel. error {err}");
    // Auto picks the modelled card for it (about 2^23 cycles), the RTL for a small one.
    let (_, auto_info) = run(&auto, &op, &inputs);
    assert!(
        auto_info.kernel.ends_with("(modelled)"),
        "{}",
        auto_info.kernel
    );
    assert_eq!(auto_info.cycles, info.cycles);
    // The estimate the planner sees is the model's cycles at the clock.
    let est = model.estimate(&op, &metas);
    let device = info.device_time.expect("device time");
    let rel = (est.as_secs_f64() - device.as_secs_f64()).abs() / device.as_secs_f64();
    assert!(rel < 0.01, "estimate {est:?} vs modelled {device:?}");
}

#[test]
fn the_u55c_profile_runs_the_card_sized_gemm() {
    // TANDEM_FPGA_SIM_PROFILE=u55c: the backend loads the 64 x 64-lane GEMM on a 512-bit port
    // (modelled here: the RTL of that size is minutes of Verilator). Same bits as the default
    // 8-lane build, far fewer cycles, and the planner's estimate is the model's.
    let (ci, card) = (modelled(SimProfile::Ci), modelled(SimProfile::U55c));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4096);
    let op = Op::Linear(LinearParams {
        act: Activation::Relu,
        bias: true,
        f32_out: false,
    });
    // N and K off the 64 lanes, K past k_max (two passes)
    let inputs = vec![
        random(&mut rng, &[130, 4200]),
        random(&mut rng, &[333, 4200]),
        random(&mut rng, &[333]),
    ];
    let (a, ia) = run(&ci, &op, &inputs);
    let (b, ib) = run(&card, &op, &inputs);
    assert_eq!(a, b, "the card-sized build computes the same bits");
    let reference = op
        .reference(&inputs.iter().map(Tensor::to_f64).collect::<Vec<_>>())
        .expect("reference");
    let err = tandem::tensor::rel_error(&b[0].to_f64(), &reference[0]);
    assert!(err < 3e-2, "rel. error {err}");
    let (ca, cb) = (ia.cycles.expect("cycles"), ib.cycles.expect("cycles"));
    println!("ci build {ca} cycles, u55c build {cb} cycles");
    // 64 x the MACs a cycle: at least 16 x fewer cycles on this shape
    assert!(cb * 16 < ca, "u55c {cb} vs ci {ca} cycles");
    let metas: Vec<TensorMeta> = inputs.iter().map(Tensor::meta).collect();
    // the planner's estimate: the model's cycles at the clock plus the launch overhead
    let est = card
        .estimate(&op, &metas)
        .saturating_sub(card.launch_overhead());
    let device = ib.device_time.expect("device time");
    let rel = (est.as_secs_f64() - device.as_secs_f64()).abs() / device.as_secs_f64();
    assert!(rel < 0.01, "estimate {est:?} vs modelled {device:?}");
}

#[test]
fn the_u55c_profile_runs_attention_on_the_query_parallel_builds() {
    // TANDEM_FPGA_SIM_PROFILE=u55c: attention goes to the 2,048-MAC query-parallel builds
    // (modelled): the same bits as the one-row `ci` builds (the numerics do not depend on how
    // many rows run together), far fewer cycles, and the planner's estimate is the model's.
    let (ci, card) = (modelled(SimProfile::Ci), modelled(SimProfile::U55c));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2048);
    // Nkv up to the ci builds' 512 keys per launch: both profiles make one launch per group,
    // so the bits agree; past it (the last case) the ci builds split the keys into ranges
    // merged on the host (within a few LSB, not the same bits), the card builds hold 4,096
    // keys, so that case is checked against the f64 reference instead.
    for (causal, hq, hkv, nq, nkv, d) in [
        (true, 8, 2, 300, 300, 128),
        (false, 4, 4, 37, 500, 64),
        (true, 4, 1, 90, 40, 256),
        (false, 8, 2, 64, 3000, 128),
    ] {
        let op = Op::Attention(AttentionParams {
            causal,
            scale: None,
        });
        let inputs = vec![
            random(&mut rng, &[1, hq, nq, d]),
            random(&mut rng, &[1, hkv, nkv, d]),
            random(&mut rng, &[1, hkv, nkv, d]),
        ];
        let (a, ia) = run(&ci, &op, &inputs);
        let (b, ib) = run(&card, &op, &inputs);
        if nkv <= 512 {
            assert_eq!(a, b, "same bits, causal {causal} Nq {nq} Nkv {nkv} d {d}");
        } else {
            let reference = op
                .reference(&inputs.iter().map(Tensor::to_f64).collect::<Vec<_>>())
                .expect("reference");
            let err = tandem::tensor::rel_error(&b[0].to_f64(), &reference[0]);
            assert!(err < 3e-2, "Nkv {nkv}: rel. error {err}");
        }
        let (ca, cb) = (ia.cycles.expect("cycles"), ib.cycles.expect("cycles"));
        println!("attention Nq {nq} Nkv {nkv} d {d} causal {causal}: ci {ca}, u55c {cb} cycles");
        assert!(cb < ca, "u55c {cb} vs ci {ca} cycles");
        let metas: Vec<TensorMeta> = inputs.iter().map(Tensor::meta).collect();
        let est = card
            .estimate(&op, &metas)
            .saturating_sub(card.launch_overhead());
        let device = ib.device_time.expect("device time");
        let rel = (est.as_secs_f64() - device.as_secs_f64()).abs() / device.as_secs_f64();
        assert!(rel < 0.01, "estimate {est:?} vs modelled {device:?}");
    }
}

/// A simulated card's backend in modelled mode with the builds of `profile`.
fn modelled(profile: SimProfile) -> FpgaBackend {
    let card = CardInfo {
        kind: DeviceKind::FpgaSim,
        index: 0,
        name: "simulated card (model)".into(),
        memory_bytes: 4 << 30,
        details: Vec::new(),
    };
    let opts = FpgaOptions {
        sim_mode: SimMode::Model,
        sim_profile: profile,
        ..FpgaOptions::default()
    };
    FpgaBackend::new(card, opts, sim_factory()).with_model(model_factory())
}
