//! Bad inputs: every op answers InvalidArgument with a message naming the problem, through
//! `Op`, through the op's own `cpu`/`reference`, and never panics.

use ndarray::{ArrayD, IxDyn};
use tandem::ops::{
    Activation, AttentionParams, LinearParams, MoeExpertsParams, MoeRouteParams, RmsNormParams,
    RopeParams, SplitHeadsParams,
};
use tandem::{DType, Op, Tensor, TensorMeta};
use tandem_tests::{TestResult, assert_invalid, rng, uniform};

fn f32s(shape: &[usize]) -> Tensor {
    Tensor::zeros(&TensorMeta::new(shape, DType::F32))
}

fn i32s(shape: &[usize]) -> Tensor {
    Tensor::zeros(&TensorMeta::new(shape, DType::I32))
}

fn att() -> Op {
    Op::Attention(AttentionParams::default())
}

#[test]
fn attention_rejects_bad_inputs() {
    let q = f32s(&[1, 4, 8, 16]);
    let kv = f32s(&[1, 2, 8, 16]);
    assert_invalid(att().run_cpu(&[&q, &kv]), &["takes 3 inputs", "q, k, v"]);
    assert_invalid(
        att().run_cpu(&[&q, &kv, &f32s(&[1, 2, 9, 16])]),
        &["one shape"],
    );
    assert_invalid(
        att().run_cpu(&[&q, &f32s(&[1, 2, 8, 8]), &f32s(&[1, 2, 8, 8])]),
        &["head dim"],
    );
    assert_invalid(
        att().run_cpu(&[&i32s(&[1, 4, 8, 16]), &kv, &kv]),
        &["q is i32", "expected f32"],
    );
    assert_invalid(
        att().run_cpu(&[&f32s(&[4, 8, 16]), &kv, &kv]),
        &["[B, H, N, D]"],
    );
    let odd = f32s(&[1, 3, 8, 16]);
    assert_invalid(
        att().run_cpu(&[&q, &odd, &odd]),
        &["multiple of kv heads 3"],
    );
    let z = f32s(&[1, 4, 8, 0]);
    assert_invalid(
        att().run_cpu(&[&z, &f32s(&[1, 2, 8, 0]), &f32s(&[1, 2, 8, 0])]),
        &["zero-sized"],
    );
    let empty = f32s(&[1, 2, 0, 16]);
    assert_invalid(att().run_cpu(&[&q, &empty, &empty]), &["kv length is 0"]);
    let bad_scale = Op::Attention(AttentionParams {
        causal: true,
        scale: Some(f32::NAN),
    });
    assert_invalid(bad_scale.run_cpu(&[&q, &kv, &kv]), &["scale"]);
    // The op's own methods check too.
    assert_invalid(AttentionParams::default().cpu(&[&q]), &["takes 3 inputs"]);
    assert_invalid(
        AttentionParams::default().reference(&[]),
        &["takes 3 inputs"],
    );
    assert_invalid(
        AttentionParams::default().cpu(&[&q, &odd, &odd]),
        &["multiple"],
    );
}

fn route(top_k: usize) -> Op {
    Op::MoeRoute(MoeRouteParams {
        top_k,
        renormalize: true,
        block_size: 4,
    })
}

#[test]
fn moe_route_rejects_bad_inputs() -> TestResult {
    let l = f32s(&[5, 4]);
    assert_invalid(route(5).run_cpu(&[&l]), &["top_k = 5", "1..=4"]);
    assert_invalid(route(0).run_cpu(&[&l]), &["top_k = 0"]);
    assert_invalid(route(2).run_cpu(&[&i32s(&[5, 4])]), &["logits are i32"]);
    assert_invalid(route(2).run_cpu(&[&f32s(&[20])]), &["[T, E]"]);
    assert_invalid(route(1).run_cpu(&[&f32s(&[5, 0])]), &["0 experts"]);
    assert_invalid(route(2).run_cpu(&[&l, &l]), &["takes 1 inputs"]);
    let zero_block = Op::MoeRoute(MoeRouteParams {
        top_k: 1,
        renormalize: true,
        block_size: 0,
    });
    assert_invalid(zero_block.run_cpu(&[&l]), &["block_size"]);
    let mut logits = uniform(&mut rng(1), &[6, 4], 1.0);
    logits[[3, 2]] = f32::NAN;
    assert_invalid(
        route(2).run_cpu(&[&Tensor::from_f32(logits.clone())]),
        &["row 3", "NaN"],
    );
    assert_invalid(
        route(2).reference(&[logits.mapv(f64::from)]),
        &["row 3", "NaN"],
    );
    logits[[3, 2]] = 0.0;
    logits[[5, 0]] = f32::NEG_INFINITY;
    assert_invalid(
        route(2).run_cpu(&[&Tensor::from_f32(logits)]),
        &["row 5", "-inf"],
    );
    assert_invalid(MoeRouteParams::default().validate(&[]), &["takes 1 inputs"]);
    Ok(())
}

