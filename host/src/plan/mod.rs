//! Where each op runs: a HEFT-style list scheduler over the backends' cost estimates, with
//! transfer costs, under a [`PlacementPolicy`] (which numerics auto placement may use, whether
//! the history counts, how strictly a requested backend is held to), and `--explain` text for
//! its choices. Estimates come from the measured history where this op and shape ran on the
//! device before, else from `tandem calibrate`'s measurements (`calibration`: the same shape,
//! else the op family's fit), else from the backend's model; transfers from the calibrated
//! links where they were measured.

mod calibration;
mod explain;
mod history;
mod memory;
mod policy;
mod reason;

pub use calibration::{
    CALIBRATION_VERSION, Calibrated, Calibration, DeviceCalibration, LinkFit, OpFit, machine_name,
};
pub use explain::{explain, explain_measured, memory_lines};
pub use history::{HISTORY_VERSION, History, HistoryEntry, MAX_MEAN_S, Stat};
pub use memory::{PlannedMemory, layer_of};
pub use policy::PlacementPolicy;
pub use reason::{Considered, EstimateSource, Reason};

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

use crate::backend::{DeviceId, DeviceKind, DeviceRegistry, Numerics, Support};
use crate::error::{Error, Result};
use crate::graph::{Graph, GraphIndex};
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
    /// The device's numerics class (lossy unless `f32`).
    pub numerics: Numerics,
    /// Estimated op time there.
    pub estimate: Duration,
    /// Samples behind the estimate when it came from the op-time history; `None` when it
    /// came from calibration or the backend's model.
    pub history_samples: Option<u64>,
    /// Whether the estimate came from `tandem calibrate`'s measurements (and how).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibrated: Option<&'static str>,
    /// Estimated finish time of the node in the schedule (from the start of the run).
    pub finish: Duration,
    /// Why this device: the alternatives considered (displays as one line).
    pub reason: Reason,
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
    /// The policy the plan was made under.
    pub policy: PlacementPolicy,
    /// Placements whose estimate on the chosen device came from the op-time history.
    pub from_history: usize,
    /// Devices auto placement kept off some ops because their numerics are lossy, as
    /// `device (numerics): N ops`.
    pub lossy_refused: Vec<String>,
    /// What the schedule has each device hold at most, against its memory limit.
    pub memory: Vec<PlannedMemory>,
}

