//! Fused linear through cuBLASLt: y[M, N] = epilogue(x[M, K] W[N, K]^T + b), bf16 or f16 in and
//! out (the bias too), f32 compute and scale. The matmul descriptor, the three layouts and the
//! heuristic's algorithm are built once per (storage, M, N, K, epilogue) and cached (cudarc's
//! safe wrapper rebuilds them each call).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys as ltsys;
use cudarc::driver::sys;

use super::CudaDType;
use super::error::BlasResultExt;
use super::memory::{DevBuf, Pool};
use super::timing::Holder;
use crate::error::Result;

/// Workspace given to cuBLASLt, bytes.
pub const WORKSPACE: usize = 32 << 20;

/// Which epilogue cuBLASLt applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Epilogue {
    /// Nothing.
    None,
    /// + bias.
    Bias,
    /// relu(.), optionally after the bias.
    Relu { bias: bool },
    /// gelu_tanh(.), optionally after the bias.
    Gelu { bias: bool },
}

impl Epilogue {
    fn native(self) -> ltsys::cublasLtEpilogue_t {
        use ltsys::cublasLtEpilogue_t as E;
        match self {
            Epilogue::None => E::CUBLASLT_EPILOGUE_DEFAULT,
            Epilogue::Bias => E::CUBLASLT_EPILOGUE_BIAS,
            Epilogue::Relu { bias: false } => E::CUBLASLT_EPILOGUE_RELU,
            Epilogue::Relu { bias: true } => E::CUBLASLT_EPILOGUE_RELU_BIAS,
            Epilogue::Gelu { bias: false } => E::CUBLASLT_EPILOGUE_GELU,
            Epilogue::Gelu { bias: true } => E::CUBLASLT_EPILOGUE_GELU_BIAS,
        }
    }

    fn has_bias(self) -> bool {
        matches!(
            self,
            Epilogue::Bias | Epilogue::Relu { bias: true } | Epilogue::Gelu { bias: true }
        )
    }

    /// Name used in kernel reports.
    pub fn name(self) -> &'static str {
        match self {
            Epilogue::None => "",
            Epilogue::Bias => "_bias",
            Epilogue::Relu { bias: false } => "_relu",
            Epilogue::Relu { bias: true } => "_bias_relu",
            Epilogue::Gelu { bias: false } => "_gelu",
            Epilogue::Gelu { bias: true } => "_bias_gelu",
        }
    }
}

/// What a plan is built for: storage, f32 output, M, N, K and epilogue.
type PlanKey = (CudaDType, bool, usize, usize, usize, Epilogue);

struct Plan {
    desc: ltsys::cublasLtMatmulDesc_t,
    a: ltsys::cublasLtMatrixLayout_t,
    b: ltsys::cublasLtMatrixLayout_t,
    d: ltsys::cublasLtMatrixLayout_t,
    algo: ltsys::cublasLtMatmulAlgo_t,
}

/// A cuBLASLt handle, its workspace and the cached plans of one device.
pub struct BlasLt {
    label: String,
    handle: ltsys::cublasLtHandle_t,
    workspace: DevBuf,
    plans: Mutex<HashMap<PlanKey, Plan>>,
    /// The device's stream hold, let go before a new plan is made.
    holder: std::sync::Arc<Holder>,
    /// `cublasLtMatmul` calls so far (each launches one kernel or more).
    calls: std::sync::atomic::AtomicU64,
}

// SAFETY: cuBLASLt handles and descriptors may be used from any thread; plans are only touched
// under the mutex, and the handle is used only under the device's launch lock.
unsafe impl Send for BlasLt {}
// SAFETY: as above.
unsafe impl Sync for BlasLt {}

impl std::fmt::Debug for BlasLt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlasLt({})", self.label)
    }
}

