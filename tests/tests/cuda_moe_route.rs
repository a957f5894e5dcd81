//! CUDA routing (`moe_route`) against the f64 reference on f32 logits, in both storage
//! precisions: the logits are uploaded for the op (`Backend::upload_for`), so they stay f32 on
//! the device and the ids must equal the f32 reference's exactly, near-ties one f32 ulp apart
//! included (bf16 or f16 storage would merge them). Cases: constructed equal logits (whole
//! rows, the k-th place, -0 against +0), idle experts, one expert taking every token, T = 0 and
//! 1, k = 1..8 (and 33, 40, 256: more places than lanes), E from 1 to 256 (each build of the fused kernel: 1, 2, 4 and 8 logits per
//! lane), renormalise on and off, block sizes 1 to 256, and the benchmark shapes (many
//! blocks of the persistent grid). The logits stored in the storage precision (a plain
//! upload: what a router linear on the GPU hands over) run the bf16/f16 builds, checked
//! against the reference on the rounded logits. Outputs are poisoned before every launch
//! (an unwritten id or weight fails). Without a usable GPU each test prints "skipped:
//! <reason>" and returns.

use ndarray::ArrayD;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tandem::backend::cuda::{CudaBackend, CudaDType, CudaOptions, RouteKernel};
use tandem::backend::{Backend, DeviceStorage};
use tandem::ops::MoeRouteParams;
use tandem::{Op, Tensor};
use tandem_tests::cuda::{
    backend as gpu, backend_with, check, clock_rng as rng, launch, options, round_to,
};

fn route(k: usize, renormalize: bool, block_size: usize) -> Op {
    Op::MoeRoute(MoeRouteParams {
        top_k: k,
        renormalize,
        block_size,
    })
}

fn reference(op: &Op, logits: &Tensor) -> Vec<ArrayD<f64>> {
    op.reference(&[logits.to_f64()]).expect("reference")
}

fn exact(name: &str, out: &Tensor, want: &ArrayD<f64>) {
    let got = out.to_f64();
    assert_eq!(got.shape(), want.shape(), "{name}: shape");
    let bad: Vec<(usize, f64, f64)> = got
        .iter()
        .zip(want.iter())
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(i, (a, b))| (i, *a, *b))
        .take(8)
        .collect();
    assert!(bad.is_empty(), "{name}: (index, got, want) differ: {bad:?}");
}

/// Every output against the reference: ids, counts, permutation and offsets exact; weights
/// within 1e-5, losses within 1e-4 (f32 sums in another order).
fn check_route(out: &[Tensor], want: &[ArrayD<f64>]) {
    exact("topk_ids", &out[0], &want[0]);
    check("topk_weights", &out[1], &want[1], 1e-5);
    exact("expert_counts", &out[2], &want[2]);
    exact("sorted_token_ids", &out[3], &want[3]);
    exact("expert_offsets", &out[4], &want[4]);
    check("aux_loss", &out[5], &want[5], 1e-4);
    check("z_loss", &out[6], &want[6], 1e-4);
}

/// Runs routing on f32 logits (kept f32 on the device) and checks it; returns the kernels.
fn run_f32(be: &CudaBackend, op: &Op, logits: &Tensor) -> String {
    let (out, kernel) = launch(be, op, std::slice::from_ref(logits));
    assert!(kernel.contains("_f32"), "f32 logits ran {kernel}");
    check_route(&out, &reference(op, logits));
    kernel
}

/// How a case's logits are made.
#[derive(Debug, Clone, Copy)]
enum Logits {
    /// Uniform in [-3, 3).
    Random,
    /// Half the entries from a few levels (many exact ties), the rest uniform.
    Tied,
    /// Pairs of experts one f32 ulp apart (bf16 and f16 round them to one value).
    NearTies,
    /// Expert E-1 far above the rest for every token, so it takes every token.
    OneExpert,
    /// Only the first k experts get tokens (the others far below): idle experts.
    Idle,
}

fn logits(r: &mut ChaCha8Rng, kind: Logits, t: usize, e: usize, k: usize) -> Tensor {
    let levels = [-1.5f32, -0.25, -0.0, 0.0, 0.5, 0.75, 2.0];
    let mut v = vec![0f32; t * e];
    for (i, x) in v.iter_mut().enumerate() {
        let ex = i % e;
        *x = match kind {
            Logits::Random => r.gen_range(-3.0f32..3.0),
            Logits::Tied if r.gen_bool(0.5) => levels[r.gen_range(0..levels.len())],
            Logits::Tied => r.gen_range(-3.0f32..3.0),
            Logits::NearTies => {
                // experts 2i and 2i+1: a value and the next f32 above it, in random order
                let base = 1.0f32 + (r.gen_range(0..8) as f32) * 0.125;
                let up = f32::from_bits(base.to_bits() + 1);
                if ex.is_multiple_of(2) ^ r.gen_bool(0.5) {
                    base
                } else {
                    up
                }
            }
            Logits::OneExpert if ex == e - 1 => 20.0,
            Logits::OneExpert => r.gen_range(-3.0f32..3.0),
            Logits::Idle if ex < k => r.gen_range(5.0f32..6.0),
            Logits::Idle => r.gen_range(-30.0f32..-20.0),
        };
    }
    Tensor::from_vec_f32(&[t, e], v).expect("shape")
}

