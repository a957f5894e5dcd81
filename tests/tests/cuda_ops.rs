//! Every CUDA kernel against the f64 reference (`Op::reference`) on fresh random inputs:
//! odd lengths, GQA/MQA ratios, causal with Nq != Nkv, ties in router logits. Each test is
//! written once and runs in both storage precisions (`per_dtype!`: `<test>::bf16` and
//! `<test>::f16`, each on its own backend of device 0). The reference sees the inputs rounded
//! as the GPU stores them; float results must be within 1e-2 (bf16) or 5e-3 (f16) relative
//! error, routing ids, counts and the permutation exact, and the kernels that ran must be
//! the ones of that precision. Outputs are poisoned (NaN) before every launch, so an
//! unwritten element fails. Without a usable GPU each test prints "skipped: <reason>" and
//! returns.

use ndarray::{ArrayD, IxDyn};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tandem::backend::Backend;
use tandem::backend::Support;
use tandem::backend::cuda::{AttentionVariant, CudaBackend, CudaDType, CudaOptions};
use tandem::ops::{
    Activation, AttentionParams, LinearParams, MoeExpertsParams, MoeRouteParams, RmsNormParams,
    RopeParams, SplitHeadsParams,
};
use tandem::tensor::rel_error;
use tandem::{DType, Op, Tensor, TensorMeta};
use tandem_tests::cuda::{
    backend as gpu, backend_with as gpu_with, check, clock_rng as rng, launch, options,
    rand_rounded as rand_t, round_to as rnd,
};

/// Each test once per storage precision: `mod <test> { fn bf16(); fn f16(); }`.
macro_rules! per_dtype {
    ($($case:ident),* $(,)?) => {
        $(
            mod $case {
                use super::*;
                #[test]
                fn bf16() {
                    if let Some(be) = gpu(CudaDType::Bf16) {
                        super::$case(&be, CudaDType::Bf16);
                    }
                }
                #[test]
                fn f16() {
                    if let Some(be) = gpu(CudaDType::F16) {
                        super::$case(&be, CudaDType::F16);
                    }
                }
            }
        )*
    };
}

per_dtype!(
    cuda_device_is_described,
    cuda_round_trip,
    cuda_add_split_merge,
    cuda_rmsnorm,
    cuda_rope,
    cuda_linear,
    cuda_router_logits_keep_near_ties,
    cuda_attention,
    cuda_moe_route,
    cuda_moe_experts,
);

/// The kernels that ran (names joined by '+') are those of storage `dt`: f16 runs no bf16
/// kernel and at least one f16 one; bf16 runs no f16 kernel.
fn assert_storage(kernel: &str, dt: CudaDType) {
    let ok = match dt {
        CudaDType::F16 => !kernel.contains("bf16") && kernel.contains("f16"),
        CudaDType::Bf16 => !kernel.replace("bf16", "").contains("f16"),
    };
    assert!(ok, "{dt} storage ran {kernel}");
}

/// Runs `op` on the GPU; checks the launch reports a kernel of the backend's precision and an
/// event-timed device time.
fn run_gpu(be: &CudaBackend, op: &Op, inputs: &[Tensor]) -> Vec<Tensor> {
    run_gpu_named(be, op, inputs).0
}

/// As [`run_gpu`], with the name of the kernel(s) that ran.
fn run_gpu_named(be: &CudaBackend, op: &Op, inputs: &[Tensor]) -> (Vec<Tensor>, String) {
    let (outs, kernel) = launch(be, op, inputs);
    assert_storage(&kernel, be.dtype());
    (outs, kernel)
}

fn reference(op: &Op, inputs: &[Tensor]) -> Vec<ArrayD<f64>> {
    let f: Vec<ArrayD<f64>> = inputs.iter().map(|t| t.to_f64()).collect();
    op.reference(&f).expect("reference")
}

fn exact(name: &str, out: &Tensor, want: &ArrayD<f64>) {
    let got = out.to_f64();
    assert_eq!(got.shape(), want.shape(), "{name}: shape");
    let bad: Vec<usize> = got
        .iter()
        .zip(want.iter())
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(i, _)| i)
        .take(8)
        .collect();
    assert!(bad.is_empty(), "{name}: differs at flat indices {bad:?}");
}

