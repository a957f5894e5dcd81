//! `--memory-limit` through the binary: bad values refused with what is accepted, a limit
//! smaller than one op's working set refused before the run (naming the node, the device,
//! the bytes and the limit), and the peak memory per device in the text and JSON reports of
//! `run`, and the memory `plan` expects each device to hold.

mod support;

use support::{TestResult, output, text};

const SMALL: [&str; 6] = ["--seq-len", "8", "--d-model", "64", "--ffn", "32"];

fn run(extra: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut args = vec!["run", "--backend", "cpu"];
    args.extend_from_slice(&SMALL);
    args.extend_from_slice(extra);
    output(&args, "warn", env)
}

fn assert_refused(o: &std::process::Output, needles: &[&str]) {
    let (_, err) = text(o);
    assert_eq!(o.status.code(), Some(1), "stderr:\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` missing from:\n{err}");
    }
}

#[test]
fn bad_limits_are_refused_naming_the_device_and_the_units() {
    assert_refused(
        &run(&["--memory-limit", "cuda:0=8XB"], &[]),
        &[
            "--memory-limit",
            "cuda:0: '8XB' is not a memory size",
            "K, M, G or T",
        ],
    );
    assert_refused(
        &run(&["--memory-limit", "npu:0=1G"], &[]),
        &["'npu:0' is not a device", "cpu, cuda, fpga-sim, fpga"],
    );
    assert_refused(
        &run(&[], &[("TANDEM_MEMORY_LIMIT", "cpu")]),
        &["TANDEM_MEMORY_LIMIT", "'cpu' is not device=size"],
    );
    // The flag wins over a variable it replaces... only where it is given; a bad variable
    // without the flag stops the run, as every TANDEM_* does.
    let o = run(&["--memory-limit", "cpu=8G"], &[]);
    assert!(o.status.success(), "{}", text(&o).1);
}

#[test]
fn a_limit_below_one_op_is_an_error_before_the_run() {
    let o = run(&["--memory-limit", "cpu=4K"], &[]);
    assert_refused(
        &o,
        &[
            "fits no device",
            "on cpu it needs",
            "over the limit of 4.0 KiB (4096 bytes)",
            "raise --memory-limit",
        ],
    );
    // Nothing ran: no node table.
    assert!(!text(&o).0.contains("layer output vs f64 reference"));
}

#[test]
fn peak_memory_per_device_is_reported() -> TestResult {
    let o = run(&["--memory-limit", "cpu=1G"], &[]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("memory: cpu peak"))
        .ok_or_else(|| format!("no memory line in:\n{out}"))?;
    assert!(line.contains("of 1.0 GiB limit"), "{line}");
    let o = run(&["--memory-limit", "cpu=1G", "--json"], &[]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out)?;
    let mem = v
        .pointer("/report/memory")
        .or_else(|| v.get("memory"))
        .and_then(|m| m.as_array())
        .ok_or_else(|| format!("no memory array in {out}"))?;
    let cpu = mem
        .iter()
        .find(|m| m["device"]["kind"] == "cpu")
        .ok_or("no cpu entry")?;
    assert_eq!(cpu["limit_bytes"], 1u64 << 30);
    assert_eq!(cpu["limit_set"], true);
    let peak = cpu["peak"].as_u64().ok_or("peak")?;
    assert!(peak > 0 && peak <= 1 << 30, "{cpu}");
    Ok(())
}

/// `tandem plan` with `SMALL` sizes on the CPU, under `TANDEM_MEMORY_LIMIT=cpu=1G`.
fn plan(extra: &[&str]) -> std::process::Output {
    let mut args = vec!["plan", "--backend", "cpu"];
    args.extend_from_slice(&SMALL);
    args.extend_from_slice(extra);
    output(&args, "warn", &[("TANDEM_MEMORY_LIMIT", "cpu=1G")])
}

#[test]
fn plan_prints_the_memory_it_plans_per_device() -> TestResult {
    let o = plan(&["--json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out)?;
    let mem = v["memory"]
        .as_array()
        .ok_or_else(|| format!("no memory in {out}"))?;
    // Everything on the CPU: one entry, the CPU's.
    assert_eq!(mem.len(), 1, "{mem:?}");
    let cpu = &mem[0];
    assert_eq!(cpu["device_name"], "cpu");
    assert_eq!(cpu["limit_bytes"], 1u64 << 30);
    assert_eq!(cpu["limit_set"], true);
    assert_eq!(cpu["derived_bytes"], 0);
    let bytes = |k: &str| cpu[k].as_u64().ok_or_else(|| format!("no {k} in {cpu}"));
    let (peak, resident) = (bytes("peak_bytes")?, bytes("resident_bytes")?);
    assert!(resident > 0 && peak > 0, "{cpu}");
    // The text prints those bytes, and a line for no other device.
    let o = plan(&[]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let h = tandem::limits::human_bytes;
    let want = format!(
        "memory: cpu weights {} resident, peak working set {} of 1.0 GiB limit",
        h(resident),
        h(peak)
    );
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("memory: ")).collect();
    assert_eq!(lines, [want.as_str()], "{out}");
    // The resident bytes are the layer's weights, each once (all f32 on the CPU).
    let c: tandem::workload::MixtralConfig =
        serde_json::from_value(v["workload"]["config"].clone())?;
    assert_eq!(Some(resident), c.weight_bytes(), "{cpu}");
    Ok(())
}

#[test]
fn plan_in_markdown_has_the_memory_lines_too() {
    let o = plan(&["--format", "markdown"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("memory: cpu weights "), "{out}");
}
