//! The CUDA experts op on every path against the f64 reference (`Op::reference`) on fresh
//! random inputs: the grouped kernels with each tile (`CudaOptions::moe_tile` = s, m, l) and
//! the cuBLASLt path (`CudaOptions::moe_experts` = blaslt) and the Hopper wgmma kernels
//! (`wgmma`; on other GPUs the request falls back and the case runs the default path), each on
//! a backend opened with that path forced. Cases: idle experts, one expert taking every
//! token, T = 1, T off the routing block, k = 1, 2 and E, hidden/ffn off the tile sizes (and off
//! multiples of 8, where the grouped request falls back to cuBLASLt), routing block sizes 1 to
//! 64, several m-, n- and k-tiles per expert, slots dropped from the permutation. Routing runs
//! on the GPU (its outputs feed the experts as in a layer). Outputs are poisoned (NaN) before
//! every launch; every case runs in both storage precisions, within 1e-2 (bf16) and 5e-3 (f16)
//! relative (Frobenius) error. Without a usable GPU each test prints "skipped: <reason>" and
//! returns.

use ndarray::ArrayD;
use rand_chacha::ChaCha8Rng;
use tandem::backend::CudaDType;
use tandem::backend::cuda::{CudaBackend, CudaOptions, MoeExpertsPath, MoeTileSize, MoeWsTile};
use tandem::ops::{MoeExpertsParams, MoeRouteParams};
use tandem::{Op, Tensor};
use tandem_tests::cuda::{
    alone, backend as gpu, backend_with as gpu_with, beside_others, check, clock_rng as rng,
    launch as run_gpu, options, rand_rounded as rand_t, round_to as round,
};

/// How the case routes its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Routing {
    /// Random logits.
    Random,
    /// Expert 0's logit far above the others for every token: it takes every token (as the
    /// first choice; with k > 1 the others share the rest).
    AllToExpert0,
    /// Random, then this many slots replaced by the sentinel in the permutation (a capacity
    /// drop): they must add nothing.
    Drop(usize),
}

#[derive(Debug, Clone, Copy)]
struct Case {
    t: usize,
    h: usize,
    e: usize,
    k: usize,
    f: usize,
    block: usize,
    routing: Routing,
}

const fn case(
    t: usize,
    h: usize,
    e: usize,
    k: usize,
    f: usize,
    block: usize,
    routing: Routing,
) -> Case {
    Case {
        t,
        h,
        e,
        k,
        f,
        block,
        routing,
    }
}

/// The experts path and tile of each path the cases run on.
/// Every path (the grouped kernels with each tile, cuBLASLt, the Hopper kernels with each
/// block).
const PATHS: [(MoeExpertsPath, Option<MoeTileSize>, Option<MoeWsTile>); 10] = [
    (MoeExpertsPath::Grouped, Some(MoeTileSize::S), None),
    (MoeExpertsPath::Grouped, Some(MoeTileSize::M), None),
    (MoeExpertsPath::Grouped, Some(MoeTileSize::L), None),
    (MoeExpertsPath::Blaslt, None, None),
    (MoeExpertsPath::Wgmma, None, Some(MoeWsTile::R128)),
    (MoeExpertsPath::Wgmma, None, Some(MoeWsTile::R128S4)),
    (MoeExpertsPath::Wgmma, None, Some(MoeWsTile::R192)),
    (MoeExpertsPath::Wgmma, None, Some(MoeWsTile::R192S4)),
    (MoeExpertsPath::Wgmma, None, Some(MoeWsTile::R128S4C2)),
    (MoeExpertsPath::Wgmma, None, Some(MoeWsTile::R192S4C2)),
];

/// The options of the CUDA tests in `dt` with the path, tile and Hopper block forced.
fn on_path(
    dt: CudaDType,
    path: MoeExpertsPath,
    tile: Option<MoeTileSize>,
    ws_tile: Option<MoeWsTile>,
) -> CudaOptions {
    CudaOptions {
        moe_experts: Some(path),
        moe_tile: tile,
        moe_ws_tile: ws_tile,
        ..options(dt)
    }
}

