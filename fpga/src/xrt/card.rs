//! [`XrtCard`]: an Alveo board through XRT as an [`FpgaDevice`], so the drivers in
//! [`crate::drive`] run on it exactly as on the simulated card.
//!
//! **How runs are driven.** The trait speaks ap_ctrl_hs registers; XRT 2.13 lets a process
//! touch a kernel's registers (`xrtKernelReadRegister`/`WriteRegister`) only with the kernel
//! opened for exclusive access, and never in software emulation. So the card keeps the
//! argument registers as a host-side shadow and turns the protocol into XRT runs: writing
//! ap_start opens a run with every argument from the shadow (pointers as the buffer objects
//! at those addresses, checked against the bank each argument is connected to) and starts
//! it through XRT's scheduler; reading AP_CTRL asks the run's state (busy: 0; finished:
//! ap_done | ap_idle, once; then ap_idle). This works with shared access, beside other
//! processes, on a board and in emulation alike.
//!
//! **Banks.** `alloc(bank, ..)` takes the card's bank `b` as the `b`-th distinct memory group
//! (MEM_TOPOLOGY index) the loaded kernel's pointer arguments are connected to, in order of
//! group index: bank 0 is the only one when the xclbin was linked with every `m_axi_gmem` port
//! on one bank, as the drivers (which allocate in bank 0) need.
//!
//! **Time.** A board has no cycle counter tandem can read: `RunStats::cycles` is the run's wall
//! time (xrtRunStart until XRT reported it done) times the kernel clock, so device time =
//! cycles / clock = that wall time, an upper bound that includes XRT's scheduling and PCIe
//! latency.
//!
//! **Timeouts.** A run that does not finish in time is abandoned (XRT 2.13's C API cannot
//! abort one, see [`super::run`]); the card then refuses further work with a message saying to
//! reset the board.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::bo::XrtBo;
use super::device::{BoardId, XrtDevice};
use super::kernel::XrtKernel;
use super::loader::Xrt;
use super::run::{RunState, XrtRun, state_name};
use super::xclbin_handle::{Uuid, XrtXclbin};
use crate::core::KernelCore;
use crate::device::{DeviceBuffer, FpgaDevice, FpgaError, KernelBuild, RunStats, SyncDir};
use crate::regmap::{
    AP_DONE, AP_IDLE, AP_READY, AP_START, AUTO_RESTART, ArgKind, ArgSlot, KernelDesc, REG_AP_CTRL,
    REG_GIE, REG_IER, REG_ISR,
};
use crate::shell::ShellConfig;

/// Options of a board card.
#[derive(Debug, Clone, PartialEq)]
pub struct XrtCardConfig {
    /// Which board.
    pub board: BoardId,
    /// Kernel clock in MHz; `None`: [`crate::DEFAULT_CLOCK_MHZ`] (until the xclbin's
    /// CLOCK_FREQ_TOPOLOGY or its manifest entry is read here).
    pub clock_mhz: Option<f64>,
    /// Folder of xclbins named by kernel (`<kernel>.xclbin`), where `load_core` looks.
    pub xclbin_dir: Option<PathBuf>,
}

/// The kernel loaded on the card.
#[derive(Debug)]
struct Loaded {
    kernel: XrtKernel,
    desc: KernelDesc,
    slots: Vec<ArgSlot>,
    /// Memory group of each argument (pointers only).
    arg_groups: Vec<Option<u32>>,
    /// The distinct groups of the pointer arguments, ascending: bank `b` is `banks[b]`.
    banks: Vec<u32>,
    uuid: Uuid,
}

/// An Alveo board with one loaded kernel.
#[derive(Debug)]
pub struct XrtCard {
    // Field order is drop order: runs and buffers before the kernel, the kernel before the
    // xclbin, everything before the device.
    run: Option<XrtRun>,
    bos: BTreeMap<u64, XrtBo>,
    loaded: Option<Loaded>,
    xclbin: Option<XrtXclbin>,
    device: XrtDevice,
    cfg: XrtCardConfig,
    /// Argument and interrupt registers as last written.
    shadow: BTreeMap<u32, u32>,
    /// Why the card takes no more work (an abandoned run).
    wedged: Option<String>,
    last: RunStats,
}

impl XrtCard {
    /// Opens the board of `cfg` with the loaded library.
    pub fn open(xrt: Arc<Xrt>, cfg: XrtCardConfig) -> Result<Self, FpgaError> {
        let device = XrtDevice::open(xrt, &cfg.board)?;
        Ok(Self {
            run: None,
            bos: BTreeMap::new(),
            loaded: None,
            xclbin: None,
            device,
            cfg,
            shadow: BTreeMap::new(),
            wedged: None,
            last: RunStats::default(),
        })
    }

