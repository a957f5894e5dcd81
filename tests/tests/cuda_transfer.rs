//! The CUDA data plane: uploads and downloads through the pinned staging slots, in several
//! chunks, with the f32 -> bf16/f16 conversion on the way, bit for bit against an
//! independent round-to-nearest-even conversion, edge values included (ties, subnormals,
//! infinities, NaN, values past f16's range). Skipped where there is no GPU.

use half::f16;
use ndarray::{ArrayD, IxDyn};
use tandem::Tensor;
use tandem::backend::CudaDType;
use tandem::tensor::HostData;
use tandem_tests::cuda_or_skip;

/// More values than two staging slots of 16-bit words hold (8 MiB slots), plus an odd tail.
const N: usize = (8 << 20) + (4 << 20) / 2 * 3 + 7;

/// bf16 bits of `x`, rounded to nearest even (NaN: quiet, sign kept), by bit arithmetic.
fn bf16_rne(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x0040) as u16;
    }
    let lsb = (b >> 16) & 1;
    (b.wrapping_add(0x7fff + lsb) >> 16) as u16
}

fn edge_values() -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MAX,
        f32::MIN_POSITIVE,
        1e-40,  // subnormal
        -3e-39, // subnormal
        65504.0,
        65520.0, // rounds to f16 infinity
        1e6,     // past f16's range
        6e-8,    // f16 subnormal
    ];
    // Exact ties between two bf16 values: the even one wins.
    for m in [0x3f80_8000u32, 0x3f81_8000, 0xbf80_8000, 0x4000_8000] {
        v.push(f32::from_bits(m));
    }
    v
}

fn values() -> Vec<f32> {
    let edges = edge_values();
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    (0..N)
        .map(|i| {
            if i % 4099 < edges.len() {
                return edges[i % 4099];
            }
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Random bits: every exponent and mantissa pattern.
            f32::from_bits((s >> 32) as u32)
        })
        .collect()
}

fn same(got: f32, want: f32) -> bool {
    (got.is_nan() && want.is_nan()) || got.to_bits() == want.to_bits()
}

fn roundtrip(dtype: CudaDType) {
    let Some(be) = cuda_or_skip(dtype) else {
        return;
    };
    let v = values();
    let t = Tensor::from_vec_f32(&[N], v.clone()).expect("tensor");
    let st = be.upload(&t).expect("upload");
    let back = be.download(&st).expect("download").to_f64();
    let mut bad = 0usize;
    for (i, (&x, &g)) in v.iter().zip(back.iter()).enumerate() {
        let want = match dtype {
            CudaDType::Bf16 => f32::from_bits(u32::from(bf16_rne(x)) << 16),
            CudaDType::F16 => f16::from_f32(x).to_f32(),
        };
        if !same(g as f32, want) {
            if bad < 5 {
                eprintln!(
                    "value {i}: {x:e} ({:#010x}) came back {g:e}, expected {want:e}",
                    x.to_bits()
                );
            }
            bad += 1;
        }
    }
    assert_eq!(bad, 0, "{dtype}: {bad} of {N} values differ");
}

#[test]
fn f32_to_bf16_through_pinned_chunks_is_round_to_nearest_even() {
    roundtrip(CudaDType::Bf16);
}

#[test]
fn f32_to_f16_through_pinned_chunks_matches_the_host_conversion() {
    roundtrip(CudaDType::F16);
}

#[test]
fn i32_and_strided_tensors_come_back_exactly() {
    let Some(be) = cuda_or_skip(CudaDType::Bf16) else {
        return;
    };
    // i32: no conversion, 4-byte words over several chunks.
    let ints: Vec<i32> = (0..N as i32)
        .map(|i| i.wrapping_mul(2654435761u32 as i32))
        .collect();
    let t = Tensor::from_i32(ArrayD::from_shape_vec(IxDyn(&[N]), ints.clone()).expect("shape"));
    let back = be
        .download(&be.upload(&t).expect("upload"))
        .expect("download");
    match back.data() {
        HostData::I32(a) => assert!(a.iter().eq(ints.iter()), "i32 values changed"),
        other => panic!("i32 came back as {:?}", Tensor::new(other.clone()).dtype()),
    }
    // A transposed (non-contiguous) f32 array goes up in its logical order.
    let (r, c) = (1500, 1300);
    let a = ArrayD::from_shape_vec(
        IxDyn(&[r, c]),
        (0..r * c).map(|i| i as f32 * 0.25).collect(),
    )
    .expect("shape");
    let tr = a.clone().reversed_axes();
    let back = be
        .download(&be.upload(&Tensor::from_f32(tr.clone())).expect("upload"))
        .expect("download")
        .to_f64();
    assert_eq!(back.shape(), &[c, r]);
    for (g, w) in back.iter().zip(tr.iter()) {
        let want = f32::from_bits(u32::from(bf16_rne(*w)) << 16);
        assert_eq!(*g as f32, want);
    }
}

