//! The emitted Verilog passes `verilator --lint-only -Wall` and yosys `synth_xilinx`
//! (skipped, with a message, where the tools are missing).

use std::process::Command;

use tandem_fpga::kernels::router::RouterCore;
use tandem_fpga::shell::ShellConfig;

fn have(tool: &str) -> bool {
    Command::new(tool).arg("-V").output().is_ok()
        || Command::new(tool).arg("--version").output().is_ok()
}

fn emit_router(dir: &std::path::Path) -> tandem_fpga::emit::Emitted {
    emit_router_lanes(dir, 4, 64)
}

fn emit_router_lanes(
    dir: &std::path::Path,
    lanes: u32,
    data_bits: u32,
) -> tandem_fpga::emit::Emitted {
    let core = RouterCore {
        e_max: 16,
        k_max: 4,
        lanes,
        data_bits,
    };
    tandem_fpga::emit::emit(&core, ShellConfig { max_burst: 16 }, dir).expect("emit")
}

#[test]
fn emitted_files_agree() {
    let d = tempfile::tempdir().expect("tempdir");
    let e = emit_router(d.path());
    let v = std::fs::read_to_string(&e.verilog).expect("verilog");
    let x = std::fs::read_to_string(&e.kernel_xml).expect("xml");
    for s in &e.manifest.args {
        // the same offset decoded in the RTL and declared in kernel.xml
        assert!(
            v.contains(&format!("12'h{:03x}:", s.offset)),
            "{}",
            s.arg.name
        );
        assert!(x.contains(&format!("offset=\"0x{:X}\"", s.offset)));
    }
    for p in [
        "ap_clk",
        "ap_rst_n",
        "s_axi_control_awaddr",
        "m_axi_gmem_araddr",
        "interrupt",
    ] {
        assert!(v.contains(p), "{p}");
    }
}

/// Waivers: DECLFILENAME (several modules in one file, with `$` in rust-hdl's module
/// names) and SYMRSVDWORD (`interrupt`, a C++ word, is the port name Vitis requires).
pub const LINT_WAIVERS: &[&str] = &["-Wno-DECLFILENAME", "-Wno-SYMRSVDWORD"];

#[test]
fn verilator_lint_is_clean() {
    if !have("verilator") {
        println!("skipped: verilator not found (apt-get install verilator)");
        return;
    }
    // every lane count on its narrowest port, and narrower lane counts on the wider ports
    // (a word then holds several groups)
    let builds = tandem_fpga::kernels::router::ROUTER_LANES
        .iter()
        .map(|&l| (l, RouterCore::data_bits_for(l)))
        .chain([(4, 128), (1, 128), (8, 256), (2, 256)]);
    for (lanes, bits) in builds {
        let d = tempfile::tempdir().expect("tempdir");
        let e = emit_router_lanes(d.path(), lanes, bits);
        let v = std::fs::read_to_string(&e.verilog).expect("verilog");
        assert!(
            v.contains(&format!("input wire [{}:0] rd_data", bits - 1)),
            "lanes {lanes}, {bits} bits: the core's read port"
        );
        let out = Command::new("verilator")
            .args(["--lint-only", "-Wall"])
            .args(LINT_WAIVERS)
            .args(["--top-module", "router"])
            .arg(&e.verilog)
            .output()
            .expect("run verilator");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !err.contains("%Warning"),
            "lanes {lanes}, {bits} bits: {err}"
        );
    }
}

#[test]
fn yosys_synth_xilinx_succeeds() {
    if !have("yosys") {
        println!("skipped: yosys not found (apt-get install yosys)");
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    let e = emit_router(d.path());
    let r = tandem_fpga::synth::synth(&e.verilog, "router").expect("synth");
    println!("router e_max=16 k_max=4: {r:?}");
    assert!(r.lut > 100 && r.ff > 100, "{r:?}");
}

/// The GEMM kernel with 8 lanes (64-bit port) and with wider ports (16..64 lanes, 128- to
/// 512-bit `m_axi_gmem`) lints clean, and the shell's AXI data bus follows the core's width.
#[test]
fn wide_gemm_builds_lint_clean() {
    use tandem_fpga::kernels::gemm::{GEMM_LANES, GemmCore};
    if !have("verilator") {
        println!("skipped: verilator not found (apt-get install verilator)");
        return;
    }
    for lanes in GEMM_LANES {
        let core = GemmCore {
            rows: 3,
            k_max: 2 * lanes,
            n_max: 2 * lanes,
            lanes,
            w_ports: false,
        };
        let d = tempfile::tempdir().expect("tempdir");
        let e =
            tandem_fpga::emit::emit(&core, ShellConfig { max_burst: 16 }, d.path()).expect("emit");
        let v = std::fs::read_to_string(&e.verilog).expect("verilog");
        let bits = 8 * lanes;
        for port in ["m_axi_gmem_rdata", "m_axi_gmem_wdata"] {
            assert!(
                v.contains(&format!("[{}:0] {port}", bits - 1)),
                "lanes {lanes}: {port} is not {bits} bits"
            );
        }
        assert!(v.contains(&format!("[{}:0] m_axi_gmem_wstrb", bits / 8 - 1)));
        let out = Command::new("verilator")
            .args(["--lint-only", "-Wall"])
            .args(LINT_WAIVERS)
            .args(["--top-module", "gemm"])
            .arg(&e.verilog)
            .output()
            .expect("run verilator");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !err.contains("%Warning"),
            "lanes {lanes}: {err}"
        );
    }
}

/// A burst of `max_burst` beats may not cross 4 KiB: at 512 bits at most 64 beats.
#[test]
fn wide_port_limits_the_burst() {
    use tandem_fpga::kernels::gemm::GemmCore;
    let core = GemmCore {
        rows: 2,
        k_max: 128,
        n_max: 128,
        lanes: 64,
        w_ports: false,
    };
    let err = tandem_fpga::shell::kernel_verilog(&core, ShellConfig { max_burst: 128 })
        .expect_err("128 beats of 64 bytes cross 4 KiB");
    assert!(err.to_string().contains("4 KiB"), "{err}");
    tandem_fpga::shell::kernel_verilog(&core, ShellConfig { max_burst: 64 }).expect("64 beats");
}
