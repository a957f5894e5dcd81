//! Building an emitted kernel with Verilator, at first use, into the [`Toolchain`]'s cache
//! (keyed by a hash of the Verilog, the shim, the flags and the Verilator version); and
//! loading the result (a shared library behind a small C ABI, `shim.cpp`) with libloading. The
//! cache checks the library against the SHA-256 recorded at build time before [`build`]
//! returns it, so [`Model::load`] never maps a truncated or damaged file.

use std::ffi::{CString, c_char, c_void};
use std::path::{Path, PathBuf};

use crate::SimError;
use crate::verilator::{Toolchain, io, jobs, run};

/// The C++ shim compiled beside every model.
pub const SHIM_CPP: &str = include_str!("shim.cpp");

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
    /// m_axi_gmem rdata, the whole beat: 64 bits a word, word 0 first (a 64-bit bus reads
    /// word 0 only; up to 512 bits).
    pub m_rdata_w: [u64; 8],
    /// arready of the read-only `m_axi_gmem1` and `m_axi_gmem2` (a kernel with three
    /// masters; ignored otherwise).
    pub x_arready: [u64; 2],
    /// Their rvalid.
    pub x_rvalid: [u64; 2],
    /// Their rlast.
    pub x_rlast: [u64; 2],
    /// Their rresp.
    pub x_rresp: [u64; 2],
    /// Their rdata, 64 bits a word as `m_rdata_w`.
    pub x_rdata_w: [[u64; 8]; 2],
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
    /// m_axi_gmem wdata, the whole beat: 64 bits a word, word 0 first (`m_wdata` is word 0;
    /// up to 512 bits).
    pub m_wdata_w: [u64; 8],
    /// arvalid of the read-only `m_axi_gmem1` and `m_axi_gmem2` (0 on a one-master kernel).
    pub x_arvalid: [u64; 2],
    /// Their araddr.
    pub x_araddr: [u64; 2],
    /// Their arlen.
    pub x_arlen: [u64; 2],
    /// Their rready.
    pub x_rready: [u64; 2],
}

type NewFn = unsafe extern "C" fn(*const c_char) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type EvalFn = unsafe extern "C" fn(*mut c_void, *const PinsIn, *mut PinsOut);
type EdgeFn = unsafe extern "C" fn(*mut c_void);

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

/// Builds (or finds in the toolchain's cache) the shared library of the kernel `top` in
/// `verilog`, whose AXI4 masters number `axi_ports` ([`KernelDesc::axi_ports`]: more than one,
/// the shim wires the read-only `m_axi_gmem1` and `m_axi_gmem2` as well).
///
/// The cache key hashes the Verilog, not `axi_ports`: the masters are part of the Verilog's
/// top module (the emitted manifest that gives the count is written with it).
///
/// [`KernelDesc::axi_ports`]: tandem_fpga::regmap::KernelDesc::axi_ports
pub fn build(
    tc: &Toolchain,
    verilog: &Path,
    top: &str,
    axi_ports: u8,
) -> Result<PathBuf, SimError> {
    let src = std::fs::read(verilog).map_err(io(verilog))?;
    let flags = VERILATOR_FLAGS.join(" ");
    let inputs: [&[u8]; 4] = [&src, SHIM_CPP.as_bytes(), top.as_bytes(), flags.as_bytes()];
    let dir = tc.cached(top, &inputs, LIB, |tmp| {
        let vsrc = tmp.join("kernel.v");
        std::fs::write(&vsrc, &src).map_err(io(&vsrc))?;
        let obj = tmp.join("obj");
        run(
            tc.verilator()
                .args(VERILATOR_FLAGS)
                .args(["-j", &jobs(4).to_string(), "--top-module", top, "--Mdir"])
                .arg(&obj)
                .arg(&vsrc),
            "verilator",
        )?;
        let shim = tmp.join("shim.cpp");
        std::fs::write(&shim, SHIM_CPP).map_err(io(&shim))?;
        let root = tc.verilator_root();
        // a kernel with the read-only masters m_axi_gmem1/2 gets them wired in the shim
        let multi = axi_ports > 1;
        run(
            tc.cxx()
                .args(["-shared", "-fPIC", "-O2", "-std=c++17"])
                .args(multi.then_some("-DTSIM_MULTI"))
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
                .arg(tmp.join(LIB)),
            "linking the shim",
        )?;
        let _ = std::fs::remove_dir_all(&obj);
        Ok(())
    })?;
    Ok(dir.join(LIB))
}

/// The shared library of a built model.
const LIB: &str = "libtsim.so";

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
