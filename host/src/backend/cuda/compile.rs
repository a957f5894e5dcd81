//! NVRTC compilation of the kernel modules to CUBIN for the device's arch, with a disk cache
//! keyed by sha256 of source, arch, options and NVRTC version.

use std::ffi::{CString, c_char, c_int};
use std::path::PathBuf;

use cudarc::nvrtc::result as rtc;
use cudarc::nvrtc::sys as rsys;
use sha2::{Digest, Sha256};
use tandem_gpu_kernels::{Module, hex};

use super::error;
use crate::error::{Error, Result};

/// NVRTC's version as (major, minor); (0, 0) when NVRTC cannot be loaded.
pub fn nvrtc_version() -> (i32, i32) {
    // SAFETY: only dlopens the library (cudarc would panic on a missing one).
    if !unsafe { rsys::is_culib_present() } {
        return (0, 0);
    }
    let (mut a, mut b): (c_int, c_int) = (0, 0);
    // SAFETY: writes two ints.
    let _ = unsafe { rsys::nvrtcVersion(&mut a, &mut b) };
    (a, b)
}

/// The `--gpu-architecture` value for a compute capability (sm_90a on Hopper, so wgmma and
/// setmaxnreg are available there).
pub fn arch_flag(arch: u32) -> String {
    if arch == 90 {
        "sm_90a".into()
    } else {
        format!("sm_{arch}")
    }
}

/// The options a module is compiled with.
pub fn options(arch: u32) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={}", arch_flag(arch)),
        "--std=c++17".into(),
        "-lineinfo".into(),
        "-DTANDEM_NVRTC=1".into(),
    ];
    for d in super::probe::include_dirs() {
        o.push(format!("--include-path={}", d.display()));
    }
    o
}

/// Where compiled modules are kept: $TANDEM_CACHE_DIR, else $XDG_CACHE_HOME/tandem/cuda, else
/// ~/.cache/tandem/cuda, else a folder under the temp dir.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TANDEM_CACHE_DIR") {
        return PathBuf::from(d).join("cuda");
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("tandem").join("cuda");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return PathBuf::from(h).join(".cache").join("tandem").join("cuda");
    }
    std::env::temp_dir().join("tandem-cache").join("cuda")
}

/// The cache key of a module for an arch and options.
pub fn cache_key(module: Module, arch: u32, opts: &[String]) -> String {
    let (a, b) = nvrtc_version();
    let mut h = Sha256::new();
    h.update(module.source().as_bytes());
    h.update(arch_flag(arch).as_bytes());
    for o in opts {
        h.update(o.as_bytes());
        h.update([0u8]);
    }
    h.update(format!("nvrtc {a}.{b}").as_bytes());
    hex(&h.finalize())
}

/// The CUBIN of `module` for `arch`: from the disk cache, or compiled (and cached).
pub fn cubin(module: Module, arch: u32) -> Result<Vec<u8>> {
    let opts = options(arch);
    let key = cache_key(module, arch, &opts);
    let path = cache_dir().join(format!(
        "{}-{}-{}.cubin",
        module.name(),
        arch_flag(arch),
        &key[..16]
    ));
    if let Ok(bytes) = std::fs::read(&path) {
        if !bytes.is_empty() {
            tracing::debug!(module = module.name(), path = %path.display(), "CUBIN from cache");
            return Ok(bytes);
        }
    }
    let t0 = std::time::Instant::now();
    let bin = compile(module, &opts)?;
    tracing::info!(
        module = module.name(),
        arch = %arch_flag(arch),
        ms = t0.elapsed().as_millis() as u64,
        "compiled with NVRTC"
    );
    if let Some(dir) = path.parent() {
        if std::fs::create_dir_all(dir).is_ok() {
            // A name of its own per write: two backends of one process (bf16 and f16 storage,
            // say) may compile the same module at once, and a reader must never see a
            // half-written file under the final name.
            static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
            if std::fs::write(&tmp, &bin).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        }
    }
    Ok(bin)
}

fn log_of(prog: rsys::nvrtcProgram) -> String {
    // SAFETY: prog is a live program.
    match unsafe { rtc::get_program_log(prog) } {
        Ok(v) => {
            let bytes: Vec<u8> = v
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).trim().to_string()
        }
        Err(_) => String::new(),
    }
}

/// Compiles a module with NVRTC and returns its CUBIN; errors carry NVRTC's log.
pub fn compile(module: Module, opts: &[String]) -> Result<Vec<u8>> {
    let src = CString::new(module.source())
        .map_err(|e| Error::Internal(format!("kernel source has a NUL byte: {e}")))?;
    let name = CString::new(module.path()).map_err(|e| Error::Internal(e.to_string()))?;
    let prog = rtc::create_program(&src, Some(&name))
        .map_err(|e| error::nvrtc(&format!("nvrtcCreateProgram({})", module.path()), e, ""))?;
    let what = format!("compiling {}", module.path());
    // SAFETY: prog is live until destroy_program below.
    let result = (|| {
        unsafe { rtc::compile_program(prog, opts) }
            .map_err(|e| error::nvrtc(&what, e, &log_of(prog)))?;
        let mut size = 0usize;
        unsafe { rsys::nvrtcGetCUBINSize(prog, &mut size) }
            .result()
            .map_err(|e| error::nvrtc("nvrtcGetCUBINSize", e, ""))?;
        let mut buf = vec![0u8; size];
        unsafe { rsys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char) }
            .result()
            .map_err(|e| error::nvrtc("nvrtcGetCUBIN", e, ""))?;
        let log = log_of(prog);
        if !log.is_empty() {
            tracing::debug!(module = module.name(), %log, "NVRTC log");
        }
        Ok(buf)
    })();
    // SAFETY: created above, destroyed once.
    let _ = unsafe { rtc::destroy_program(prog) };
    result
}
