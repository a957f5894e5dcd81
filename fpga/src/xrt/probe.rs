//! Listing boards without risking the process: the XRT calls run in a child process.
//!
//! The parent ([`probe`]) finds the library, makes a prefix for `XILINX_XRT`
//! ([`XrtInstall::make_prefix`]) and runs the child with it: the `tandem` binary's hidden
//! `__xrt-probe` command (or, in tests, the test binary) ending in [`child_main`], which opens
//! boards by index until XRT finds none and prints one line, [`PROBE_MARK`] + JSON. Whatever
//! XRT does in the child (abort for a missing plugin, hang), the parent reports it as a reason
//! and carries on. PCIe functions of Xilinx's vendor id are read from sysfs in the parent, so
//! a board whose driver XRT cannot reach is still named.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::device::{BoardId, XrtDevice};
use super::error::unavailable;
use super::loader::{Xrt, XrtInstall, XrtSearch};
use crate::FpgaError;

/// The line prefix of the child's report.
pub const PROBE_MARK: &str = "TANDEM-XRT-PROBE ";
/// Most boards looked for.
const MAX_BOARDS: u32 = 64;
/// Longest the child may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// One board XRT opened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct XrtBoard {
    /// XRT's device index.
    pub index: u32,
    /// The uuid of the xclbin on it (`None`: none loaded).
    pub xclbin_uuid: Option<String>,
}

/// A Xilinx PCIe function seen in sysfs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciBoard {
    /// `0000:65:00.1`.
    pub bdf: String,
    /// PCI device id, `0x505c`.
    pub device_id: String,
    /// The platform (shell) name XRT's driver exposes (`rom.*/VBNV`), if readable.
    pub platform: Option<String>,
}

/// What the child reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildReport {
    /// Boards XRT opened.
    pub boards: Vec<XrtBoard>,
}

/// What `tandem devices` shows of XRT.
#[derive(Debug, Clone)]
pub struct XrtReport {
    /// The library found.
    pub install: XrtInstall,
    /// The prefix the child ran with (`XILINX_XRT`).
    pub prefix: PathBuf,
    /// Boards XRT opened, or why the probe failed.
    pub boards: Result<Vec<XrtBoard>, String>,
    /// Xilinx PCIe functions in sysfs.
    pub pci: Vec<PciBoard>,
}

/// Finds XRT (no library: the error says where it looked) and lists its boards through a child
/// made by `child` (the program and its leading arguments; the library's path is appended).
/// Files for the `XILINX_XRT` prefix go under `cache`.
pub fn probe(search: &XrtSearch, cache: &Path, child: Command) -> Result<XrtReport, FpgaError> {
    let install = XrtInstall::find(search)?;
    let prefix = install.make_prefix(cache)?;
    let boards = run_child(&install, Some(&prefix), child, PROBE_TIMEOUT);
    Ok(XrtReport {
        install,
        prefix,
        boards,
        pci: pci_boards(Path::new("/sys/bus/pci/devices")),
    })
}

/// Runs the child with `XILINX_XRT=prefix` (`None`: as `child` has it) and reads its report.
pub fn run_child(
    install: &XrtInstall,
    prefix: Option<&Path>,
    mut child: Command,
    timeout: Duration,
) -> Result<Vec<XrtBoard>, String> {
    if let Some(p) = prefix {
        child.env("XILINX_XRT", p);
    }
    child
        .arg(&install.library)
        .env_remove("XCL_EMULATION_MODE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = run_with_timeout(child, timeout)?;
    let report = out
        .stdout
        .lines()
        .find_map(|l| l.find(PROBE_MARK).map(|i| &l[i + PROBE_MARK.len()..]))
        .map(serde_json::from_str::<ChildReport>);
    match report {
        Some(Ok(r)) => Ok(r.boards),
        Some(Err(e)) => Err(format!("the XRT probe's report does not parse: {e}")),
        None => {
            let said: Vec<&str> = out
                .stderr
                .lines()
                .chain(out.stdout.lines())
                .filter(|l| l.contains("what()") || l.contains("ERROR") || l.contains("rror"))
                .collect();
            Err(format!(
                "the XRT probe (a child process) ended with {} and no report{}",
                out.status,
                if said.is_empty() {
                    String::new()
                } else {
                    format!("; it said: {}", said.join(" / ").trim())
                }
            ))
        }
    }
}

struct ChildOutput {
    status: String,
    stdout: String,
    stderr: String,
}

fn run_with_timeout(mut cmd: Command, timeout: Duration) -> Result<ChildOutput, String> {
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the XRT probe {:?}: {e}", cmd.get_program()))?;
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let mut b = Vec::new();
                let _ = r.read_to_end(&mut b);
                s = String::from_utf8_lossy(&b).into_owned();
            }
            s
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let t0 = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break describe(s),
            Ok(None) if t0.elapsed() < timeout => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                break format!("no answer within {timeout:?} (killed)");
            }
            Err(e) => return Err(format!("waiting for the XRT probe: {e}")),
        }
    };
    Ok(ChildOutput {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

fn describe(s: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(6)) => "signal 6 (SIGABRT: XRT aborted)".into(),
        (None, Some(sig)) => format!("signal {sig}"),
        (None, None) => s.to_string(),
    }
}

/// The child's side: loads `library`, opens boards 0, 1, ... until XRT has no more, prints
/// [`PROBE_MARK`] + JSON on stdout and returns the exit code (0, or 1 when the library does not
/// load). Its parent has set `XILINX_XRT`.
pub fn child_main(library: &Path) -> i32 {
    let install = XrtInstall {
        library: library.to_path_buf(),
        version: None,
        prefix: None,
    };
    let xrt = match Xrt::load_unchecked(install) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    let mut boards = Vec::new();
    for index in 0..MAX_BOARDS {
        let Ok(dev) = XrtDevice::open(xrt.clone(), &BoardId::Index(index)) else {
            break;
        };
        let xclbin_uuid = dev
            .xclbin_uuid()
            .ok()
            .filter(|u| !u.is_nil())
            .map(|u| u.to_string());
        boards.push(XrtBoard { index, xclbin_uuid });
    }
    match serde_json::to_string(&ChildReport { boards }) {
        Ok(j) => {
            // On a line of its own, whatever was printed before (a test harness's name).
            println!("\n{PROBE_MARK}{j}");
            0
        }
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

/// Xilinx (vendor 0x10ee) PCIe functions under `sysfs` (`/sys/bus/pci/devices`).
pub fn pci_boards(sysfs: &Path) -> Vec<PciBoard> {
    let Ok(entries) = std::fs::read_dir(sysfs) else {
        return Vec::new();
    };
    let read = |p: PathBuf| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let mut v: Vec<PciBoard> = entries
        .flatten()
        .filter(|e| read(e.path().join("vendor")).as_deref() == Some("0x10ee"))
        .map(|e| {
            let dir = e.path();
            let platform = std::fs::read_dir(&dir).ok().and_then(|d| {
                d.flatten()
                    .filter(|r| r.file_name().to_string_lossy().starts_with("rom."))
                    .find_map(|r| read(r.path().join("VBNV")))
            });
            PciBoard {
                bdf: e.file_name().to_string_lossy().into_owned(),
                device_id: read(dir.join("device")).unwrap_or_default(),
                platform,
            }
        })
        .collect();
    v.sort_by(|a, b| a.bdf.cmp(&b.bdf));
    v
}

/// The error of a probe that found no library, for callers that only want the reason.
pub fn not_found(reason: String) -> FpgaError {
    unavailable(reason)
}