/// Valid experts inputs for T = 2, H = 4, E = 3, k = 2, F = 2, block 2: token 0 -> (0, 2),
/// token 1 -> (2, 1); slots 0..4, sentinel 4.
fn experts_inputs() -> TestResult<Vec<Tensor>> {
    Ok(vec![
        f32s(&[2, 4]),
        Tensor::from_vec_i32(&[2, 2], vec![0, 2, 2, 1])?,
        f32s(&[2, 2]),
        Tensor::from_vec_i32(&[8], vec![0, 4, 3, 4, 1, 2, 4, 4])?,
        Tensor::from_vec_i32(&[4], vec![0, 2, 4, 6])?,
        f32s(&[3, 4, 4]),
        f32s(&[3, 4, 2]),
    ])
}

fn run_experts(inputs: &[Tensor]) -> tandem::Result<Vec<Tensor>> {
    let refs: Vec<&Tensor> = inputs.iter().collect();
    Op::MoeExperts(MoeExpertsParams {}).run_cpu(&refs)
}

fn reference_experts(inputs: &[Tensor]) -> tandem::Result<Vec<ArrayD<f64>>> {
    let wide: Vec<ArrayD<f64>> = inputs.iter().map(|t| t.to_f64()).collect();
    MoeExpertsParams {}.reference(&wide)
}

/// The valid inputs with input `i` replaced.
fn with(i: usize, t: Tensor) -> TestResult<Vec<Tensor>> {
    let mut v = experts_inputs()?;
    v[i] = t;
    Ok(v)
}

#[test]
fn moe_experts_rejects_bad_inputs() -> TestResult {
    run_experts(&experts_inputs()?)?;
    reference_experts(&experts_inputs()?)?;
    let ids = |v: Vec<i32>| Tensor::from_vec_i32(&[2, 2], v);
    let sorted = |v: Vec<i32>| Tensor::from_vec_i32(&[8], v);
    let cases: Vec<(Vec<Tensor>, Vec<&str>)> = vec![
        (
            with(1, ids(vec![0, 3, 2, 1])?)?,
            vec!["topk_ids[0, 1] = 3", "not an expert id"],
        ),
        (
            with(1, ids(vec![0, 2, -1, 1])?)?,
            vec!["topk_ids[1, 0] = -1"],
        ),
        (
            with(3, sorted(vec![0, 9, 3, 4, 1, 2, 4, 4])?)?,
            vec!["sorted_token_ids[1] = 9", "sentinel 4"],
        ),
        (
            with(3, sorted(vec![0, -2, 3, 4, 1, 2, 4, 4])?)?,
            vec!["sorted_token_ids[1] = -2"],
        ),
        (
            with(3, sorted(vec![1, 4, 3, 4, 0, 2, 4, 4])?)?,
            vec!["slot 1", "expert 0's segment"],
        ),
        (
            with(3, sorted(vec![0, 0, 3, 4, 1, 2, 4, 4])?)?,
            vec!["slot 0 appears twice"],
        ),
        (
            with(4, Tensor::from_vec_i32(&[4], vec![0, 2, 1, 6])?)?,
            vec!["expert_offsets", "must rise"],
        ),
        (
            with(4, Tensor::from_vec_i32(&[4], vec![0, 2, 4, 9])?)?,
            vec!["expert_offsets", "<= 8"],
        ),
        (
            with(6, f32s(&[3, 2, 4]))?,
            vec!["down [3, 2, 4] must be [3, 4, 2]"],
        ),
        (with(5, f32s(&[3, 3, 4]))?, vec!["gate_up"]),
        (with(2, f32s(&[2, 3]))?, vec!["topk_weights"]),
        (with(4, i32s(&[3]))?, vec!["expert_offsets"]),
    ];
    for (inputs, needles) in cases {
        assert_invalid(run_experts(&inputs), &needles);
        assert_invalid(reference_experts(&inputs), &needles);
    }
    // Dtypes exist only on the CPU path (reference inputs are all f64).
    let dtype_cases: Vec<(Vec<Tensor>, Vec<&str>)> = vec![
        (
            with(1, f32s(&[2, 2]))?,
            vec!["topk_ids is f32", "expected i32"],
        ),
        (with(0, i32s(&[2, 4]))?, vec!["x is i32"]),
    ];
    for (inputs, needles) in dtype_cases {
        assert_invalid(run_experts(&inputs), &needles);
    }
    let mut short = experts_inputs()?;
    short.pop();
    assert_invalid(run_experts(&short), &["takes 7 inputs"]);
    assert_invalid(MoeExpertsParams {}.reference(&[]), &["takes 7 inputs"]);
    // A reference id that is not an integer.
    let mut wide: Vec<ArrayD<f64>> = experts_inputs()?.iter().map(|t| t.to_f64()).collect();
    wide[1][[0, 0]] = 0.5;
    assert_invalid(
        MoeExpertsParams {}.reference(&wide),
        &["topk_ids holds 0.5"],
    );
    Ok(())
}

