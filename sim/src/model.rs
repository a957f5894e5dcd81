//! Building an emitted kernel with Verilator, at first use, into a cache folder keyed by a
//! hash of the Verilog, the shim, the flags and the Verilator version; and loading the result
//! (a shared library behind a small C ABI, `shim.cpp`) with libloading.

use std::ffi::{CString, c_char, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::SimError;

/// The C++ shim compiled beside every model.
pub const SHIM_CPP: &str = include_str!("shim.cpp");

/// Oldest Verilator release tandem supports.
pub const MIN_VERILATOR: (u32, u32) = (5, 6);

/// Install hint shown when Verilator is missing.
pub const INSTALL_HINT: &str =
    "install Verilator >= 5.006 (Debian/Ubuntu: apt-get install verilator) and a C++ compiler";

/// Inputs of the model, one per Vitis port the testbench drives (all widened to u64).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PinsIn {
    /// ap_rst_n.
    pub ap_rst_n: u64,
    /// s_axi_control awvalid.
    pub s_awvalid: u64,
    /// s_axi_control awaddr.
    pub s_awaddr: u64,
    /// s_axi_control wvalid.
    pub s_wvalid: u64,
    /// s_axi_control wdata.
    pub s_wdata: u64,
    /// s_axi_control wstrb.
    pub s_wstrb: u64,
    /// s_axi_control bready.
    pub s_bready: u64,
    /// s_axi_control arvalid.
    pub s_arvalid: u64,
    /// s_axi_control araddr.
    pub s_araddr: u64,
    /// s_axi_control rready.
    pub s_rready: u64,
    /// m_axi_gmem awready.
    pub m_awready: u64,
    /// m_axi_gmem wready.
    pub m_wready: u64,
    /// m_axi_gmem bvalid.
    pub m_bvalid: u64,
    /// m_axi_gmem bresp.
    pub m_bresp: u64,
    /// m_axi_gmem arready.
    pub m_arready: u64,
    /// m_axi_gmem rvalid.
    pub m_rvalid: u64,
    /// m_axi_gmem rdata.
    pub m_rdata: u64,
    /// m_axi_gmem rlast.
    pub m_rlast: u64,
    /// m_axi_gmem rresp.
    pub m_rresp: u64,
}

/// Outputs of the model.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PinsOut {
    /// s_axi_control awready.
    pub s_awready: u64,
    /// s_axi_control wready.
    pub s_wready: u64,
    /// s_axi_control bvalid.
    pub s_bvalid: u64,
    /// s_axi_control bresp.
    pub s_bresp: u64,
    /// s_axi_control arready.
    pub s_arready: u64,
    /// s_axi_control rvalid.
    pub s_rvalid: u64,
    /// s_axi_control rdata.
    pub s_rdata: u64,
    /// s_axi_control rresp.
    pub s_rresp: u64,
    /// m_axi_gmem awvalid.
    pub m_awvalid: u64,
    /// m_axi_gmem awaddr.
    pub m_awaddr: u64,
    /// m_axi_gmem awlen.
    pub m_awlen: u64,
    /// m_axi_gmem wvalid.
    pub m_wvalid: u64,
    /// m_axi_gmem wdata.
    pub m_wdata: u64,
    /// m_axi_gmem wstrb.
    pub m_wstrb: u64,
    /// m_axi_gmem wlast.
    pub m_wlast: u64,
    /// m_axi_gmem bready.
    pub m_bready: u64,
    /// m_axi_gmem arvalid.
    pub m_arvalid: u64,
    /// m_axi_gmem araddr.
    pub m_araddr: u64,
    /// m_axi_gmem arlen.
    pub m_arlen: u64,
    /// m_axi_gmem rready.
    pub m_rready: u64,
    /// interrupt.
    pub interrupt: u64,
}

type NewFn = unsafe extern "C" fn(*const c_char) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type EvalFn = unsafe extern "C" fn(*mut c_void, *const PinsIn, *mut PinsOut);
type EdgeFn = unsafe extern "C" fn(*mut c_void);

/// The installed Verilator's version, or why it cannot be used.
pub fn verilator_version() -> Result<(u32, u32), SimError> {
    verilator_version_of("verilator")
}

