//! The Alveo platforms tandem builds for: their Vitis platform name (VBNV), FPGA part, and
//! the memory banks kernels connect to (`sp=` names, count, size, bandwidth).
//!
//! | key | board | platform | memory |
//! | --- | --- | --- | --- |
//! | `u55c` | Alveo U55C | `xilinx_u55c_gen3x16_xdma_3_202210_1` | HBM2e, 32 pseudo-channels `HBM[0..31]` x 512 MiB, ~14.4 GB/s each |
//! | `u250` | Alveo U250 | `xilinx_u250_gen3x16_xdma_4_1_202210_1` | DDR4, 4 banks `DDR[0..3]` x 16 GiB, ~19.2 GB/s each |

use serde::Serialize;

/// The kind of memory behind a platform's banks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryKind {
    /// High-bandwidth memory pseudo-channels.
    Hbm,
    /// DDR4 banks.
    Ddr,
}

/// One Alveo platform.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Platform {
    /// Short name used on the command line (`u55c`).
    pub key: &'static str,
    /// Board name.
    pub board: &'static str,
    /// The Vitis platform (VBNV) passed to `v++ --platform` and written into the xclbin.
    pub vbnv: &'static str,
    /// The base (shell) platform `xbutil examine` reports on a board flashed for `vbnv`.
    pub base_shell: &'static str,
    /// FPGA part (package_xo's `-part`).
    pub part: &'static str,
    /// Memory kind of the banks.
    pub memory: MemoryKind,
    /// Bank name prefix in `sp=` and MEM_TOPOLOGY tags (`HBM` gives `HBM[3]`).
    pub bank_prefix: &'static str,
    /// Number of banks.
    pub banks: u32,
    /// Bytes per bank.
    pub bank_bytes: u64,
    /// Peak bandwidth of one bank, GB/s.
    pub bank_gbps: f64,
    /// Read latency of one bank (request to first data, page hit), ns: the measurements of
    /// Shuhai (Wang et al., FCCM 2020) on an Alveo U280's HBM2 and DDR4, rounded.
    pub read_latency_ns: f64,
}

impl Platform {
    /// The `sp=` / MEM_TOPOLOGY name of bank `i` (`HBM[3]`).
    pub fn bank_name(&self, i: u32) -> String {
        format!("{}[{i}]", self.bank_prefix)
    }

    /// Peak bytes one bank delivers per kernel clock cycle at `clock_mhz` (48 for a U55C
    /// pseudo-channel at 300 MHz, 64 for a U250 DDR bank).
    pub fn bank_bytes_per_cycle(&self, clock_mhz: f64) -> f64 {
        self.bank_gbps * 1e3 / clock_mhz.max(1e-3)
    }

    /// A bank's read latency in kernel clock cycles at `clock_mhz`, rounded up.
    pub fn bank_read_latency_cycles(&self, clock_mhz: f64) -> u64 {
        (self.read_latency_ns * clock_mhz * 1e-3).ceil() as u64
    }

    /// Bytes of all banks together.
    pub fn total_bytes(&self) -> u64 {
        self.bank_bytes * u64::from(self.banks)
    }

    /// Whether `name` (a VBNV from an xclbin or a base shell name from a board) is this
    /// platform.
    pub fn matches(&self, name: &str) -> bool {
        name == self.vbnv || name == self.base_shell || name == self.key
    }
}

/// Alveo U55C: 16 GiB HBM2e in 32 pseudo-channels.
pub const U55C: Platform = Platform {
    key: "u55c",
    board: "Alveo U55C",
    vbnv: "xilinx_u55c_gen3x16_xdma_3_202210_1",
    base_shell: "xilinx_u55c_gen3x16_xdma_base_3",
    part: "xcu55c-fsvh2892-2L-e",
    memory: MemoryKind::Hbm,
    bank_prefix: "HBM",
    banks: 32,
    bank_bytes: 512 << 20,
    bank_gbps: 14.4,
    read_latency_ns: 107.0,
};

/// Alveo U250: 64 GiB DDR4 in 4 banks.
pub const U250: Platform = Platform {
    key: "u250",
    board: "Alveo U250",
    vbnv: "xilinx_u250_gen3x16_xdma_4_1_202210_1",
    base_shell: "xilinx_u250_gen3x16_base_4",
    part: "xcu250-figd2104-2L-e",
    memory: MemoryKind::Ddr,
    bank_prefix: "DDR",
    banks: 4,
    bank_bytes: 16 << 30,
    bank_gbps: 19.2,
    read_latency_ns: 73.0,
};

/// Every platform tandem knows.
pub const PLATFORMS: [&Platform; 2] = [&U55C, &U250];

/// The platform is not one tandem knows.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown platform `{name}` (known: {})", known())]
pub struct UnknownPlatform {
    /// What was asked for.
    pub name: String,
}

fn known() -> String {
    PLATFORMS
        .iter()
        .map(|p| format!("{} = {}", p.key, p.vbnv))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The platform named `name`: its key (`u55c`, any case), its VBNV or its base shell.
pub fn platform(name: &str) -> Result<&'static Platform, UnknownPlatform> {
    let lower = name.trim().to_ascii_lowercase();
    PLATFORMS
        .into_iter()
        .find(|p| p.matches(&lower))
        .ok_or_else(|| UnknownPlatform { name: name.into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_by_key_vbnv_and_shell() {
        assert_eq!(platform("U55C").map(|p| p.vbnv).ok(), Some(U55C.vbnv));
        assert_eq!(
            platform("xilinx_u250_gen3x16_xdma_4_1_202210_1")
                .map(|p| p.key)
                .ok(),
            Some("u250")
        );
        assert_eq!(
            platform("xilinx_u55c_gen3x16_xdma_base_3")
                .map(|p| p.key)
                .ok(),
            Some("u55c")
        );
        let e = platform("u280")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("unknown platform `u280`") && e.contains("u55c = xilinx_u55c"),
            "{e}"
        );
    }

    #[test]
    fn banks_add_up() {
        assert_eq!(U55C.bank_name(31), "HBM[31]");
        assert_eq!(U55C.total_bytes(), 16 << 30);
        assert_eq!(U250.bank_name(0), "DDR[0]");
        assert_eq!(U250.total_bytes(), 64 << 30);
    }

    #[test]
    fn per_cycle_figures_at_300_mhz() {
        assert!((U55C.bank_bytes_per_cycle(300.0) - 48.0).abs() < 1e-9);
        assert!((U250.bank_bytes_per_cycle(300.0) - 64.0).abs() < 1e-9);
        assert_eq!(U55C.bank_read_latency_cycles(300.0), 33);
        assert_eq!(U250.bank_read_latency_cycles(300.0), 22);
    }
}
