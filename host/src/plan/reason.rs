//! Why the planner put a node where it did: the devices it considered, kept as data while
//! planning and written out only when someone reads it (`--explain`, reports), so planning a
//! large graph formats no text.

use std::fmt;
use std::time::Duration;

use serde::{Serialize, Serializer};

use crate::backend::DeviceId;

/// Where an op-time estimate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EstimateSource {
    /// The op-time history, from this many runs.
    Measured(u64),
    /// `tandem calibrate`'s measurement of this very shape.
    CalibratedShape,
    /// `tandem calibrate`'s fit of the op family.
    CalibratedFit,
    /// The backend's cost model.
    Model,
}

impl EstimateSource {
    /// The history's sample count, where the estimate came from it.
    pub fn samples(self) -> Option<u64> {
        match self {
            EstimateSource::Measured(n) => Some(n),
            _ => None,
        }
    }

    /// How calibration gave the estimate, where it did (`Placement::calibrated`).
    pub fn calibrated(self) -> Option<&'static str> {
        match self {
            EstimateSource::CalibratedShape => Some("calibrated shape"),
            EstimateSource::CalibratedFit => Some("calibrated fit"),
            _ => None,
        }
    }
}

impl fmt::Display for EstimateSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EstimateSource::Measured(n) => write!(f, "measured, n={n}"),
            EstimateSource::CalibratedShape | EstimateSource::CalibratedFit => {
                f.write_str(self.calibrated().unwrap_or_default())
            }
            EstimateSource::Model => f.write_str("model"),
        }
    }
}

/// One device the planner looked at for a node, and what it found.
#[derive(Debug, Clone, PartialEq)]
pub enum Considered {
    /// The device has no kernel for the op on these inputs (or they never fit its memory).
    No(DeviceId, String),
    /// The policy kept the device off (lossy numerics).
    NotUsed(DeviceId, String),
    /// The device holds too much already.
    NoRoom(DeviceId, String),
    /// The node fits, but its layer's weights would evict others there: the time to fetch
    /// them again is added to its finish (the `Timed` entry before this one is without it).
    Evicts(DeviceId, String),
    /// A candidate: its op time and when the node would be done there.
    Timed {
        /// The device.
        device: DeviceId,
        /// Estimated op time.
        op: Duration,
        /// Where the estimate came from.
        source: EstimateSource,
        /// Estimated finish in the schedule.
        done: Duration,
    },
}

impl fmt::Display for Considered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Considered::No(d, why) => write!(f, "{d}: no ({why})"),
            Considered::NotUsed(d, why) => write!(f, "{d}: not used ({why})"),
            Considered::NoRoom(d, why) => write!(f, "{d}: no room ({why})"),
            Considered::Evicts(d, why) => write!(f, "{d}: evicts ({why})"),
            Considered::Timed {
                device,
                op,
                source,
                done,
            } => write!(
                f,
                "{device}: op {:.3} ms ({source}), done at {:.3} ms",
                op.as_secs_f64() * 1e3,
                done.as_secs_f64() * 1e3
            ),
        }
    }
}

/// Why a node went where it did: the devices considered, in the order looked at. Displays
/// (and serializes) as one line, `; `-separated. Two devices' entries are held inline (the
/// usual case: the requested device and the CPU), so planning a node allocates nothing here.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reason(pub smallvec::SmallVec<[Considered; 2]>);

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

impl Serialize for Reason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_read_as_before() {
        let r = Reason(smallvec::smallvec![
            Considered::No(DeviceId::CPU, "no kernel".into()),
            Considered::Timed {
                device: DeviceId::CPU,
                op: Duration::from_micros(1500),
                source: EstimateSource::Measured(2),
                done: Duration::from_millis(3),
            },
        ]);
        assert_eq!(
            r.to_string(),
            "cpu: no (no kernel); cpu: op 1.500 ms (measured, n=2), done at 3.000 ms"
        );
        assert_eq!(serde_json::to_string(&r).expect("json"), format!("\"{r}\""));
        assert_eq!(Reason::default().to_string(), "");
    }
}
