//! Admission control: what a run needs, counted with overflow checks before anything is
//! allocated, against what the machine has.
//!
//! A workload or an op's inputs are admitted in two steps: the sizes are multiplied with
//! checked arithmetic (a product past `u64` is an error naming the tensor, never a panic or a
//! failed allocation), and the bytes the run will allocate are compared with
//! [`Limits::memory_bytes`] (by default the host's available memory, `MemAvailable`; the
//! `TANDEM_MAX_MEMORY` setting changes it). Each device's memory is the planner's business:
//! an op that does not fit a device is not placed there.

use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::tensor::TensorMeta;

/// Host memory assumed when `/proc/meminfo` cannot be read.
const UNKNOWN_HOST_MEMORY: u64 = 8 << 30;

/// What a run may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of host memory a run may allocate.
    pub memory_bytes: u64,
    /// Where the figure came from, for the error message.
    pub source: LimitSource,
}

/// Where [`Limits::memory_bytes`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitSource {
    /// The host's available memory (`MemAvailable` in /proc/meminfo).
    Available,
    /// Nothing could be read; a fixed 8 GiB is assumed.
    Assumed,
    /// Set by the user (`TANDEM_MAX_MEMORY`).
    Setting,
}

impl Default for Limits {
    fn default() -> Self {
        Self::host()
    }
}

impl Limits {
    /// The host's available memory now.
    pub fn host() -> Self {
        match available_memory() {
            Some(b) => Self {
                memory_bytes: b,
                source: LimitSource::Available,
            },
            None => Self {
                memory_bytes: UNKNOWN_HOST_MEMORY,
                source: LimitSource::Assumed,
            },
        }
    }

    /// A limit set by the user.
    pub fn with_memory(bytes: u64) -> Self {
        Self {
            memory_bytes: bytes,
            source: LimitSource::Setting,
        }
    }

    /// Checks that `need` bytes (`None`: more than `u64` can count) fit; `what` names the
    /// thing that needs them.
    pub fn admit(&self, what: &str, need: Option<u64>) -> Result<()> {
        let have = format!(
            "{} {}",
            human_bytes(self.memory_bytes),
            match self.source {
                LimitSource::Available => "available (host MemAvailable)",
                LimitSource::Assumed => "assumed (host memory unknown)",
                LimitSource::Setting => "allowed (TANDEM_MAX_MEMORY)",
            }
        );
        match need {
            Some(n) if n <= self.memory_bytes => Ok(()),
            Some(n) => Err(Error::invalid(
                what,
                format!(
                    "needs {} of host memory, {have}; make it smaller, or set \
                     TANDEM_MAX_MEMORY (bytes, or with a K/M/G/T suffix) if more will be free",
                    human_bytes(n)
                ),
            )),
            None => Err(Error::invalid(
                what,
                format!("needs more than 16 EiB of host memory (its sizes overflow), {have}"),
            )),
        }
    }
}

/// `MemAvailable` of /proc/meminfo, in bytes.
fn available_memory() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = s
        .lines()
        .find(|l| l.starts_with("MemAvailable"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    kb.checked_mul(1024)
}

/// Elements of `shape`, or `None` when the product overflows.
pub fn numel(shape: &[usize]) -> Option<u64> {
    shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(u64::try_from(d).ok()?))
}

/// Bytes of a tensor of `meta`, or `None` when they overflow.
pub fn meta_bytes(meta: &TensorMeta) -> Option<u64> {
    numel(&meta.shape)?.checked_mul(meta.dtype.size() as u64)
}

/// Sum of `parts`, or `None` when any part is `None` or the sum overflows.
pub fn sum(parts: impl IntoIterator<Item = Option<u64>>) -> Option<u64> {
    parts
        .into_iter()
        .try_fold(0u64, |acc, p| acc.checked_add(p?))
}

/// Bytes a run of `graph` allocates beyond its constants (which exist already): every node's
/// outputs, and with `check` what the reference comparison holds: every tensor in f64 along
/// the reference chain, plus the f64 inputs and outputs of the largest node, which the
/// per-node check holds one node at a time.
pub fn graph_need(graph: &Graph, check: bool) -> Result<Option<u64>> {
    let metas = graph.validate()?;
    let f64_bytes = |name: &String| {
        metas
            .get(name)
            .and_then(|m| numel(&m.shape))
            .and_then(|n| n.checked_mul(8))
    };
    let outputs = sum(graph
        .nodes
        .iter()
        .flat_map(|n| n.outputs.iter())
        .map(|o| metas.get(o).and_then(meta_bytes)));
    if !check {
        return Ok(outputs);
    }
    let chain = sum(metas.keys().map(f64_bytes));
    let largest_node = graph
        .nodes
        .iter()
        .map(|n| sum(n.inputs.iter().chain(&n.outputs).map(f64_bytes)))
        .try_fold(0u64, |m, b| b.map(|b| m.max(b)));
    Ok(sum([outputs, chain, largest_node]))
}

/// Checks that a run of `graph` fits `limits` (see [`graph_need`]).
pub fn admit_graph(graph: &Graph, check: bool, limits: &Limits) -> Result<()> {
    limits.admit("workload", graph_need(graph, check)?)
}

/// Parses a byte count: a number with an optional K, M, G or T suffix (powers of 1024, an
/// optional trailing `B` or `iB`), e.g. `512M`, `24GiB`, `1073741824`.
pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return None,
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let v: f64 = num.trim().parse().ok()?;
    if !v.is_finite() || v < 0.0 {
        return None;
    }
    let b = v * (1u64 << shift) as f64;
    (b < u64::MAX as f64).then_some(b as u64)
}

/// `bytes` for people: `2.0 TiB`, `512.0 MiB`, `100 B`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    #[test]
    fn products_and_sums_overflow_to_none() {
        assert_eq!(numel(&[2, 3, 4]), Some(24));
        assert_eq!(numel(&[]), Some(1));
        assert_eq!(numel(&[usize::MAX, 2]), None);
        assert_eq!(numel(&[0, usize::MAX]), Some(0));
        let m = TensorMeta::new(vec![1 << 62, 4], DType::F32);
        assert_eq!(meta_bytes(&m), None);
        assert_eq!(sum([Some(1), Some(2)]), Some(3));
        assert_eq!(sum([Some(u64::MAX), Some(1)]), None);
        assert_eq!(sum([Some(1), None]), None);
    }

    #[test]
    fn admit_says_what_is_needed_and_what_is_there() {
        let l = Limits::with_memory(1 << 30);
        assert!(l.admit("w", Some(1 << 30)).is_ok());
        let e = l
            .admit("w", Some(3 << 40))
            .expect_err("too big")
            .to_string();
        assert!(e.contains("3.0 TiB") && e.contains("1.0 GiB"), "{e}");
        let e = l.admit("w", None).expect_err("overflow").to_string();
        assert!(e.contains("overflow"), "{e}");
    }

    #[test]
    fn byte_counts_parse_with_suffixes() {
        assert_eq!(parse_bytes("1024"), Some(1024));
        assert_eq!(parse_bytes("512M"), Some(512 << 20));
        assert_eq!(parse_bytes("24GiB"), Some(24 << 30));
        assert_eq!(parse_bytes("1.5k"), Some(1536));
        assert_eq!(parse_bytes("2TB"), Some(2 << 40));
        for bad in ["", "-1", "x", "1Q", "nan", "inf", "1e30T"] {
            assert_eq!(parse_bytes(bad), None, "{bad}");
        }
        assert_eq!(human_bytes(100), "100 B");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}
