//! Event-timed figures of the CUDA kernels on benchmark shapes (ignored by default: run with
//! `--ignored` on the GPU machine; `TANDEM_CUDA_DTYPE=f16` times the f16 storage: the options
//! are read once, by the options loader). Prints; asserts nothing about time. `tandem bench`
//! is the tool for measurements; this exists for quick looks from the test bundle.

use std::time::Duration;

use tandem::backend::cuda::{AttentionVariant, CudaBackend, CudaOptions, unavailable_reason};
use tandem::backend::{Backend, DeviceStorage};
use tandem::ops::{
    Activation, AttentionParams, LinearParams, MoeRouteParams, RmsNormParams, RopeParams,
};
use tandem::{Op, Tensor, TensorMeta};

fn rand_tensor(m: &TensorMeta, seed: u64, scale: f32) -> Tensor {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let v: Vec<f32> = (0..m.numel())
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect();
    Tensor::from_vec_f32(&m.shape, v).expect("shape")
}

fn time(be: &CudaBackend, label: &str, op: &Op, metas: &[TensorMeta], sets: usize) {
    let inputs: Vec<Vec<DeviceStorage>> = (0..sets)
        .map(|s| {
            metas
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    be.upload(&rand_tensor(m, (s * 10 + i) as u64, 1.0))
                        .expect("upload")
                })
                .collect()
        })
        .collect();
    let mut times = Vec::new();
    let mut kernel = String::new();
    for i in 0..25 {
        let refs: Vec<&DeviceStorage> = inputs[i % sets].iter().collect();
        let mut l = be.launch(op, &refs).expect("launch");
        l.outputs.clear();
        l.done
            .wait(Duration::from_secs(60), "timing")
            .expect("done");
        let inf = l.info.lock().expect("info");
        kernel = inf.kernel.clone();
        if i >= 5 {
            times.push(inf.device_time.expect("device time").as_secs_f64());
        }
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let med = times[times.len() / 2];
    let c = op.cost(metas);
    println!(
        "TIMING {label}: {:.3} ms, {:.1} TFLOP/s, {:.1} GB/s({}) [{kernel}]",
        med * 1e3,
        c.flops / med / 1e12,
        c.bytes / 2.0 / med / 1e9,
        be.dtype()
    );
}

#[test]
#[ignore = "timing on the GPU machine only"]
fn cuda_timing() {
    let opts = tandem::options::Options::from_env()
        .expect("the TANDEM_* variables are valid")
        .cuda;
    if let Some(r) = unavailable_reason(&opts) {
        tandem_tests::skip(tandem_tests::Need::Gpu, &r);
        return;
    }
    let be = CudaBackend::open(0, opts.clone()).expect("open");
    let f = |s: &[usize]| TensorMeta::new(s, tandem::DType::F32);
    // One backend per attention build timed, each with its build forced.
    let builds = [AttentionVariant::M2, AttentionVariant::Ws].map(|w| {
        let forced = CudaOptions {
            attention_variant: Some(w),
            ..opts.clone()
        };
        (w, CudaBackend::open(0, forced).expect("open"))
    });
    for causal in [false, true] {
        for (w, be) in &builds {
            let op = Op::Attention(AttentionParams {
                causal,
                scale: None,
            });
            let m = [
                f(&[4, 32, 4096, 128]),
                f(&[4, 32, 4096, 128]),
                f(&[4, 32, 4096, 128]),
            ];
            time(
                be,
                &format!("attention B4 H32 N4096 D128 causal={causal} variant={w}"),
                &op,
                &m,
                1,
            );
        }
    }
    let op = Op::MoeRoute(MoeRouteParams {
        top_k: 8,
        renormalize: true,
        block_size: 16,
    });
    time(&be, "moe_route T16384 E64 k8", &op, &[f(&[16384, 64])], 8);
    let op = Op::Linear(LinearParams {
        act: Activation::Gelu,
        bias: true,
        f32_out: false,
    });
    time(
        &be,
        "linear 8192^3 gelu+bias",
        &op,
        &[f(&[8192, 8192]), f(&[8192, 8192]), f(&[8192])],
        1,
    );
    let op = Op::RmsNorm(RmsNormParams {
        eps: 1e-5,
        residual: false,
    });
    time(
        &be,
        "rmsnorm 16384x8192",
        &op,
        &[f(&[16384, 8192]), f(&[8192])],
        2,
    );
    let op = Op::Rope(RopeParams::default());
    time(
        &be,
        "rope B4 H32 T4096 D128",
        &op,
        &[f(&[4, 32, 4096, 128])],
        2,
    );
}
