//! [`FpgaDevice`]: what the host needs from an FPGA card, simulated or real.
//!
//! `tandem_sim::SimCard` (Verilator) and the XRT driver implement it; the host's FPGA backend
//! cannot tell them apart. The control protocol helpers ([`FpgaDevice::set_arg`],
//! [`FpgaDevice::start`], [`FpgaDevice::wait`]) are written once here on top of register
//! reads and writes, so every device follows the same ap_ctrl_hs sequence.

use std::path::PathBuf;
use std::time::Duration;

use crate::core::KernelCore;
use crate::regmap::{AP_DONE, AP_IDLE, AP_START, ArgKind, KernelDesc, REG_AP_CTRL};
use crate::shell::ShellConfig;

/// Errors of an FPGA device.
#[derive(Debug, thiserror::Error)]
pub enum FpgaError {
    /// The device cannot be used here (no Verilator, no XRT, no board), with a hint.
    #[error("{device} is unavailable: {reason}")]
    Unavailable {
        /// Device.
        device: String,
        /// Why, with an install hint where there is one.
        reason: String,
    },
    /// Building or loading the kernel failed.
    #[error("loading {kernel}: {msg}")]
    Load {
        /// Kernel.
        kernel: String,
        /// What failed.
        msg: String,
    },
    /// No kernel is loaded.
    #[error("no kernel is loaded on {device}")]
    NotLoaded {
        /// Device.
        device: String,
    },
    /// A bank has no room for an allocation.
    #[error("bank {bank}: cannot allocate {bytes} bytes ({free} free)")]
    OutOfMemory {
        /// Memory bank.
        bank: u32,
        /// Requested.
        bytes: u64,
        /// Free in the bank.
        free: u64,
    },
    /// An access falls outside a buffer, a bank or the register space.
    #[error("out of range: {msg}")]
    OutOfRange {
        /// What was accessed.
        msg: String,
    },
    /// An argument name or value the kernel does not accept.
    #[error("kernel {kernel}: {msg}")]
    BadArgument {
        /// Kernel.
        kernel: String,
        /// What is wrong.
        msg: String,
    },
    /// The kernel did not finish within the timeout.
    #[error("kernel {kernel} did not finish within {timeout:?} ({cycles} cycles simulated)")]
    Timeout {
        /// Kernel.
        kernel: String,
        /// The timeout.
        timeout: Duration,
        /// Cycles run while waiting.
        cycles: u64,
    },
    /// The device or simulator failed.
    #[error("{device}: {msg}")]
    Device {
        /// Device.
        device: String,
        /// What failed.
        msg: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// What to load onto a card.
#[derive(Debug, Clone)]
pub enum KernelBuild {
    /// An emitted kernel folder (Verilog, kernel.xml, manifest), for the simulator.
    Simulated {
        /// The emitted folder (see [`crate::emit`]).
        dir: PathBuf,
        /// Its interface.
        desc: KernelDesc,
    },
    /// An xclbin for a real board.
    Xclbin {
        /// The xclbin file.
        path: PathBuf,
        /// The kernel's interface.
        desc: KernelDesc,
    },
}

impl KernelBuild {
    /// The interface of the kernel in this build.
    pub fn desc(&self) -> &KernelDesc {
        match self {
            KernelBuild::Simulated { desc, .. } | KernelBuild::Xclbin { desc, .. } => desc,
        }
    }
}

/// A buffer in device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceBuffer {
    /// Memory bank (HBM pseudo-channel or DDR bank).
    pub bank: u32,
    /// Device byte address (what a pointer argument gets).
    pub addr: u64,
    /// Size in bytes.
    pub len: u64,
}

/// Direction of a buffer sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncDir {
    /// Host memory to the device.
    ToDevice,
    /// Device memory to the host.
    FromDevice,
}

/// Counters of a device's clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Kernel clock cycles from ap_start to ap_done of the last run.
    pub cycles: u64,
    /// Kernel clock cycles since the device was opened.
    pub total_cycles: u64,
    /// Wall-clock time the device (or simulator) took for the last run.
    pub wall: Duration,
}

/// An FPGA card with one loaded kernel.
pub trait FpgaDevice: Send {
    /// Name of the card (`sim:router` or the board's name).
    fn name(&self) -> String;

    /// Loads a kernel build, replacing any loaded one.
    fn load(&mut self, build: &KernelBuild) -> Result<(), FpgaError>;

    /// Loads the build of `core` in `shell`, replacing any loaded one: the simulator emits
    /// and builds it (cached), a board finds its xclbin.
    fn load_core(&mut self, core: &dyn KernelCore, shell: ShellConfig) -> Result<(), FpgaError>;

    /// Interface of the loaded kernel.
    fn kernel(&self) -> Option<&KernelDesc>;

