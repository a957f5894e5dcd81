//! [`ModelCard`]: a simulated card that computes each kernel run with the golden models (the
//! same bits as the RTL) and counts its cycles with the analytic models of
//! `tandem_fpga::timing` instead of simulating the RTL cycle by cycle. It speaks the same
//! `FpgaDevice` protocol as [`crate::SimCard`] (registers by name, ap_ctrl_hs, buffers in
//! banks), so the drivers of `tandem_fpga::drive` and the host backend cannot tell them apart,
//! and a shape that no build takes is refused by the same checks with the same message.
//!
//! A run reads its inputs from device memory in the layouts the RTL reads, and writes its
//! outputs where the RTL writes them; arguments the RTL would refuse (`args_ok` low) finish
//! at once without touching memory, as on the RTL. Device time is the modelled cycles at the
//! clock; the wall time is what the golden models took on the host.

mod attention;
mod attn_fast;
mod gemm;
mod router;
mod sums;
mod vecops;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tandem_fpga::core::KernelCore;
use tandem_fpga::device::SyncDir;
use tandem_fpga::emit::Manifest;
use tandem_fpga::kernels::{Build, core_for};
use tandem_fpga::regmap::{AP_DONE, AP_IDLE, AP_READY, AP_START, KernelDesc, REG_AP_CTRL};
use tandem_fpga::shell::ShellConfig;
use tandem_fpga::timing::MemTiming;
use tandem_fpga::{DEFAULT_CLOCK_MHZ, DeviceBuffer, FpgaDevice, FpgaError, KernelBuild, RunStats};

use crate::memory::{MemConfig, Memory};

/// Options of a modelled card.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelConfig {
    /// Memory banks, latency and bandwidth (the cycle models use the latency and bandwidth).
    pub mem: MemConfig,
    /// Clock the device time is computed at, MHz (default: `DEFAULT_CLOCK_MHZ`).
    pub clock_mhz: Option<f64>,
}

/// A card whose kernel runs are computed by the golden models and timed by the cycle models.
#[derive(Debug)]
pub struct ModelCard {
    cfg: ModelConfig,
    mem: Memory,
    build: Option<(Build, KernelDesc)>,
    regs: BTreeMap<u32, u32>,
    /// ap_done / ap_ready of a finished run, cleared when AP_CTRL is read.
    pending: u32,
    last_run: u64,
    total_cycles: u64,
    wall: Duration,
    /// The GEMM's buffers, kept between launches.
    scratch: sums::Scratch,
}

impl ModelCard {
    /// A card with nothing loaded.
    pub fn open(cfg: ModelConfig) -> Self {
        Self {
            mem: Memory::new(cfg.mem),
            cfg,
            build: None,
            regs: BTreeMap::new(),
            pending: 0,
            last_run: 0,
            total_cycles: 0,
            wall: Duration::ZERO,
            scratch: sums::Scratch::default(),
        }
    }

    fn timing(&self) -> MemTiming {
        MemTiming {
            read_latency: self.cfg.mem.read_latency,
            write_latency: self.cfg.mem.write_latency,
            // one stream with its bank to itself: the slower of the port and the bank
            bytes_per_cycle: self.cfg.mem.stream_bytes_per_cycle(),
            bank_bytes_per_cycle: self.cfg.mem.bank_bytes_per_cycle,
        }
    }

    /// The card's name (for errors).
    fn name_of(&self) -> String {
        self.name()
    }

    /// Scalar argument `name` of the loaded kernel.
    fn scalar(&self, desc: &KernelDesc, name: &str) -> Result<u32, FpgaError> {
        let slot = desc.slot(name).map_err(|e| FpgaError::BadArgument {
            kernel: desc.name.clone(),
            msg: e.msg,
        })?;
        Ok(self.regs.get(&slot.offset).copied().unwrap_or(0))
    }

    /// Pointer argument `name` of the loaded kernel (a device byte address).
    fn pointer(&self, desc: &KernelDesc, name: &str) -> Result<u64, FpgaError> {
        let slot = desc.slot(name).map_err(|e| FpgaError::BadArgument {
            kernel: desc.name.clone(),
            msg: e.msg,
        })?;
        let lo = self.regs.get(&slot.offset).copied().unwrap_or(0);
        let hi = self.regs.get(&(slot.offset + 4)).copied().unwrap_or(0);
        Ok(u64::from(hi) << 32 | u64::from(lo))
    }

