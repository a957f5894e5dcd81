//! Decode attention on the GPU (common/attention_decode.cu), in both storage precisions,
//! against the f64 reference on fresh random inputs rounded as the GPU stores them: Nq 1/3/16,
//! lengths off every chunk and block (a sequence of just its new tokens, one at capacity),
//! GQA ratios 1/4/8/32, head dims 64/128/256; paged against contiguous on the same data
//! (shuffled block table, NaN in every cache row no sequence owns, so a stray read shows);
//! decode against prefill-then-slice; a bad length or block id gives NaN, never a read outside
//! the cache. Outputs are poisoned (NaN) before every launch. Without a usable GPU each test
//! prints "skipped: <reason>" and returns.

use ndarray::ArrayD;
use tandem::Tensor;
use tandem::backend::cuda::{CudaBackend, CudaDType};
use tandem_tests::cuda::{backend as gpu, check, clock_rng as rng, launch, round_to};
use tandem_tests::decode::{DecodeCase, contiguous, last_rows, paged, prefill, sequence_rows};

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
    cuda_decode_matches_the_reference,
    cuda_decode_paged_matches_contiguous,
    cuda_decode_is_the_last_rows_of_prefill,
    cuda_decode_bad_values_give_nan,
    cuda_decode_in_one_chunk_has_no_merge,
    cuda_decode_larger_rings_match_the_reference,
);

fn f64s(inputs: &[Tensor]) -> Vec<ArrayD<f64>> {
    inputs.iter().map(Tensor::to_f64).collect()
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
        c(4, 4, 1, 64, &[1, 37, 700, 2049], 2050), // MHA (1 row per block), many chunks
        c(8, 2, 3, 128, &[3, 70, 1029], 1100),     // GQA 4, Nq 3 (12 rows: 2 groups of 8)
        c(32, 8, 1, 128, &[5000, 4097, 1], 5000),  // the target's group (4 rows), at capacity
        c(8, 1, 16, 64, &[16, 333], 400),          // GQA 8, Nq 16: 128 rows
        c(32, 1, 2, 128, &[95, 2, 300], 301),      // MQA 32
        c(4, 2, 5, 256, &[61, 530], 531),          // d 256, 10 rows
        c(2, 1, 1, 256, &[3000], 3001),            // d 256, 2 rows
        c(8, 2, 1, 128, &[200, 17], 250),          // one chunk: no merge
    ]
}

/// LSE within 1e-3 relative (it is f32 on the device whatever the storage).
fn check_outputs(name: &str, out: &[Tensor], want: &[ArrayD<f64>], dt: CudaDType) {
    println!(" {name}");
    check("o", &out[0], &want[0], dt.tolerance());
    check("lse", &out[1], &want[1], 1e-3);
}

/// The partial kernel, then the merge unless the cache is one chunk (the partial writes o).
fn assert_kernel(kernel: &str, dt: CudaDType, paged: bool, d: usize) {
    let p = if paged { "paged_" } else { "" };
    let merge = format!("+attn_decode_merge_{dt}_d{d}");
    assert!(
        kernel.starts_with(&format!("attn_decode_{p}{dt}_d{d}_r"))
            && (kernel.ends_with(&merge) || !kernel.contains('+')),
        "{kernel}"
    );
}

