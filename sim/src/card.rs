//! [`SimCard`]: a Verilator model of one kernel, its device memory, and the host's view of
//! it through the `FpgaDevice` trait.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tandem_fpga::core::KernelCore;
use tandem_fpga::device::SyncDir;
use tandem_fpga::emit::Manifest;
use tandem_fpga::regmap::{AP_DONE, AP_READY, AP_START, KernelDesc, REG_AP_CTRL};
use tandem_fpga::shell::ShellConfig;
use tandem_fpga::{DeviceBuffer, FpgaDevice, FpgaError, KernelBuild, RunStats};

use crate::SimError;
use crate::memory::{BankCounters, MemConfig, Memory};
use crate::model::{self, Model, PinsIn, PinsOut};
use crate::verilator::Toolchain;

/// How often a long simulation reports its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// A progress event of `task` (`start`, `update`, `finish`) with the cycles simulated so
/// far (`unit` `cycles`; empty for a build): the fields of `tandem::progress` (target `tandem::progress`; tandem's binary renders
/// them as a bar or a line), emitted by hand since this crate sits below tandem's.
pub(crate) fn progress(
    task: &str,
    event: &str,
    done: u64,
    unit: &str,
    elapsed: Duration,
    message: &str,
) {
    let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
    tracing::info!(
        target: "tandem::progress",
        task,
        event,
        done,
        total = 0u64,
        unit,
        elapsed_ms,
        "{message}"
    );
}

/// Options of a simulated card.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SimConfig {
    /// Memory latency and bandwidth.
    pub mem: MemConfig,
    /// Clock the projected device time is computed at, MHz; `None`: the loaded build's target
    /// clock (its manifest's `clock_mhz`).
    pub clock_mhz: Option<f64>,
    /// Write a VCD trace of every signal here.
    pub vcd: Option<PathBuf>,
    /// Verilator, the C++ compiler and the build cache.
    pub toolchain: Toolchain,
}

/// A simulated Alveo card with one kernel.
#[derive(Debug)]
pub struct SimCard {
    cfg: SimConfig,
    model: Option<Model>,
    desc: Option<KernelDesc>,
    /// Target clock of the loaded build, MHz.
    build_clock_mhz: Option<f64>,
    mem: Memory,
    pins: PinsIn,
    cycle: u64,
    run_start: Option<u64>,
    last_run: u64,
    pending_cor: u32,
    sim_wall: Duration,
}

impl SimCard {
    /// Opens a card (checks that Verilator is usable, or that the build cache holds prebuilt
    /// models); load a kernel next.
    pub fn open(cfg: SimConfig) -> Result<Self, SimError> {
        crate::available_with(&cfg.toolchain)?;
        Ok(Self {
            mem: Memory::new(cfg.mem),
            cfg,
            model: None,
            desc: None,
            build_clock_mhz: None,
            pins: PinsIn::default(),
            cycle: 0,
            run_start: None,
            last_run: 0,
            pending_cor: 0,
            sim_wall: Duration::ZERO,
        })
    }

    /// Memory configuration.
    pub fn mem_config(&self) -> MemConfig {
        self.mem.cfg
    }

    /// Changes memory latency/bandwidth (takes effect for new transactions).
    pub fn set_mem_config(&mut self, cfg: MemConfig) {
        self.mem.cfg = MemConfig {
            banks: self.mem.cfg.banks,
            bank_bytes: self.mem.cfg.bank_bytes,
            ..cfg
        };
    }

    /// Traffic of each bank (bytes read and written, cycles requests waited for their
    /// bank) since the card was opened or [`SimCard::reset_bank_counters`], bank 0 first.
    pub fn bank_counters(&self) -> Vec<BankCounters> {
        self.mem.bank_counters()
    }

    /// Zeroes the bank counters (to measure one launch).
    pub fn reset_bank_counters(&mut self) {
        self.mem.reset_bank_counters();
    }

    /// Read bursts the kernel issued on each AXI4 master (`m_axi_gmem`, `m_axi_gmem1`,
    /// `m_axi_gmem2`; the last two are 0 for a kernel with one master) since the card was
    /// opened or [`SimCard::reset_bank_counters`].
    pub fn port_read_bursts(&self) -> [u64; 3] {
        self.mem.port_read_bursts()
    }

    /// Wall-clock time spent simulating since the card was opened.
    pub fn sim_wall(&self) -> Duration {
        self.sim_wall
    }