fn cuda_device_is_described(be: &CudaBackend, dt: CudaDType) {
    let i = be.info();
    println!("{} {:?} {} GiB", i.name, i.details, i.memory_bytes >> 30);
    assert!(i.memory_bytes > 0 && i.peak_flops > 0.0 && i.peak_bandwidth > 0.0);
    assert_eq!(i.compute_dtype, dt.dtype());
    let storage = i.details.iter().find(|(k, _)| k == "storage");
    assert_eq!(
        storage.map(|(_, v)| v.as_str()),
        Some(format!("{dt} (f32 accumulate)").as_str())
    );
    be.warm_up().expect("every module compiles");
}

/// Uploads keep values the storage holds exactly, round others to it, and download gives back
/// the logical dtype: f32 from f32, bf16/f16 host tensors as themselves.
fn cuda_round_trip(be: &CudaBackend, dt: CudaDType) {
    let mut r = rng("round_trip");
    let exact = rand_t(&mut r, dt, &[3, 17, 5], 4.0);
    let back = be
        .download(&be.upload(&exact).expect("upload"))
        .expect("download");
    assert_eq!(back, exact, "{dt}: stored values come back exactly");
    let raw = Tensor::from_vec_f32(&[4], vec![1.0 + 1.0 / 1024.0, 0.1, -3.3, 1e-3]).expect("shape");
    let back = be
        .download(&be.upload(&raw).expect("upload"))
        .expect("download");
    let want: Vec<f32> = raw
        .as_f32()
        .expect("f32")
        .iter()
        .map(|&x| rnd(dt, x))
        .collect();
    assert_eq!(
        back.as_f32()
            .expect("f32")
            .iter()
            .copied()
            .collect::<Vec<_>>(),
        want
    );
    for host in [raw.cast(tandem::DType::BF16), raw.cast(tandem::DType::F16)] {
        let back = be
            .download(&be.upload(&host).expect("upload"))
            .expect("download");
        assert_eq!(back.dtype(), host.dtype());
        let e = rel_error(&back.to_f64(), &host.to_f64());
        assert!(
            e < 4e-3,
            "{dt}: {} round trip rel err {e:.2e}",
            host.dtype()
        );
    }
    let ids = Tensor::from_vec_i32(&[3], vec![-7, 0, 1 << 30]).expect("shape");
    let back = be
        .download(&be.upload(&ids).expect("upload"))
        .expect("download");
    assert_eq!(back, ids);
}

fn cuda_add_split_merge(be: &CudaBackend, dt: CudaDType) {
    let mut r = rng("layout");
    for (b, t, h, d) in [
        (2usize, 37usize, 3usize, 64usize),
        (1, 5, 4, 6),
        (3, 1, 2, 8),
    ] {
        let a = rand_t(&mut r, dt, &[b * t, h * d], 1.0);
        let c = rand_t(&mut r, dt, &[b * t, h * d], 1.0);
        let out = run_gpu(be, &Op::Add, &[a.clone(), c.clone()]);
        check(
            "add",
            &out[0],
            &reference(&Op::Add, &[a.clone(), c])[0],
            dt.tolerance(),
        );
        let sp = Op::SplitHeads(SplitHeadsParams { batch: b, heads: h });
        let s = run_gpu(be, &sp, std::slice::from_ref(&a));
        exact(
            "split_heads",
            &s[0],
            &reference(&sp, std::slice::from_ref(&a))[0],
        );
        let m = run_gpu(be, &Op::MergeHeads, &s);
        exact("merge_heads", &m[0], &a.to_f64());
    }
}

fn cuda_rmsnorm(be: &CudaBackend, dt: CudaDType) {
    let mut r = rng("rmsnorm");
    for (rows, cols, residual) in [
        (7usize, 4096usize, false),
        (33, 8192, true),
        (5, 1000, false),
        (3, 77, true),
        (2, 40000, false),
    ] {
        let op = Op::RmsNorm(RmsNormParams {
            eps: 1e-5,
            residual,
        });
        let mut ins = vec![
            rand_t(&mut r, dt, &[rows, cols], 2.0),
            rand_t(&mut r, dt, &[cols], 1.0),
        ];
        if residual {
            ins.push(rand_t(&mut r, dt, &[rows, cols], 2.0));
        }
        println!(" rows {rows} cols {cols} residual {residual}");
        let out = run_gpu(be, &op, &ins);
        let want = reference(&op, &ins);
        check("y", &out[0], &want[0], dt.tolerance());
        if residual {
            check("sum", &out[1], &want[1], dt.tolerance());
        }
    }
}

