//! A CBLAS library (OpenBLAS, MKL) loaded at run time, for the CPU backend's f32 matrix
//! products: `cblas_sgemm`, and the library's own thread count.
//!
//! Nothing is linked at build time: tandem builds and runs without a BLAS (the portable GEMM,
//! matrixmultiply, takes over), as the CUDA backend does without CUDA.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use ndarray::{ArrayView2, ArrayViewMut2};

use crate::options::CpuBlas;
use crate::options::cpu::BLAS_VAR;

/// Libraries looked for in the system's library path by [`CpuBlas::Auto`], in order.
/// `libblas.so.3` is taken only when it is an optimised BLAS (see [`Blas::vendor`]); the
/// reference BLAS Debian installs there is slower than the portable GEMM.
pub const AUTO_CANDIDATES: [&str; 6] = [
    "libopenblas.so.0",
    "libopenblas64.so.0",
    "libmkl_rt.so.2",
    "libmkl_rt.so",
    "libblas.so.3",
    "libopenblas.so",
];

// CBLAS enum values (cblas.h).
const ROW_MAJOR: c_int = 101;
const NO_TRANS: c_int = 111;
const TRANS: c_int = 112;

/// `cblas_sgemm` with 32-bit integers (LP64 libraries).
type Sgemm32 = unsafe extern "C" fn(
    c_int,
    c_int,
    c_int,
    i32,
    i32,
    i32,
    f32,
    *const f32,
    i32,
    *const f32,
    i32,
    f32,
    *mut f32,
    i32,
);
/// `cblas_sgemm` with 64-bit integers (ILP64 libraries: OpenBLAS built with INTERFACE64).
type Sgemm64 = unsafe extern "C" fn(
    c_int,
    c_int,
    c_int,
    i64,
    i64,
    i64,
    f32,
    *const f32,
    i64,
    *const f32,
    i64,
    f32,
    *mut f32,
    i64,
);

#[derive(Clone, Copy)]
enum Sgemm {
    Lp64(Sgemm32),
    Ilp64(Sgemm64),
}

/// An optimised BLAS library, loaded and checked.
pub struct Blas {
    sgemm: Sgemm,
    set_threads: Option<unsafe extern "C" fn(c_int)>,
    /// The thread count last given to the library (0: never set).
    threads_set: AtomicUsize,
    path: PathBuf,
    vendor: &'static str,
    version: Option<String>,
    /// Kept open for as long as the function pointers above are used.
    _lib: libloading::Library,
}

impl std::fmt::Debug for Blas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blas")
            .field("path", &self.path)
            .field("vendor", &self.vendor)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// Entry points a library is recognised by (vendor, symbol).
const VENDOR_MARKS: [(&str, &str); 4] = [
    ("OpenBLAS", "openblas_get_config"),
    ("OpenBLAS", "openblas_get_config64_"),
    ("MKL", "MKL_Get_Version_String"),
    ("BLIS", "bli_info_get_version_str"),
];

impl Blas {
    /// The library `choice` asks for: `Ok(None)` when it says off, or when `Auto` finds no
    /// optimised BLAS (the reason is logged); `Err` when a library named by path cannot be
    /// used, saying why.
    pub fn open(choice: &CpuBlas) -> Result<Option<Blas>, String> {
        match choice {
            CpuBlas::Off => Ok(None),
            CpuBlas::Library(p) => Self::load(p.as_os_str(), false)
                .map(Some)
                .map_err(|e| format!("{BLAS_VAR}: {e}")),
            CpuBlas::Auto => {
                let mut why = Vec::new();
                for name in AUTO_CANDIDATES {
                    match Self::load(std::ffi::OsStr::new(name), true) {
                        Ok(b) => return Ok(Some(b)),
                        Err(e) => why.push(e),
                    }
                }
                tracing::debug!(reasons = ?why, "no optimised BLAS found; the portable GEMM is used");
                Ok(None)
            }
        }
    }

