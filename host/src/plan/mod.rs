//! Where each op runs: a HEFT-style list scheduler over the backends' cost estimates, with
//! transfer costs, and `--explain` text for its choices. Estimates come from the measured
//! history where this op and shape ran on the device before, else from the backend's model.

mod history;

pub use history::{HISTORY_VERSION, History, MAX_MEAN_S};

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

use crate::backend::{DeviceId, DeviceKind, DeviceRegistry, Support};
use crate::error::Result;
use crate::graph::Graph;
use crate::tensor::TensorMeta;

/// Which devices a run may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// Every device found; the planner picks per op.
    Auto,
    /// One kind of device; ops it lacks run on the CPU.
    Only(DeviceKind),
}

impl BackendChoice {
    /// `auto`, or the device kind's name.
    pub fn name(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Only(k) => k.name(),
        }
    }
}

impl FromStr for BackendChoice {
    type Err = String;
    /// `auto`, or a device kind as [`DeviceKind`] parses it (names and aliases).
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == "auto" {
            return Ok(BackendChoice::Auto);
        }
        s.parse::<DeviceKind>()
            .map(BackendChoice::Only)
            .map_err(|_| {
                format!(
                    "unknown backend '{s}' (accepted: auto, {})",
                    DeviceKind::accepted()
                )
            })
    }
}

/// Where one node runs and why.
#[derive(Debug, Clone, Serialize)]
pub struct Placement {
    /// Device.
    pub device: DeviceId,
    /// Estimated op time there.
    pub estimate: Duration,
    /// Estimated finish time of the node in the schedule.
    pub finish: Duration,
    /// Why this device (the alternatives considered, or why it fell back).
    pub reason: String,
}

/// A placement for every node, and warnings about devices that were asked for but missing.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// One per node, in the graph's order.
    pub placements: Vec<Placement>,
    /// Things the user should know (a requested device is missing, an op fell back).
    pub warnings: Vec<String>,
    /// Estimated time of the whole schedule.
    pub makespan: Duration,
}

/// `secs` seconds as a [`Duration`], saturating: NaN and negative values give zero, values
/// past [`Duration::MAX`] give it (`Duration::from_secs_f64` panics on both). Every estimate
/// computed in floating point goes through here.
pub fn duration_from_secs(secs: f64) -> Duration {
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
}

/// Bandwidth assumed between host and an accelerator (PCIe 4 x16 in practice).
const HOST_LINK_BPS: f64 = 20e9;
/// Fixed cost of one transfer.
const TRANSFER_LATENCY: Duration = Duration::from_micros(10);

/// Estimated time to move `bytes` from one device to another.
pub fn transfer_cost(bytes: usize, from: DeviceId, to: DeviceId) -> Duration {
    if from == to || bytes == 0 {
        return Duration::ZERO;
    }
    let hops = if from.kind == DeviceKind::Cpu || to.kind == DeviceKind::Cpu {
        1.0
    } else {
        2.0
    };
    TRANSFER_LATENCY.saturating_add(duration_from_secs(hops * bytes as f64 / HOST_LINK_BPS))
}

/// Places every node of `graph`. Never fails for a missing device: work falls back to the
/// devices that exist, with a warning.
pub fn plan(graph: &Graph, reg: &DeviceRegistry, choice: BackendChoice) -> Result<Plan> {
    plan_with_history(graph, reg, choice, None)
}

