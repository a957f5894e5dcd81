//! `tandem compare --html FILE`: one self-contained page (no scripts, no links out) with two
//! charts drawn as inline SVG (per-op time and per-op error, one bar per backend, log
//! scales) and the numbers in a table below.

use std::fmt::Write as _;

use tandem::report::RunReport;

/// Bar colours, one per backend (colour-blind safe: Okabe-Ito).
const COLOURS: [&str; 6] = [
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// One horizontal bar chart: a group per node, a bar per run; `values[run][node]` (`None`:
/// no bar), on a log scale; `unit` names the axis.
fn chart(
    id: &str,
    title: &str,
    unit: &str,
    nodes: &[String],
    runs: &[String],
    values: &[Vec<Option<f64>>],
    dim: &[Vec<bool>],
) -> String {
    let label_w = 190.0;
    let plot_w = 560.0;
    let bar_h = 10.0;
    let group_h = bar_h * runs.len() as f64 + 8.0;
    let top = 40.0;
    let height = top + group_h * nodes.len() as f64 + 40.0;
    let width = label_w + plot_w + 90.0;
    let positive = values
        .iter()
        .flatten()
        .flatten()
        .copied()
        .filter(|v| v.is_finite() && *v > 0.0);
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in positive {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg id="{id}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{title}">"#
    );
    let _ = write!(
        s,
        r#"<text x="0" y="18" font-size="15" font-weight="bold">{}</text>"#,
        esc(title)
    );
    if !lo.is_finite() {
        let _ = write!(
            s,
            r#"<text x="{label_w}" y="{}" font-size="12">no values to show</text></svg>"#,
            top + 12.0
        );
        return s;
    }
    // Decades that hold every value.
    let (d0, d1) = (
        lo.log10().floor(),
        hi.log10().ceil().max(lo.log10().floor() + 1.0),
    );
    let x = |v: f64| label_w + (v.log10() - d0) / (d1 - d0) * plot_w;
    let bottom = top + group_h * nodes.len() as f64;
    let mut d = d0;
    while d <= d1 + 1e-9 {
        let gx = x(10f64.powf(d));
        let _ = write!(
            s,
            r##"<line x1="{gx:.1}" y1="{top}" x2="{gx:.1}" y2="{bottom}" stroke="#ddd"/><text x="{gx:.1}" y="{:.1}" font-size="10" text-anchor="middle">1e{d:.0}</text>"##,
            bottom + 14.0
        );
        d += 1.0;
    }
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{} (log scale)</text>"#,
        label_w + plot_w / 2.0,
        bottom + 30.0,
        esc(unit)
    );
    for (i, node) in nodes.iter().enumerate() {
        let gy = top + group_h * i as f64;
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"#,
            label_w - 6.0,
            gy + group_h / 2.0 + 3.0,
            esc(node)
        );
        for (r, run) in runs.iter().enumerate() {
            let Some(v) = values[r].get(i).copied().flatten() else {
                continue;
            };
            let y = gy + 4.0 + bar_h * r as f64;
            let colour = COLOURS[r % COLOURS.len()];
            if v.is_finite() && v > 0.0 {
                let w = (x(v) - label_w).max(1.0);
                let faded = dim.get(r).and_then(|d| d.get(i)).copied().unwrap_or(false);
                let _ = write!(
                    s,
                    r#"<rect class="bar" x="{label_w}" y="{y:.1}" width="{w:.1}" height="{:.1}" fill="{colour}" fill-opacity="{}"><title>{}: {} {v:.3e}{}</title></rect>"#,
                    bar_h - 1.0,
                    if faded { "0.35" } else { "1" },
                    esc(node),
                    esc(run),
                    if faded { " (ran on the CPU)" } else { "" }
                );
            } else {
                // zero (exact) or not finite: said, not drawn
                let what = if v == 0.0 { "0" } else { "NaN" };
                let _ = write!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" font-size="9" fill="{colour}">{what}</text>"#,
                    label_w + 2.0,
                    y + bar_h - 2.0
                );
            }
        }
    }
    // Legend.
    for (r, run) in runs.iter().enumerate() {
        let ly = top + 14.0 * r as f64;
        let lx = label_w + plot_w + 10.0;
        let _ = write!(
            s,
            r#"<rect x="{lx}" y="{ly}" width="10" height="10" fill="{}"/><text x="{}" y="{}" font-size="11">{}</text>"#,
            COLOURS[r % COLOURS.len()],
            lx + 14.0,
            ly + 9.0,
            esc(run)
        );
    }
    s.push_str("</svg>");
    s
}