#[test]
fn uploads_back_to_back_reuse_the_slots_without_mixing_data() {
    let Some(be) = cuda_or_skip(CudaDType::Bf16) else {
        return;
    };
    // Many uploads queued without waiting: each slot is refilled only after its copy.
    let n = (12 << 20) / 2 + 3;
    let stored: Vec<_> = (0..6)
        .map(|k| {
            let t = Tensor::from_vec_f32(&[n], vec![k as f32; n]).expect("tensor");
            be.upload(&t).expect("upload")
        })
        .collect();
    for (k, st) in stored.iter().enumerate() {
        let back = be.download(st).expect("download").to_f64();
        assert!(
            back.iter().all(|&x| x == k as f64),
            "upload {k} came back mixed"
        );
    }
}

/// A tensor uploaded again from one host replica is registered in place on its second upload
/// and then copied from its own pages (f32 raw, rounded on the device by the cast kernel):
/// every upload gives the same bits as the staged path's host rounding (edge values
/// included), i32 comes back exact, and the registration goes once nothing else holds the
/// tensor.
#[test]
fn repeated_uploads_from_registered_pages_match_the_staged_bits() {
    use std::sync::Arc;
    use tandem::backend::cuda::{CudaBackend, unavailable_reason};
    use tandem::backend::{Backend, DeviceId, DeviceStorage};
    if let Some(r) = unavailable_reason(&tandem_tests::cuda::options(CudaDType::default())) {
        tandem_tests::skip(tandem_tests::Need::Gpu, &r);
        return;
    }
    for dtype in [CudaDType::Bf16, CudaDType::F16] {
        let be = CudaBackend::open(0, tandem_tests::cuda::options(dtype)).expect("device 0 opens");
        let v = values();
        let t = Arc::new(Tensor::from_vec_f32(&[N], v.clone()).expect("tensor"));
        let staged = be
            .download(&be.upload(&t).expect("upload"))
            .expect("download");
        let host = DeviceStorage::shared(DeviceId::CPU, t.meta(), t.clone());
        for k in 0..3 {
            let back = be
                .download(&be.upload_storage(&host).expect("upload"))
                .expect("download");
            let (g, w) = (back.to_f64(), staged.to_f64());
            let bad = g
                .iter()
                .zip(w.iter())
                .filter(|(a, b)| !same(**a as f32, **b as f32))
                .count();
            assert_eq!(bad, 0, "{dtype}: upload {k}: {bad} of {N} values differ");
            // Registered from the second upload on.
            let (bytes, tensors) = be.registered_host();
            assert_eq!(
                (bytes >= N * 4, tensors),
                (k >= 1, usize::from(k >= 1)),
                "upload {k}"
            );
        }
        drop(host);
        drop(t);
        // The next registration attempt lets the unheld one go.
        let ints: Vec<i32> = (0..N as i32).map(|i| i ^ 0x5a5a_5a5a).collect();
        let ti = Arc::new(Tensor::from_i32(
            ArrayD::from_shape_vec(IxDyn(&[N]), ints.clone()).expect("shape"),
        ));
        let hi = DeviceStorage::shared(DeviceId::CPU, ti.meta(), ti.clone());
        for _ in 0..2 {
            let back = be
                .download(&be.upload_storage(&hi).expect("upload"))
                .expect("download");
            match back.data() {
                HostData::I32(a) => assert!(a.iter().eq(ints.iter()), "i32 values changed"),
                other => panic!("i32 came back as {:?}", Tensor::new(other.clone()).dtype()),
            }
        }
        assert_eq!(
            be.registered_host().1,
            1,
            "only the i32 tensor stays registered"
        );
    }
}

