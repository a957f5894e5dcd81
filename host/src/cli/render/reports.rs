//! The reports of `run`, `plan`, `compare` and `bench` in the table formats, and the JSON
//! objects they share (workload, plan).

use std::io::Write as _;

use serde_json::{Value, json};
use tandem::DeviceRegistry;
use tandem::bench::BenchReport;
use tandem::graph::Graph;
use tandem::plan::Plan;
use tandem::report::{self, RunReport};
use tandem::workload::MixtralConfig;

use super::{Format, Grid, markdown_lines};

/// The workload as an object: its label, and its sizes where it is a Mixtral layer.
pub fn workload_json(label: &str, config: Option<&MixtralConfig>) -> Value {
    let name = label.split(": ").next().unwrap_or(label);
    let mut v = json!({ "name": name, "label": label });
    if let (Some(c), Some(m)) = (config, v.as_object_mut()) {
        m.insert(
            "config".into(),
            serde_json::to_value(c).unwrap_or(Value::Null),
        );
        m.insert("head_dim".into(), c.head_dim().into());
    }
    v
}

/// The report's header (workload, backend, devices), printed and flushed before the run
/// so a long run shows what it is doing from its start.
pub fn print_run_header(label: &str, backend: &str, reg: &DeviceRegistry) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    write!(out, "workload: {label}\nbackend:  {backend}\n")?;
    for d in report::device_labels(reg) {
        writeln!(out, "device:   {d}")?;
    }
    out.flush()?;
    Ok(())
}

/// The node table of `r`.
pub fn node_grid(r: &RunReport) -> Grid {
    let mut g = Grid::new(&report::NODE_COLUMNS, &[4, 5, 6, 7]);
    g.rows = report::node_rows(r);
    g
}

/// `run`'s report in a table format: with `header`, the workload and devices first (the
/// table format prints them before the run); Markdown adds the summary lines after; CSV is
/// the node table alone.
pub fn run_tables(r: &RunReport, format: Format, header: bool) -> anyhow::Result<String> {
    let grid = node_grid(r).render(format)?;
    Ok(match format {
        Format::Csv => grid,
        Format::Markdown => {
            let mut s = String::new();
            if header {
                s.push_str(&markdown_lines(&report::header_lines(r)));
                s.push('\n');
            }
            s.push_str(&grid);
            s.push('\n');
            s.push_str(&markdown_lines(&report::summary_lines(r)));
            s
        }
        _ => {
            let mut s = String::new();
            if header {
                s.push_str(&report::header_lines(r));
            }
            s.push('\n');
            s.push_str(&grid);
            s.push_str(&report::summary_lines(r));
            s
        }
    })
}

/// The plan as an object: per node its name, op, device, estimate and finish (seconds) and
/// reason; the makespan; warnings; per device used the memory it plans (`memory`: limit,
/// peak, resident and derived bytes, as [`tandem::plan::PlannedMemory`], with `device_name`).
pub fn plan_json(graph: &Graph, plan: &Plan) -> anyhow::Result<Value> {
    let mut v = serde_json::to_value(plan)?;
    if let Some(ps) = v.get_mut("placements").and_then(Value::as_array_mut) {
        for ((p, node), placed) in ps.iter_mut().zip(&graph.nodes).zip(&plan.placements) {
            if let Some(m) = p.as_object_mut() {
                m.insert("node".into(), node.name.clone().into());
                m.insert("op".into(), node.op.name().into());
                m.insert("device_name".into(), placed.device.to_string().into());
            }
        }
    }
    name_memory_devices(&mut v, plan);
    report::seconds_as_numbers(&mut v);
    Ok(v)
}

/// Adds `device_name` (`cuda:0`) to each entry of the plan object's `memory`.
fn name_memory_devices(v: &mut Value, plan: &Plan) {
    let Some(ms) = v.get_mut("memory").and_then(Value::as_array_mut) else {
        return;
    };
    for (m, planned) in ms.iter_mut().zip(&plan.memory) {
        if let Some(m) = m.as_object_mut() {
            m.insert("device_name".into(), planned.device.to_string().into());
        }
    }
}

