//! The `tandem` binary, run as a user would: the default workload, a TOML workload, malformed
//! input, `tandem op` on the reference vectors, and `--save` round trips.

use std::path::{Path, PathBuf};
use std::process::Output;

mod support;

use support::{TestResult, text};

fn tandem(args: &[&str]) -> Output {
    support::output(args, "error", &[])
}

/// `tandem ARGS` with extra environment variables.
fn tandem_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    support::output(args, "error", env)
}

/// Reference vectors, relative to the workspace root's tests/ crate.
fn reference(name: &str) -> PathBuf {
    Path::new("../tests/data/reference").join(name)
}

type Tensors = std::collections::BTreeMap<String, ndarray::ArrayD<f64>>;

/// Runs `tandem ARGS --save TMP` (which must succeed) and returns the saved tensors and the
/// tensors of the reference file `reference`.
fn run_saved(
    args: &[&str],
    reference: &Path,
) -> Result<(Tensors, Tensors), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let save = dir.path().join("out.safetensors");
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--save", save.to_str().ok_or("path")?]);
    let o = tandem(&all);
    assert!(o.status.success(), "{}", text(&o).1);
    Ok((
        tandem::io::read_safetensors_f64(&save)?,
        tandem::io::read_safetensors_f64(reference)?,
    ))
}

