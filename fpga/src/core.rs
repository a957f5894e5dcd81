//! The kernel core interface: what a kernel's datapath must look like to plug into the
//! Vitis RTL shell ([`crate::shell`]).
//!
//! A *core* is one Verilog module named `<kernel>_core` (for example `router_core`), written
//! as a rust-hdl `LogicBlock` and turned into Verilog with [`core_verilog_from_block`] (or
//! written directly as Verilog text by Rust code). The shell owns everything a Vitis kernel
//! needs around it (AXI4-Lite control registers, ap_ctrl_hs, AXI4 bursts, interrupt) and talks
//! to the core only through the ports below. All signals are synchronous to `clock`.
//!
//! | port | dir | width | meaning |
//! | --- | --- | --- | --- |
//! | `clock` | in | 1 | `ap_clk` |
//! | `reset` | in | 1 | synchronous, active high (`!ap_rst_n`); may arrive in the middle of a run |
//! | `start` | in | 1 | one-cycle pulse: run once with the current `arg*` / `ptr*` |
//! | `done` | out | 1 | one-cycle pulse: the core has handed its last write beat to `wr_data` |
//! | `busy` | out | 1 | high from the cycle after `start` until `done` |
//! | `arg0`..`arg7` | in | 32 | scalar arguments, stable from `start` to `done` |
//! | `ptr0`..`ptr7` | in | 64 | pointer arguments (device byte addresses), stable from `start` to `done` |
//! | `rd_req_valid` / `rd_req_ready` | out / in | 1 | read request handshake |
//! | `rd_req_addr` | out | 64 | byte address of the first word, 8-byte aligned |
//! | `rd_req_len` | out | 32 | number of 64-bit words to read, >= 1 |
//! | `rd_data_valid` / `rd_data_ready` | in / out | 1 | read data handshake |
//! | `rd_data` | in | 64 | next word; little endian (byte `addr` in bits 7:0) |
//! | `wr_req_valid` / `wr_req_ready` | out / in | 1 | write request handshake |
//! | `wr_req_addr` | out | 64 | byte address of the first word, 8-byte aligned |
//! | `wr_req_len` | out | 32 | number of 64-bit words that will follow on `wr_data`, >= 1 |
//! | `wr_data_valid` / `wr_data_ready` | out / in | 1 | write data handshake |
//! | `wr_data` | out | 64 | next word |
//! | `wr_strb` | out | 8 | byte enables of `wr_data` |
//!
//! Rules:
//! - A handshake happens on a rising edge where `valid && ready`. `valid` must not depend
//!   combinationally on `ready` of the same channel.
//! - Reads: the shell serves read requests in order and returns exactly `len` words for each,
//!   in order; it may accept a second request before the first one's data has all arrived.
//!   The core may hold `rd_data_ready` low (back pressure) for as long as it likes.
//! - Writes: after a write request is accepted the core sends exactly `len` words on
//!   `wr_data` before the words of the next request. The shell splits requests into AXI
//!   INCR bursts (never crossing a `max_burst`*8-byte boundary, so never a 4 KiB one).
//! - `done`: the shell raises `ap_done` only after `done` *and* once every write burst has
//!   received its B response, so a core need not count write responses.
//! - Argument slots: the kernel's arguments ([`crate::regmap::KernelDesc`]) are numbered in
//!   order of appearance within their kind: the first scalar argument drives `arg0`, the
//!   first pointer argument `ptr0`, and so on. Unused inputs are driven with 0.
//!
//! A core written as a rust-hdl block has exactly these fields (`Signal<In, Clock>` for
//! `clock`, `Signal<In, Bit>` / `Signal<Out, Bit>` for one-bit ports, `Signal<_, Bits<N>>`
//! otherwise). [`core_verilog_from_block`] generates its Verilog, renames the rust-hdl
//! `top` module to `<kernel>_core` and checks the port list against [`CORE_PORTS`].

use std::fmt;
use std::fmt::Write as _;

use rust_hdl::prelude::*;

use crate::regmap::KernelDesc;

/// Number of scalar argument ports (`arg0`..`arg7`).
pub const NUM_SCALARS: usize = 8;
/// Number of pointer argument ports (`ptr0`..`ptr7`).
pub const NUM_POINTERS: usize = 8;

/// Direction of a core port, seen from the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortDir {
    /// Driven by the shell.
    In,
    /// Driven by the core.
    Out,
}

/// One port of the core contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorePort {
    /// Verilog name.
    pub name: String,
    /// Direction seen from the core.
    pub dir: PortDir,
    /// Width in bits.
    pub width: usize,
}

/// Data widths of the core's read/write ports (and the shell's `m_axi_gmem`) a kernel may
/// build with: 64 (every kernel's default) and the wider AXI widths Vitis uses (512 is its
/// default for `m_axi` on the card).
pub const DATA_BITS: &[u32] = &[64, 128, 256, 512];

