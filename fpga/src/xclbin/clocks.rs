//! CLOCK_FREQ_TOPOLOGY: `struct clock_freq_topology` (`int16_t m_count`, then `struct
//! clock_freq` of 136 bytes each at offset 2): the clocks the link set.

use serde::Serialize;

use super::XclbinError;
use super::bytes::Bytes;

const CLOCK_FREQ_SIZE: usize = 136;
const FIRST: usize = 2;

/// `enum CLOCK_TYPE` names, indexed by `m_type`.
const CLOCK_TYPES: [&str; 4] = ["UNUSED", "DATA", "KERNEL", "SYSTEM"];

/// `CT_DATA`: the clock of the kernels' `ap_clk` (Vitis names it `DATA_CLK`).
pub const CT_DATA: u8 = 1;

/// One `struct clock_freq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClockFreq {
    /// `m_freq_Mhz`.
    pub freq_mhz: u16,
    /// `m_type` (`enum CLOCK_TYPE`).
    pub clock_type: u8,
    /// `m_name`, e.g. `DATA_CLK`.
    pub name: String,
}

impl ClockFreq {
    /// Name of `m_type`: `UNUSED`, `DATA`, `KERNEL`, `SYSTEM`.
    pub fn type_name(&self) -> String {
        CLOCK_TYPES.get(self.clock_type as usize).map_or_else(
            || format!("UNKNOWN({})", self.clock_type),
            |s| (*s).to_string(),
        )
    }
}

/// Parses a CLOCK_FREQ_TOPOLOGY payload (`base`: its file offset).
pub(crate) fn parse(data: &[u8], base: u64) -> Result<Vec<ClockFreq>, XclbinError> {
    let b = Bytes::new(data, base);
    let raw = b.i16(0, "CLOCK_FREQ_TOPOLOGY m_count")?;
    let n = b.count(
        i64::from(raw),
        FIRST,
        CLOCK_FREQ_SIZE,
        "CLOCK_FREQ_TOPOLOGY m_count",
    )?;
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let at = FIRST + i * CLOCK_FREQ_SIZE;
        let f = |name: &str| format!("CLOCK_FREQ_TOPOLOGY[{i}].{name}");
        v.push(ClockFreq {
            freq_mhz: b.u16(at, &f("m_freq_Mhz"))?,
            clock_type: b.u8(at + 2, &f("m_type"))?,
            name: b.cstr(at + 8, 128, &f("m_name"))?,
        });
    }
    Ok(v)
}
