//! What `tandem calibrate` measured on this machine, kept for the planner: per device the
//! host links (latency and bandwidth of uploads and downloads, fitted over a range of sizes)
//! and op times (the median time of each op and shape measured, and per op family a fit
//! `t = overhead + scale x model`, where `model` is the backend's own roofline estimate), so
//! shapes that were not measured are predicted from the ones that were.
//!
//! Kept in `<cache>/calibration/<machine>.json` (versioned; a file of another version is
//! ignored with a warning, never half-trusted). The planner's order of trust for an op's time:
//! the op-time history of real runs, then a calibrated sample of the same shape, then the
//! calibrated fit of the op family, then the backend's model.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backend::{DeviceId, DeviceKind};
use crate::error::{Error, Result};
use crate::ops::Op;
use crate::tensor::TensorMeta;

/// Version of the calibration file layout.
pub const CALIBRATION_VERSION: u32 = 1;

/// A fitted link: moving `b` bytes takes `latency_s + b / bytes_per_s`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkFit {
    /// Fixed cost of one transfer, seconds.
    pub latency_s: f64,
    /// Bandwidth, bytes per second.
    pub bytes_per_s: f64,
    /// The measured points (bytes, median seconds) the fit came from.
    pub points: Vec<(u64, f64)>,
}

impl LinkFit {
    /// Least-squares fit of `t = latency + bytes / bandwidth` over `points`, weighting each
    /// point by its relative error (small and large transfers count alike). `None` without at
    /// least two distinct sizes, or when the times do not grow with the size.
    pub fn fit(points: &[(u64, f64)]) -> Option<Self> {
        let xy: Vec<(f64, f64)> = points.iter().map(|&(b, t)| (b as f64, t)).collect();
        let (a, s) = fit_affine(&xy)?;
        (s > 0.0).then(|| Self {
            latency_s: a,
            bytes_per_s: 1.0 / s,
            points: points.to_vec(),
        })
    }

    /// Predicted time to move `bytes`.
    pub fn time(&self, bytes: usize) -> Duration {
        super::duration_from_secs(self.latency_s + bytes as f64 / self.bytes_per_s)
    }
}

/// The fit of one op family on one device: `t = overhead_s + scale x model`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpFit {
    /// Fixed cost per launch beyond the model, seconds (>= 0).
    pub overhead_s: f64,
    /// Measured time per second of modelled time (1 / the fraction of the model's peak
    /// reached).
    pub scale: f64,
    /// Shapes the fit came from.
    pub n: usize,
    /// Largest relative error of the fit on those shapes.
    pub max_rel_error: f64,
}

impl OpFit {
    /// Fits `points` of (model seconds, measured seconds); `None` without a usable point.
    pub fn fit(points: &[(f64, f64)]) -> Option<Self> {
        let (overhead_s, scale) = match fit_affine(points) {
            Some((a, s)) if s > 0.0 => (a, s),
            // One shape, or times that do not grow with the model: a pure scale.
            _ => (0.0, fit_scale(points)?),
        };
        let max_rel_error = points
            .iter()
            .map(|&(m, t)| ((overhead_s + scale * m) - t).abs() / t)
            .fold(0.0, f64::max);
        Some(Self {
            overhead_s,
            scale,
            n: points.len(),
            max_rel_error,
        })
    }

    /// Predicted time of a launch the model puts at `model`.
    pub fn time(&self, model: Duration) -> Duration {
        super::duration_from_secs(self.overhead_s + self.scale * model.as_secs_f64())
    }
}

/// What calibration measured on one device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceCalibration {
    /// The device's name as `tandem devices` shows it.
    pub name: String,
    /// Host to device copies (none for the CPU).
    pub upload: Option<LinkFit>,
    /// Device to host copies (none for the CPU).
    pub download: Option<LinkFit>,
    /// Per op family (`linear`, `attention`, ...), the fit over the measured shapes.
    pub ops: BTreeMap<String, OpFit>,
    /// Per op and shape (the op-time history's key), the median measured seconds.
    pub samples: BTreeMap<String, f64>,
}

