//! `tandem calibrate` on the CPU: measures, stores, shows, and the planner uses it.

mod support;

use support::{TestResult, output, text};

const SIZES: &[&str] = &[
    "--seq-len",
    "16",
    "--d-model",
    "64",
    "--heads",
    "4",
    "--kv-heads",
    "2",
    "--experts",
    "4",
    "--ffn",
    "32",
];

#[test]
fn calibrate_stores_what_it_measured_and_the_planner_uses_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("cal.json");
    let file_s = file.to_string_lossy().into_owned();
    let env = [("TANDEM_CALIBRATION", file_s.as_str())];
    let mut args = vec!["calibrate", "--backend", "cpu", "--iters", "1"];
    args.extend_from_slice(SIZES);
    let o = output(&args, "warn", &env);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("linear"), "{out}");
    assert!(out.contains("cpu        attention"), "{out}");
    assert!(file.exists(), "{out}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file)?)?;
    assert_eq!(v["version"], 1);
    assert!(
        v["devices"]["cpu"]["ops"]["moe_experts"]["scale"]
            .as_f64()
            .is_some_and(|s| s > 0.0)
    );

    let o = output(&["calibrate", "--show"], "warn", &env);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains(&file_s) && out.contains("measured shapes"),
        "{out}"
    );

    // Planning the same layer takes the calibrated shapes.
    let mut args = vec!["plan", "--backend", "cpu"];
    args.extend_from_slice(SIZES);
    let o = output(&args, "warn", &env);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(
        format!("{out}{err}").contains("calibrated shape"),
        "{out}\n{err}"
    );
    Ok(())
}

#[test]
fn calibrate_refuses_a_bad_op_time_limit_and_a_missing_file_is_shown_as_none() -> TestResult {
    let o = output(&["calibrate", "--max-op-seconds", "0"], "warn", &[]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("--max-op-seconds 0 is not accepted"), "{err}");
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("none.json");
    let f = file.to_string_lossy().into_owned();
    let o = output(
        &["calibrate", "--show"],
        "warn",
        &[("TANDEM_CALIBRATION", f.as_str())],
    );
    let (out, _) = text(&o);
    assert!(out.contains("none at"), "{out}");
    Ok(())
}
