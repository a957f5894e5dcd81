//! Run reports: a terminal table and JSON.

use serde::Serialize;

use crate::exec::NodeRun;
use crate::verify::NodeError;

/// One row: a node, where and how it ran, and its error.
#[derive(Debug, Clone, Serialize)]
pub struct NodeReport {
    /// How it ran.
    #[serde(flatten)]
    pub run: NodeRun,
    /// Error against the f64 reference on its actual inputs.
    #[serde(flatten)]
    pub error: NodeError,
    /// FLOPs of the op.
    pub flops: f64,
    /// Bytes the op must move at least.
    pub bytes: f64,
    /// Numerics class of the device it ran on.
    pub numerics: crate::backend::Numerics,
    /// Whether that class is lossy (not exact f32): marked `~` in the table.
    pub lossy: bool,
}

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// Workload name and sizes.
    pub workload: String,
    /// `--backend` as given.
    pub backend: String,
    /// How placement was decided: the policy, devices kept off as lossy, how many estimates
    /// came from the op-time history ([`crate::plan::Plan::summary`]).
    pub placement: String,
    /// Placements whose estimate came from the op-time history.
    pub placements_from_history: usize,
    /// Devices found, and those missing with the reason.
    pub devices: Vec<String>,
    /// Per node, in graph order.
    pub nodes: Vec<NodeReport>,
    /// Wall time of the whole run, seconds.
    pub wall_s: f64,
    /// Weight bytes uploaded to devices by the warm-up and timed executions to make them
    /// resident (once per device; the nodes' `transfer_bytes` leave them out, their
    /// `resident_bytes` say which of them the timed execution moved).
    pub weights_uploaded_bytes: u64,
    /// Weight bytes resident on devices other than the host after the run.
    pub weights_resident_bytes: u64,
    /// The layer output against the f64 reference chain.
    pub output_rel_error: Option<f64>,
    /// Router load-balancing loss of the run.
    pub aux_loss: Option<f64>,
    /// Router z-loss of the run.
    pub z_loss: Option<f64>,
    /// Warnings (missing devices, fallbacks).
    pub warnings: Vec<String>,
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn sci(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.1e}")).unwrap_or_else(|| "-".into())
}

/// The report as a terminal table.
pub fn table(r: &RunReport) -> String {
    let mut s = format!("workload: {}\nbackend:  {}\n", r.workload, r.backend);
    for d in &r.devices {
        s.push_str(&format!("device:   {d}\n"));
    }
    s.push('\n');
    s.push_str(&format!(
        "{:<20} {:<12} {:<11} {:<28} {:>10} {:>10} {:>9} {:>9}\n",
        "node", "op", "device", "kernel", "time ms", "device ms", "rel.err", "id diffs"
    ));
    s.push_str(&format!("{}\n", "-".repeat(115)));
    for n in &r.nodes {
        let mut kernel = n.run.launch.kernel.clone();
        if kernel.len() > 28 {
            kernel.truncate(27);
            kernel.push('~');
        }
        s.push_str(&format!(
            "{:<20} {:<12} {:<11} {:<28} {:>10.3} {:>10} {:>9} {:>9}\n",
            n.run.node,
            n.run.op,
            format!("{}{}", n.run.device, if n.lossy { "~" } else { "" }),
            kernel,
            ms(n.run.wall),
            n.run
                .launch
                .device_time
                .map(|d| format!("{:.3}", ms(d)))
                .unwrap_or_else(|| "-".into()),
            sci(n.error.rel_error),
            n.error
                .id_mismatches
                .map(|v| v.to_string())
                .unwrap_or_else(|| "-".into()),
        ));
    }
    s.push_str(&format!("{}\n", "-".repeat(115)));
    let op_total: f64 = r.nodes.iter().map(|n| ms(n.run.wall)).sum();
    let xfer: f64 = r.nodes.iter().map(|n| ms(n.run.transfer)).sum();
    let xfer_b: u64 = r.nodes.iter().map(|n| n.run.transfer_bytes).sum();
    s.push_str(&format!(
        "total: {:.3} ms wall ({:.3} ms in ops, {:.3} ms moving {:.2} MB to devices)\n",
        r.wall_s * 1e3,
        op_total,
        xfer,
        xfer_b as f64 / 1e6
    ));
    if let Some(w) = resident_line(r) {
        s.push_str(&w);
    }
    if let Some(e) = r.output_rel_error {
        s.push_str(&format!("layer output vs f64 reference: {e:.2e}\n"));
    }
    s.push_str(&format!("placement: {}\n", r.placement));
    let lossy = r.nodes.iter().filter(|n| n.lossy).count();
    if lossy > 0 {
        s.push_str(&format!(
            "~ = lossy numerics: {lossy} of {} ops ran in bf16/f16 storage or int8 fixed point\n",
            r.nodes.len()
        ));
    }
    if let (Some(a), Some(z)) = (r.aux_loss, r.z_loss) {
        s.push_str(&format!("router aux loss {a:.6}, z loss {z:.6}\n"));
    }
    for n in &r.nodes {
        if let Some(f) = &n.run.fallback {
            s.push_str(&format!(
                "note: {} ran on {} because {f}\n",
                n.run.node, n.run.device
            ));
        }
    }
    for w in &r.warnings {
        s.push_str(&format!("warning: {w}\n"));
    }
    s
}

