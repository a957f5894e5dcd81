//! The Vitis RTL kernel shell: what XRT expects around a kernel core.
//!
//! - `ap_clk`, `ap_rst_n` (active-low, synchronous);
//! - AXI4-Lite slave `s_axi_control` (12-bit addresses) with the ap_ctrl_hs map of
//!   [`crate::regmap`] and the kernel's argument registers ([`ctrl::ControlRegs`]);
//! - AXI4 master `m_axi_gmem` (64-bit addresses, data as wide as the core's data ports:
//!   [`KernelCore::data_bits`], 64 by default, 128/256/512 accepted; INCR bursts of at most
//!   `max_burst` beats that never cross a `max_burst * data_bits / 8`-byte boundary): a read engine
//!   ([`axi_read::ReadMaster`]) and a write engine ([`axi_write::WriteMaster`]) that also
//!   waits for every B response before the shell raises ap_done;
//! - for a kernel whose arguments use three masters ([`crate::regmap::KernelDesc::axi_ports`]),
//!   the read-only `m_axi_gmem1` and `m_axi_gmem2` as well, each with its own read engine,
//!   behind a fan-out ([`read_fanout::ReadFanout`]) that routes the core's read requests by the
//!   master named in address bits 63:62 and hands their words back in request order
//!   ([`top::VitisShellMulti`]);
//! - `interrupt`, level, = GIE && (ISR & IER) != 0.
//!
//! The blocks are rust-hdl `LogicBlock`s wired together in rust-hdl ([`top::VitisShell`]).
//! The leaf blocks whose structure depends on build parameters (the register decode of a
//! kernel's arguments, the burst engines) produce their Verilog body from Rust
//! (`Verilog::Custom`): rust-hdl 0.46 has no AXI widgets and its `hdl_gen` cannot unroll
//! parameter-dependent structure. The core sits in a rust-hdl black box ([`socket::CoreSocket`]).

pub mod axi_read;
pub mod axi_write;
pub mod ctrl;
pub mod read_fanout;
pub mod socket;
pub mod top;

use rust_hdl::prelude::*;

use crate::core::{CoreError, KernelCore};

/// Shell build options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShellConfig {
    /// Longest AXI burst in beats (a power of two, 2..=256).
    pub max_burst: u32,
}

impl Default for ShellConfig {
    fn default() -> Self {
        Self { max_burst: 64 }
    }
}

/// Errors while generating a kernel's Verilog.
#[derive(Debug, thiserror::Error)]
pub enum ShellError {
    /// The core could not be generated.
    #[error(transparent)]
    Core(#[from] CoreError),
    /// The kernel's argument description is unusable.
    #[error(transparent)]
    Desc(#[from] crate::regmap::DescError),
    /// A shell option is out of range.
    #[error("shell: {0}")]
    Config(String),
    /// rust-hdl's checks failed on the shell.
    #[error("shell of {kernel}: rust-hdl check failed: {msg}")]
    Check {
        /// Kernel.
        kernel: String,
        /// rust-hdl's message.
        msg: String,
    },
}

/// The complete Verilog of a kernel: the top module `<name>` with Vitis port names, its
/// shell submodules (`<name>$ctrl`, `<name>$rd`, `<name>$wr`) and the core `<name>_core`.
pub fn kernel_verilog(core: &dyn KernelCore, cfg: ShellConfig) -> Result<String, ShellError> {
    if !(2..=256).contains(&cfg.max_burst) || !cfg.max_burst.is_power_of_two() {
        return Err(ShellError::Config(format!(
            "max_burst = {} must be a power of two in 2..=256",
            cfg.max_burst
        )));
    }
    let bits = core.data_bits();
    if !crate::core::DATA_BITS.contains(&bits) {
        return Err(ShellError::Config(format!(
            "kernel {}: data width {bits} bits is not one of {:?}",
            core.name(),
            crate::core::DATA_BITS
        )));
    }
    if u64::from(cfg.max_burst) * u64::from(bits / 8) > 4096 {
        return Err(ShellError::Config(format!(
            "max_burst = {} beats of {} bytes would cross 4 KiB boundaries (at most {} at {bits} bits)",
            cfg.max_burst,
            bits / 8,
            4096 / (bits / 8)
        )));
    }
    let ports = core.desc().axi_ports();
    if ports != 1 && ports != 3 {
        return Err(ShellError::Config(format!(
            "kernel {}: {ports} AXI4 masters; the shell builds one (m_axi_gmem) or three \
             (m_axi_gmem, m_axi_gmem1, m_axi_gmem2)",
            core.name()
        )));
    }
    let multi = ports == 3;
    match bits {
        128 => shell_verilog::<128, 16>(core, cfg, multi),
        256 => shell_verilog::<256, 32>(core, cfg, multi),
        512 => shell_verilog::<512, 64>(core, cfg, multi),
        _ => shell_verilog::<64, 8>(core, cfg, multi),
    }
}

/// The shell of `W`-bit data (`S = W / 8` strobes) around `core`; `multi`: three masters.
fn shell_verilog<const W: usize, const S: usize>(
    core: &dyn KernelCore,
    cfg: ShellConfig,
    multi: bool,
) -> Result<String, ShellError> {
    let name = core.name().to_string();
    let desc = core.desc();
    let ctrl = ctrl::ControlRegs::new(&desc)?;
    let code = core.core_verilog()?;
    crate::core::check_core_ports_w(&code, &format!("{name}_core"), W)?;
    let socket = socket::CoreSocket::<W, S>::new(&format!("{name}_core"), code);
    let v = if multi {
        checked_verilog(
            &name,
            top::VitisShellMulti::<W, S>::new(ctrl, socket, cfg.max_burst),
        )?
    } else {
        checked_verilog(
            &name,
            top::VitisShell::<W, S>::new(ctrl, socket, cfg.max_burst),
        )?
    };
    let v = crate::core::rename_top(&v, &name);
    Ok(format!(
        "// Generated by tandem-fpga from the Rust description of kernel `{name}`; do not edit.\n\
         `timescale 1ns/1ps\n{v}\n"
    ))
}

/// rust-hdl's checks on a wired shell, then its Verilog.
fn checked_verilog<B: Block>(kernel: &str, mut shell: B) -> Result<String, ShellError> {
    shell.connect_all();
    check_all(&shell).map_err(|e| ShellError::Check {
        kernel: kernel.to_string(),
        msg: format!("{e:?}"),
    })?;
    Ok(generate_verilog_unchecked(&shell))
}