/// Where an estimate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Calibrated {
    /// This op and shape was measured by `tandem calibrate`.
    Sample,
    /// Predicted by the op family's fit from other shapes.
    Fit,
}

/// Everything `tandem calibrate` measured on one machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// [`CALIBRATION_VERSION`].
    pub version: u32,
    /// The machine it was measured on (its host name).
    pub machine: String,
    /// Seconds since the Unix epoch when it was measured.
    pub created_unix: u64,
    /// The tandem version that measured it.
    pub tool_version: String,
    /// Per device (`cuda:0`, `cpu`, ...).
    pub devices: BTreeMap<String, DeviceCalibration>,
}

impl Calibration {
    /// An empty calibration of this machine.
    pub fn new(machine: impl Into<String>) -> Self {
        Self {
            version: CALIBRATION_VERSION,
            machine: machine.into(),
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            tool_version: env!("CARGO_PKG_VERSION").into(),
            devices: BTreeMap::new(),
        }
    }

    /// Where the calibration of `machine` is kept under the cache folder `cache_dir`.
    pub fn path(cache_dir: &Path, machine: &str) -> PathBuf {
        let safe: String = machine
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        cache_dir.join("calibration").join(format!("{safe}.json"))
    }

    /// The calibration at `path`: `Ok(None)` when there is none, or when it is of another
    /// version or another machine (a warning says so); an unreadable or malformed file is an
    /// error naming it.
    pub fn load(path: &Path, machine: &str) -> Result<Option<Self>> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::file(path, e.to_string())),
        };
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::file(path, format!("not a calibration file: {e}")))?;
        let version = v.get("version").and_then(|v| v.as_u64());
        if version != Some(u64::from(CALIBRATION_VERSION)) {
            tracing::warn!(
                "calibration {}: version {version:?}, this tandem reads version \
                 {CALIBRATION_VERSION}; ignored (run `tandem calibrate` again)",
                path.display()
            );
            return Ok(None);
        }
        let c: Self = serde_json::from_value(v)
            .map_err(|e| Error::file(path, format!("malformed calibration: {e}")))?;
        if c.machine != machine {
            tracing::warn!(
                "calibration {} was measured on `{}`, not on this machine (`{machine}`); ignored",
                path.display(),
                c.machine
            );
            return Ok(None);
        }
        Ok(Some(c))
    }

    /// Writes it to `path` (atomically: a reader sees the old file or the new one).
    pub fn save(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::file(dir, e.to_string()))?;
        }
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| Error::Internal(format!("calibration to JSON: {e}")))?;
        crate::files::write_atomic(path, text.as_bytes())
    }

    /// The calibrated time of `op` on `inputs` on `device`, where `model` is the backend's own
    /// estimate: the measured sample of this shape, else the op family's fit.
    pub fn estimate(
        &self,
        device: DeviceId,
        op: &Op,
        inputs: &[TensorMeta],
        model: Duration,
    ) -> Option<(Duration, Calibrated)> {
        let d = self.devices.get(&device.to_string())?;
        if let Some(&s) = d.samples.get(&super::history::key(device, op, inputs)) {
            return Some((super::duration_from_secs(s), Calibrated::Sample));
        }
        d.ops
            .get(op.name())
            .map(|f| (f.time(model), Calibrated::Fit))
    }

    /// The calibrated time to move `bytes` from `from` to `to` (through the host between two
    /// accelerators), where every link on the way was measured.
    pub fn transfer(&self, bytes: usize, from: DeviceId, to: DeviceId) -> Option<Duration> {
        if from == to || bytes == 0 {
            return Some(Duration::ZERO);
        }
        let down = |d: DeviceId| -> Option<Duration> {
            if d.kind == DeviceKind::Cpu {
                return Some(Duration::ZERO);
            }
            Some(
                self.devices
                    .get(&d.to_string())?
                    .download
                    .as_ref()?
                    .time(bytes),
            )
        };
        let up = |d: DeviceId| -> Option<Duration> {
            if d.kind == DeviceKind::Cpu {
                return Some(Duration::ZERO);
            }
            Some(
                self.devices
                    .get(&d.to_string())?
                    .upload
                    .as_ref()?
                    .time(bytes),
            )
        };
        Some(down(from)?.saturating_add(up(to)?))
    }
}