    /// Number of memory banks.
    fn banks(&self) -> u32;

    /// Allocates `bytes` in `bank`, aligned to 4 KiB.
    fn alloc(&mut self, bank: u32, bytes: u64) -> Result<DeviceBuffer, FpgaError>;

    /// Frees a buffer.
    fn free(&mut self, buf: DeviceBuffer) -> Result<(), FpgaError>;

    /// Writes host bytes into a buffer at `offset` (into the host-side shadow on a real
    /// board; call [`FpgaDevice::sync`] to move them).
    fn write(&mut self, buf: &DeviceBuffer, offset: u64, data: &[u8]) -> Result<(), FpgaError>;

    /// Reads bytes of a buffer at `offset` into `out`.
    fn read(&mut self, buf: &DeviceBuffer, offset: u64, out: &mut [u8]) -> Result<(), FpgaError>;

    /// Moves a buffer between host shadow and device memory (a no-op on the simulator,
    /// whose memory the host reads directly).
    fn sync(&mut self, buf: &DeviceBuffer, dir: SyncDir) -> Result<(), FpgaError>;

    /// Reads a 32-bit control register.
    fn read_reg(&mut self, offset: u32) -> Result<u32, FpgaError>;

    /// Writes a 32-bit control register.
    fn write_reg(&mut self, offset: u32, value: u32) -> Result<(), FpgaError>;

    /// Lets the device run for up to `timeout` (wall clock) or until the kernel raises
    /// ap_done. Returns whether ap_done was seen; a real board just polls.
    fn run_until_done(&mut self, timeout: Duration) -> Result<bool, FpgaError>;

    /// Clock counters; `cycles` is the last run's.
    fn stats(&self) -> RunStats;

    /// Kernel clock in Hz: the loaded build's clock (on the simulator its target clock, from
    /// the manifest, unless the card was opened with another), what device time is computed
    /// from.
    fn clock_hz(&self) -> f64;

    /// Sets a scalar argument by name.
    fn set_scalar(&mut self, name: &str, value: u32) -> Result<(), FpgaError> {
        let slot = self.arg_slot(name, ArgKind::Scalar)?;
        self.write_reg(slot, value)
    }

    /// Sets a pointer argument by name to a buffer's address.
    fn set_pointer(&mut self, name: &str, buf: &DeviceBuffer) -> Result<(), FpgaError> {
        let slot = self.arg_slot(name, ArgKind::Pointer)?;
        self.write_reg(slot, buf.addr as u32)?;
        self.write_reg(slot + 4, (buf.addr >> 32) as u32)
    }

    /// Register offset of argument `name`, checking its kind.
    fn arg_slot(&self, name: &str, kind: ArgKind) -> Result<u32, FpgaError> {
        let desc = self.kernel().ok_or_else(|| FpgaError::NotLoaded {
            device: self.name(),
        })?;
        let bad = |msg: String| FpgaError::BadArgument {
            kernel: desc.name.clone(),
            msg,
        };
        let slot = desc.slot(name).map_err(|e| bad(e.msg))?;
        if slot.arg.kind != kind {
            return Err(bad(format!(
                "`{name}` is a {:?}, not a {kind:?}",
                slot.arg.kind
            )));
        }
        Ok(slot.offset)
    }

    /// Starts the kernel: checks ap_idle, then sets ap_start.
    fn start(&mut self) -> Result<(), FpgaError> {
        let ctrl = self.read_reg(REG_AP_CTRL)?;
        if ctrl & AP_IDLE == 0 {
            return Err(FpgaError::Device {
                device: self.name(),
                msg: format!("start while the kernel is busy (AP_CTRL = {ctrl:#x})"),
            });
        }
        self.write_reg(REG_AP_CTRL, ctrl & !0x0f | AP_START)
    }

    /// Waits for ap_done (reading AP_CTRL, which clears it), at most `timeout`.
    fn wait(&mut self, timeout: Duration) -> Result<RunStats, FpgaError> {
        let t0 = std::time::Instant::now();
        let start_cycles = self.stats().total_cycles;
        loop {
            let left = timeout.saturating_sub(t0.elapsed());
            let seen = self.run_until_done(left)?;
            let ctrl = self.read_reg(REG_AP_CTRL)?;
            if ctrl & AP_DONE != 0 {
                let mut s = self.stats();
                s.wall = t0.elapsed();
                return Ok(s);
            }
            if !seen && t0.elapsed() >= timeout {
                return Err(FpgaError::Timeout {
                    kernel: self
                        .kernel()
                        .map(|k| k.name.clone())
                        .unwrap_or_else(|| "?".into()),
                    timeout,
                    cycles: self.stats().total_cycles - start_cycles,
                });
            }
        }
    }
}
