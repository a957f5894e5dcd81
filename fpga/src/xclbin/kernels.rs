//! The kernels of an xclbin joined across sections: each kernel's arguments from
//! EMBEDDED_METADATA, its compute units from IP_LAYOUT, and the bank each argument of each
//! compute unit is connected to from CONNECTIVITY and MEM_TOPOLOGY.

use serde::Serialize;

use super::XclbinError;
use super::connectivity::Connection;
use super::ip_layout::IpData;
use super::mem_topology::MemData;
use super::metadata::{ArgMeta, KernelMeta, PortMeta};

/// A compute unit: one instance of a kernel on the control bus.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComputeUnit {
    /// Instance name (`gemm_1`).
    pub name: String,
    /// Base address of its control registers.
    pub base_address: u64,
    /// Its index in IP_LAYOUT.
    pub ip_index: usize,
    /// Control protocol (`AP_CTRL_HS` ...).
    pub control_protocol: String,
}

/// A memory bank one argument of one compute unit is connected to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArgBank {
    /// The compute unit (`gemm_1`).
    pub cu: String,
    /// Index of the bank in MEM_TOPOLOGY (XRT's memory group for buffer allocation).
    pub mem_index: usize,
    /// The bank's tag (`HBM[0]`, `DDR[1]`).
    pub bank: String,
}

/// An argument with its connections.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArgInfo {
    /// What the metadata says about it.
    #[serde(flatten)]
    pub meta: ArgMeta,
    /// The banks it is connected to, one per compute unit (empty for scalars).
    pub banks: Vec<ArgBank>,
}

/// A kernel of the xclbin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KernelInfo {
    /// Name.
    pub name: String,
    /// `language` of the metadata (`ip_c` for RTL).
    pub language: Option<String>,
    /// `hwControlProtocol` of the metadata.
    pub control_protocol: Option<String>,
    /// Ports (from the metadata).
    pub ports: Vec<PortMeta>,
    /// Arguments in metadata order (empty when the xclbin has no EMBEDDED_METADATA).
    pub args: Vec<ArgInfo>,
    /// Compute units (from IP_LAYOUT).
    pub compute_units: Vec<ComputeUnit>,
}

impl KernelInfo {
    /// The argument `name`.
    pub fn arg(&self, name: &str) -> Option<&ArgInfo> {
        self.args.iter().find(|a| a.meta.name == name)
    }
}

/// Joins the sections into the kernel list: the metadata's kernels in order, then kernels
/// that only IP_LAYOUT names. Where IP_LAYOUT, MEM_TOPOLOGY and CONNECTIVITY are all present,
/// a connection that points outside IP_LAYOUT or MEM_TOPOLOGY, at an IP that is not a
/// compute unit, or at an argument id the kernel's metadata lacks, is an error naming the
/// entry.
pub(crate) fn join(
    meta: Option<&[KernelMeta]>,
    ips: Option<&[IpData]>,
    conns: Option<&[Connection]>,
    mems: Option<&[MemData]>,
) -> Result<Vec<KernelInfo>, XclbinError> {
    let mut out: Vec<KernelInfo> = meta
        .unwrap_or_default()
        .iter()
        .map(|k| KernelInfo {
            name: k.name.clone(),
            language: k.language.clone(),
            control_protocol: k.control_protocol.clone(),
            ports: k.ports.clone(),
            args: k
                .args
                .iter()
                .map(|a| ArgInfo {
                    meta: a.clone(),
                    banks: Vec::new(),
                })
                .collect(),
            compute_units: Vec::new(),
        })
        .collect();
    for (i, ip) in ips
        .unwrap_or_default()
        .iter()
        .enumerate()
        .filter(|(_, ip)| ip.is_kernel())
    {
        let cu = ComputeUnit {
            name: ip.cu_name().to_string(),
            base_address: ip.base_address,
            ip_index: i,
            control_protocol: ip.control_protocol(),
        };
        match out.iter_mut().find(|k| k.name == ip.kernel_name()) {
            Some(k) => k.compute_units.push(cu),
            None => out.push(KernelInfo {
                name: ip.kernel_name().to_string(),
                language: None,
                control_protocol: None,
                ports: Vec::new(),
                args: Vec::new(),
                compute_units: vec![cu],
            }),
        }
    }
    // Without IP_LAYOUT or MEM_TOPOLOGY (a section removed) the connections cannot be
    // resolved: the kernels are listed without banks rather than the file refused.
    let (Some(ips), Some(mems), Some(conns)) = (ips, mems, conns) else {
        return Ok(out);
    };
    let has_meta = meta.is_some();
    for (i, c) in conns.iter().enumerate() {
        let corrupt = |field: &str, msg: String| XclbinError::Corrupt {
            field: format!("CONNECTIVITY[{i}].{field}"),
            msg,
        };
        let ip = ips.get(c.ip_layout_index as usize).ok_or_else(|| {
            corrupt(
                "m_ip_layout_index",
                format!(
                    "{} but IP_LAYOUT has {} entries",
                    c.ip_layout_index,
                    ips.len()
                ),
            )
        })?;
        if !ip.is_kernel() {
            return Err(corrupt(
                "m_ip_layout_index",
                format!(
                    "{} names `{}`, a {}, not a compute unit",
                    c.ip_layout_index,
                    ip.name,
                    ip.type_name()
                ),
            ));
        }
        let mem = mems.get(c.mem_data_index as usize).ok_or_else(|| {
            corrupt(
                "mem_data_index",
                format!(
                    "{} but MEM_TOPOLOGY has {} entries",
                    c.mem_data_index,
                    mems.len()
                ),
            )
        })?;
        let Some(k) = out.iter_mut().find(|k| k.name == ip.kernel_name()) else {
            continue; // unreachable: every compute unit has an entry
        };
        match k.args.iter_mut().find(|a| a.meta.id == c.arg_index) {
            Some(a) => a.banks.push(ArgBank {
                cu: ip.cu_name().to_string(),
                mem_index: c.mem_data_index as usize,
                bank: mem.tag.clone(),
            }),
            None if !has_meta => {
                tracing::debug!(kernel = %k.name, arg = c.arg_index, "connection of an argument without metadata");
            }
            None => {
                return Err(corrupt(
                    "arg_index",
                    format!(
                        "{}: kernel `{}` has no argument with that id",
                        c.arg_index, k.name
                    ),
                ));
            }
        }
    }
    Ok(out)
}
