//! Every CPU op under the CPU backend's compute settings, with the BLAS library (OpenBLAS,
//! where one is installed) and with the portable GEMM (what `TANDEM_CPU_BLAS=off` selects), on
//! 1..=N threads, against the independent f64 reference at 1e-5, on shapes off every block
//! size: linear's BLAS row blocks (64..1024 rows), attention's query and key blocks (64, 128),
//! the experts' per-expert groups, and the rayon split thresholds of the other ops.

use std::sync::Arc;

use ndarray::{Array2, ArrayD, linalg::general_mat_mul};
use rand::Rng;
use tandem::backend::cpu::{Blas, CpuBackend, CpuCompute, Gemm, Threads};
use tandem::backend::{Backend, DeviceId};
use tandem::ops::{
    Activation, AttentionParams, LinearParams, MoeExpertsParams, MoeRouteParams, Op, RmsNormParams,
    RopeParams, SplitHeadsParams,
};
use tandem::options::{CpuBlas, CpuOptions};
use tandem::tensor::rel_error;
use tandem::{Error, Tensor};
use tandem_tests::{TestResult, rng, uniform};

/// f32 against the f64 reference.
const TOL: f64 = 1e-5;

/// The library auto-detection finds, or `None` after saying the BLAS half is skipped.
fn blas() -> TestResult<Option<Arc<Blas>>> {
    match Blas::open(&CpuBlas::Auto)? {
        Some(b) => Ok(Some(Arc::new(b))),
        None => {
            println!(
                "SKIP: no optimised BLAS in the library path (install libopenblas0-pthread, as \
                 .ci/setup does): only the portable GEMM is tested"
            );
            Ok(None)
        }
    }
}

/// The settings every case runs under: portable and BLAS (when found), 1..=N threads
/// (N: the cores, at least 3, so several threads run even on a 2-core machine).
fn computes() -> TestResult<Vec<(String, CpuCompute)>> {
    let n = std::thread::available_parallelism().map_or(3, |n| n.get().max(3));
    let lib = blas()?;
    let mut v = Vec::new();
    for t in 1..=n {
        v.push((
            format!("portable, {t} threads"),
            CpuCompute::new(None, Threads::Fixed(t)),
        ));
        if let Some(b) = &lib {
            v.push((
                format!("{}, {t} threads", b.vendor()),
                CpuCompute::new(Some(b.clone()), Threads::Fixed(t)),
            ));
        }
    }
    Ok(v)
}

/// Runs `op` under `c`, checking that the GEMM in effect is the one `c` names.
fn run_under(c: &CpuCompute, op: &Op, inputs: &[Tensor]) -> TestResult<Vec<Tensor>> {
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let (outs, threads, through_blas) = c.run(|| {
        (
            op.run_cpu(&refs),
            rayon::current_num_threads(),
            Gemm::current().blas().is_some(),
        )
    })?;
    assert_eq!(threads, c.threads_now(), "pool size");
    assert_eq!(through_blas, c.blas().is_some(), "GEMM in effect");
    Ok(outs?)
}

/// Every output of `op` under every setting against the f64 reference: norm-relative error
/// below `TOL` (on `scale` instead of the reference's norm where given: a linear's
/// |x| |W|^T + |b|), equal -inf where the reference has -inf, integer outputs exact.
fn check_all(what: &str, op: &Op, inputs: &[Tensor], scale: Option<f64>) -> TestResult {
    let f64_inputs: Vec<ArrayD<f64>> = inputs.iter().map(Tensor::to_f64).collect();
    let want = op.reference(&f64_inputs)?;
    for (name, c) in computes()? {
        let got = run_under(&c, op, inputs)?;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let g = g.to_f64();
            let e = match scale {
                Some(s) => (&g - w).mapv(|v| v * v).sum().sqrt() / s,
                None => rel_error(&g, w),
            };
            if e.is_nan() || e >= TOL {
                return Err(format!("{what}, {name}: output {i} error {e:.2e}").into());
            }
        }
    }
    Ok(())
}

