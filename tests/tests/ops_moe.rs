//! MoE routing and experts: the CPU fast path and f64 reference against naive f64 versions
//! written here, on random shapes with ties (integer logits), k = E, experts nobody is routed
//! to, T = 1 and T = 0; plus the routing layout (sorted_token_ids, expert_offsets) spelled out.

use ndarray::{Array2, ArrayD, IxDyn};
use proptest::prelude::*;
use tandem::ops::{MoeExpertsParams, MoeRouteParams};
use tandem::{DType, Op, Tensor, TensorMeta};
use tandem_tests::{TestResult, rel_err, rng, small_ints, uniform};

/// f32 fast path against exact f64 on these sizes.
const F32_TOL: f64 = 1e-5;
/// f64 reference against the naive f64 loops.
const F64_TOL: f64 = 1e-12;

/// Routing computed the long way: full sort of each row's probabilities.
#[derive(Debug)]
struct Route {
    ids: Vec<usize>,
    weights: Vec<f64>,
    counts: Vec<usize>,
    sorted: Vec<usize>,
    offsets: Vec<usize>,
    aux: f64,
    z: f64,
}

fn naive_route(logits: &Array2<f64>, k: usize, renormalize: bool, block: usize) -> Route {
    let (t, e) = logits.dim();
    let (mut ids, mut weights, mut counts) = (Vec::new(), Vec::new(), vec![0usize; e]);
    let mut mean_p = vec![0.0f64; e];
    let mut z = 0.0;
    for row in logits.rows() {
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|l| (l - m).exp()).sum();
        let p: Vec<f64> = row.iter().map(|l| (l - m).exp() / sum).collect();
        z += (m + sum.ln()).powi(2) / t as f64;
        let mut order: Vec<usize> = (0..e).collect();
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a])); // stable: equal p keep lower index first
        let chosen = &order[..k];
        let kept: f64 = chosen.iter().map(|&i| p[i]).sum();
        for &i in chosen {
            ids.push(i);
            weights.push(if renormalize { p[i] / kept } else { p[i] });
            counts[i] += 1;
        }
        for (acc, pi) in mean_p.iter_mut().zip(&p) {
            *acc += pi / t as f64;
        }
    }
    let aux = e as f64
        * (0..e)
            .map(|i| counts[i] as f64 / t as f64 * mean_p[i])
            .sum::<f64>();
    let sentinel = t * k;
    let len = (t * k + e * (block - 1)).div_ceil(block) * block;
    let (mut sorted, mut offsets) = (Vec::new(), vec![0]);
    for expert in 0..e {
        sorted.extend((0..t * k).filter(|&s| ids[s] == expert));
        while sorted.len() % block != 0 {
            sorted.push(sentinel);
        }
        offsets.push(sorted.len());
    }
    sorted.resize(len, sentinel);
    let (aux, z) = if t == 0 { (0.0, 0.0) } else { (aux, z) };
    Route {
        ids,
        weights,
        counts,
        sorted,
        offsets,
        aux,
        z,
    }
}

fn arr(shape: &[usize], v: Vec<f64>) -> TestResult<ArrayD<f64>> {
    Ok(ArrayD::from_shape_vec(IxDyn(shape), v)?)
}