/// Results downloaded again and again land in reused registered host tensors from the second
/// download of a shape on: every landed download equals the staged download bit for bit (a
/// landing reused for new data holds the new data, not the old), bf16/f16 storage widened to
/// f32 on the device gives the host widening's bits, a landing still held by a caller is never
/// written (a second landing is made), and i32 comes back exact.
#[test]
fn repeated_downloads_land_in_reused_registered_memory_with_the_staged_bits() {
    use tandem::backend::cuda::{CudaBackend, unavailable_reason};
    use tandem::backend::{Backend, DeviceId};
    if let Some(r) = unavailable_reason(&tandem_tests::cuda::options(CudaDType::default())) {
        tandem_tests::skip(tandem_tests::Need::Gpu, &r);
        return;
    }
    // Same bits, any NaN matching any NaN (the device and the host may quiet NaNs alike or
    // not; every other value is compared bit for bit).
    let differ = |a: &Tensor, b: &Tensor| -> usize {
        let (a, b) = (a.to_f32(), b.to_f32());
        a.iter()
            .zip(b.iter())
            .filter(|(x, y)| !same(**x, **y))
            .count()
    };
    for dtype in [CudaDType::Bf16, CudaDType::F16] {
        let be = CudaBackend::open(0, tandem_tests::cuda::options(dtype)).expect("device 0 opens");
        let mut v = values();
        let mut held = Vec::new();
        for k in 0..5 {
            // New data each round, same shape: a reused landing must not show the old data.
            v.rotate_left(12_345);
            let st = be
                .upload(&Tensor::from_vec_f32(&[N], v.clone()).expect("tensor"))
                .expect("upload");
            let staged = be.download(&st).expect("download");
            let landed = be.download_storage(&st).expect("download_storage");
            assert_eq!(landed.device, DeviceId::CPU);
            let got = landed.host_shared("CPU").expect("host replica");
            assert_eq!(got.meta(), staged.meta(), "{dtype}: round {k}");
            let bad = differ(&got, &staged);
            assert_eq!(
                bad, 0,
                "{dtype}: round {k}: {bad} landed values differ from staged"
            );
            let (bytes, tensors) = be.landing_host();
            // Seen once at round 0; a landing from round 1; round 3's result is kept by the
            // caller below, so round 4 needs a second landing.
            let want = match k {
                0 => 0,
                1..=3 => 1,
                _ => 2,
            };
            assert_eq!(tensors, want, "{dtype}: round {k}: landings");
            assert!(bytes >= want * N * 4, "{dtype}: round {k}: {bytes} bytes");
            if k == 3 {
                held.push(got.clone());
            }
        }
        // The held result kept its values while a later download landed elsewhere.
        let mut w = values();
        w.rotate_left(12_345 * 4);
        let want = be
            .download(
                &be.upload(&Tensor::from_vec_f32(&[N], w).expect("tensor"))
                    .expect("upload"),
            )
            .expect("download");
        let bad = differ(&held[0], &want);
        assert_eq!(
            bad, 0,
            "{dtype}: a held landing was overwritten ({bad} values)"
        );
        let ints: Vec<i32> = (0..N as i32).map(|i| i.wrapping_mul(-7919)).collect();
        let st = be
            .upload(&Tensor::from_i32(
                ArrayD::from_shape_vec(IxDyn(&[N]), ints.clone()).expect("shape"),
            ))
            .expect("upload");
        for _ in 0..3 {
            let d = be.download_storage(&st).expect("download_storage");
            match d.host_tensor("CPU").expect("host").data() {
                HostData::I32(a) => assert!(a.iter().eq(ints.iter()), "i32 values changed"),
                other => panic!("i32 came back as {:?}", Tensor::new(other.clone()).dtype()),
            }
        }
    }
}

/// A tensor on one GPU copied straight to another (`cuMemcpyPeerAsync` over NVLink or PCIe
/// peer-to-peer): the same bits arrive, in each precision the backend stores, with an odd
/// length; a copy from the device itself is declined (the caller has nothing to copy).
/// Needs two GPUs that can access each other.
#[test]
fn peer_copies_between_two_gpus_keep_the_bits() {
    use tandem::backend::Backend;
    use tandem::backend::cuda::{CudaBackend, unavailable_reason};
    if let Some(r) = unavailable_reason(&tandem_tests::cuda::options(CudaDType::default())) {
        tandem_tests::skip(tandem_tests::Need::Gpu, &r);
        return;
    }
    let opts = tandem_tests::cuda::options(CudaDType::Bf16);
    let b0 = CudaBackend::open(0, opts.clone()).expect("device 0 opens");
    let b1 = match CudaBackend::open(1, opts) {
        Ok(b) => b,
        Err(e) => {
            tandem_tests::skip(
                tandem_tests::Need::SecondGpu,
                &format!("peer copies need a second GPU: cuda:1 does not open ({e})"),
            );
            return;
        }
    };
    let n = (3 << 20) + 5;
    let v: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 10007) as f32 - 5000.5)
        .collect();
    let ints: Vec<i32> = (0..n as i32).map(|i| i.wrapping_mul(-31)).collect();
    for t in [
        Tensor::from_vec_f32(&[n], v).expect("tensor"),
        Tensor::from_i32(ArrayD::from_shape_vec(IxDyn(&[n]), ints).expect("shape")),
    ] {
        let s0 = b0.upload(&t).expect("upload to cuda:0");
        let want = b0.download(&s0).expect("download from cuda:0");
        assert!(
            b0.copy_peer(&s0).expect("copy_peer").is_none(),
            "a copy from the device itself is declined"
        );
        let Some(s1) = b1.copy_peer(&s0).expect("copy_peer") else {
            tandem_tests::skip(
                tandem_tests::Need::SecondGpu,
                "cuda:0 and cuda:1 cannot access each other (no peer-to-peer path)",
            );
            return;
        };
        drop(s0);
        let got = b1.download(&s1).expect("download from cuda:1");
        assert_eq!(got, want, "{:?}: the peer copy changed the data", t.dtype());
    }
}