#[test]
fn linear_rejects_bad_inputs() {
    let op = |bias| {
        Op::Linear(LinearParams {
            act: Activation::Relu,
            bias,
            f32_out: false,
        })
    };
    let (x, w) = (f32s(&[3, 8]), f32s(&[5, 8]));
    assert_invalid(
        op(false).run_cpu(&[&x, &f32s(&[5, 7])]),
        &["K = 8", "K = 7"],
    );
    assert_invalid(op(true).run_cpu(&[&x, &w, &f32s(&[4])]), &["bias", "[5]"]);
    assert_invalid(
        op(false).run_cpu(&[&i32s(&[3, 8]), &w]),
        &["input 0 is i32"],
    );
    assert_invalid(
        op(false).run_cpu(&[&f32s(&[3, 0]), &f32s(&[5, 0])]),
        &["zero-sized"],
    );
    assert_invalid(op(true).run_cpu(&[&x, &w]), &["takes 3 inputs"]);
    assert_invalid(
        LinearParams {
            act: Activation::None,
            bias: true,
            f32_out: false,
        }
        .cpu(&[&x, &w]),
        &["takes 3 inputs"],
    );
    assert_invalid(
        LinearParams::default().reference(&[ArrayD::zeros(IxDyn(&[3, 8]))]),
        &["takes 2 inputs"],
    );
}

#[test]
fn rmsnorm_rejects_bad_inputs() {
    let op = |residual| {
        Op::RmsNorm(RmsNormParams {
            eps: 1e-5,
            residual,
        })
    };
    let x = f32s(&[3, 8]);
    assert_invalid(
        op(false).run_cpu(&[&x, &f32s(&[7])]),
        &["w has shape [7]", "[8]"],
    );
    assert_invalid(
        op(true).run_cpu(&[&x, &f32s(&[8]), &f32s(&[4, 8])]),
        &["residual"],
    );
    assert_invalid(
        op(false).run_cpu(&[&f32s(&[3, 0]), &f32s(&[0])]),
        &["empty last dimension"],
    );
    assert_invalid(op(false).run_cpu(&[&x, &i32s(&[8])]), &["input 1 is i32"]);
    let neg = Op::RmsNorm(RmsNormParams {
        eps: -1.0,
        residual: false,
    });
    assert_invalid(neg.run_cpu(&[&x, &f32s(&[8])]), &["eps"]);
    assert_invalid(
        RmsNormParams {
            eps: 1e-5,
            residual: true,
        }
        .cpu(&[&x, &f32s(&[8])]),
        &["takes 3 inputs"],
    );
}

#[test]
fn rope_rejects_bad_inputs() {
    let op = Op::Rope(RopeParams::default());
    assert_invalid(op.run_cpu(&[&f32s(&[1, 2, 3, 7])]), &["head dim 7", "even"]);
    assert_invalid(op.run_cpu(&[&f32s(&[2, 3, 8])]), &["[B, H, T, D]"]);
    assert_invalid(op.run_cpu(&[&i32s(&[1, 2, 3, 8])]), &["x is i32"]);
    let low = Op::Rope(RopeParams {
        base: 1.0,
        position_offset: 0,
    });
    assert_invalid(low.run_cpu(&[&f32s(&[1, 2, 3, 8])]), &["base"]);
    assert_invalid(RopeParams::default().cpu(&[]), &["takes 1 inputs"]);
}

#[test]
fn add_and_layouts_reject_bad_inputs() {
    assert_invalid(
        Op::Add.run_cpu(&[&f32s(&[2, 3]), &f32s(&[3, 2])]),
        &["[2, 3]", "[3, 2]", "differ"],
    );
    assert_invalid(
        Op::Add.run_cpu(&[&f32s(&[2]), &i32s(&[2])]),
        &["expected f32"],
    );
    assert_invalid(
        tandem::ops::elementwise::cpu_add(&[&f32s(&[2])]),
        &["takes 2 inputs"],
    );
    assert_invalid(
        tandem::ops::elementwise::cpu_add(&[&f32s(&[2]), &f32s(&[1, 2])]),
        &["differ"],
    );
    let split = |batch, heads| Op::SplitHeads(SplitHeadsParams { batch, heads });
    assert_invalid(split(2, 2).run_cpu(&[&f32s(&[5, 4])]), &["does not split"]);
    assert_invalid(
        split(0, 2).run_cpu(&[&f32s(&[4, 4])]),
        &["batch and heads must be > 0"],
    );
    assert_invalid(
        SplitHeadsParams { batch: 0, heads: 1 }.cpu(&[&f32s(&[4, 4])]),
        &["> 0"],
    );
    assert_invalid(Op::MergeHeads.run_cpu(&[&f32s(&[4, 4])]), &["[B, H, T, D]"]);
    assert_invalid(tandem::ops::layout::cpu_merge(&[]), &["takes 1 inputs"]);
}
