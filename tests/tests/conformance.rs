//! The conformance suite every backend runs: written once, instantiated per device kind
//! (cpu, cuda in both storage precisions bf16 and f16, fpga-sim, an Alveo board through XRT). Each case uploads fresh random inputs, launches the op through the
//! `Backend` trait, waits with a timeout, downloads, and compares with the f64 reference at
//! the device's precision. A device that is missing, or lacks an op, says so (printed) and
//! the case returns: it never passes silently.

use std::time::Duration;

use ndarray::{ArrayD, IxDyn};
use rand::Rng;
use tandem::backend::{Backend, CudaDType, DeviceKind, Support};
use tandem::ops::{
    Activation, AttentionParams, EmbeddingParams, LinearParams, MoeExpertsParams, MoeRouteParams,
    Op, RmsNormParams, RopeParams, SplitHeadsParams,
};
use tandem::tensor::rel_error;
use tandem::{DType, Tensor};
use tandem_tests::{TestResult, cuda_or_skip, device_or_skip, rng, uniform};

/// A device the suite runs on.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// The first device of a kind (the CPU, the FPGA simulation).
    Kind(DeviceKind),
    /// The first CUDA device, storing in this precision.
    Cuda(CudaDType),
}

fn device(t: Target) -> Option<std::sync::Arc<dyn Backend>> {
    match t {
        Target::Kind(kind) => device_or_skip(kind),
        Target::Cuda(dtype) => {
            let b = cuda_or_skip(dtype)?;
            assert_eq!(
                b.info().compute_dtype,
                dtype.dtype(),
                "storage of {}",
                b.id()
            );
            Some(b)
        }
    }
}

/// How close an output must be to the f64 reference.
#[derive(Debug, Clone, Copy)]
enum Bound {
    /// ||out - ref|| / ||ref|| below this.
    Rel(f64),
    /// Every element within this of the reference.
    Abs(f64),
}

/// The bound of output `name` of `op` on `b`, from the device's precision with a stated
/// margin:
/// - CPU, f32 math: 1e-5 (f32's unit roundoff 6e-8 grown by sums over up to a few hundred
///   terms, with margin);
/// - GPU, bf16 or f16 storage with f32 accumulation: `CudaDType::tolerance` (1e-2, 5e-3: the
///   storage's unit roundoff 2^-9 / 2^-12 on inputs and outputs, times a few);
/// - FPGA, int8/int16 fixed point, the bounds docs/FPGA.md derives for each kernel: router
///   weights within 4e-3 each (Q7.8 logits, Q0.15 weights); routing losses are computed on
///   the host in f64 from the f32 logits and the kernel's exact counts (1e-6); attention o
///   within 3% and lse within 0.05; linear (int8 GEMM, int8 output) within 3%.
fn bound(b: &dyn Backend, op: &Op, name: &str) -> Bound {
    match b.info().compute_dtype {
        DType::F32 => Bound::Rel(1e-5),
        DType::BF16 => Bound::Rel(CudaDType::Bf16.tolerance()),
        DType::F16 => Bound::Rel(CudaDType::F16.tolerance()),
        DType::I8 | DType::I32 => match (op.name(), name) {
            ("moe_route", "topk_weights") => Bound::Abs(4e-3),
            ("moe_route", _) => Bound::Rel(1e-6),
            ("attention", "lse") => Bound::Abs(0.05),
            _ => Bound::Rel(3e-2),
        },
    }
}

/// What a case expects of a device kind: every op runs, unless listed here with (a part of)
/// the reason the device gives. A listed op that the device runs after all fails too, so the
/// list stays true.
fn expected_decline(b: &dyn Backend, op: &Op, head_dim: Option<usize>) -> Option<&'static str> {
    if b.id().kind == DeviceKind::Cuda {
        return match op {
            Op::Attention(_) if !head_dim.is_some_and(|d| [64, 128, 256].contains(&d)) => {
                Some("(64, 128 and 256 are supported)")
            }
            Op::Embedding(_) => Some("no CUDA kernel for the embedding lookup"),
            _ => None,
        };
    }
    if !matches!(b.id().kind, DeviceKind::FpgaSim | DeviceKind::FpgaXrt) {
        return None;
    }
    match op {
        // the GEMM + vecops launch sequence keeps its intermediates on one card
        Op::MoeExperts(_) if b.id().kind == DeviceKind::FpgaXrt => Some("a board needs one xclbin"),
        Op::Embedding(_) => Some("no FPGA kernel for"),
        Op::Linear(p) if matches!(p.act, Activation::Gelu | Activation::Silu) => Some("ReLU only"),
        _ => None,
    }
}

