//! Measured op times per device and shape (StarPU-style history), so the planner's estimates
//! come from what this machine actually did once an op has run here.
//!
//! The file (`history.json` in the user's cache, [`crate::options::Options::history`]) is
//! `{"version": 2, "entries": {KEY: {"n": N, "mean_s": S, "max_rel_error": E, "error_n": M}}}`
//! (the error fields only where a run checked its results against the f64 reference). KEY is
//! `DEVICE|OP PARAMETERS (JSON)|INPUT SHAPES`, with `|contended` appended for CPU samples
//! taken while a Verilator simulation shared the host's cores (a run with ops on `fpga-sim`):
//! those are kept apart and never used as estimates, since they run slow by a
//! factor that depends on the simulation. It is a cache, never trusted:
//! - on reading, an entry with `n` < 1 or a `mean_s` that is not a finite number in
//!   0..=[`MAX_MEAN_S`] is dropped with a warning; a file that is not JSON, not an object, or of
//!   another `version` is set aside (renamed `history.json.bad-<unix time>`) with a warning and
//!   the history starts empty. Nothing in the file can make the planner panic.
//! - on saving, the process takes an exclusive lock on `history.json.lock`, reads the file
//!   again, adds this run's samples to it (means weighted by their counts) and writes it through
//!   [`crate::files::write_atomic`], so concurrent runs lose no samples.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::backend::DeviceId;
use crate::error::{Error, Result};
use crate::ops::Op;
use crate::tensor::TensorMeta;

/// The format version of the history file this build reads and writes.
pub const HISTORY_VERSION: u64 = 2;

/// The longest mean time (seconds) an entry may hold: longer ones are dropped on reading and
/// such samples are not recorded (about 28 hours; no op of one run takes that long).
pub const MAX_MEAN_S: f64 = 1e5;

/// Running mean of one (device, op, shapes) key, and the worst error measured for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Stat {
    /// Samples.
    pub n: u64,
    /// Mean seconds.
    pub mean_s: f64,
    /// The largest relative error against the f64 reference measured under this key (runs
    /// that checked their results).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rel_error: Option<f64>,
    /// How many runs measured the error.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub error_n: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Stat {
    /// Why this entry is not acceptable, if it is not.
    fn problem(&self) -> Option<String> {
        if self.n == 0 {
            return Some("n is 0 (at least 1 sample expected)".into());
        }
        if !self.mean_s.is_finite() || !(0.0..=MAX_MEAN_S).contains(&self.mean_s) {
            return Some(format!(
                "mean_s {} is not a number of seconds in 0..={MAX_MEAN_S}",
                self.mean_s
            ));
        }
        if let Some(e) = self.max_rel_error
            && !(e.is_finite() && e >= 0.0)
        {
            return Some(format!("max_rel_error {e} is not a finite number >= 0"));
        }
        None
    }

    /// Adds `other`'s samples (mean weighted by the counts, the worse error).
    fn merge(&mut self, other: Stat) {
        self.max_rel_error = worse(self.max_rel_error, other.max_rel_error);
        self.error_n = self.error_n.saturating_add(other.error_n);
        let n = self.n.saturating_add(other.n);
        if n == 0 {
            return;
        }
        self.mean_s = (self.mean_s * self.n as f64 + other.mean_s * other.n as f64)
            / (self.n as f64 + other.n as f64);
        self.n = n;
    }

    /// Adds one sample, and its error where it was measured.
    fn add(&mut self, t_s: f64, rel_error: Option<f64>) {
        self.n = self.n.saturating_add(1);
        self.mean_s += (t_s - self.mean_s) / self.n as f64;
        if let Some(e) = rel_error.filter(|e| e.is_finite() && *e >= 0.0) {
            self.max_rel_error = worse(self.max_rel_error, Some(e));
            self.error_n = self.error_n.saturating_add(1);
        }
    }
}

fn worse(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// The suffix of the keys of samples taken under contention (see the module documentation).
const CONTENDED: &str = "|contended";

/// One entry of the history, as `tandem history show` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistoryEntry {
    /// The key as stored.
    pub key: String,
    /// The device (`cpu`, `cuda:0`, `fpga-sim:0`).
    pub device: String,
    /// The op and its parameters (JSON).
    pub op: String,
    /// The input shapes and dtypes.
    pub shapes: String,
    /// CPU times taken while a Verilator simulation shared the cores: not used as estimates.
    pub contended: bool,
    /// Samples.
    pub n: u64,
    /// Mean seconds.
    pub mean_s: f64,
    /// The largest relative error against the f64 reference measured, if any run checked.
    pub max_rel_error: Option<f64>,
    /// Runs that measured the error.
    pub error_n: u64,
}