fn cuda_rope(be: &CudaBackend, dt: CudaDType) {
    let mut r = rng("rope");
    for (b, h, t, d, off) in [
        (2usize, 3usize, 37usize, 128usize, 0usize),
        (1, 2, 300, 64, 4000),
        (1, 1, 9, 6, 3),
    ] {
        let op = Op::Rope(RopeParams {
            base: 10000.0,
            position_offset: off,
        });
        let x = rand_t(&mut r, dt, &[b, h, t, d], 1.0);
        println!(" [{b},{h},{t},{d}] offset {off}");
        let out = run_gpu(be, &op, std::slice::from_ref(&x));
        check("rope", &out[0], &reference(&op, &[x])[0], dt.tolerance());
    }
}

fn cuda_linear(be: &CudaBackend, dt: CudaDType) {
    let mut r = rng("linear");
    for (m, n, k, act, bias, f32_out) in [
        (37usize, 96usize, 64usize, Activation::Gelu, true, false),
        (128, 256, 512, Activation::Relu, true, false),
        (5, 64, 40, Activation::Silu, true, false),
        (64, 128, 256, Activation::None, false, false),
        (3, 8, 16, Activation::Gelu, false, false),
        // f32 output (router logits): f32 accumulators stored as they are
        (50, 64, 96, Activation::None, false, true),
        (33, 40, 72, Activation::Relu, true, true),
        // SiLU runs after the GEMM as a 16-bit kernel: the output stays 16-bit
        (5, 64, 40, Activation::Silu, true, true),
    ] {
        let op = Op::Linear(LinearParams { act, bias, f32_out });
        let mut ins = vec![
            rand_t(&mut r, dt, &[m, k], 1.0),
            rand_t(&mut r, dt, &[n, k], 1.0 / (k as f32).sqrt()),
        ];
        if bias {
            ins.push(rand_t(&mut r, dt, &[n], 0.5));
        }
        println!(" {m}x{n}x{k} {act:?} bias {bias} f32_out {f32_out}");
        let (out, kernel) = run_gpu_named(be, &op, &ins);
        let want = &reference(&op, &ins)[0];
        let f32_stored = f32_out && act != Activation::Silu;
        assert_eq!(kernel.contains("_f32out"), f32_stored, "ran {kernel}");
        // f32 storage: only the f32 accumulation's error (16-bit storage: ~4e-3 for bf16)
        let tol = if f32_stored { 1e-5 } else { dt.tolerance() };
        check("y", &out[0], want, tol);
    }
}

/// Router logits whose top experts differ by less than a bf16 step: stored in f32
/// (`f32_out`, as the layer's router_logits node asks), the routing picks the f32
/// reference's experts exactly; the same logits stored in 16 bits are printed for contrast.
fn cuda_router_logits_keep_near_ties(be: &CudaBackend, dt: CudaDType) {
    let mut r = rng("router near ties");
    let (t, e, h, k) = (50usize, 64usize, 64usize, 2usize);
    let x = rand_t(&mut r, dt, &[t, h], 1.0);
    // Experts in pairs: the odd one is the even one with one element a step of the storage
    // precision away, so the pair's logits differ by about 2^-11 of their size.
    let mut w = rand_t(&mut r, dt, &[e, h], 1.0 / (h as f32).sqrt())
        .as_f32()
        .expect("f32")
        .clone();
    for j in (0..e).step_by(2) {
        for c in 0..h {
            w[[j + 1, c]] = w[[j, c]];
        }
        let c = r.gen_range(0..h);
        let v = w[[j, c]];
        w[[j + 1, c]] = rnd(dt, v * (1.0 + 1.0 / 64.0));
    }
    let w = Tensor::from_f32(w);
    let route = Op::MoeRoute(MoeRouteParams {
        top_k: k,
        renormalize: true,
        block_size: 16,
    });
    // the reference: f64 logits (rounded to f32 only to be an input), then routing
    let lin = |f32_out| {
        Op::Linear(LinearParams {
            act: Activation::None,
            bias: false,
            f32_out,
        })
    };
    let exact_logits = reference(&lin(true), &[x.clone(), w.clone()])[0].mapv(|v| v as f32);
    let want = reference(&route, &[Tensor::from_f32(exact_logits)]);
    let mut flipped = 0;
    for f32_out in [true, false] {
        let (logits, kernel) = run_gpu_named(be, &lin(f32_out), &[x.clone(), w.clone()]);
        let (out, _) = launch(be, &route, &[logits[0].clone()]);
        if f32_out {
            assert!(kernel.contains("_f32out"), "ran {kernel}");
            check_route(&out, &want);
        } else {
            let got = out[0].to_f64();
            flipped = got
                .iter()
                .zip(want[0].iter())
                .filter(|(a, b)| a != b)
                .count();
        }
    }
    println!(
        "  {dt} logits: {flipped} of {} expert ids differ from the f32 reference",
        t * k
    );
}

