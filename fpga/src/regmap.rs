//! The one Rust description of a kernel's arguments. It yields the register offsets the
//! shell's control block decodes, the `kernel.xml` that Vitis packages, and the offsets the
//! host writes, so the three can never disagree.
//!
//! Register map (ap_ctrl_hs), as Vitis expects it:
//!
//! | offset | register | bits |
//! | --- | --- | --- |
//! | 0x00 | AP_CTRL | 0 ap_start (R/W, cleared by the kernel at ap_ready), 1 ap_done (R, clear on read), 2 ap_idle (R), 3 ap_ready (R, clear on read), 7 auto_restart (R/W) |
//! | 0x04 | GIE | 0 global interrupt enable |
//! | 0x08 | IER | 0 ap_done interrupt enable, 1 ap_ready interrupt enable |
//! | 0x0C | ISR | 0 ap_done, 1 ap_ready; set by the kernel when enabled in IER, *toggled* by writing 1 |
//! | 0x10 + 8*i | argument i | a scalar in the low word; a pointer as low word (+0) and high word (+4) |

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::core::{NUM_POINTERS, NUM_SCALARS};

/// AP_CTRL register offset.
pub const REG_AP_CTRL: u32 = 0x00;
/// Global interrupt enable register offset.
pub const REG_GIE: u32 = 0x04;
/// Interrupt enable register offset.
pub const REG_IER: u32 = 0x08;
/// Interrupt status register offset (toggle on write).
pub const REG_ISR: u32 = 0x0C;
/// Offset of the first argument.
pub const REG_ARGS: u32 = 0x10;
/// Bytes between consecutive arguments.
pub const ARG_STRIDE: u32 = 8;

/// AP_CTRL bit: start.
pub const AP_START: u32 = 1 << 0;
/// AP_CTRL bit: done (clear on read).
pub const AP_DONE: u32 = 1 << 1;
/// AP_CTRL bit: idle.
pub const AP_IDLE: u32 = 1 << 2;
/// AP_CTRL bit: ready (clear on read).
pub const AP_READY: u32 = 1 << 3;
/// AP_CTRL bit: auto restart.
pub const AUTO_RESTART: u32 = 1 << 7;

/// Width of the s_axi_control address bus.
pub const CTRL_ADDR_BITS: u32 = 12;

/// Kind of a kernel argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArgKind {
    /// A 32-bit scalar (`uint`).
    Scalar,
    /// A 64-bit device address of a buffer read and/or written through one of the kernel's
    /// AXI4 masters (`m_axi_gmem`, or a read-only `m_axi_gmem1`, `m_axi_gmem2`: [`ArgDesc::port`]).
    Pointer,
}

/// One argument of a kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArgDesc {
    /// Name (as `xrt::kernel` sees it).
    pub name: String,
    /// Scalar or pointer.
    pub kind: ArgKind,
    /// C type written to kernel.xml (`uint`, `short*`, `int*` ...).
    pub c_type: String,
    /// The AXI4 master a pointer argument's buffer is reached through: 0 is `m_axi_gmem`
    /// (read and write), `i > 0` the read-only `m_axi_gmem{i}` (a stream with a memory bank
    /// of its own, bound by its own `sp=` in the link). Always 0 for scalars.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub port: u8,
}

fn is_zero(p: &u8) -> bool {
    *p == 0
}

/// Most AXI4 masters a kernel may have: `m_axi_gmem` and the read-only `m_axi_gmem1`,
/// `m_axi_gmem2`.
pub const MAX_AXI_PORTS: u8 = 3;

/// The Vitis name of AXI4 master `port` (`m_axi_gmem`, `m_axi_gmem1`, ...).
pub fn axi_port_name(port: u8) -> String {
    if port == 0 {
        "m_axi_gmem".into()
    } else {
        format!("m_axi_gmem{port}")
    }
}

impl ArgDesc {
    /// A scalar argument.
    pub fn scalar(name: &str) -> Self {
        Self {
            name: name.into(),
            kind: ArgKind::Scalar,
            c_type: "uint".into(),
            port: 0,
        }
    }

