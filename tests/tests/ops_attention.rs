//! Attention's CPU fast path and f64 reference against a naive f64 attention written here,
//! on random shapes: odd lengths, Nq < Nkv and Nq > Nkv (causal rows that see no key), MHA,
//! GQA and MQA, several query and key blocks.

use ndarray::{Array3, Array4, ArrayD, Axis, IxDyn};
use proptest::prelude::*;
use tandem::ops::AttentionParams;
use tandem::{Op, Tensor};
use tandem_tests::{TestResult, rel_err, rel_err_neg_inf, rng, uniform};

/// f32 fast path against exact f64 (inputs in [-1, 1], D <= 64).
const F32_TOL: f64 = 1e-5;
/// f64 reference against the naive f64 loops.
const F64_TOL: f64 = 1e-12;

/// o and lse by the textbook formula: every row's scores, max, sum and weighted sum of V.
fn naive(
    q: &ArrayD<f64>,
    k: &ArrayD<f64>,
    v: &ArrayD<f64>,
    causal: bool,
    scale: f64,
) -> (ArrayD<f64>, ArrayD<f64>) {
    let (b, hq, nq, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let (hkv, nkv) = (k.shape()[1], k.shape()[2]);
    let mut o = Array4::<f64>::zeros((b, hq, nq, d));
    let mut lse = Array3::<f64>::from_elem((b, hq, nq), f64::NEG_INFINITY);
    for bi in 0..b {
        for h in 0..hq {
            let hk = h / (hq / hkv);
            for i in 0..nq {
                let last = i as isize + nkv as isize - nq as isize;
                let keys: Vec<usize> = (0..nkv)
                    .filter(|&j| !causal || j as isize <= last)
                    .collect();
                if keys.is_empty() {
                    continue;
                }
                let scores: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        scale
                            * (0..d)
                                .map(|c| q[[bi, h, i, c]] * k[[bi, hk, j, c]])
                                .sum::<f64>()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                lse[[bi, h, i]] = m + z.ln();
                for (&j, s) in keys.iter().zip(&scores) {
                    let p = (s - m).exp() / z;
                    for c in 0..d {
                        o[[bi, h, i, c]] += p * v[[bi, hk, j, c]];
                    }
                }
            }
        }
    }
    (o.into_dyn(), lse.into_dyn())
}

struct Case {
    b: usize,
    hkv: usize,
    group: usize,
    nq: usize,
    nkv: usize,
    d: usize,
    causal: bool,
    scale: Option<f32>,
    seed: u64,
}

/// Runs one case through the CPU path and the f64 reference; returns the four errors
/// (f32 o, f32 lse, f64 o, f64 lse) against the naive loops.
fn errors(c: &Case) -> TestResult<[f64; 4]> {
    let mut r = rng(c.seed);
    let hq = c.hkv * c.group;
    let q = uniform(&mut r, &[c.b, hq, c.nq, c.d], 1.0);
    let k = uniform(&mut r, &[c.b, c.hkv, c.nkv, c.d], 1.0);
    let v = uniform(&mut r, &[c.b, c.hkv, c.nkv, c.d], 1.0);
    let (q64, k64, v64) = (q.mapv(f64::from), k.mapv(f64::from), v.mapv(f64::from));
    let scale = c.scale.map_or(1.0 / (c.d as f64).sqrt(), f64::from);
    let (o_ref, lse_ref) = naive(&q64, &k64, &v64, c.causal, scale);
    let op = Op::Attention(AttentionParams {
        causal: c.causal,
        scale: c.scale,
    });
    let inputs = [
        Tensor::from_f32(q),
        Tensor::from_f32(k),
        Tensor::from_f32(v),
    ];
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let out = op.run_cpu(&refs)?;
    let metas: Vec<_> = out.iter().map(|t| t.meta()).collect();
    let inmetas: Vec<_> = inputs.iter().map(|t| t.meta()).collect();
    assert_eq!(
        metas,
        op.validate(&inmetas)?.into_vec(),
        "output metas differ from validate()"
    );
    let f64_out = op.reference(&[q64, k64, v64])?;
    Ok([
        rel_err(&out[0].to_f64(), &o_ref),
        rel_err_neg_inf(&out[1].to_f64(), &lse_ref)?,
        rel_err(&f64_out[0], &o_ref),
        rel_err_neg_inf(&f64_out[1], &lse_ref)?,
    ])
}

fn check(c: &Case) -> TestResult {
    let [o32, l32, o64, l64] = errors(c)?;
    let ok = o32 < F32_TOL && l32 < F32_TOL && o64 < F64_TOL && l64 < F64_TOL;
    if !ok {
        return Err(
            format!("errors f32 o {o32:.2e} lse {l32:.2e}, f64 o {o64:.2e} lse {l64:.2e}").into(),
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn matches_naive(
        b in 1usize..=2,
        hkv in 1usize..=3,
        group in prop::sample::select(vec![1usize, 2, 4]),
        nq in 1usize..=150,
        nkv in 1usize..=300,
        d in 1usize..=64,
        causal in any::<bool>(),
        scale in prop::option::of(0.05f32..1.0),
        seed in any::<u64>(),
    ) {
        let case = Case { b, hkv, group, nq, nkv, d, causal, scale, seed };
        check(&case).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
}

#[test]
fn mqa_many_blocks_both_directions() -> TestResult {
    for (nq, nkv) in [
        (130, 333),
        (333, 130),
        (1, 257),
        (257, 1),
        (64, 64),
        (65, 129),
    ] {
        for causal in [true, false] {
            let case = Case {
                b: 1,
                hkv: 1,
                group: 4,
                nq,
                nkv,
                d: 33,
                causal,
                scale: None,
                seed: 7,
            };
            check(&case).map_err(|e| format!("nq {nq} nkv {nkv} causal {causal}: {e}"))?;
        }
    }
    Ok(())
}

#[test]
fn rows_that_see_no_key_give_zero_and_neg_inf() -> TestResult {
    let (nq, nkv) = (9, 4);
    let mut r = rng(3);
    let q = Tensor::from_f32(uniform(&mut r, &[1, 2, nq, 8], 1.0));
    let k = Tensor::from_f32(uniform(&mut r, &[1, 1, nkv, 8], 1.0));
    let v = Tensor::from_f32(uniform(&mut r, &[1, 1, nkv, 8], 1.0));
    let out = Op::Attention(AttentionParams::default()).run_cpu(&[&q, &k, &v])?;
    let (o, lse) = (out[0].as_f32()?, out[1].as_f32()?);
    for h in 0..2 {
        for i in 0..nq {
            let blind = i < nq - nkv;
            let row = o
                .index_axis(Axis(0), 0)
                .index_axis(Axis(0), h)
                .index_axis(Axis(0), i)
                .to_owned();
            if blind {
                assert!(row.iter().all(|&x| x == 0.0), "row {i} must be 0");
                assert_eq!(lse[[0, h, i]], f32::NEG_INFINITY, "row {i} lse");
            } else {
                assert!(lse[[0, h, i]].is_finite(), "row {i} lse");
            }
        }
    }
    Ok(())
}

/// A run's finiteness check lets the -inf LSE of rows that see no key through (it is the
/// op's defined value: `tandem op attention --causal` with Nq > Nkv once failed on it), and
/// still reports the node when an output holds NaN.
#[test]
fn a_checked_run_keeps_the_neg_inf_lse_of_rows_that_see_no_key() -> TestResult {
    use tandem::backend::DeviceRegistry;
    use tandem::exec::ExecOptions;
    use tandem::graph::Graph;
    use tandem::plan::BackendChoice;
    use tandem::run::{RunOptions, run_graph};
    let mut r = rng(5);
    let mut g = Graph::default();
    g.constant("q", Tensor::from_f32(uniform(&mut r, &[1, 2, 9, 8], 1.0)));
    g.constant("k", Tensor::from_f32(uniform(&mut r, &[1, 1, 4, 8], 1.0)));
    g.constant("v", Tensor::from_f32(uniform(&mut r, &[1, 1, 4, 8], 1.0)));
    let outs = g.add(
        "attention",
        Op::Attention(AttentionParams {
            causal: true,
            scale: None,
        }),
        &["q", "k", "v"],
    );
    g.outputs = outs.clone();
    let opts = RunOptions {
        backend: BackendChoice::Only(tandem::DeviceKind::Cpu),
        placement: Default::default(),
        backend_label: "cpu".into(),
        exec: ExecOptions {
            timeout: std::time::Duration::from_secs(30),
            fallback: false,
            fuse: false,
            ..ExecOptions::default()
        },
        check: true,
        workload: "attention, rows that see no key".into(),
        history: None,
        limits: tandem::limits::Limits::default(),
        allow_nonfinite: false,
        warmup: 0,
    };
    let reg = DeviceRegistry::cpu_only();
    let out = run_graph(&g, &reg, &opts)?;
    let lse = out.exec.buffers[&outs[1]].to_host(&reg)?;
    assert_eq!(lse.as_f32()?[[0, 0, 0]], f32::NEG_INFINITY);
    // only -inf passes: NaN and +inf are still found
    for x in [f32::NAN, f32::INFINITY] {
        let bad = Tensor::from_f32(ndarray::arr1(&[f32::NEG_INFINITY, x]).into_dyn());
        assert_eq!(
            bad.first_non_finite_but(true).map(|(i, _)| i),
            Some(vec![1])
        );
    }
    let probe = Tensor::from_f32(ndarray::arr1(&[1.0f32, f32::NEG_INFINITY]).into_dyn());
    assert_eq!(probe.first_non_finite_but(true), None);
    assert!(probe.first_non_finite().is_some());
    Ok(())
}

#[test]
fn no_queries_give_empty_outputs() -> TestResult {
    let q = Tensor::zeros(&tandem::TensorMeta::new(
        vec![2, 4, 0, 16],
        tandem::DType::F32,
    ));
    let k = Tensor::zeros(&tandem::TensorMeta::new(
        vec![2, 2, 5, 16],
        tandem::DType::F32,
    ));
    let out = Op::Attention(AttentionParams::default()).run_cpu(&[&q, &k, &k])?;
    assert_eq!(out[0].shape(), &[2, 4, 0, 16]);
    assert_eq!(out[1].shape(), &[2, 4, 0]);
    Ok(())
}

#[test]
fn strided_inputs_match_contiguous_ones() -> TestResult {
    let mut r = rng(11);
    // q stored as [B, N, H, D] and viewed as [B, H, N, D]: not standard layout.
    let bnhd = uniform(&mut r, &[2, 40, 4, 16], 1.0);
    let strided = bnhd.clone().permuted_axes(IxDyn(&[0, 2, 1, 3]));
    let contiguous = strided.as_standard_layout().into_owned();
    let k = Tensor::from_f32(uniform(&mut r, &[2, 2, 50, 16], 1.0));
    let v = Tensor::from_f32(uniform(&mut r, &[2, 2, 50, 16], 1.0));
    let op = Op::Attention(AttentionParams::default());
    let a = op.run_cpu(&[&Tensor::from_f32(strided), &k, &v])?;
    let b = op.run_cpu(&[&Tensor::from_f32(contiguous), &k, &v])?;
    assert_eq!(a, b);
    Ok(())
}

#[test]
fn repeated_runs_agree_bit_for_bit() -> TestResult {
    let mut r = rng(5);
    let q = Tensor::from_f32(uniform(&mut r, &[1, 4, 200, 32], 1.0));
    let k = Tensor::from_f32(uniform(&mut r, &[1, 2, 300, 32], 1.0));
    let v = Tensor::from_f32(uniform(&mut r, &[1, 2, 300, 32], 1.0));
    let op = Op::Attention(AttentionParams::default());
    let first = op.run_cpu(&[&q, &k, &v])?;
    for _ in 0..3 {
        assert_eq!(first, op.run_cpu(&[&q, &k, &v])?);
    }
    Ok(())
}
