//! The binary's reports and conventions, run as a user would: every `--format` parsed back,
//! the HTML page of `compare` opened in a headless browser where there is one, baselines
//! and their verdicts, flags refused where they do not apply, a closed pipe, progress lines
//! off a terminal, `--version`, `--help` and shell completions.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

mod support;

use support::{TestResult, text};

fn command(args: &[&str], env: &[(&str, &str)]) -> Command {
    support::command(args, "error", env)
}

fn tandem_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    command(args, env)
        .output()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", support::bin().display()))
}

fn tandem(args: &[&str]) -> Output {
    tandem_env(args, &[])
}

/// A small Mixtral layer: fast on the CPU and on the simulated card.
const SMALL: [&str; 6] = ["--seq-len", "8", "--d-model", "64", "--ffn", "32"];

fn with_small<'a>(cmd: &[&'a str]) -> Vec<&'a str> {
    let mut v = cmd.to_vec();
    v.extend(SMALL);
    v
}

fn ok(o: &Output) -> String {
    let (out, err) = text(o);
    assert!(o.status.success(), "exit {:?}\n{err}", o.status);
    assert!(!err.contains("panicked"), "{err}");
    out
}

/// No `{"secs": .., "nanos": ..}` left anywhere in `v`.
fn no_duration_objects(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Object(m) => {
            !(m.contains_key("secs") && m.contains_key("nanos"))
                && m.values().all(no_duration_objects)
        }
        serde_json::Value::Array(a) => a.iter().all(no_duration_objects),
        _ => true,
    }
}

fn check_envelope(v: &serde_json::Value, kind: &str) {
    assert_eq!(v["schema_version"].as_u64(), Some(2), "{v}");
    assert_eq!(v["kind"], kind);
    assert_eq!(v["tool"]["name"], "tandem");
    assert_eq!(v["tool"]["version"], env!("CARGO_PKG_VERSION"));
    assert!(v["tool"]["commit"].as_str().is_some_and(|c| !c.is_empty()));
    let created = v["created"].as_str().unwrap_or_default();
    assert!(created.len() == 20 && created.ends_with('Z'), "{created}");
    assert!(no_duration_objects(v), "a duration as secs/nanos in {v}");
}

#[test]
fn run_json_has_a_schema_numbers_for_seconds_and_structured_objects() -> TestResult {
    let o = tandem(&with_small(&["run", "--format", "json"]));
    let v: serde_json::Value = serde_json::from_str(&ok(&o))?;
    check_envelope(&v, "run");
    let nodes = v["nodes"].as_array().ok_or("nodes")?;
    assert_eq!(nodes.len(), 17);
    for n in nodes {
        assert!(n["wall_s"].as_f64().is_some_and(|s| s >= 0.0), "{n}");
        assert!(n["start_s"].as_f64().is_some(), "{n}");
        assert!(n.get("wall").is_none(), "{n}");
        assert!(n["device"]["kind"].as_str().is_some(), "{n}");
    }
    assert_eq!(v["workload"]["config"]["seq_len"], 8);
    assert_eq!(v["workload"]["config"]["d_model"], 64);
    assert!(
        v["workload"]["label"]
            .as_str()
            .is_some_and(|l| l.contains("T=8"))
    );
    let found = v["devices"]["found"].as_array().ok_or("devices.found")?;
    assert!(found.iter().any(|d| d["id"]["kind"] == "cpu"), "{found:?}");
    assert!(v["devices"]["missing"].is_array());
    // --json is --format json
    let o = tandem(&with_small(&["run", "--json"]));
    let w: serde_json::Value = serde_json::from_str(&ok(&o))?;
    assert_eq!(w["schema_version"], v["schema_version"]);
    Ok(())
}

