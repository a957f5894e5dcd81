//! EMBEDDED_METADATA: the kernels' XML. Reads both the `kernel.xml` that `package_xo` takes
//! (`<root><kernel><ports/><args/></kernel></root>`, what [`crate::regmap`] writes) and the
//! document v++ embeds (`<project><platform><device><core><kernel>...`): every `kernel`
//! element anywhere in the tree, its `port` and `arg` elements (directly or under
//! `ports`/`args`).

use serde::Serialize;

use super::XclbinError;

/// A kernel port (`<port name="m_axi_gmem" mode="master" .../>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PortMeta {
    /// `name`, e.g. `m_axi_gmem`, `s_axi_control`.
    pub name: String,
    /// `mode`: `master` (an AXI master to memory), `slave` (control), `read_only` ...
    pub mode: String,
    /// `dataWidth` in bits, if given.
    pub data_width: Option<u32>,
}

impl PortMeta {
    /// Whether the port masters memory (`mode="master"`): the ports `sp=` maps to banks.
    pub fn is_memory_master(&self) -> bool {
        self.mode == "master"
    }
}

/// A kernel argument (`<arg name=.. addressQualifier=.. id=.. port=.. size=.. offset=.. type=../>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArgMeta {
    /// `name`.
    pub name: String,
    /// `id`: the argument index (CONNECTIVITY's `arg_index`).
    pub id: u32,
    /// `addressQualifier`: 0 scalar, 1 global memory, 2 constant, 3 local, 4 stream.
    pub address_qualifier: u32,
    /// `port`: the port it is passed through (`s_axi_control` or a master such as `m_axi_gmem`).
    pub port: String,
    /// `size`: bytes of the register slot.
    pub size: u64,
    /// `offset`: register offset in the control block.
    pub offset: u64,
    /// `type`: the C type, e.g. `char*`, `uint`.
    pub c_type: String,
}

impl ArgMeta {
    /// Name of the address qualifier: `scalar`, `global`, `constant`, `local`, `stream`.
    pub fn qualifier_name(&self) -> String {
        match self.address_qualifier {
            0 => "scalar".into(),
            1 => "global".into(),
            2 => "constant".into(),
            3 => "local".into(),
            4 => "stream".into(),
            q => format!("unknown({q})"),
        }
    }

    /// Whether the argument is a buffer in device memory (global or constant).
    pub fn is_buffer(&self) -> bool {
        matches!(self.address_qualifier, 1 | 2)
    }
}

/// One `kernel` element.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KernelMeta {
    /// `name`.
    pub name: String,
    /// `language` (`ip_c` for an RTL kernel, `c` for HLS).
    pub language: Option<String>,
    /// `vlnv`.
    pub vlnv: Option<String>,
    /// `hwControlProtocol` (`ap_ctrl_hs` ...).
    pub control_protocol: Option<String>,
    /// The ports, in document order.
    pub ports: Vec<PortMeta>,
    /// The arguments, in document order.
    pub args: Vec<ArgMeta>,
}

impl KernelMeta {
    /// The ports that master memory, in document order (one `sp=` line each in a link).
    pub fn memory_ports(&self) -> impl Iterator<Item = &PortMeta> {
        self.ports.iter().filter(|p| p.is_memory_master())
    }
}

fn err(msg: String) -> XclbinError {
    XclbinError::Metadata { msg }
}

/// Parses `0x1F` or `31`.
fn number(s: &str) -> Option<u64> {
    let t = s.trim();
    match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => t.parse().ok(),
    }
}

/// Parses the kernels of a metadata XML document (an EMBEDDED_METADATA payload or a
/// `kernel.xml`).
pub fn parse_kernels(xml: &[u8]) -> Result<Vec<KernelMeta>, XclbinError> {
    let text = std::str::from_utf8(xml)
        .map_err(|e| err(format!("not UTF-8 text ({e})")))?
        // C strings in the container may carry a terminating NUL.
        .trim_end_matches('\0');
    let doc = roxmltree::Document::parse(text).map_err(|e| err(format!("not XML: {e}")))?;
    let mut kernels = Vec::new();
    for k in doc.descendants().filter(|n| n.has_tag_name("kernel")) {
        let name = k
            .attribute("name")
            .ok_or_else(|| err("a <kernel> element has no name".into()))?
            .to_string();
        let mut ports = Vec::new();
        let mut args = Vec::new();
        // `port`/`arg` children of the kernel or of its `ports`/`args` elements.
        let items = k.children().filter(|c| c.is_element()).flat_map(|c| {
            if c.has_tag_name("ports") || c.has_tag_name("args") {
                c.children().filter(|g| g.is_element()).collect::<Vec<_>>()
            } else {
                vec![c]
            }
        });
        for n in items {
            if n.has_tag_name("port") {
                let pname = n
                    .attribute("name")
                    .ok_or_else(|| err(format!("kernel `{name}`: a <port> has no name")))?;
                ports.push(PortMeta {
                    name: pname.to_string(),
                    mode: n.attribute("mode").unwrap_or_default().to_string(),
                    data_width: n
                        .attribute("dataWidth")
                        .and_then(number)
                        .and_then(|w| u32::try_from(w).ok()),
                });
            } else if n.has_tag_name("arg") {
                args.push(arg(&name, n)?);
            }
        }
        kernels.push(KernelMeta {
            name,
            language: k.attribute("language").map(str::to_string),
            vlnv: k.attribute("vlnv").map(str::to_string),
            control_protocol: k.attribute("hwControlProtocol").map(str::to_string),
            ports,
            args,
        });
    }
    Ok(kernels)
}