/// Every port a core has, in a fixed order, with 64-bit data ports (see [`core_ports_w`]).
pub fn core_ports() -> Vec<CorePort> {
    core_ports_w(64)
}

/// Every port a core with `data_bits`-bit `rd_data` / `wr_data` (and `data_bits / 8` bits of
/// `wr_strb`) has, in a fixed order.
pub fn core_ports_w(data_bits: usize) -> Vec<CorePort> {
    use PortDir::{In, Out};
    let mut v = Vec::new();
    let mut p = |name: &str, dir, width| {
        v.push(CorePort {
            name: name.to_string(),
            dir,
            width,
        })
    };
    p("clock", In, 1);
    p("reset", In, 1);
    p("start", In, 1);
    p("done", Out, 1);
    p("busy", Out, 1);
    for i in 0..NUM_SCALARS {
        p(&format!("arg{i}"), In, 32);
    }
    for i in 0..NUM_POINTERS {
        p(&format!("ptr{i}"), In, 64);
    }
    p("rd_req_valid", Out, 1);
    p("rd_req_ready", In, 1);
    p("rd_req_addr", Out, 64);
    p("rd_req_len", Out, 32);
    p("rd_data_valid", In, 1);
    p("rd_data_ready", Out, 1);
    p("rd_data", In, data_bits);
    p("wr_req_valid", Out, 1);
    p("wr_req_ready", In, 1);
    p("wr_req_addr", Out, 64);
    p("wr_req_len", Out, 32);
    p("wr_data_valid", Out, 1);
    p("wr_data_ready", In, 1);
    p("wr_data", Out, data_bits);
    p("wr_strb", Out, data_bits / 8);
    v
}

/// Names of the contract's ports (see [`core_ports`]).
pub const CORE_PORTS: &[&str] = &[
    "clock",
    "reset",
    "start",
    "done",
    "busy",
    "arg0..arg7",
    "ptr0..ptr7",
    "rd_req_valid",
    "rd_req_ready",
    "rd_req_addr",
    "rd_req_len",
    "rd_data_valid",
    "rd_data_ready",
    "rd_data",
    "wr_req_valid",
    "wr_req_ready",
    "wr_req_addr",
    "wr_req_len",
    "wr_data_valid",
    "wr_data_ready",
    "wr_data",
    "wr_strb",
];

/// Errors while producing a core's Verilog.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// rust-hdl's checks (connectivity, logic loops, writes to inputs) failed.
    #[error("core {module}: rust-hdl check failed: {msg}")]
    Check {
        /// Module being generated.
        module: String,
        /// rust-hdl's message.
        msg: String,
    },
    /// The module's ports do not match the contract.
    #[error("core {module}: port list does not match the core contract: {msg}")]
    Ports {
        /// Module being generated.
        module: String,
        /// What differs.
        msg: String,
    },
    /// The kernel's parameters are out of range.
    #[error("kernel {kernel}: bad parameter: {msg}")]
    Param {
        /// Kernel.
        kernel: String,
        /// What is wrong and what is accepted.
        msg: String,
    },
}

/// A kernel datapath that plugs into the shell: its name, arguments, parameters and Verilog.
///
/// Implemented by `kernels::router::RouterCore` (and the GEMM and attention cores). Everything
/// the emitter, the simulator and the host need about a kernel comes from here.
pub trait KernelCore: fmt::Debug + Send + Sync {
    /// Kernel name, lower case (`router`): the core module is `<name>_core` and the packaged
    /// top `<name>`.
    fn name(&self) -> &str;

    /// The kernel's arguments (registers from 0x10) and its memory interface.
    fn desc(&self) -> KernelDesc;

    /// Build parameters as key/value pairs, written to the manifest (and hashed into the
    /// simulator's cache key).
    fn params(&self) -> Vec<(String, i64)>;

    /// Verilog of the module `<name>_core` (and any modules it instantiates, whose names
    /// must start with `<name>_core`).
    fn core_verilog(&self) -> Result<String, CoreError>;

    /// Width in bits of the core's `rd_data` / `wr_data` ports, which the shell's
    /// `m_axi_gmem` data bus follows: one of [`DATA_BITS`]; 64 unless the kernel says
    /// otherwise. Requests then count beats of `data_bits / 8` bytes, at addresses aligned
    /// to that many bytes.
    fn data_bits(&self) -> u32 {
        64
    }
}

/// Generates the Verilog of a rust-hdl block that follows the core contract, as the module
/// `module_name` (submodules become `module_name$child`), after rust-hdl's own checks.
pub fn core_verilog_from_block<B: Block>(
    block: &mut B,
    module_name: &str,
) -> Result<String, CoreError> {
    block.connect_all();
    check_all(block).map_err(|e| CoreError::Check {
        module: module_name.to_string(),
        msg: format!("{e:?}"),
    })?;
    let v = generate_verilog_unchecked(block);
    let v = rename_top(&v, module_name);
    check_core_ports(&v, module_name)?;
    Ok(v)
}