/// Runs `op` on `b` and checks it against the f64 reference. A decline is a failure unless
/// [`expected_decline`] lists it (then its reason is checked and printed).
fn check(b: &dyn Backend, op: &Op, inputs: &[Tensor]) -> TestResult {
    let metas: Vec<_> = inputs.iter().map(Tensor::meta).collect();
    let want_metas = op.validate(&metas)?;
    let head_dim = metas.first().and_then(|m| m.shape.last()).copied();
    match (b.supports(op, &metas), expected_decline(b, op, head_dim)) {
        (Support::No(why), Some(reason)) => {
            assert!(
                why.contains(reason),
                "{} declines {} with '{why}', expected a reason containing '{reason}'",
                b.id(),
                op.name()
            );
            println!("expected decline: {} has no {}: {why}", b.id(), op.name());
            return Ok(());
        }
        (Support::No(why), None) => {
            panic!("{} declines {} ({metas:?}): {why}", b.id(), op.name())
        }
        (Support::Native, Some(reason)) => panic!(
            "{} now runs {} ({metas:?}), listed as declined ('{reason}'): update the list",
            b.id(),
            op.name()
        ),
        (Support::Native, None) => {}
    }
    let stored = inputs
        .iter()
        .map(|t| b.upload(t))
        .collect::<tandem::Result<Vec<_>>>()?;
    let refs: Vec<_> = stored.iter().collect();
    let launch = b.launch(op, &refs)?;
    launch.done.wait(
        Duration::from_secs(300),
        &format!("{} on {}", op.name(), b.id()),
    )?;
    let outs = launch
        .outputs
        .iter()
        .map(|s| b.download(s))
        .collect::<tandem::Result<Vec<_>>>()?;
    // What the device computed from: its own rounding of the inputs.
    let seen: Vec<ArrayD<f64>> = stored
        .iter()
        .map(|s| b.download(s).map(|t| t.to_f64()))
        .collect::<tandem::Result<_>>()?;
    let refs = op.reference(&seen)?;
    assert_eq!(outs.len(), want_metas.len(), "{}: output count", op.name());
    for ((o, r), (m, name)) in outs
        .iter()
        .zip(&refs)
        .zip(want_metas.iter().zip(op.output_names()))
    {
        assert_eq!(&o.meta(), m, "{} output {name}: meta", op.name());
        let got = o.to_f64();
        if m.dtype == DType::I32 {
            assert_eq!(&got, r, "{} on {}: {name} differs", op.name(), b.id());
            continue;
        }
        assert!(got.iter().all(|v| !v.is_nan()), "{name} has NaN");
        // rel_error takes equal infinities (lse of a row that sees no key) as exact and any
        // other non-finite difference as NaN, which fails both bounds below.
        match bound(b, op, name) {
            Bound::Rel(tol) => {
                let e = rel_error(&got, r);
                assert!(
                    e < tol,
                    "{} on {}: {name} rel. error {e:.3e}, bound {tol:.0e}",
                    op.name(),
                    b.id()
                );
            }
            Bound::Abs(tol) => {
                let worst = got
                    .iter()
                    .zip(r.iter())
                    .map(|(a, b)| if a == b { 0.0 } else { (a - b).abs() })
                    .fold(0.0f64, |m, v| if v.is_nan() { f64::NAN } else { m.max(v) });
                assert!(
                    worst <= tol,
                    "{} on {}: {name} max abs. error {worst:.3e}, bound {tol:.0e}",
                    op.name(),
                    b.id()
                );
            }
        }
    }
    Ok(())
}

fn t(a: ArrayD<f32>) -> Tensor {
    Tensor::from_f32(a)
}

/// Router logits whose values per token are at least 0.25 apart, so every device's rounding
/// (bf16, f16, Q7.8) keeps the same ranking: ids must then agree exactly everywhere.
fn separated_logits(seed: u64, tokens: usize, experts: usize) -> Tensor {
    let mut r = rng(seed);
    let mut v = Vec::with_capacity(tokens * experts);
    for _ in 0..tokens {
        let mut order: Vec<usize> = (0..experts).collect();
        for i in (1..experts).rev() {
            order.swap(i, r.gen_range(0..=i));
        }
        v.extend(
            order
                .iter()
                .map(|&o| o as f32 * 0.25 - 1.0 + r.gen_range(0.0..0.02)),
        );
    }
    Tensor::from_vec_f32(&[tokens, experts], v).unwrap_or_else(|e| panic!("{e}"))
}

