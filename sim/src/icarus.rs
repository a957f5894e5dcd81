//! A 4-state simulation of an emitted kernel in Icarus Verilog, behind the `FpgaDevice` trait.
//!
//! Verilator (the [`crate::SimCard`]) is a 2-state simulator: a register that was never
//! written reads as some value, so a datapath that multiplies an uninitialised lane by zero
//! gets zero, as real silicon would. The Vivado simulator that Vitis hardware emulation runs is
//! 4-state: there the lane is X, X x 0 stays X, and the kernel's outputs turn to X. The
//! [`IcarusCard`] runs the emitted Verilog in Icarus Verilog (also 4-state) inside the
//! hand-written testbench `sim/tb/axi_tb.v`, so X-propagation and AXI protocol mistakes show
//! up in the project's own tests:
//!
//! - the host side of `s_axi_control` is the testbench, commanded over a pipe by this module,
//!   so the drivers of `tandem_fpga::drive` run unchanged (the same ap_ctrl_hs sequence,
//!   argument registers from 0x10, 64-bit pointers as low/high words);
//! - `m_axi_gmem` (of the build's data width, one of [`DATA_BITS`]: a beat is that many bits
//!   of consecutive 64-bit memory words) is served from a memory with random stalls on AR, R,
//!   AW, W and B ([`IcarusConfig::stall_percent`]); the testbench checks the AXI rules every
//!   cycle (see the file's header) and reports each breach, which fails the device call that
//!   saw it;
//! - device memory starts as X and the host's shadow of a buffer keeps which bytes it knows,
//!   so memory moves to and from the simulation as `$readmemh` / `$writememh` images with X
//!   where nothing was written, and [`FpgaDevice::read`] refuses bytes that came back X
//!   (an output the kernel never wrote, or wrote with unknown bits).
//!
//! Icarus Verilog 11.0 (Debian bookworm's) is the oldest release tested. Its issue #515 (an
//! array index `a[p + 1]` with a narrow `p` is evaluated without wrapping to `p`'s width)
//! is worked around in the kernels by giving such indices an explicit width (the router's
//! histogram queue).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use tandem_fpga::core::KernelCore;
use tandem_fpga::device::SyncDir;
use tandem_fpga::emit::{self, Manifest};
use tandem_fpga::regmap::KernelDesc;
use tandem_fpga::shell::ShellConfig;
use tandem_fpga::{DeviceBuffer, FpgaDevice, FpgaError, KernelBuild, RunStats};

use crate::SimError;

/// Oldest Icarus Verilog release the testbench is tested with.
pub const MIN_ICARUS: (u32, u32) = (11, 0);

/// Install hint shown when Icarus Verilog is missing.
pub const INSTALL_HINT: &str =
    "install Icarus Verilog >= 11.0 (Debian/Ubuntu: apt-get install iverilog)";

/// Byte address of the first word of the testbench's memory (`BASE` in `axi_tb.v`; above
/// 4 GiB, so every pointer has a non-zero high word).
pub const MEM_BASE: u64 = 0x4_0000_0000;

/// Device name in errors.
const DEVICE: &str = "icarus";

/// The testbench, compiled with each kernel.
const TESTBENCH: &str = include_str!("../tb/axi_tb.v");

/// Data widths of `m_axi_gmem` (and `m_axi_gmem1/2`) the testbench takes (its `DW`).
pub const DATA_BITS: [u32; 4] = [64, 128, 256, 512];

/// Alignment of allocations (as XRT's).
const ALIGN: u64 = 4096;

/// Lines of a failed command's output kept in an error.
const LOG_TAIL: usize = 30;