impl HistoryEntry {
    fn new(key: &str, s: &Stat) -> Self {
        let (base, contended) = match key.strip_suffix(CONTENDED) {
            Some(b) => (b, true),
            None => (key, false),
        };
        let (device, rest) = base.split_once('|').unwrap_or((base, ""));
        let (op, shapes) = rest.rsplit_once('|').unwrap_or((rest, ""));
        Self {
            key: key.to_string(),
            device: device.to_string(),
            op: op.to_string(),
            shapes: shapes.to_string(),
            contended,
            n: s.n,
            mean_s: s.mean_s,
            max_rel_error: s.max_rel_error,
            error_n: s.error_n,
        }
    }
}

/// The file as written.
#[derive(Serialize)]
struct FileOut<'a> {
    version: u64,
    entries: &'a BTreeMap<String, Stat>,
}

/// A table of measured op times, optionally kept in a JSON file.
#[derive(Debug, Default)]
pub struct History {
    /// Everything known: the file as read, plus this process's samples.
    entries: BTreeMap<String, Stat>,
    /// This process's samples not saved yet (added to the file on [`History::save`]).
    fresh: BTreeMap<String, Stat>,
    path: Option<PathBuf>,
}

pub(crate) fn key(device: DeviceId, op: &Op, inputs: &[TensorMeta]) -> String {
    let params = serde_json::to_string(op).unwrap_or_default();
    let shapes: Vec<String> = inputs.iter().map(|m| m.to_string()).collect();
    format!("{device}|{params}|{}", shapes.join(","))
}

/// What reading the file found.
enum Read {
    /// No file.
    Missing,
    /// Read, with the entries that were acceptable.
    Entries(BTreeMap<String, Stat>),
    /// Not a history file of this version: why.
    Bad(String),
}

/// Parses the text of a history file: the acceptable entries (each dropped one with a
/// warning), or why the whole file is not acceptable.
fn parse(path: &Path, text: &str) -> std::result::Result<BTreeMap<String, Stat>, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON ({e})"))?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    match obj.get("version").and_then(|v| v.as_u64()) {
        Some(HISTORY_VERSION) => {}
        Some(other) => {
            return Err(format!(
                "version {other} (this tandem reads {HISTORY_VERSION})"
            ));
        }
        None => {
            return Err(format!(
                "no version (older format; this tandem reads {HISTORY_VERSION})"
            ));
        }
    }
    let entries = obj
        .get("entries")
        .and_then(|e| e.as_object())
        .ok_or("no `entries` object")?;
    let mut out = BTreeMap::new();
    let mut dropped = 0usize;
    for (k, v) in entries {
        let problem = match serde_json::from_value::<Stat>(v.clone()) {
            Ok(s) => match s.problem() {
                None => {
                    out.insert(k.clone(), s);
                    continue;
                }
                Some(p) => p,
            },
            Err(e) => format!("not {{\"n\": N, \"mean_s\": S}} ({e})"),
        };
        dropped += 1;
        if dropped <= 3 {
            tracing::warn!(file = %path.display(), key = %k, "op-time history: entry dropped: {problem}");
        }
    }
    if dropped > 3 {
        tracing::warn!(file = %path.display(), "op-time history: {dropped} entries dropped in all");
    }
    Ok(out)
}

/// Reads the history file at `path`.
fn read(path: &Path) -> Read {
    match std::fs::read(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Read::Missing,
        Err(e) => Read::Bad(format!("cannot be read ({e})")),
        Ok(bytes) => match std::str::from_utf8(&bytes) {
            Err(_) => Read::Bad("not UTF-8 text".into()),
            Ok(text) => match parse(path, text) {
                Ok(e) => Read::Entries(e),
                Err(why) => Read::Bad(why),
            },
        },
    }
}

/// Moves a bad history file out of the way (`<name>.bad-<unix time>`), with a warning.
fn set_aside(path: &Path, why: &str) {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "history.json".into());
    let mut aside = path.with_file_name(format!("{name}.bad-{secs}"));
    if aside.exists() {
        aside = path.with_file_name(format!("{name}.bad-{secs}-{}", std::process::id()));
    }
    match std::fs::rename(path, &aside) {
        Ok(()) => tracing::warn!(
            "op-time history {}: {why}; set aside as {} and starting afresh",
            path.display(),
            aside.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(
            "op-time history {}: {why}; not used (cannot set it aside: {e})",
            path.display()
        ),
    }
}