#[test]
fn plan_json_names_its_nodes() -> TestResult {
    let o = tandem(&with_small(&["plan", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&ok(&o))?;
    check_envelope(&v, "plan");
    let p = v["placements"].as_array().ok_or("placements")?;
    assert_eq!(p.len(), 17);
    assert_eq!(p[0]["node"], "input_norm");
    assert!(
        p.iter()
            .any(|x| x["node"] == "attention" && x["op"] == "attention")
    );
    assert!(p.iter().all(|x| x["estimate_s"].as_f64().is_some()));
    assert!(v["makespan_s"].as_f64().is_some());
    Ok(())
}

/// The cells of a Markdown table's rows (after the header and the `---` line), checked
/// to be a table: every row as wide as the header.
fn markdown_table(text: &str) -> Result<(Vec<String>, Vec<Vec<String>>), String> {
    let cells = |l: &str| -> Vec<String> {
        l.trim()
            .trim_start_matches('|')
            .trim_end_matches('|')
            .split(" | ")
            .map(|c| c.trim().to_string())
            .collect()
    };
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with('|')).collect();
    let (head, rest) = lines.split_first().ok_or("no table")?;
    let (rule, rows) = rest.split_first().ok_or("no rule")?;
    let header = cells(head);
    let rule = cells(rule);
    if rule.len() != header.len()
        || !rule
            .iter()
            .all(|c| c.trim_end_matches(':') == "---" || c == "---:")
    {
        return Err(format!("bad rule line for {header:?}: {rule:?}"));
    }
    let rows: Vec<Vec<String>> = rows.iter().map(|l| cells(l)).collect();
    if let Some(r) = rows.iter().find(|r| r.len() != header.len()) {
        return Err(format!("row {r:?} is not as wide as {header:?}"));
    }
    Ok((header, rows))
}

#[test]
fn run_markdown_and_csv_parse_back() -> TestResult {
    let md = ok(&tandem(&with_small(&["run", "--format", "markdown"])));
    let (header, rows) = markdown_table(&md)?;
    assert_eq!(header[0], "node");
    assert_eq!(header.len(), 8);
    assert_eq!(rows.len(), 17);
    assert!(rows.iter().any(|r| r[0] == "attention"));
    assert!(md.contains("layer output vs f64 reference"), "{md}");

    let csv_text = ok(&tandem(&with_small(&["run", "--format", "csv"])));
    let mut r = csv::Reader::from_reader(csv_text.as_bytes());
    let headers = r.headers()?.clone();
    assert_eq!(&headers[0], "node");
    assert_eq!(&headers[4], "time ms");
    let records: Vec<csv::StringRecord> = r.records().collect::<Result<_, _>>()?;
    assert_eq!(records.len(), 17);
    for rec in &records {
        assert_eq!(rec.len(), headers.len());
        let t: f64 = rec[4].parse()?;
        assert!(t >= 0.0);
    }
    Ok(())
}

#[test]
fn compare_and_plan_and_bench_in_every_format() -> TestResult {
    for cmd in [
        with_small(&["compare"]),
        with_small(&["plan"]),
        vec![
            "bench",
            "rmsnorm",
            "--backend",
            "cpu",
            "--rows",
            "8",
            "--cols",
            "64",
            "--iters",
            "5",
        ],
    ] {
        for format in ["table", "json", "markdown", "csv"] {
            let mut args = cmd.clone();
            args.extend(["--format", format]);
            let out = ok(&tandem(&args));
            match format {
                "json" => {
                    let v: serde_json::Value = serde_json::from_str(&out)?;
                    check_envelope(&v, cmd[0]);
                }
                "markdown" => {
                    let (h, rows) = markdown_table(&out)?;
                    assert!(!rows.is_empty() && h.len() >= 2, "{args:?}: {out}");
                }
                "csv" => {
                    let mut r = csv::Reader::from_reader(out.as_bytes());
                    let n = r.headers()?.len();
                    let recs: Vec<csv::StringRecord> = r.records().collect::<Result<_, _>>()?;
                    assert!(!recs.is_empty(), "{args:?}: {out}");
                    assert!(recs.iter().all(|x| x.len() == n));
                }
                _ => assert!(!out.is_empty()),
            }
        }
    }
    // compare's JSON: one run per device kind found, its nodes' seconds as numbers
    let v: serde_json::Value =
        serde_json::from_str(&ok(&tandem(&with_small(&["compare", "--json"]))))?;
    let runs = v["runs"].as_array().ok_or("runs")?;
    assert!(
        runs.iter()
            .all(|r| r["nodes"][0]["wall_s"].as_f64().is_some())
    );
    // bench's JSON keeps its keys at the top, with the spread
    let v: serde_json::Value = serde_json::from_str(&ok(&tandem(&[
        "bench",
        "rmsnorm",
        "--backend",
        "cpu",
        "--rows",
        "8",
        "--cols",
        "64",
        "--iters",
        "7",
        "--json",
    ])))?;
    assert_eq!(v["op"], "rmsnorm");
    assert_eq!(v["runs"], 7);
    assert_eq!(v["samples_s"].as_array().map(Vec::len), Some(7));
    assert!(v["q1_s"].as_f64().is_some() && v["outliers"]["severe"].as_u64().is_some());
    Ok(())
}

/// Debian's chromium, where installed.
fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| {
            Command::new(b)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}

#[test]
fn compare_html_is_a_page_with_two_charts_in_a_browser() -> TestResult {
    let dir = tempfile::tempdir()?;
    let page = dir.path().join("compare.html");
    let p = page.to_str().ok_or("path")?;
    let out = ok(&tandem(&with_small(&["compare", "--html", p])));
    assert!(out.contains("html: "), "{out}");
    let html = std::fs::read_to_string(&page)?;
    assert!(html.starts_with("<!DOCTYPE html>"));
    // self-contained: nothing fetched from elsewhere
    for outside in ["<script", "src=\"http", "href=\"http", "<link"] {
        assert!(!html.contains(outside), "{outside} in the page");
    }
    assert!(html.contains("<svg id=\"time\"") && html.contains("<svg id=\"error\""));
    let Some(browser) = chromium() else {
        println!("SKIP: no chromium to open the page in (apt-get install chromium)");
        return Ok(());
    };
    let profile = tempfile::tempdir()?;
    let o = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            &format!("--user-data-dir={}", profile.path().display()),
            "--dump-dom",
            &format!("file://{p}"),
        ])
        .output()?;
    let dom = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{browser}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // The browser parsed it into the elements written: both charts with bars (one per
    // node and backend, times are never zero) and the numbers table with 17 nodes + total.
    assert!(
        dom.contains("id=\"time\"") && dom.contains("id=\"error\""),
        "{dom}"
    );
    let time_chart = dom
        .split("id=\"time\"")
        .nth(1)
        .and_then(|s| s.split("</svg>").next())
        .ok_or("time chart")?;
    assert!(
        time_chart.matches("class=\"bar\"").count() >= 17,
        "{time_chart}"
    );
    let numbers = dom.split("id=\"numbers\"").nth(1).ok_or("numbers table")?;
    assert_eq!(numbers.matches("<tr>").count(), 1 + 17 + 1, "{numbers}");
    // And it renders: a screenshot is written.
    let shot = dir.path().join("compare.png");
    let o = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            &format!("--user-data-dir={}", profile.path().display()),
            &format!("--screenshot={}", shot.display()),
            "--window-size=1000,1400",
            &format!("file://{p}"),
        ])
        .output()?;
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let png = std::fs::read(&shot)?;
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    Ok(())
}