/// The line on resident weights, where there are any.
fn resident_line(r: &RunReport) -> Option<String> {
    let mb = |b: u64| b as f64 / 1e6;
    let timed: u64 = r.nodes.iter().map(|n| n.run.resident_bytes).sum();
    let up = r.weights_uploaded_bytes;
    let timed_ms: f64 = r.nodes.iter().map(|n| ms(n.run.resident_transfer)).sum();
    if up == 0 {
        return (r.weights_resident_bytes > 0).then(|| {
            format!(
                "weights resident: {:.2} MB, uploaded before this run\n",
                mb(r.weights_resident_bytes)
            )
        });
    }
    let when = if timed == 0 {
        "during warm-up"
    } else if timed == up {
        &format!("in the timed run, {timed_ms:.3} ms")
    } else {
        &format!("during warm-up and the timed run, {timed_ms:.3} ms of it")
    };
    Some(format!(
        "weights resident: {:.2} MB uploaded once ({when}; not in the transfers above)\n",
        mb(up)
    ))
}

/// The run as a Chrome / Perfetto trace (JSON "traceEvents"): one track per device, a slice
/// per op and per input transfer. Open it in ui.perfetto.dev or chrome://tracing.
pub fn chrome_trace(r: &RunReport) -> serde_json::Value {
    let us = |d: std::time::Duration| d.as_secs_f64() * 1e6;
    let mut devices: Vec<String> = r.nodes.iter().map(|n| n.run.device.to_string()).collect();
    devices.sort();
    devices.dedup();
    let tid = |d: &str| devices.iter().position(|x| x == d).unwrap_or(0);
    let mut events: Vec<serde_json::Value> = devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            serde_json::json!({"ph": "M", "name": "thread_name", "pid": 1, "tid": i,
                               "args": {"name": d}})
        })
        .collect();
    for n in &r.nodes {
        let dev = n.run.device.to_string();
        if n.run.transfer_bytes + n.run.resident_bytes > 0 {
            events.push(serde_json::json!({
                "ph": "X", "pid": 1, "tid": tid(&dev), "cat": "transfer",
                "name": format!("{} inputs", n.run.node),
                "ts": us(n.run.start), "dur": us(n.run.transfer + n.run.resident_transfer),
                "args": {"bytes": n.run.transfer_bytes, "weight_bytes": n.run.resident_bytes},
            }));
        }
        events.push(serde_json::json!({
            "ph": "X", "pid": 1, "tid": tid(&dev), "cat": n.run.op,
            "name": n.run.node,
            "ts": us(n.run.start + n.run.transfer + n.run.resident_transfer),
            "dur": us(n.run.wall),
            "args": {
                "kernel": n.run.launch.kernel,
                "device_ms": n.run.launch.device_time.map(|d| d.as_secs_f64() * 1e3),
                "cycles": n.run.launch.cycles,
                "rel_error": n.error.rel_error,
                "gflop": n.flops / 1e9,
            },
        }));
    }
    serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ms" })
}
