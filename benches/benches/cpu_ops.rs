//! criterion benches of every CPU op (f32 fast path, through `Op::run_cpu`) at a small and a
//! medium size, on inputs made by `tandem::bench::make_inputs` (the same seeded values and
//! routing `tandem bench` uses). `cargo bench -p tandem-benches --bench cpu_ops -- --quick`
//! for a fast pass.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tandem::bench::{MOE_BLOCK, make_inputs};
use tandem::ops::{
    Activation, AttentionParams, LinearParams, MoeExpertsParams, MoeRouteParams, RmsNormParams,
    RopeParams, SplitHeadsParams,
};
use tandem::{DType, Op, Tensor, TensorMeta};

/// f32 metas of these shapes.
fn f32s(shapes: &[&[usize]]) -> Vec<TensorMeta> {
    shapes
        .iter()
        .map(|s| TensorMeta::new(s, DType::F32))
        .collect()
}

/// Benches `op` under `group/size` on inputs shaped `metas` (seeded with `seed`).
fn bench_op(c: &mut Criterion, group: &str, size: &str, op: &Op, metas: &[TensorMeta], seed: u64) {
    let inputs: Vec<Tensor> =
        make_inputs(op, metas, seed).unwrap_or_else(|e| panic!("{group}/{size}: {e}"));
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
    let op = Op::Attention(AttentionParams::default());
    // (name, B, Hq, Hkv, N, D), causal, Nq = Nkv.
    for (size, b, hq, hkv, n, d) in [
        ("small_b1_h4_n128_d64", 1, 4, 4, 128, 64),
        ("medium_b1_h8_kv2_n1024_d64", 1, 8, 2, 1024, 64),
    ] {
        let metas = f32s(&[&[b, hq, n, d], &[b, hkv, n, d], &[b, hkv, n, d]]);
        bench_op(c, "attention", size, &op, &metas, 1);
    }
}

fn route_params(k: usize) -> MoeRouteParams {
    MoeRouteParams {
        top_k: k,
        renormalize: true,
        block_size: MOE_BLOCK,
    }
}

fn moe_route(c: &mut Criterion) {
    for (size, t, e, k) in [
        ("small_t64_e8_k2", 64, 8, 2),
        ("medium_t16384_e64_k8", 16384, 64, 8),
    ] {
        let op = Op::MoeRoute(route_params(k));
        bench_op(c, "moe_route", size, &op, &f32s(&[&[t, e]]), 2);
    }
}

fn moe_experts(c: &mut Criterion) {
    for (size, t, h, f, e, k) in [
        ("small_t16_h64_f128_e8_k2", 16, 64, 128, 8, 2),
        ("medium_t256_h512_f1024_e8_k2", 256, 512, 1024, 8, 2),
    ] {
        let i32s = |s: Vec<usize>| TensorMeta::new(s, DType::I32);
        let metas = vec![
            TensorMeta::new(vec![t, h], DType::F32),
            i32s(vec![t, k]),
            TensorMeta::new(vec![t, k], DType::F32),
            i32s(vec![route_params(k).padded_len(t, e)]),
            i32s(vec![e + 1]),
            TensorMeta::new(vec![e, 2 * f, h], DType::F32),
            TensorMeta::new(vec![e, h, f], DType::F32),
        ];
        let op = Op::MoeExperts(MoeExpertsParams {});
        bench_op(c, "moe_experts", size, &op, &metas, 3);
    }
}

fn linear(c: &mut Criterion) {
    let op = Op::Linear(LinearParams {
        act: Activation::Gelu,
        bias: true,
        f32_out: false,
    });
    for (size, m, k, n) in [
        ("small_m64_k256_n256", 64, 256, 256),
        ("medium_m512_k1024_n1024", 512, 1024, 1024),
    ] {
        bench_op(c, "linear", size, &op, &f32s(&[&[m, k], &[n, k], &[n]]), 4);
    }
}

fn rmsnorm(c: &mut Criterion) {
    let op = Op::RmsNorm(RmsNormParams {
        eps: 1e-5,
        residual: true,
    });
    for (size, rows, h) in [
        ("small_64x1024", 64, 1024),
        ("medium_2048x4096", 2048, 4096),
    ] {
        let metas = f32s(&[&[rows, h], &[h], &[rows, h]]);
        bench_op(c, "rmsnorm", size, &op, &metas, 5);
    }
}

fn rope(c: &mut Criterion) {
    let op = Op::Rope(RopeParams::default());
    for (size, shape) in [
        ("small_1x8x128x64", [1, 8, 128, 64]),
        ("medium_2x32x1024x128", [2, 32, 1024, 128]),
    ] {
        bench_op(c, "rope", size, &op, &f32s(&[&shape]), 6);
    }
}

fn elementwise_and_layout(c: &mut Criterion) {
    for (size, rows, cols) in [
        ("small_128x512", 128, 512),
        ("medium_2048x4096", 2048, 4096),
    ] {
        let two_d = f32s(&[&[rows, cols]]);
        bench_op(
            c,
            "add",
            size,
            &Op::Add,
            &f32s(&[&[rows, cols], &[rows, cols]]),
            7,
        );
        let split = Op::SplitHeads(SplitHeadsParams { batch: 2, heads: 8 });
        bench_op(c, "split_heads", size, &split, &two_d, 8);
        let heads = f32s(&[&[2, 8, rows / 2, cols / 8]]);
        bench_op(c, "merge_heads", size, &Op::MergeHeads, &heads, 9);
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