/// An exclusive lock on `<path>.lock`, held until dropped; `None` (with a warning) where the
/// file system cannot lock: the caller goes on unlocked.
// `File::lock` is stable since Rust 1.89; the workspace's `rust-version` (1.85) is older than
// what the code already needs (let chains, 1.88) and is to be raised with its own lint fixes.
#[allow(clippy::incompatible_msrv)]
fn lock(path: &Path) -> Option<std::fs::File> {
    let mut name = path.file_name()?.to_os_string();
    name.push(".lock");
    let lock_path = path.with_file_name(name);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path);
    match file.and_then(|f| f.lock().map(|()| f)) {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::warn!(
                "op-time history: cannot lock {} ({e}); saving without the lock",
                lock_path.display()
            );
            None
        }
    }
}

/// The entries of the file at `path`, the file set aside when it is bad. Call under
/// [`lock`], so a file another process just wrote is never set aside.
fn read_or_set_aside(path: &Path) -> BTreeMap<String, Stat> {
    match read(path) {
        Read::Missing => BTreeMap::new(),
        Read::Entries(e) => e,
        Read::Bad(why) => {
            set_aside(path, &why);
            BTreeMap::new()
        }
    }
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

    /// The history kept at `path`: empty if the file is missing; a bad file is set aside with a
    /// warning (see the module documentation), bad entries are dropped with one.
    pub fn open(path: PathBuf) -> Self {
        let entries = match read(&path) {
            Read::Missing => BTreeMap::new(),
            Read::Entries(e) => e,
            Read::Bad(_) => {
                // Look again under the lock: another process may have replaced it meanwhile.
                let _lock = lock(&path);
                read_or_set_aside(&path)
            }
        };
        Self {
            entries,
            fresh: BTreeMap::new(),
            path: Some(path),
        }
    }

    /// Records one measured time (a time over [`MAX_MEAN_S`] is not recorded).
    pub fn record(&mut self, device: DeviceId, op: &Op, inputs: &[TensorMeta], t: Duration) {
        self.record_sample(device, op, inputs, t, false, None);
    }

    /// Records one measured time and, where the run checked it, the op's relative error
    /// against the f64 reference. `contended`: the time was taken on host cores while a
    /// Verilator simulation shared them; it is kept under a key of its own (`|contended`) and
    /// never used as an estimate. A time over [`MAX_MEAN_S`] is not recorded.
    pub fn record_sample(
        &mut self,
        device: DeviceId,
        op: &Op,
        inputs: &[TensorMeta],
        t: Duration,
        contended: bool,
        rel_error: Option<f64>,
    ) {
        let t_s = t.as_secs_f64();
        if t_s > MAX_MEAN_S {
            tracing::debug!(secs = t_s, "op-time history: sample too long, not recorded");
            return;
        }
        let mut k = key(device, op, inputs);
        if contended {
            k.push_str(CONTENDED);
        }
        self.entries
            .entry(k.clone())
            .or_default()
            .add(t_s, rel_error);
        self.fresh.entry(k).or_default().add(t_s, rel_error);
    }

    /// The measured mean and its sample count, if this op with these shapes ran on this
    /// device before (samples taken under contention do not count).
    pub fn estimate(
        &self,
        device: DeviceId,
        op: &Op,
        inputs: &[TensorMeta],
    ) -> Option<(Duration, u64)> {
        self.entries
            .get(&key(device, op, inputs))
            .map(|s| (super::duration_from_secs(s.mean_s), s.n))
    }

    /// The largest relative error against the f64 reference measured for this op with these
    /// shapes on this device, and how many runs measured it (contended or not: contention
    /// changes times, not results).
    pub fn measured_error(
        &self,
        device: DeviceId,
        op: &Op,
        inputs: &[TensorMeta],
    ) -> Option<(f64, u64)> {
        let k = key(device, op, inputs);
        let mut out: Option<(f64, u64)> = None;
        for s in [
            self.entries.get(&k),
            self.entries.get(&(k.clone() + CONTENDED)),
        ]
        .into_iter()
        .flatten()
        {
            if let Some(e) = s.max_rel_error {
                out = Some(match out {
                    Some((w, n)) => (w.max(e), n + s.error_n),
                    None => (e, s.error_n),
                });
            }
        }
        out
    }

    /// Every entry, with its key taken apart (`tandem history show`).
    pub fn list(&self) -> Vec<HistoryEntry> {
        self.entries
            .iter()
            .map(|(k, s)| HistoryEntry::new(k, s))
            .collect()
    }

    /// The file this history is kept in, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Forgets everything: removes the file (under the lock, so a run saving meanwhile is
    /// not half-merged) and the samples in memory. Returns the number of entries the file
    /// held (0 where there was none).
    pub fn reset(&mut self) -> Result<usize> {
        self.entries.clear();
        self.fresh.clear();
        let Some(path) = self.path.clone() else {
            return Ok(0);
        };
        let _lock = lock(&path);
        let held = match read(&path) {
            Read::Entries(e) => e.len(),
            Read::Missing | Read::Bad(_) => 0,
        };
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(held),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(Error::file(&path, format!("cannot remove: {e}"))),
        }
    }

    /// The samples and mean seconds of every key (for inspection and tests).
    pub fn entries(&self) -> impl Iterator<Item = (&str, u64, f64)> {
        self.entries
            .iter()
            .map(|(k, s)| (k.as_str(), s.n, s.mean_s))
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds this process's new samples to the file, if this history has one: under an
    /// exclusive lock, the file is read again (other runs may have saved since), the samples
    /// are merged in, and the result is written atomically. Afterwards this history holds what
    /// the file holds.
    pub fn save(&mut self) -> Result<()> {
        let Some(path) = self.path.clone() else {
            return Ok(());
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::file(dir, format!("cannot create: {e}")))?;
        }
        let _lock = lock(&path);
        let mut merged = read_or_set_aside(&path);
        for (k, s) in &self.fresh {
            merged.entry(k.clone()).or_default().merge(*s);
        }
        let text = serde_json::to_string(&FileOut {
            version: HISTORY_VERSION,
            entries: &merged,
        })
        .map_err(|e| Error::Internal(format!("history: {e}")))?;
        crate::files::write_atomic(&path, text.as_bytes())?;
        self.entries = merged;
        self.fresh.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    fn ins() -> Vec<TensorMeta> {
        vec![TensorMeta::new(vec![4], DType::F32); 2]
    }

    #[test]
    fn mean_and_round_trip() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Internal(e.to_string()))?;
        let path = dir.path().join("h.json");
        let op = Op::Add;
        let ins = ins();
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

    #[test]
    fn saves_merge_with_what_others_saved() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Internal(e.to_string()))?;
        let path = dir.path().join("h.json");
        let op = Op::Add;
        let ins = ins();
        // Two runs open the same (empty) file, each records, each saves.
        let mut a = History::open(path.clone());
        let mut b = History::open(path.clone());
        a.record(DeviceId::CPU, &op, &ins, Duration::from_millis(1));
        b.record(DeviceId::CPU, &op, &ins, Duration::from_millis(3));
        b.record(DeviceId::CPU, &op, &ins, Duration::from_millis(3));
        a.save()?;
        b.save()?;
        // Saving again adds nothing twice.
        a.save()?;
        let h = History::open(path);
        let (t, n) = h
            .estimate(DeviceId::CPU, &op, &ins)
            .ok_or(Error::Internal("lost".into()))?;
        assert_eq!(n, 3);
        assert!((t.as_secs_f64() - 7e-3 / 3.0).abs() < 1e-9, "{t:?}");
        Ok(())
    }

    fn file_with(entries: &str) -> String {
        format!("{{\"version\": {HISTORY_VERSION}, \"entries\": {{{entries}}}}}")
    }

    #[test]
    fn bad_entries_are_dropped_good_ones_kept() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Internal(e.to_string()))?;
        let path = dir.path().join("h.json");
        let text = file_with(
            r#""huge": {"n": 1, "mean_s": 1e300}, "overflow": {"n": 3, "mean_s": 1.5e19},
               "neg": {"n": 1, "mean_s": -1}, "zero": {"n": 0, "mean_s": 1},
               "text": {"n": 1, "mean_s": "NaN"}, "short": {"n": 1},
               "ok": {"n": 2, "mean_s": 0.5}"#,
        );
        std::fs::write(&path, text).map_err(|e| Error::file(&path, e.to_string()))?;
        let h = History::open(path.clone());
        let e: Vec<_> = h.entries().collect();
        assert_eq!(e, vec![("ok", 2, 0.5)]);
        assert!(path.exists(), "a file with some good entries is kept");
        Ok(())
    }

    #[test]
    fn bad_files_are_set_aside() -> Result<()> {
        for text in [
            "garbage".to_string(),
            "[1, 2]".into(),
            // the unversioned format of earlier builds
            r#"{"entries": {"k": {"n": 1, "mean_s": 1e300}}}"#.into(),
            format!(r#"{{"version": {}, "entries": {{}}}}"#, HISTORY_VERSION + 1),
            format!(r#"{{"version": {HISTORY_VERSION}}}"#),
        ] {
            let dir = tempfile::tempdir().map_err(|e| Error::Internal(e.to_string()))?;
            let path = dir.path().join("history.json");
            std::fs::write(&path, &text).map_err(|e| Error::file(&path, e.to_string()))?;
            let mut h = History::open(path.clone());
            assert!(h.is_empty(), "{text}");
            assert!(!path.exists(), "{text}: set aside");
            let aside: Vec<String> = std::fs::read_dir(dir.path())
                .map_err(|e| Error::file(dir.path(), e.to_string()))?
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("history.json.bad-"))
                .collect();
            assert_eq!(aside.len(), 1, "{text}: {aside:?}");
            h.record(DeviceId::CPU, &Op::Add, &ins(), Duration::from_millis(1));
            h.save()?;
            assert_eq!(History::open(path).len(), 1, "{text}");
        }
        Ok(())
    }

    #[test]
    fn overlong_samples_are_not_recorded() {
        let mut h = History::in_memory();
        h.record(DeviceId::CPU, &Op::Add, &ins(), Duration::MAX);
        assert!(h.is_empty());
    }

    #[test]
    fn errors_and_contended_samples_are_kept_and_listed() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Internal(e.to_string()))?;
        let path = dir.path().join("history.json");
        let (op, ins) = (Op::Add, ins());
        let mut h = History::open(path.clone());
        h.record_sample(
            DeviceId::CPU,
            &op,
            &ins,
            Duration::from_millis(1),
            false,
            Some(1e-3),
        );
        h.record_sample(
            DeviceId::CPU,
            &op,
            &ins,
            Duration::from_millis(3),
            true,
            Some(2e-3),
        );
        h.record_sample(
            DeviceId::CPU,
            &op,
            &ins,
            Duration::from_millis(5),
            true,
            None,
        );
        h.save()?;
        let mut h = History::open(path.clone());
        // The estimate is the uncontended mean; the error the worst of both.
        let (t, n) = h
            .estimate(DeviceId::CPU, &op, &ins)
            .ok_or(Error::Internal("lost".into()))?;
        assert_eq!((t, n), (Duration::from_millis(1), 1));
        assert_eq!(h.measured_error(DeviceId::CPU, &op, &ins), Some((2e-3, 2)));
        let list = h.list();
        assert_eq!(list.len(), 2);
        let c = list
            .iter()
            .find(|e| e.contended)
            .ok_or(Error::Internal("no contended".into()))?;
        assert_eq!((c.device.as_str(), c.n, c.error_n), ("cpu", 2, 1));
        assert_eq!(c.op, r#"{"op":"add"}"#);
        assert_eq!(c.shapes, "f32[4],f32[4]");
        assert!((c.mean_s - 4e-3).abs() < 1e-12);
        assert_eq!(h.path(), Some(path.as_path()));
        // Reset removes the file and forgets everything.
        assert_eq!(h.reset()?, 2);
        assert!(h.is_empty() && !path.exists());
        assert_eq!(h.reset()?, 0);
        Ok(())
    }

    #[test]
    fn a_bad_error_field_drops_the_entry() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Internal(e.to_string()))?;
        let path = dir.path().join("h.json");
        let text = file_with(
            r#""bad": {"n": 1, "mean_s": 0.5, "max_rel_error": -1, "error_n": 1},
               "ok": {"n": 1, "mean_s": 0.5, "max_rel_error": 0.25, "error_n": 1}"#,
        );
        std::fs::write(&path, text).map_err(|e| Error::file(&path, e.to_string()))?;
        let h = History::open(path);
        let keys: Vec<_> = h.entries().map(|(k, _, _)| k.to_string()).collect();
        assert_eq!(keys, ["ok"]);
        assert_eq!(h.list()[0].max_rel_error, Some(0.25));
        Ok(())
    }
}