/// `(major, minor)` of the installed `iverilog`, or why it cannot be used (with the install
/// hint).
pub fn version() -> Result<(u32, u32), SimError> {
    let out = Command::new("iverilog")
        .arg("-V")
        .output()
        .map_err(|e| SimError::Unavailable(format!("iverilog not found ({e}); {INSTALL_HINT}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = parse_version(&text).ok_or_else(|| {
        SimError::Unavailable(format!(
            "cannot read the version of iverilog from {:?}; {INSTALL_HINT}",
            text.lines().next().unwrap_or("")
        ))
    })?;
    if v < MIN_ICARUS {
        return Err(SimError::Unavailable(format!(
            "Icarus Verilog {}.{} is older than {}.{}; {INSTALL_HINT}",
            v.0, v.1, MIN_ICARUS.0, MIN_ICARUS.1
        )));
    }
    Command::new("vvp")
        .arg("-V")
        .output()
        .map_err(|e| SimError::Unavailable(format!("vvp not found ({e}); {INSTALL_HINT}")))?;
    Ok(v)
}

/// `(major, minor)` from `iverilog -V`'s first line, `Icarus Verilog version 11.0 (stable)`.
fn parse_version(text: &str) -> Option<(u32, u32)> {
    let line = text.lines().next()?;
    let rest = line.split("version").nth(1)?.trim_start();
    let num: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let mut it = num.split('.');
    let major = it.next()?.parse().ok()?;
    let minor = it.next().unwrap_or("0").parse().unwrap_or(0);
    Some((major, minor))
}

/// How the Icarus card is built and run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IcarusConfig {
    /// Folder for emitted kernels, compiled simulations and the per-card run folders.
    pub work_dir: PathBuf,
    /// Device memory in bytes (a multiple of 8; the testbench's `MEM_WORDS` x 8).
    pub mem_bytes: u64,
    /// Probability (percent, 0..=90) that the memory stalls each ready/valid decision.
    pub stall_percent: u32,
    /// Seed of the testbench's random stalls.
    pub seed: u32,
    /// Cycles per polling step of [`FpgaDevice::run_until_done`] (the wall-clock timeout is
    /// checked between steps).
    pub poll_cycles: u64,
    /// Banks the memory is split into (equal parts, bank 0 first; 1..=8): with three or more
    /// the drivers stripe a GEMM's W over banks 1 and 2, which a kernel with W on masters of
    /// its own reads through `m_axi_gmem1` and `m_axi_gmem2`.
    pub banks: u32,
}

impl Default for IcarusConfig {
    /// 1 MiB of memory, 30% stalls, seed 1, in the temp folder (`tandem-icarus`).
    fn default() -> Self {
        Self {
            work_dir: std::env::temp_dir().join("tandem-icarus"),
            mem_bytes: 1 << 20,
            stall_percent: 30,
            seed: 1,
            poll_cycles: 20_000,
            banks: 1,
        }
    }
}

/// The host's copy of a device buffer: its bytes and which of them are known (not X).
#[derive(Debug)]
struct Shadow {
    buf: DeviceBuffer,
    data: Vec<u8>,
    known: Vec<bool>,
}

/// The running `vvp` process and its command pipe.
struct Vvp {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    run_dir: PathBuf,
    /// `VIOLATION` lines printed before `READY`, handed over with the first command.
    early: Vec<String>,
}

