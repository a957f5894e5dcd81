//! NVRTC compilation of the kernel modules to CUBIN for the device's arch, with a disk cache
//! keyed by sha256 of source, arch, options and NVRTC version. Sources, cache and headers are
//! where the backend's [`CudaOptions`] say.

use std::ffi::{CString, c_char, c_int};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::result as rtc;
use cudarc::nvrtc::sys as rsys;
use sha2::{Digest, Sha256};
use tandem_gpu_kernels::{Module, hex};

use super::{CudaOptions, error};
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

/// What kernels are compiled from and into: the source folder (if any), the CUBIN cache and
/// the header folders, all from [`CudaOptions`].
#[derive(Debug, Clone)]
pub struct Compiler {
    kernel_dir: Option<PathBuf>,
    cache_dir: PathBuf,
    decode_ring: tandem_gpu_kernels::DecodeRing,
    include_dirs: Vec<PathBuf>,
}

impl Compiler {
    /// The compiler `opts` describe (the header folders are looked up now).
    pub fn new(opts: &CudaOptions) -> Self {
        Self {
            kernel_dir: opts.kernel_dir.clone(),
            cache_dir: opts.cache_dir.clone(),
            decode_ring: opts.decode_ring.unwrap_or_default(),
            include_dirs: super::probe::include_dirs(opts),
        }
    }

    /// Where compiled modules are kept ([`CudaOptions::cache_dir`]).
    pub fn cache_dir(&self) -> &Path {
        &self.cache_dir
    }

    /// A module's full source, read from the kernel folder where one is set.
    pub fn source(&self, module: Module) -> String {
        module.source(self.kernel_dir.as_deref())
    }

    /// The options `module` is compiled with for `arch` (the decode module's ring, where
    /// another is set, as `-D` options).
    pub fn options(&self, module: Module, arch: u32) -> Vec<String> {
        let mut o = vec![
            format!("--gpu-architecture={}", arch_flag(arch)),
            "--std=c++17".into(),
            // unannotated functions (a kernel's local lambdas) are device code
            "--device-as-default-execution-space".into(),
            "-lineinfo".into(),
            "-DTANDEM_NVRTC=1".into(),
        ];
        for d in &self.include_dirs {
            o.push(format!("--include-path={}", d.display()));
        }
        if module == Module::AttentionDecode {
            o.extend(self.decode_ring.defines());
        }
        o
    }

    /// The cache key of a module for an arch and options: sha256 of the source, arch,
    /// options and NVRTC version.
    pub fn cache_key(&self, module: Module, arch: u32, opts: &[String]) -> String {
        let (a, b) = nvrtc_version();
        let mut h = Sha256::new();
        h.update(self.source(module).as_bytes());
        h.update(arch_flag(arch).as_bytes());
        for o in opts {
            h.update(o.as_bytes());
            h.update([0u8]);
        }
        h.update(format!("nvrtc {a}.{b}").as_bytes());
        hex(&h.finalize())
    }

    /// The CUBIN of `module` for `arch` (a device named `device`): from the disk cache, or
    /// compiled (and cached).
    pub fn cubin(&self, device: &str, module: Module, arch: u32) -> Result<Vec<u8>> {
        let opts = self.options(module, arch);
        let key = self.cache_key(module, arch, &opts);
        let path = self.cache_dir.join(format!(
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
        let bin = self.compile(device, module, &opts)?;
        tracing::info!(
            module = module.name(),
            arch = %arch_flag(arch),
            ms = t0.elapsed().as_millis() as u64,
            "compiled with NVRTC"
        );
        if let Some(dir) = path.parent() {
            if std::fs::create_dir_all(dir).is_ok() {
                // Two backends of one process (bf16 and f16 storage, say) or two processes may
                // compile the same module at once; a reader never sees a half-written file.
                if let Err(e) = crate::files::write_atomic(&path, &bin) {
                    tracing::debug!(error = %e, "CUBIN not cached");
                }
            }
        }
        Ok(bin)
    }

    /// Compiles a module with NVRTC for `device` and returns its CUBIN; a failure is an
    /// [`Error::Compile`] with NVRTC's log.
    pub fn compile(&self, device: &str, module: Module, opts: &[String]) -> Result<Vec<u8>> {
        let src = CString::new(self.source(module))
            .map_err(|e| Error::Internal(format!("kernel source has a NUL byte: {e}")))?;
        let path = module.path();
        let name = CString::new(path).map_err(|e| Error::Internal(e.to_string()))?;
        let prog = rtc::create_program(&src, Some(&name))
            .map_err(|e| error::nvrtc(device, path, "nvrtcCreateProgram", e, ""))?;
        let result = (|| {
            // SAFETY: prog is live until destroy_program below.
            unsafe { rtc::compile_program(prog, opts) }
                .map_err(|e| error::nvrtc(device, path, "compiling", e, &log_of(prog)))?;
            let mut size = 0usize;
            // SAFETY: prog is live and compiled; writes one size_t.
            unsafe { rsys::nvrtcGetCUBINSize(prog, &mut size) }
                .result()
                .map_err(|e| error::nvrtc(device, path, "nvrtcGetCUBINSize", e, ""))?;
            let mut buf = vec![0u8; size];
            // SAFETY: buf holds the `size` bytes NVRTC reported.
            unsafe { rsys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char) }
                .result()
                .map_err(|e| error::nvrtc(device, path, "nvrtcGetCUBIN", e, ""))?;
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
