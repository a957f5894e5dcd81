//! The XRT driver without a board: finding XRT, the probe that cannot take the process down
//! (no XRT, XRT without XILINX_XRT, no board), and the clear errors of the in-process driver.
//!
//! XRT runs in child processes here: this test binary re-runs itself on one of the `#[ignore]`d
//! `child_*` tests, with the environment XRT reads set by the parent (the process's own
//! environment is never changed).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tandem_fpga::FpgaError;
use tandem_fpga::xrt::probe::{self, PROBE_MARK};
use tandem_fpga::xrt::{BoardId, Xrt, XrtCard, XrtCardConfig, XrtEnv, XrtInstall, XrtSearch};

/// This test binary, running only the ignored test `name`.
fn child(name: &str) -> Command {
    let exe = std::env::current_exe().expect("test binary");
    let mut c = Command::new(exe);
    c.args([
        "--exact",
        name,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    c
}

fn installed() -> Option<XrtInstall> {
    match XrtInstall::find(&XrtSearch::default()) {
        Ok(i) => Some(i),
        Err(e) => {
            println!("SKIP: {e}");
            None
        }
    }
}

/// The probe's child side: the last argument is the library (see `probe::run_child`).
#[test]
#[ignore = "run by the probe tests in a child process"]
fn child_probe() {
    let lib = std::env::args()
        .next_back()
        .map(PathBuf::from)
        .expect("library argument");
    std::process::exit(probe::child_main(&lib));
}

#[test]
fn no_xrt_is_a_reason_not_a_crash() {
    let empty = tempfile::tempdir().expect("temp dir");
    let search = XrtSearch {
        xilinx_xrt: None,
        only: Some(empty.path().to_path_buf()),
    };
    let e = probe::probe(&search, empty.path(), child("child_probe")).expect_err("no XRT there");
    let msg = e.to_string();
    assert!(matches!(e, FpgaError::Unavailable { .. }), "{msg}");
    assert!(msg.contains("XRT not found"), "{msg}");
    assert!(msg.contains(&empty.path().display().to_string()), "{msg}");
    assert!(msg.contains("apt-get install"), "{msg}");
    // The in-process loader says the same.
    let e = Xrt::load(&search, &XrtEnv::default()).expect_err("no XRT there");
    assert!(e.to_string().contains("XRT not found"), "{e}");
}

#[test]
fn xrt_without_xilinx_xrt_aborts_only_the_child() {
    let Some(install) = installed() else { return };
    // What XRT 2.13 does without XILINX_XRT: it throws "XILINX_XRT not set" out of its C API,
    // which aborts the child (SIGABRT); the parent reports it and goes on.
    let mut c = child("child_probe");
    c.env_remove("XILINX_XRT");
    let err = probe::run_child(&install, None, c, Duration::from_secs(60))
        .expect_err("XRT aborts without XILINX_XRT");
    assert!(err.contains("SIGABRT"), "{err}");
    assert!(err.contains("no report"), "{err}");
    // A prefix without the shim library: XRT throws a C++ exception through its C API, which
    // ends the (child) process too.
    let empty = tempfile::tempdir().expect("temp dir");
    let err = probe::run_child(
        &install,
        Some(empty.path()),
        child("child_probe"),
        Duration::from_secs(60),
    )
    .expect_err("XRT aborts without its shim");
    assert!(err.contains("SIGABRT"), "{err}");
    // In process, the loader refuses before any XRT call, naming the variable and a fix.
    let e = Xrt::load(&XrtSearch::default(), &XrtEnv::default()).expect_err("no XILINX_XRT");
    let msg = e.to_string();
    assert!(msg.contains("XILINX_XRT is not set"), "{msg}");
    assert!(msg.contains("export XILINX_XRT="), "{msg}");
    let env = XrtEnv {
        xilinx_xrt: Some(empty.path().to_path_buf()),
        ..XrtEnv::default()
    };
    let e = Xrt::load(&XrtSearch::default(), &env).expect_err("prefix without the shim");
    assert!(e.to_string().contains("has no lib/libxrt_core.so.2"), "{e}");
}

#[test]
fn no_board_is_listed_as_none_with_the_version() {
    let Some(install) = installed() else { return };
    let cache = tempfile::tempdir().expect("temp dir");
    let report = probe::probe(&XrtSearch::default(), cache.path(), child("child_probe"))
        .expect("XRT is installed");
    assert_eq!(report.install, install);
    assert!(report.prefix.join("lib/libxrt_core.so.2").is_file());
    let boards = report.boards.expect("the probe ran");
    if !report.pci.is_empty() || !boards.is_empty() {
        println!(
            "SKIP: this machine has a board: {boards:?} {:?}",
            report.pci
        );
        return;
    }
    assert!(boards.is_empty());
    let v = install
        .version
        .expect("version from the library's file name");
    assert!(v.starts_with("2."), "{v}");
}

#[test]
fn emulation_without_vitis_is_refused_before_xrt_ends_the_process() {
    let Some(install) = installed() else { return };
    let cache = tempfile::tempdir().expect("temp dir");
    let prefix = install.make_prefix(cache.path()).expect("prefix");
    let env = XrtEnv {
        xilinx_xrt: Some(prefix),
        emulation: Some("sw_emu".into()),
        xilinx_vitis: Some(cache.path().to_path_buf()),
    };
    let e = env
        .check(&install)
        .expect_err("no Vitis device process here");
    let msg = e.to_string();
    assert!(msg.contains("genericpciemodel"), "{msg}");
    assert!(msg.contains("Vitis"), "{msg}");
    let env = XrtEnv {
        emulation: Some("hw".into()),
        ..env
    };
    let e = env.check(&install).expect_err("not a mode");
    assert!(e.to_string().contains("sw_emu or hw_emu"), "{e}");
}

/// In-process driver errors, run in a child whose XILINX_XRT the parent set.
#[test]
#[ignore = "run by `driver_errors_are_clear` in a child process"]
#[allow(clippy::disallowed_methods)] // reads the XILINX_XRT its parent test set for it
fn child_driver_errors() {
    let env = XrtEnv {
        xilinx_xrt: std::env::var_os("XILINX_XRT").map(PathBuf::from),
        ..XrtEnv::default()
    };
    let xrt = Xrt::load(&XrtSearch::default(), &env).expect("XRT loads with XILINX_XRT set");
    // No board: a clear Unavailable naming the board and XRT's version.
    let cfg = XrtCardConfig {
        board: BoardId::Index(0),
        clock_mhz: None,
        xclbin_dir: None,
    };
    let e = XrtCard::open(xrt.clone(), cfg).expect_err("no board on this machine");
    let msg = e.to_string();
    assert!(matches!(e, FpgaError::Unavailable { .. }), "{msg}");
    assert!(msg.contains("no Alveo board at xrt:0"), "{msg}");
    assert!(msg.contains("XRT 2."), "{msg}");
    let cfg = XrtCardConfig {
        board: BoardId::Bdf("0000:ff:00.1".into()),
        clock_mhz: None,
        xclbin_dir: None,
    };
    let e = XrtCard::open(xrt.clone(), cfg).expect_err("no board there");
    assert!(
        e.to_string().contains("no Alveo board at xrt:0000:ff:00.1"),
        "{e}"
    );
    // An xclbin XRT cannot read: a Load error naming the file.
    let dir = tempfile::tempdir().expect("temp dir");
    let bad = dir.path().join("bad.xclbin");
    std::fs::write(&bad, b"not an xclbin").expect("write");
    let e = tandem_fpga::xrt::xclbin_handle::XrtXclbin::open(xrt.clone(), &bad)
        .expect_err("corrupt xclbin");
    assert!(matches!(e, FpgaError::Load { .. }), "{e}");
    assert!(e.to_string().contains("bad.xclbin"), "{e}");
    let e = tandem_fpga::xrt::xclbin_handle::XrtXclbin::open(xrt, &dir.path().join("none.xclbin"))
        .expect_err("missing xclbin");
    assert!(e.to_string().contains("no such xclbin file"), "{e}");
    println!("child_driver_errors: ok");
}

#[test]
fn driver_errors_are_clear() {
    let Some(install) = installed() else { return };
    let cache = tempfile::tempdir().expect("temp dir");
    let prefix = install.make_prefix(cache.path()).expect("prefix");
    let out = child("child_driver_errors")
        .env("XILINX_XRT", &prefix)
        .env_remove("XCL_EMULATION_MODE")
        .output()
        .expect("run the child");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed: {text}");
    assert!(
        text.contains("child_driver_errors: ok"),
        "the child test did not run: {text}"
    );
}

#[test]
fn pci_scan_reads_xilinx_functions_from_sysfs() {
    // A sysfs tree made by hand: one Xilinx function with a platform name, one other vendor.
    let root = tempfile::tempdir().expect("temp dir");
    let dev = |bdf: &str, vendor: &str| {
        let d = root.path().join(bdf);
        std::fs::create_dir_all(&d).expect("dir");
        std::fs::write(d.join("vendor"), format!("{vendor}\n")).expect("vendor");
        std::fs::write(d.join("device"), "0x505c\n").expect("device");
        d
    };
    let x = dev("0000:65:00.1", "0x10ee");
    std::fs::create_dir_all(x.join("rom.u.1")).expect("rom");
    std::fs::write(x.join("rom.u.1/VBNV"), "xilinx_u55c_gen3x16_xdma_base_3\n").expect("vbnv");
    dev("0000:01:00.0", "0x10de");
    let found = probe::pci_boards(root.path());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].bdf, "0000:65:00.1");
    assert_eq!(
        found[0].platform.as_deref(),
        Some("xilinx_u55c_gen3x16_xdma_base_3")
    );
    assert!(probe::pci_boards(Path::new("/nonexistent")).is_empty());
    let _ = PROBE_MARK;
}