    /// A pointer argument of C type `c_type` (`short*`).
    pub fn pointer(name: &str, c_type: &str) -> Self {
        Self {
            name: name.into(),
            kind: ArgKind::Pointer,
            c_type: c_type.into(),
            port: 0,
        }
    }

    /// The same pointer argument reached through the read-only AXI4 master `port` (1 or 2).
    pub fn on_port(mut self, port: u8) -> Self {
        self.port = port;
        self
    }
}

/// Where one argument lives: its register offset and the core port it drives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArgSlot {
    /// The argument.
    pub arg: ArgDesc,
    /// Argument index (kernel.xml `id`).
    pub index: usize,
    /// Register offset of the (low) word.
    pub offset: u32,
    /// Size in bytes (4 for scalars, 8 for pointers).
    pub size: u32,
    /// Core port it drives (`arg0`, `ptr1` ...).
    pub port: String,
}

/// A kernel's interface: name and arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelDesc {
    /// Kernel name (the packaged top module and the xclbin kernel name).
    pub name: String,
    /// Arguments in order.
    pub args: Vec<ArgDesc>,
}

/// The description is not usable (too many arguments of a kind, duplicate names).
#[derive(Debug, Clone, thiserror::Error)]
#[error("kernel {kernel}: {msg}")]
pub struct DescError {
    /// Kernel.
    pub kernel: String,
    /// What is wrong.
    pub msg: String,
}

impl KernelDesc {
    /// Register offsets and core ports of every argument.
    pub fn slots(&self) -> Result<Vec<ArgSlot>, DescError> {
        let err = |msg: String| DescError {
            kernel: self.name.clone(),
            msg,
        };
        let (mut s, mut p) = (0usize, 0usize);
        let mut out = Vec::with_capacity(self.args.len());
        for (i, a) in self.args.iter().enumerate() {
            if self.args[..i].iter().any(|b| b.name == a.name) {
                return Err(err(format!("argument `{}` appears twice", a.name)));
            }
            if a.port >= MAX_AXI_PORTS || (a.port > 0 && a.kind == ArgKind::Scalar) {
                return Err(err(format!(
                    "argument `{}`: port {} (a pointer may use ports 0..{MAX_AXI_PORTS}, a scalar none)",
                    a.name, a.port
                )));
            }
            let (port, size) = match a.kind {
                ArgKind::Scalar => {
                    s += 1;
                    (format!("arg{}", s - 1), 4)
                }
                ArgKind::Pointer => {
                    p += 1;
                    (format!("ptr{}", p - 1), 8)
                }
            };
            out.push(ArgSlot {
                arg: a.clone(),
                index: i,
                offset: REG_ARGS + ARG_STRIDE * i as u32,
                size,
                port,
            });
        }
        if s > NUM_SCALARS || p > NUM_POINTERS {
            return Err(err(format!(
                "{s} scalar and {p} pointer arguments; the shell has {NUM_SCALARS} and {NUM_POINTERS}"
            )));
        }
        if REG_ARGS + ARG_STRIDE * self.args.len() as u32 > (1 << CTRL_ADDR_BITS) {
            return Err(err(
                "too many arguments for the control address range".into()
            ));
        }
        Ok(out)
    }

    /// The slot of the argument `name`.
    pub fn slot(&self, name: &str) -> Result<ArgSlot, DescError> {
        self.slots()?
            .into_iter()
            .find(|s| s.arg.name == name)
            .ok_or_else(|| DescError {
                kernel: self.name.clone(),
                msg: format!("no argument `{name}`"),
            })
    }

    /// How many AXI4 masters the kernel has: one more than the highest [`ArgDesc::port`].
    pub fn axi_ports(&self) -> u8 {
        self.args.iter().map(|a| a.port).max().unwrap_or(0) + 1
    }

