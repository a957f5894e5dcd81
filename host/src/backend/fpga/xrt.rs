//! Alveo boards through XRT: which boards there are (listed by a child process, so XRT can
//! never end tandem: see `tandem_fpga::xrt::probe`), and the factory of board cards.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use tandem_fpga::FpgaDevice;
use tandem_fpga::xrt::probe::{self, XrtReport};
use tandem_fpga::xrt::{BoardId, Xrt, XrtCard, XrtCardConfig, XrtEnv, XrtInstall, XrtSearch};

use super::{CardInfo, FpgaBackend, OpenDevice};
use crate::backend::{Backend, DeviceKind, Missing};
use crate::options::FpgaOptions;

/// The hidden command of the `tandem` binary that runs the board probe.
pub const PROBE_COMMAND: &str = "__xrt-probe";

/// Where XRT is looked for, from the options.
pub fn search(o: &FpgaOptions) -> XrtSearch {
    XrtSearch {
        xilinx_xrt: o.xilinx_xrt.clone(),
        only: o.xrt_lib.clone(),
    }
}

/// The environment XRT will read in this process, from the options.
pub fn env(o: &FpgaOptions) -> XrtEnv {
    XrtEnv {
        xilinx_xrt: o.xilinx_xrt.clone(),
        emulation: o.xrt_emulation.clone(),
        xilinx_vitis: o.xilinx_vitis.clone(),
    }
}

/// Where the `XILINX_XRT` prefix for Debian's XRT is made: beside the simulator's cache.
fn cache(o: &FpgaOptions) -> PathBuf {
    o.sim_cache
        .parent()
        .map_or_else(|| o.sim_cache.clone(), PathBuf::from)
}

/// The reason of an unavailable XRT, without the device-name prefix.
fn reason(e: tandem_fpga::FpgaError) -> String {
    match e {
        tandem_fpga::FpgaError::Unavailable { reason, .. } => reason,
        other => other.to_string(),
    }
}

/// One line on XRT: version and library.
fn driver(install: &XrtInstall) -> String {
    format!(
        "XRT {} ({})",
        install.version.as_deref().unwrap_or("(version unknown)"),
        install.library.display()
    )
}

/// A backend per board XRT opens; otherwise one [`Missing`] saying what was found and why no
/// board is usable (no XRT, no board, XRT's environment).
pub fn discover(opts: &FpgaOptions) -> (Vec<Arc<dyn Backend>>, Vec<Missing>) {
    let missing = |reason: String| {
        (
            Vec::new(),
            vec![Missing {
                kind: DeviceKind::FpgaXrt,
                reason,
            }],
        )
    };
    let Some(exe) = &opts.xrt_probe else {
        return match XrtInstall::find(&search(opts)) {
            Ok(i) => missing(format!(
                "{} found; boards are listed by the `tandem` binary only (no probe program here)",
                driver(&i)
            )),
            Err(e) => missing(reason(e)),
        };
    };
    let mut cmd = Command::new(exe);
    cmd.arg(PROBE_COMMAND);
    let report = match probe::probe(&search(opts), &cache(opts), cmd) {
        Ok(r) => r,
        Err(e) => return missing(reason(e)),
    };
    let XrtReport {
        install,
        boards,
        pci,
        ..
    } = report;
    let boards = match boards {
        Ok(b) => b,
        Err(why) => {
            return missing(format!(
                "{} found; listing boards failed: {why}",
                driver(&install)
            ));
        }
    };
    let pci_text = pci
        .iter()
        .map(|p| match &p.platform {
            Some(v) => format!("{} ({v})", p.bdf),
            None => format!("{} (device {})", p.bdf, p.device_id),
        })
        .collect::<Vec<_>>()
        .join(", ");
    if boards.is_empty() {
        let seen = if pci.is_empty() {
            String::new()
        } else {
            format!(
                " (Xilinx PCIe functions {pci_text} are present, but XRT's driver opens none: is \
                 the xocl driver loaded?)"
            )
        };
        return missing(format!(
            "driver found: {}; no Alveo board{seen}",
            driver(&install)
        ));
    }
    // A board is usable in this process only if XRT's environment is set (else XRT aborts).
    if let Err(e) = env(opts).check(&install) {
        return missing(format!(
            "{} board(s) found by {}, but not usable here: {}",
            boards.len(),
            driver(&install),
            reason(e)
        ));
    }
    let found = boards
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let mut details = vec![
                ("driver".into(), driver(&install)),
                ("board".into(), format!("XRT device {}", b.index)),
                (
                    "loaded xclbin".into(),
                    b.xclbin_uuid.clone().unwrap_or_else(|| "none".into()),
                ),
                (
                    "xclbins".into(),
                    opts.xclbin_dir.as_ref().map_or_else(
                        || "TANDEM_XCLBIN_DIR is not set".into(),
                        |d| d.display().to_string(),
                    ),
                ),
            ];
            if !pci.is_empty() {
                details.push(("pci".into(), pci_text.clone()));
            }
            let card = CardInfo {
                kind: DeviceKind::FpgaXrt,
                index: i,
                name: format!("Alveo board (XRT device {})", b.index),
                // XRT's C API does not report bank sizes; the banks are the xclbin's.
                memory_bytes: 0,
                details,
            };
            Arc::new(FpgaBackend::new(card, opts.clone(), xrt_factory(b.index))) as Arc<dyn Backend>
        })
        .collect();
    (found, Vec::new())
}

