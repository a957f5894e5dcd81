//! Run reports: the terminal table (its parts for other renderers: [`header_lines`],
//! [`node_rows`], [`summary_lines`]), JSON with seconds as numbers, and a Chrome trace.

use serde::Serialize;

use crate::exec::NodeRun;
use crate::verify::NodeError;

/// One row: a node, where and how it ran, and its error. Serialized flat, times in seconds
/// as numbers (`wall_s`, `device_time_s`, ...; see [`seconds_as_numbers`]).
#[derive(Debug, Clone)]
pub struct NodeReport {
    /// How it ran.
    pub run: NodeRun,
    /// Error against the f64 reference on its actual inputs.
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
    /// Warnings (missing devices, fallbacks, a model split across devices by memory).
    pub warnings: Vec<String>,
    /// Per device used: its memory limit, the most it held during the timed execution
    /// (`peak`), what it holds after it (`used`), the replicas it evicted to stay within the
    /// limit and the bytes copied to and from it (the whole run, warm-up included).
    pub memory: Vec<crate::memory::DeviceMemoryReport>,
}

impl Serialize for NodeReport {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let mut v = serde_json::Map::new();
        for part in [
            serde_json::to_value(&self.run),
            serde_json::to_value(self.error),
        ] {
            if let serde_json::Value::Object(m) = part.map_err(serde::ser::Error::custom)? {
                v.extend(m);
            }
        }
        v.insert("flops".into(), self.flops.into());
        v.insert("bytes".into(), self.bytes.into());
        v.insert(
            "numerics".into(),
            serde_json::to_value(self.numerics).map_err(serde::ser::Error::custom)?,
        );
        v.insert("lossy".into(), self.lossy.into());
        let mut v = serde_json::Value::Object(v);
        seconds_as_numbers(&mut v);
        v.serialize(ser)
    }
}

/// The keys of durations in tandem's serialized reports and plans.
pub const DURATION_KEYS: [&str; 8] = [
    "start",
    "wall",
    "transfer",
    "resident_transfer",
    "device_time",
    "estimate",
    "finish",
    "makespan",
];