impl Vvp {
    /// Starts `vvp` on a compiled simulation in a fresh run folder and waits for `READY`.
    fn spawn(vvp_file: &Path, cfg: &IcarusConfig) -> Result<Self, FpgaError> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let run_dir = cfg
            .work_dir
            .join("run")
            .join(format!("{}-{n}", std::process::id()));
        std::fs::create_dir_all(&run_dir).map_err(io_err(&run_dir))?;
        let log = run_dir.join("vvp.log");
        let log_file = std::fs::File::create(&log).map_err(io_err(&log))?;
        let mut child = Command::new("vvp")
            .arg("-n")
            .arg(vvp_file)
            .arg(format!("+seed={}", cfg.seed))
            .arg(format!("+stall={}", cfg.stall_percent))
            .current_dir(&run_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .spawn()
            .map_err(|e| device(format!("cannot start vvp: {e}")))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(device("vvp started without pipes".into()));
        };
        let mut vvp = Self {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            run_dir,
            early: Vec::new(),
        };
        let mut line = String::new();
        loop {
            line.clear();
            let got = vvp
                .stdout
                .read_line(&mut line)
                .map_err(|e| device(format!("reading vvp: {e}")))?;
            if got == 0 {
                return Err(device(format!(
                    "vvp ended before the testbench was ready: {}",
                    vvp.log_tail()
                )));
            }
            if line.starts_with("READY") {
                return Ok(vvp);
            }
            if let Some(v) = line.trim_end().strip_prefix("VIOLATION ") {
                vvp.early.push(v.to_string());
            }
        }
    }

    /// Sends one command and returns the words after `OK`; `VIOLATION` lines seen meanwhile
    /// go into `violations`.
    fn command(&mut self, cmd: &str, violations: &mut Vec<String>) -> Result<String, FpgaError> {
        violations.append(&mut self.early);
        writeln!(self.stdin, "{cmd}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| device(format!("writing to vvp ({cmd}): {e}; {}", self.log_tail())))?;
        let mut line = String::new();
        loop {
            line.clear();
            let got = self
                .stdout
                .read_line(&mut line)
                .map_err(|e| device(format!("reading vvp: {e}")))?;
            if got == 0 {
                return Err(device(format!(
                    "vvp ended during `{cmd}`: {}",
                    self.log_tail()
                )));
            }
            let l = line.trim_end();
            if let Some(rest) = l.strip_prefix("OK") {
                return Ok(rest.trim().to_string());
            }
            if let Some(rest) = l.strip_prefix("ERR") {
                return Err(device(format!(
                    "testbench refused `{cmd}`: {}",
                    rest.trim()
                )));
            }
            if let Some(v) = l.strip_prefix("VIOLATION ") {
                violations.push(v.to_string());
            } else if !l.is_empty() {
                tracing::debug!(line = l, "vvp");
            }
        }
    }

    /// The last lines vvp wrote to its stderr log.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.run_dir.join("vvp.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n")
    }
}

impl Drop for Vvp {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "Q 0 0");
        let _ = self.stdin.flush();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(2) {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

/// A card whose kernel runs in Icarus Verilog: 4-state, random AXI stalls, AXI rule checks.
/// [`IcarusConfig::mem_bytes`] at [`MEM_BASE`], in [`IcarusConfig::banks`] equal banks.
pub struct IcarusCard {
    cfg: IcarusConfig,
    vvp: Option<Vvp>,
    desc: Option<KernelDesc>,
    kernel_name: String,
    clock_mhz: f64,
    bufs: Vec<Shadow>,
    last_cycles: u64,
    total_cycles: u64,
    violations: Vec<String>,
    reported: usize,
}

impl std::fmt::Debug for IcarusCard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IcarusCard")
            .field("cfg", &self.cfg)
            .field("kernel", &self.kernel_name)
            .field("buffers", &self.bufs.len())
            .finish()
    }
}

impl IcarusCard {
    /// Opens a card (nothing loaded): fails with [`SimError::Unavailable`] (and the install
    /// hint) where Icarus Verilog is missing or too old, or on a bad configuration.
    pub fn open(cfg: IcarusConfig) -> Result<Self, SimError> {
        if cfg.mem_bytes < ALIGN || !cfg.mem_bytes.is_multiple_of(8) || cfg.mem_bytes > 1 << 30 {
            return Err(SimError::Run(format!(
                "mem_bytes = {} must be a multiple of 8 in {ALIGN}..=1 GiB",
                cfg.mem_bytes
            )));
        }
        if cfg.stall_percent > 90 || cfg.poll_cycles == 0 {
            return Err(SimError::Run(format!(
                "stall_percent = {} must be in 0..=90 and poll_cycles = {} positive",
                cfg.stall_percent, cfg.poll_cycles
            )));
        }
        version()?;
        Ok(Self {
            cfg,
            vvp: None,
            desc: None,
            kernel_name: String::new(),
            clock_mhz: tandem_fpga::DEFAULT_CLOCK_MHZ,
            bufs: Vec::new(),
            last_cycles: 0,
            total_cycles: 0,
            violations: Vec::new(),
            reported: 0,
        })
    }