/// LSE where the reference says -inf (rows that see no key) must be -inf too.
fn check_lse(out: &Tensor, want: &ArrayD<f64>) {
    let got = out.to_f64();
    let mut g = Vec::new();
    let mut w = Vec::new();
    for (a, b) in got.iter().zip(want.iter()) {
        if b.is_infinite() {
            assert!(a.is_infinite() && *a < 0.0, "lse: expected -inf, got {a}");
        } else {
            g.push(*a);
            w.push(*b);
        }
    }
    let e = rel_error(
        &ArrayD::from_shape_vec(IxDyn(&[g.len()]), g).expect("1-D"),
        &ArrayD::from_shape_vec(IxDyn(&[w.len()]), w).expect("1-D"),
    );
    println!("  lse: rel err {e:.2e}");
    assert!(e < 1e-3, "lse rel err {e:.3e}");
}

/// Every build of the kernel, in the storage precision of `be`, each on a backend opened with
/// that build forced ([`CudaOptions::attention_variant`]); each must run its own entry point
/// (`mha_{dt}_fwd_d{d}[_{variant}]`).
fn cuda_attention(be: &CudaBackend, dt: CudaDType) {
    let mut r = rng("attention");
    for (b, hq, hkv, nq, nkv, d, causal) in [
        (1usize, 4usize, 4usize, 37usize, 37usize, 64usize, true),
        (2, 8, 2, 100, 100, 128, false),
        (1, 4, 1, 17, 80, 64, true),
        (1, 2, 2, 80, 17, 128, true),
        (1, 8, 1, 129, 257, 128, false),
        (2, 4, 2, 1, 200, 64, true),
        (1, 6, 3, 200, 133, 64, true),
        (1, 2, 1, 256, 256, 128, true),
        (1, 4, 2, 300, 700, 128, true),
        (2, 2, 2, 513, 390, 64, true),
        (1, 2, 2, 1000, 1000, 128, false),
        (1, 2, 1, 450, 1000, 64, false),
        // more tiles than an H100 has multiprocessors: the persistent ws build's blocks take
        // several tiles each, carrying the K/V ring and the Q buffer over
        (2, 16, 4, 800, 800, 64, true),
        (1, 32, 8, 600, 700, 128, false),
        // and rows that see no key (Nq > Nkv, causal): tiles with no key tiles among the rest
        (4, 16, 2, 600, 100, 64, true),
        (2, 16, 4, 500, 200, 128, true),
        // head dim 256 (80-key tiles in the ws build): off every tile, GQA 4 and 8, more tiles
        // than multiprocessors, rows that see no key
        (1, 4, 2, 37, 53, 256, true),
        (2, 8, 2, 300, 300, 256, false),
        (1, 8, 1, 200, 700, 256, true),
        (2, 16, 4, 600, 500, 256, true),
        (2, 8, 2, 500, 100, 256, true),
    ] {
        for variant in AttentionVariant::ALL {
            if !variant.has_head_dim(d) {
                // the two-m-tile builds have no d256 kernel: forcing one is declined, saying so
                let op = Op::Attention(AttentionParams {
                    causal,
                    scale: None,
                });
                let metas = [
                    TensorMeta::new(vec![b, hq, nq, d], DType::F32),
                    TensorMeta::new(vec![b, hkv, nkv, d], DType::F32),
                    TensorMeta::new(vec![b, hkv, nkv, d], DType::F32),
                ];
                let Some(vb) = gpu_with(CudaOptions {
                    attention_variant: Some(variant),
                    ..options(dt)
                }) else {
                    return;
                };
                match vb.supports(&op, &metas) {
                    Support::No(why) => {
                        println!(" D{d} {variant}: declined as expected: {why}")
                    }
                    s => panic!("{variant} has no d{d} kernel but the backend says {s:?}"),
                }
                continue;
            }
            if variant == AttentionVariant::Ws
                && be
                    .info()
                    .details
                    .iter()
                    .all(|(k, v)| k != "compute capability" || v != "9.0")
            {
                println!(" {variant}: skipped (needs sm_90)");
                continue;
            }
            let Some(vb) = gpu_with(CudaOptions {
                attention_variant: Some(variant),
                ..options(dt)
            }) else {
                return;
            };
            let op = Op::Attention(AttentionParams {
                causal,
                scale: None,
            });
            let ins = vec![
                rand_t(&mut r, dt, &[b, hq, nq, d], 2.0),
                rand_t(&mut r, dt, &[b, hkv, nkv, d], 2.0),
                rand_t(&mut r, dt, &[b, hkv, nkv, d], 1.0),
            ];
            println!(
                " B{b} Hq{hq} Hkv{hkv} Nq{nq} Nkv{nkv} D{d} causal {causal} variant {variant}"
            );
            let (out, kernel) = run_gpu_named(&vb, &op, &ins);
            let want_kernel = match variant {
                AttentionVariant::W4 => format!("mha_{dt}_fwd_d{d}"),
                v => format!("mha_{dt}_fwd_d{d}_{v}"),
            };
            assert_eq!(kernel, want_kernel, "{dt} variant {variant}");
            let want = reference(&op, &ins);
            check("o", &out[0], &want[0], dt.tolerance());
            check_lse(&out[1], &want[1]);
        }
    }
}

