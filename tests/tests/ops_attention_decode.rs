//! Decode attention on the CPU: the f32 fast path against the f64 reference on odd shapes
//! (Nq 1/3/16, lengths off every block, GQA ratios 1/4/8/32, head dims 64/128/256), decode
//! against prefill-then-slice (the attention op, bottom-right causal, on the whole sequence,
//! last Nq rows), paged against contiguous on the same data (shuffled block table, NaN in every
//! cache row no sequence owns), and bad values refused with what is accepted.

use ndarray::ArrayD;
use tandem::ops::AttentionDecodeParams;
use tandem::{ErrorKind, Op, Tensor};
use tandem_tests::decode::{DecodeCase, contiguous, last_rows, paged, prefill, sequence_rows};
use tandem_tests::{TestResult, rel_err, rng};

/// f32 fast path against exact f64.
const F32_TOL: f64 = 2e-5;
/// f64 paths against each other.
const F64_TOL: f64 = 1e-12;

fn f64s(inputs: &[Tensor]) -> Vec<ArrayD<f64>> {
    inputs.iter().map(Tensor::to_f64).collect()
}

fn check(name: &str, got: &ArrayD<f64>, want: &ArrayD<f64>, tol: f64) {
    assert_eq!(got.shape(), want.shape(), "{name}: shape");
    assert!(got.iter().all(|x| x.is_finite()), "{name}: not finite");
    let e = rel_err(got, want);
    assert!(e < tol, "{name}: rel err {e:.3e} >= {tol:.0e}");
}

fn cases() -> Vec<DecodeCase> {
    let c = |hq, hkv, nq, d, lens: &[usize], nmax| DecodeCase {
        hq,
        hkv,
        nq,
        d,
        lens: lens.to_vec(),
        nmax,
    };
    vec![
        c(4, 4, 1, 64, &[1, 37, 200], 203), // MHA, a sequence of just its new token
        c(8, 2, 3, 128, &[3, 70, 129], 150), // GQA 4, Nq 3
        c(8, 1, 16, 64, &[16, 33, 100], 100), // GQA 8, Nq 16, one sequence at capacity
        c(32, 1, 2, 64, &[95, 2], 97),      // MQA 32
        c(4, 2, 5, 256, &[61, 130], 131),   // d 256
    ]
}

#[test]
fn cpu_matches_the_reference_on_odd_shapes() -> TestResult {
    let mut r = rng(11);
    for c in cases() {
        let ins = contiguous(&c, &mut r, |x| x);
        let op = c.op();
        let refs: Vec<&Tensor> = ins.iter().collect();
        let got = op.run_cpu(&refs)?;
        let want = op.reference(&f64s(&ins))?;
        check(&format!("{c:?} o"), &got[0].to_f64(), &want[0], F32_TOL);
        check(&format!("{c:?} lse"), &got[1].to_f64(), &want[1], F32_TOL);
    }
    Ok(())
}

#[test]
fn decode_is_the_last_rows_of_prefill() -> TestResult {
    let mut r = rng(12);
    for c in cases() {
        let ins = contiguous(&c, &mut r, |x| x);
        let refs: Vec<&Tensor> = ins.iter().collect();
        let dec_cpu = c.op().run_cpu(&refs)?;
        let dec_ref = c.op().reference(&f64s(&ins))?;
        for b in 0..c.b() {
            let (att, pre) = prefill(&c, &ins, b, &mut r);
            let pre_ref = att.reference(&f64s(&pre))?;
            for (i, what) in ["o", "lse"].iter().enumerate() {
                let want = last_rows(&pre_ref[i], c.nq);
                let name = format!("{c:?} seq {b} {what}");
                check(&name, &sequence_rows(&dec_ref[i], b), &want, F64_TOL);
                check(
                    &name,
                    &sequence_rows(&dec_cpu[i].to_f64(), b),
                    &want,
                    F32_TOL,
                );
            }
        }
    }
    Ok(())
}

#[test]
fn paged_matches_contiguous_on_the_same_data() -> TestResult {
    let mut r = rng(13);
    for c in cases() {
        let ins = contiguous(&c, &mut r, |x| x);
        let refs: Vec<&Tensor> = ins.iter().collect();
        let want_cpu = c.op().run_cpu(&refs)?;
        let want_ref = c.op().reference(&f64s(&ins))?;
        for bs in [1, 16, 32] {
            let pins = paged(&c, &ins, bs, 3, &mut r);
            let op = c.paged_op(bs);
            let prefs: Vec<&Tensor> = pins.iter().collect();
            let got = op.run_cpu(&prefs)?;
            let got_ref = op.reference(&f64s(&pins))?;
            for i in 0..2 {
                let name = format!("{c:?} bs {bs} output {i}");
                // the same f32 arithmetic in the same order: equal
                assert_eq!(got[i].to_f64(), want_cpu[i].to_f64(), "{name}");
                check(&name, &got_ref[i], &want_ref[i], F64_TOL);
            }
        }
    }
    Ok(())
}