/// This machine's name for calibration files: its host name.
pub fn machine_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "this-machine".into())
}

/// Weighted least squares of `y = a + s x` minimising the relative error of each point
/// (weight 1/y^2), with `a >= 0`; `None` without two distinct x or with a non-positive y.
fn fit_affine(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    if points
        .iter()
        .any(|&(x, y)| !(x.is_finite() && y.is_finite() && y > 0.0))
    {
        return None;
    }
    let (mut sw, mut swx, mut swy, mut swxx, mut swxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(x, y) in points {
        let w = 1.0 / (y * y);
        sw += w;
        swx += w * x;
        swy += w * y;
        swxx += w * x * x;
        swxy += w * x * y;
    }
    let det = sw * swxx - swx * swx;
    if det.abs() <= f64::EPSILON * sw * swxx {
        return None;
    }
    let s = (sw * swxy - swx * swy) / det;
    let a = (swy - s * swx) / sw;
    if a >= 0.0 {
        Some((a, s))
    } else {
        // The intercept wants to be negative: the best fit through the origin.
        Some((0.0, fit_scale(points)?))
    }
}

/// Weighted least squares of `y = s x` (weight 1/y^2); `None` without a usable point.
fn fit_scale(points: &[(f64, f64)]) -> Option<f64> {
    let (mut num, mut den) = (0.0, 0.0);
    for &(x, y) in points {
        if !(x.is_finite() && y.is_finite() && y > 0.0 && x >= 0.0) {
            return None;
        }
        let w = 1.0 / (y * y);
        num += w * x * y;
        den += w * x * x;
    }
    (den > 0.0).then(|| num / den).filter(|s| *s > 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::ops::{Activation, LinearParams};

    #[test]
    fn a_link_fit_recovers_latency_and_bandwidth() {
        let (lat, bw) = (12e-6, 25e9);
        let pts: Vec<(u64, f64)> = [4096u64, 1 << 16, 1 << 20, 1 << 24, 1 << 26]
            .iter()
            .map(|&b| (b, lat + b as f64 / bw))
            .collect();
        let f = LinkFit::fit(&pts).expect("fit");
        assert!((f.latency_s - lat).abs() / lat < 1e-6, "{f:?}");
        assert!((f.bytes_per_s - bw).abs() / bw < 1e-6, "{f:?}");
        // One size cannot tell latency from bandwidth.
        assert_eq!(LinkFit::fit(&pts[..1]), None);
        assert_eq!(LinkFit::fit(&[(4096, 1e-5), (4096, 2e-5)]), None);
    }

    #[test]
    fn an_op_fit_predicts_within_its_stated_error() {
        // Measured = 8 us + 1.6 x model, with +-5% noise.
        let pts: Vec<(f64, f64)> = [1e-5, 1e-4, 1e-3, 1e-2]
            .iter()
            .zip([1.05, 0.95, 1.02, 0.98])
            .map(|(&m, n)| (m, (8e-6 + 1.6 * m) * n))
            .collect();
        let f = OpFit::fit(&pts).expect("fit");
        assert!((f.scale - 1.6).abs() < 0.1, "{f:?}");
        assert!(f.max_rel_error < 0.07, "{f:?}");
        for &(m, t) in &pts {
            let p = f.time(Duration::from_secs_f64(m)).as_secs_f64();
            assert!((p - t).abs() / t <= f.max_rel_error + 1e-12);
        }
        // A single shape: a pure scale through it.
        let one = OpFit::fit(&[(2e-3, 5e-3)]).expect("fit");
        assert_eq!(one.overhead_s, 0.0);
        assert!((one.scale - 2.5).abs() < 1e-12);
        assert_eq!(OpFit::fit(&[]), None);
        assert_eq!(OpFit::fit(&[(1e-3, f64::NAN)]), None);
    }

    fn linear() -> (Op, Vec<TensorMeta>) {
        (
            Op::Linear(LinearParams {
                act: Activation::None,
                bias: false,
                f32_out: false,
            }),
            vec![
                TensorMeta::new(vec![64, 32], DType::F32),
                TensorMeta::new(vec![16, 32], DType::F32),
            ],
        )
    }

    #[test]
    fn estimates_prefer_the_measured_shape_then_the_fit_and_transfers_add_links() {
        let dev = DeviceId {
            kind: DeviceKind::Cuda,
            index: 0,
        };
        let (op, ins) = linear();
        let mut c = Calibration::new("m");
        let mut d = DeviceCalibration::default();
        d.ops.insert(
            "linear".into(),
            OpFit {
                overhead_s: 1e-5,
                scale: 2.0,
                n: 3,
                max_rel_error: 0.1,
            },
        );
        d.upload = LinkFit::fit(&[(1000, 2e-6), (1_000_000, 1e-4 + 1e-6)]);
        d.download = d.upload.clone();
        c.devices.insert(dev.to_string(), d);
        let model = Duration::from_micros(100);
        let (t, how) = c.estimate(dev, &op, &ins, model).expect("fit");
        assert_eq!(how, Calibrated::Fit);
        assert!((t.as_secs_f64() - 210e-6).abs() < 1e-9);
        c.devices
            .get_mut(&dev.to_string())
            .expect("device")
            .samples
            .insert(super::super::history::key(dev, &op, &ins), 3e-4);
        assert_eq!(
            c.estimate(dev, &op, &ins, model),
            Some((Duration::from_micros(300), Calibrated::Sample))
        );
        // Another device was not calibrated.
        let other = DeviceId {
            kind: DeviceKind::Cuda,
            index: 1,
        };
        assert_eq!(c.estimate(other, &op, &ins, model), None);
        let up = c.transfer(1_000_000, DeviceId::CPU, dev).expect("up");
        let both = c.transfer(1_000_000, dev, dev).expect("same");
        assert_eq!(both, Duration::ZERO);
        assert!(up > Duration::from_micros(95) && up < Duration::from_micros(110));
        assert_eq!(
            c.transfer(1_000_000, dev, other),
            None,
            "cuda:1 has no links"
        );
    }

    #[test]
    fn files_round_trip_and_other_versions_or_machines_are_ignored() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Internal(e.to_string()))?;
        let path = Calibration::path(dir.path(), "host/1");
        assert!(path.ends_with("calibration/host_1.json"));
        assert_eq!(Calibration::load(&path, "host/1")?, None);
        let mut c = Calibration::new("host/1");
        c.devices.insert("cpu".into(), DeviceCalibration::default());
        c.save(&path)?;
        assert_eq!(Calibration::load(&path, "host/1")?, Some(c.clone()));
        assert_eq!(Calibration::load(&path, "another")?, None);
        let mut v: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(&path).map_err(|e| Error::file(&path, e.to_string()))?,
        )
        .map_err(|e| Error::Internal(e.to_string()))?;
        v["version"] = serde_json::json!(CALIBRATION_VERSION + 1);
        std::fs::write(&path, v.to_string()).map_err(|e| Error::file(&path, e.to_string()))?;
        assert_eq!(Calibration::load(&path, "host/1")?, None);
        std::fs::write(&path, "{ not json").map_err(|e| Error::file(&path, e.to_string()))?;
        let e = Calibration::load(&path, "host/1").expect_err("malformed");
        assert!(e.to_string().contains("not a calibration file"), "{e}");
        Ok(())
    }
}