#[test]
fn route_f32_logits_match_the_reference_exactly() {
    for dt in CudaDType::ALL {
        let Some(be) = gpu(dt) else { return };
        let mut r = rng("cuda_moe_route");
        use Logits::*;
        for (t, e, k, renorm, bs, kind) in [
            (0usize, 8usize, 2usize, true, 16usize, Random),
            (1, 1, 1, true, 16, Random),
            (1, 3, 3, false, 16, Tied),
            (1, 256, 8, true, 64, NearTies),
            (5, 8, 2, false, 4, Tied),
            (64, 16, 4, true, 1, Tied),
            (100, 31, 5, true, 8, NearTies),
            (333, 32, 7, false, 16, Random),
            (257, 33, 8, true, 16, Tied),
            (1000, 64, 8, true, 16, NearTies),
            (999, 100, 6, false, 32, Tied),
            (4097, 128, 6, true, 128, Tied),
            (2000, 200, 3, true, 256, Random),
            (3000, 256, 1, true, 64, Tied),
            (777, 64, 2, true, 16, OneExpert),
            (777, 256, 8, false, 16, OneExpert),
            (1500, 128, 4, true, 16, Idle),
            (40, 64, 8, true, 16, Idle),
            (50, 64, 40, true, 16, Tied),
            (7, 256, 256, false, 16, Random),
            (9, 100, 33, true, 4, NearTies),
        ] {
            let op = route(k, renorm, bs);
            let l = logits(&mut r, kind, t, e, k);
            println!(" {dt}: T{t} E{e} k{k} renorm {renorm} block {bs} {kind:?}");
            run_f32(&be, &op, &l);
        }
    }
}

#[test]
fn route_every_k_from_1_to_8() {
    for dt in CudaDType::ALL {
        let Some(be) = gpu(dt) else { return };
        let mut r = rng("cuda_moe_route k");
        for k in 1..=8 {
            for e in [k, 8, 64, 256] {
                if e < k {
                    continue;
                }
                for renorm in [true, false] {
                    let op = route(k, renorm, 16);
                    let l = logits(&mut r, Logits::Tied, 300, e, k);
                    println!(" {dt}: T300 E{e} k{k} renorm {renorm}");
                    run_f32(&be, &op, &l);
                }
            }
        }
    }
}

/// Rows of equal logits and a -0/+0 tie: the lower expert wins, as in the f32 reference.
#[test]
fn route_constructed_ties_pick_the_lower_expert() {
    let Some(be) = gpu(CudaDType::Bf16) else {
        return;
    };
    let e = 64;
    let mut rows: Vec<f32> = Vec::new();
    rows.extend(vec![0.5f32; e]); // all equal: experts 0..k
    let mut r2 = vec![-1.0f32; e];
    r2[40] = -0.0;
    r2[9] = 0.0; // -0 at 40 ties +0 at 9: 9 first
    r2[50] = 0.0; // and 50 after 9 (ties keep index order)
    rows.extend(r2);
    let mut r3 = vec![0.0f32; e];
    for (i, x) in r3.iter_mut().enumerate() {
        *x = if i % 3 == 0 { 1.0 } else { -(i as f32) };
    }
    rows.extend(r3); // the 1.0s at 0, 3, 6, ... tie
    let l = Tensor::from_vec_f32(&[3, e], rows).expect("shape");
    let op = route(4, true, 16);
    let (out, _) = launch(&be, &op, std::slice::from_ref(&l));
    let ids: Vec<i32> = out[0].as_i32().expect("ids").iter().copied().collect();
    assert_eq!(ids, vec![0, 1, 2, 3, 9, 40, 50, 0, 0, 3, 6, 9], "tie order");
    check_route(&out, &reference(&op, &l));
}

/// Near-ties one f32 ulp apart: the f32 logits pick the larger one; the storage precision
/// would round both to one value (this is what keeping the logits f32 buys).
#[test]
fn route_near_ties_follow_the_f32_logits() {
    for dt in CudaDType::ALL {
        let Some(be) = gpu(dt) else { return };
        let e = 64;
        let base = 1.25f32;
        let up = f32::from_bits(base.to_bits() + 1);
        assert_eq!(
            round_to(dt, base),
            round_to(dt, up),
            "the pair rounds to one value"
        );
        let mut row = vec![-2.0f32; e];
        row[5] = base;
        row[37] = up; // the larger, at the higher index
        let l = Tensor::from_vec_f32(&[1, e], row).expect("shape");
        let op = route(1, true, 16);
        let (out, _) = launch(&be, &op, std::slice::from_ref(&l));
        let ids: Vec<i32> = out[0].as_i32().expect("ids").iter().copied().collect();
        assert_eq!(ids, vec![37], "{dt}");
        check_route(&out, &reference(&op, &l));
    }
}