#[test]
fn bad_lengths_and_block_ids_are_refused() -> TestResult {
    let c = DecodeCase {
        hq: 2,
        hkv: 1,
        nq: 3,
        d: 64,
        lens: vec![20, 5],
        nmax: 40,
    };
    let mut r = rng(14);
    let ins = contiguous(&c, &mut r, |x| x);
    let with_lens = |ins: &[Tensor], lens: Vec<i32>| -> Vec<Tensor> {
        let mut v = ins.to_vec();
        v[3] = Tensor::from_vec_i32(&[2], lens).expect("lens");
        v
    };
    let expect_err = |op: &Op, ins: &[Tensor], want: &str| {
        let refs: Vec<&Tensor> = ins.iter().collect();
        let e = op.run_cpu(&refs).expect_err(want);
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().contains(want), "{e}");
        let e = op.reference(&f64s(ins)).expect_err(want);
        assert!(e.to_string().contains(want), "{e}");
    };
    // a length below Nq (0 among them) or past the capacity
    expect_err(&c.op(), &with_lens(&ins, vec![0, 5]), "accepted: 3..=40");
    expect_err(&c.op(), &with_lens(&ins, vec![2, 5]), "seq_lens[0] = 2");
    expect_err(&c.op(), &with_lens(&ins, vec![20, 41]), "seq_lens[1] = 41");
    // a block id outside the cache, or -1 where a sequence still has tokens
    let pins = paged(&c, &ins, 16, 0, &mut r);
    let mut bad = pins.clone();
    let mut t = pins[4].as_i32()?.clone();
    t[[0, 1]] = 99;
    bad[4] = Tensor::from_i32(t.clone());
    expect_err(&c.paged_op(16), &bad, "block_table[0, 1] = 99");
    t[[0, 1]] = -1;
    bad[4] = Tensor::from_i32(t);
    expect_err(&c.paged_op(16), &bad, "block_table[0, 1] = -1");
    // shapes: Nq 17, an unsupported head dim
    let f = |s: &[usize]| tandem::TensorMeta::new(s, tandem::DType::F32);
    let i = |s: &[usize]| tandem::TensorMeta::new(s, tandem::DType::I32);
    let op = Op::AttentionDecode(AttentionDecodeParams::default());
    let e = op
        .validate(&[
            f(&[1, 2, 17, 64]),
            f(&[1, 2, 40, 64]),
            f(&[1, 2, 40, 64]),
            i(&[1]),
        ])
        .expect_err("nq 17");
    assert!(e.to_string().contains("accepted: 1..=16"), "{e}");
    let e = op
        .validate(&[
            f(&[1, 2, 1, 80]),
            f(&[1, 2, 40, 80]),
            f(&[1, 2, 40, 80]),
            i(&[1]),
        ])
        .expect_err("d 80");
    assert!(e.to_string().contains("accepted: 64, 128, 256"), "{e}");
    Ok(())
}

/// The decode workload (`tandem run --decode`) planned, executed and checked on the CPU:
/// every node and the output against the f64 chain, contiguous and paged.
#[test]
fn the_decode_workload_runs_and_matches_its_reference() -> TestResult {
    use tandem::plan::BackendChoice;
    use tandem::run::{RunOptions, run_graph};
    use tandem::workload::MixtralConfig;
    use tandem::workload::decode::{DecodeStep, decode_layer};
    let reg = tandem::DeviceRegistry::cpu_only();
    for block_size in [None, Some(32)] {
        let c = MixtralConfig {
            batch: 3,
            d_model: 256,
            heads: 4,
            kv_heads: 1,
            ..MixtralConfig::default()
        };
        let step = DecodeStep {
            new_tokens: 3,
            context: 150,
            block_size,
        };
        let g = decode_layer(&c, &step, &tandem::limits::Limits::default())?;
        let opts = RunOptions {
            backend: BackendChoice::Only(tandem::DeviceKind::Cpu),
            placement: Default::default(),
            backend_label: "cpu".into(),
            exec: Default::default(),
            check: true,
            workload: "decode".into(),
            history: None,
            limits: tandem::limits::Limits::default(),
            allow_nonfinite: false,
            warmup: 0,
        };
        let out = run_graph(&g, &reg, &opts)?;
        let e = out.report.output_rel_error.ok_or("no output error")?;
        assert!(e < 1e-5, "{block_size:?}: output rel err {e:.2e}");
        assert!(
            out.report
                .nodes
                .iter()
                .any(|n| n.run.op == "attention_decode"
                    && n.error.rel_error.is_some_and(|x| x < 1e-5)),
            "{block_size:?}: no checked attention_decode node"
        );
    }
    Ok(())
}
