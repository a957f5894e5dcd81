//! MEM_TOPOLOGY: `struct mem_topology` (`m_count`, then `struct mem_data` of 40 bytes each at
//! offset 8): the memory banks (`HBM[3]`, `DDR[0]`, `HOST[0]` ...).

use serde::Serialize;

use super::XclbinError;
use super::bytes::Bytes;

const MEM_DATA_SIZE: usize = 40;
const FIRST: usize = 8;

/// `enum MEM_TYPE` names, indexed by `m_type`.
const MEM_TYPES: [&str; 12] = [
    "MEM_DDR3",
    "MEM_DDR4",
    "MEM_DRAM",
    "MEM_STREAMING",
    "MEM_PREALLOCATED_GLOB",
    "MEM_ARE",
    "MEM_HBM",
    "MEM_BRAM",
    "MEM_URAM",
    "MEM_STREAMING_CONNECTION",
    "MEM_HOST",
    "MEM_PS_KERNEL",
];

/// One `struct mem_data`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemData {
    /// `m_type` (`enum MEM_TYPE`).
    pub mem_type: u8,
    /// `m_used`: whether a kernel is connected to the bank.
    pub used: bool,
    /// `m_size`: size in KiB (for streaming entries, the route id).
    pub size_kib: u64,
    /// `m_base_address` (for streaming entries, the flow id).
    pub base_address: u64,
    /// `m_tag`: the bank's name, e.g. `HBM[0]`.
    pub tag: String,
}

impl MemData {
    /// Name of `m_type`, e.g. `MEM_DRAM`.
    pub fn type_name(&self) -> String {
        MEM_TYPES.get(self.mem_type as usize).map_or_else(
            || format!("UNKNOWN({})", self.mem_type),
            |s| (*s).to_string(),
        )
    }

    /// Size in bytes (saturating).
    pub fn size_bytes(&self) -> u64 {
        self.size_kib.saturating_mul(1024)
    }
}

/// Parses a MEM_TOPOLOGY payload (`base`: its file offset).
pub(crate) fn parse(data: &[u8], base: u64) -> Result<Vec<MemData>, XclbinError> {
    let b = Bytes::new(data, base);
    let raw = b.i32(0, "MEM_TOPOLOGY m_count")?;
    let n = b.count(i64::from(raw), FIRST, MEM_DATA_SIZE, "MEM_TOPOLOGY m_count")?;
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let at = FIRST + i * MEM_DATA_SIZE;
        let f = |name: &str| format!("MEM_TOPOLOGY[{i}].{name}");
        v.push(MemData {
            mem_type: b.u8(at, &f("m_type"))?,
            used: b.u8(at + 1, &f("m_used"))? != 0,
            size_kib: b.u64(at + 8, &f("m_size"))?,
            base_address: b.u64(at + 16, &f("m_base_address"))?,
            tag: b.cstr(at + 24, 16, &f("m_tag"))?,
        });
    }
    Ok(v)
}