    /// The uuid of the xclbin this card loaded.
    pub fn xclbin_uuid(&self) -> Option<Uuid> {
        self.loaded.as_ref().map(|l| l.uuid)
    }

    /// The platform the loaded xclbin was linked for.
    pub fn platform(&self) -> Option<String> {
        self.xclbin.as_ref().and_then(|x| x.platform().ok())
    }

    /// The xclbin of `core`: the entry of a `manifest.toml` in the xclbin folder (what
    /// `tandem fpga package` writes into bitstreams/) whose kernels include it, checked against
    /// the file (hash, platform, kernels, clock) before XRT sees it; else
    /// `<xclbin_dir>/<kernel>.xclbin`.
    pub fn find_xclbin(&self, core: &dyn KernelCore) -> Result<PathBuf, FpgaError> {
        let name = core.name();
        let load_err = |msg: String| FpgaError::Load {
            kernel: name.into(),
            msg,
        };
        let Some(dir) = &self.cfg.xclbin_dir else {
            return Err(load_err(
                "no xclbin folder is configured: set TANDEM_XCLBIN_DIR to the folder of the \
                 xclbins and their manifest.toml (bitstreams/, filled by `tandem fpga package`)"
                    .into(),
            ));
        };
        let manifest = dir.join("manifest.toml");
        if manifest.is_file() {
            let m = crate::xclbin::manifest::BitstreamManifest::load(&manifest)
                .map_err(|e| load_err(e.to_string()))?;
            if let Some(entry) = m
                .entries
                .iter()
                .find(|e| e.kernels.iter().any(|k| k == name))
            {
                let path = entry.file_in(dir);
                crate::xclbin::check_against_manifest(&path, entry)
                    .map_err(|e| load_err(e.to_string()))?;
                return Ok(path);
            }
        }
        let path = dir.join(format!("{name}.xclbin"));
        if !path.is_file() {
            return Err(load_err(format!(
                "no xclbin for kernel `{name}`: no entry in {} and no {} (build it with `tandem \
                 fpga package --kernel {name}`)",
                manifest.display(),
                path.display()
            )));
        }
        Ok(path)
    }

    fn loaded(&self) -> Result<&Loaded, FpgaError> {
        self.loaded.as_ref().ok_or_else(|| FpgaError::NotLoaded {
            device: self.device.name().into(),
        })
    }

    fn usable(&self) -> Result<(), FpgaError> {
        match &self.wedged {
            Some(why) => Err(FpgaError::Device {
                device: self.device.name().into(),
                msg: why.clone(),
            }),
            None => Ok(()),
        }
    }

    fn bo(&mut self, buf: &DeviceBuffer) -> Result<&mut XrtBo, FpgaError> {
        self.bos
            .get_mut(&buf.addr)
            .ok_or_else(|| FpgaError::OutOfRange {
                msg: format!("no buffer of this card at {:#x}", buf.addr),
            })
    }

    /// Opens a run with the shadowed arguments and starts it.
    fn start_run(&mut self) -> Result<(), FpgaError> {
        self.usable()?;
        if self.run.is_some() {
            return Err(FpgaError::Device {
                device: self.device.name().into(),
                msg: "ap_start while a run is in flight".into(),
            });
        }
        let l = self.loaded()?;
        let bad = |msg: String| FpgaError::BadArgument {
            kernel: l.desc.name.clone(),
            msg,
        };
        let mut run = XrtRun::open(&l.kernel)?;
        for s in &l.slots {
            let lo = self.shadow.get(&s.offset).copied().unwrap_or(0);
            match s.arg.kind {
                ArgKind::Scalar => run.set_scalar(s.index, lo)?,
                ArgKind::Pointer => {
                    let hi = self.shadow.get(&(s.offset + 4)).copied().unwrap_or(0);
                    let addr = u64::from(lo) | u64::from(hi) << 32;
                    let bo = self.bos.get(&addr).ok_or_else(|| {
                        bad(format!(
                            "pointer argument `{}` = {addr:#x} is not a buffer allocated on this card",
                            s.arg.name
                        ))
                    })?;
                    let want = l.arg_groups.get(s.index).copied().flatten();
                    if want.is_some_and(|g| g != bo.group) {
                        return Err(bad(format!(
                            "pointer argument `{}` is connected to memory group {}, but its buffer \
                             is in group {} (link the xclbin with every gmem port on one bank)",
                            s.arg.name,
                            want.unwrap_or_default(),
                            bo.group
                        )));
                    }
                    run.set_buffer(s.index, bo)?;
                }
            }
        }
        run.start()?;
        self.run = Some(run);
        Ok(())
    }