impl BlasLt {
    /// A handle and workspace for the current context's device; `holder` is let go before a
    /// new plan is made.
    pub fn new(
        label: &str,
        pool: &std::sync::Arc<Pool>,
        holder: std::sync::Arc<Holder>,
    ) -> Result<Self> {
        let handle = lt::create_handle().ctx(label, "cublasLtCreate")?;
        Ok(Self {
            label: label.into(),
            handle,
            workspace: pool.alloc(WORKSPACE)?,
            plans: Mutex::new(HashMap::new()),
            holder,
            calls: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// `cublasLtMatmul` calls made so far on this device (queued or captured; each launches
    /// one kernel or more: a split-K plan adds a reduction).
    pub fn calls(&self) -> u64 {
        self.calls.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn plan(&self, key: PlanKey) -> Result<Plan> {
        let (dt, f32_out, m, n, k, epi) = key;
        let l = &self.label;
        use ltsys::cudaDataType::{CUDA_R_16BF, CUDA_R_16F, CUDA_R_32F};
        let ty = match dt {
            CudaDType::Bf16 => CUDA_R_16BF,
            CudaDType::F16 => CUDA_R_16F,
        };
        // The output (and bias) type: the storage's, or f32.
        let out_ty = if f32_out { CUDA_R_32F } else { ty };
        let desc =
            lt::create_matmul_desc(ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F, CUDA_R_32F)
                .ctx(l, "cublasLtMatmulDescCreate")?;
        let set = |attr: ltsys::cublasLtMatmulDescAttributes_t, v: i32| {
            // SAFETY: desc is live; v is an int32 attribute value.
            unsafe {
                lt::set_matmul_desc_attribute(
                    desc,
                    attr,
                    &v as *const i32 as *const c_void,
                    std::mem::size_of::<i32>(),
                )
            }
            .ctx(l, "cublasLtMatmulDescSetAttribute")
        };
        use ltsys::cublasLtMatmulDescAttributes_t as D;
        set(D::CUBLASLT_MATMUL_DESC_TRANSA, 1 /* CUBLAS_OP_T */)?;
        set(D::CUBLASLT_MATMUL_DESC_TRANSB, 0 /* CUBLAS_OP_N */)?;
        set(D::CUBLASLT_MATMUL_DESC_EPILOGUE, epi.native() as i32)?;
        if epi.has_bias() {
            // The bias is stored like the output (cuBLASLt's default for 16-bit D; set so the
            // plan says so).
            set(D::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, out_ty as i32)?;
        }
        // Column-major view: D^T[N, M] = W^T[N, K] (W stored [N, K] row-major = [K, N] col-major,
        // transposed) times x^T[K, M] (x row-major [M, K] = col-major [K, M]).
        let a = lt::create_matrix_layout(ty, k as u64, n as u64, k as i64)
            .ctx(l, "cublasLtMatrixLayoutCreate")?;
        let b = lt::create_matrix_layout(ty, k as u64, m as u64, k as i64)
            .ctx(l, "cublasLtMatrixLayoutCreate")?;
        let d = lt::create_matrix_layout(out_ty, n as u64, m as u64, n as i64)
            .ctx(l, "cublasLtMatrixLayoutCreate")?;
        let pref = lt::create_matmul_pref().ctx(l, "cublasLtMatmulPreferenceCreate")?;
        let ws = WORKSPACE;
        // SAFETY: pref is live; the value is a size_t.
        unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const usize as *const c_void,
                std::mem::size_of::<usize>(),
            )
        }
        .ctx(l, "cublasLtMatmulPreferenceSetAttribute")?;
        if epi.has_bias() {
            // The heuristic must see a bias pointer to pick an algorithm for the bias epilogue;
            // the workspace address stands in at planning time (the real bias is set per call).
            self.set_bias(desc, self.workspace.ptr())?;
        }
        // SAFETY: every descriptor is live.
        let heur = unsafe { lt::get_matmul_algo_heuristic(self.handle, desc, a, b, d, d, pref) }
            .ctx(
                l,
                &format!(
                    "no cuBLASLt algorithm for {dt} {m}x{n}x{k}{}{}",
                    epi.name(),
                    if f32_out { " (f32 output)" } else { "" }
                ),
            );
        // SAFETY: created above.
        let _ = unsafe { lt::destroy_matmul_pref(pref) };
        let heur = heur?;
        tracing::debug!(
            dtype = dt.name(),
            f32_out,
            m,
            n,
            k,
            epilogue = epi.name(),
            "cuBLASLt plan"
        );
        Ok(Plan {
            desc,
            a,
            b,
            d,
            algo: heur.algo,
        })
    }

    fn set_bias(&self, desc: ltsys::cublasLtMatmulDesc_t, ptr: sys::CUdeviceptr) -> Result<()> {
        // SAFETY: desc is live; the value is a device pointer.
        unsafe {
            lt::set_matmul_desc_attribute(
                desc,
                ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                &ptr as *const u64 as *const c_void,
                std::mem::size_of::<u64>(),
            )
        }
        .ctx(&self.label, "cublasLtMatmulDescSetAttribute(bias)")
    }

    /// Queues y = epi(x W^T + b) on `stream`. Pointers are device arrays of `dt` (bf16 or
    /// f16): x [M, K], w [N, K]; bias [N] (when the epilogue has one) and y [M, N] in `dt`, or
    /// in f32 with `f32_out`.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &self,
        stream: sys::CUstream,
        dt: CudaDType,
        f32_out: bool,
        m: usize,
        n: usize,
        k: usize,
        epi: Epilogue,
        x: sys::CUdeviceptr,
        w: sys::CUdeviceptr,
        bias: sys::CUdeviceptr,
        y: sys::CUdeviceptr,
    ) -> Result<()> {
        if m == 0 {
            return Ok(());
        }
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        let key = (dt, f32_out, m, n, k, epi);
        let p = match plans.entry(key) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                // The heuristic, and the kernel's load at its first use, are host work the
                // device must not be held for.
                self.holder.release();
                v.insert(self.plan(key)?)
            }
        };
        if epi.has_bias() {
            self.set_bias(p.desc, bias)?;
        }
        let alpha = 1.0f32;
        let beta = 0.0f32;
        // SAFETY: descriptors and algorithm are live; pointers are device arrays of the sizes
        // the layouts describe, queued on `stream` after the work that wrote them.
        unsafe {
            lt::matmul(
                self.handle,
                p.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                w as *const c_void,
                p.a,
                x as *const c_void,
                p.b,
                y as *const c_void,
                p.d,
                y as *mut c_void,
                p.d,
                &p.algo,
                self.workspace.ptr() as *mut c_void,
                WORKSPACE,
                stream as ltsys::cudaStream_t,
            )
        }
        .ctx(
            &self.label,
            &format!("cublasLtMatmul {dt} {m}x{n}x{k} (f32 output: {f32_out})"),
        )?;
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}