/// [`plan`], with estimates taken from `history` where it has them.
pub fn plan_with_history(
    graph: &Graph,
    reg: &DeviceRegistry,
    choice: BackendChoice,
    history: Option<&History>,
) -> Result<Plan> {
    let metas = graph.validate()?;
    let mut warnings = Vec::new();
    let candidates: Vec<DeviceId> = match choice {
        BackendChoice::Auto => reg.backends().iter().map(|b| b.id()).collect(),
        BackendChoice::Only(kind) => {
            let found: Vec<DeviceId> = reg.of_kind(kind).iter().map(|b| b.id()).collect();
            if found.is_empty() {
                let why = reg
                    .missing()
                    .iter()
                    .find(|m| m.kind == kind)
                    .map(|m| m.reason.clone())
                    .unwrap_or_else(|| "not found".into());
                warnings.push(format!(
                    "{} is unavailable ({why}); running on the CPU",
                    kind.name()
                ));
                vec![DeviceId::CPU]
            } else if kind == DeviceKind::Cpu {
                found
            } else {
                // Ops the device lacks fall back to the CPU.
                found.into_iter().chain([DeviceId::CPU]).collect()
            }
        }
    };
    let mut device_free: BTreeMap<DeviceId, Duration> = BTreeMap::new();
    // Where each tensor will be, and when.
    let mut location: BTreeMap<&str, (DeviceId, Duration)> = graph
        .constants
        .keys()
        .map(|k| (k.as_str(), (DeviceId::CPU, Duration::ZERO)))
        .collect();
    let mut placements = Vec::with_capacity(graph.nodes.len());
    let mut makespan = Duration::ZERO;
    let mut fell_back: Vec<&str> = Vec::new();
    for node in &graph.nodes {
        let ins: Vec<TensorMeta> = node.inputs.iter().map(|i| metas[i].clone()).collect();
        let mut best: Option<(Duration, Duration, DeviceId)> = None;
        let mut considered = Vec::new();
        let preferred = match choice {
            BackendChoice::Only(k) => Some(k),
            BackendChoice::Auto => None,
        };
        for &dev in &candidates {
            let Some(b) = reg.get(dev) else { continue };
            if let Support::No(why) = b.supports(&node.op, &ins) {
                considered.push(format!("{dev}: no ({why})"));
                continue;
            }
            let (est, measured) = match history.and_then(|h| h.estimate(dev, &node.op, &ins)) {
                Some((t, n)) => (t, format!(" (measured, n={n})")),
                None => (b.estimate(&node.op, &ins), String::new()),
            };
            let ready = node
                .inputs
                .iter()
                .zip(&ins)
                .map(|(name, m)| {
                    let (at, t) = location
                        .get(name.as_str())
                        .copied()
                        .unwrap_or((DeviceId::CPU, Duration::ZERO));
                    t.saturating_add(transfer_cost(m.bytes(), at, dev))
                })
                .max()
                .unwrap_or_default();
            let start = ready.max(device_free.get(&dev).copied().unwrap_or_default());
            let finish = start.saturating_add(est);
            considered.push(format!(
                "{dev}: {:.3} ms{measured}",
                finish.as_secs_f64() * 1e3
            ));
            // With an explicit backend, its device wins whenever it supports the op.
            let rank = |d: DeviceId| match preferred {
                Some(k) if d.kind == k => 0,
                Some(_) => 1,
                None => 0,
            };
            let better = match best {
                None => true,
                Some((bf, _, bd)) => (rank(dev), finish) < (rank(bd), bf),
            };
            if better {
                best = Some((finish, est, dev));
            }
        }
        let (finish, est, dev) = best.unwrap_or((Duration::ZERO, Duration::ZERO, DeviceId::CPU));
        if let Some(k) = preferred {
            if dev.kind != k && k != DeviceKind::Cpu && !reg.of_kind(k).is_empty() {
                fell_back.push(node.op.name());
            }
        }
        device_free.insert(dev, finish);
        for o in &node.outputs {
            location.insert(o.as_str(), (dev, finish));
        }
        makespan = makespan.max(finish);
        placements.push(Placement {
            device: dev,
            estimate: est,
            finish,
            reason: considered.join("; "),
        });
    }
    if let (BackendChoice::Only(k), false) = (choice, fell_back.is_empty()) {
        let ran = graph.nodes.len() - fell_back.len();
        fell_back.sort_unstable();
        fell_back.dedup();
        warnings.push(format!(
            "{} runs {ran} of {} ops; it has no kernel for {}, which run on the CPU (--explain says why)",
            k.name(),
            graph.nodes.len(),
            fell_back.join(", ")
        ));
    }
    Ok(Plan {
        placements,
        warnings,
        makespan,
    })
}

/// The plan as text, one line per node: device, estimate, and the alternatives weighed.
pub fn explain(graph: &Graph, plan: &Plan) -> String {
    let mut s = String::new();
    for (n, p) in graph.nodes.iter().zip(&plan.placements) {
        s.push_str(&format!(
            "{:<22} {:<12} -> {:<10} est {:>9.3} ms   [{}]\n",
            n.name,
            n.op.name(),
            p.device.to_string(),
            p.estimate.as_secs_f64() * 1e3,
            p.reason
        ));
    }
    s.push_str(&format!(
        "estimated makespan {:.3} ms\n",
        plan.makespan.as_secs_f64() * 1e3
    ));
    for w in &plan.warnings {
        s.push_str(&format!("warning: {w}\n"));
    }
    s
}
