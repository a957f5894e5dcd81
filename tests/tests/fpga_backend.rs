//! The `fpga-sim` backend end to end: routing on the Verilator-simulated card against the
//! f64 reference, launch info, and what it declines. Skipped where Verilator is missing.

use std::time::Duration;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tandem::backend::{Backend, DeviceKind, Support};
use tandem::ops::{AttentionParams, MoeRouteParams, Op};
use tandem::{DType, Tensor, TensorMeta};

fn fpga_sim() -> Option<std::sync::Arc<dyn Backend>> {
    tandem_tests::device_or_skip(DeviceKind::FpgaSim)
}

/// Logits whose values in a row are a permutation of a grid 0.05 apart (well above the
/// 2^-8 quantisation step), so the top-k ids are exact and every output can be compared.
fn separated_logits(t: usize, e: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut v = Vec::with_capacity(t * e);
    for _ in 0..t {
        let mut row: Vec<f32> = (0..e).map(|i| i as f32 * 0.05 - 1.0).collect();
        row.shuffle(&mut rng);
        let shift: f32 = rng.gen_range(-3.0..3.0);
        v.extend(row.iter().map(|x| x + shift));
    }
    v
}

/// Routing renormalised over the k chosen and (renormalize = false) the softmax over all
/// experts, on the card (the default build: 8 lanes, 128-bit port) against the f64
/// reference: E off a multiple of the 8 lanes, k up to k_max = 8, T = 1.
#[test]
fn moe_route_on_the_simulated_card_matches_the_reference() {
    let Some(b) = fpga_sim() else { return };
    for (renormalize, (t, e, k)) in [
        (true, (24, 40, 4)),
        (false, (24, 40, 4)),
        (false, (9, 8, 2)),
        (true, (1, 37, 8)),
        (false, (5, 13, 8)),
        (true, (17, 130, 7)),
    ] {
        route_case(&*b, renormalize, t, e, k);
    }
}

fn route_case(b: &dyn Backend, renormalize: bool, t: usize, e: usize, k: usize) {
    let x = separated_logits(t, e, 11);
    let logits = Tensor::from_vec_f32(&[t, e], x).expect("tensor");
    let op = Op::MoeRoute(MoeRouteParams {
        top_k: k,
        renormalize,
        block_size: 8,
    });
    assert_eq!(b.supports(&op, &[logits.meta()]), Support::Native);
    let s = b.upload(&logits).expect("upload");
    let l = b.launch(&op, &[&s]).expect("launch");
    l.done
        .wait(Duration::from_secs(300), "moe_route")
        .expect("done");
    let outs: Vec<Tensor> = l
        .outputs
        .iter()
        .map(|o| b.download(o).expect("download"))
        .collect();
    let reference = op.reference(&[logits.to_f64()]).expect("reference");
    assert_eq!(outs.len(), reference.len());
    // ids, counts, permutation and offsets: exact
    for i in [0usize, 2, 3, 4] {
        let got = outs[i].to_f64();
        assert_eq!(got, reference[i], "output {i}");
    }
    // weights: Q0.15 fixed point, documented bound 4e-3
    let w = outs[1].to_f64();
    let worst = w
        .iter()
        .zip(reference[1].iter())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(
        worst < 4e-3,
        "renormalize {renormalize}: weight error {worst}"
    );
    // losses are computed on the host in f64
    for i in [5usize, 6] {
        let (a, r) = (outs[i].to_f64()[[0]], reference[i][[0]]);
        assert!(
            (a - r).abs() <= 1e-5 * r.abs().max(1.0),
            "loss {i}: {a} vs {r}"
        );
    }
    let info = l.info.lock().expect("info").clone();
    assert_eq!(info.kernel, "moe_router_int16+host_align");
    let cycles = info.cycles.expect("cycles");
    // at most `lanes` logits per cycle
    let lanes = tandem_fpga::kernels::router::RouterCore::default().lanes as usize;
    assert!(
        cycles as usize >= t * e / lanes,
        "{cycles} cycles for {} logits",
        t * e
    );
    let dt = info.device_time.expect("device time").as_secs_f64();
    let clock = tandem_tests::fpga_clock_mhz(b) * 1e6;
    assert!((dt - cycles as f64 / clock).abs() < 1e-9);
}

#[test]
fn ops_without_a_kernel_are_declined_with_a_reason() {
    let Some(b) = fpga_sim() else { return };
    let m = TensorMeta::new(vec![8, 16], DType::F32);
    // renormalize = false runs on the card; top_k past the build's k_max does not
    let no_renorm = Op::MoeRoute(MoeRouteParams {
        top_k: 2,
        renormalize: false,
        block_size: 16,
    });
    assert_eq!(
        b.supports(&no_renorm, std::slice::from_ref(&m)),
        Support::Native
    );
    let wide_k = Op::MoeRoute(MoeRouteParams {
        top_k: 9,
        renormalize: true,
        block_size: 16,
    });
    match b.supports(&wide_k, std::slice::from_ref(&m)) {
        Support::No(why) => assert!(why.contains("k_max"), "{why}"),
        Support::Native => panic!("top_k 9 exceeds the router build's k_max 8"),
    }
    let too_many = Op::MoeRoute(MoeRouteParams {
        top_k: 2,
        renormalize: true,
        block_size: 16,
    });
    let wide = TensorMeta::new(vec![8, 4096], DType::F32);
    assert!(matches!(b.supports(&too_many, &[wide]), Support::No(_)));
    // attention runs on the card (tests/tests/fpga_attention_backend.rs), but not with a head
    // dimension beyond the largest build's d_max = 256
    let q = TensorMeta::new(vec![1, 2, 8, 264], DType::F32);
    let att = Op::Attention(AttentionParams::default());
    match b.supports(&att, &[q.clone(), q.clone(), q]) {
        Support::No(why) => assert!(why.contains("d_max"), "{why}"),
        Support::Native => panic!("head dim 264 exceeds the attention builds"),
    }
    // launching an op it declined is an error, not a panic
    let s = b.upload(&Tensor::zeros(&m)).expect("upload");
    assert!(b.launch(&wide_k, &[&s]).is_err());
}