    /// Reads `len` bytes of device memory at `addr`, as the kernel's read port would.
    fn fetch(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, FpgaError> {
        let dev = self.name_of();
        Ok(self
            .mem
            .bytes_mut(addr, len as u64)
            .ok_or_else(|| FpgaError::Device {
                device: dev,
                msg: format!("kernel read outside device memory at {addr:#x} ({len} bytes)"),
            })?
            .to_vec())
    }

    /// `len` bytes of device memory at `addr`, read in place (as [`ModelCard::fetch`], no
    /// copy).
    fn view(&mut self, addr: u64, len: usize) -> Result<&[u8], FpgaError> {
        let dev = self.name_of();
        self.mem
            .bytes_mut(addr, len as u64)
            .map(|b| &*b)
            .ok_or_else(|| FpgaError::Device {
                device: dev,
                msg: format!("kernel read outside device memory at {addr:#x} ({len} bytes)"),
            })
    }

    /// [`ModelCard::fetch`] into `out` (resized to `len`; its capacity kept between runs).
    fn fetch_into(&mut self, addr: u64, len: usize, out: &mut Vec<u8>) -> Result<(), FpgaError> {
        let src = self.view(addr, len)?;
        out.clear();
        out.extend_from_slice(src);
        Ok(())
    }

    /// `len` bytes of device memory at `addr` to write in place, as the kernel's write port
    /// would ([`ModelCard::store`] without a staging buffer).
    fn view_mut(&mut self, addr: u64, len: usize) -> Result<&mut [u8], FpgaError> {
        let dev = self.name_of();
        self.mem
            .bytes_mut(addr, len as u64)
            .ok_or_else(|| FpgaError::Device {
                device: dev,
                msg: format!("kernel write outside device memory at {addr:#x} ({len} bytes)"),
            })
    }

    /// Writes bytes to device memory at `addr`, as the kernel's write port would.
    fn store(&mut self, addr: u64, data: &[u8]) -> Result<(), FpgaError> {
        let dev = self.name_of();
        self.mem
            .bytes_mut(addr, data.len() as u64)
            .ok_or_else(|| FpgaError::Device {
                device: dev,
                msg: format!(
                    "kernel write outside device memory at {addr:#x} ({} bytes)",
                    data.len()
                ),
            })?
            .copy_from_slice(data);
        Ok(())
    }

    /// One run of the loaded kernel on the argument registers: returns its cycles.
    fn execute(&mut self) -> Result<u64, FpgaError> {
        let Some((build, desc)) = self.build.clone() else {
            return Err(FpgaError::NotLoaded {
                device: self.name_of(),
            });
        };
        let t = self.timing();
        match build {
            Build::Router(c) => router::run(self, &c, &desc, &t),
            Build::Gemm(c) => gemm::run(self, &c, &desc, &t),
            Build::Attention(c) => attention::run(self, &c, &desc, &t),
            Build::Vecops(c) => vecops::run(self, &c, &desc, &t),
        }
    }
}

impl FpgaDevice for ModelCard {
    fn name(&self) -> String {
        match &self.build {
            Some((_, d)) => format!("model:{}", d.name),
            None => "model".into(),
        }
    }

    fn load(&mut self, build: &KernelBuild) -> Result<(), FpgaError> {
        let KernelBuild::Simulated { dir, desc } = build else {
            return Err(FpgaError::Load {
                kernel: build.desc().name.clone(),
                msg: "the modelled card loads an emitted kernel's manifest, not an xclbin".into(),
            });
        };
        let load_err = |msg: String| FpgaError::Load {
            kernel: desc.name.clone(),
            msg,
        };
        let m = Manifest::read(dir).map_err(|e| load_err(e.to_string()))?;
        let core = core_for(&m.kernel, &m.params).map_err(|e| load_err(e.to_string()))?;
        self.load_core(core.as_ref(), ShellConfig::default())
    }

    fn load_core(&mut self, core: &dyn KernelCore, _shell: ShellConfig) -> Result<(), FpgaError> {
        let b = Build::of(core).map_err(|e| FpgaError::Load {
            kernel: core.name().into(),
            msg: e.to_string(),
        })?;
        self.build = Some((b, core.desc()));
        self.regs.clear();
        self.pending = 0;
        Ok(())
    }

    fn kernel(&self) -> Option<&KernelDesc> {
        self.build.as_ref().map(|(_, d)| d)
    }

    fn banks(&self) -> u32 {
        self.mem.cfg.banks
    }

    fn alloc(&mut self, bank: u32, bytes: u64) -> Result<DeviceBuffer, FpgaError> {
        self.mem.alloc(bank, bytes)
    }

    fn free(&mut self, buf: DeviceBuffer) -> Result<(), FpgaError> {
        self.mem.free(buf);
        Ok(())
    }

    fn write(&mut self, buf: &DeviceBuffer, offset: u64, data: &[u8]) -> Result<(), FpgaError> {
        self.mem
            .buffer_bytes(buf, offset, data.len(), "write")?
            .copy_from_slice(data);
        Ok(())
    }

    fn read(&mut self, buf: &DeviceBuffer, offset: u64, out: &mut [u8]) -> Result<(), FpgaError> {
        out.copy_from_slice(self.mem.buffer_bytes(buf, offset, out.len(), "read")?);
        Ok(())
    }

    fn sync(&mut self, _buf: &DeviceBuffer, _dir: SyncDir) -> Result<(), FpgaError> {
        Ok(())
    }

    fn read_reg(&mut self, offset: u32) -> Result<u32, FpgaError> {
        if offset == REG_AP_CTRL {
            // Runs finish inside the write that starts them: the kernel is always idle.
            let v = AP_IDLE | self.pending | self.regs.get(&offset).copied().unwrap_or(0) & 0x80;
            self.pending = 0;
            return Ok(v);
        }
        Ok(self.regs.get(&offset).copied().unwrap_or(0))
    }

    fn write_reg(&mut self, offset: u32, value: u32) -> Result<(), FpgaError> {
        if offset >= 0x1000 || !offset.is_multiple_of(4) {
            return Err(FpgaError::OutOfRange {
                msg: format!("register {offset:#x}"),
            });
        }
        let kept = if offset == REG_AP_CTRL {
            value & !AP_START
        } else {
            value
        };
        self.regs.insert(offset, kept);
        if offset == REG_AP_CTRL && value & AP_START != 0 {
            let t0 = Instant::now();
            let cycles = self.execute()?;
            self.wall += t0.elapsed();
            self.last_run = cycles;
            self.total_cycles += cycles;
            self.pending = AP_DONE | AP_READY;
        }
        Ok(())
    }

    fn run_until_done(&mut self, _timeout: Duration) -> Result<bool, FpgaError> {
        Ok(self.pending & AP_DONE != 0)
    }

    fn stats(&self) -> RunStats {
        RunStats {
            cycles: self.last_run,
            total_cycles: self.total_cycles,
            wall: self.wall,
        }
    }

    fn clock_hz(&self) -> f64 {
        self.cfg.clock_mhz.unwrap_or(DEFAULT_CLOCK_MHZ) * 1e6
    }
}