fn attention(b: &dyn Backend, causal: bool, shape: [usize; 6]) -> TestResult {
    let [bs, hq, hkv, nq, nkv, d] = shape;
    let mut r = rng(nq as u64 * 31 + d as u64);
    let q = t(uniform(&mut r, &[bs, hq, nq, d], 1.0));
    let k = t(uniform(&mut r, &[bs, hkv, nkv, d], 1.0));
    let v = t(uniform(&mut r, &[bs, hkv, nkv, d], 1.0));
    let op = Op::Attention(AttentionParams {
        causal,
        scale: None,
    });
    check(b, &op, &[q, k, v])?;
    Ok(())
}

fn conformance_attention(target: Target) -> TestResult {
    let Some(b) = device(target) else {
        return Ok(());
    };
    attention(&*b, true, [1, 4, 2, 37, 53, 64])?;
    attention(&*b, false, [2, 2, 2, 65, 65, 128])?;
    attention(&*b, true, [1, 4, 1, 80, 17, 64])?;
    // Head dims that need padding (to the next multiple of 8 or 16, or of the build's width).
    for d in [80, 96, 112] {
        attention(&*b, d != 96, [1, 2, 1, 33, 40, d])?;
    }
    // The largest head dim the GPU builds take.
    attention(&*b, true, [1, 2, 1, 45, 70, 256])?;
    Ok(())
}

fn conformance_moe_route(target: Target) -> TestResult {
    let Some(b) = device(target) else {
        return Ok(());
    };
    for (tokens, experts, k) in [(45, 8, 2), (33, 16, 4), (7, 8, 8)] {
        let op = Op::MoeRoute(MoeRouteParams {
            top_k: k,
            renormalize: true,
            block_size: 16,
        });
        check(
            &*b,
            &op,
            &[separated_logits(tokens as u64, tokens, experts)],
        )?;
    }
    Ok(())
}

fn conformance_moe_experts(target: Target) -> TestResult {
    let Some(b) = device(target) else {
        return Ok(());
    };
    let (tokens, h, f, e, k) = (21, 64, 48, 4, 2);
    let route = Op::MoeRoute(MoeRouteParams {
        top_k: k,
        renormalize: true,
        block_size: 16,
    });
    let logits = separated_logits(5, tokens, e);
    let routed = route.run_cpu(&[&logits])?;
    let mut r = rng(11);
    let x = t(uniform(&mut r, &[tokens, h], 1.0));
    let gate_up = t(uniform(&mut r, &[e, 2 * f, h], 0.2));
    let down = t(uniform(&mut r, &[e, h, f], 0.2));
    let inputs = [
        x,
        routed[0].clone(),
        routed[1].clone(),
        routed[3].clone(),
        routed[4].clone(),
        gate_up,
        down,
    ];
    check(&*b, &Op::MoeExperts(MoeExpertsParams {}), &inputs)?;
    Ok(())
}

fn conformance_linear(target: Target) -> TestResult {
    let Some(b) = device(target) else {
        return Ok(());
    };
    let mut r = rng(3);
    for (m, n, kk, act, bias) in [
        (33, 70, 96, Activation::Gelu, true),
        (64, 64, 64, Activation::Relu, true),
        (5, 24, 40, Activation::Silu, false),
        (17, 31, 29, Activation::None, false),
    ] {
        let mut ins = vec![
            t(uniform(&mut r, &[m, kk], 1.0)),
            t(uniform(&mut r, &[n, kk], 0.3)),
        ];
        if bias {
            ins.push(t(uniform(&mut r, &[n], 0.5)));
        }
        check(
            &*b,
            &Op::Linear(LinearParams {
                act,
                bias,
                f32_out: false,
            }),
            &ins,
        )?;
    }
    Ok(())
}