    /// Holds `ap_rst_n` low for 4 cycles (in the middle of a run too) and drops in-flight
    /// memory transactions, as a board reset does. Memory contents are kept.
    pub fn reset(&mut self) -> Result<(), FpgaError> {
        self.pins = PinsIn::default();
        self.mem.reset_port();
        for _ in 0..4 {
            self.cycle()?;
        }
        self.pins.ap_rst_n = 1;
        self.pending_cor = 0;
        self.run_start = None;
        Ok(())
    }

    /// One clock cycle: memory drives its outputs, the model settles, handshakes are
    /// committed, rising edge. Returns the outputs as seen before the edge.
    fn cycle(&mut self) -> Result<PinsOut, FpgaError> {
        let Some(m) = self.model.as_mut() else {
            return Err(FpgaError::NotLoaded {
                device: "fpga-sim".into(),
            });
        };
        self.mem.drive(self.cycle, &mut self.pins);
        let o = m.eval(&self.pins);
        self.mem.commit(self.cycle, &self.pins, &o);
        m.posedge();
        self.cycle += 1;
        if let Some(f) = self.mem.fault.take() {
            return Err(FpgaError::Device {
                device: "fpga-sim".into(),
                msg: f,
            });
        }
        Ok(o)
    }

    fn axi_read(&mut self, offset: u32) -> Result<u32, FpgaError> {
        self.pins.s_arvalid = 1;
        self.pins.s_araddr = u64::from(offset);
        self.pins.s_rready = 1;
        for _ in 0..64 {
            let o = self.cycle()?;
            if self.pins.s_arvalid == 1 && o.s_arready == 1 {
                self.pins.s_arvalid = 0;
            }
            if o.s_rvalid == 1 {
                self.pins.s_rready = 0;
                return Ok(o.s_rdata as u32);
            }
        }
        Err(self.bus_hang("read", offset))
    }

    fn axi_write(&mut self, offset: u32, value: u32) -> Result<(), FpgaError> {
        self.pins.s_awvalid = 1;
        self.pins.s_awaddr = u64::from(offset);
        self.pins.s_wvalid = 1;
        self.pins.s_wdata = u64::from(value);
        self.pins.s_wstrb = 0xf;
        self.pins.s_bready = 1;
        for _ in 0..64 {
            let o = self.cycle()?;
            if self.pins.s_awvalid == 1 && o.s_awready == 1 {
                self.pins.s_awvalid = 0;
            }
            if self.pins.s_wvalid == 1 && o.s_wready == 1 {
                self.pins.s_wvalid = 0;
            }
            if o.s_bvalid == 1 {
                self.pins.s_bready = 0;
                return Ok(());
            }
        }
        Err(self.bus_hang("write", offset))
    }

    fn bus_hang(&self, what: &str, offset: u32) -> FpgaError {
        FpgaError::Device {
            device: "fpga-sim".into(),
            msg: format!("s_axi_control {what} at {offset:#x} got no response in 64 cycles"),
        }
    }

    /// Runs `n` idle cycles (no register traffic).
    pub fn idle(&mut self, n: u64) -> Result<(), FpgaError> {
        for _ in 0..n {
            self.cycle()?;
        }
        Ok(())
    }

    /// Current level of the `interrupt` pin.
    pub fn interrupt(&mut self) -> Result<bool, FpgaError> {
        let Some(m) = self.model.as_mut() else {
            return Err(FpgaError::NotLoaded {
                device: "fpga-sim".into(),
            });
        };
        Ok(m.eval(&self.pins).interrupt == 1)
    }
}

impl FpgaDevice for SimCard {
    fn name(&self) -> String {
        match &self.desc {
            Some(d) => format!("sim:{}", d.name),
            None => "sim".into(),
        }
    }