/// Renames rust-hdl's `top` module (and its `top$...` submodules) to `name`.
pub fn rename_top(verilog: &str, name: &str) -> String {
    verilog
        .replace("module top(", &format!("module {name}("))
        .replace("module top$", &format!("module {name}$"))
        .replace("endmodule // top", &format!("endmodule // {name}"))
        .replace("\ntop$", &format!("\n{name}$"))
        .replace(" top$", &format!(" {name}$"))
}

/// Checks that `module` in `verilog` declares exactly the contract's ports with the right
/// directions and widths (64-bit data ports).
pub fn check_core_ports(verilog: &str, module: &str) -> Result<(), CoreError> {
    check_core_ports_w(verilog, module, 64)
}

/// [`check_core_ports`] for a core with `data_bits`-bit data ports.
pub fn check_core_ports_w(verilog: &str, module: &str, data_bits: usize) -> Result<(), CoreError> {
    let err = |msg: String| CoreError::Ports {
        module: module.to_string(),
        msg,
    };
    let header = format!("module {module}(");
    let start = verilog
        .find(&header)
        .ok_or_else(|| err(format!("no `{header}` in the Verilog")))?;
    let body = &verilog[start..];
    let end = body
        .find("endmodule")
        .ok_or_else(|| err("no endmodule".into()))?;
    let body = &body[..end];
    // Declarations in either style: ANSI (`input wire [63:0] a, ...` in the header) or
    // rust-hdl's (`input wire [63:0] a;` one per line).
    let decls: Vec<(String, String, usize)> = body
        .split([',', ';', '\n', '(', ')'])
        .filter_map(|d| {
            let d = d.trim();
            let dir = ["input", "output"].into_iter().find(|k| d.starts_with(k))?;
            let name = d.split_whitespace().last()?.to_string();
            let width = d
                .find('[')
                .and_then(|a| d[a + 1..].find(':').map(|b| &d[a + 1..a + 1 + b]))
                .and_then(|s| s.trim().parse::<usize>().ok())
                .map_or(1, |msb| msb + 1);
            Some((dir.to_string(), name, width))
        })
        .collect();
    for p in core_ports_w(data_bits) {
        let dir = match p.dir {
            PortDir::In => "input",
            PortDir::Out => "output",
        };
        let found = decls
            .iter()
            .any(|(d, n, w)| d == dir && *n == p.name && *w == p.width);
        if !found {
            return Err(err(format!(
                "missing `{dir} [{}:0] {}`",
                p.width.saturating_sub(1),
                p.name
            )));
        }
    }
    Ok(())
}

/// The module header of a text core: the contract's ports ([`core_ports`]) in the
/// order and widths the shell expects, one declaration per line; outputs are `reg` except
/// those named in `wire_outputs`.
pub(crate) fn core_header(module: &str, wire_outputs: &[&str]) -> String {
    core_header_w(module, wire_outputs, 64)
}

/// [`core_header`] with `data_bits`-bit data ports.
pub(crate) fn core_header_w(module: &str, wire_outputs: &[&str], data_bits: usize) -> String {
    let ports = core_ports_w(data_bits);
    let names: Vec<&str> = ports.iter().map(|p| p.name.as_str()).collect();
    let mut s = format!("module {module}({});\n", names.join(", "));
    for p in &ports {
        let range = if p.width > 1 {
            format!("[{}:0] ", p.width - 1)
        } else {
            String::new()
        };
        let kind = match p.dir {
            PortDir::In => "input wire",
            PortDir::Out if wire_outputs.contains(&p.name.as_str()) => "output wire",
            PortDir::Out => "output reg",
        };
        let _ = writeln!(s, "{kind} {range}{};", p.name);
    }
    s
}

/// Bits needed to address `n` entries (at least 1).
pub(crate) fn clog2(n: u32) -> u32 {
    if n <= 1 {
        1
    } else {
        32 - (n - 1).leading_zeros()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_has_expected_size() {
        let ports = core_ports();
        assert_eq!(ports.len(), 5 + NUM_SCALARS + NUM_POINTERS + 15);
        assert!(
            ports
                .iter()
                .any(|p| p.name == "wr_strb" && p.width == 8 && p.dir == PortDir::Out)
        );
    }

    #[test]
    fn port_check_rejects_missing_port() {
        let v = "module foo(clock);\ninput wire clock;\nendmodule // foo\n";
        let e = check_core_ports(v, "foo").expect_err("reset is missing");
        assert!(e.to_string().contains("reset"), "{e}");
    }
}
