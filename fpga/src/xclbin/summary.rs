//! What `tandem fpga inspect` shows of an xclbin: platform, UUID, kernels with their
//! arguments and banks, memories, clocks and sections, as text ([`std::fmt::Display`]) or
//! JSON (`serde`).

use std::fmt::Write as _;

use serde::Serialize;

use super::{KernelInfo, Xclbin};

/// A memory bank, with its type named.
#[derive(Debug, Clone, Serialize)]
pub struct MemorySummary {
    /// Index in MEM_TOPOLOGY.
    pub index: usize,
    /// Tag (`HBM[0]`).
    pub tag: String,
    /// Type (`MEM_DRAM`, `MEM_DDR4`, `MEM_HBM` ...).
    pub mem_type: String,
    /// Whether a kernel uses it.
    pub used: bool,
    /// Base address.
    pub base_address: u64,
    /// Size in bytes.
    pub size_bytes: u64,
}

/// A clock, with its type named.
#[derive(Debug, Clone, Serialize)]
pub struct ClockSummary {
    /// Name (`DATA_CLK`).
    pub name: String,
    /// Type (`DATA`, `KERNEL`, `SYSTEM`).
    pub clock_type: String,
    /// Frequency, MHz.
    pub mhz: u16,
}

/// A section of the table.
#[derive(Debug, Clone, Serialize)]
pub struct SectionSummary {
    /// Kind (`IP_LAYOUT`).
    pub kind: String,
    /// Name field.
    pub name: String,
    /// File offset.
    pub offset: u64,
    /// Bytes.
    pub size: u64,
}

/// The inspectable content of an xclbin.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Target platform (VBNV).
    pub platform: String,
    /// The xclbin's UUID.
    pub uuid: String,
    /// Creation time, seconds since the Unix epoch.
    pub timestamp: u64,
    /// Creation time, UTC (`2026-11-23 13:47:43 UTC`).
    pub created: String,
    /// Version of the tool that wrote it.
    pub version: String,
    /// `m_mode` (`FLAT`, `HW_EMU` ...).
    pub mode: String,
    /// Total bytes (`m_length`).
    pub length: u64,
    /// Kernels, arguments, banks and compute units.
    pub kernels: Vec<KernelInfo>,
    /// Memory banks.
    pub memories: Vec<MemorySummary>,
    /// Clocks.
    pub clocks: Vec<ClockSummary>,
    /// Sections.
    pub sections: Vec<SectionSummary>,
}

impl Summary {
    /// The summary of `x`.
    pub fn of(x: &Xclbin) -> Self {
        let h = &x.header;
        Self {
            platform: h.platform_vbnv.clone(),
            uuid: h.uuid.to_string(),
            timestamp: h.timestamp,
            created: utc(h.timestamp),
            version: h.version.clone(),
            mode: h.mode_name(),
            length: h.length,
            kernels: x.kernels.clone(),
            memories: x
                .mem_topology
                .as_deref()
                .unwrap_or_default()
                .iter()
                .enumerate()
                .map(|(index, m)| MemorySummary {
                    index,
                    tag: m.tag.clone(),
                    mem_type: m.type_name(),
                    used: m.used,
                    base_address: m.base_address,
                    size_bytes: m.size_bytes(),
                })
                .collect(),
            clocks: x
                .clocks
                .as_deref()
                .unwrap_or_default()
                .iter()
                .map(|c| ClockSummary {
                    name: c.name.clone(),
                    clock_type: c.type_name(),
                    mhz: c.freq_mhz,
                })
                .collect(),
            sections: x
                .sections
                .iter()
                .map(|s| SectionSummary {
                    kind: s.kind.name(),
                    name: s.name.clone(),
                    offset: s.offset,
                    size: s.size,
                })
                .collect(),
        }
    }
}

/// `n` bytes as `512 MiB`, `16 GiB`, `300 B`.
fn size(n: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (u, name) in UNITS {
        if n >= u && n.is_multiple_of(u) {
            return format!("{} {name}", n / u);
        }
    }
    format!("{n} B")
}

/// Seconds since the Unix epoch as a UTC date and time.
pub fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = String::new();
        let _ = writeln!(s, "platform  {}", self.platform);
        let _ = writeln!(s, "uuid      {}", self.uuid);
        let _ = writeln!(
            s,
            "created   {} (xclbin {} {}, {} bytes)",
            self.created, self.version, self.mode, self.length
        );
        let _ = writeln!(s, "kernels   {}", self.kernels.len());
        for k in &self.kernels {
            let cus = k
                .compute_units
                .iter()
                .map(|c| format!("{} @ {:#x}", c.name, c.base_address))
                .collect::<Vec<_>>();
            let _ = writeln!(
                s,
                "  {}  ({}{})  compute units: {}",
                k.name,
                k.language.as_deref().unwrap_or("no metadata"),
                k.control_protocol
                    .as_deref()
                    .map(|p| format!(", {p}"))
                    .unwrap_or_default(),
                if cus.is_empty() {
                    "none".into()
                } else {
                    cus.join(", ")
                }
            );
            for a in &k.args {
                let m = &a.meta;
                let banks = a
                    .banks
                    .iter()
                    .map(|b| format!("{}: {}", b.cu, b.bank))
                    .collect::<Vec<_>>()
                    .join(", ");
                let line = format!(
                    "    {:>2}  {:<10} {:<8} {:<7} {:#06x}  {:<14} {}",
                    m.id,
                    m.name,
                    m.c_type,
                    m.qualifier_name(),
                    m.offset,
                    m.port,
                    if banks.is_empty() && m.is_buffer() {
                        "(not connected)".to_string()
                    } else {
                        banks
                    }
                );
                let _ = writeln!(s, "{}", line.trim_end());
            }
        }
        let used = self.memories.iter().filter(|m| m.used).count();
        let _ = writeln!(s, "memories  {} ({used} used)", self.memories.len());
        for m in &self.memories {
            let _ = writeln!(
                s,
                "  {:>2}  {:<8} {:<9} {:#013x}  {:>8}{}",
                m.index,
                m.tag,
                m.mem_type,
                m.base_address,
                size(m.size_bytes),
                if m.used { "  used" } else { "" }
            );
        }
        let _ = writeln!(s, "clocks    {}", self.clocks.len());
        for c in &self.clocks {
            let _ = writeln!(s, "  {:<12} {:<7} {} MHz", c.name, c.clock_type, c.mhz);
        }
        let _ = writeln!(s, "sections  {}", self.sections.len());
        for x in &self.sections {
            let _ = writeln!(
                s,
                "  {:<20} offset {:>8}  {:>8} bytes",
                x.kind, x.offset, x.size
            );
        }
        f.write_str(s.trim_end())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_sizes() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        // 0x6b0443ff, the timestamp xclbinutil wrote into the fixture.
        assert_eq!(utc(1_795_441_663), "2026-11-23 13:47:43 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(size(512 << 20), "512 MiB");
        assert_eq!(size(16 << 30), "16 GiB");
        assert_eq!(size(1000), "1000 B");
    }
}
