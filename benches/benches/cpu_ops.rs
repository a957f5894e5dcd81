//! criterion benches of every CPU op (f32 fast path, through `Op::run_cpu`) at a small and a
//! medium size. `cargo bench -p tandem-benches --bench cpu_ops -- --quick` for a fast pass.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ndarray::{ArrayD, IxDyn};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tandem::ops::{
    Activation, AttentionParams, LinearParams, MoeExpertsParams, MoeRouteParams, RmsNormParams,
    RopeParams, SplitHeadsParams,
};
use tandem::{Op, Tensor};

/// Uniform values in [-1, 1) of a shape.
fn rand_f32(rng: &mut StdRng, shape: &[usize]) -> Tensor {
    Tensor::from_f32(ArrayD::from_shape_simple_fn(IxDyn(shape), || {
        rng.gen_range(-1.0f32..1.0)
    }))
}

/// Benches `op` on `inputs` under `group/size`.
fn bench_op(c: &mut Criterion, group: &str, size: &str, op: &Op, inputs: &[Tensor]) {
    let refs: Vec<&Tensor> = inputs.iter().collect();
    if let Err(e) = op.run_cpu(&refs) {
        panic!("{group}/{size}: {e}");
    }
    let mut g = c.benchmark_group(group);
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    g.bench_function(BenchmarkId::from_parameter(size), |b| {
        b.iter(|| op.run_cpu(&refs))
    });
    g.finish();
}

fn attention(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(1);
    let op = Op::Attention(AttentionParams::default());
    // (name, B, Hq, Hkv, N, D), causal, Nq = Nkv.
    for (size, b, hq, hkv, n, d) in [
        ("small_b1_h4_n128_d64", 1, 4, 4, 128, 64),
        ("medium_b1_h8_kv2_n1024_d64", 1, 8, 2, 1024, 64),
    ] {
        let inputs = [
            rand_f32(&mut rng, &[b, hq, n, d]),
            rand_f32(&mut rng, &[b, hkv, n, d]),
            rand_f32(&mut rng, &[b, hkv, n, d]),
        ];
        bench_op(c, "attention", size, &op, &inputs);
    }
}

fn route_params(k: usize) -> MoeRouteParams {
    MoeRouteParams {
        top_k: k,
        renormalize: true,
        block_size: 16,
    }
}

fn moe_route(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(2);
    for (size, t, e, k) in [
        ("small_t64_e8_k2", 64, 8, 2),
        ("medium_t16384_e64_k8", 16384, 64, 8),
    ] {
        let op = Op::MoeRoute(route_params(k));
        bench_op(c, "moe_route", size, &op, &[rand_f32(&mut rng, &[t, e])]);
    }
}

fn moe_experts(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(3);
    for (size, t, h, f, e, k) in [
        ("small_t16_h64_f128_e8_k2", 16, 64, 128, 8, 2),
        ("medium_t256_h512_f1024_e8_k2", 256, 512, 1024, 8, 2),
    ] {
        let logits = rand_f32(&mut rng, &[t, e]);
        let routed = match Op::MoeRoute(route_params(k)).run_cpu(&[&logits]) {
            Ok(r) => r,
            Err(err) => panic!("routing for moe_experts/{size}: {err}"),
        };
        let inputs = [
            rand_f32(&mut rng, &[t, h]),
            routed[0].clone(),
            routed[1].clone(),
            routed[3].clone(),
            routed[4].clone(),
            rand_f32(&mut rng, &[e, 2 * f, h]),
            rand_f32(&mut rng, &[e, h, f]),
        ];
        let op = Op::MoeExperts(MoeExpertsParams {});
        bench_op(c, "moe_experts", size, &op, &inputs);
    }
}

fn linear(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(4);
    let op = Op::Linear(LinearParams {
        act: Activation::Gelu,
        bias: true,
    });
    for (size, m, k, n) in [
        ("small_m64_k256_n256", 64, 256, 256),
        ("medium_m512_k1024_n1024", 512, 1024, 1024),
    ] {
        let inputs = [
            rand_f32(&mut rng, &[m, k]),
            rand_f32(&mut rng, &[n, k]),
            rand_f32(&mut rng, &[n]),
        ];
        bench_op(c, "linear", size, &op, &inputs);
    }
}

fn rmsnorm(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(5);
    let op = Op::RmsNorm(RmsNormParams {
        eps: 1e-5,
        residual: true,
    });
    for (size, rows, h) in [
        ("small_64x1024", 64, 1024),
        ("medium_2048x4096", 2048, 4096),
    ] {
        let inputs = [
            rand_f32(&mut rng, &[rows, h]),
            rand_f32(&mut rng, &[h]),
            rand_f32(&mut rng, &[rows, h]),
        ];
        bench_op(c, "rmsnorm", size, &op, &inputs);
    }
}

fn rope(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(6);
    let op = Op::Rope(RopeParams::default());
    for (size, shape) in [
        ("small_1x8x128x64", [1, 8, 128, 64]),
        ("medium_2x32x1024x128", [2, 32, 1024, 128]),
    ] {
        bench_op(c, "rope", size, &op, &[rand_f32(&mut rng, &shape)]);
    }
}

fn elementwise_and_layout(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(7);
    for (size, rows, cols) in [
        ("small_128x512", 128, 512),
        ("medium_2048x4096", 2048, 4096),
    ] {
        let a = rand_f32(&mut rng, &[rows, cols]);
        let b = rand_f32(&mut rng, &[rows, cols]);
        bench_op(c, "add", size, &Op::Add, &[a.clone(), b]);
        let split = Op::SplitHeads(SplitHeadsParams { batch: 2, heads: 8 });
        bench_op(c, "split_heads", size, &split, std::slice::from_ref(&a));
        let heads = [2, 8, rows / 2, cols / 8];
        bench_op(
            c,
            "merge_heads",
            size,
            &Op::MergeHeads,
            &[rand_f32(&mut rng, &heads)],
        );
    }
}

criterion_group!(
    cpu_ops,
    attention,
    moe_route,
    moe_experts,
    linear,
    rmsnorm,
    rope,
    elementwise_and_layout
);
criterion_main!(cpu_ops);
