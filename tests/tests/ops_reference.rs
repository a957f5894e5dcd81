//! The CPU ops (f32 fast path and f64 reference) against PyTorch's float64 vectors in
//! `data/reference` (see its README.md and index.json).

use ndarray::ArrayD;
use tandem::Op;
use tandem::ops::{AttentionParams, MoeRouteParams};
use tandem_tests::{
    TestResult, f32_tensor, get, load_reference, reference_case, rel_err, rel_err_neg_inf,
};

/// f32 fast path against float64 PyTorch.
const F32_TOL: f64 = 1e-5;
/// f64 reference against float64 PyTorch.
const F64_TOL: f64 = 1e-12;

fn attention_case(name: &str) -> TestResult {
    let file = load_reference(name)?;
    let case = reference_case(name)?;
    let causal = case["causal"].as_bool().ok_or("index.json: causal")?;
    let d = case["D"].as_u64().ok_or("index.json: D")? as f64;
    let scale = case["scale"].as_f64().ok_or("index.json: scale")?;
    assert!(
        (scale - 1.0 / d.sqrt()).abs() < 1e-15,
        "{name}: scale is not 1/sqrt(D)"
    );
    let op = Op::Attention(AttentionParams {
        causal,
        scale: None,
    });
    let (q, k, v) = (get(&file, "q")?, get(&file, "k")?, get(&file, "v")?);
    let (o_ref, lse_ref) = (get(&file, "o")?, get(&file, "lse")?);

    let out = op.run_cpu(&[&f32_tensor(q), &f32_tensor(k), &f32_tensor(v)])?;
    let (eo, el) = (
        rel_err(&out[0].to_f64(), o_ref),
        rel_err_neg_inf(&out[1].to_f64(), lse_ref)?,
    );
    assert!(
        eo < F32_TOL && el < F32_TOL,
        "{name} f32: o {eo:.2e}, lse {el:.2e}"
    );

    let r = op.reference(&[q.clone(), k.clone(), v.clone()])?;
    let (eo, el) = (rel_err(&r[0], o_ref), rel_err_neg_inf(&r[1], lse_ref)?);
    assert!(
        eo < F64_TOL && el < F64_TOL,
        "{name} f64: o {eo:.2e}, lse {el:.2e}"
    );
    Ok(())
}

#[test]
fn attention_0_causal_mha() -> TestResult {
    attention_case("attention_0")
}

#[test]
fn attention_1_gqa_not_causal() -> TestResult {
    attention_case("attention_1")
}

#[test]
fn attention_2_mqa_causal_short_queries() -> TestResult {
    attention_case("attention_2")
}

/// Checks one routing result (f32 outputs widened, or the f64 reference) against the file.
fn check_route(
    name: &str,
    outs: &[ArrayD<f64>],
    file: &std::collections::HashMap<String, ArrayD<f64>>,
    weights_key: &str,
    tol: f64,
) -> TestResult {
    assert_eq!(&outs[0], get(file, "topk_ids")?, "{name}: topk_ids");
    assert_eq!(
        &outs[2],
        get(file, "expert_counts")?,
        "{name}: expert_counts"
    );
    let checks = [
        (weights_key, &outs[1]),
        ("aux_loss", &outs[5]),
        ("z_loss", &outs[6]),
    ];
    for (key, out) in checks {
        let err = rel_err(out, get(file, key)?);
        assert!(err < tol, "{name}: {key} rel. error {err:.2e} >= {tol:.0e}");
    }
    Ok(())
}

fn route_case(name: &str) -> TestResult {
    let file = load_reference(name)?;
    let logits = get(&file, "logits")?;
    let k = get(&file, "topk_ids")?.shape()[1];
    for (renormalize, key) in [(false, "topk_weights"), (true, "topk_weights_renorm")] {
        let op = Op::MoeRoute(MoeRouteParams {
            top_k: k,
            renormalize,
            block_size: 16,
        });
        let out = op.run_cpu(&[&f32_tensor(logits)])?;
        let wide: Vec<ArrayD<f64>> = out.iter().map(|t| t.to_f64()).collect();
        check_route(name, &wide, &file, key, F32_TOL)?;
        let r = op.reference(std::slice::from_ref(logits))?;
        check_route(name, &r, &file, key, F64_TOL)?;
    }
    Ok(())
}

#[test]
fn moe_route_0_top2_of_8() -> TestResult {
    route_case("moe_route_0")
}

#[test]
fn moe_route_1_top4_of_16() -> TestResult {
    route_case("moe_route_1")
}

#[test]
fn rope_tables_match_the_mixtral_layer() -> TestResult {
    // transformers' cos/sin [1, T, D], each half a copy of the other ([cos..., cos...]).
    let file = load_reference("mixtral_layer_0")?;
    let (cos_ref, sin_ref) = (get(&file, "rope_cos")?, get(&file, "rope_sin")?);
    let (t, d) = (cos_ref.shape()[1], cos_ref.shape()[2]);
    let (cos, sin) = tandem::ops::RopeParams::default().tables::<f64>(t, d);
    let dup = |half: &[f64]| -> TestResult<ArrayD<f64>> {
        let rows = half
            .chunks(d / 2)
            .flat_map(|r| r.iter().chain(r.iter()).copied());
        Ok(ArrayD::from_shape_vec(vec![1, t, d], rows.collect())?)
    };
    // transformers computes inv_freq in float32 before widening: they agree to 3.6e-8.
    let (ec, es) = (rel_err(&dup(&cos)?, cos_ref), rel_err(&dup(&sin)?, sin_ref));
    assert!(
        ec < 1e-6 && es < 1e-6,
        "rope tables: cos {ec:.2e}, sin {es:.2e}"
    );
    Ok(())
}