/// Routes random logits on the GPU and makes the experts' inputs for `c`.
fn inputs(be: &CudaBackend, dt: CudaDType, r: &mut ChaCha8Rng, c: &Case) -> Vec<Tensor> {
    let route = Op::MoeRoute(MoeRouteParams {
        top_k: c.k,
        renormalize: true,
        block_size: c.block,
    });
    let mut logits = rand_t(r, dt, &[c.t, c.e], 2.0);
    if c.routing == Routing::AllToExpert0 {
        let mut l = logits.as_f32().expect("f32").clone();
        l.index_axis_mut(ndarray::Axis(1), 0).fill(8.0);
        logits = Tensor::from_f32(l);
    }
    let (routed, _) = run_gpu(be, &route, &[logits]);
    let counts: Vec<i32> = routed[2].as_i32().expect("i32").iter().copied().collect();
    println!("  expert counts {counts:?}");
    match c.routing {
        Routing::AllToExpert0 => assert_eq!(counts[0] as usize, c.t, "expert 0 takes all"),
        Routing::Random if c.t * c.k < c.e => {
            assert!(counts.contains(&0), "some expert is idle")
        }
        _ => {}
    }
    let mut sorted = routed[3].clone();
    if let Routing::Drop(n) = c.routing {
        let sentinel = (c.t * c.k) as i32;
        let mut s: Vec<i32> = sorted.as_i32().expect("i32").iter().copied().collect();
        let real: Vec<usize> = (0..s.len()).filter(|&i| s[i] != sentinel).collect();
        for &i in real.iter().step_by((real.len() / n.max(1)).max(1)).take(n) {
            s[i] = sentinel;
        }
        sorted = Tensor::from_vec_i32(&[s.len()], s).expect("1-D");
    }
    // the routing weights as the GPU stores them once uploaded again
    let w = Tensor::from_f32(routed[1].as_f32().expect("f32").mapv(|x| round(dt, x)));
    vec![
        rand_t(r, dt, &[c.t, c.h], 1.0),
        routed[0].clone(),
        w,
        sorted,
        routed[4].clone(),
        rand_t(r, dt, &[c.e, 2 * c.f, c.h], 1.0 / (c.h as f32).sqrt()),
        rand_t(r, dt, &[c.e, c.h, c.f], 1.0 / (c.f as f32).sqrt()),
    ]
}

/// Runs every case on every path and checks each against the reference.
fn run_cases(tag: &str, cases: &[Case]) {
    for dt in CudaDType::ALL {
        run_cases_in(tag, dt, cases);
    }
}

fn run_cases_in(tag: &str, dt: CudaDType, cases: &[Case]) {
    let Some(be) = gpu(dt) else { return };
    let mut r = rng(tag);
    let op = Op::MoeExperts(MoeExpertsParams {});
    for c in cases {
        println!(
            " {dt} T{} H{} E{} k{} F{} block {} {:?}",
            c.t, c.h, c.e, c.k, c.f, c.block, c.routing
        );
        let ins = inputs(&be, dt, &mut r, c);
        let f64s: Vec<ArrayD<f64>> = ins.iter().map(|t| t.to_f64()).collect();
        let want = op.reference(&f64s).expect("reference");
        let aligned = c.h % 8 == 0 && c.f % 8 == 0;
        for (path, tile, ws_tile) in PATHS {
            let Some(pb) = gpu_with(on_path(dt, path, tile, ws_tile)) else {
                return;
            };
            println!("  path {path} tile {tile:?} {ws_tile:?}");
            let (out, kernel) = run_gpu(&pb, &op, &ins);
            match (path, tile) {
                (MoeExpertsPath::Wgmma, _) => {
                    let hopper = aligned && pb.arch() == 90;
                    let prefix = ws_tile.map_or("moe_ws", |r| r.block().prefix());
                    assert_eq!(
                        kernel.contains(&format!("{prefix}_swiglu_{dt}"))
                            && kernel.contains(&format!("{prefix}_down_{dt}")),
                        hopper,
                        "wgmma asked for on sm_{} (H {} F {}), ran {kernel}",
                        pb.arch(),
                        c.h,
                        c.f
                    );
                }
                (_, Some(t)) if aligned => {
                    assert!(
                        kernel.contains(&format!("moe_gemm_swiglu_{dt}_{t}"))
                            && kernel.contains(&format!("moe_gemm_down_{dt}_{t}")),
                        "expected the grouped kernels with tile {t}, ran {kernel}"
                    );
                    assert!(!kernel.contains("cublaslt"), "{kernel}");
                }
                _ => assert!(
                    kernel.contains("cublaslt"),
                    "expected cuBLASLt, ran {kernel}"
                ),
            }
            check("y", &out[0], &want[0], dt.tolerance());
        }
    }
}

