//! Helpers of the CUDA test files: device 0 per set of options (storage precision, a forced
//! attention build or MoE path), inputs rounded as the GPU stores them, and one launch through
//! the `Backend` trait. Tests pass options by value; nothing sets environment variables.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use half::{bf16, f16};
use ndarray::ArrayD;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem::backend::cuda::{CudaBackend, CudaDType, CudaOptions, unavailable_reason};
use tandem::backend::{Backend, DeviceStorage};
use tandem::options::ProcessEnv;
use tandem::tensor::rel_error;
use tandem::{Op, Tensor};

/// The options of the CUDA tests: storage `dt`, outputs poisoned, nothing forced, the
/// libraries and the kernel cache where this machine keeps them
/// ([`CudaOptions::machine`]). Tests change fields of this value to force a path.
pub fn options(dt: CudaDType) -> CudaOptions {
    CudaOptions {
        dtype: dt,
        poison: true,
        ..CudaOptions::machine(&ProcessEnv)
    }
}

/// Device 0 storing in `dt`, with poisoned outputs ([`options`]), or `None` after printing why
/// the test is skipped. A GPU that is present but fails to open fails the test.
pub fn backend(dt: CudaDType) -> Option<Arc<CudaBackend>> {
    backend_with(options(dt))
}

/// Device 0 opened with `opts` (one backend per distinct options, opened once per test
/// binary), or `None` after printing why the test is skipped. A GPU that is present but fails
/// to open fails the test.
pub fn backend_with(opts: CudaOptions) -> Option<Arc<CudaBackend>> {
    type Opened = Vec<(CudaOptions, Result<Arc<CudaBackend>, String>)>;
    static OPENED: Mutex<Opened> = Mutex::new(Vec::new());
    let mut opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
    let known = opened
        .iter()
        .find(|(o, _)| *o == opts)
        .map(|(_, r)| r.clone());
    let r = known.unwrap_or_else(|| {
        let r = open(&opts);
        opened.push((opts.clone(), r.clone()));
        r
    });
    drop(opened);
    match r {
        Ok(b) => {
            assert_eq!(b.options(), &opts);
            Some(b)
        }
        Err(r) if r.starts_with("CUDA present") => panic!("{r}"),
        Err(r) => {
            crate::skip(crate::Need::Gpu, &r);
            None
        }
    }
}

fn open(opts: &CudaOptions) -> Result<Arc<CudaBackend>, String> {
    if let Some(r) = unavailable_reason(opts) {
        return Err(r);
    }
    CudaBackend::open(0, opts.clone())
        .map(Arc::new)
        .map_err(|e| format!("CUDA present but device 0 failed to open ({opts:?}): {e}"))
}

/// The held-stream tests run alone ([`alone`]), the other tests of their binary beside one
/// another ([`beside_others`]): a hold lets its stream go after 20 ms, and another test's
/// driver calls on the same context (a module load, a free that waits for the device) can keep
/// the held test's thread from letting go in time. Measured: the MoE block suite in parallel on
/// a warm kernel cache lapsed one hold, alone none; the experts suite lapsed one on a cold
/// kernel cache in two of nine runs (2026-11-29), each time with a freshly compiled kernel.
static ALONE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Held by a test that must not share the device with the other tests of its binary.
pub fn alone() -> std::sync::RwLockWriteGuard<'static, ()> {
    ALONE.write().unwrap_or_else(|e| e.into_inner())
}

/// Held by every other test of a binary that has an [`alone`] test.
pub fn beside_others() -> std::sync::RwLockReadGuard<'static, ()> {
    ALONE.read().unwrap_or_else(|e| e.into_inner())
}

/// A generator seeded from the clock (fresh inputs every run), or from `TANDEM_SEED` when set;
/// the seed is printed so a failure can be replayed (`TANDEM_SEED=<seed>`).
pub fn clock_rng(tag: &str) -> ChaCha8Rng {
    let seed = crate::skip::settings().seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(7)
    });
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
        .enumerate()
        .map(|(i, t)| be.upload_for(t, op, i).expect("upload"))
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