/// The version of the Verilator at `bin`, or why it cannot be used.
pub fn verilator_version_of(bin: &str) -> Result<(u32, u32), SimError> {
    let out = Command::new(bin)
        .arg("--version")
        .output()
        .map_err(|e| SimError::Unavailable(format!("verilator not found ({e}); {INSTALL_HINT}")))?;
    let s = String::from_utf8_lossy(&out.stdout);
    // "Verilator 5.006 2023-01-22 rev ..."
    let v = s
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.split_once('.'))
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
        .ok_or_else(|| {
            SimError::Unavailable(format!(
                "cannot read the Verilator version from `{}`",
                s.trim()
            ))
        })?;
    if v < MIN_VERILATOR {
        return Err(SimError::Unavailable(format!(
            "Verilator {}.{:03} is older than 5.006; {INSTALL_HINT}",
            v.0, v.1
        )));
    }
    Ok(v)
}

/// Where built models are cached: `$TANDEM_SIM_CACHE`, else `$XDG_CACHE_HOME/tandem/sim`,
/// else `$HOME/.cache/tandem/sim`, else the temp folder.
pub fn cache_root() -> PathBuf {
    if let Some(p) = std::env::var_os("TANDEM_SIM_CACHE") {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(p).join("tandem").join("sim");
    }
    if let Some(p) = std::env::var_os("HOME") {
        return PathBuf::from(p).join(".cache").join("tandem").join("sim");
    }
    std::env::temp_dir().join("tandem-sim")
}

const VERILATOR_FLAGS: &[&str] = &[
    "--cc",
    "--build",
    "-O3",
    "--trace",
    "--x-assign",
    "fast",
    "--x-initial",
    "fast",
    "--prefix",
    "Vtop",
    "-Wno-fatal",
    "-Wno-lint",
    "-Wno-style",
    "-CFLAGS",
    "-fPIC -O2",
];

/// Builds (or finds in the cache) the shared library of the kernel `top` in `verilog`.
pub fn build(verilog: &Path, top: &str) -> Result<PathBuf, SimError> {
    let (maj, min) = verilator_version()?;
    let src = std::fs::read(verilog)
        .map_err(|e| SimError::Build(format!("{}: {e}", verilog.display())))?;
    let mut h = Sha256::new();
    h.update(&src);
    h.update(SHIM_CPP.as_bytes());
    h.update(top.as_bytes());
    h.update(VERILATOR_FLAGS.join(" ").as_bytes());
    h.update(format!("{maj}.{min}").as_bytes());
    let key: String = h
        .finalize()
        .iter()
        .take(12)
        .map(|b| format!("{b:02x}"))
        .collect();
    let dir = cache_root().join(format!("{top}-{key}"));
    let lib = dir.join("libtsim.so");
    if lib.exists() {
        return Ok(lib);
    }
    // One build at a time in this process; other processes build in their own folder.
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    if lib.exists() {
        return Ok(lib);
    }
    let tmp = cache_root().join(format!(".{top}-{key}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)
        .map_err(|e| SimError::Build(format!("{}: {e}", tmp.display())))?;
    let t0 = std::time::Instant::now();
    let run = |cmd: &mut Command, what: &str| -> Result<(), SimError> {
        let out = cmd
            .output()
            .map_err(|e| SimError::Build(format!("{what}: cannot run: {e}")))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let lines: Vec<&str> = err.lines().collect();
            return Err(SimError::Build(format!(
                "{what} failed:\n{}",
                lines[lines.len().saturating_sub(20)..].join("\n")
            )));
        }
        Ok(())
    };
    let vsrc = tmp.join("kernel.v");
    std::fs::write(&vsrc, &src).map_err(|e| SimError::Build(e.to_string()))?;
    let jobs = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4);
    run(
        Command::new("verilator")
            .args(VERILATOR_FLAGS)
            .args(["-j", &jobs.to_string(), "--top-module", top, "--Mdir"])
            .arg(tmp.join("obj"))
            .arg(&vsrc),
        "verilator",
    )?;
    let shim = tmp.join("shim.cpp");
    std::fs::write(&shim, SHIM_CPP).map_err(|e| SimError::Build(e.to_string()))?;
    let root = Command::new("verilator")
        .arg("--getenv")
        .arg("VERILATOR_ROOT")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|_| "/usr/share/verilator".into());
    let obj = tmp.join("obj");
    run(
        Command::new(std::env::var("CXX").unwrap_or_else(|_| "g++".into()))
            .args(["-shared", "-fPIC", "-O2", "-std=c++17"])
            .arg(format!("-I{}", obj.display()))
            .arg(format!("-I{root}/include"))
            .arg(format!("-I{root}/include/vltstd"))
            .arg(&shim)
            .arg(format!("{root}/include/verilated.cpp"))
            .arg(format!("{root}/include/verilated_vcd_c.cpp"))
            .arg(format!("{root}/include/verilated_threads.cpp"))
            .arg("-Wl,--whole-archive")
            .arg(obj.join("Vtop__ALL.a"))
            .arg("-Wl,--no-whole-archive")
            .args(["-pthread", "-lz", "-o"])
            .arg(tmp.join("libtsim.so")),
        "linking the shim",
    )?;
    let _ = std::fs::remove_dir_all(&obj);
    if std::fs::rename(&tmp, &dir).is_err() {
        // Another process built the same model first; use theirs.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    tracing::info!(top, dir = %dir.display(), secs = t0.elapsed().as_secs_f64(), "built Verilator model");
    if !lib.exists() {
        return Err(SimError::Build(format!(
            "{} missing after the build",
            lib.display()
        )));
    }
    Ok(lib)
}