/// The page. `runs` are the compared runs of one workload (same nodes, same order);
/// `not_compared` the device kinds missing, with the reason.
pub fn compare_page(label: &str, runs: &[RunReport], not_compared: &[String]) -> String {
    let nodes: Vec<String> = runs
        .first()
        .map(|r| r.nodes.iter().map(|n| n.run.node.to_string()).collect())
        .unwrap_or_default();
    let names: Vec<String> = runs.iter().map(|r| r.backend.clone()).collect();
    let times: Vec<Vec<Option<f64>>> = runs
        .iter()
        .map(|r| {
            r.nodes
                .iter()
                .map(|n| Some(n.run.launch.device_time.unwrap_or(n.run.wall).as_secs_f64() * 1e3))
                .collect()
        })
        .collect();
    // Faded bars: the op ran on the CPU in that backend's run (the device lacks it).
    let elsewhere: Vec<Vec<bool>> = runs
        .iter()
        .map(|r| {
            r.nodes
                .iter()
                .map(|n| n.run.device.kind.name() != r.backend)
                .collect()
        })
        .collect();
    let errors: Vec<Vec<Option<f64>>> = runs
        .iter()
        .map(|r| r.nodes.iter().map(|n| n.error.rel_error).collect())
        .collect();
    let mut s = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"generator\" content=\"tandem compare\">",
    );
    let _ = write!(
        s,
        "<title>tandem compare: {}</title><style>body{{font-family:sans-serif;margin:2em;max-width:980px}}\
         table{{border-collapse:collapse;font-size:12px}}td,th{{border-bottom:1px solid #ddd;padding:3px 8px;text-align:right}}\
         td:first-child,th:first-child,td:nth-child(2),th:nth-child(2){{text-align:left}}.note{{color:#555;font-size:13px}}</style></head><body>",
        esc(label)
    );
    let _ = write!(
        s,
        "<h1>tandem compare</h1><p id=\"workload\">{}</p>",
        esc(label)
    );
    let _ = write!(
        s,
        "<p class=\"note\">tandem {} (commit {}), {}. Times are device-reported where the device reports them (a simulated FPGA's time is modelled: cycles / clock), else wall time; error is ||out - ref|| / ||ref|| against the f64 reference on the op's inputs.</p>",
        env!("CARGO_PKG_VERSION"),
        super::GIT_COMMIT,
        super::timestamp()
    );
    for m in not_compared {
        let _ = write!(s, "<p class=\"note\">not compared: {}</p>", esc(m));
    }
    s.push_str(&chart(
        "time",
        "Per-op time by backend",
        "milliseconds",
        &nodes,
        &names,
        &times,
        &elsewhere,
    ));
    s.push_str(&chart(
        "error",
        "Per-op error against the f64 reference",
        "relative error",
        &nodes,
        &names,
        &errors,
        &elsewhere,
    ));
    s.push_str("<h2>Numbers</h2><table id=\"numbers\"><thead><tr><th>node</th><th>op</th>");
    for n in &names {
        let _ = write!(s, "<th>{0} ms</th><th>{0} rel.err</th>", esc(n));
    }
    s.push_str("</tr></thead><tbody>");
    for (i, node) in nodes.iter().enumerate() {
        let op = runs
            .first()
            .and_then(|r| r.nodes.get(i))
            .map(|n| n.run.op)
            .unwrap_or_default();
        let _ = write!(s, "<tr><td>{}</td><td>{}</td>", esc(node), esc(op));
        for (r, run) in runs.iter().enumerate() {
            let here = run
                .nodes
                .get(i)
                .is_some_and(|n| n.run.device.kind.name() == run.backend);
            let t = times[r][i].map(|v| format!("{v:.3}")).unwrap_or_default();
            let e = errors[r][i]
                .map(|v| format!("{v:.1e}"))
                .unwrap_or_else(|| "-".into());
            let _ = write!(s, "<td>{t}{}</td><td>{e}</td>", if here { "" } else { "*" });
        }
        s.push_str("</tr>");
    }
    s.push_str("<tr><th>total wall ms / output rel.err</th><th></th>");
    for run in runs {
        let e = run
            .output_rel_error
            .map(|v| format!("{v:.1e}"))
            .unwrap_or_else(|| "-".into());
        let _ = write!(s, "<th>{:.3}</th><th>{e}</th>", run.wall_s * 1e3);
    }
    s.push_str(
        "</tr></tbody></table><p class=\"note\">* (and faded bars): ran on the CPU, the device lacks the op</p></body></html>\n",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_scales_and_escapes() {
        let svg = chart(
            "t",
            "T<1>",
            "ms",
            &["a&b".into(), "c".into()],
            &["cpu".into()],
            &[vec![Some(0.5), Some(0.0)]],
            &[vec![true, false]],
        );
        assert!(svg.contains("fill-opacity=\"0.35\""), "{svg}");
        assert!(
            svg.contains("T&lt;1&gt;") && svg.contains("a&amp;b"),
            "{svg}"
        );
        assert_eq!(svg.matches("class=\"bar\"").count(), 1, "{svg}");
        assert!(svg.contains(">0</text>"), "the zero is said: {svg}");
        let empty = chart(
            "t",
            "T",
            "ms",
            &["a".into()],
            &["cpu".into()],
            &[vec![None]],
            &[],
        );
        assert!(empty.contains("no values"), "{empty}");
    }
}
