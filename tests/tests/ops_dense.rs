//! Linear, RMSNorm, RoPE, add and the head layouts: the CPU fast path and f64 reference
//! against naive f64 versions written here, on random shapes.

use ndarray::{ArrayD, IxDyn};
use proptest::prelude::*;
use tandem::ops::{Activation, LinearParams, RmsNormParams, RopeParams, SplitHeadsParams};
use tandem::{Op, Tensor, TensorMeta};
use tandem_tests::{TestResult, rel_err, rng, uniform};

/// f32 fast path against exact f64 on these sizes.
const F32_TOL: f64 = 1e-5;
/// f64 reference against the naive f64 loops.
const F64_TOL: f64 = 1e-12;

/// Outputs of the CPU path (widened to f64) and of the f64 reference.
type Outs = (Vec<ArrayD<f64>>, Vec<ArrayD<f64>>);

/// Runs `op` on f32 inputs through the CPU path and the reference, checks output metas
/// against validate(), and returns (f32 outputs widened, reference outputs).
fn run(op: &Op, inputs: &[ArrayD<f32>]) -> TestResult<Outs> {
    let tensors: Vec<Tensor> = inputs.iter().cloned().map(Tensor::from_f32).collect();
    let refs: Vec<&Tensor> = tensors.iter().collect();
    let out = op.run_cpu(&refs)?;
    let metas: Vec<TensorMeta> = tensors.iter().map(|t| t.meta()).collect();
    let out_metas: Vec<TensorMeta> = out.iter().map(|t| t.meta()).collect();
    assert_eq!(
        out_metas,
        op.validate(&metas)?.into_vec(),
        "{}: output metas",
        op.name()
    );
    let wide: Vec<ArrayD<f64>> = inputs.iter().map(|a| a.mapv(f64::from)).collect();
    let reference = op.reference(&wide)?;
    Ok((out.iter().map(|t| t.to_f64()).collect(), reference))
}

/// Checks both result sets against `want`, output by output.
fn check(
    name: &str,
    got: (Vec<ArrayD<f64>>, Vec<ArrayD<f64>>),
    want: &[ArrayD<f64>],
) -> TestResult {
    for (i, w) in want.iter().enumerate() {
        let (e32, e64) = (rel_err(&got.0[i], w), rel_err(&got.1[i], w));
        if e32 >= F32_TOL || e64 >= F64_TOL {
            return Err(format!("{name} output {i}: f32 {e32:.2e}, f64 {e64:.2e}").into());
        }
    }
    Ok(())
}

fn act(a: Activation, x: f64) -> f64 {
    match a {
        Activation::None => x,
        Activation::Relu => x.max(0.0),
        Activation::Gelu => {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
        }
        Activation::Silu => x / (1.0 + (-x).exp()),
    }
}

fn naive_linear(
    x: &ArrayD<f64>,
    w: &ArrayD<f64>,
    b: Option<&ArrayD<f64>>,
    a: Activation,
) -> ArrayD<f64> {
    let (n, k) = (w.shape()[0], w.shape()[1]);
    let m = x.len() / k;
    let xs: Vec<f64> = x.iter().copied().collect();
    let mut y = Vec::with_capacity(m * n);
    for r in 0..m {
        for c in 0..n {
            let dot: f64 = (0..k).map(|i| xs[r * k + i] * w[[c, i]]).sum();
            y.push(act(a, dot + b.map_or(0.0, |b| b[[c]])));
        }
    }
    let mut shape = x.shape().to_vec();
    *shape.last_mut().unwrap_or(&mut 0) = n;
    ArrayD::from_shape_vec(IxDyn(&shape), y).unwrap_or_else(|e| panic!("{e}"))
}

fn linear_case(
    lead: &[usize],
    k: usize,
    n: usize,
    bias: bool,
    a: Activation,
    seed: u64,
) -> TestResult {
    let mut r = rng(seed);
    let mut xs = lead.to_vec();
    xs.push(k);
    let mut inputs = vec![uniform(&mut r, &xs, 1.0), uniform(&mut r, &[n, k], 1.0)];
    if bias {
        inputs.push(uniform(&mut r, &[n], 1.0));
    }
    let wide: Vec<ArrayD<f64>> = inputs.iter().map(|a| a.mapv(f64::from)).collect();
    let want = naive_linear(&wide[0], &wide[1], wide.get(2), a);
    let op = Op::Linear(LinearParams {
        act: a,
        bias,
        f32_out: false,
    });
    check("linear", run(&op, &inputs)?, &[want])
}