#[test]
fn linear_off_block_sizes() -> TestResult {
    let mut r = rng(19);
    let acts = [
        Activation::Gelu,
        Activation::Silu,
        Activation::Relu,
        Activation::None,
    ];
    let mut case = 0;
    for m in [1, 63, 65, 513, 1100] {
        for n in [1, 17, 129] {
            for k in [1, 3, 257] {
                case += 1;
                let p = LinearParams {
                    act: acts[case % acts.len()],
                    bias: case % 3 != 0,
                    f32_out: false,
                };
                let mut inputs = vec![uniform(&mut r, &[m, k], 1.0), uniform(&mut r, &[n, k], 1.0)];
                if p.bias {
                    inputs.push(uniform(&mut r, &[n], 1.0));
                }
                // The sum's magnitude before cancellation: |x| |W|^T + |b|.
                let abs: Vec<ArrayD<f64>> = inputs
                    .iter()
                    .map(|a| a.mapv(|v| f64::from(v).abs()))
                    .collect();
                let plain = Op::Linear(LinearParams {
                    act: Activation::None,
                    bias: p.bias,
                    f32_out: false,
                });
                let scale = plain.reference(&abs)?[0].mapv(|v| v * v).sum().sqrt();
                let tensors: Vec<Tensor> = inputs.into_iter().map(Tensor::from_f32).collect();
                let what = format!("linear M{m} N{n} K{k} {:?} bias {}", p.act, p.bias);
                check_all(&what, &Op::Linear(p), &tensors, Some(scale))?;
            }
        }
    }
    Ok(())
}

#[test]
fn linear_with_leading_dims_and_large_values() -> TestResult {
    let mut r = rng(23);
    // x [2, 600, 96]: M = 1200 over two BLAS row blocks; values up to 30 push GELU and SiLU
    // into their saturated ranges.
    let x = uniform(&mut r, &[2, 600, 96], 30.0);
    let w = uniform(&mut r, &[40, 96], 0.2);
    let b = uniform(&mut r, &[40], 5.0);
    for act in [Activation::Gelu, Activation::Silu] {
        let op = Op::Linear(LinearParams {
            act,
            bias: true,
            f32_out: false,
        });
        let t = [
            Tensor::from_f32(x.clone()),
            Tensor::from_f32(w.clone()),
            Tensor::from_f32(b.clone()),
        ];
        check_all(&format!("linear [2, 600, 96] {act:?}"), &op, &t, None)?;
    }
    Ok(())
}

#[test]
fn attention_off_block_sizes() -> TestResult {
    // [B, Hq, Hkv, Nq, Nkv, D], causal: sizes around BLOCK_Q = 64 and BLOCK_K = 128, GQA and
    // MQA, more queries than keys (rows that see no key under the causal mask).
    let cases: [([usize; 6], bool); 7] = [
        ([1, 2, 1, 1, 1, 1], true),
        ([1, 2, 2, 63, 129, 3], false),
        ([2, 4, 2, 65, 127, 64], true),
        ([1, 1, 1, 130, 300, 17], true),
        ([1, 3, 1, 129, 64, 8], false),
        ([1, 2, 1, 200, 100, 16], true),
        ([1, 8, 8, 257, 257, 64], false),
    ];
    for ([b, hq, hkv, nq, nkv, d], causal) in cases {
        let mut r = rng((nq * 131 + nkv * 7 + d) as u64);
        let t = [
            Tensor::from_f32(uniform(&mut r, &[b, hq, nq, d], 1.0)),
            Tensor::from_f32(uniform(&mut r, &[b, hkv, nkv, d], 1.0)),
            Tensor::from_f32(uniform(&mut r, &[b, hkv, nkv, d], 1.0)),
        ];
        let op = Op::Attention(AttentionParams {
            causal,
            scale: None,
        });
        let what = format!("attention B{b} Hq{hq} Hkv{hkv} Nq{nq} Nkv{nkv} D{d} causal {causal}");
        check_attention(&what, &op, &t)?;
    }
    Ok(())
}