/// `plan` in Markdown or CSV: node, op, device, estimate, finish, reason.
pub fn plan_tables(
    label: &str,
    graph: &Graph,
    plan: &Plan,
    format: Format,
) -> anyhow::Result<String> {
    let mut g = Grid::new(
        &["node", "op", "device", "estimate ms", "finish ms", "reason"],
        &[3, 4],
    );
    for (n, p) in graph.nodes.iter().zip(&plan.placements) {
        g.rows.push(vec![
            n.name.clone(),
            n.op.name().to_string(),
            p.device.to_string(),
            format!("{:.3}", p.estimate.as_secs_f64() * 1e3),
            format!("{:.3}", p.finish.as_secs_f64() * 1e3),
            p.reason.to_string(),
        ]);
    }
    let grid = g.render(format)?;
    Ok(match format {
        Format::Markdown => {
            let mut s = markdown_lines(&format!("workload: {label}"));
            s.push('\n');
            s.push_str(&grid);
            s.push('\n');
            let mut tail = format!(
                "estimated makespan {:.3} ms\n",
                plan.makespan.as_secs_f64() * 1e3
            );
            tail.push_str(&tandem::plan::memory_lines(plan));
            for w in &plan.warnings {
                tail.push_str(&format!("warning: {w}\n"));
            }
            s.push_str(&markdown_lines(&tail));
            s
        }
        _ => grid,
    })
}

/// `compare`'s side-by-side grid: node, op, then per run `<backend> ms` and
/// `<backend> rel.err` (`*` after a time: ran on the CPU), and a total row.
pub fn compare_grid(graph: &Graph, runs: &[RunReport]) -> Grid {
    let mut header: Vec<String> = vec!["node".into(), "op".into()];
    let mut right = Vec::new();
    for r in runs {
        right.push(header.len());
        header.push(format!("{} ms", r.backend));
        right.push(header.len());
        header.push(format!("{} rel.err", r.backend));
    }
    let mut g = Grid {
        header,
        rows: Vec::new(),
        right,
    };
    for (i, node) in graph.nodes.iter().enumerate() {
        let mut row = vec![node.name.clone(), node.op.name().to_string()];
        for r in runs {
            let Some(n) = r.nodes.get(i) else {
                row.extend(["-".to_string(), "-".to_string()]);
                continue;
            };
            let t = n.run.launch.device_time.unwrap_or(n.run.wall).as_secs_f64() * 1e3;
            let here = if n.run.device.kind.name() == r.backend {
                ""
            } else {
                "*"
            };
            row.push(format!("{t:.3}{here}"));
            row.push(
                n.error
                    .rel_error
                    .map(|e| format!("{e:.1e}"))
                    .unwrap_or_else(|| "-".into()),
            );
        }
        g.rows.push(row);
    }
    let mut total = vec!["total (wall)".to_string(), "output".to_string()];
    for r in runs {
        total.push(format!("{:.3}", r.wall_s * 1e3));
        total.push(
            r.output_rel_error
                .map(|e| format!("{e:.1e}"))
                .unwrap_or_else(|| "-".into()),
        );
    }
    g.rows.push(total);
    g
}

/// `bench`'s result as a one-row grid (Markdown, CSV).
pub fn bench_grid(r: &BenchReport) -> Grid {
    let sp = r.spread();
    let mut g = Grid::new(
        &[
            "op",
            "shape",
            "backend",
            "kernel",
            "timing",
            "runs",
            "median ms",
            "min ms",
            "max ms",
            "iqr ms",
            "outliers",
            "tflops",
            "gbps",
            "cycles",
        ],
        &[5, 6, 7, 8, 9, 10, 11, 12, 13],
    );
    g.rows.push(vec![
        r.op.to_string(),
        r.shape.clone(),
        r.backend.to_string(),
        r.kernel.clone(),
        r.timing.name().to_string(),
        r.runs.to_string(),
        format!("{:.4}", r.median_s * 1e3),
        format!("{:.4}", r.min_s * 1e3),
        format!("{:.4}", r.max_s * 1e3),
        format!("{:.4}", sp.iqr_s() * 1e3),
        (sp.mild_outliers + sp.severe_outliers).to_string(),
        format!("{:.3}", r.tflops()),
        format!("{:.1}", r.gbps()),
        r.cycles
            .map(|c| format!("{c:.0}"))
            .unwrap_or_else(|| "-".into()),
    ]);
    g
}