/// Rewrites the durations in `v` (serde's `{"secs": .., "nanos": ..}`, at any depth) as
/// seconds, numbers, under the key with `_s` appended; the keys of [`DURATION_KEYS`] are
/// renamed so even when null (a time not measured).
pub fn seconds_as_numbers(v: &mut serde_json::Value) {
    fn as_secs(v: &serde_json::Value) -> Option<f64> {
        let m = v.as_object()?;
        if m.len() != 2 {
            return None;
        }
        Some(m.get("secs")?.as_u64()? as f64 + m.get("nanos")?.as_u64()? as f64 * 1e-9)
    }
    match v {
        serde_json::Value::Object(m) => {
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let Some(mut val) = m.remove(&k) else {
                    continue;
                };
                if let Some(secs) = as_secs(&val) {
                    m.insert(format!("{k}_s"), secs.into());
                } else if val.is_null() && DURATION_KEYS.contains(&k.as_str()) {
                    m.insert(format!("{k}_s"), val);
                } else {
                    seconds_as_numbers(&mut val);
                    m.insert(k, val);
                }
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(seconds_as_numbers),
        _ => {}
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn sci(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.1e}")).unwrap_or_else(|| "-".into())
}

/// The devices of `reg` as the report lists them: those found (id, name; a GPU's storage
/// precision, which decides its accuracy), then those missing with the reason.
pub fn device_labels(reg: &crate::backend::DeviceRegistry) -> Vec<String> {
    let mut devices: Vec<String> = reg
        .backends()
        .iter()
        .map(|b| {
            let i = b.info();
            if i.id.kind == crate::backend::DeviceKind::Cuda {
                format!("{} ({}, {} storage)", i.id, i.name, i.compute_dtype)
            } else {
                format!("{} ({})", i.id, i.name)
            }
        })
        .collect();
    devices.extend(
        reg.missing()
            .iter()
            .map(|m| format!("{}: unavailable ({})", m.kind.name(), m.reason)),
    );
    devices
}

/// The column names of [`node_rows`].
pub const NODE_COLUMNS: [&str; 8] = [
    "node",
    "op",
    "device",
    "kernel",
    "time ms",
    "device ms",
    "rel.err",
    "id diffs",
];

/// One row of text per node, the cells of [`NODE_COLUMNS`] (`-` where there is no value).
pub fn node_rows(r: &RunReport) -> Vec<Vec<String>> {
    r.nodes
        .iter()
        .map(|n| {
            vec![
                n.run.node.to_string(),
                n.run.op.to_string(),
                format!("{}{}", n.run.device, if n.lossy { "~" } else { "" }),
                n.run.launch.kernel.clone(),
                format!("{:.3}", ms(n.run.wall)),
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
            ]
        })
        .collect()
}

/// The lines above the node table: workload, backend, devices.
pub fn header_lines(r: &RunReport) -> String {
    let mut s = format!("workload: {}\nbackend:  {}\n", r.workload, r.backend);
    for d in &r.devices {
        s.push_str(&format!("device:   {d}\n"));
    }
    s
}

/// The report as a terminal table.
pub fn table(r: &RunReport) -> String {
    let mut s = header_lines(r);
    s.push('\n');
    s.push_str(&format!(
        "{:<20} {:<12} {:<11} {:<28} {:>10} {:>10} {:>9} {:>9}\n",
        "node", "op", "device", "kernel", "time ms", "device ms", "rel.err", "id diffs"
    ));
    s.push_str(&format!("{}\n", "-".repeat(115)));
    for row in node_rows(r) {
        let mut kernel = row[3].clone();
        if kernel.len() > 28 {
            kernel.truncate(27);
            kernel.push('~');
        }
        s.push_str(&format!(
            "{:<20} {:<12} {:<11} {:<28} {:>10} {:>10} {:>9} {:>9}\n",
            row[0], row[1], row[2], kernel, row[4], row[5], row[6], row[7]
        ));
    }
    s.push_str(&format!("{}\n", "-".repeat(115)));
    s.push_str(&summary_lines(r));
    s
}

/// The lines below the node table: totals, resident weights, the output's error, router
/// losses, fallbacks and warnings.
pub fn summary_lines(r: &RunReport) -> String {
    let mut s = String::new();
    // The ops' own time: what each device reports (events, cycles), the host wall where it
    // reports none. Node walls overlap where launches are queued ahead, so they are not summed.
    let op_total: f64 = r
        .nodes
        .iter()
        .map(|n| ms(n.run.launch.device_time.unwrap_or(n.run.wall)))
        .sum();
    let xfer: f64 = r.nodes.iter().map(|n| ms(n.run.transfer)).sum();
    let xfer_b: u64 = r.nodes.iter().map(|n| n.run.transfer_bytes).sum();
    s.push_str(&format!(
        "total: {:.3} ms wall ({:.3} ms of op time on the devices, {:.3} ms moving {:.2} MB to devices)\n",
        r.wall_s * 1e3,
        op_total,
        xfer,
        xfer_b as f64 / 1e6
    ));
    if let Some(w) = resident_line(r) {
        s.push_str(&w);
    }
    for line in memory_lines(r) {
        s.push_str(&line);
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
    // Fused units, from the node that ran each (the launch count is in its kernels).
    for n in &r.nodes {
        if let Some(f) = &n.run.fused
            && n.run.runs_unit()
        {
            let time = n
                .run
                .launch
                .device_time
                .map(|d| format!(" in {:.3} ms", d.as_secs_f64() * 1e3))
                .unwrap_or_default();
            s.push_str(&format!(
                "fused on {}: {f}; {}{time}\n",
                n.run.device, n.run.launch.kernel
            ));
        }
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

/// The memory report of every device that ran a node of `exec` or holds or moved data:
/// limits from `reg`, use from its [`crate::memory::DeviceMemory`].
pub fn memory_of(
    reg: &crate::backend::DeviceRegistry,
    exec: &crate::exec::Execution,
) -> Vec<crate::memory::DeviceMemoryReport> {
    let limits = reg.memory().limits();
    reg.backends()
        .iter()
        .filter_map(|b| {
            let device = b.id();
            let usage = reg.memory().usage(device);
            let ran = exec.runs.iter().any(|r| r.device == device);
            let touched = usage.peak + usage.uploaded + usage.downloaded + usage.peer > 0;
            (ran || touched).then(|| crate::memory::DeviceMemoryReport {
                device,
                limit_bytes: reg.memory_limit(device).unwrap_or(b.info().memory_bytes),
                limit_set: limits.limit_for(device).is_some(),
                usage,
            })
        })
        .collect()
}

/// A line per device on its memory: peak held against its limit, evictions, copies.
pub fn memory_lines(r: &RunReport) -> Vec<String> {
    use crate::limits::human_bytes;
    r.memory
        .iter()
        .map(|m| {
            let u = &m.usage;
            let mut s = format!(
                "memory: {} peak {} of {} {}",
                m.device,
                human_bytes(u.peak),
                human_bytes(m.limit_bytes),
                if m.limit_set { "limit" } else { "capacity" }
            );
            if u.evictions > 0 {
                s.push_str(&format!(
                    ", {} evictions ({} given back, fetched again when needed)",
                    u.evictions,
                    human_bytes(u.evicted_bytes)
                ));
            }
            if u.uploaded + u.downloaded + u.peer > 0 {
                s.push_str(&format!(
                    ", copied {:.2} MB in, {:.2} MB out",
                    (u.uploaded + u.peer) as f64 / 1e6,
                    u.downloaded as f64 / 1e6
                ));
            }
            s.push('\n');
            s
        })
        .collect()
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
/// per op (its wall time); a track "<device> copies" with a slice per node's input copies to
/// it (the bytes and weight bytes as arguments); and for devices that report their own
/// time (a simulated card's modelled time, CUDA events) a track "<device> device time" with
/// a slice per op of that time, starting with the op. Open it in ui.perfetto.dev or chrome://tracing.
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
    // A second track per device whose times are modelled or device-reported (a simulated
    // card's cycles / clock, CUDA events): the op's device time, beside its wall time.
    let modelled: Vec<String> = devices
        .iter()
        .filter(|d| {
            r.nodes
                .iter()
                .any(|n| &n.run.device.to_string() == *d && n.run.launch.device_time.is_some())
        })
        .cloned()
        .collect();
    let model_tid = |d: &str| devices.len() + modelled.iter().position(|x| x == d).unwrap_or(0);
    // A copy track per device that received data: each node's input copies, so that copies
    // to one device are seen overlapping the compute of the others.
    let copied: Vec<String> = devices
        .iter()
        .filter(|d| {
            r.nodes.iter().any(|n| {
                &n.run.device.to_string() == *d && n.run.transfer_bytes + n.run.resident_bytes > 0
            })
        })
        .cloned()
        .collect();
    let copy_tid =
        |d: &str| devices.len() + modelled.len() + copied.iter().position(|x| x == d).unwrap_or(0);
    for d in &copied {
        events.push(
            serde_json::json!({"ph": "M", "name": "thread_name", "pid": 1,
                               "tid": copy_tid(d), "args": {"name": format!("{d} copies")}}),
        );
    }
    for d in &modelled {
        events.push(
            serde_json::json!({"ph": "M", "name": "thread_name", "pid": 1,
                                       "tid": model_tid(d),
                                       "args": {"name": format!("{d} device time")}}),
        );
    }
    for n in &r.nodes {
        let dev = n.run.device.to_string();
        if let Some(dt) = n.run.launch.device_time {
            events.push(serde_json::json!({
                "ph": "X", "pid": 1, "tid": model_tid(&dev), "cat": "device time",
                "name": n.run.node,
                "ts": us(n.run.start + n.run.transfer + n.run.resident_transfer),
                "dur": us(dt),
                "args": {"kernel": n.run.launch.kernel, "cycles": n.run.launch.cycles,
                         "wall_ms": n.run.wall.as_secs_f64() * 1e3},
            }));
        }
        if n.run.transfer_bytes + n.run.resident_bytes > 0 {
            events.push(serde_json::json!({
                "ph": "X", "pid": 1, "tid": copy_tid(&dev), "cat": "transfer",
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