impl Plan {
    /// One line on how the plan was made, for reports: the policy, the devices it kept out,
    /// and how many placements the history decided.
    pub fn summary(&self, choice: BackendChoice) -> String {
        let mut s = match choice {
            BackendChoice::Auto => format!("auto, {}", self.policy.describe_auto()),
            BackendChoice::Only(k) => format!("{} as requested", k.name()),
        };
        if !self.lossy_refused.is_empty() {
            s.push_str(&format!(
                " (kept off as lossy: {})",
                self.lossy_refused.join(", ")
            ));
        }
        if self.policy.fresh {
            s.push_str("; op-time history ignored (--fresh)");
        } else {
            s.push_str(&format!(
                "; {} of {} estimates from the op-time history",
                self.from_history,
                self.placements.len()
            ));
        }
        s
    }
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

/// The key under which the op-time history (and calibration) keep `op` on `inputs` on
/// `device`.
pub fn history_key(device: DeviceId, op: &crate::ops::Op, inputs: &[TensorMeta]) -> String {
    history::key(device, op, inputs)
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

/// Places every node of `graph` under the default [`PlacementPolicy`] (exact f32 only in
/// auto placement; a requested backend that is missing is an error).
pub fn plan(graph: &Graph, reg: &DeviceRegistry, choice: BackendChoice) -> Result<Plan> {
    plan_with(graph, reg, choice, None, &PlacementPolicy::default())
}

/// [`plan`], with estimates taken from `history` where it has them.
pub fn plan_with_history(
    graph: &Graph,
    reg: &DeviceRegistry,
    choice: BackendChoice,
    history: Option<&History>,
) -> Result<Plan> {
    plan_with(graph, reg, choice, history, &PlacementPolicy::default())
}

/// The devices an explicit backend choice may use; an error (or, under
/// [`PlacementPolicy::fallback`], the CPU and a warning) when the kind is missing.
fn requested(
    reg: &DeviceRegistry,
    kind: DeviceKind,
    policy: &PlacementPolicy,
    warnings: &mut Vec<String>,
) -> Result<Vec<DeviceId>> {
    let found: Vec<DeviceId> = reg.of_kind(kind).iter().map(|b| b.id()).collect();
    if !found.is_empty() {
        if kind == DeviceKind::Cpu {
            return Ok(found);
        }
        // Ops the device lacks fall back to the CPU (unless strict: checked after planning).
        return Ok(found.into_iter().chain([DeviceId::CPU]).collect());
    }
    let why = reg
        .missing()
        .iter()
        .find(|m| m.kind == kind)
        .map(|m| m.reason.clone())
        .unwrap_or_else(|| "not found".into());
    if !policy.fallback {
        return Err(Error::Unavailable {
            device: format!("backend {}", kind.name()),
            reason: why,
        });
    }
    warnings.push(format!(
        "{} is unavailable ({why}); running on the CPU (--fallback)",
        kind.name()
    ));
    Ok(vec![DeviceId::CPU])
}

/// Places every node of `graph` under `policy`, with estimates from `history` where it has
/// them (unless the policy is fresh).
///
/// - `Auto`: every device found, per op the one that finishes first; a device with lossy
///   numerics only where the policy admits it ([`PlacementPolicy::admits`]).
/// - `Only(kind)`: that kind's devices for every op they run, the others on the CPU with a
///   warning (an error under [`PlacementPolicy::strict`]); a kind that is missing is an
///   error ([`Error::Unavailable`]) unless [`PlacementPolicy::fallback`].
pub fn plan_with(
    graph: &Graph,
    reg: &DeviceRegistry,
    choice: BackendChoice,
    history: Option<&History>,
    policy: &PlacementPolicy,
) -> Result<Plan> {
    plan_indexed(graph, &graph.index()?, reg, choice, history, policy)
}

/// [`plan_with`] for a graph already indexed ([`Graph::index`]; `index` must be `graph`'s),
/// so a caller that executes the plan too ([`crate::exec::Prepared::with_index`]) validates
/// and numbers the graph once.
pub fn plan_indexed(
    graph: &Graph,
    index: &GraphIndex,
    reg: &DeviceRegistry,
    choice: BackendChoice,
    history: Option<&History>,
    policy: &PlacementPolicy,
) -> Result<Plan> {
    if !index.fits(graph) {
        return Err(Error::Internal(
            "the index given was made of another graph".into(),
        ));
    }
    let history = history.filter(|_| !policy.fresh);
    let mut warnings = Vec::new();
    let candidates: Vec<DeviceId> = match choice {
        BackendChoice::Auto => reg.backends().iter().map(|b| b.id()).collect(),
        BackendChoice::Only(kind) => requested(reg, kind, policy, &mut warnings)?,
    };
    let backends: Vec<_> = candidates
        .iter()
        .filter_map(|&d| reg.get(d).map(|b| (d, b)))
        .collect();
    let preferred = match choice {
        BackendChoice::Only(k) => Some(k),
        BackendChoice::Auto => None,
    };
    // When each candidate device is free, by its position in `backends`.
    let mut device_free: Vec<Duration> = vec![Duration::ZERO; backends.len()];
    // Where each tensor will be, and when (constants: on the host from the start).
    let mut location: Vec<(DeviceId, Duration)> =
        vec![(DeviceId::CPU, Duration::ZERO); index.slots()];
    let mut placements = Vec::with_capacity(graph.nodes.len());
    let mut makespan = Duration::ZERO;
    // Ops the requested device lacks, with the first reason it gave.
    let mut fell_back: BTreeMap<&str, String> = BTreeMap::new();
    let mut fell_back_nodes = 0usize;
    let mut lossy_refused: BTreeMap<String, usize> = BTreeMap::new();
    let mut mem = memory::Accounts::new(graph, index, reg);
    let calibration = reg.calibration();
    // With an explicit backend, its device wins whenever it supports the op.
    let rank = |d: DeviceId| match preferred {
        Some(k) if d.kind == k => 0,
        Some(_) => 1,
        None => 0,
    };
    for (node_ix, node) in graph.nodes.iter().enumerate() {
        let ins = index.input_metas(node_ix);
        let in_slots = index.inputs(node_ix);
        // (finish, estimate, history samples, device position, numerics, calibrated, evicts)
        type Best = (
            Duration,
            Duration,
            Option<u64>,
            usize,
            Numerics,
            Option<&'static str>,
            bool,
        );
        let mut best: Option<Best> = None;
        let mut considered = smallvec::SmallVec::<[Considered; 2]>::new();
        let mut lacks: Option<String> = None;
        // Devices whose limit is under the node's working set: (device, need, derived copies
        // in it, limit).
        let mut too_big: Vec<(DeviceId, u64, u64, u64)> = Vec::new();
        // The best device had memory not counted, when it is not `best`: a spill.
        let mut best_any: Option<(u8, Duration, DeviceId)> = None;
        let mut full: Vec<String> = Vec::new();
        for (pos, (dev, b)) in backends.iter().enumerate() {
            let dev = *dev;
            if let Support::No(why) = b.supports(&node.op, ins) {
                if preferred == Some(dev.kind) && lacks.is_none() {
                    lacks = Some(why.clone());
                }
                considered.push(Considered::No(dev, why));
                continue;
            }
            let numerics = b.numerics();
            if preferred.is_none() {
                let measured = history.and_then(|h| h.measured_error(dev, &node.op, ins));
                if let Err(why) = policy.admits(numerics, measured) {
                    *lossy_refused
                        .entry(format!("{dev} ({numerics})"))
                        .or_default() += 1;
                    considered.push(Considered::NotUsed(dev, why));
                    continue;
                }
            }
            let (est, source) = match history.and_then(|h| h.estimate(dev, &node.op, ins)) {
                Some((t, n)) => (t, EstimateSource::Measured(n)),
                None => {
                    let model = b.estimate(&node.op, ins);
                    match calibration.and_then(|c| c.estimate(dev, &node.op, ins, model)) {
                        Some((t, Calibrated::Sample)) => (t, EstimateSource::CalibratedShape),
                        Some((t, Calibrated::Fit)) => (t, EstimateSource::CalibratedFit),
                        None => (model, EstimateSource::Model),
                    }
                }
            };
            let ready = in_slots
                .iter()
                .zip(ins)
                .map(|(&slot, m)| {
                    let (at, t) = location[slot as usize];
                    if at == dev {
                        return t;
                    }
                    let moved = calibration
                        .and_then(|c| c.transfer(m.bytes(), at, dev))
                        .unwrap_or_else(|| transfer_cost(m.bytes(), at, dev));
                    t.saturating_add(moved)
                })
                .max()
                .unwrap_or_default();
            let start = ready.max(device_free[pos]);
            let mut finish = start.saturating_add(est);
            considered.push(Considered::Timed {
                device: dev,
                op: est,
                source,
                done: finish,
            });
            if best_any.is_none_or(|(r, f, _)| (rank(dev), finish) < (r, f)) {
                best_any = Some((rank(dev), finish, dev));
            }
            let mut evicts = false;
            match mem.check(node_ix, dev) {
                Ok(()) => {}
                Err(memory::NoRoom::Evicts { bytes, why }) => {
                    // Evicting is weighed, not refused: each run fetches those weights again.
                    let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
                    let refetch = calibration
                        .and_then(|c| c.transfer(bytes, DeviceId::CPU, dev))
                        .unwrap_or_else(|| transfer_cost(bytes, DeviceId::CPU, dev));
                    finish = finish.saturating_add(refetch);
                    evicts = true;
                    considered.push(Considered::Evicts(
                        dev,
                        format!(
                            "{why}; {:.3} ms to fetch them again, done at {:.3} ms",
                            refetch.as_secs_f64() * 1e3,
                            finish.as_secs_f64() * 1e3
                        ),
                    ));
                }
                Err(memory::NoRoom::TooBig {
                    need,
                    derived,
                    limit,
                }) => {
                    let why = format!(
                        "needs {} for inputs + outputs{}, over its memory {} of {}",
                        crate::limits::human_bytes(need),
                        memory::copies(derived),
                        if mem.limit_set(dev) {
                            "limit"
                        } else {
                            "capacity"
                        },
                        crate::limits::human_bytes(limit)
                    );
                    // A limit the user set is held to (an error below); a device's own
                    // capacity is like a missing kernel: the op runs elsewhere.
                    if mem.limit_set(dev) {
                        too_big.push((dev, need, derived, limit));
                    } else if preferred == Some(dev.kind) && lacks.is_none() {
                        lacks = Some(why.clone());
                    }
                    considered.push(Considered::No(dev, why));
                    continue;
                }
                Err(memory::NoRoom::Full(why)) => {
                    full.push(format!("{dev}: {why}"));
                    considered.push(Considered::NoRoom(dev, why));
                    continue;
                }
            }
            let better = match best {
                None => true,
                Some((bf, _, _, bp, ..)) => (rank(dev), finish) < (rank(backends[bp].0), bf),
            };
            if better {
                best = Some((
                    finish,
                    est,
                    source.samples(),
                    pos,
                    numerics,
                    source.calibrated(),
                    evicts,
                ));
            }
        }
        // A requested device that can never hold the node, or no device that can: an error
        // naming the node, the devices, the bytes and the limits (not a thrash).
        let requested_too_big =
            preferred.is_some_and(|k| too_big.iter().any(|(d, ..)| d.kind == k));
        if requested_too_big || (best.is_none() && !too_big.is_empty()) {
            let listed: Vec<(DeviceId, u64, u64, u64)> = too_big
                .iter()
                .filter(|(d, ..)| !requested_too_big || Some(d.kind) == preferred)
                .copied()
                .collect();
            return Err(memory::Accounts::too_big_error(node, &listed));
        }
        if best.is_none() && !full.is_empty() {
            return Err(Error::invalid(
                "memory limit",
                format!(
                    "node '{}' ({}) fits no device: {}; raise --memory-limit",
                    node.name,
                    node.op.name(),
                    full.join("; ")
                ),
            ));
        }
        let (finish, est, samples, pos, numerics, calibrated, evicts) = match best {
            Some(b) => b,
            None => (
                Duration::ZERO,
                Duration::ZERO,
                None,
                usize::MAX,
                Numerics::F32,
                None,
                false,
            ),
        };
        let dev = backends.get(pos).map_or(DeviceId::CPU, |b| b.0);
        if let Some((_, _, want)) = best_any
            && best.is_some()
            && want != dev
        {
            mem.spilled
                .entry(want)
                .or_default()
                .push((node.name.clone(), dev));
        }
        if let Some(k) = preferred
            && dev.kind != k
            && k != DeviceKind::Cpu
            && !reg.of_kind(k).is_empty()
        {
            fell_back_nodes += 1;
            fell_back
                .entry(node.op.name())
                .or_insert_with(|| lacks.unwrap_or_else(|| "no kernel".into()));
        }
        if let Some(free) = device_free.get_mut(pos) {
            *free = finish;
        }
        if evicts {
            mem.accept_evicting(node_ix, dev);
        }
        mem.place(node_ix, dev);
        for o in index.outputs(node_ix) {
            location[o as usize] = (dev, finish);
        }
        makespan = makespan.max(finish);
        placements.push(Placement {
            device: dev,
            numerics,
            estimate: est,
            history_samples: samples,
            calibrated,
            finish,
            reason: Reason(considered),
        });
    }
    if let (BackendChoice::Only(k), false) = (choice, fell_back.is_empty()) {
        let ops: Vec<&str> = fell_back.keys().copied().collect();
        if policy.strict {
            // The first reason stands for the others (they differ in the op's name).
            let (first, why) = fell_back
                .iter()
                .next()
                .map_or(("", ""), |(o, w)| (*o, w.as_str()));
            return Err(Error::Unsupported {
                op: ops.join(", "),
                device: k.name().into(),
                why: format!(
                    "{first}: {why}{}; --strict does not let them run on the CPU",
                    if ops.len() > 1 {
                        " (and likewise for the others)"
                    } else {
                        ""
                    }
                ),
            });
        }
        let ran = graph.nodes.len() - fell_back_nodes;
        warnings.push(format!(
            "{} runs {ran} of {} ops; it has no kernel for {}, which run on the CPU (--explain says why; --strict makes this an error)",
            k.name(),
            graph.nodes.len(),
            ops.join(", ")
        ));
    }
    warnings.extend(mem.split_notes());
    let from_history = placements
        .iter()
        .filter(|p| p.history_samples.is_some())
        .count();
    Ok(Plan {
        placements,
        warnings,
        makespan,
        policy: *policy,
        from_history,
        lossy_refused: lossy_refused
            .into_iter()
            .map(|(d, n)| format!("{d}: {n} op{}", if n == 1 { "" } else { "s" }))
            .collect(),
        memory: mem.planned(),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backend::{Backend, DeviceInfo, DeviceStorage, Launch};
    use crate::dtype::DType;
    use crate::ops::{Activation, LinearParams, Op, RmsNormParams};
    use crate::tensor::Tensor;

    /// A device that is very fast at linear and has nothing else, of the numerics its
    /// `compute_dtype` says, deriving `derived` bytes from a linear's weight. The planner
    /// only sees what the trait says; nothing launches here.
    #[derive(Debug)]
    struct FastLinear {
        info: DeviceInfo,
        derived: u64,
    }

    impl Backend for FastLinear {
        fn info(&self) -> &DeviceInfo {
            &self.info
        }
        fn supports(&self, op: &Op, _inputs: &[TensorMeta]) -> Support {
            match op {
                Op::Linear(_) => Support::Native,
                other => Support::No(format!("no {} kernel", other.name())),
            }
        }
        fn derived_weight_bytes(&self, op: &Op, _inputs: &[TensorMeta], input: usize) -> u64 {
            match op {
                Op::Linear(_) if input == 1 => self.derived,
                _ => 0,
            }
        }
        fn upload(&self, host: &Tensor) -> Result<DeviceStorage> {
            Ok(DeviceStorage::new(self.id(), host.meta(), host.clone()))
        }
        fn download(&self, storage: &DeviceStorage) -> Result<Tensor> {
            storage.host_tensor("fast linear").cloned()
        }
        fn launch(&self, _op: &Op, _inputs: &[&DeviceStorage]) -> Result<Launch> {
            Err(Error::Internal(
                "the planner's test device does not launch".into(),
            ))
        }
        fn synchronize(&self) -> Result<()> {
            Ok(())
        }
    }

    const FAST: DeviceId = DeviceId {
        kind: DeviceKind::FpgaXrt,
        index: 0,
    };

    fn registry(dtype: DType) -> DeviceRegistry {
        registry_deriving(dtype, 0)
    }

    /// [`registry`], with the fast device deriving `derived` bytes from a linear's weight.
    fn registry_deriving(dtype: DType, derived: u64) -> DeviceRegistry {
        let mut r = DeviceRegistry::cpu_only();
        r.add(Arc::new(FastLinear {
            info: DeviceInfo {
                id: FAST,
                name: "fast linear".into(),
                memory_bytes: 1 << 30,
                peak_flops: 1e18,
                peak_bandwidth: 1e15,
                compute_dtype: dtype,
                details: Vec::new(),
            },
            derived,
        }));
        r
    }

    /// x [256, 1024] -> linear (1024 -> 1024) -> rmsnorm.
    fn graph() -> Graph {
        let mut g = Graph::default();
        let t = |s: &[usize]| Tensor::zeros(&TensorMeta::new(s, DType::F32));
        g.constant("x", t(&[256, 1024]));
        g.param("w", t(&[1024, 1024]));
        g.param("g", t(&[1024]));
        let lin = g.add(
            "lin",
            Op::Linear(LinearParams {
                act: Activation::None,
                bias: false,
                f32_out: false,
            }),
            &["x", "w"],
        );
        let norm = g.add(
            "norm",
            Op::RmsNorm(RmsNormParams::default()),
            &[&lin[0], "g"],
        );
        g.outputs = norm;
        g
    }

    fn devices(p: &Plan) -> Vec<String> {
        p.placements.iter().map(|p| p.device.to_string()).collect()
    }

    fn policy(f: impl FnOnce(&mut PlacementPolicy)) -> PlacementPolicy {
        let mut p = PlacementPolicy::default();
        f(&mut p);
        p
    }

    #[test]
    fn auto_uses_a_lossy_device_only_when_allowed() -> Result<()> {
        let g = graph();
        let reg = registry(DType::I8);
        let auto = BackendChoice::Auto;
        let strict = plan(&g, &reg, auto)?;
        assert_eq!(devices(&strict), ["cpu", "cpu"]);
        assert_eq!(strict.lossy_refused, ["fpga:0 (int8 fixed point): 1 op"]);
        assert!(
            strict.placements[0]
                .reason
                .to_string()
                .contains("--allow-lossy")
        );
        assert!(strict.summary(auto).starts_with("auto, exact f32 only"));
        let any = plan_with(&g, &reg, auto, None, &policy(|p| p.allow_lossy = true))?;
        assert_eq!(devices(&any), ["fpga:0", "cpu"]);
        assert!(any.placements[0].numerics.is_lossy());
        assert!(any.lossy_refused.is_empty());
        // The same device declaring exact f32 numerics is used without asking.
        let exact = plan(&g, &registry(DType::F32), auto)?;
        assert_eq!(devices(&exact), ["fpga:0", "cpu"]);
        Ok(())
    }

    #[test]
    fn max_error_is_checked_against_the_measured_error_else_the_declared_bound() -> Result<()> {
        let g = graph();
        let metas = g.validate()?;
        let ins: Vec<TensorMeta> = g.nodes[0].inputs.iter().map(|i| metas[i].clone()).collect();
        let reg = registry(DType::I8);
        let auto = BackendChoice::Auto;
        let tight = policy(|p| p.max_error = Some(1e-2));
        let loose = policy(|p| p.max_error = Some(1e-1));
        // Not measured: int8's declared 5e-2 decides.
        assert_eq!(
            devices(&plan_with(&g, &reg, auto, None, &tight)?),
            ["cpu", "cpu"]
        );
        assert_eq!(
            devices(&plan_with(&g, &reg, auto, None, &loose)?),
            ["fpga:0", "cpu"]
        );
        // Measured at 4e-3 on this op and shape: within 1e-2.
        let mut h = History::in_memory();
        let lin = &g.nodes[0].op;
        h.record_sample(FAST, lin, &ins, Duration::from_micros(1), false, Some(4e-3));
        let p = plan_with(&g, &reg, auto, Some(&h), &tight)?;
        assert_eq!(devices(&p), ["fpga:0", "cpu"]);
        // --fresh ignores the measurement (and the times).
        let fresh = policy(|p| {
            p.max_error = Some(1e-2);
            p.fresh = true;
        });
        let p = plan_with(&g, &reg, auto, Some(&h), &fresh)?;
        assert_eq!(devices(&p), ["cpu", "cpu"]);
        assert_eq!(p.from_history, 0);
        // A worse measurement later takes the op back off the device.
        h.record_sample(FAST, lin, &ins, Duration::from_micros(1), false, Some(3e-2));
        let p = plan_with(&g, &reg, auto, Some(&h), &tight)?;
        assert_eq!(devices(&p), ["cpu", "cpu"]);
        assert!(
            p.placements[0]
                .reason
                .to_string()
                .contains("measured, 2 runs"),
            "{}",
            p.placements[0].reason
        );
        Ok(())
    }

    #[test]
    fn calibrated_times_come_after_the_history_and_before_the_model() -> Result<()> {
        let g = graph();
        let metas = g.validate()?;
        let mut reg = DeviceRegistry::cpu_only();
        let ins = |i: usize| -> Vec<TensorMeta> {
            g.nodes[i].inputs.iter().map(|n| metas[n].clone()).collect()
        };
        let mut d = DeviceCalibration::default();
        d.samples
            .insert(history_key(DeviceId::CPU, &g.nodes[0].op, &ins(0)), 7e-3);
        d.ops.insert(
            g.nodes[1].op.name().into(),
            OpFit {
                overhead_s: 1.0,
                scale: 1.0,
                n: 2,
                max_rel_error: 0.0,
            },
        );
        let mut c = Calibration::new("m");
        c.devices.insert("cpu".into(), d);
        reg.set_calibration(Some(c));
        let p = plan(&g, &reg, BackendChoice::Auto)?;
        assert_eq!(p.placements[0].estimate, Duration::from_millis(7));
        assert_eq!(p.placements[0].calibrated, Some("calibrated shape"));
        assert!(p.placements[1].estimate >= Duration::from_secs(1));
        assert_eq!(p.placements[1].calibrated, Some("calibrated fit"));
        assert!(
            p.placements[1]
                .reason
                .to_string()
                .contains("(calibrated fit)"),
            "{}",
            p.placements[1].reason
        );
        // A measured run of the same shape wins over calibration.
        let mut h = History::in_memory();
        h.record(
            DeviceId::CPU,
            &g.nodes[0].op,
            &ins(0),
            Duration::from_millis(2),
        );
        let p = plan_with_history(&g, &reg, BackendChoice::Auto, Some(&h))?;
        assert_eq!(p.placements[0].estimate, Duration::from_millis(2));
        assert_eq!(p.placements[0].calibrated, None);
        Ok(())
    }

    #[test]
    fn placements_from_the_history_are_counted_and_contended_samples_ignored() -> Result<()> {
        let g = graph();
        let metas = g.validate()?;
        let reg = DeviceRegistry::cpu_only();
        let mut h = History::in_memory();
        let ins = |i: usize| -> Vec<TensorMeta> {
            g.nodes[i].inputs.iter().map(|n| metas[n].clone()).collect()
        };
        // Contended samples are kept, but not as estimates.
        h.record_sample(
            DeviceId::CPU,
            &g.nodes[0].op,
            &ins(0),
            Duration::from_millis(9),
            true,
            None,
        );
        let p = plan_with_history(&g, &reg, BackendChoice::Auto, Some(&h))?;
        assert_eq!(p.from_history, 0);
        h.record(
            DeviceId::CPU,
            &g.nodes[0].op,
            &ins(0),
            Duration::from_millis(2),
        );
        let p = plan_with_history(&g, &reg, BackendChoice::Auto, Some(&h))?;
        assert_eq!(p.from_history, 1);
        assert_eq!(p.placements[0].history_samples, Some(1));
        assert_eq!(p.placements[0].estimate, Duration::from_millis(2));
        assert!(
            p.summary(BackendChoice::Auto)
                .contains("1 of 2 estimates from the op-time history")
        );
        Ok(())
    }

    #[test]
    fn a_requested_backend_is_held_to() -> Result<()> {
        let g = graph();
        let reg = registry(DType::I8);
        let fpga = BackendChoice::Only(DeviceKind::FpgaXrt);
        // It lacks rmsnorm: the CPU runs it, with a warning; --strict refuses.
        let p = plan(&g, &reg, fpga)?;
        assert_eq!(devices(&p), ["fpga:0", "cpu"]);
        assert!(
            p.warnings[0].contains("no kernel for rmsnorm"),
            "{:?}",
            p.warnings
        );
        let e = plan_with(&g, &reg, fpga, None, &policy(|p| p.strict = true)).expect_err("strict");
        assert_eq!(e.kind(), crate::error::ErrorKind::Unimplemented);
        assert!(e.to_string().contains("rmsnorm"), "{e}");
        // A kind that is missing is an error, unless the CPU may stand in.
        let cuda = BackendChoice::Only(DeviceKind::Cuda);
        let e = plan(&g, &reg, cuda).expect_err("missing");
        assert_eq!(e.kind(), crate::error::ErrorKind::Unavailable);
        let p = plan_with(&g, &reg, cuda, None, &policy(|p| p.fallback = true))?;
        assert_eq!(devices(&p), ["cpu", "cpu"]);
        assert!(
            p.warnings[0].contains("running on the CPU"),
            "{:?}",
            p.warnings
        );
        Ok(())
    }

    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;

    /// `(limit, limit set, peak, resident, derived)` of `dev` in the plan's memory.
    fn planned(p: &Plan, dev: DeviceId) -> Option<(u64, bool, u64, u64, u64)> {
        p.memory.iter().find(|m| m.device == dev).map(|m| {
            let b = (m.peak_bytes, m.resident_bytes, m.derived_bytes);
            (m.limit_bytes, m.limit_set, b.0, b.1, b.2)
        })
    }

    fn limits(text: &str) -> Result<crate::options::MemoryLimits> {
        crate::options::MemoryLimits::parse(text, "--memory-limit")
    }

    #[test]
    fn memory_lines_give_each_device_its_planned_bytes() -> Result<()> {
        let g = graph();
        // The fast device keeps a 3 MiB copy beside the linear's weight (as CUDA's e4m3
        // expert weights).
        let reg = registry_deriving(DType::F32, 3 * MIB);
        reg.set_memory_limits(limits("cpu=1G,fpga:0=512M")?);
        let p = plan(&g, &reg, BackendChoice::Auto)?;
        assert_eq!(devices(&p), ["fpga:0", "cpu"]);
        // fpga:0 runs lin: x (1 MiB) and w (4 MiB) fetched, its 3 MiB copy of w, 1 MiB out;
        // w and its copy stay resident.
        assert_eq!(
            planned(&p, FAST),
            Some((512 * MIB, true, 9 * MIB, 7 * MIB, 3 * MIB))
        );
        // The CPU runs norm: lin's output (1 MiB) and g (4 KiB) fetched, 1 MiB out.
        assert_eq!(
            planned(&p, DeviceId::CPU),
            Some((1 << 30, true, 2 * MIB + 4 * KIB, 4 * KIB, 0))
        );
        let lines = memory_lines(&p);
        assert_eq!(
            lines,
            "memory: cpu weights 4.0 KiB resident, peak working set 2.0 MiB of 1.0 GiB limit\n\
             memory: fpga:0 weights 7.0 MiB resident (3.0 MiB of it derived copies), \
             peak working set 9.0 MiB of 512.0 MiB limit\n"
        );
        // `plan` and `run --explain` print them after the makespan.
        let text = explain(&g, &p);
        let after = text.split("estimated makespan").nth(1).unwrap_or_default();
        assert!(after.contains(&lines), "{text}");
        Ok(())
    }

    #[test]
    fn a_device_that_holds_nothing_gets_no_memory_line() -> Result<()> {
        let g = graph();
        let reg = registry(DType::I8);
        reg.set_memory_limits(limits("cpu=1G")?);
        // Exact f32 only: the int8 device runs nothing and holds nothing.
        let mut p = plan(&g, &reg, BackendChoice::Auto)?;
        assert_eq!(devices(&p), ["cpu", "cpu"]);
        assert_eq!(planned(&p, FAST), None);
        // Both weights resident; the peak is lin's: x, w and its output.
        assert_eq!(
            planned(&p, DeviceId::CPU),
            Some((1 << 30, true, 6 * MIB, 4 * MIB + 4 * KIB, 0))
        );
        let one =
            "memory: cpu weights 4.0 MiB resident, peak working set 6.0 MiB of 1.0 GiB limit\n";
        assert_eq!(memory_lines(&p), one);
        assert!(!explain(&g, &p).contains("fpga:0 weights"));
        // An entry of no bytes gets no line either.
        p.memory.push(PlannedMemory {
            device: FAST,
            limit_bytes: u64::MAX,
            limit_set: false,
            peak_bytes: 0,
            resident_bytes: 0,
            derived_bytes: 0,
        });
        assert_eq!(memory_lines(&p), one);
        Ok(())
    }

    #[test]
    fn a_limit_not_known_is_said_so() {
        let m = PlannedMemory {
            device: DeviceId::CPU,
            limit_bytes: u64::MAX,
            limit_set: false,
            peak_bytes: 3 * MIB,
            resident_bytes: MIB,
            derived_bytes: 0,
        };
        assert_eq!(
            m.line(),
            "memory: cpu weights 1.0 MiB resident, peak working set 3.0 MiB (no known limit)"
        );
        let m = PlannedMemory {
            limit_bytes: 80 << 30,
            ..m
        };
        assert!(
            m.line()
                .ends_with("peak working set 3.0 MiB of 80.0 GiB capacity")
        );
    }

    /// A fused unit's node is compared with all the unit's estimates together; the nodes that
    /// ran inside it show no time of their own and count once in the measured sum.
    #[test]
    fn a_fused_unit_is_compared_with_its_nodes_together() -> Result<()> {
        use crate::backend::LaunchInfo;
        use crate::exec::{INSIDE_THE_UNIT_OF, NodeRun, RUNS_THE_UNIT};
        let g = graph();
        let p = plan(
            &g,
            &registry(DType::F32),
            BackendChoice::Only(DeviceKind::Cpu),
        )?;
        let (lin, norm) = (p.placements[0].estimate, p.placements[1].estimate);
        assert!(!lin.is_zero() && !norm.is_zero());
        let unit = (lin + norm) * 2;
        let run = |name: &str, time: Option<Duration>, fused: String| {
            let launch = LaunchInfo {
                kernel: String::new(),
                device_time: time,
                cycles: None,
            };
            NodeRun::quiet(name.into(), "x", DeviceId::CPU, launch, Some(fused))
        };
        let runs = [
            run(
                "lin",
                Some(unit),
                format!("moe_block: lin + norm {RUNS_THE_UNIT}"),
            ),
            run("norm", None, format!("{INSIDE_THE_UNIT_OF}lin")),
        ];
        assert!(runs[0].runs_unit() && runs[0].unit_head().is_none());
        assert_eq!(runs[1].unit_head(), Some("lin"));
        let text = explain_measured(&g, &p, &runs);
        let rows: Vec<&str> = text.lines().collect();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        assert!(
            rows[1].contains(&format!("{:.3} u", ms(lin + norm))),
            "{text}"
        );
        assert!(rows[1].trim_end().ends_with("2.00"), "{text}");
        assert!(
            rows[2].contains("in unit") && rows[2].trim_end().ends_with('-'),
            "{text}"
        );
        assert!(
            rows[3].contains(&format!("measured {:.3} ms", ms(unit))),
            "{text}"
        );
        Ok(())
    }
}