fn naive_rmsnorm(
    x: &ArrayD<f64>,
    w: &ArrayD<f64>,
    res: Option<&ArrayD<f64>>,
    eps: f64,
) -> Vec<ArrayD<f64>> {
    let h = w.len();
    let t = match res {
        Some(r) => x + r,
        None => x.clone(),
    };
    let ts: Vec<f64> = t.iter().copied().collect();
    let mut y = Vec::with_capacity(ts.len());
    for row in ts.chunks(h) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / h as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        y.extend(row.iter().zip(w.iter()).map(|(v, g)| v * inv * g));
    }
    let y = ArrayD::from_shape_vec(IxDyn(x.shape()), y).unwrap_or_else(|e| panic!("{e}"));
    if res.is_some() { vec![y, t] } else { vec![y] }
}

fn naive_rope(x: &ArrayD<f64>, base: f64, offset: usize) -> ArrayD<f64> {
    let (t, d) = (x.shape()[2], x.shape()[3]);
    let half = d / 2;
    let mut y = x.clone();
    for ((bi, h, ti, i), v) in y
        .view_mut()
        .into_dimensionality::<ndarray::Ix4>()
        .unwrap_or_else(|e| panic!("{e}"))
        .indexed_iter_mut()
    {
        let freq = base.powf(-((2 * (i % half)) as f64) / d as f64);
        let angle = (offset + ti) as f64 * freq;
        let rotated = if i < half {
            -x[[bi, h, ti, i + half]]
        } else {
            x[[bi, h, ti, i - half]]
        };
        *v = x[[bi, h, ti, i]] * angle.cos() + rotated * angle.sin();
    }
    let _ = t;
    y
}

