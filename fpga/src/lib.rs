//! FPGA kernels of tandem: rust-hdl pipelines wrapped in a Vitis RTL kernel shell, their
//! golden fixed-point models, the emitter and synthesis runner, and the [`FpgaDevice`] trait
//! that the Verilator-simulated card (crate `tandem-sim`) and the XRT driver implement.
//!
//! - [`regmap`]: a kernel's arguments, the register map and `kernel.xml`, from one description.
//! - [`core`]: the interface a kernel datapath (core) implements to plug into the shell.
//! - [`shell`]: the Vitis RTL kernel shell (AXI4-Lite control, AXI4 master bursts, interrupt).
//! - [`kernels`]: the cores (MoE router, GEMM, attention) and the kernel catalog.
//! - [`golden`]: bit-exact fixed-point models of the kernels in plain Rust.
//! - [`emit`], [`synth`]: Verilog + kernel.xml + manifest to a folder; yosys `synth_xilinx`.
//! - [`device`]: the [`FpgaDevice`] trait and its error type.
//! - [`xclbin`]: the xclbin reader and the manifest of built xclbins; [`platform`]: the
//!   Alveo platforms; [`flow`]: the commands that build an xclbin (package_xo, v++, vitis_hls).
//! - [`timing`]: the analytic cycle models of the kernels (the modelled card, the planner).
//! - [`drive`]: the host-side drivers of the kernels, written once over `&mut dyn FpgaDevice`
//!   (the simulated card and the XRT driver alike).
//! - [`xrt`]: the XRT driver: Alveo boards through XRT's C API, loaded at run time.

pub mod core;
pub mod device;
pub mod drive;
pub mod emit;
pub mod flow;
pub mod golden;
pub mod kernels;
pub mod platform;
pub mod regmap;
pub mod shell;
pub mod synth;
pub mod timing;
pub mod xclbin;
pub mod xrt;

/// Target clock of every build, MHz: what the pipelines are cut for, recorded in each emitted
/// manifest and read back by the device (`FpgaDevice::clock_hz`).
pub const DEFAULT_CLOCK_MHZ: f64 = 300.0;

pub use device::{DeviceBuffer, FpgaDevice, FpgaError, KernelBuild, RunStats};