#[test]
fn cuda_moe_experts_edge_cases() {
    let _beside = beside_others();
    use Routing::*;
    run_cases(
        "moe_experts edges",
        &[
            case(64, 128, 8, 2, 96, 16, Random),
            case(37, 64, 4, 3, 40, 16, Random), // T off the block, F off every tile
            case(1, 72, 4, 1, 24, 16, Random),  // T = 1, k = 1
            case(1, 64, 8, 8, 16, 16, Random),  // T = 1, k = E
            case(5, 64, 16, 2, 48, 16, Random), // 10 slots over 16 experts: idle experts
            case(70, 136, 4, 1, 88, 16, AllToExpert0), // one expert takes every token
            case(50, 64, 4, 2, 64, 16, AllToExpert0),
            case(33, 64, 4, 4, 48, 5, Random), // k = E, block 5: tiles straddle blocks
            case(40, 96, 6, 2, 40, 1, Random), // block 1: unpadded segments
            case(45, 80, 4, 2, 56, 64, Random), // block 64: padding > the s tile's 32 rows
            case(300, 200, 8, 2, 136, 16, Drop(7)), // dropped slots; H, F off the tiles
            case(20, 60, 4, 2, 36, 16, Random), // H, F not multiples of 8: cuBLASLt fallback
        ],
    );
}

#[test]
fn cuda_moe_experts_many_tiles() {
    let _beside = beside_others();
    use Routing::*;
    // several m-tiles per expert for every tile (up to ~290 rows an expert), several n-tiles
    // (F 1000 -> 16 of the SwiGLU GEMM's 64 columns; H 520 -> 5 of 128) and k-tiles (K up to 1000).
    run_cases(
        "moe_experts tiles",
        &[
            case(577, 520, 4, 2, 1000, 16, Random),
            case(512, 256, 8, 2, 512, 16, AllToExpert0),
            // more experts than one warp's step of the pair builds' unit table (32): 40
            // experts of ~300 rows (pairs and split tiles), 256 of ~6 (split tiles, idle experts)
            case(3000, 64, 40, 4, 40, 16, Random),
            case(200, 64, 256, 8, 48, 16, Random),
        ],
    );
}

/// With the stream held while each op queues (`CudaOptions::hold_stream`, what `run --explain`
/// and `calibrate` set), every path still gives the reference's output, and none of the holds
/// times out: the cuBLASLt path, which waits on the host for the segment offsets inside its op,
/// lets the stream go before it waits.
#[test]
fn cuda_moe_experts_on_a_held_stream() {
    let _alone = alone();
    let dt = CudaDType::Bf16;
    let Some(be) = gpu(dt) else { return };
    let mut r = rng("moe_experts held");
    let op = Op::MoeExperts(MoeExpertsParams {});
    let c = case(300, 200, 8, 2, 136, 16, Routing::Random);
    let ins = inputs(&be, dt, &mut r, &c);
    let f64s: Vec<ArrayD<f64>> = ins.iter().map(|t| t.to_f64()).collect();
    let want = op.reference(&f64s).expect("reference");
    for (path, tile, ws_tile) in PATHS {
        let opts = CudaOptions {
            hold_stream: true,
            ..on_path(dt, path, tile, ws_tile)
        };
        let Some(pb) = gpu_with(opts) else { return };
        println!("  held, path {path} tile {tile:?} {ws_tile:?}");
        let before = pb.holds_timed_out();
        let (out, kernel) = run_gpu(&pb, &op, &ins);
        check("y", &out[0], &want[0], dt.tolerance());
        assert_eq!(
            pb.holds_timed_out(),
            before,
            "a hold timed out on {kernel}: something in the op waited for the held stream"
        );
    }
}

