//! `--explain`: the plan as text (per node the device chosen, its op-time estimate, where the
//! estimate came from, and every device weighed; then per device the memory it plans), and
//! after a run the predicted against the measured op time per node.

use std::collections::HashMap;
use std::time::Duration;

use super::Plan;
use crate::exec::NodeRun;
use crate::graph::Graph;

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The plan as text, one line per node: device, op-time estimate (from the history, `hist
/// n=N`, or the backend's model) and the devices weighed (each with its op-time estimate and
/// the time the node would be done there in the schedule); then the makespan and the
/// memory each device holds ([`memory_lines`]).
pub fn explain(graph: &Graph, plan: &Plan) -> String {
    let mut s = format!(
        "{:<22} {:<12} -> {:<12} {:>11}  {:<10} [devices weighed]\n",
        "node", "op", "device", "est. op ms", "from"
    );
    for (n, p) in graph.nodes.iter().zip(&plan.placements) {
        let lossy = if p.numerics.is_lossy() { "~" } else { "" };
        let from = match (p.history_samples, p.calibrated) {
            (Some(k), _) => format!("hist n={k}"),
            (None, Some(_)) => "calibrated".into(),
            (None, None) => "model".into(),
        };
        s.push_str(&format!(
            "{:<22} {:<12} -> {:<12} {:>11.3}  {:<10} [{}]\n",
            n.name,
            n.op.name(),
            format!("{}{lossy}", p.device),
            ms(p.estimate),
            from,
            p.reason
        ));
    }
    s.push_str(&format!(
        "estimated makespan {:.3} ms; {} of {} estimates from the op-time history{}\n",
        ms(plan.makespan),
        plan.from_history,
        plan.placements.len(),
        if plan.policy.fresh { " (--fresh)" } else { "" }
    ));
    s.push_str(&memory_lines(plan));
    if plan.placements.iter().any(|p| p.numerics.is_lossy()) {
        s.push_str("~ = lossy numerics (bf16/f16 storage or int8 fixed point)\n");
    }
    for w in &plan.warnings {
        s.push_str(&format!("warning: {w}\n"));
    }
    s
}

/// A line per device the plan has hold anything ([`PlannedMemory::line`]), by device: its
/// resident weights (and the copies derived from them), its peak and its limit. Devices that
/// hold nothing get no line.
///
/// [`PlannedMemory::line`]: super::PlannedMemory::line
pub fn memory_lines(plan: &Plan) -> String {
    plan.memory
        .iter()
        .filter(|m| m.holds_anything())
        .map(|m| m.line() + "\n")
        .collect()
}

/// After a run: per node the device planned and its op-time estimate against the device it
/// ran on and the op time measured there (device-reported where the device reports it, else
/// wall), with measured / predicted. A fused unit is measured as one launch: the node that ran
/// it is compared with the estimates of all the unit's nodes together (`u`), and the nodes
/// that ran inside it have no time of their own.
pub fn explain_measured(graph: &Graph, plan: &Plan, runs: &[NodeRun]) -> String {
    let mut s = format!(
        "{:<22} {:<12} {:<12} {:>12} {:<12} {:>12} {:>8}\n",
        "node", "op", "planned", "predicted ms", "ran on", "measured ms", "ratio"
    );
    // what the members of each fused unit were expected to take, by the unit's node
    let mut inside: HashMap<&str, Duration> = HashMap::new();
    for (p, r) in plan.placements.iter().zip(runs) {
        if let Some(head) = r.unit_head() {
            *inside.entry(head).or_default() += p.estimate;
        }
    }
    let (mut predicted, mut measured) = (0.0, 0.0);
    for ((n, p), r) in graph.nodes.iter().zip(&plan.placements).zip(runs) {
        predicted += ms(p.estimate);
        let (estimate, unit) = match inside.get(n.name.as_str()) {
            Some(more) if r.runs_unit() => (p.estimate + *more, " u"),
            _ => (p.estimate, ""),
        };
        let (shown, ratio) = if r.unit_head().is_some() {
            ("in unit".to_string(), "-".to_string())
        } else {
            let t = r.launch.device_time.unwrap_or(r.wall);
            measured += ms(t);
            let src = if r.launch.device_time.is_some() {
                ""
            } else {
                " w"
            };
            let ratio = if estimate.is_zero() {
                "-".to_string()
            } else {
                format!("{:.2}", t.as_secs_f64() / estimate.as_secs_f64())
            };
            (format!("{:.3}{src}", ms(t)), ratio)
        };
        s.push_str(&format!(
            "{:<22} {:<12} {:<12} {:>12} {:<12} {:>12} {:>8}\n",
            n.name,
            n.op.name(),
            p.device.to_string(),
            format!("{:.3}{unit}", ms(estimate)),
            r.device.to_string(),
            shown,
            ratio
        ));
    }
    s.push_str(&format!(
        "sum of op times: predicted {predicted:.3} ms, measured {measured:.3} ms (w = wall time, \
         the others device-reported; u = a fused unit's nodes together, measured as one launch)\n"
    ));
    s
}