/// The factory of cards on board `index`: loads XRT (refusing an environment XRT would abort
/// over) and opens the board; its kernels are found as `<TANDEM_XCLBIN_DIR>/<kernel>.xclbin`.
pub fn xrt_factory(index: u32) -> OpenDevice {
    Box::new(move |o: &FpgaOptions| {
        let xrt = Xrt::load(&search(o), &env(o))?;
        let cfg = XrtCardConfig {
            board: BoardId::Index(index),
            clock_mhz: o.clock_mhz,
            xclbin_dir: o.xclbin_dir.clone(),
        };
        Ok(Box::new(XrtCard::open(xrt, cfg)?) as Box<dyn FpgaDevice>)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_xrt_is_one_missing_entry_with_the_reason() {
        let empty = std::env::temp_dir().join(format!("tandem-no-xrt-{}", std::process::id()));
        std::fs::create_dir_all(&empty).expect("dir");
        let opts = FpgaOptions {
            xrt_lib: Some(empty.clone()),
            xrt_probe: Some(PathBuf::from("/nonexistent/tandem")),
            ..FpgaOptions::default()
        };
        let (found, missing) = discover(&opts);
        assert!(found.is_empty());
        assert_eq!(missing.len(), 1);
        assert_eq!(missing[0].kind, DeviceKind::FpgaXrt);
        assert!(
            missing[0].reason.contains("XRT not found"),
            "{}",
            missing[0].reason
        );
        let _ = std::fs::remove_dir(&empty);
    }

    #[test]
    fn a_failing_probe_program_is_a_reason_not_a_crash() {
        if XrtInstall::find(&XrtSearch::default()).is_err() {
            println!("SKIP: XRT is not installed");
            return;
        }
        let cache = std::env::temp_dir().join(format!("tandem-xrt-probe-{}", std::process::id()));
        let opts = FpgaOptions {
            sim_cache: cache.join("sim"),
            xrt_probe: Some(PathBuf::from("/nonexistent/tandem")),
            ..FpgaOptions::default()
        };
        let (found, missing) = discover(&opts);
        assert!(found.is_empty());
        assert!(
            missing[0].reason.contains("cannot start the XRT probe"),
            "{}",
            missing[0].reason
        );
        let _ = std::fs::remove_dir_all(&cache);
    }

    #[test]
    fn the_factory_refuses_an_environment_xrt_would_abort_over() {
        if XrtInstall::find(&XrtSearch::default()).is_err() {
            println!("SKIP: XRT is not installed");
            return;
        }
        let e = match xrt_factory(0)(&FpgaOptions::default()) {
            Ok(_) => panic!("XILINX_XRT is unset in these options"),
            Err(e) => e,
        };
        assert!(e.to_string().contains("XILINX_XRT is not set"), "{e}");
    }
}