/// The rings of 8 and 32 KiB K tiles (`TANDEM_DECODE_RING=8k-s4`, the default before the
/// 16 KiB one, and `32k-s2`: 32 and 128 keys a tile at d 128), contiguous and paged, split and
/// in one chunk, against the reference.
fn cuda_decode_larger_rings_match_the_reference(_be: &CudaBackend, dt: CudaDType) {
    for (tile, stages) in [(4096, 4), (16384, 2)] {
        let ring = tandem::backend::cuda::DecodeRing::new(tile, stages, stages).expect("a ring");
        for chunks in [None, Some(1)] {
            let Some(be) = tandem_tests::cuda::backend_with(tandem::backend::cuda::CudaOptions {
                decode_ring: Some(ring),
                decode_chunks: chunks,
                ..tandem_tests::cuda::options(dt)
            }) else {
                return;
            };
            let mut r = rng("decode rings");
            for c in cases() {
                let ins = contiguous(&c, &mut r, |x| round_to(dt, x));
                let want = c.op().reference(&f64s(&ins)).expect("reference");
                let (out, kernel) = launch(&be, &c.op(), &ins);
                assert_kernel(&kernel, dt, false, c.d);
                check_outputs(
                    &format!("{c:?} {ring:?} chunks {chunks:?}"),
                    &out,
                    &want,
                    dt,
                );
                let pins = paged(&c, &ins, 16, 3, &mut r);
                let (out, kernel) = launch(&be, &c.paged_op(16), &pins);
                assert_kernel(&kernel, dt, true, c.d);
                check_outputs(
                    &format!("{c:?} {ring:?} chunks {chunks:?} paged"),
                    &out,
                    &want,
                    dt,
                );
            }
        }
    }
}

/// Forced to one chunk (`TANDEM_DECODE_CHUNKS=1`), every case runs without the merge, the
/// partial kernel writing o and the LSE itself, bad values included, and agrees with the
/// reference and with the merged split of the same data.
fn cuda_decode_in_one_chunk_has_no_merge(be: &CudaBackend, dt: CudaDType) {
    let Some(one) = tandem_tests::cuda::backend_with(tandem::backend::cuda::CudaOptions {
        decode_chunks: Some(1),
        ..tandem_tests::cuda::options(dt)
    }) else {
        return;
    };
    let mut r = rng("decode one chunk");
    for c in cases() {
        let ins = contiguous(&c, &mut r, |x| round_to(dt, x));
        let want = c.op().reference(&f64s(&ins)).expect("reference");
        let (out, kernel) = launch(&one, &c.op(), &ins);
        assert!(!kernel.contains("merge"), "{kernel}");
        check_outputs(&format!("{c:?} one chunk"), &out, &want, dt);
        let (split, _) = launch(be, &c.op(), &ins);
        check(
            "o one chunk vs split",
            &out[0],
            &split[0].to_f64(),
            dt.tolerance(),
        );
        let pins = paged(&c, &ins, 16, 3, &mut r);
        let (pout, kernel) = launch(&one, &c.paged_op(16), &pins);
        assert!(!kernel.contains("merge"), "{kernel}");
        check_outputs(&format!("{c:?} one chunk paged"), &pout, &want, dt);
    }
    // a length past the capacity: NaN for that sequence, the other right
    let c = &cases()[2];
    let ins = contiguous(c, &mut r, |x| round_to(dt, x));
    let want = c.op().reference(&f64s(&ins)).expect("reference");
    let mut bad = ins.clone();
    bad[3] = Tensor::from_vec_i32(&[3], vec![5000, 1_000_000, 1]).expect("lens");
    let (out, _) = launch(&one, &c.op(), &bad);
    let o = out[0].to_f64();
    assert!(sequence_rows(&o, 1).iter().all(|x| x.is_nan()), "long");
    assert!(out[1].to_f64().iter().filter(|x| x.is_nan()).count() == c.hq * c.nq);
    let first = Tensor::from_f32(sequence_rows(&o, 0).mapv(|x| x as f32));
    check(
        "o of a good sequence",
        &first,
        &sequence_rows(&want[0], 0),
        dt.tolerance(),
    );
}

fn cuda_decode_matches_the_reference(be: &CudaBackend, dt: CudaDType) {
    let mut r = rng("decode");
    for c in cases() {
        let ins = contiguous(&c, &mut r, |x| round_to(dt, x));
        let (out, kernel) = launch(be, &c.op(), &ins);
        assert_kernel(&kernel, dt, false, c.d);
        let want = c.op().reference(&f64s(&ins)).expect("reference");
        check_outputs(&format!("{c:?}"), &out, &want, dt);
    }
}