    /// The run finished: record its time and close it.
    fn finish_run(&mut self) {
        if let Some(run) = self.run.take() {
            let wall = run.started().map(|t| t.elapsed()).unwrap_or_default();
            let cycles = (wall.as_secs_f64() * self.clock_hz()).round() as u64;
            self.last = RunStats {
                cycles,
                total_cycles: self.last.total_cycles + cycles,
                wall,
            };
        }
    }
}

impl FpgaDevice for XrtCard {
    fn name(&self) -> String {
        match &self.loaded {
            Some(l) => format!("{}:{}", self.device.name(), l.desc.name),
            None => self.device.name().into(),
        }
    }

    /// Loads an xclbin and opens the build's kernel in it; the kernel's argument offsets in
    /// the xclbin must be those of the build's description.
    fn load(&mut self, build: &KernelBuild) -> Result<(), FpgaError> {
        let KernelBuild::Xclbin { path, desc } = build else {
            return Err(FpgaError::Load {
                kernel: build.desc().name.clone(),
                msg: "a board loads an xclbin, not a simulated build".into(),
            });
        };
        self.usable()?;
        let load_err = |msg: String| FpgaError::Load {
            kernel: desc.name.clone(),
            msg,
        };
        // Everything of the old xclbin goes first.
        self.run = None;
        self.bos.clear();
        self.loaded = None;
        self.xclbin = None;
        self.shadow.clear();
        let slots = desc.slots().map_err(|e| load_err(e.msg))?;
        // tandem reads the file first: a truncated or corrupt xclbin, or one without this
        // kernel, is a clear error here instead of whatever XRT makes of it.
        let parsed = crate::xclbin::Xclbin::read(path)
            .map_err(|e| load_err(format!("{}: {e}", path.display())))?;
        if parsed.kernel(&desc.name).is_none() {
            return Err(load_err(format!(
                "{} (platform {}) holds no kernel `{}` (it holds: {})",
                path.display(),
                parsed.platform(),
                desc.name,
                parsed
                    .kernels
                    .iter()
                    .map(|k| k.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let xclbin = self.device.load_xclbin(path)?;
        let uuid = xclbin.uuid()?;
        let kernel = XrtKernel::open(&self.device, &uuid, &desc.name)?;
        let mut arg_groups = Vec::with_capacity(slots.len());
        for s in &slots {
            let off = kernel.arg_offset(s.index)?;
            if off != s.offset {
                return Err(load_err(format!(
                    "{}: argument {} (`{}`) is at register {off:#x} in the xclbin, {:#x} in \
                     tandem's description: the xclbin was built from another kernel version",
                    path.display(),
                    s.index,
                    s.arg.name,
                    s.offset
                )));
            }
            arg_groups.push(match s.arg.kind {
                ArgKind::Pointer => Some(kernel.group_id(s.index)?),
                ArgKind::Scalar => None,
            });
        }
        let mut banks: Vec<u32> = arg_groups.iter().flatten().copied().collect();
        banks.sort_unstable();
        banks.dedup();
        tracing::info!(device = %self.device.name(), kernel = %desc.name, %uuid, ?banks, "xclbin loaded");
        self.xclbin = Some(xclbin);
        self.loaded = Some(Loaded {
            kernel,
            desc: desc.clone(),
            slots,
            arg_groups,
            banks,
            uuid,
        });
        Ok(())
    }

    fn load_core(&mut self, core: &dyn KernelCore, _shell: ShellConfig) -> Result<(), FpgaError> {
        let path = self.find_xclbin(core)?;
        self.load(&KernelBuild::Xclbin {
            path,
            desc: core.desc(),
        })
    }

    fn kernel(&self) -> Option<&KernelDesc> {
        self.loaded.as_ref().map(|l| &l.desc)
    }

    fn banks(&self) -> u32 {
        self.loaded
            .as_ref()
            .map_or(0, |l| l.banks.len().max(1) as u32)
    }

    fn alloc(&mut self, bank: u32, bytes: u64) -> Result<DeviceBuffer, FpgaError> {
        self.usable()?;
        let l = self.loaded()?;
        let group = match l.banks.get(bank as usize) {
            Some(g) => *g,
            None if l.banks.is_empty() && bank == 0 => 0,
            None => {
                return Err(FpgaError::OutOfRange {
                    msg: format!(
                        "bank {bank}: kernel {} is connected to {} bank(s) (memory groups {:?})",
                        l.desc.name,
                        l.banks.len(),
                        l.banks
                    ),
                });
            }
        };
        let bo = XrtBo::alloc(&self.device, bytes, group).map_err(|e| match e {
            FpgaError::OutOfMemory { bytes, free, .. } => {
                FpgaError::OutOfMemory { bank, bytes, free }
            }
            other => other,
        })?;
        let buf = DeviceBuffer {
            bank,
            addr: bo.addr,
            len: bytes,
        };
        self.bos.insert(bo.addr, bo);
        Ok(buf)
    }

    fn free(&mut self, buf: DeviceBuffer) -> Result<(), FpgaError> {
        self.bos
            .remove(&buf.addr)
            .map(drop)
            .ok_or_else(|| FpgaError::OutOfRange {
                msg: format!("free of {:#x}: no buffer of this card there", buf.addr),
            })
    }

    fn write(&mut self, buf: &DeviceBuffer, offset: u64, data: &[u8]) -> Result<(), FpgaError> {
        self.bo(buf)?.write(offset, data)
    }

    fn read(&mut self, buf: &DeviceBuffer, offset: u64, out: &mut [u8]) -> Result<(), FpgaError> {
        self.bo(buf)?.read(offset, out)
    }

    fn sync(&mut self, buf: &DeviceBuffer, dir: SyncDir) -> Result<(), FpgaError> {
        self.usable()?;
        self.bo(buf)?.sync(dir)
    }

    fn read_reg(&mut self, offset: u32) -> Result<u32, FpgaError> {
        self.usable()?;
        if offset != REG_AP_CTRL {
            return Ok(self.shadow.get(&offset).copied().unwrap_or(0));
        }
        let Some(run) = &self.run else {
            return Ok(AP_IDLE);
        };
        match run.state() {
            RunState::Busy => Ok(0),
            RunState::Completed => {
                self.finish_run();
                Ok(AP_DONE | AP_IDLE | AP_READY)
            }
            RunState::Failed(s) => {
                self.run = None;
                Err(FpgaError::Device {
                    device: self.device.name().into(),
                    msg: format!(
                        "the run of kernel {} ended in XRT state {} ({s})",
                        self.loaded()?.desc.name,
                        state_name(s)
                    ),
                })
            }
        }
    }

    fn write_reg(&mut self, offset: u32, value: u32) -> Result<(), FpgaError> {
        self.usable()?;
        let l = self.loaded()?;
        if offset == REG_AP_CTRL {
            if value & AUTO_RESTART != 0 {
                return Err(FpgaError::BadArgument {
                    kernel: l.desc.name.clone(),
                    msg: "auto_restart is not driven through XRT runs".into(),
                });
            }
            return if value & AP_START != 0 {
                self.start_run()
            } else {
                Ok(())
            };
        }
        let known = [REG_GIE, REG_IER, REG_ISR].contains(&offset)
            || l.slots.iter().any(|s| {
                offset == s.offset || s.arg.kind == ArgKind::Pointer && offset == s.offset + 4
            });
        if !known {
            return Err(FpgaError::OutOfRange {
                msg: format!(
                    "register {offset:#x} is not in kernel {}'s map",
                    l.desc.name
                ),
            });
        }
        // Interrupt registers belong to XRT's scheduler: kept, not written to the board.
        self.shadow.insert(offset, value);
        Ok(())
    }

    fn run_until_done(&mut self, timeout: Duration) -> Result<bool, FpgaError> {
        self.usable()?;
        let Some(run) = &self.run else {
            return Err(FpgaError::Device {
                device: self.device.name().into(),
                msg: "waiting for a kernel that was not started".into(),
            });
        };
        match run.wait(timeout) {
            RunState::Busy => {
                let kernel = self.loaded()?.desc.name.clone();
                if let Some(run) = self.run.take() {
                    run.abandon();
                }
                self.wedged = Some(format!(
                    "a run of kernel {kernel} did not finish within {timeout:?} and XRT 2.13 \
                     cannot abort it: reset the board (`xbutil reset --device <BDF>`) and open \
                     the card again"
                ));
                Err(FpgaError::Timeout {
                    kernel,
                    timeout,
                    cycles: 0,
                })
            }
            RunState::Completed | RunState::Failed(_) => Ok(true),
        }
    }

    fn stats(&self) -> RunStats {
        self.last
    }

    fn clock_hz(&self) -> f64 {
        self.cfg.clock_mhz.unwrap_or(crate::DEFAULT_CLOCK_MHZ) * 1e6
    }
}