    /// Loads `name` (a path, or a file name the loader looks up) and its `cblas_sgemm`;
    /// with `optimised_only`, refuses a library none of [`VENDOR_MARKS`] identifies.
    fn load(name: &std::ffi::OsStr, optimised_only: bool) -> Result<Blas, String> {
        let shown = name.to_string_lossy();
        // SAFETY: loading a BLAS runs only its initialisers (OpenBLAS starts its thread pool),
        // which have no preconditions.
        let lib = unsafe { libloading::Library::new(name) }
            .map_err(|e| format!("{shown}: cannot load: {e}"))?;
        let vendor = VENDOR_MARKS
            .iter()
            // SAFETY: only the symbol's presence is checked here.
            .find(|(_, sym)| unsafe { lib.get::<*const c_void>(*sym) }.is_ok())
            .map(|(v, _)| *v);
        if optimised_only && vendor.is_none() {
            return Err(format!(
                "{shown}: not OpenBLAS, MKL or BLIS (likely the reference BLAS, slower than \
                 the portable GEMM)"
            ));
        }
        let version = library_version(&lib);
        // SAFETY: the symbols are the CBLAS functions of these names; their C signatures are
        // the types given (cblas.h: enums are int; integers are 64-bit in ILP64 builds, which
        // OpenBLAS marks with the `64_` suffix or USE64BITINT in its configuration).
        let sgemm = unsafe {
            if let Ok(f) = lib.get::<Sgemm64>("cblas_sgemm64_") {
                Sgemm::Ilp64(*f)
            } else {
                let f = lib
                    .get::<Sgemm32>("cblas_sgemm")
                    .map_err(|_| format!("{shown}: no cblas_sgemm (not a CBLAS library)"))?;
                if version
                    .as_deref()
                    .is_some_and(|v| v.contains("USE64BITINT"))
                {
                    Sgemm::Ilp64(std::mem::transmute::<Sgemm32, Sgemm64>(*f))
                } else {
                    Sgemm::Lp64(*f)
                }
            }
        };
        // SAFETY: as above; both take the thread count as an int.
        let set_threads = unsafe {
            [
                "openblas_set_num_threads",
                "openblas_set_num_threads64_",
                "MKL_Set_Num_Threads",
            ]
            .iter()
            .find_map(|s| lib.get::<unsafe extern "C" fn(c_int)>(*s).ok().map(|f| *f))
        };
        let path = loaded_path(&lib).unwrap_or_else(|| PathBuf::from(name));
        let blas = Blas {
            sgemm,
            set_threads,
            threads_set: AtomicUsize::new(0),
            path,
            vendor: vendor.unwrap_or("CBLAS"),
            version,
            _lib: lib,
        };
        blas.warm_up();
        Ok(blas)
    }

    /// One small threaded product, so the library's one-time set-up (its threads, its
    /// buffers) happens when it is loaded rather than inside the first op a run times.
    fn warm_up(&self) {
        let a = ndarray::Array2::<f32>::zeros((128, 128));
        let mut c = ndarray::Array2::<f32>::zeros((128, 128));
        self.gemm(1.0, a.view(), a.t(), 0.0, c.view_mut());
    }

    /// The library file (as the loader found it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `OpenBLAS`, `MKL`, `BLIS`, or `CBLAS` for a library none of them.
    pub fn vendor(&self) -> &'static str {
        self.vendor
    }

    /// The library's own description (`openblas_get_config`, MKL's version string), if it
    /// gives one.
    pub fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// One line for `tandem devices`: vendor, version, path.
    pub fn describe(&self) -> String {
        match &self.version {
            Some(v) => format!("{} ({v}), {}", self.vendor, self.path.display()),
            None => format!("{}, {}", self.vendor, self.path.display()),
        }
    }

    /// Makes the library compute with `threads` threads (its own pool), when it lets itself be
    /// told; only calls the library when the count changes.
    pub fn use_threads(&self, threads: usize) {
        let threads = threads.max(1);
        if self.threads_set.swap(threads, Ordering::Relaxed) == threads {
            return;
        }
        if let Some(f) = self.set_threads {
            // SAFETY: openblas_set_num_threads / MKL_Set_Num_Threads take any positive count.
            unsafe { f(c_int::try_from(threads).unwrap_or(c_int::MAX)) };
        }
    }

    /// c = alpha a b + beta c for f32 matrix views, a `[m, k]`, b `[k, n]`, c `[m, n]`; a and
    /// b may be row-major or transposed (unit stride in either dimension), c row-major.
    /// Returns `false`, with c untouched, when a view has neither layout, K is 0, or a size
    /// does not fit the library's integers (the caller then multiplies another way).
    pub fn gemm(
        &self,
        alpha: f32,
        a: ArrayView2<f32>,
        b: ArrayView2<f32>,
        beta: f32,
        mut c: ArrayViewMut2<f32>,
    ) -> bool {
        let (m, k) = a.dim();
        let n = b.ncols();
        if b.nrows() != k || c.dim() != (m, n) {
            return false;
        }
        if m == 0 || n == 0 {
            return true;
        }
        let (Some((ta, lda)), Some((tb, ldb)), Some((false, ldc))) = (
            layout(a.dim(), a.strides()),
            layout(b.dim(), b.strides()),
            layout(c.dim(), c.strides()),
        ) else {
            return false;
        };
        if k == 0 {
            return false;
        }
        let trans = |t: bool| if t { TRANS } else { NO_TRANS };
        let (ta, tb) = (trans(ta), trans(tb));
        let (pa, pb, pc) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        match self.sgemm {
            Sgemm::Lp64(f) => {
                let i = |v: usize| i32::try_from(v).ok();
                let (Some(m), Some(n), Some(k), Some(lda), Some(ldb), Some(ldc)) =
                    (i(m), i(n), i(k), i(lda), i(ldb), i(ldc))
                else {
                    return false;
                };
                // SAFETY: each pointer is element [0, 0] of a view whose elements lie at
                // non-negative strides `ld` (checked by `layout`), so the library reads and
                // writes only the views' elements; c does not alias a or b (a mutable and
                // two shared borrows).
                unsafe {
                    f(
                        ROW_MAJOR, ta, tb, m, n, k, alpha, pa, lda, pb, ldb, beta, pc, ldc,
                    )
                };
            }
            Sgemm::Ilp64(f) => {
                let i = |v: usize| i64::try_from(v).ok();
                let (Some(m), Some(n), Some(k), Some(lda), Some(ldb), Some(ldc)) =
                    (i(m), i(n), i(k), i(lda), i(ldb), i(ldc))
                else {
                    return false;
                };
                // SAFETY: as above.
                unsafe {
                    f(
                        ROW_MAJOR, ta, tb, m, n, k, alpha, pa, lda, pb, ldb, beta, pc, ldc,
                    )
                };
            }
        }
        true
    }
}

