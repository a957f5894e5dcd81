//! Per-device memory limits: `--memory-limit cuda:0=8GiB,fpga-sim:0=2GiB,cpu=16GiB` (or
//! `TANDEM_MEMORY_LIMIT`). A device without a limit may use its real capacity
//! ([`crate::backend::DeviceInfo::memory_bytes`]).

use std::fmt;

use crate::backend::{DeviceId, DeviceKind};
use crate::error::{Error, Result};
use crate::limits::{human_bytes, parse_bytes};

/// The environment variable that sets [`MemoryLimits`] when no `--memory-limit` flag does.
pub const MEMORY_LIMIT_VAR: &str = "TANDEM_MEMORY_LIMIT";

/// Which devices one limit applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DeviceSelector {
    /// One device (`cuda:0`, `fpga-sim:1`; `cpu` is the CPU).
    Id(DeviceId),
    /// Every device of a kind (`cuda`, `fpga-sim`), each held to the limit on its own.
    Kind(DeviceKind),
}

impl DeviceSelector {
    /// Whether the selector names `id`.
    pub fn matches(self, id: DeviceId) -> bool {
        match self {
            DeviceSelector::Id(d) => d == id,
            DeviceSelector::Kind(k) => k == id.kind,
        }
    }

    fn parse(text: &str) -> std::result::Result<Self, String> {
        let t = text.trim();
        let accepted = || {
            format!(
                "accepted: a device as `tandem devices` names it (cpu, cuda:0, fpga-sim:0, \
                 fpga:0) or a kind alone for each of its devices ({})",
                DeviceKind::accepted()
            )
        };
        let (kind, index) = match t.split_once(':') {
            Some((k, i)) => (k, Some(i)),
            None => (t, None),
        };
        let kind: DeviceKind = kind
            .trim()
            .parse()
            .map_err(|_| format!("'{t}' is not a device ({})", accepted()))?;
        match index {
            None if kind == DeviceKind::Cpu => Ok(DeviceSelector::Id(DeviceId::CPU)),
            None => Ok(DeviceSelector::Kind(kind)),
            Some(i) => {
                let index: usize = i
                    .trim()
                    .parse()
                    .map_err(|_| format!("'{t}': '{i}' is not a device index ({})", accepted()))?;
                if kind == DeviceKind::Cpu && index != 0 {
                    return Err(format!("'{t}': there is one CPU device, cpu (or cpu:0)"));
                }
                Ok(DeviceSelector::Id(DeviceId { kind, index }))
            }
        }
    }
}

impl fmt::Display for DeviceSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSelector::Id(d) => write!(f, "{d}"),
            DeviceSelector::Kind(k) => write!(f, "{k}"),
        }
    }
}

/// One `device=size` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimit {
    /// The device or devices.
    pub device: DeviceSelector,
    /// Bytes the device may hold (weights, activations, staged inputs).
    pub bytes: u64,
}

/// Memory limits per device; empty: every device may use its real capacity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryLimits {
    /// The entries, in the order given.
    pub entries: Vec<MemoryLimit>,
}