/// Tolerance of the FP8 experts against the host model of what they compute: the storage
/// precision's rounding of h and y (2e-3 in bf16, 3e-4 in f16 on most cases, H100
/// 2026-11-27), and now and then an element of h whose device value (f32, fast exp) and model
/// value (f64) round to neighbouring e4m3 codes, 2^-4 of that element: up to 1.4e-2 seen on
/// the smallest cases (one token, F 16), where one element weighs most.
const FP8_MODEL_TOL: f64 = 3e-2;

/// The FP8 experts (`CudaOptions::moe_fp8`, Hopper only) on fresh random inputs with a zero
/// token row and a row 100x larger than the rest (scales from 0 to large), in both storage
/// precisions. Two checks each: against `tandem_tests::fp8::experts`, the f64 model of what
/// FP8 computes (operands quantized as the device quantizes them, byte for byte), within
/// [`FP8_MODEL_TOL`]; and against the f64 reference of the unquantized op within
/// `Numerics::Fp8`'s declared bound (1.5e-1; 4e-2 to 9e-2 measured). On sm_90 the e4m3 kernels must have run (off
/// Hopper the request falls back, and the case checks the fallback at the storage tolerance);
/// H or F not a multiple of 16 falls back to the 16-bit wgmma kernels.
#[test]
fn cuda_moe_experts_fp8() {
    let _beside = beside_others();
    use Routing::*;
    let cases = [
        case(64, 128, 8, 2, 96, 16, Random),
        case(37, 64, 4, 3, 48, 16, Random), // T off the block
        case(1, 64, 8, 8, 16, 16, Random),  // T = 1, k = E
        case(5, 64, 16, 2, 48, 16, Random), // idle experts
        case(50, 64, 4, 2, 64, 16, AllToExpert0),
        case(300, 208, 8, 2, 144, 16, Drop(7)), // K tails of the 128-byte stage, dropped slots
        case(577, 528, 4, 2, 1008, 16, Random), // several m-, n- and k-tiles
        case(20, 72, 4, 2, 40, 16, Random),     // H, F not multiples of 16: 16-bit wgmma
    ];
    let bound = tandem::backend::Numerics::Fp8.declared_bound();
    for dt in CudaDType::ALL {
        let opts = CudaOptions {
            moe_fp8: true,
            ..options(dt)
        };
        let Some(be) = gpu_with(opts) else { return };
        let hopper = be.arch() == 90;
        if !hopper {
            println!(
                "FP8 kernels skipped: they run on sm_90 only, this GPU is sm_{}; checking the \
                 fallback",
                be.arch()
            );
        }
        let mut r = rng("moe_experts fp8");
        let op = Op::MoeExperts(MoeExpertsParams {});
        for c in &cases {
            println!(
                " {dt} fp8 T{} H{} E{} k{} F{} {:?}",
                c.t, c.h, c.e, c.k, c.f, c.routing
            );
            let mut ins = inputs(&be, dt, &mut r, c);
            // a zero row and a large row
            let mut x = ins[0].as_f32().expect("f32").clone();
            if c.t > 2 {
                x.index_axis_mut(ndarray::Axis(0), 0).fill(0.0);
                x.index_axis_mut(ndarray::Axis(0), 1)
                    .mapv_inplace(|v| round(dt, v * 100.0));
            }
            ins[0] = Tensor::from_f32(x);
            let f64s: Vec<ArrayD<f64>> = ins.iter().map(|t| t.to_f64()).collect();
            let exact = op.reference(&f64s).expect("reference");
            let (out, kernel) = run_gpu(&be, &op, &ins);
            let fp8 = hopper && c.h % 16 == 0 && c.f % 16 == 0;
            assert_eq!(
                kernel.contains(&format!("_swiglu_e4m3_{dt}"))
                    && kernel.contains(&format!("_down_e4m3_{dt}")),
                fp8,
                "FP8 on sm_{} (H {} F {}), ran {kernel}",
                be.arch(),
                c.h,
                c.f
            );
            if !fp8 {
                check("y", &out[0], &exact[0], dt.tolerance());
                continue;
            }
            let v = |i: usize| -> Vec<f32> { ins[i].to_f64().iter().map(|&x| x as f32).collect() };
            let ids: Vec<i32> = ins[1].as_i32().expect("i32").iter().copied().collect();
            let mut present = vec![false; c.t * c.k];
            for &s in ins[3].as_i32().expect("i32").iter() {
                if s >= 0 && (s as usize) < present.len() {
                    present[s as usize] = true;
                }
            }
            let (x, w, gu, dn) = (v(0), v(2), v(5), v(6));
            let model = tandem_tests::fp8::experts(
                &tandem_tests::fp8::ExpertsInputs {
                    x: &x,
                    ids: &ids,
                    weights: &w,
                    present: &present,
                    gate_up: &gu,
                    down: &dn,
                    dims: (c.t, c.h, c.e, c.k, c.f),
                },
                |v| round(dt, v as f32),
            );
            check("y vs the FP8 model", &out[0], &model, FP8_MODEL_TOL);
            check(
                "y vs the unquantized f64 reference",
                &out[0],
                &exact[0],
                bound,
            );
        }
    }
}