/// A view's layout for a row-major BLAS call: `(transposed, leading dimension)`, or `None`
/// when it has no unit stride (or a negative one).
fn layout((rows, cols): (usize, usize), strides: &[isize]) -> Option<(bool, usize)> {
    let s0 = usize::try_from(strides[0]).ok()?;
    let s1 = usize::try_from(strides[1]).ok()?;
    if (s1 == 1 || cols <= 1) && (rows <= 1 || s0 >= cols) {
        Some((false, if rows <= 1 { cols.max(1) } else { s0 }))
    } else if (s0 == 1 || rows <= 1) && (cols <= 1 || s1 >= rows) {
        Some((true, if cols <= 1 { rows.max(1) } else { s1 }))
    } else {
        None
    }
}

/// The library's own description, if it has a function that gives one.
fn library_version(lib: &libloading::Library) -> Option<String> {
    // SAFETY: openblas_get_config returns a static NUL-terminated string.
    let openblas = ["openblas_get_config", "openblas_get_config64_"]
        .iter()
        .find_map(|s| unsafe { lib.get::<unsafe extern "C" fn() -> *const c_char>(*s) }.ok());
    if let Some(f) = openblas {
        // SAFETY: as above; a null pointer is checked.
        let p = unsafe { f() };
        if !p.is_null() {
            // SAFETY: a static NUL-terminated string.
            let s = unsafe { CStr::from_ptr(p) };
            return Some(s.to_string_lossy().trim().to_string());
        }
    }
    // SAFETY: MKL_Get_Version_String(char *buf, int len) writes at most len bytes.
    let mkl =
        unsafe { lib.get::<unsafe extern "C" fn(*mut c_char, c_int)>("MKL_Get_Version_String") };
    if let Ok(f) = mkl {
        let mut buf = vec![0 as c_char; 256];
        // SAFETY: the buffer holds 256 bytes and the length says so.
        unsafe { f(buf.as_mut_ptr(), 255) };
        buf[255] = 0;
        // SAFETY: NUL-terminated (the last byte is 0).
        let s = unsafe { CStr::from_ptr(buf.as_ptr()) };
        return Some(s.to_string_lossy().trim().to_string());
    }
    None
}

/// `struct Dl_info` (dlfcn.h).
#[repr(C)]
struct DlInfo {
    dli_fname: *const c_char,
    dli_fbase: *mut c_void,
    dli_sname: *const c_char,
    dli_saddr: *mut c_void,
}

unsafe extern "C" {
    /// glibc's dladdr (in libc.so.6 since glibc 2.34, libdl before; both are linked).
    fn dladdr(addr: *const c_void, info: *mut DlInfo) -> c_int;
}

/// The file the loader opened `lib` from, found through the address of its `cblas_sgemm`.
fn loaded_path(lib: &libloading::Library) -> Option<PathBuf> {
    // SAFETY: only the symbol's address is read.
    let sym = unsafe { lib.get::<*const c_void>("cblas_sgemm") }.ok()?;
    let addr: *const c_void = *sym;
    let mut info = DlInfo {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr fills `info` for an address inside a loaded object.
    let found = unsafe { dladdr(addr, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is the NUL-terminated path of the loaded object.
    let s = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(s.to_string_lossy().into_owned()))
}
