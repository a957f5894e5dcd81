//! Finds the CUDA libraries without letting cudarc panic: checks that the driver, NVRTC and
//! cuBLASLt can be opened (preloading them from the usual install folders where the loader's
//! search path misses them), that `cuInit` succeeds and that a device exists. Where to look
//! first comes from [`CudaOptions::toolkit_roots`] and [`CudaOptions::python_prefix`].

use std::path::{Path, PathBuf};

use super::CudaOptions;

/// Folders that may hold CUDA's libraries: the toolkit roots of `opts` (CUDA_HOME /
/// CUDA_PATH), /usr/local/cuda, and NVIDIA's pip wheels in the usual Python prefixes.
pub fn library_dirs(opts: &CudaOptions) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for h in &opts.toolkit_roots {
        v.push(h.join("lib64"));
        v.push(h.join("lib"));
    }
    v.push(PathBuf::from("/usr/local/cuda/lib64"));
    v.push(PathBuf::from("/usr/local/cuda/targets/x86_64-linux/lib"));
    v.extend(wheel_dirs(opts, "lib"));
    v.into_iter().filter(|d| d.is_dir()).collect()
}

/// Folders that may hold CUDA's headers, in the same places as [`library_dirs`].
pub fn include_dirs(opts: &CudaOptions) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for h in &opts.toolkit_roots {
        v.push(h.join("include"));
    }
    v.push(PathBuf::from("/usr/local/cuda/include"));
    v.extend(wheel_dirs(opts, "include"));
    v.into_iter()
        .filter(|d| d.join("cuda_runtime.h").is_file() || d.join("cuda_bf16.h").is_file())
        .collect()
}

/// `<site-packages>/nvidia/*/<sub>` in the Python prefix of `opts` (VIRTUAL_ENV),
/// /opt/torch/.venv, /usr/local and /usr.
fn wheel_dirs(opts: &CudaOptions, sub: &str) -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> = Vec::new();
    if let Some(v) = &opts.python_prefix {
        prefixes.push(v.clone());
    }
    // /opt/tandem/nvrtc-venv: NVRTC and the headers that .ci/setup installs from NVIDIA's
    // wheels (compiling the kernels needs no GPU).
    for p in [
        "/opt/tandem/nvrtc-venv",
        "/opt/torch/.venv",
        "/usr/local",
        "/usr",
    ] {
        prefixes.push(p.into());
    }
    let mut out = Vec::new();
    for p in prefixes {
        for lib in ["lib", "lib64"] {
            let Ok(rd) = std::fs::read_dir(p.join(lib)) else {
                continue;
            };
            for py in rd.flatten() {
                let name = py.file_name();
                if !name.to_string_lossy().starts_with("python3") {
                    continue;
                }
                for site in ["site-packages", "dist-packages"] {
                    let nv = py.path().join(site).join("nvidia");
                    let Ok(pk) = std::fs::read_dir(&nv) else {
                        continue;
                    };
                    for pkg in pk.flatten() {
                        let d = pkg.path().join(sub);
                        if d.is_dir() {
                            out.push(d);
                        }
                    }
                }
            }
        }
    }
    out
}

/// dlopens the first `<dir>/<file>` that exists and keeps it loaded, so that a later dlopen by
/// soname (cudarc's) finds it. Returns whether one loaded.
fn preload(opts: &CudaOptions, file_names: &[&str]) -> bool {
    for d in library_dirs(opts) {
        for f in file_names {
            let p = d.join(f);
            if p.is_file() && open_forever(&p) {
                tracing::debug!(path = %p.display(), "preloaded CUDA library");
                return true;
            }
        }
    }
    false
}

/// dlopens NVRTC's builtins library (`libnvrtc-builtins.so.13.*`) from the folders where
/// NVRTC is preloaded from: NVRTC opens it by soname at its first compile, and a wheel's lib
/// folder is not on the loader's search path. Returns whether one loaded.
fn preload_builtins(opts: &CudaOptions) -> bool {
    for d in library_dirs(opts) {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for f in rd.flatten() {
            let name = f.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("libnvrtc-builtins.so.13") && open_forever(&f.path()) {
                tracing::debug!(path = %f.path().display(), "preloaded NVRTC builtins");
                return true;
            }
        }
    }
    false
}

fn open_forever(p: &Path) -> bool {
    // SAFETY: loading a CUDA library runs only its initialisers, which have no preconditions.
    match unsafe { libloading::Library::new(p) } {
        Ok(lib) => {
            std::mem::forget(lib);
            true
        }
        Err(_) => false,
    }
}

/// Whether NVRTC can be loaded (preloaded from the folders of `opts` and the usual ones where
/// the loader's search path misses it). Enough to compile the kernels; no driver or device
/// needed.
pub fn nvrtc_present(opts: &CudaOptions) -> bool {
    // SAFETY: the presence checks only dlopen and close the library.
    let found = unsafe { cudarc::nvrtc::sys::is_culib_present() };
    found
        || (preload_builtins(opts) | preload(opts, &["libnvrtc.so.13", "libnvrtc.so"])
            // SAFETY: as above.
            && unsafe { cudarc::nvrtc::sys::is_culib_present() })
}

/// Checks everything the backend needs, looking for the libraries where `opts` says first;
/// `Err` carries the reason shown by `tandem devices`. Returns the number of devices.
pub fn check(opts: &CudaOptions) -> Result<usize, String> {
    // SAFETY: the presence checks only dlopen and close the libraries.
    let driver = unsafe { cudarc::driver::sys::is_culib_present() };
    if !driver {
        return Err("no NVIDIA driver (libcuda.so.1 not found)".into());
    }
    if !nvrtc_present(opts) {
        return Err(
            "NVRTC not found (libnvrtc.so.13; install the CUDA toolkit or set CUDA_HOME)".into(),
        );
    }
    // SAFETY: the presence checks only dlopen and close the library; preloading only runs
    // the library's initialisers (see `open_forever`).
    let lt = unsafe { cudarc::cublaslt::sys::is_culib_present() }
        || (preload(opts, &["libcublasLt.so.13", "libcublasLt.so"])
            // SAFETY: as above.
            && unsafe { cudarc::cublaslt::sys::is_culib_present() });
    if !lt {
        return Err(
            "cuBLASLt not found (libcublasLt.so.13; install the CUDA toolkit or set CUDA_HOME)"
                .into(),
        );
    }
    if let Err(e) = cudarc::driver::result::init() {
        use cudarc::driver::sys::CUresult;
        return Err(match e.0 {
            CUresult::CUDA_ERROR_NO_DEVICE => "no CUDA device".into(),
            _ => format!("cuInit failed: {}", super::error::driver_msg(&e)),
        });
    }
    match cudarc::driver::result::device::get_count() {
        Ok(0) => Err("no CUDA device".into()),
        Ok(n) => Ok(n as usize),
        Err(e) => Err(format!(
            "cannot count devices: {}",
            super::error::driver_msg(&e)
        )),
    }
}