    /// Every AXI rule breach the testbench reported since the kernel was loaded
    /// (`<cycle> <what>`).
    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    /// Compiles the testbench with the emitted kernel in `dir` (cached in that folder by the
    /// memory size, the data width and the testbench's hash, so builds of other testbench
    /// versions sharing the folder neither overwrite nor reuse each other's files) and returns
    /// the `vvp` file.
    fn compile(&self, dir: &Path, manifest: &Manifest) -> Result<PathBuf, FpgaError> {
        let words = self.cfg.mem_bytes / 8;
        let dw = manifest.data_bits;
        let h: String = Sha256::digest(TESTBENCH.as_bytes())
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect();
        let out = dir.join(format!("icarus-{words}-{dw}-{h}.vvp"));
        if out.exists() {
            return Ok(out);
        }
        let tb = dir.join(format!("axi_tb-{h}.v"));
        write_atomic(&tb, TESTBENCH.as_bytes()).map_err(io_err(&tb))?;
        let tmp = dir.join(format!(
            ".icarus-{words}-{dw}-{h}.{}.{}.partial",
            std::process::id(),
            unique()
        ));
        // a kernel with the read-only masters m_axi_gmem1/2 gets the testbench's slaves for them
        let multi = manifest.desc().axi_ports() > 1;
        let res = Command::new("iverilog")
            .arg("-g2012")
            .args(multi.then_some("-DMULTI"))
            .arg(format!("-DKERNEL={}", manifest.kernel))
            .arg(format!("-DMEM_WORDS={words}"))
            .arg(format!("-DDW={dw}"))
            .arg("-o")
            .arg(&tmp)
            .arg(&tb)
            .arg(dir.join(&manifest.verilog))
            .output()
            .map_err(|e| load_err(&manifest.kernel, format!("cannot run iverilog: {e}")))?;
        if !res.status.success() {
            let _ = std::fs::remove_file(&tmp);
            let text = String::from_utf8_lossy(&res.stderr);
            let lines: Vec<&str> = text.lines().collect();
            return Err(load_err(
                &manifest.kernel,
                format!(
                    "iverilog failed ({}):\n{}",
                    res.status,
                    lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n")
                ),
            ));
        }
        std::fs::rename(&tmp, &out).map_err(io_err(&out))?;
        Ok(out)
    }

    fn vvp(&mut self) -> Result<&mut Vvp, FpgaError> {
        self.vvp.as_mut().ok_or_else(|| FpgaError::NotLoaded {
            device: DEVICE.into(),
        })
    }

    /// Runs one testbench command; new AXI rule breaches fail it.
    fn command(&mut self, cmd: &str) -> Result<String, FpgaError> {
        let mut v = std::mem::take(&mut self.violations);
        let r = self.vvp().and_then(|p| p.command(cmd, &mut v));
        self.violations = v;
        let answer = r?;
        if self.violations.len() > self.reported {
            let new = &self.violations[self.reported..];
            self.reported = self.violations.len();
            return Err(device(format!(
                "{} AXI rule breach(es) in kernel {} during `{cmd}`: {}",
                new.len(),
                self.kernel_name,
                new.join("; ")
            )));
        }
        Ok(answer)
    }

    fn shadow(&mut self, buf: &DeviceBuffer) -> Result<&mut Shadow, FpgaError> {
        self.bufs
            .iter_mut()
            .find(|s| s.buf.addr == buf.addr && s.buf.len == buf.len)
            .ok_or_else(|| FpgaError::OutOfRange {
                msg: format!(
                    "no buffer of {} bytes at {:#x} on the Icarus card",
                    buf.len, buf.addr
                ),
            })
    }
}

impl FpgaDevice for IcarusCard {
    fn name(&self) -> String {
        format!("{DEVICE}:{}", self.kernel_name)
    }