fn conformance_norm_rope_layout(target: Target) -> TestResult {
    let Some(b) = device(target) else {
        return Ok(());
    };
    let mut r = rng(9);
    let x = t(uniform(&mut r, &[17, 256], 1.0));
    let w = t(uniform(&mut r, &[256], 1.0));
    let res = t(uniform(&mut r, &[17, 256], 1.0));
    check(
        &*b,
        &Op::RmsNorm(RmsNormParams {
            eps: 1e-5,
            residual: true,
        }),
        &[x.clone(), w.clone(), res],
    )?;
    check(
        &*b,
        &Op::RmsNorm(RmsNormParams {
            eps: 1e-6,
            residual: false,
        }),
        &[x.clone(), w],
    )?;
    // A large eps, where dropping it changes the output by far more than any device rounds
    // (eps 1e-5 against a mean square of ~1/3 moves y by ~2e-5: below bf16's bound).
    check(
        &*b,
        &Op::RmsNorm(RmsNormParams {
            eps: 0.1,
            residual: false,
        }),
        &[x.clone(), t(uniform(&mut r, &[256], 1.0))],
    )?;
    check(
        &*b,
        &Op::Rope(RopeParams {
            base: 10000.0,
            position_offset: 3,
        }),
        &[t(uniform(&mut r, &[2, 3, 11, 64], 1.0))],
    )?;
    let y = t(uniform(&mut r, &[17, 256], 1.0));
    check(&*b, &Op::Add, &[x, y])?;
    let flat = t(uniform(&mut r, &[2 * 9, 4 * 8], 1.0));
    check(
        &*b,
        &Op::SplitHeads(SplitHeadsParams { batch: 2, heads: 4 }),
        &[flat],
    )?;
    check(
        &*b,
        &Op::MergeHeads,
        &[t(uniform(&mut r, &[2, 4, 9, 8], 1.0))],
    )?;
    let ids = Tensor::from_vec_i32(&[2, 5], vec![0, 12, 3, 3, 7, 12, 1, 0, 9, 4])?;
    check(
        &*b,
        &Op::Embedding(EmbeddingParams {}),
        &[ids, t(uniform(&mut r, &[13, 64], 1.0))],
    )?;
    Ok(())
}

fn conformance_round_trip(target: Target) -> TestResult {
    let Some(b) = device(target) else {
        return Ok(());
    };
    let mut r = rng(1);
    let f = t(uniform(&mut r, &[3, 5, 7], 2.0));
    let back = b.download(&b.upload(&f)?)?;
    assert_eq!(back.meta(), f.meta());
    // Storage may be narrower than f32 (bf16: 2^-9 relative per element, f16: 2^-12).
    let e = rel_error(&back.to_f64(), &f.to_f64());
    assert!(e < 4e-3, "{}: f32 round trip rel. error {e:.3e}", b.id());
    let ids = Tensor::from_i32(ArrayD::from_shape_fn(IxDyn(&[4, 9]), |i| {
        (i[0] * 1000 + i[1]) as i32 - 2000
    }));
    assert_eq!(
        b.download(&b.upload(&ids)?)?,
        ids,
        "{}: i32 round trip",
        b.id()
    );
    let empty = Tensor::from_vec_f32(&[0, 4], Vec::new())?;
    assert_eq!(b.download(&b.upload(&empty)?)?.shape(), &[0, 4]);
    b.synchronize()?;
    Ok(())
}

macro_rules! per_device {
    (@gpu $case:ident) => {
        #[test]
        fn cpu() -> TestResult {
            super::$case(Target::Kind(DeviceKind::Cpu))
        }
        #[test]
        fn cuda_bf16() -> TestResult {
            super::$case(Target::Cuda(CudaDType::Bf16))
        }
        #[test]
        fn cuda_f16() -> TestResult {
            super::$case(Target::Cuda(CudaDType::F16))
        }
    };
    ($($case:ident),* $(,)?) => {
        $(
            mod $case {
                use super::*;
                per_device!(@gpu $case);
                #[test]
                fn fpga_sim() -> TestResult {
                    super::$case(Target::Kind(DeviceKind::FpgaSim))
                }
                #[test]
                fn fpga_board() -> TestResult {
                    super::$case(Target::Kind(DeviceKind::FpgaXrt))
                }
            }
        )*
    };
}

// Storage round trips: the devices with memory of their own. The simulated card keeps a
// tensor in host memory until a launch writes it into the card's banks, so a round trip there
// could not fail; its banks are exercised by every launch instead.
mod conformance_round_trip {
    use super::*;
    per_device!(@gpu conformance_round_trip);
}

per_device!(
    conformance_attention,
    conformance_moe_route,
    conformance_moe_experts,
    conformance_linear,
    conformance_norm_rope_layout,
);
