//! The CPU emulations of sm80/moe_experts.cu, common/attention_decode.cu and the fused
//! routing kernel of common/moe_route.cu (gpu-kernels/emu:
//! the .cu compiled by g++ with the PTX wrappers replaced by stand-ins of their fragment
//! layouts, warp shuffles and cp.async), run against their double-precision references on
//! every tile or row block and both storage precisions, so the kernels' logic is checked in CI
//! where no GPU is. Needs g++ (C++20, <barrier>); says it skipped otherwise.

use std::path::Path;
use std::process::Command;

fn gxx_present() -> bool {
    Command::new("g++")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs `emu/{script}` (the MoE experts' `run.sh`, the decode attention's `run_decode.sh`).
fn run_emu(script: &str, eager: bool, cases: Option<u32>) {
    run_emu_with(script, eager, cases, &[], "all passed");
}

/// Runs `emu/{script}` with extra environment, expecting `done` in its output at the end.
fn run_emu_with(script: &str, eager: bool, cases: Option<u32>, env: &[(&str, &str)], done: &str) {
    if !gxx_present() {
        println!("skipped: g++ not found (apt-get install g++)");
        return;
    }
    let dir = scratch_dir(script, if eager { "eager" } else { "deferred" });
    // cargo runs a test from its crate folder (and so does the GPU bundle).
    let script = Path::new("emu").join(script);
    let script = script.as_path();
    let mut cmd = Command::new("bash");
    cmd.arg(script).env("EMU_OUT", &dir);
    if eager {
        cmd.env("EMU_EAGER", "1");
    }
    if let Some(n) = cases {
        cmd.env("EMU_CASES", n.to_string());
    }
    cmd.envs(env.iter().copied());
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
        text.contains(done) && oks > 0,
        "no passing case reported:\n{text}"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("FAIL")),
        "a case failed:\n{text}"
    );
    println!("{oks} emulated launches within bounds");
}

/// A scratch folder of this process, script and mode (the tests run at once).
fn scratch_dir(script: &str, mode: &str) -> std::path::PathBuf {
    let name = script.trim_end_matches(".sh");
    let d = std::env::temp_dir().join(format!("tandem-emu-{name}-{}-{mode}", std::process::id()));
    let _ = std::fs::create_dir_all(&d);
    d
}

#[test]
fn moe_experts_kernels_emulated_with_deferred_copies() {
    run_emu("run.sh", false, None);
}

#[test]
fn moe_experts_kernels_emulated_with_eager_copies() {
    run_emu("run.sh", true, Some(2));
}

/// Every case of decode_main.cpp: d 64/128/256, row blocks 1/2/4/8, contiguous and paged
/// (block sizes 1 to 128), empty chunks, bad lengths and block ids.
#[test]
fn attention_decode_kernels_emulated_with_deferred_copies() {
    run_emu("run_decode.sh", false, None);
}

/// The first four cases (among them 11 tiles a chunk, so every stage is refilled) with the
/// copies landing at once and the odd warps slowed: a stage refilled while a warp still reads
/// it shows.
#[test]
fn attention_decode_kernels_emulated_with_eager_copies() {
    run_emu("run_decode.sh", true, Some(4));
}

/// The fused routing kernel as shipped (self-resetting barrier, 16 warps a block): one process
/// a block, one thread a CUDA thread, against a plain reference: ids, counts, offsets and the
/// permutation exact (ties, one expert taking every token, idle blocks, k past 32, E 256),
/// weights within 1e-5.
#[test]
fn moe_route_fused_kernel_emulated() {
    run_emu_with(
        "route_run.sh",
        false,
        None,
        &[("EMU_ROUTE_MODES", "1")],
        "all cases passed",
    );
}