    fn load(&mut self, build: &KernelBuild) -> Result<(), FpgaError> {
        let KernelBuild::Simulated { dir, desc } = build else {
            return Err(load_err(
                &build.desc().name,
                "the Icarus card runs emitted Verilog, not an xclbin".into(),
            ));
        };
        let manifest = Manifest::read(dir).map_err(|e| load_err(&desc.name, e.to_string()))?;
        if !DATA_BITS.contains(&manifest.data_bits) {
            return Err(load_err(
                &desc.name,
                format!(
                    "the Icarus testbench drives an m_axi_gmem of {DATA_BITS:?} data bits; \
                     this build's is {} bits",
                    manifest.data_bits
                ),
            ));
        }
        let vvp_file = self.compile(dir, &manifest)?;
        self.vvp = None;
        self.bufs.clear();
        self.violations.clear();
        self.reported = 0;
        self.vvp = Some(Vvp::spawn(&vvp_file, &self.cfg)?);
        self.desc = Some(desc.clone());
        self.kernel_name = manifest.kernel.clone();
        self.clock_mhz = manifest.clock_mhz;
        Ok(())
    }

    fn load_core(&mut self, core: &dyn KernelCore, shell: ShellConfig) -> Result<(), FpgaError> {
        let (_, manifest) =
            emit::generate(core, shell).map_err(|e| load_err(core.name(), e.to_string()))?;
        let dir = self.cfg.work_dir.join("emit").join(format!(
            "{}-{}",
            core.name(),
            &manifest.verilog_sha256[..24]
        ));
        let em = emit::emit(core, shell, &dir).map_err(|e| load_err(core.name(), e.to_string()))?;
        self.load(&KernelBuild::Simulated {
            dir: em.dir,
            desc: em.desc,
        })
    }

    fn kernel(&self) -> Option<&KernelDesc> {
        self.desc.as_ref()
    }

    fn banks(&self) -> u32 {
        self.cfg.banks.clamp(1, 8)
    }

    fn alloc(&mut self, bank: u32, bytes: u64) -> Result<DeviceBuffer, FpgaError> {
        let banks = self.banks();
        if bank >= banks {
            return Err(FpgaError::OutOfRange {
                msg: format!("bank {bank}: the Icarus card has {banks} bank(s) (0..{banks})"),
            });
        }
        let size = self.cfg.mem_bytes / u64::from(banks) / ALIGN * ALIGN;
        let (lo_bank, hi_bank) = (u64::from(bank) * size, u64::from(bank + 1) * size);
        let need = bytes.max(8).div_ceil(ALIGN) * ALIGN;
        let mut taken: Vec<(u64, u64)> = self
            .bufs
            .iter()
            .map(|s| {
                let off = s.buf.addr - MEM_BASE;
                (off, off + s.buf.len.max(8).div_ceil(ALIGN) * ALIGN)
            })
            .filter(|&(lo, _)| (lo_bank..hi_bank).contains(&lo))
            .collect();
        taken.sort_unstable();
        let mut at = lo_bank;
        for (lo, hi) in taken {
            if at + need <= lo {
                break;
            }
            at = at.max(hi);
        }
        if at + need > hi_bank {
            return Err(FpgaError::OutOfMemory {
                bank,
                bytes,
                free: hi_bank.saturating_sub(at),
            });
        }
        let buf = DeviceBuffer {
            bank,
            addr: MEM_BASE + at,
            len: bytes,
        };
        let n = usize::try_from(bytes).map_err(|_| FpgaError::OutOfMemory {
            bank,
            bytes,
            free: 0,
        })?;
        self.bufs.push(Shadow {
            buf,
            data: vec![0; n],
            known: vec![false; n],
        });
        Ok(buf)
    }

    fn free(&mut self, buf: DeviceBuffer) -> Result<(), FpgaError> {
        let i =
            self.bufs
                .iter()
                .position(|s| s.buf == buf)
                .ok_or_else(|| FpgaError::OutOfRange {
                    msg: format!("free of an unknown buffer at {:#x}", buf.addr),
                })?;
        self.bufs.swap_remove(i);
        Ok(())
    }

    fn write(&mut self, buf: &DeviceBuffer, offset: u64, data: &[u8]) -> Result<(), FpgaError> {
        let s = self.shadow(buf)?;
        let (lo, hi) = span(s, offset, data.len())?;
        s.data[lo..hi].copy_from_slice(data);
        s.known[lo..hi].iter_mut().for_each(|k| *k = true);
        Ok(())
    }