fn activation() -> impl Strategy<Value = Activation> {
    prop::sample::select(vec![
        Activation::None,
        Activation::Relu,
        Activation::Gelu,
        Activation::Silu,
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn linear_matches_naive(
        lead in prop::collection::vec(0usize..=12, 1..=3),
        k in 1usize..=70,
        n in 1usize..=70,
        bias in any::<bool>(),
        a in activation(),
        seed in any::<u64>(),
    ) {
        linear_case(&lead, k, n, bias, a, seed).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }

    #[test]
    fn rmsnorm_matches_naive(
        lead in prop::collection::vec(1usize..=9, 0..=2),
        h in 1usize..=300,
        residual in any::<bool>(),
        eps in prop::sample::select(vec![1e-6f32, 1e-5, 0.1]),
        seed in any::<u64>(),
    ) {
        let mut r = rng(seed);
        let mut xs = lead.clone();
        xs.push(h);
        let mut inputs = vec![uniform(&mut r, &xs, 2.0), uniform(&mut r, &[h], 1.0)];
        if residual {
            inputs.push(uniform(&mut r, &xs, 2.0));
        }
        let wide: Vec<ArrayD<f64>> = inputs.iter().map(|a| a.mapv(f64::from)).collect();
        let want = naive_rmsnorm(&wide[0], &wide[1], wide.get(2), f64::from(eps));
        let op = Op::RmsNorm(RmsNormParams { eps, residual });
        let got = run(&op, &inputs).map_err(|e| TestCaseError::fail(e.to_string()))?;
        check("rmsnorm", got, &want).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }

    #[test]
    fn rope_matches_naive(
        b in 1usize..=2,
        h in 1usize..=3,
        t in 1usize..=40,
        half in 1usize..=32,
        offset in 0usize..=5000,
        base in prop::sample::select(vec![10000.0f64, 500000.0, 2.5]),
        seed in any::<u64>(),
    ) {
        let mut r = rng(seed);
        let x = uniform(&mut r, &[b, h, t, 2 * half], 1.0);
        let want = naive_rope(&x.mapv(f64::from), base, offset);
        let op = Op::Rope(RopeParams { base, position_offset: offset });
        let got = run(&op, &[x]).map_err(|e| TestCaseError::fail(e.to_string()))?;
        check("rope", got, &[want]).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }

    #[test]
    fn add_and_layouts_match_naive(
        b in 1usize..=3,
        h in 1usize..=4,
        t in 0usize..=9,
        d in 1usize..=8,
        seed in any::<u64>(),
    ) {
        let mut r = rng(seed);
        let x = uniform(&mut r, &[b * t, h * d], 1.0);
        let y = uniform(&mut r, &[b * t, h * d], 1.0);
        let sum = &x.mapv(f64::from) + &y.mapv(f64::from);
        let got = run(&Op::Add, &[x.clone(), y]).map_err(|e| TestCaseError::fail(e.to_string()))?;
        check("add", got, &[sum]).map_err(|e| TestCaseError::fail(e.to_string()))?;
        // split_heads: out[b, h, t, d] = x[b*T + t, h*D + d]; merge_heads undoes it.
        let want = ArrayD::from_shape_fn(IxDyn(&[b, h, t, d]), |i| f64::from(x[[i[0] * t + i[2], i[1] * d + i[3]]]));
        let split = Op::SplitHeads(SplitHeadsParams { batch: b, heads: h });
        let got = run(&split, std::slice::from_ref(&x)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&got.0[0], &want);
        prop_assert_eq!(&got.1[0], &want);
        let back = run(&Op::MergeHeads, &[want.mapv(|v| v as f32)]).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&back.0[0], &x.mapv(f64::from));
    }
}

#[test]
fn linear_parallel_splits() -> TestResult {
    // Many rows (split over rows), few rows and wide (split over columns), and odd sizes.
    linear_case(&[300], 64, 64, true, Activation::Gelu, 1)?;
    linear_case(&[2], 512, 513, true, Activation::Silu, 2)?;
    linear_case(&[3, 67], 129, 131, false, Activation::Relu, 3)
}

/// Sizes above the CPU ops' serial threshold (2^17 elements or multiply-adds), so the
/// rayon paths run.
#[test]
fn large_sizes_take_the_parallel_paths() -> TestResult {
    let mut r = rng(8);
    let (a, b) = (
        uniform(&mut r, &[400, 401], 1.0),
        uniform(&mut r, &[400, 401], 1.0),
    );
    let sum = &a.mapv(f64::from) + &b.mapv(f64::from);
    check("add", run(&Op::Add, &[a, b])?, &[sum])?;
    let x = uniform(&mut r, &[70, 4096], 1.0);
    let res = uniform(&mut r, &[70, 4096], 1.0);
    let w = uniform(&mut r, &[4096], 1.0);
    let wide: Vec<ArrayD<f64>> = [&x, &w, &res].iter().map(|a| a.mapv(f64::from)).collect();
    let want = naive_rmsnorm(&wide[0], &wide[1], Some(&wide[2]), 1e-5);
    let op = Op::RmsNorm(RmsNormParams {
        eps: 1e-5,
        residual: true,
    });
    check("rmsnorm", run(&op, &[x, w, res])?, &want)?;
    let x = uniform(&mut r, &[2, 4, 300, 128], 1.0);
    let want = naive_rope(&x.mapv(f64::from), 10000.0, 4000);
    let op = Op::Rope(RopeParams {
        base: 10000.0,
        position_offset: 4000,
    });
    check("rope", run(&op, &[x])?, &[want])
}

/// The GEMM (`gemm` crate) on shapes off every block size, against the f64 reference, on a
/// 1-thread rayon pool and on one of several threads: within 1e-5 of f64 on both, and the
/// two f32 results bit-identical (the thread count does not change the result). The error
/// is relative to the norm of |x| |W|^T + |b| (the sum's magnitude before cancellation): with
/// M = N = 1 a single output can cancel to near zero, where a plain relative error measures
/// the conditioning of that one sum rather than the kernel.
#[test]
fn linear_odd_shapes_and_thread_counts() -> TestResult {
    const SIZES: [usize; 6] = [1, 3, 17, 65, 129, 257];
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let many = rayon::ThreadPoolBuilder::new()
        .num_threads(std::thread::available_parallelism().map_or(4, |n| n.get().max(3)))
        .build()?;
    let mut seed = 100;
    for &m in &SIZES {
        for &n in &SIZES {
            for &k in &SIZES {
                seed += 1;
                let mut r = rng(seed);
                let inputs = vec![
                    uniform(&mut r, &[m, k], 1.0),
                    uniform(&mut r, &[n, k], 1.0),
                    uniform(&mut r, &[n], 1.0),
                ];
                let op = Op::Linear(LinearParams {
                    act: Activation::Gelu,
                    bias: true,
                    f32_out: false,
                });
                let single = one.install(|| run(&op, &inputs).map_err(|e| e.to_string()))?;
                let multi = many.install(|| run(&op, &inputs).map_err(|e| e.to_string()))?;
                let abs: Vec<ArrayD<f64>> = inputs
                    .iter()
                    .map(|a| a.mapv(|v| f64::from(v).abs()))
                    .collect();
                let plain = Op::Linear(LinearParams {
                    act: Activation::None,
                    bias: true,
                    f32_out: false,
                });
                let scale = plain.reference(&abs)?[0].mapv(|v| v * v).sum().sqrt();
                let diff = (&single.0[0] - &single.1[0]).mapv(|v| v * v).sum().sqrt();
                let e = diff / scale;
                if e >= F32_TOL {
                    return Err(format!("linear M{m} N{n} K{k}: f32 {e:.2e}").into());
                }
                if single.0[0] != multi.0[0] {
                    return Err(format!("linear M{m} N{n} K{k}: 1 thread != n threads").into());
                }
            }
        }
    }
    Ok(())
}