    fn load(&mut self, build: &KernelBuild) -> Result<(), FpgaError> {
        let KernelBuild::Simulated { dir, desc } = build else {
            return Err(FpgaError::Load {
                kernel: build.desc().name.clone(),
                msg: "the simulated card loads emitted Verilog, not an xclbin".into(),
            });
        };
        let load_err = |msg: String| FpgaError::Load {
            kernel: desc.name.clone(),
            msg,
        };
        let manifest = Manifest::read(dir).map_err(|e| load_err(e.to_string()))?;
        let v = dir.join(format!("{}.v", desc.name));
        let lib = model::build(
            &self.cfg.toolchain,
            &v,
            &desc.name,
            manifest.desc().axi_ports(),
        )
        .map_err(|e| load_err(e.to_string()))?;
        self.model = None;
        self.model = Some(Model::load(&lib, self.cfg.vcd.as_deref())?);
        self.desc = Some(desc.clone());
        self.build_clock_mhz = Some(manifest.clock_mhz);
        // the memory serves beats as wide as the kernel's m_axi_gmem data bus
        self.mem.beat_bytes = u64::from(manifest.data_bits / 8).clamp(8, 64);
        self.reset()
    }

    /// Emits `core` into the toolchain's cache folder and loads it.
    fn load_core(&mut self, core: &dyn KernelCore, shell: ShellConfig) -> Result<(), FpgaError> {
        let load_err = |msg: String| FpgaError::Load {
            kernel: core.name().to_string(),
            msg,
        };
        let (_, manifest) =
            tandem_fpga::emit::generate(core, shell).map_err(|e| load_err(e.to_string()))?;
        let dir = self.cfg.toolchain.cache_dir.join("emit").join(format!(
            "{}-{}",
            core.name(),
            &manifest.verilog_sha256[..16]
        ));
        let e = tandem_fpga::emit::emit(core, shell, &dir).map_err(|e| load_err(e.to_string()))?;
        self.load(&KernelBuild::Simulated {
            dir: e.dir,
            desc: e.desc,
        })
    }

    fn kernel(&self) -> Option<&KernelDesc> {
        self.desc.as_ref()
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
        let t0 = Instant::now();
        let mut v = self.axi_read(offset)?;
        if offset == REG_AP_CTRL {
            v |= self.pending_cor;
            self.pending_cor = 0;
        }
        self.sim_wall += t0.elapsed();
        Ok(v)
    }

    fn write_reg(&mut self, offset: u32, value: u32) -> Result<(), FpgaError> {
        let t0 = Instant::now();
        self.axi_write(offset, value)?;
        if offset == REG_AP_CTRL && value & AP_START != 0 {
            self.run_start = Some(self.cycle);
        }
        self.sim_wall += t0.elapsed();
        Ok(())
    }

    fn run_until_done(&mut self, timeout: Duration) -> Result<bool, FpgaError> {
        let t0 = Instant::now();
        let mut n = 0u64;
        // Progress of a long simulation: looked at where the timeout is (every 256 polls),
        // reported once the run has taken a second, then about once a second.
        let mut next_report = PROGRESS_EVERY;
        let task = format!("sim:{}", self.desc.as_ref().map_or("kernel", |d| &d.name));
        let what = format!("simulating the {} kernel", &task[4..]);
        let r = loop {
            // Poll AP_CTRL back to back; its clear-on-read bits are kept for the next
            // read_reg(AP_CTRL), as XRT's driver does.
            let v = self.axi_read(REG_AP_CTRL)?;
            self.pending_cor |= v & (AP_DONE | AP_READY);
            if v & AP_DONE != 0 {
                if let Some(s) = self.run_start.take() {
                    self.last_run = self.cycle - s;
                }
                break Ok(true);
            }
            n += 1;
            if n & 255 == 0 {
                let elapsed = t0.elapsed();
                if elapsed >= timeout {
                    break Ok(false);
                }
                if elapsed >= next_report {
                    let done = self.run_start.map_or(0, |s| self.cycle - s);
                    if next_report == PROGRESS_EVERY {
                        progress(&task, "start", done, "cycles", elapsed, &what);
                    }
                    progress(&task, "update", done, "cycles", elapsed, &what);
                    next_report = elapsed + PROGRESS_EVERY;
                }
            }
        };
        if next_report != PROGRESS_EVERY {
            progress(
                &task,
                "finish",
                self.last_run,
                "cycles",
                t0.elapsed(),
                &what,
            );
        }
        self.sim_wall += t0.elapsed();
        r
    }

    fn stats(&self) -> RunStats {
        RunStats {
            cycles: self.last_run,
            total_cycles: self.cycle,
            wall: self.sim_wall,
        }
    }

    fn clock_hz(&self) -> f64 {
        let mhz = self
            .cfg
            .clock_mhz
            .or(self.build_clock_mhz)
            .unwrap_or(tandem_fpga::DEFAULT_CLOCK_MHZ);
        mhz * 1e6
    }
}