/// A loaded model instance.
pub struct Model {
    handle: *mut c_void,
    free: FreeFn,
    eval: EvalFn,
    posedge: EdgeFn,
    _lib: libloading::Library,
}

// SAFETY: the Verilated model is only touched through `&mut self`, from one thread at a time.
unsafe impl Send for Model {}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Model")
    }
}

impl Model {
    /// Loads a built library and creates one model, tracing to `vcd` if given.
    pub fn load(lib: &Path, vcd: Option<&Path>) -> Result<Self, SimError> {
        let err = |e: libloading::Error| SimError::Build(format!("{}: {e}", lib.display()));
        // SAFETY: the library is one we built from shim.cpp; its symbols have these types.
        unsafe {
            let l = libloading::Library::new(lib).map_err(err)?;
            let new: NewFn = *l.get::<NewFn>(b"tsim_new\0").map_err(err)?;
            let free: FreeFn = *l.get::<FreeFn>(b"tsim_free\0").map_err(err)?;
            let eval: EvalFn = *l.get::<EvalFn>(b"tsim_eval\0").map_err(err)?;
            let posedge: EdgeFn = *l.get::<EdgeFn>(b"tsim_posedge\0").map_err(err)?;
            let path = vcd
                .map(|p| CString::new(p.display().to_string()))
                .transpose()
                .map_err(|e| SimError::Build(format!("vcd path: {e}")))?;
            let handle = new(path.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()));
            if handle.is_null() {
                return Err(SimError::Build("tsim_new returned null".into()));
            }
            Ok(Self {
                handle,
                free,
                eval,
                posedge,
                _lib: l,
            })
        }
    }

    /// Drives the inputs (clock low), settles, and returns the outputs.
    pub fn eval(&mut self, i: &PinsIn) -> PinsOut {
        let mut o = PinsOut::default();
        // SAFETY: handle is live; the structs match shim.cpp's layout (all u64).
        unsafe { (self.eval)(self.handle, i, &mut o) };
        o
    }

    /// Rising clock edge.
    pub fn posedge(&mut self) {
        // SAFETY: handle is live.
        unsafe { (self.posedge)(self.handle) };
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: handle came from tsim_new and is freed once.
        unsafe { (self.free)(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_verilator_is_unavailable_with_a_hint() {
        let e = verilator_version_of("verilator-that-is-not-installed").expect_err("missing");
        assert!(matches!(e, SimError::Unavailable(_)));
        assert!(e.to_string().contains("apt-get install verilator"), "{e}");
    }
}