/// The simulator's build cache tandem uses here (so a test that moves TANDEM_CACHE_DIR
/// does not rebuild every kernel with Verilator): the variables in tandem's order.
// Reads the variables tandem would, to hand the same folder on (not a tandem option).
#[allow(clippy::disallowed_methods)]
fn sim_cache() -> Option<PathBuf> {
    let var = |n: &str| {
        std::env::var_os(n)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("TANDEM_SIM_CACHE_DIR")
        .or_else(|| var("TANDEM_SIM_CACHE"))
        .or_else(|| var("TANDEM_CACHE_DIR").map(|d| d.join("sim")))
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("tandem/sim")))
        .or_else(|| var("HOME").map(|d| d.join(".cache/tandem/sim")))
}

#[test]
fn baselines_are_saved_compared_and_a_missing_one_is_named() -> TestResult {
    let cache = tempfile::tempdir()?;
    let c = cache.path().to_str().ok_or("path")?;
    let sim = sim_cache().unwrap_or_else(|| cache.path().join("sim"));
    let sim = sim.to_str().ok_or("path")?;
    let env = [("TANDEM_CACHE_DIR", c), ("TANDEM_SIM_CACHE_DIR", sim)];
    let bench = [
        "bench",
        "rmsnorm",
        "--backend",
        "cpu",
        "--rows",
        "64",
        "--cols",
        "256",
        "--iters",
        "20",
    ];
    let mut args = bench.to_vec();
    args.extend(["--save-baseline", "before"]);
    let o = tandem_env(&args, &env);
    ok(&o);
    assert!(text(&o).1.contains("saved baseline 'before'"));
    assert!(cache.path().join("baselines/before.json").is_file());
    let mut args = bench.to_vec();
    args.extend(["--baseline", "before"]);
    let out = ok(&tandem_env(&args, &env));
    assert!(out.contains("against baseline 'before'"), "{out}");
    let verdict = out
        .lines()
        .find(|l| l.starts_with("verdict: "))
        .ok_or(out.clone())?;
    assert!(
        verdict.contains("regressed") && verdict.contains("no change"),
        "{verdict}"
    );
    let mut args = bench.to_vec();
    args.extend(["--baseline", "before", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&ok(&tandem_env(&args, &env)))?;
    let e = &v["baseline"]["entries"][0];
    assert_eq!(e["key"], "bench/rmsnorm/64x256/cpu");
    assert!(e["verdict"]["change"].as_f64().is_some(), "{v}");
    assert!(
        ["regressed", "improved", "no_change"]
            .contains(&e["verdict"]["verdict"].as_str().unwrap_or("")),
        "{e}"
    );
    // compare saves per node and per backend
    let o = tandem_env(&with_small(&["compare", "--save-baseline", "c1"]), &env);
    ok(&o);
    let o = tandem_env(&with_small(&["compare", "--baseline", "c1"]), &env);
    let out = ok(&o);
    assert!(out.contains("compare/cpu/attention: "), "{out}");
    // a name never saved: exit 1 before any work, naming what is there
    let mut args = bench.to_vec();
    args.extend(["--baseline", "nope"]);
    let o = tandem_env(&args, &env);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no baseline 'nope'") && err.contains("before"),
        "{err}"
    );
    let mut args = bench.to_vec();
    args.extend(["--save-baseline", "../escape"]);
    let o = tandem_env(&args, &env);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("not accepted"), "{}", text(&o).1);
    Ok(())
}