impl MemoryLimits {
    /// Parses `device=size[,device=size...]`; `source` names the flag or variable in errors.
    /// Sizes are bytes, or with a K, M, G or T suffix (powers of 1024; `KiB`, `MB`, `GiB`...
    /// read the same); a device is named as `tandem devices` lists it, or by its kind alone
    /// for every device of that kind. A device named twice is an error.
    pub fn parse(text: &str, source: &str) -> Result<Self> {
        let mut entries: Vec<MemoryLimit> = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((dev, size)) = part.split_once('=') else {
                return Err(Error::invalid(
                    source,
                    format!(
                        "'{part}' is not device=size (e.g. cuda:0=8GiB,fpga-sim:0=2GiB,cpu=16GiB)"
                    ),
                ));
            };
            let device = DeviceSelector::parse(dev).map_err(|m| Error::invalid(source, m))?;
            let size = size.trim();
            let bytes = parse_bytes(size).filter(|&b| b > 0).ok_or_else(|| {
                Error::invalid(
                    source,
                    format!(
                        "{device}: '{size}' is not a memory size (accepted: a positive byte \
                         count, optionally with a K, M, G or T suffix, powers of 1024, e.g. \
                         8GiB, 512M, 1.5G)"
                    ),
                )
            })?;
            if entries.iter().any(|e| e.device == device) {
                return Err(Error::invalid(
                    source,
                    format!("{device} is given a limit twice"),
                ));
            }
            entries.push(MemoryLimit { device, bytes });
        }
        if entries.is_empty() && !text.trim().is_empty() {
            return Err(Error::invalid(
                source,
                format!("'{text}' names no device=size"),
            ));
        }
        Ok(Self { entries })
    }

    /// The limit of `id`: its own entry, else its kind's, else `None` (its real capacity).
    pub fn limit_for(&self, id: DeviceId) -> Option<u64> {
        self.entries
            .iter()
            .find(|e| e.device == DeviceSelector::Id(id))
            .or_else(|| self.entries.iter().find(|e| e.device.matches(id)))
            .map(|e| e.bytes)
    }

    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl fmt::Display for MemoryLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .entries
            .iter()
            .map(|e| format!("{}={}", e.device, human_bytes(e.bytes)))
            .collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    const CUDA0: DeviceId = DeviceId {
        kind: DeviceKind::Cuda,
        index: 0,
    };
    const CUDA1: DeviceId = DeviceId {
        kind: DeviceKind::Cuda,
        index: 1,
    };

    #[test]
    fn devices_and_units_parse() -> Result<()> {
        let l = MemoryLimits::parse("cuda:0=8GiB, fpga-sim:0=2G,cpu=1.5g", "--memory-limit")?;
        assert_eq!(l.limit_for(CUDA0), Some(8 << 30));
        assert_eq!(l.limit_for(CUDA1), None);
        let sim = DeviceId {
            kind: DeviceKind::FpgaSim,
            index: 0,
        };
        assert_eq!(l.limit_for(sim), Some(2 << 30));
        assert_eq!(l.limit_for(DeviceId::CPU), Some(3 << 29));
        // A kind alone covers each of its devices; an exact entry wins over it.
        let l = MemoryLimits::parse("cuda=4096M,cuda:1=1024", "x")?;
        assert_eq!(l.limit_for(CUDA0), Some(4 << 30));
        assert_eq!(l.limit_for(CUDA1), Some(1024));
        assert_eq!(l.to_string(), "cuda=4.0 GiB,cuda:1=1.0 KiB");
        // Aliases of kinds, cpu:0, empty text.
        let l = MemoryLimits::parse("gpu:1=1k,cpu:0=2MB", "x")?;
        assert_eq!(l.limit_for(CUDA1), Some(1024));
        assert_eq!(l.limit_for(DeviceId::CPU), Some(2 << 20));
        assert!(MemoryLimits::parse("", "x")?.is_empty());
        Ok(())
    }

    #[test]
    fn bad_entries_name_the_device_and_what_is_accepted() {
        let cases = [
            ("cuda:0", "is not device=size"),
            ("tpu:0=1G", "'tpu:0' is not a device"),
            ("cuda:x=1G", "'x' is not a device index"),
            ("cpu:1=1G", "one CPU device"),
            ("cuda:0=8GB!", "cuda:0: '8GB!' is not a memory size"),
            ("cuda:0=0", "cuda:0: '0' is not a memory size"),
            ("cuda:0=-1G", "positive byte count"),
            ("cuda:0=1G,cuda:0=2G", "cuda:0 is given a limit twice"),
            (",,", "names no device=size"),
        ];
        for (text, want) in cases {
            let e = MemoryLimits::parse(text, "--memory-limit").expect_err(text);
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{text}");
            let m = e.to_string();
            assert!(m.starts_with("--memory-limit: "), "{m}");
            assert!(m.contains(want), "{text}: {m}");
        }
        let m = MemoryLimits::parse("cuda:0=1Q", "x")
            .expect_err("unit")
            .to_string();
        assert!(m.contains("K, M, G or T suffix"), "{m}");
        let m = MemoryLimits::parse("npu=1G", "x")
            .expect_err("kind")
            .to_string();
        assert!(m.contains("cpu, cuda, fpga-sim, fpga"), "{m}");
    }
}