/// Attention's o (norm-relative) and lse (-inf at the same rows, the rest norm-relative).
fn check_attention(what: &str, op: &Op, inputs: &[Tensor]) -> TestResult {
    let f64_inputs: Vec<ArrayD<f64>> = inputs.iter().map(Tensor::to_f64).collect();
    let want = op.reference(&f64_inputs)?;
    for (name, c) in computes()? {
        let got = run_under(&c, op, inputs)?;
        let eo = rel_error(&got[0].to_f64(), &want[0]);
        let el = tandem_tests::rel_err_neg_inf(&got[1].to_f64(), &want[1])?;
        if eo.is_nan() || el.is_nan() || eo >= TOL || el >= TOL {
            return Err(format!("{what}, {name}: o {eo:.2e}, lse {el:.2e}").into());
        }
    }
    Ok(())
}

/// Router logits whose values per token are at least 0.25 apart (one ranking however
/// rounded).
fn separated_logits(seed: u64, tokens: usize, experts: usize) -> TestResult<Tensor> {
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
    Ok(Tensor::from_vec_f32(&[tokens, experts], v)?)
}

#[test]
fn route_and_experts_off_block_sizes() -> TestResult {
    // (tokens, H, F, E, k, routing block)
    for (tokens, h, f, e, k, block) in [
        (1, 3, 1, 2, 1, 1),
        (21, 64, 48, 4, 2, 16),
        (70, 17, 65, 8, 2, 4),
        (200, 33, 129, 8, 3, 64),
        (128, 512, 96, 8, 2, 16),
    ] {
        let route = Op::MoeRoute(MoeRouteParams {
            top_k: k,
            renormalize: true,
            block_size: block,
        });
        let logits = separated_logits(tokens as u64, tokens, e)?;
        check_all(
            &format!("moe_route T{tokens} E{e} k{k}"),
            &route,
            std::slice::from_ref(&logits),
            None,
        )?;
        let routed = route.run_cpu(&[&logits])?;
        let mut r = rng(h as u64 * 7 + f as u64);
        let inputs = [
            Tensor::from_f32(uniform(&mut r, &[tokens, h], 1.0)),
            routed[0].clone(),
            routed[1].clone(),
            routed[3].clone(),
            routed[4].clone(),
            Tensor::from_f32(uniform(&mut r, &[e, 2 * f, h], 0.3)),
            Tensor::from_f32(uniform(&mut r, &[e, h, f], 0.3)),
        ];
        let what = format!("moe_experts T{tokens} H{h} F{f} E{e} k{k}");
        check_all(&what, &Op::MoeExperts(MoeExpertsParams {}), &inputs, None)?;
    }
    Ok(())
}

#[test]
fn norm_rope_add_and_layouts_on_every_thread_count() -> TestResult {
    let mut r = rng(41);
    // [300, 513]: past the rayon split threshold of the row-wise ops.
    let x = Tensor::from_f32(uniform(&mut r, &[300, 513], 1.0));
    let w = Tensor::from_f32(uniform(&mut r, &[513], 1.0));
    let res = Tensor::from_f32(uniform(&mut r, &[300, 513], 1.0));
    let norm = Op::RmsNorm(RmsNormParams {
        eps: 1e-5,
        residual: true,
    });
    check_all("rmsnorm", &norm, &[x.clone(), w, res.clone()], None)?;
    check_all("add", &Op::Add, &[x, res], None)?;
    let rope = Op::Rope(RopeParams {
        base: 10000.0,
        position_offset: 5,
    });
    let q = Tensor::from_f32(uniform(&mut r, &[2, 4, 131, 66], 1.0));
    check_all("rope", &rope, std::slice::from_ref(&q), None)?;
    check_all(
        "merge_heads",
        &Op::MergeHeads,
        std::slice::from_ref(&q),
        None,
    )?;
    let flat = Tensor::from_f32(uniform(&mut r, &[2 * 131, 4 * 66], 1.0));
    let split = Op::SplitHeads(SplitHeadsParams { batch: 2, heads: 4 });
    check_all("split_heads", &split, &[flat], None)?;
    Ok(())
}