#[test]
fn flags_that_do_not_apply_are_refused() {
    for (cmd, flag) in [
        ("compare", vec!["--trace", "t.json"]),
        ("compare", vec!["--save", "s.safetensors"]),
        ("compare", vec!["--explain"]),
        ("compare", vec!["--backend", "cpu"]),
        ("plan", vec!["--trace", "t.json"]),
        ("plan", vec!["--save", "s.safetensors"]),
        ("plan", vec!["--warmup", "2"]),
        ("plan", vec!["--timeout", "5"]),
        ("plan", vec!["--no-check"]),
        ("devices", vec!["--format", "csv"]),
    ] {
        let mut args = vec![cmd];
        args.extend(flag.iter().copied());
        let o = tandem(&args);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("unexpected argument"), "{args:?}: {err}");
    }
    // and every listed format is accepted, a name not listed refused with the list
    let o = tandem(&with_small(&["plan", "--format", "xml"]));
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(err.contains("table, json, markdown, csv"), "{err}");
    let o = tandem(&with_small(&["plan", "--format", "csv", "--json"]));
    assert_eq!(o.status.code(), Some(2), "--json and --format together");
}

#[test]
fn a_closed_pipe_ends_quietly() -> TestResult {
    // The reader goes away before tandem writes (devices are looked for first).
    let mut child = command(&["devices"], &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    drop(child.stdout.take());
    let o = child.wait_with_output()?;
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.is_empty(), "a closed pipe printed: {err}");
    assert_ne!(o.status.code(), Some(101), "panicked");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert!(
            o.status.success() || o.status.signal() == Some(13),
            "{:?}",
            o.status
        );
    }
    // Through a shell, as a user types it.
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{}' completions bash | head -1",
            support::bin().display()
        ))
        .env("TANDEM_LOG", "error")
        .output()?;
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).is_empty(), "{o:?}");
    Ok(())
}