    fn read(&mut self, buf: &DeviceBuffer, offset: u64, out: &mut [u8]) -> Result<(), FpgaError> {
        let kernel = self.kernel_name.clone();
        let s = self.shadow(buf)?;
        let (lo, hi) = span(s, offset, out.len())?;
        if let Some(i) = s.known[lo..hi].iter().position(|k| !k) {
            let unknown = s.known[lo..hi].iter().filter(|k| !**k).count();
            return Err(device(format!(
                "kernel {kernel}: {unknown} of the {} bytes read back from the buffer at {:#x} \
                 are X (first at byte {}): an output the kernel never wrote, or wrote with \
                 unknown bits",
                hi - lo,
                s.buf.addr,
                lo + i
            )));
        }
        out.copy_from_slice(&s.data[lo..hi]);
        Ok(())
    }

    fn sync(&mut self, buf: &DeviceBuffer, dir: SyncDir) -> Result<(), FpgaError> {
        let run_dir = self.vvp()?.run_dir.clone();
        let s = self.shadow(buf)?;
        let first = (s.buf.addr - MEM_BASE) / 8;
        let words = s.data.len().div_ceil(8);
        match dir {
            SyncDir::ToDevice => {
                let mut text = String::with_capacity(words * 17);
                for w in 0..words {
                    for b in (0..8).rev() {
                        let i = 8 * w + b;
                        if i < s.data.len() && s.known[i] {
                            text.push_str(&format!("{:02x}", s.data[i]));
                        } else {
                            text.push_str("xx");
                        }
                    }
                    text.push('\n');
                }
                let path = run_dir.join("in.hex");
                std::fs::write(&path, text).map_err(io_err(&path))?;
                self.command(&format!("L {first:x} {words:x}"))?;
            }
            SyncDir::FromDevice => {
                self.command(&format!("D {first:x} {words:x}"))?;
                let path = run_dir.join("out.hex");
                let text = std::fs::read_to_string(&path).map_err(io_err(&path))?;
                let s = self.shadow(buf)?;
                let mut w = 0usize;
                for line in text.lines() {
                    let line = line.trim();
                    if line.is_empty() || line.starts_with("//") {
                        continue;
                    }
                    if line.len() != 16 || w >= words {
                        return Err(device(format!(
                            "unexpected memory dump line {line:?} (word {w} of {words})"
                        )));
                    }
                    for b in 0..8 {
                        let i = 8 * w + b;
                        if i >= s.data.len() {
                            continue;
                        }
                        let hex = &line[14 - 2 * b..16 - 2 * b];
                        match u8::from_str_radix(hex, 16) {
                            Ok(v) => {
                                s.data[i] = v;
                                s.known[i] = true;
                            }
                            Err(_) => s.known[i] = false,
                        }
                    }
                    w += 1;
                }
                if w != words {
                    return Err(device(format!(
                        "memory dump has {w} words, expected {words}"
                    )));
                }
            }
        }
        Ok(())
    }

    fn read_reg(&mut self, offset: u32) -> Result<u32, FpgaError> {
        check_reg(offset)?;
        let a = self.command(&format!("R {offset:x} 0"))?;
        u32::from_str_radix(a.trim(), 16).map_err(|_| {
            device(format!(
                "register {offset:#x} read back {a:?} (X or unknown bits)"
            ))
        })
    }

    fn write_reg(&mut self, offset: u32, value: u32) -> Result<(), FpgaError> {
        check_reg(offset)?;
        self.command(&format!("W {offset:x} {value:x}"))?;
        Ok(())
    }

    fn run_until_done(&mut self, timeout: Duration) -> Result<bool, FpgaError> {
        let t0 = Instant::now();
        loop {
            let a = self.command(&format!("C {:x} 0", self.cfg.poll_cycles))?;
            let f: Vec<u64> = a
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            let [done, ran, last] = f[..] else {
                return Err(device(format!("unexpected answer to a poll: {a:?}")));
            };
            self.total_cycles += ran;
            if done == 1 {
                self.last_cycles = last;
                return Ok(true);
            }
            if t0.elapsed() >= timeout {
                return Ok(false);
            }
        }
    }