/// The e4m3 copies of the expert weights are charged to the registry's memory accounts once,
/// at first use, and given back with the weights.
#[test]
fn cuda_moe_fp8_weight_copies_are_charged() {
    use std::sync::Arc;
    use tandem::backend::{Backend, DeviceRegistry, DeviceStorage};
    let _beside = beside_others();
    let dt = CudaDType::Bf16;
    let opts = CudaOptions {
        moe_fp8: true,
        ..options(dt)
    };
    let Some(shared) = gpu_with(opts.clone()) else {
        return;
    };
    if shared.arch() != 90 {
        println!(
            "skipped: the FP8 experts (and their e4m3 copies) run on sm_90 only, this GPU is sm_{}",
            shared.arch()
        );
        return;
    }
    // A backend of its own: one registry's accounts are attached to it.
    let be = Arc::new(CudaBackend::open(0, opts).expect("open cuda:0"));
    let mut reg = DeviceRegistry::cpu_only();
    reg.add(be.clone());
    let c = case(64, 128, 8, 2, 96, 16, Routing::Random);
    let ins = inputs(&shared, dt, &mut rng("moe_experts fp8 charge"), &c);
    let op = Op::MoeExperts(MoeExpertsParams {});
    let st: Vec<DeviceStorage> = ins
        .iter()
        .enumerate()
        .map(|(i, t)| be.upload_for(t, &op, i).expect("upload"))
        .collect();
    let refs: Vec<&DeviceStorage> = st.iter().collect();
    let used = || reg.memory().usage(be.id()).used;
    assert_eq!(used(), 0, "uploads outside a buffer are not charged");
    // gate_up [E, 2F, H] and down [E, H, F]: a byte an element and an f32 scale a row.
    let (e, h, f) = (c.e, c.h, c.f);
    let want = (e * 2 * f * (h + 4) + e * h * (f + 4)) as u64;
    for run in 0..2 {
        let l = be.launch(&op, &refs).expect("launch");
        l.done
            .wait(std::time::Duration::from_secs(120), op.name())
            .expect("kernel finished");
        let kernel = l.info.lock().expect("info").kernel.clone();
        assert!(kernel.contains("e4m3"), "ran {kernel}");
        assert_eq!(used(), want, "run {run}: the copies are charged once");
    }
    drop(refs);
    drop(st);
    assert_eq!(used(), 0, "the copies go with the weights");
}
