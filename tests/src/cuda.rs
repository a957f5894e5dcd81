//! Helpers of the CUDA test files: device 0 per storage precision, inputs rounded as the GPU
//! stores them, and one launch through the `Backend` trait.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use half::{bf16, f16};
use ndarray::ArrayD;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem::backend::cuda::{CudaBackend, CudaDType, CudaOptions, unavailable_reason};
use tandem::backend::{Backend, DeviceStorage};
use tandem::tensor::rel_error;
use tandem::{Op, Tensor};

/// Device 0 storing in `dt`, with poisoned outputs (one backend per precision, opened once),
/// or `None` after printing why the test is skipped. A GPU that is present but fails to open
/// fails the test.
pub fn backend(dt: CudaDType) -> Option<Arc<CudaBackend>> {
    type Slot = OnceLock<Result<Arc<CudaBackend>, String>>;
    static GPUS: [Slot; 2] = [OnceLock::new(), OnceLock::new()];
    let g = GPUS[dt as usize].get_or_init(|| {
        if let Some(r) = unavailable_reason() {
            return Err(r);
        }
        CudaBackend::open(
            0,
            CudaOptions {
                poison: true,
                dtype: dt,
            },
        )
        .map(Arc::new)
        .map_err(|e| format!("CUDA present but device 0 failed to open ({dt}): {e}"))
    });
    match g {
        Ok(b) => {
            assert_eq!(b.dtype(), dt);
            Some(b.clone())
        }
        Err(r) if r.starts_with("CUDA present") => panic!("{r}"),
        Err(r) => {
            println!("skipped: {r}");
            None
        }
    }
}

/// A generator seeded from the clock (fresh inputs every run); the seed is printed so a
/// failure can be replayed.
pub fn clock_rng(tag: &str) -> ChaCha8Rng {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(7);
    println!("{tag}: seed {seed}");
    ChaCha8Rng::seed_from_u64(seed)
}

/// `x` rounded as the GPU stores it in `dt`.
pub fn round_to(dt: CudaDType, x: f32) -> f32 {
    match dt {
        CudaDType::Bf16 => bf16::from_f32(x).to_f32(),
        CudaDType::F16 => f16::from_f32(x).to_f32(),
    }
}

/// A random f32 tensor in [-scale, scale), already rounded to `dt` (what the GPU will hold).
pub fn rand_rounded(r: &mut ChaCha8Rng, dt: CudaDType, shape: &[usize], scale: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| round_to(dt, r.gen_range(-1.0f32..1.0) * scale))
        .collect();
    Tensor::from_vec_f32(shape, v).expect("shape")
}

/// Uploads `inputs`, runs `op`, waits (2 minutes at most) and downloads the outputs; returns
/// them with the name of the kernel(s) that ran, and prints the device time.
pub fn launch(be: &CudaBackend, op: &Op, inputs: &[Tensor]) -> (Vec<Tensor>, String) {
    let st: Vec<DeviceStorage> = inputs
        .iter()
        .map(|t| be.upload(t).expect("upload"))
        .collect();
    let refs: Vec<&DeviceStorage> = st.iter().collect();
    let l = be.launch(op, &refs).expect("launch");
    l.done
        .wait(Duration::from_secs(120), op.name())
        .expect("kernel finished");
    let info = l.info.lock().expect("info").clone();
    assert!(!info.kernel.is_empty());
    let t = info.device_time.expect("event-timed device time");
    println!(
        "  {} ran {} in {:.1} us",
        op.name(),
        info.kernel,
        t.as_secs_f64() * 1e6
    );
    let outs = l
        .outputs
        .iter()
        .map(|s| be.download(s).expect("download"))
        .collect();
    (outs, info.kernel)
}

/// Relative error of a float output; NaN (poison left behind) fails.
pub fn check(name: &str, out: &Tensor, want: &ArrayD<f64>, tol: f64) {
    let got = out.to_f64();
    assert_eq!(got.shape(), want.shape(), "{name}: shape");
    let nan = got.iter().filter(|v| v.is_nan()).count();
    assert_eq!(nan, 0, "{name}: {nan} elements NaN (unwritten or overflow)");
    let e = rel_error(&got, want);
    println!("  {name}: rel err {e:.2e}");
    assert!(e < tol, "{name}: rel err {e:.3e} >= {tol:.0e}");
}