#[test]
fn progress_lines_off_a_terminal() {
    // stderr is a pipe here: plain lines, no bar codes.
    let o = tandem(&[
        "bench",
        "rmsnorm",
        "--backend",
        "cpu",
        "--rows",
        "8",
        "--cols",
        "64",
        "--iters",
        "4",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.lines()
            .any(|l| l
                .starts_with("tandem: timing rmsnorm 8x64 on cpu: 6 untimed + 4 timed runs...")),
        "{err}"
    );
    assert!(err.lines().any(|l| l.contains(": done in ")), "{err}");
    assert!(
        !err.contains('\u{1b}'),
        "escape codes off a terminal: {err:?}"
    );
    assert!(!out.contains("tandem: timing"), "progress on stdout: {out}");
    // A long run's header comes before the work (the node table after it).
    let o = tandem(&with_small(&["run"]));
    let out = ok(&o);
    assert!(out.starts_with("workload: "), "{out}");
}

#[test]
fn version_help_and_completions() {
    let out = ok(&tandem(&["--version"]));
    assert!(
        out.starts_with(&format!("tandem {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{out}"
    );
    assert!(out.contains("device kinds: cpu"), "{out}");
    assert!(out.contains("fpga-sim"), "{out}");
    let out = ok(&tandem(&["--help"]));
    for var in [
        "TANDEM_LOG",
        "TANDEM_CACHE_DIR",
        "TANDEM_SIM_CACHE_DIR",
        "TANDEM_HISTORY",
        "TANDEM_CUDA_DTYPE",
    ] {
        assert!(out.contains(var), "{var} missing from --help:\n{out}");
    }
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef tandem"),
        ("fish", "complete -c tandem"),
    ] {
        let out = ok(&tandem(&["completions", shell]));
        assert!(out.contains(marker), "{shell}: {out}");
        assert!(out.contains("compare"), "{shell}");
    }
    let o = tandem(&["completions", "tcsh"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn an_invalid_log_filter_is_reported() {
    let o = tandem_env(&["devices"], &[("TANDEM_LOG", "tandem=loud")]);
    let (_, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("TANDEM_LOG='tandem=loud' is not a log filter"),
        "{err}"
    );
}

#[test]
fn the_trace_has_a_device_time_track() -> TestResult {
    let dir = tempfile::tempdir()?;
    let t = dir.path().join("trace.json");
    ok(&tandem(&with_small(&[
        "run",
        "--backend",
        "cpu",
        "--trace",
        t.to_str().ok_or("path")?,
    ])));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&t)?)?;
    let ev = v["traceEvents"].as_array().ok_or("events")?;
    let track = ev
        .iter()
        .find(|e| e["ph"] == "M" && e["args"]["name"] == "cpu device time")
        .ok_or("no device time track")?;
    let slices = ev
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"] == track["tid"] && e["cat"] == "device time")
        .count();
    assert_eq!(slices, 17);
    Ok(())
}