/// The library's products on every layout it takes (row-major or transposed operands,
/// strided rows, alpha and beta) against matrixmultiply; a layout it cannot take is refused,
/// leaving c as it was.
#[test]
fn blas_gemm_views_match_matrixmultiply() -> TestResult {
    let Some(b) = blas()? else {
        return Ok(());
    };
    let mut r = rng(5);
    let mut mat = |rows: usize, cols: usize| {
        Array2::from_shape_fn((rows, cols), |_| r.gen_range(-1.0f32..1.0))
    };
    for (m, n, k) in [(1, 1, 1), (3, 5, 7), (64, 17, 129), (130, 1, 33)] {
        let a = mat(m, k + 3);
        let a = a.slice(ndarray::s![.., 1..k + 1]);
        let at = mat(k, m);
        let bt = mat(n, k);
        let bn = mat(k, n);
        let c0 = mat(m, n);
        for (a, b_op) in [
            (a, bt.t()),
            (at.t(), bn.view()),
            (a, bn.view()),
            (at.t(), bt.t()),
        ] {
            let mut want = c0.clone();
            general_mat_mul(0.5, &a, &b_op, 2.0, &mut want);
            let mut got = c0.clone();
            assert!(b.gemm(0.5, a, b_op, 2.0, got.view_mut()), "M{m} N{n} K{k}");
            let e = rel_error(
                &got.mapv(f64::from).into_dyn(),
                &want.mapv(f64::from).into_dyn(),
            );
            assert!(e < TOL, "M{m} N{n} K{k}: {e:.2e}");
        }
    }
    // c transposed (column-major) is not a row-major layout: refused, c untouched.
    let a = mat(4, 3);
    let bm = mat(3, 5);
    let mut c = mat(5, 4);
    let before = c.clone();
    assert!(!b.gemm(1.0, a.view(), bm.view(), 0.0, c.view_mut().reversed_axes()));
    assert_eq!(c, before);
    Ok(())
}

/// The backend: `TANDEM_CPU_BLAS=off` (as options) computes through the portable GEMM and says
/// so; a library path that is not a BLAS makes every launch fail naming the variable and the
/// file, never a silent fallback; `tandem devices` details name the BLAS and the threads.
#[test]
fn backend_follows_its_blas_option() -> TestResult {
    let off = CpuBackend::with_options(&CpuOptions {
        blas: CpuBlas::Off,
        threads: Some(2),
    });
    let detail = |b: &CpuBackend, key: &str| {
        b.info()
            .details
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert!(
        detail(&off, "blas").starts_with("off"),
        "{}",
        detail(&off, "blas")
    );
    assert!(detail(&off, "threads").starts_with('2'));
    let compute = off.compute().map_err(|e| e.to_string())?;
    assert!(compute.blas().is_none());
    assert_eq!(compute.threads_now(), 2);

    let mut r = rng(3);
    let x = Tensor::from_f32(uniform(&mut r, &[70, 33], 1.0));
    let w = Tensor::from_f32(uniform(&mut r, &[20, 33], 1.0));
    let op = Op::Linear(LinearParams {
        act: Activation::Gelu,
        bias: false,
        f32_out: false,
    });
    let want = op.reference(&[x.to_f64(), w.to_f64()])?;
    let launch = |b: &CpuBackend| -> tandem::Result<Tensor> {
        let xs = b.upload(&x)?;
        let ws = b.upload(&w)?;
        let l = b.launch(&op, &[&xs, &ws])?;
        b.download(&l.outputs[0])
    };
    let y = launch(&off)?;
    assert!(rel_error(&y.to_f64(), &want[0]) < TOL);

    let auto = CpuBackend::with_options(&CpuOptions::default());
    let y = launch(&auto)?;
    assert!(rel_error(&y.to_f64(), &want[0]) < TOL);
    if let Some(b) = blas()? {
        assert!(detail(&auto, "blas").contains(&b.path().display().to_string()));
    }

    // A file that exists but is no library.
    let dir = tempfile::tempdir()?;
    let fake = dir.path().join("libnotblas.so");
    std::fs::write(&fake, b"not a library")?;
    let bad = CpuBackend::with_options(&CpuOptions {
        blas: CpuBlas::Library(fake.clone()),
        threads: None,
    });
    assert!(detail(&bad, "blas").contains("unusable"));
    match launch(&bad) {
        Err(e @ Error::Unavailable { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("TANDEM_CPU_BLAS") && msg.contains("libnotblas.so"),
                "{msg}"
            );
        }
        other => panic!("expected the CPU to be unavailable, got {other:?}"),
    }
    assert_eq!(bad.id(), DeviceId::CPU);
    Ok(())
}
