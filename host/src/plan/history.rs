//! Measured op times per device and shape (StarPU-style history), so the planner's estimates
//! come from what this machine actually did once an op has run here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backend::DeviceId;
use crate::error::{Error, Result};
use crate::ops::Op;
use crate::tensor::TensorMeta;

/// Running mean of one (device, op, shapes) key.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Stat {
    /// Samples.
    pub n: u64,
    /// Mean seconds.
    pub mean_s: f64,
}

/// A table of measured op times, optionally kept in a JSON file.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct History {
    entries: BTreeMap<String, Stat>,
    #[serde(skip)]
    path: Option<PathBuf>,
}

fn key(device: DeviceId, op: &Op, inputs: &[TensorMeta]) -> String {
    let params = serde_json::to_string(op).unwrap_or_default();
    let shapes: Vec<String> = inputs.iter().map(|m| m.to_string()).collect();
    format!("{device}|{params}|{}", shapes.join(","))
}

impl History {
    /// An empty history kept in memory only.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// The history kept at `path` ([`crate::options::Options::history`]), or in memory only
    /// when there is none.
    pub fn at(path: Option<&Path>) -> Self {
        match path {
            Some(p) => Self::open(p.to_path_buf()),
            None => Self::in_memory(),
        }
    }

    /// The history kept at `path` (new if the file is missing or unreadable).
    pub fn open(path: PathBuf) -> Self {
        let mut h: History = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        h.path = Some(path);
        h
    }

    /// Records one measured time.
    pub fn record(&mut self, device: DeviceId, op: &Op, inputs: &[TensorMeta], t: Duration) {
        let s = self.entries.entry(key(device, op, inputs)).or_default();
        s.n += 1;
        s.mean_s += (t.as_secs_f64() - s.mean_s) / s.n as f64;
    }

    /// The measured mean, if this op with these shapes ran on this device before.
    pub fn estimate(
        &self,
        device: DeviceId,
        op: &Op,
        inputs: &[TensorMeta],
    ) -> Option<(Duration, u64)> {
        self.entries
            .get(&key(device, op, inputs))
            .map(|s| (Duration::from_secs_f64(s.mean_s.max(0.0)), s.n))
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Writes the file, if this history has one (atomically: temporary file, then rename).
    pub fn save(&self) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::file(dir, format!("cannot create: {e}")))?;
        }
        let text =
            serde_json::to_string(self).map_err(|e| Error::Internal(format!("history: {e}")))?;
        let tmp = path.with_extension("json.partial");
        std::fs::write(&tmp, text).map_err(|e| Error::file(&tmp, format!("cannot write: {e}")))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::file(path, format!("cannot write: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    #[test]
    fn mean_and_round_trip() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Internal(e.to_string()))?;
        let path = dir.path().join("h.json");
        let op = Op::Add;
        let ins = vec![TensorMeta::new(vec![4], DType::F32); 2];
        let mut h = History::open(path.clone());
        assert!(h.estimate(DeviceId::CPU, &op, &ins).is_none());
        h.record(DeviceId::CPU, &op, &ins, Duration::from_millis(2));
        h.record(DeviceId::CPU, &op, &ins, Duration::from_millis(4));
        h.save()?;
        let h2 = History::open(path);
        let (t, n) = h2
            .estimate(DeviceId::CPU, &op, &ins)
            .ok_or(Error::Internal("lost".into()))?;
        assert_eq!(n, 2);
        assert!((t.as_secs_f64() - 0.003).abs() < 1e-9);
        let other = vec![TensorMeta::new(vec![5], DType::F32); 2];
        assert!(h2.estimate(DeviceId::CPU, &op, &other).is_none());
        Ok(())
    }
}
