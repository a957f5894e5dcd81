//! Verilator simulation of tandem's FPGA kernels behind the `FpgaDevice` trait.
//!
//! [`SimCard`] is a simulated Alveo card: the emitted Verilog of a kernel is built with
//! Verilator at first use (cached by a hash of the Verilog, [`model`]), device memory banks
//! are served to the kernel's `m_axi_gmem` port with a configurable latency and bandwidth
//! ([`memory`]), the host reads and writes registers over `s_axi_control`, and the card counts
//! clock cycles. Where Verilator is missing, [`SimCard::open`] fails with
//! [`SimError::Unavailable`] carrying the reason and an install hint; nothing else breaks.

pub mod card;
pub mod memory;
pub mod model;
pub mod run;

pub use card::{SimCard, SimConfig};
pub use memory::MemConfig;

/// Errors of the simulator.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// Verilator (or a C++ compiler) is missing or too old.
    #[error("simulated FPGA card unavailable: {0}")]
    Unavailable(String),
    /// Building or loading the model failed.
    #[error("building the Verilator model: {0}")]
    Build(String),
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
        }
    }
}

/// Whether the simulator can run here: `Ok(version)` or why not (with an install hint).
pub fn available() -> Result<String, SimError> {
    model::verilator_version().map(|(a, b)| format!("Verilator {a}.{b:03}"))
}
