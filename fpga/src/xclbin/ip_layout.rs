//! IP_LAYOUT: `struct ip_layout` (`m_count`, then `struct ip_data` of 80 bytes each at offset
//! 8): the compute units and other IPs on the control bus.

use serde::Serialize;

use super::XclbinError;
use super::bytes::Bytes;

const IP_DATA_SIZE: usize = 80;
const FIRST: usize = 8;

/// `enum IP_TYPE` names, indexed by `m_type`.
const IP_TYPES: [&str; 8] = [
    "IP_MB",
    "IP_KERNEL",
    "IP_DNASC",
    "IP_DDR4_CONTROLLER",
    "IP_MEM_DDR4",
    "IP_MEM_HBM",
    "IP_MEM_HBM_ECC",
    "IP_PS_KERNEL",
];

/// `enum IP_CONTROL` names (bits 8..16 of a kernel's `properties`).
const IP_CONTROLS: [&str; 6] = [
    "AP_CTRL_HS",
    "AP_CTRL_CHAIN",
    "AP_CTRL_NONE",
    "AP_CTRL_ME",
    "ACCEL_ADAPTER",
    "FAST_ADAPTER",
];

/// `IP_KERNEL`: a compute unit.
pub const IP_KERNEL: u32 = 1;

/// One `struct ip_data`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IpData {
    /// `m_type` (`enum IP_TYPE`).
    pub ip_type: u32,
    /// `properties`: for a kernel, bit 0 interrupt enable, bits 1..8 interrupt id, bits 8..16
    /// the control protocol.
    pub properties: u32,
    /// `m_base_address` on the control bus (`u64::MAX`: not used).
    pub base_address: u64,
    /// `m_name`: `kernel:cu` for a compute unit, e.g. `gemm:gemm_1`.
    pub name: String,
}

impl IpData {
    /// Name of `m_type`, e.g. `IP_KERNEL`.
    pub fn type_name(&self) -> String {
        IP_TYPES.get(self.ip_type as usize).map_or_else(
            || format!("UNKNOWN({})", self.ip_type),
            |s| (*s).to_string(),
        )
    }

    /// Whether this is a compute unit (`IP_KERNEL`).
    pub fn is_kernel(&self) -> bool {
        self.ip_type == IP_KERNEL
    }

    /// The kernel of a compute unit (`gemm` of `gemm:gemm_1`).
    pub fn kernel_name(&self) -> &str {
        self.name.split_once(':').map_or(&self.name, |(k, _)| k)
    }

    /// The compute unit's instance name (`gemm_1` of `gemm:gemm_1`; the whole name if it has
    /// no `:`).
    pub fn cu_name(&self) -> &str {
        self.name.split_once(':').map_or(&self.name, |(_, c)| c)
    }

    /// A kernel's control protocol (`AP_CTRL_HS` ...).
    pub fn control_protocol(&self) -> String {
        let c = (self.properties >> 8) & 0xFF;
        IP_CONTROLS
            .get(c as usize)
            .map_or_else(|| format!("UNKNOWN({c})"), |s| (*s).to_string())
    }

    /// Whether a kernel's interrupt is enabled.
    pub fn interrupt_enabled(&self) -> bool {
        self.properties & 1 != 0
    }
}

/// Parses an IP_LAYOUT payload (`base`: its file offset).
pub(crate) fn parse(data: &[u8], base: u64) -> Result<Vec<IpData>, XclbinError> {
    let b = Bytes::new(data, base);
    let raw = b.i32(0, "IP_LAYOUT m_count")?;
    let n = b.count(i64::from(raw), FIRST, IP_DATA_SIZE, "IP_LAYOUT m_count")?;
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let at = FIRST + i * IP_DATA_SIZE;
        let f = |name: &str| format!("IP_LAYOUT[{i}].{name}");
        v.push(IpData {
            ip_type: b.u32(at, &f("m_type"))?,
            properties: b.u32(at + 4, &f("properties"))?,
            base_address: b.u64(at + 8, &f("m_base_address"))?,
            name: b.cstr(at + 16, 64, &f("m_name"))?,
        });
    }
    Ok(v)
}