fn arg(kernel: &str, n: roxmltree::Node<'_, '_>) -> Result<ArgMeta, XclbinError> {
    let aname = n
        .attribute("name")
        .ok_or_else(|| err(format!("kernel `{kernel}`: an <arg> has no name")))?;
    let attr = |a: &str| {
        n.attribute(a).ok_or_else(|| {
            err(format!(
                "kernel `{kernel}` argument `{aname}`: no `{a}` attribute"
            ))
        })
    };
    let num = |a: &str| -> Result<u64, XclbinError> {
        let s = attr(a)?;
        number(s).ok_or_else(|| {
            err(format!(
                "kernel `{kernel}` argument `{aname}`: {a}=\"{s}\" is not a number (decimal or 0x hex)"
            ))
        })
    };
    let small = |a: &str| -> Result<u32, XclbinError> {
        let v = num(a)?;
        u32::try_from(v).map_err(|_| {
            err(format!(
                "kernel `{kernel}` argument `{aname}`: {a}={v} is out of range"
            ))
        })
    };
    Ok(ArgMeta {
        name: aname.to_string(),
        id: small("id")?,
        address_qualifier: small("addressQualifier")?,
        port: n.attribute("port").unwrap_or_default().to_string(),
        size: num("size")?,
        offset: num("offset")?,
        c_type: n.attribute("type").unwrap_or_default().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regmap::{ArgDesc, KernelDesc};

    #[test]
    fn reads_the_kernel_xml_regmap_writes() {
        let d = KernelDesc {
            name: "k".into(),
            args: vec![ArgDesc::pointer("a", "short*"), ArgDesc::scalar("n")],
        };
        let xml = d.kernel_xml(64).expect("xml");
        let ks = parse_kernels(xml.as_bytes()).expect("parse");
        assert_eq!(ks.len(), 1);
        let k = &ks[0];
        assert_eq!(k.name, "k");
        assert_eq!(k.control_protocol.as_deref(), Some("ap_ctrl_hs"));
        assert_eq!(
            k.memory_ports()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>(),
            ["m_axi_gmem"]
        );
        let slots = d.slots().expect("slots");
        for (a, s) in k.args.iter().zip(&slots) {
            assert_eq!(a.name, s.arg.name);
            assert_eq!(a.offset, u64::from(s.offset));
            assert_eq!(a.id as usize, s.index);
            assert_eq!(a.c_type, s.arg.c_type);
        }
        assert_eq!(k.args[0].qualifier_name(), "global");
        assert_eq!(k.args[1].qualifier_name(), "scalar");
    }

    #[test]
    fn reads_the_vitis_project_layout() {
        let xml = r#"<?xml version="1.0"?><project name="p"><platform><device><core name="OCL_REGION_0">
          <kernel name="vadd" language="c" vlnv="xilinx.com:hls:vadd:1.0">
            <port name="M_AXI_GMEM" mode="master" range="0xFFFFFFFF" dataWidth="512"/>
            <arg name="a" addressQualifier="1" id="0" port="M_AXI_GMEM" size="0x8" offset="0x10" type="int*"/>
            <arg name="n" addressQualifier="0" id="1" port="S_AXI_CONTROL" size="0x4" offset="0x1c" type="uint"/>
            <instance name="vadd_1"/>
          </kernel></core></device></platform></project>"#;
        let ks = parse_kernels(xml.as_bytes()).expect("parse");
        assert_eq!(ks[0].name, "vadd");
        assert_eq!(ks[0].ports[0].data_width, Some(512));
        assert_eq!(ks[0].args[1].offset, 0x1c);
    }

    #[test]
    fn bad_documents_say_what_is_wrong() {
        let e = |x: &str| parse_kernels(x.as_bytes()).err().map(|e| e.to_string());
        assert!(e("<root><kernel").is_some_and(|m| m.contains("not XML")));
        assert!(e("<root><kernel/></root>").is_some_and(|m| m.contains("no name")));
        let bad = r#"<root><kernel name="k"><args><arg name="a" addressQualifier="1" id="x" size="8" offset="0x10"/></args></kernel></root>"#;
        assert!(
            e(bad).is_some_and(|m| m.contains("id=\"x\" is not a number")),
            "{:?}",
            e(bad)
        );
        assert!(parse_kernels(&[0xff, 0xfe]).is_err());
    }
}