/// Logits drawn from a few values, so many ties; rounded to `dt`.
fn tied_logits(r: &mut ChaCha8Rng, dt: CudaDType, t: usize, e: usize) -> Tensor {
    let levels = [-1.5f32, -0.25, 0.0, 0.5, 0.75, 1.0, 2.0];
    let v: Vec<f32> = (0..t * e)
        .map(|_| {
            if r.gen_bool(0.5) {
                levels[r.gen_range(0..levels.len())]
            } else {
                rnd(dt, r.gen_range(-3.0f32..3.0))
            }
        })
        .collect();
    Tensor::from_vec_f32(&[t, e], v).expect("shape")
}

fn check_route(out: &[Tensor], want: &[ArrayD<f64>]) {
    exact("topk_ids", &out[0], &want[0]);
    check("topk_weights", &out[1], &want[1], 1e-5);
    exact("expert_counts", &out[2], &want[2]);
    exact("sorted_token_ids", &out[3], &want[3]);
    exact("expert_offsets", &out[4], &want[4]);
    check("aux_loss", &out[5], &want[5], 1e-4);
    check("z_loss", &out[6], &want[6], 1e-4);
}

fn cuda_moe_route(be: &CudaBackend, dt: CudaDType) {
    let mut r = rng("moe_route");
    for (t, e, k, renorm, bs) in [
        (1000usize, 64usize, 8usize, true, 16usize),
        (5, 8, 2, false, 4),
        (333, 256, 1, true, 64),
        (64, 16, 4, true, 1),
        (4097, 128, 6, true, 128),
        (1, 3, 3, true, 16),
    ] {
        let op = Op::MoeRoute(MoeRouteParams {
            top_k: k,
            renormalize: renorm,
            block_size: bs,
        });
        let logits = tied_logits(&mut r, dt, t, e);
        println!(" T{t} E{e} k{k} renorm {renorm} block {bs}");
        // routing runs in f32 whatever the storage (its kernel names say f32, not dt)
        let (out, _) = launch(be, &op, std::slice::from_ref(&logits));
        check_route(&out, &reference(&op, &[logits]));
    }
}

fn cuda_moe_experts(be: &CudaBackend, dt: CudaDType) {
    let mut r = rng("moe_experts");
    for (t, h, e, k, f) in [
        (64usize, 128usize, 8usize, 2usize, 96usize),
        (37, 64, 4, 3, 40),
    ] {
        let route = Op::MoeRoute(MoeRouteParams {
            top_k: k,
            renormalize: true,
            block_size: 16,
        });
        let logits = rand_t(&mut r, dt, &[t, e], 2.0);
        let (routed, _) = launch(be, &route, &[logits]);
        let x = rand_t(&mut r, dt, &[t, h], 1.0);
        let gate_up = rand_t(&mut r, dt, &[e, 2 * f, h], 1.0 / (h as f32).sqrt());
        let down = rand_t(&mut r, dt, &[e, h, f], 1.0 / (f as f32).sqrt());
        // the weights as the GPU stores them (bf16 or f16)
        let w = Tensor::from_f32(routed[1].as_f32().expect("f32").mapv(|x| rnd(dt, x)));
        let ins = vec![
            x,
            routed[0].clone(),
            w,
            routed[3].clone(),
            routed[4].clone(),
            gate_up,
            down,
        ];
        let op = Op::MoeExperts(MoeExpertsParams {});
        println!(" T{t} H{h} E{e} k{k} F{f}");
        let out = run_gpu(be, &op, &ins);
        check("y", &out[0], &reference(&op, &ins)[0], dt.tolerance());
    }
}
