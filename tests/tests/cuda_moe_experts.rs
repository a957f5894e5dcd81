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
use tandem::backend::cuda::{CudaBackend, CudaOptions, MoeExpertsPath, MoeTileSize};
use tandem::ops::{MoeExpertsParams, MoeRouteParams};
use tandem::{Op, Tensor};
use tandem_tests::cuda::{
    backend as gpu, backend_with as gpu_with, check, clock_rng as rng, launch as run_gpu, options,
    rand_rounded as rand_t, round_to as round,
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
const PATHS: [(MoeExpertsPath, Option<MoeTileSize>); 5] = [
    (MoeExpertsPath::Grouped, Some(MoeTileSize::S)),
    (MoeExpertsPath::Grouped, Some(MoeTileSize::M)),
    (MoeExpertsPath::Grouped, Some(MoeTileSize::L)),
    (MoeExpertsPath::Blaslt, None),
    (MoeExpertsPath::Wgmma, None),
];

/// The options of the CUDA tests in `dt` with the path and tile forced.
fn on_path(dt: CudaDType, path: MoeExpertsPath, tile: Option<MoeTileSize>) -> CudaOptions {
    CudaOptions {
        moe_experts: Some(path),
        moe_tile: tile,
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
        for (path, tile) in PATHS {
            let Some(pb) = gpu_with(on_path(dt, path, tile)) else {
                return;
            };
            println!("  path {path} tile {tile:?}");
            let (out, kernel) = run_gpu(&pb, &op, &ins);
            match (path, tile) {
                (MoeExpertsPath::Wgmma, _) => {
                    let hopper = aligned && pb.arch() == 90;
                    assert_eq!(
                        kernel.contains(&format!("moe_ws_swiglu_{dt}"))
                            && kernel.contains(&format!("moe_ws_down_{dt}")),
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
    use Routing::*;
    // several m-tiles per expert for every tile (up to ~290 rows an expert), several n-tiles
    // (F 1000 -> 16 of the SwiGLU GEMM's 64 columns; H 520 -> 5 of 128) and k-tiles (K up to 1000).
    run_cases(
        "moe_experts tiles",
        &[
            case(577, 520, 4, 2, 1000, 16, Random),
            case(512, 256, 8, 2, 512, 16, AllToExpert0),
        ],
    );
}