/// Logits stored in the storage precision (a plain upload, as a router linear's output on the
/// GPU would be) run the bf16/f16 builds: exact against the reference on the rounded logits.
#[test]
fn route_half_stored_logits() {
    for dt in CudaDType::ALL {
        let Some(be) = gpu(dt) else { return };
        let mut r = rng("cuda_moe_route half");
        for (t, e, k) in [(1usize, 8usize, 2usize), (999, 64, 8), (4097, 256, 6)] {
            let l = logits(&mut r, Logits::Tied, t, e, k);
            let rounded = Tensor::from_f32(l.as_f32().expect("f32").mapv(|x| round_to(dt, x)));
            let op = route(k, true, 16);
            let st: DeviceStorage = be.upload(&rounded).expect("upload");
            let launched = be.launch(&op, &[&st]).expect("launch");
            launched
                .done
                .wait(std::time::Duration::from_secs(120), "moe_route")
                .expect("finished");
            let kernel = launched.info.lock().expect("info").kernel.clone();
            assert!(
                kernel.contains(&format!("_{dt}_")),
                "{dt} logits ran {kernel}"
            );
            let out: Vec<Tensor> = launched
                .outputs
                .iter()
                .map(|s| be.download(s).expect("download"))
                .collect();
            println!(" {dt} logits: T{t} E{e} k{k}: {kernel}");
            check_route(&out, &reference(&op, &rounded));
        }
    }
}

/// The benchmark shapes (issue 15), checked: many blocks of the persistent grid, each expert's
/// segment assembled from every block.
#[test]
fn route_benchmark_shapes() {
    let Some(be) = gpu(CudaDType::Bf16) else {
        return;
    };
    let mut r = rng("cuda_moe_route bench shapes");
    for (t, e, k) in [
        (16384usize, 8usize, 2usize),
        (16384, 64, 8),
        (65536, 128, 8),
        (8192, 256, 8),
    ] {
        let op = route(k, true, 16);
        let l = logits(&mut r, Logits::Random, t, e, k);
        println!(" T{t} E{e} k{k}");
        let kernel = run_f32(&be, &op, &l);
        assert!(kernel.contains("moe_route_fused"), "{kernel}");
    }
}

/// Every routing kernel choice (`TANDEM_ROUTE_KERNEL`: the self-resetting barrier at up to 4
/// and 2 blocks per multiprocessor, the memset one, three launches) on the same cases, each
/// launched many times back to back on one backend: the `_g` builds' barrier word must come
/// back to its start after every launch (a word left off would hang or release early and
/// misplace slots). Also the bench shapes, checked, under every choice.
#[test]
fn route_every_kernel_choice() {
    let mut r = rng("cuda_moe_route kernels");
    use Logits::*;
    for choice in RouteKernel::ALL {
        let Some(be) = backend_with(CudaOptions {
            route_kernel: Some(choice),
            ..options(CudaDType::Bf16)
        }) else {
            return;
        };
        let mut cases = vec![
            (1usize, 256usize, 8usize, true, 16usize, Tied),
            (3, 8, 2, true, 16, Random),
            (999, 64, 8, false, 16, NearTies),
            (2048, 256, 8, true, 16, Tied),
            (4097, 128, 6, true, 64, OneExpert),
            (1500, 128, 4, true, 16, Idle),
            (16384, 8, 2, true, 16, Random),
            (16384, 64, 8, true, 16, Random),
            (65536, 128, 8, true, 16, Random),
            (8192, 256, 8, true, 16, Random),
        ];
        if choice != RouteKernel::Three {
            cases.push((50, 64, 40, true, 16, Tied)); // k > 32: fused only
        }
        for (t, e, k, renorm, bs, kind) in cases {
            let op = route(k, renorm, bs);
            let l = logits(&mut r, kind, t, e, k);
            for rep in 0..3 {
                println!(" {choice}: T{t} E{e} k{k} renorm {renorm} block {bs} {kind:?} #{rep}");
                let kernel = run_f32(&be, &op, &l);
                let fused = kernel.contains("moe_route_fused");
                match choice {
                    RouteKernel::Three => assert!(!fused, "{kernel}"),
                    RouteKernel::FusedMemset => {
                        assert!(kernel.starts_with("memset_d8+"), "{kernel}")
                    }
                    _ => assert!(
                        fused && kernel.contains("_g(") && !kernel.contains("memset"),
                        "{kernel}"
                    ),
                }
                if choice == RouteKernel::Fused2 {
                    assert!(
                        kernel.contains(", 1/SM)") || kernel.contains(", 2/SM)"),
                        "{kernel}"
                    );
                }
                if choice == RouteKernel::Fused1 {
                    assert!(kernel.contains(", 1/SM)"), "{kernel}");
                }
            }
        }
    }
}
