//! Verilator simulation of tandem's FPGA kernels behind the `FpgaDevice` trait.
//!
//! [`SimCard`] is a simulated Alveo card: the emitted Verilog of a kernel is built with
//! Verilator at first use (cached by a hash of the Verilog, [`model`]), device memory banks
//! are served to the kernel's `m_axi_gmem` port with a configurable latency and bandwidth
//! ([`memory`]), the host reads and writes registers over `s_axi_control`, and the card counts
//! clock cycles. Where Verilator is missing, [`SimCard::open`] fails with
//! [`SimError::Unavailable`] carrying the reason and an install hint; nothing else breaks.
//! The kernels are driven by `tandem_fpga::drive`, as on a board.
//!
//! [`core_sim`] runs a bare kernel core (no shell) in a C++ testbench, for bit-exact core
//! tests. Both go through one [`Toolchain`] ([`verilator`]): the Verilator check, the C++
//! compiler and the build cache, which the host passes in (this crate reads no environment).
//!
//! [`icarus`] runs an emitted kernel in Icarus Verilog, a 4-state simulator, inside a
//! hand-written AXI testbench with random stalls and protocol checks ([`IcarusCard`], also an
//! `FpgaDevice`): the tests use it so that X-propagation (which Verilator's 2-state model
//! hides) cannot creep into the kernels.

pub mod card;
pub mod core_sim;
pub mod icarus;
pub mod memory;
pub mod model;
pub mod modelled;
pub mod verilator;

pub use card::{SimCard, SimConfig};
pub use icarus::{IcarusCard, IcarusConfig};
pub use memory::{BankCounters, MemConfig};
pub use modelled::{ModelCard, ModelConfig};
pub use verilator::Toolchain;

/// Errors of the simulator.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// Verilator, Icarus Verilog or a C++ compiler is missing or too old.
    #[error("simulated FPGA card unavailable: {0}")]
    Unavailable(String),
    /// Building or loading the model failed.
    #[error("building the Verilator model: {0}")]
    Build(String),
    /// Running a built harness failed or its output was not understood.
    #[error("core simulation failed: {0}")]
    Run(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl From<SimError> for tandem_fpga::FpgaError {
    fn from(e: SimError) -> Self {
        match e {
            SimError::Unavailable(reason) => tandem_fpga::FpgaError::Unavailable {
                device: "fpga-sim".into(),
                reason,
            },
            SimError::Build(msg) => tandem_fpga::FpgaError::Load {
                kernel: "?".into(),
                msg,
            },
            SimError::Run(msg) => tandem_fpga::FpgaError::Device {
                device: "fpga-sim".into(),
                msg,
            },
            SimError::Io { path, source } => tandem_fpga::FpgaError::Io { path, source },
        }
    }
}

/// Whether the simulator can run here: `Ok(version)` or why not (with an install hint).
pub fn available() -> Result<String, SimError> {
    verilator::version().map(|(a, b)| format!("Verilator {a}.{b:03}"))
}

/// Whether the simulator can run here with the build cache of `tc`: Verilator installed, or
/// (where it is not) models prebuilt elsewhere and carried in the cache folder, which run
/// without it (`Ok` then says so); otherwise why not.
pub fn available_with(tc: &Toolchain) -> Result<String, SimError> {
    match available() {
        Ok(v) => Ok(v),
        Err(missing) => match tc.prebuilt_count() {
            0 => Err(missing),
            n => Ok(format!(
                "{n} prebuilt Verilator model(s) in {} (Verilator not installed: kernels built \
                 elsewhere run, others cannot be built)",
                tc.cache_dir.display()
            )),
        },
    }
}