    fn stats(&self) -> RunStats {
        RunStats {
            cycles: self.last_cycles,
            total_cycles: self.total_cycles,
            wall: Duration::ZERO,
        }
    }

    fn clock_hz(&self) -> f64 {
        self.clock_mhz * 1e6
    }
}

/// The byte range `offset .. offset + len` of a shadow, checked.
fn span(s: &Shadow, offset: u64, len: usize) -> Result<(usize, usize), FpgaError> {
    let lo = usize::try_from(offset).unwrap_or(usize::MAX);
    match lo.checked_add(len) {
        Some(hi) if hi <= s.data.len() => Ok((lo, hi)),
        _ => Err(FpgaError::OutOfRange {
            msg: format!(
                "{len} bytes at offset {offset} of a {}-byte buffer",
                s.data.len()
            ),
        }),
    }
}

/// Register offsets the control port decodes: 12 bits, word aligned.
fn check_reg(offset: u32) -> Result<(), FpgaError> {
    if offset >= 1 << 12 || !offset.is_multiple_of(4) {
        return Err(FpgaError::OutOfRange {
            msg: format!("register offset {offset:#x} (word-aligned, below 0x1000)"),
        });
    }
    Ok(())
}

fn device(msg: String) -> FpgaError {
    FpgaError::Device {
        device: DEVICE.into(),
        msg,
    }
}

fn load_err(kernel: &str, msg: String) -> FpgaError {
    FpgaError::Load {
        kernel: kernel.into(),
        msg,
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> FpgaError + '_ {
    move |source| FpgaError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn unique() -> u64 {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    SEQ.fetch_add(1, Ordering::Relaxed)
}

/// Writes a file through a unique temporary name renamed into place.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("{}.{}.partial", std::process::id(), unique()));
    let r = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_lines_parse() {
        assert_eq!(
            parse_version("Icarus Verilog version 11.0 (stable) ()\n"),
            Some((11, 0))
        );
        assert_eq!(
            parse_version("Icarus Verilog version 12.0 (devel) (s20150603-1539-g2693dd32b)"),
            Some((12, 0))
        );
        assert_eq!(parse_version("iverilog: command not found"), None);
        assert!((10, 3) < MIN_ICARUS);
    }

    /// A build whose data port the testbench has no `DW` for is refused at load, naming the
    /// widths it takes (no iverilog run).
    #[test]
    fn unsupported_data_widths_are_refused() {
        let cfg = IcarusConfig::default();
        let mut c = match IcarusCard::open(cfg.clone()) {
            Ok(c) => c,
            Err(SimError::Unavailable(why)) => {
                println!("SKIP: {why}");
                return;
            }
            Err(e) => panic!("opening the Icarus card: {e}"),
        };
        let dir = cfg
            .work_dir
            .join(format!("dw1024-{}-{}", std::process::id(), unique()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(
            dir.join("manifest.json"),
            r#"{"kernel":"wide","params":[],"shell":{"max_burst":8},"clock_mhz":300.0,"data_bits":1024,"args":[],"verilog_sha256":"-","verilog":"wide.v"}"#,
        )
        .expect("manifest");
        let desc = KernelDesc {
            name: "wide".into(),
            args: vec![],
        };
        let err = c
            .load(&KernelBuild::Simulated {
                dir: dir.clone(),
                desc,
            })
            .expect_err("1024 bits refused");
        let msg = err.to_string();
        assert!(
            matches!(err, FpgaError::Load { .. }) && msg.contains("1024 bits"),
            "{msg}"
        );
        assert!(msg.contains("[64, 128, 256, 512]"), "{msg}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_configurations_are_refused() {
        for cfg in [
            IcarusConfig {
                mem_bytes: 100,
                ..IcarusConfig::default()
            },
            IcarusConfig {
                stall_percent: 95,
                ..IcarusConfig::default()
            },
        ] {
            let e = IcarusCard::open(cfg).expect_err("refused");
            assert!(matches!(e, SimError::Run(_)), "{e}");
        }
    }
}