#[test]
fn linear_on_the_simulated_card_is_within_int8_error() {
    use tandem::ops::{Activation, LinearParams};
    let Some(b) = fpga_sim() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
    let (m, n, k) = (12, 20, 48);
    let mut r = |len: usize| -> Vec<f32> { (0..len).map(|_| rng.gen_range(-1.0..1.0)).collect() };
    let x = Tensor::from_vec_f32(&[m, k], r(m * k)).expect("x");
    let w = Tensor::from_vec_f32(&[n, k], r(n * k)).expect("w");
    let bias = Tensor::from_vec_f32(&[n], r(n)).expect("b");
    for act in [Activation::None, Activation::Relu] {
        let op = Op::Linear(LinearParams {
            act,
            bias: true,
            f32_out: false,
        });
        let ins = [x.clone(), w.clone(), bias.clone()];
        let metas: Vec<TensorMeta> = ins.iter().map(|t| t.meta()).collect();
        assert_eq!(b.supports(&op, &metas), Support::Native);
        let st: Vec<_> = ins.iter().map(|t| b.upload(t).expect("upload")).collect();
        let refs: Vec<_> = st.iter().collect();
        let l = b.launch(&op, &refs).expect("launch");
        l.done
            .wait(Duration::from_secs(300), "linear")
            .expect("done");
        let y = b.download(&l.outputs[0]).expect("download").to_f64();
        let want = op
            .reference(&ins.iter().map(|t| t.to_f64()).collect::<Vec<_>>())
            .expect("reference");
        let err = tandem::tensor::rel_error(&y, &want[0]);
        println!("linear {act:?} on fpga-sim: rel. error {err:.2e}");
        assert!(err < 3e-2, "{act:?}: {err}");
        let info = l.info.lock().expect("info").clone();
        assert_eq!(info.kernel, "linear_int8_gemm");
        assert!(info.cycles.expect("cycles") > (m * n * k / 64) as u64);
    }
    let gelu = Op::Linear(LinearParams {
        act: Activation::Gelu,
        bias: false,
        f32_out: false,
    });
    assert!(matches!(
        b.supports(&gelu, &[x.meta(), w.meta()]),
        Support::No(_)
    ));
}

/// Host replicas move to and from the simulated card without copying the tensor: the card's
/// storage shares the host tensor (the drivers write the banks from it at launch), a result
/// comes back as the very tensor the banks were read into, and a routing run from shared
/// storage gives the same outputs as one from a private copy.
#[test]
fn host_replicas_reach_the_card_and_come_back_without_copies() {
    use std::sync::Arc;
    use tandem::backend::{DeviceId, DeviceStorage};
    let Some(b) = fpga_sim() else { return };
    let logits =
        Arc::new(Tensor::from_vec_f32(&[9, 8], separated_logits(9, 8, 5)).expect("tensor"));
    let host = DeviceStorage::shared(DeviceId::CPU, logits.meta(), logits.clone());
    let on_card = b.upload_storage(&host).expect("upload_storage");
    assert_eq!(on_card.device, b.id());
    assert!(
        on_card.same_data(&host),
        "the upload copied the host tensor"
    );
    let back = b.download_storage(&on_card).expect("download_storage");
    assert_eq!(back.device, DeviceId::CPU);
    assert!(back.same_data(&on_card), "the download copied the tensor");
    let op = Op::MoeRoute(MoeRouteParams {
        top_k: 2,
        renormalize: true,
        block_size: 8,
    });
    let run = |s: &tandem::backend::DeviceStorage| -> Vec<Tensor> {
        let l = b.launch(&op, &[s]).expect("launch");
        l.done
            .wait(Duration::from_secs(300), "moe_route")
            .expect("done");
        l.outputs
            .iter()
            .map(|o| b.download(o).expect("download"))
            .collect()
    };
    let private = b.upload(&logits).expect("upload");
    assert_eq!(run(&on_card), run(&private));
}

#[test]
fn bank_copies_are_measured_on_every_path_of_the_simulated_card() {
    if fpga_sim().is_none() {
        return;
    }
    // The registry found the simulated card, so it opens again with the same options.
    let opts = tandem_tests::registry().options().fpga.clone();
    let b = tandem::backend::fpga::simulated(&opts).expect("the simulated card's backend");
    let bytes = 1 << 20;
    let rows = b.measure_transfers(bytes, 2).expect("measured");
    let paths: Vec<&str> = rows.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(rows.len(), 5, "{paths:?}");
    for r in &rows {
        assert!(
            r.median_s > 0.0 && r.host_gbps.is_finite() && r.of_pinned_ceiling > 0.0,
            "{r:?}"
        );
        assert!(r.direction == "h2d" || r.direction == "d2h", "{r:?}");
        // The tensor paths count an f32 tensor on the host and its int8 bytes on the card.
        let ratio = if r.path.starts_with("tandem") { 4 } else { 1 };
        assert_eq!(
            (r.host_bytes, r.link_bytes),
            (ratio * bytes as u64, bytes as u64),
            "{r:?}"
        );
    }
}