#[test]
fn devices_lists_cpu_and_says_why_others_are_missing() {
    let o = tandem(&["devices"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.starts_with("cpu"), "{out}");
    assert!(out.contains("cores:"), "{out}");
    // Every device kind is either listed or explained.
    for kind in ["cuda", "fpga-sim"] {
        assert!(out.contains(kind), "{kind} missing from:\n{out}");
    }
    let o = tandem(&["devices", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("devices --json is JSON");
    assert!(v["devices"].as_array().is_some_and(|d| !d.is_empty()));
}

#[test]
fn devices_says_what_xrt_found() {
    // No XRT (the search pointed at an empty folder): the reason says where it looked.
    let empty = tempfile::tempdir().expect("temp dir");
    let dir = empty.path().to_string_lossy().into_owned();
    let o = tandem_env(&["devices"], &[("TANDEM_XRT_LIB", dir.as_str())]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("fpga "))
        .unwrap_or_default();
    assert!(
        line.contains("XRT not found") && line.contains(&dir),
        "{out}"
    );
    // XRT as installed: the driver and its version, and a board or "no Alveo board".
    let o = tandem(&["devices"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    if out.contains("XRT not found") {
        println!("SKIP: XRT is not installed here");
        return;
    }
    let board = out.lines().any(|l| l.starts_with("fpga:"));
    assert!(
        board || out.contains("driver found: XRT 2.") && out.contains("no Alveo board"),
        "{out}"
    );
}

#[test]
fn run_default_workload_on_cpu() {
    let o = tandem(&[
        "run",
        "--backend",
        "cpu",
        "--seq-len",
        "24",
        "--d-model",
        "128",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    for node in [
        "attention",
        "router",
        "experts",
        "q_proj",
        "post_attention_norm",
    ] {
        assert!(out.contains(node), "{node} missing:\n{out}");
    }
    let line = out
        .lines()
        .find(|l| l.starts_with("layer output vs f64 reference"))
        .expect("error line");
    let e: f64 = line
        .rsplit(' ')
        .next()
        .and_then(|s| s.parse().ok())
        .expect("number");
    assert!(e < 1e-5, "{line}");
}

#[test]
fn run_json_has_every_node() {
    let o = tandem(&[
        "run",
        "--json",
        "--seq-len",
        "8",
        "--d-model",
        "64",
        "--ffn",
        "32",
    ]);
    assert!(o.status.success(), "{}", text(&o).1);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("run --json is JSON");
    let nodes = v["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 17);
    assert!(v["output_rel_error"].as_f64().is_some_and(|e| e < 1e-5));
    assert!(nodes.iter().all(|n| n["kernel"].as_str().is_some()));
    // The warm-up run made the weights resident wherever they went: the timed run moved none.
    assert!(v["weights_uploaded_bytes"].as_u64().is_some());
    assert!(v["weights_resident_bytes"].as_u64().is_some());
    assert!(nodes.iter().all(|n| n["transfer_bytes"].as_u64().is_some()));
    assert!(
        nodes
            .iter()
            .all(|n| n["resident_bytes"].as_u64() == Some(0))
    );
}

#[test]
fn run_toml_workload() {
    let o = tandem(&["run", "../tests/data/workloads/small.toml"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("small mixtral layer: B=2 T=19 d_model=64"),
        "{out}"
    );
}

#[test]
fn malformed_toml_is_one_clear_error() -> TestResult {
    let dir = tempfile::tempdir()?;
    let p = dir.path().join("bad.toml");
    std::fs::write(&p, "[mixtral]\nheads = 5\n")?;
    let o = tandem(&["run", p.to_str().ok_or("path")?]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(err.starts_with("tandem: "), "{err}");
    assert!(err.contains("heads = 5"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    std::fs::write(&p, "[mixtral\nseq_len = 4")?;
    let o = tandem(&["run", p.to_str().ok_or("path")?]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("bad.toml"));
    let o = tandem(&["run", "/nonexistent/w.toml"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("cannot read"));
    Ok(())
}

/// Asserts that `tandem ARGS` is a usage error (exit 2) about `value` that lists `accepted`.
fn assert_usage_error(args: &[&str], value: &str, accepted: &str) {
    let o = tandem(args);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(
        err.contains(&format!("invalid value '{value}'")),
        "{args:?}: {err}"
    );
    assert!(
        err.contains(&format!("[possible values: {accepted}]")),
        "{args:?}: {err}"
    );
}

#[test]
fn bad_flags_are_usage_errors() {
    let kinds = "cpu, cuda, fpga-sim, fpga";
    let planned = format!("auto, {kinds}");
    // (compare runs every device kind: it takes no --backend, tests/reports.rs)
    for cmd in ["run", "plan"] {
        assert_usage_error(&[cmd, "--backend", "tpu"], "tpu", &planned);
    }
    assert_usage_error(
        &[
            "op",
            "rope",
            "--inputs",
            "x.safetensors",
            "--backend",
            "tpu",
        ],
        "tpu",
        &planned,
    );
    assert_usage_error(&["bench", "rope", "--backend", "auto"], "auto", kinds);
    let ops = "attention, attention-decode, moe-route, moe-experts, linear, rmsnorm, rope";
    // `tandem bench` also measures copies (`transfer`) and the MoE block (`moe-block`).
    let targets = format!("{ops}, transfer, moe-block");
    assert_usage_error(&["bench", "matmul"], "matmul", &targets);
    assert_usage_error(&["bench", "add"], "add", &targets);
    assert_usage_error(
        &["op", "softmax", "--inputs", "x.safetensors"],
        "softmax",
        ops,
    );
    assert_usage_error(&["run", "--cuda-dtype", "f8"], "f8", "bf16, f16");
    assert_usage_error(
        &["bench", "rope", "--cuda-dtype", "fp16"],
        "fp16",
        "bf16, f16",
    );
    assert_usage_error(&["run", "--dtype", "i8"], "i8", "f32, f16, bf16");
    let o = tandem(&["run", "--seq-len", "many"]);
    assert_eq!(o.status.code(), Some(2));
    // Checkable only once the layer is put together: a run error, exit 1.
    let o = tandem(&["run", "--top-k", "9"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("top_k = 9"));
}

#[test]
fn backend_aliases_and_dtype_case_are_accepted() {
    let small = ["--seq-len", "8", "--d-model", "64", "--ffn", "32"];
    let mut args = vec!["plan", "--backend", "gpu", "--fallback", "--dtype", "BF16"];
    args.extend(small);
    let o = tandem(&args);
    assert!(o.status.success(), "{}", text(&o).1);
}

#[test]
fn missing_device_falls_back_to_cpu_with_a_warning_under_fallback() {
    // CI has no GPU; where one exists this still passes (it then runs there). Without
    // --fallback a missing device is an error: tests/placement.rs.
    let o = tandem(&[
        "run",
        "--backend",
        "cuda",
        "--fallback",
        "--seq-len",
        "8",
        "--d-model",
        "64",
        "--ffn",
        "32",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    if out.contains("cuda is unavailable") {
        assert!(out.contains("running on the CPU"), "{out}");
        assert!(!out.contains("cuda:0"), "{out}");
    } else {
        // A CUDA device is present: the layer ran there.
        assert!(out.contains("cuda:0"), "{out}");
    }
}

#[test]
fn op_attention_matches_reference_file_and_saves() -> TestResult {
    let input = reference("attention_2.safetensors");
    let path = input.to_str().ok_or("path")?;
    let (got, want) = run_saved(
        &[
            "op",
            "attention",
            "--inputs",
            path,
            "--causal",
            "--backend",
            "cpu",
        ],
        &input,
    )?;
    for k in ["o", "lse"] {
        let e = tandem::tensor::rel_error(&got[k], &want[k]);
        assert!(e < 1e-5, "{k}: {e:.3e}");
    }
    Ok(())
}

#[test]
fn op_moe_route_ids_exact() -> TestResult {
    let input = reference("moe_route_1.safetensors");
    let path = input.to_str().ok_or("path")?;
    let (got, want) = run_saved(
        &[
            "op",
            "moe-route",
            "--inputs",
            path,
            "--top-k",
            "4",
            "--renormalize",
            "--backend",
            "cpu",
        ],
        &input,
    )?;
    assert_eq!(got["topk_ids"], want["topk_ids"]);
    assert_eq!(got["expert_counts"], want["expert_counts"]);
    let e = tandem::tensor::rel_error(&got["topk_weights"], &want["topk_weights_renorm"]);
    assert!(e < 1e-5, "{e:.3e}");
    for k in ["aux_loss", "z_loss"] {
        assert!(tandem::tensor::rel_error(&got[k], &want[k]) < 1e-5, "{k}");
    }
    Ok(())
}

#[test]
fn op_with_missing_tensor_names_what_is_needed() {
    let input = reference("moe_route_0.safetensors");
    let o = tandem(&[
        "op",
        "attention",
        "--inputs",
        input.to_str().unwrap_or_default(),
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains("no tensor named 'q'") && err.contains("logits"),
        "{err}"
    );
}

#[test]
fn run_with_reference_weights_saves_transformers_output() -> TestResult {
    let w = reference("mixtral_layer_0.safetensors");
    let path = w.to_str().ok_or("path")?;
    let (got, want) = run_saved(
        &["run", "--weights", path, "--heads", "4", "--backend", "cpu"],
        &w,
    )?;
    let e = tandem::tensor::rel_error(&got["output"], &want["output"]);
    assert!(e < 1e-5, "{e:.3e}");
    // A file that is not a Mixtral layer gets an error naming what is missing.
    let o = tandem(&[
        "run",
        "--weights",
        reference("moe_route_0.safetensors").to_str().ok_or("p")?,
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("q_proj"));
    Ok(())
}

#[test]
fn config_json_beside_the_weights_gives_the_heads_and_flags_win() -> TestResult {
    let dir = tempfile::tempdir()?;
    let w = dir.path().join("layer.safetensors");
    std::fs::copy(reference("mixtral_layer_0.safetensors"), &w)?;
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        r#"{"num_attention_heads": 4, "rms_norm_eps": 1e-5}"#,
    )?;
    let path = w.to_str().ok_or("path")?;
    let (got, want) = run_saved(&["run", "--weights", path, "--backend", "cpu"], &w)?;
    let e = tandem::tensor::rel_error(&got["output"], &want["output"]);
    assert!(e < 1e-5, "{e:.3e}");
    // A flag wins over the file.
    std::fs::write(&config, r#"{"num_attention_heads": 3}"#)?;
    run_saved(
        &["run", "--weights", path, "--heads", "4", "--backend", "cpu"],
        &w,
    )?;
    // A bad value is a run error naming the file and the key.
    std::fs::write(&config, r#"{"num_attention_heads": "four"}"#)?;
    let o = tandem(&["run", "--weights", path, "--backend", "cpu"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "{}: num_attention_heads = \"four\" is not accepted",
            config.display()
        )),
        "{err}"
    );
    Ok(())
}

#[test]
fn trace_has_a_slice_per_node() -> TestResult {
    let dir = tempfile::tempdir()?;
    let trace = dir.path().join("t.json");
    let o = tandem(&[
        "run",
        "--seq-len",
        "8",
        "--d-model",
        "64",
        "--ffn",
        "32",
        "--trace",
        trace.to_str().ok_or("path")?,
    ]);
    assert!(o.status.success(), "{}", text(&o).1);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace)?)?;
    let slices = v["traceEvents"]
        .as_array()
        .ok_or("no traceEvents")?
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] != "transfer" && e["cat"] != "device time")
        .count();
    assert_eq!(slices, 17);
    Ok(())
}

#[test]
fn compare_runs_every_device_kind_found() {
    let o = tandem(&[
        "compare",
        "--seq-len",
        "8",
        "--d-model",
        "64",
        "--ffn",
        "32",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("cpu ms") && out.contains("cpu rel.err"),
        "{out}"
    );
    assert_eq!(
        out.lines().filter(|l| l.starts_with("attention ")).count(),
        1
    );
    let o = tandem(&[
        "compare",
        "--json",
        "--seq-len",
        "8",
        "--d-model",
        "64",
        "--ffn",
        "32",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("compare --json is JSON");
    assert!(v["runs"].as_array().is_some_and(|r| !r.is_empty()));
}

#[test]
fn cuda_dtype_flag_is_checked_and_used() {
    // Not a storage precision: a usage error listing the accepted values.
    for cmd in [
        vec![
            "bench",
            "rmsnorm",
            "--backend",
            "cuda",
            "--cuda-dtype",
            "f8",
        ],
        vec!["run", "--cuda-dtype", "fp16"],
    ] {
        let o = tandem(&cmd);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{cmd:?}: {err}");
        assert!(err.contains("--cuda-dtype"), "{err}");
        assert!(err.contains("bf16") && err.contains("f16"), "{err}");
    }
    // f16 is accepted. Without a GPU, bench says the device is missing; with one, it times
    // the f16 kernel and counts bytes at f16.
    let o = tandem(&[
        "bench",
        "rmsnorm",
        "--backend",
        "cuda",
        "--cuda-dtype",
        "f16",
        "--rows",
        "64",
        "--cols",
        "256",
        "--iters",
        "3",
        "--warmup",
        "1",
    ]);
    let (out, err) = text(&o);
    assert!(!err.contains("panicked"), "{err}");
    if o.status.success() {
        assert!(out.contains("kernel rmsnorm_f16"), "{out}");
        assert!(out.contains("f16 storage"), "{out}");
    } else {
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains("backend cuda is unavailable"), "{err}");
    }
    // run, compare and op take the flag too (here on the CPU).
    let small = ["--seq-len", "8", "--d-model", "64", "--ffn", "32"];
    for cmd in ["run", "compare"] {
        let mut args = vec![cmd, "--cuda-dtype", "f16"];
        if cmd == "run" {
            args.extend(["--backend", "cpu"]);
        }
        args.extend(small);
        let o = tandem(&args);
        assert!(o.status.success(), "{cmd}: {}", text(&o).1);
    }
    let input = reference("moe_route_1.safetensors");
    let o = tandem(&[
        "op",
        "moe-route",
        "--inputs",
        input.to_str().unwrap_or_default(),
        "--top-k",
        "4",
        "--backend",
        "cpu",
        "--cuda-dtype",
        "bf16",
    ]);
    assert!(o.status.success(), "{}", text(&o).1);
}

#[test]
fn cuda_dtype_environment_is_checked_and_the_flag_wins() {
    let o = tandem_env(&["devices"], &[("TANDEM_CUDA_DTYPE", "f8")]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "TANDEM_CUDA_DTYPE: 'f8' is not a CUDA storage precision (accepted: bf16, f16)"
        ),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    let o = tandem_env(
        &["devices", "--cuda-dtype", "f16"],
        &[("TANDEM_CUDA_DTYPE", "f8")],
    );
    assert!(o.status.success(), "{}", text(&o).1);
    // Where a GPU is present, `devices` shows the storage in use.
    let o = tandem_env(&["devices"], &[("TANDEM_CUDA_DTYPE", "f16")]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    if out.contains("cuda:0") {
        assert!(out.contains("storage: f16 (f32 accumulate)"), "{out}");
    } else {
        // No GPU here: the missing device is listed with its reason.
        assert!(
            out.lines()
                .any(|l| l.starts_with("cuda ") && l.contains(" unavailable: ")),
            "{out}"
        );
    }
}

#[test]
fn the_modelled_card_runs_without_verilator() {
    // No simulator on PATH and no prebuilt models: the RTL card is unavailable with its
    // reason, but `--fpga-sim-mode model` needs no simulator and runs every op.
    let empty = tempfile::tempdir().expect("temp dir");
    let dir = empty.path().to_string_lossy().into_owned();
    let env = [
        ("PATH", dir.as_str()),
        ("TANDEM_SIM_CACHE_DIR", dir.as_str()),
    ];
    let o = tandem_env(&["run", "--backend", "fpga-sim", "--no-check"], &env);
    let (_, err) = text(&o);
    assert!(!o.status.success(), "ran without a simulator:\n{err}");
    assert!(err.contains("verilator not found"), "{err}");
    let mut env = env.to_vec();
    env.push(("TANDEM_FPGA_SIM_MODE", "model"));
    let o = tandem_env(&["run", "--backend", "fpga-sim", "--no-check"], &env);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("Alveo (modelled)"), "{out}");
    assert!(out.contains("(modelled)"), "{out}");
    // every row of the op table ran on the card
    let rows: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("----"))
        .skip(1)
        .take_while(|l| !l.starts_with("total:"))
        .collect();
    assert!(rows.len() >= 10, "{out}");
    for r in rows {
        assert!(r.contains("fpga-sim:0"), "an op ran elsewhere: {r}\n{out}");
    }
}