    /// The `kernel.xml` Vitis needs to package the RTL as a kernel (`package_xo`), with
    /// `data_bits`-bit AXI4 masters.
    pub fn kernel_xml(&self, data_bits: u32) -> Result<String, DescError> {
        let slots = self.slots()?;
        let mut x = String::new();
        let n = &self.name;
        let _ = writeln!(x, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
        let _ = writeln!(x, r#"<root versionMajor="1" versionMinor="6">"#);
        let _ = writeln!(
            x,
            r#"  <kernel name="{n}" language="ip_c" vlnv="tandem:kernel:{n}:1.0" attributes="" preferredWorkGroupSizeMultiple="0" workGroupSize="1" interrupt="true" hwControlProtocol="ap_ctrl_hs">"#
        );
        let _ = writeln!(x, "    <ports>");
        let _ = writeln!(
            x,
            r#"      <port name="s_axi_control" mode="slave" range="0x{:X}" dataWidth="32" portType="addressable" base="0x0"/>"#,
            1u32 << CTRL_ADDR_BITS
        );
        for p in 0..self.axi_ports() {
            let _ = writeln!(
                x,
                r#"      <port name="{}" mode="master" range="0xFFFFFFFFFFFFFFFF" dataWidth="{data_bits}" portType="addressable" base="0x0"/>"#,
                axi_port_name(p)
            );
        }
        let _ = writeln!(x, "    </ports>");
        let _ = writeln!(x, "    <args>");
        for s in &slots {
            let (port, addr_q, host_size) = match s.arg.kind {
                ArgKind::Scalar => ("s_axi_control".to_string(), 0, 4),
                ArgKind::Pointer => (axi_port_name(s.arg.port), 1, 8),
            };
            let _ = writeln!(
                x,
                r#"      <arg name="{}" addressQualifier="{addr_q}" id="{}" port="{port}" size="0x{:X}" offset="0x{:X}" type="{}" hostOffset="0x0" hostSize="0x{host_size:X}"/>"#,
                s.arg.name,
                s.index,
                s.size,
                s.offset,
                xml_escape(&s.arg.c_type)
            );
        }
        let _ = writeln!(x, "    </args>");
        let _ = writeln!(x, "  </kernel>");
        let _ = writeln!(x, "</root>");
        Ok(x)
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc() -> KernelDesc {
        KernelDesc {
            name: "k".into(),
            args: vec![
                ArgDesc::pointer("a", "short*"),
                ArgDesc::scalar("n"),
                ArgDesc::pointer("b", "int*"),
            ],
        }
    }

    #[test]
    fn slots_follow_the_map() {
        let s = desc().slots().expect("slots");
        assert_eq!(
            s.iter()
                .map(|s| (s.offset, s.port.as_str()))
                .collect::<Vec<_>>(),
            vec![(0x10, "ptr0"), (0x18, "arg0"), (0x20, "ptr1")]
        );
    }

    #[test]
    fn kernel_xml_has_the_same_offsets() {
        let x = desc().kernel_xml(64).expect("xml");
        assert!(x.contains(r#"name="n" addressQualifier="0" id="1" port="s_axi_control" size="0x4" offset="0x18""#), "{x}");
        assert!(x.contains(
            r#"name="b" addressQualifier="1" id="2" port="m_axi_gmem" size="0x8" offset="0x20""#
        ));
        assert!(!x.contains("m_axi_gmem1"), "{x}");
    }

    #[test]
    fn streams_on_their_own_ports_get_their_own_masters() {
        let mut d = desc();
        d.args[2] = ArgDesc::pointer("b", "int*").on_port(2);
        assert_eq!(d.axi_ports(), 3);
        let x = d.kernel_xml(512).expect("xml");
        for p in ["m_axi_gmem", "m_axi_gmem1", "m_axi_gmem2"] {
            assert!(
                x.contains(&format!(
                    r#"<port name="{p}" mode="master" range="0xFFFFFFFFFFFFFFFF" dataWidth="512""#
                )),
                "{p}: {x}"
            );
        }
        assert!(
            x.contains(r#"name="b" addressQualifier="1" id="2" port="m_axi_gmem2""#),
            "{x}"
        );
        d.args[2].port = 3;
        assert!(d.slots().is_err());
        d.args[2].port = 0;
        d.args[1].port = 1;
        let e = d.slots().expect_err("a scalar on a master");
        assert!(e.to_string().contains("`n`"), "{e}");
    }

    #[test]
    fn duplicate_names_are_rejected() {
        let mut d = desc();
        d.args.push(ArgDesc::scalar("n"));
        assert!(d.slots().is_err());
    }
}
