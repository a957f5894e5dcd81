//! The CPU emulation of sm80/moe_experts.cu (gpu-kernels/emu: the .cu compiled by g++ with
//! the PTX wrappers replaced by stand-ins of their fragment layouts), run against its
//! double-precision reference on every tile and both storage precisions, so the kernels' logic
//! is checked in CI where no GPU is. Needs g++ (C++20, <barrier>); says it skipped otherwise.

use std::path::Path;
use std::process::Command;

fn gxx_present() -> bool {
    Command::new("g++")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn run_emu(eager: bool, cases: Option<u32>) {
    if !gxx_present() {
        println!("skipped: g++ not found (apt-get install g++)");
        return;
    }
    let dir = scratch_dir(if eager { "eager" } else { "deferred" });
    // cargo runs a test from its crate folder (and so does the GPU bundle).
    let script = Path::new("emu/run.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(script).env("EMU_OUT", &dir);
    if eager {
        cmd.env("EMU_EAGER", "1");
    }
    if let Some(n) = cases {
        cmd.env("EMU_CASES", n.to_string());
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "emulation failed:\n{text}");
    let oks = text.lines().filter(|l| l.starts_with("ok ")).count();
    assert!(
        text.contains("all passed") && oks > 0,
        "no passing case reported:\n{text}"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("FAIL")),
        "a case failed:\n{text}"
    );
    println!("{oks} emulated launches within bounds");
}

/// A scratch folder of this process and mode (the two tests run at once).
fn scratch_dir(mode: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-moe-emu-{}-{mode}", std::process::id()));
    let _ = std::fs::create_dir_all(&d);
    d
}

#[test]
fn moe_experts_kernels_emulated_with_deferred_copies() {
    run_emu(false, None);
}

#[test]
fn moe_experts_kernels_emulated_with_eager_copies() {
    run_emu(true, Some(2));
}