fn ints(v: &[usize]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// Checks routing outputs (widened to f64) against the naive routing.
fn check_route(outs: &[ArrayD<f64>], want: &Route, t: usize, k: usize, tol: f64) -> TestResult {
    let e = want.counts.len();
    assert_eq!(outs[0], arr(&[t, k], ints(&want.ids))?, "topk_ids");
    assert_eq!(outs[2], arr(&[e], ints(&want.counts))?, "expert_counts");
    assert_eq!(
        outs[3],
        arr(&[want.sorted.len()], ints(&want.sorted))?,
        "sorted_token_ids"
    );
    assert_eq!(
        outs[4],
        arr(&[e + 1], ints(&want.offsets))?,
        "expert_offsets"
    );
    let w = rel_err(&outs[1], &arr(&[t, k], want.weights.clone())?);
    let aux = rel_err(&outs[5], &arr(&[1], vec![want.aux])?);
    let z = rel_err(&outs[6], &arr(&[1], vec![want.z])?);
    if w >= tol || aux >= tol || z >= tol {
        return Err(format!("weights {w:.2e}, aux {aux:.2e}, z {z:.2e} >= {tol:.0e}").into());
    }
    Ok(())
}

/// Routes `logits` with the CPU op and the reference, checking both; returns the CPU outputs.
fn route_and_check(logits: &ArrayD<f32>, p: MoeRouteParams) -> TestResult<Vec<Tensor>> {
    let (t, _) = (logits.shape()[0], logits.shape()[1]);
    let l64 = logits.mapv(f64::from);
    let want = naive_route(
        &l64.clone().into_dimensionality()?,
        p.top_k,
        p.renormalize,
        p.block_size,
    );
    let op = Op::MoeRoute(p);
    let input = Tensor::from_f32(logits.clone());
    let out = op.run_cpu(&[&input])?;
    let metas: Vec<TensorMeta> = out.iter().map(|o| o.meta()).collect();
    assert_eq!(
        metas,
        op.validate(&[input.meta()])?.into_vec(),
        "output metas differ from validate()"
    );
    let wide: Vec<ArrayD<f64>> = out.iter().map(|o| o.to_f64()).collect();
    check_route(&wide, &want, t, p.top_k, F32_TOL).map_err(|e| format!("cpu: {e}"))?;
    let r = op.reference(&[l64])?;
    check_route(&r, &want, t, p.top_k, F64_TOL).map_err(|e| format!("reference: {e}"))?;
    Ok(out)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn route_matches_naive(
        t in 1usize..=150,
        e in 1usize..=12,
        k_pick in 1usize..=12,
        block_size in 1usize..=8,
        renormalize in any::<bool>(),
        ties in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let mut r = rng(seed);
        let logits = if ties { small_ints(&mut r, &[t, e]) } else { uniform(&mut r, &[t, e], 4.0) };
        let p = MoeRouteParams { top_k: k_pick.min(e), renormalize, block_size };
        route_and_check(&logits, p).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }

    #[test]
    fn experts_match_naive(
        t in 0usize..=40,
        h in 1usize..=40,
        f in 1usize..=24,
        e in 1usize..=6,
        k_pick in 1usize..=6,
        block_size in 1usize..=5,
        ties in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let case = ExpertsCase { t, h, f, e, k: k_pick.min(e), block_size, ties, seed };
        check_experts(&case).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
}

#[test]
fn route_ties_k_equal_e_and_single_token() -> TestResult {
    let mut r = rng(1);
    // All logits equal: ids must be 0..k in order.
    let flat = ArrayD::from_elem(IxDyn(&[3, 5]), 0.5f32);
    let out = route_and_check(
        &flat,
        MoeRouteParams {
            top_k: 5,
            renormalize: false,
            block_size: 4,
        },
    )?;
    assert_eq!(
        out[0].as_i32()?.iter().copied().collect::<Vec<_>>(),
        [0, 1, 2, 3, 4].repeat(3)
    );
    // k = E with ties, T = 1, and an expert nobody uses (count 0, empty segment).
    route_and_check(
        &small_ints(&mut r, &[1, 6]),
        MoeRouteParams {
            top_k: 6,
            renormalize: true,
            block_size: 3,
        },
    )?;
    let out = route_and_check(
        &uniform(&mut r, &[1, 8], 2.0),
        MoeRouteParams {
            top_k: 1,
            renormalize: true,
            block_size: 4,
        },
    )?;
    let counts = out[2].as_i32()?;
    assert_eq!(counts.iter().filter(|&&c| c == 0).count(), 7);
    let offsets: Vec<i32> = out[4].as_i32()?.iter().copied().collect();
    assert_eq!(offsets[8], 4, "one slot padded to one block of 4");
    Ok(())
}

/// Ties built on purpose, the rule the GPU kernels follow too: equal logits rank the lower
/// expert first, -0 ties +0, and values one f32 ulp apart are not ties.
#[test]
fn route_constructed_ties_pick_the_lower_expert() -> TestResult {
    let e = 8;
    let up = f32::from_bits(1.25f32.to_bits() + 1);
    let rows: Vec<[f32; 8]> = vec![
        [0.5; 8],                                         // all equal: 0, 1, 2
        [-1.0, -1.0, -1.0, -0.0, -1.0, 0.0, 0.0, -1.0],   // -0 at 3 ties +0 at 5, 6: 3, 5, 6
        [1.0, -2.0, 1.0, -2.0, 3.0, 1.0, -2.0, 1.0],      // 3 first, then the lower 1.0s: 4, 0, 2
        [1.25, -1.0, -1.0, -1.0, -1.0, up, -1.0, 1.25],   // one ulp above: 5, then 0, 7
        [-5.0, -5.0, -5.0, -5.0, -5.0, -5.0, -5.0, -4.0], // k-th place tied: 7, 0, 1
    ];
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    let logits = ArrayD::from_shape_vec(IxDyn(&[rows.len(), e]), flat)?;
    for renormalize in [true, false] {
        let p = MoeRouteParams {
            top_k: 3,
            renormalize,
            block_size: 2,
        };
        let out = route_and_check(&logits, p)?;
        assert_eq!(
            out[0].as_i32()?.iter().copied().collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 5, 6, 4, 0, 2, 5, 0, 7, 7, 0, 1]
        );
    }
    // One expert taking every token (as the first choice), the others idle at k = 1.
    let mut one = ArrayD::from_elem(IxDyn(&[40, e]), -1.0f32);
    for t in 0..40 {
        one[[t, 6]] = 2.0;
    }
    let p = MoeRouteParams {
        top_k: 1,
        renormalize: true,
        block_size: 16,
    };
    let out = route_and_check(&one, p)?;
    let counts: Vec<i32> = out[2].as_i32()?.iter().copied().collect();
    assert_eq!(counts, vec![0, 0, 0, 0, 0, 0, 40, 0]);
    let offsets: Vec<i32> = out[4].as_i32()?.iter().copied().collect();
    assert_eq!(offsets, vec![0, 0, 0, 0, 0, 0, 0, 48, 48]);
    Ok(())
}

#[test]
fn route_layout_spelled_out() -> TestResult {
    // T = 3, E = 3, k = 2: token 0 -> (2, 0), token 1 -> (2, 1), token 2 -> (0, 2).
    let logits = ArrayD::from_shape_vec(
        IxDyn(&[3, 3]),
        vec![2.0f32, 0.0, 3.0, 0.0, 1.0, 4.0, 5.0, -1.0, 1.0],
    )?;
    let out = route_and_check(
        &logits,
        MoeRouteParams {
            top_k: 2,
            renormalize: true,
            block_size: 2,
        },
    )?;
    let v = |i: usize| -> TestResult<Vec<i32>> { Ok(out[i].as_i32()?.iter().copied().collect()) };
    assert_eq!(v(0)?, vec![2, 0, 2, 1, 0, 2]);
    assert_eq!(v(2)?, vec![2, 1, 3]);
    // Slots: expert 0 <- {1, 4}, expert 1 <- {3} + pad, expert 2 <- {0, 2, 5} + pad; sentinel 6.
    assert_eq!(out[3].shape(), &[10]); // (6 + 3 * 1) rounded up to 2
    assert_eq!(v(3)?, vec![1, 4, 3, 6, 0, 2, 5, 6, 6, 6]);
    assert_eq!(v(4)?, vec![0, 2, 4, 8]);
    Ok(())
}

#[test]
fn route_no_tokens() -> TestResult {
    let p = MoeRouteParams {
        top_k: 2,
        renormalize: true,
        block_size: 4,
    };
    let logits = ArrayD::<f32>::zeros(IxDyn(&[0, 5]));
    let out = route_and_check(&logits, p)?;
    assert_eq!(out[0].shape(), &[0, 2]);
    assert_eq!(out[3].shape(), &[p.padded_len(0, 5)]);
    assert!(
        out[3].as_i32()?.iter().all(|&s| s == 0),
        "all sentinel (T*k = 0)"
    );
    assert!(out[4].as_i32()?.iter().all(|&o| o == 0));
    assert_eq!(
        out[5].as_f32()?.iter().copied().collect::<Vec<_>>(),
        vec![0.0]
    );
    assert_eq!(
        out[6].as_f32()?.iter().copied().collect::<Vec<_>>(),
        vec![0.0]
    );
    Ok(())
}

struct ExpertsCase {
    t: usize,
    h: usize,
    f: usize,
    e: usize,
    k: usize,
    block_size: usize,
    ties: bool,
    seed: u64,
}

/// y[t] = sum_j w[t, j] * down_e (silu(gate_e x_t) * (up_e x_t)), e = ids[t, j], directly.
fn naive_experts(
    x: &Array2<f64>,
    route: &Route,
    k: usize,
    gate_up: &ArrayD<f64>,
    down: &ArrayD<f64>,
) -> Array2<f64> {
    let (t, h) = x.dim();
    let f = gate_up.shape()[1] / 2;
    let mut y = Array2::<f64>::zeros((t, h));
    for tok in 0..t {
        for j in 0..k {
            let e = route.ids[tok * k + j];
            let w = route.weights[tok * k + j];
            let act: Vec<f64> = (0..f)
                .map(|i| {
                    let g: f64 = (0..h).map(|c| gate_up[[e, i, c]] * x[[tok, c]]).sum();
                    let u: f64 = (0..h).map(|c| gate_up[[e, f + i, c]] * x[[tok, c]]).sum();
                    g / (1.0 + (-g).exp()) * u
                })
                .collect();
            for c in 0..h {
                y[[tok, c]] += w * (0..f).map(|i| down[[e, c, i]] * act[i]).sum::<f64>();
            }
        }
    }
    y
}

/// The seven experts inputs for a case, as f32/i32 tensors, and the naive f64 output.
fn experts_inputs(c: &ExpertsCase) -> TestResult<(Vec<Tensor>, Array2<f64>)> {
    let mut r = rng(c.seed);
    let x = uniform(&mut r, &[c.t, c.h], 1.0);
    let logits = if c.ties {
        small_ints(&mut r, &[c.t, c.e])
    } else {
        uniform(&mut r, &[c.t, c.e], 3.0)
    };
    let gate_up = uniform(&mut r, &[c.e, 2 * c.f, c.h], 0.5);
    let down = uniform(&mut r, &[c.e, c.h, c.f], 0.5);
    let route = naive_route(
        &logits.mapv(f64::from).into_dimensionality()?,
        c.k,
        true,
        c.block_size,
    );
    // The op sees f32 weights; the naive sum uses the same rounded values.
    let w32: Vec<f32> = route.weights.iter().map(|&w| w as f32).collect();
    let route = Route {
        weights: w32.iter().map(|&w| f64::from(w)).collect(),
        ..route
    };
    let want = naive_experts(
        &x.mapv(f64::from).into_dimensionality()?,
        &route,
        c.k,
        &gate_up.mapv(f64::from),
        &down.mapv(f64::from),
    );
    let i32s = |v: &[usize], shape: &[usize]| {
        Tensor::from_vec_i32(shape, v.iter().map(|&i| i as i32).collect())
    };
    let inputs = vec![
        Tensor::from_f32(x),
        i32s(&route.ids, &[c.t, c.k])?,
        Tensor::from_vec_f32(&[c.t, c.k], w32)?,
        i32s(&route.sorted, &[route.sorted.len()])?,
        i32s(&route.offsets, &[c.e + 1])?,
        Tensor::from_f32(gate_up),
        Tensor::from_f32(down),
    ];
    Ok((inputs, want))
}

fn check_experts(c: &ExpertsCase) -> TestResult {
    let (inputs, want) = experts_inputs(c)?;
    let want = want.into_dyn();
    let op = Op::MoeExperts(MoeExpertsParams {});
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let out = op.run_cpu(&refs)?;
    let metas: Vec<TensorMeta> = inputs.iter().map(|t| t.meta()).collect();
    assert_eq!(
        vec![out[0].meta()],
        op.validate(&metas)?.into_vec(),
        "output metas differ from validate()"
    );
    let e32 = rel_err(&out[0].to_f64(), &want);
    let r = op.reference(&inputs.iter().map(|t| t.to_f64()).collect::<Vec<_>>())?;
    let e64 = rel_err(&r[0], &want);
    if e32 >= F32_TOL || e64 >= F64_TOL {
        return Err(format!("experts: f32 {e32:.2e}, f64 {e64:.2e}").into());
    }
    Ok(())
}

/// Sizes above the CPU ops' serial threshold (2^17 elements or multiply-adds), so the
/// rayon paths run.
#[test]
fn experts_large_enough_to_split_gemms() -> TestResult {
    let case = ExpertsCase {
        t: 1100,
        h: 64,
        f: 96,
        e: 8,
        k: 2,
        block_size: 16,
        ties: false,
        seed: 9,
    };
    check_experts(&case)
}

#[test]
fn experts_no_tokens_and_unused_experts() -> TestResult {
    check_experts(&ExpertsCase {
        t: 0,
        h: 8,
        f: 4,
        e: 3,
        k: 2,
        block_size: 4,
        ties: false,
        seed: 1,
    })?;
    check_experts(&ExpertsCase {
        t: 1,
        h: 8,
        f: 4,
        e: 6,
        k: 1,
        block_size: 4,
        ties: false,
        seed: 2,
    })
}

#[test]
fn experts_repeat_bit_for_bit() -> TestResult {
    let case = ExpertsCase {
        t: 64,
        h: 32,
        f: 48,
        e: 4,
        k: 2,
        block_size: 8,
        ties: true,
        seed: 4,
    };
    let (inputs, _) = experts_inputs(&case)?;
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let op = Op::MoeExperts(MoeExpertsParams {});
    let first = op.run_cpu(&refs)?;
    assert_eq!(first, op.run_cpu(&refs)?);
    Ok(())
}

#[test]
fn route_output_drives_experts() -> TestResult {
    // The CPU router's outputs are valid experts inputs as they are.
    let mut r = rng(21);
    let (t, h, f, e, k) = (37, 16, 8, 5, 2);
    let x = Tensor::from_f32(uniform(&mut r, &[t, h], 1.0));
    let logits = Tensor::from_f32(uniform(&mut r, &[t, e], 2.0));
    let routed = Op::MoeRoute(MoeRouteParams {
        top_k: k,
        renormalize: true,
        block_size: 4,
    })
    .run_cpu(&[&logits])?;
    let gate_up = Tensor::from_f32(uniform(&mut r, &[e, 2 * f, h], 0.5));
    let down = Tensor::from_f32(uniform(&mut r, &[e, h, f], 0.5));
    let inputs = [
        &x, &routed[0], &routed[1], &routed[3], &routed[4], &gate_up, &down,
    ];
    let y = Op::MoeExperts(MoeExpertsParams {}).run_cpu(&inputs)?;
    assert_eq!(y[0].meta(), TensorMeta::new(vec![t, h], DType::F32));
    Ok(())
}

/// Sizes above the CPU ops' serial threshold (2^17 elements or multiply-adds), so the
/// rayon paths run.
#[test]
fn route_large_enough_to_run_in_parallel() -> TestResult {
    let mut r = rng(33);
    let p = MoeRouteParams {
        top_k: 3,
        renormalize: true,
        block_size: 8,
    };
    route_and_check(&uniform(&mut r, &[9001, 16], 3.0), p)?;
    route_and_check(&small_ints(&mut r, &[9001, 16]), p)?;
    Ok(())
}