fn cuda_decode_paged_matches_contiguous(be: &CudaBackend, dt: CudaDType) {
    let mut r = rng("decode paged");
    for c in cases() {
        let ins = contiguous(&c, &mut r, |x| round_to(dt, x));
        let want = c.op().reference(&f64s(&ins)).expect("reference");
        let (flat, _) = launch(be, &c.op(), &ins);
        for bs in [16, 32, 128] {
            let pins = paged(&c, &ins, bs, 5, &mut r);
            let (out, kernel) = launch(be, &c.paged_op(bs), &pins);
            assert_kernel(&kernel, dt, true, c.d);
            check_outputs(&format!("{c:?} paged bs {bs}"), &out, &want, dt);
            // the same data through the block table: within rounding of the contiguous run
            // (the capacity, so the chunking, may differ)
            check(
                "o paged vs contiguous",
                &out[0],
                &flat[0].to_f64(),
                dt.tolerance(),
            );
        }
    }
}

fn cuda_decode_is_the_last_rows_of_prefill(be: &CudaBackend, dt: CudaDType) {
    let mut r = rng("decode prefill");
    for c in cases().into_iter().take(4) {
        let ins = contiguous(&c, &mut r, |x| round_to(dt, x));
        let (out, _) = launch(be, &c.op(), &ins);
        for b in 0..c.b() {
            let (att, pre) = prefill(&c, &ins, b, &mut r);
            let want = att.reference(&f64s(&pre)).expect("prefill reference");
            let got_o = Tensor::from_f32(sequence_rows(&out[0].to_f64(), b).mapv(|x| x as f32));
            let got_l = Tensor::from_f32(sequence_rows(&out[1].to_f64(), b).mapv(|x| x as f32));
            println!(" {c:?} sequence {b}");
            check("o", &got_o, &last_rows(&want[0], c.nq), dt.tolerance());
            check("lse", &got_l, &last_rows(&want[1], c.nq), 1e-3);
        }
    }
}

/// A length past the capacity, or a block id outside the cache, gives NaN for that sequence
/// (the device cannot raise an error mid-kernel) and leaves the other sequences right.
fn cuda_decode_bad_values_give_nan(be: &CudaBackend, dt: CudaDType) {
    let mut r = rng("decode bad");
    let c = DecodeCase {
        hq: 8,
        hkv: 2,
        nq: 1,
        d: 128,
        lens: vec![300, 200],
        nmax: 300,
    };
    let ins = contiguous(&c, &mut r, |x| round_to(dt, x));
    let want = c.op().reference(&f64s(&ins)).expect("reference");
    let mut bad = ins.clone();
    bad[3] = Tensor::from_vec_i32(&[2], vec![300, 1_000_000]).expect("lens");
    let (out, _) = launch(be, &c.op(), &bad);
    let o = out[0].to_f64();
    assert!(sequence_rows(&o, 1).iter().all(|x| x.is_nan()), "long");
    let first = Tensor::from_f32(sequence_rows(&o, 0).mapv(|x| x as f32));
    check(
        "o of the good sequence",
        &first,
        &sequence_rows(&want[0], 0),
        dt.tolerance(),
    );
    let pins = paged(&c, &ins, 16, 0, &mut r);
    let mut t = pins[4].as_i32().expect("table").clone();
    t[[1, 3]] = 1 << 30;
    let mut bad = pins.clone();
    bad[4] = Tensor::from_i32(t);
    let (out, _) = launch(be, &c.paged_op(16), &bad);
    let o = out[0].to_f64();
    assert!(sequence_rows(&o, 1).iter().all(|x| x.is_nan()), "block id");
    assert!(
        sequence_rows(&o, 0).iter().all(|x| x.is_finite()),
        "good sequence"
    );
}
