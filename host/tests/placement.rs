//! Placement you can see and control (issue 13), through the binary as a user runs it and
//! through the library where a run would take minutes: a requested backend that is missing
//! is an error unless `--fallback`; `--strict` refuses ops the backend lacks; auto placement
//! keeps lossy backends off unless allowed; the op-time history is shown, reset, counted in
//! the report and ignored under `--fresh`; weights need their head count and, in a file of
//! several layers, the layer.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tandem::DeviceRegistry;
use tandem::backend::{DeviceId, DeviceKind};
use tandem::plan::{self, BackendChoice, History, PlacementPolicy};
use tandem::tensor::TensorMeta;

mod support;

use support::{TestResult, text};

fn tandem_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    support::output(args, "error", env)
}

fn tandem(args: &[&str]) -> Output {
    tandem_env(args, &[])
}

/// `tandem ARGS` with the history on, kept in `cache` (as `$XDG_CACHE_HOME`).
fn tandem_cached(args: &[&str], cache: &Path) -> Output {
    Command::new(support::bin())
        .args(args)
        .env("TANDEM_LOG", "error")
        .env_remove("TANDEM_HISTORY")
        .env("XDG_CACHE_HOME", cache)
        .output()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", support::bin().display()))
}

fn reference(name: &str) -> PathBuf {
    Path::new("../tests/data/reference").join(name)
}

/// A small layer, quick on the CPU.
const SMALL: [&str; 6] = ["--seq-len", "8", "--d-model", "64", "--ffn", "32"];

fn with<'a>(args: &[&'a str], more: &[&'a str]) -> Vec<&'a str> {
    args.iter().chain(more).copied().collect()
}

/// Whether Verilator is found here (the simulated card then exists).
fn has_fpga_sim() -> bool {
    DeviceRegistry::discover()
        .backends()
        .iter()
        .any(|b| b.id().kind == DeviceKind::FpgaSim)
}

#[test]
fn a_missing_backend_is_an_error_in_every_subcommand_unless_fallback() -> TestResult {
    // Without Verilator on PATH (and no prebuilt models in the build cache) the simulated card
    // is missing, as on a machine without it.
    let empty = tempfile::tempdir()?;
    let empty_dir = empty.path().to_str().ok_or("path")?;
    let no_verilator = [("PATH", empty_dir), ("TANDEM_SIM_CACHE_DIR", empty_dir)];
    let attention = reference("attention_0.safetensors");
    let attention = attention.to_str().ok_or("path")?;
    let commands: Vec<Vec<&str>> = vec![
        with(&["run", "--backend", "fpga-sim"], &SMALL),
        with(&["plan", "--backend", "fpga-sim"], &SMALL),
        vec![
            "op",
            "attention",
            "--backend",
            "fpga-sim",
            "--inputs",
            attention,
        ],
        vec![
            "bench",
            "rmsnorm",
            "--backend",
            "fpga-sim",
            "--rows",
            "8",
            "--cols",
            "64",
            "--iters",
            "2",
            "--warmup",
            "0",
        ],
    ];
    for args in &commands {
        let o = tandem_env(args, &no_verilator);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {out}{err}");
        assert!(
            err.contains("--backend fpga-sim is unavailable: ") && err.contains("verilator"),
            "{args:?}: the reason, as `tandem devices` gives it: {err}"
        );
        assert!(
            err.contains("fix: ") && err.contains("--fallback"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        // --fallback lets the CPU stand in.
        let o = tandem_env(&with(args, &["--fallback"]), &no_verilator);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{args:?} --fallback: {err}");
        assert!(!out.contains("fpga-sim:0"), "{args:?}: {out}");
        if args[0] == "run" || args[0] == "plan" {
            assert!(
                out.contains("fpga-sim is unavailable") && out.contains("running on the CPU"),
                "{args:?}: {out}"
            );
        }
    }
    // `tandem fpga sim` needs the simulator itself: an error naming it, with the fix.
    let o = tandem_env(&["fpga", "sim", "--kernel", "router"], &no_verilator);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("verilator not found") && err.contains("install"),
        "{err}"
    );
    // The same for CUDA where there is no GPU (CI).
    let o = tandem(&with(&["run", "--backend", "cuda"], &SMALL));
    let (out, err) = text(&o);
    if out.contains("cuda:0") {
        println!("SKIP: a CUDA device is present; the missing-GPU error cannot be shown here");
    } else {
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains("--backend cuda is unavailable: "), "{err}");
    }
    Ok(())
}

#[test]
fn flags_that_do_nothing_with_the_backend_are_refused() {
    for (args, flag) in [
        (with(&["plan", "--fallback"], &SMALL), "--fallback applies"),
        (with(&["plan", "--strict"], &SMALL), "--strict applies"),
        (
            with(&["run", "--backend", "cpu", "--allow-lossy"], &SMALL),
            "--allow-lossy applies",
        ),
        (
            with(&["plan", "--backend", "cpu", "--max-error", "1e-2"], &SMALL),
            "--max-error applies",
        ),
    ] {
        let o = tandem(&args);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
    }
    // compare runs every device kind on every op it has: placement flags are not its own.
    let o = tandem(&with(&["compare", "--allow-lossy"], &SMALL));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o).1);
    let o = tandem(&with(&["plan", "--max-error", "0"], &SMALL));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o).1);
    assert!(text(&o).1.contains("a relative error > 0"));
}

#[test]
fn strict_refuses_the_ops_a_present_backend_lacks() {
    if !has_fpga_sim() {
        println!("SKIP: Verilator not found: no simulated card to be strict about");
        return;
    }
    // The default layer runs whole on the card now; a model folder's embedding lookup has no
    // FPGA kernel. Without --strict it goes to the CPU, with a warning.
    const MODEL: [&str; 2] = ["--weights", "../tests/data/models/mixtral-tiny"];
    let o = tandem(&with(&["plan", "--backend", "fpga-sim"], &MODEL));
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("no kernel for embedding") && out.contains("--strict makes this an error"),
        "{out}"
    );
    // With it, planning fails before anything runs, naming the ops.
    for cmd in ["plan", "run"] {
        let o = tandem(&with(&[cmd, "--backend", "fpga-sim", "--strict"], &MODEL));
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{cmd}: {err}");
        assert!(
            err.contains("embedding") && err.contains("is not supported on fpga-sim"),
            "{cmd}: {err}"
        );
        assert!(err.contains("--strict"), "{cmd}: {err}");
    }
    // The default layer has a kernel for every op: --strict plans it whole on the card.
    let o = tandem(&with(
        &["plan", "--backend", "fpga-sim", "--strict"],
        &SMALL,
    ));
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(!out.contains("-> cpu"), "{out}");
}

/// The metas of a node's inputs.
fn input_metas(g: &tandem::graph::Graph, node: usize) -> tandem::Result<Vec<TensorMeta>> {
    let metas = g.validate()?;
    Ok(g.nodes[node]
        .inputs
        .iter()
        .map(|i| metas[i].clone())
        .collect())
}

#[test]
fn auto_placement_puts_ops_on_the_int8_card_only_when_allowed() -> TestResult {
    let reg = DeviceRegistry::discover();
    let Some(card) = reg.of_kind(DeviceKind::FpgaSim).first().map(|b| b.id()) else {
        println!(
            "SKIP: Verilator not found: no simulated card (the planner's unit tests cover a fake lossy device)"
        );
        return Ok(());
    };
    assert!(reg.get(card).is_some_and(|b| b.numerics().is_lossy()));
    let c = tandem::workload::MixtralConfig {
        seq_len: 16,
        d_model: 64,
        heads: 4,
        kv_heads: 2,
        ffn: 32,
        ..Default::default()
    };
    let g = tandem::workload::mixtral_layer(&c, None, None)?;
    let att = g
        .nodes
        .iter()
        .position(|n| n.op.name() == "attention")
        .ok_or("no attention node")?;
    // A history in which the card ran attention far faster than the CPU, measured at 1.4e-2
    // (the int8 kernel's error on this layer, docs/FPGA.md).
    let ins = input_metas(&g, att)?;
    let mut h = History::in_memory();
    let op = &g.nodes[att].op;
    let micros = std::time::Duration::from_micros;
    h.record_sample(card, op, &ins, micros(1), false, Some(1.4e-2));
    h.record_sample(DeviceId::CPU, op, &ins, micros(5000), false, Some(1e-7));
    let on = |policy: PlacementPolicy| -> tandem::Result<String> {
        let p = plan::plan_with(&g, &reg, BackendChoice::Auto, Some(&h), &policy)?;
        Ok(p.placements[att].device.to_string())
    };
    let base = PlacementPolicy::default();
    assert_eq!(on(base)?, "cpu", "lossy by default: never");
    assert_eq!(
        on(PlacementPolicy {
            allow_lossy: true,
            ..base
        })?,
        card.to_string()
    );
    // A tolerance is checked against the measured 1.4e-2.
    for (max, want) in [(1e-2, "cpu".to_string()), (2e-2, card.to_string())] {
        let policy = PlacementPolicy {
            max_error: Some(max),
            ..base
        };
        assert_eq!(on(policy)?, want, "--max-error {max}");
    }
    Ok(())
}

#[test]
fn op_with_backend_auto_keeps_int8_off_by_default() -> TestResult {
    // The case: `tandem op attention` with backend auto returned int8 results
    // without a word once the history favoured the card. Seed such a history and look.
    let input = reference("attention_0.safetensors");
    let cache = tempfile::tempdir()?;
    if has_fpga_sim() {
        let t = tandem::io::read_safetensors(&input)?;
        let ins: Vec<TensorMeta> = ["q", "k", "v"]
            .iter()
            .map(|n| t.get(*n).map(|x| x.cast(tandem::DType::F32).meta()))
            .collect::<Option<_>>()
            .ok_or("q, k, v")?;
        let op = tandem::ops::Op::Attention(tandem::ops::AttentionParams {
            causal: false,
            scale: None,
        });
        let card = DeviceId {
            kind: DeviceKind::FpgaSim,
            index: 0,
        };
        let mut h = History::open(cache.path().join("tandem").join("history.json"));
        h.record(card, &op, &ins, std::time::Duration::from_nanos(1));
        h.save()?;
    } else {
        println!("SKIP (part): Verilator not found: the op runs on the CPU either way");
    }
    let o = tandem_cached(
        &[
            "op",
            "attention",
            "--inputs",
            input.to_str().ok_or("p")?,
            "--json",
        ],
        cache.path(),
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out)?;
    let node = &v["nodes"][0];
    assert_eq!(node["device"]["kind"], "cpu", "{out}");
    assert_eq!(node["lossy"], false, "{out}");
    assert_eq!(node["numerics"], "f32", "{out}");
    Ok(())
}

#[test]
fn history_is_shown_counted_ignored_under_fresh_and_reset() -> TestResult {
    let cache = tempfile::tempdir()?;
    let file = cache.path().join("tandem").join("history.json");
    let o = tandem_cached(&["history", "show"], cache.path());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains(&format!("file: {}", file.display())) && out.contains("0 entries"),
        "{out}"
    );
    // A first run learns; its report says nothing came from the history yet.
    let run = with(&["run", "--backend", "cpu"], &SMALL);
    let o = tandem_cached(&run, cache.path());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("placement: cpu as requested; 0 of 17 estimates from the op-time history"),
        "{out}"
    );
    let o = tandem_cached(&["history", "show", "--json"], cache.path());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out)?;
    assert_eq!(v["file"], file.to_str().ok_or("path")?);
    let entries = v["entries"].as_array().ok_or("entries")?;
    assert!(!entries.is_empty(), "{out}");
    for e in entries {
        assert_eq!(e["device"], "cpu", "{e}");
        assert!(e["n"].as_u64().is_some_and(|n| n >= 1), "{e}");
        assert!(e["mean_s"].as_f64().is_some_and(|s| s > 0.0), "{e}");
        // The run checked against the reference: its errors are recorded.
        assert!(e["max_rel_error"].as_f64().is_some_and(|x| x < 1e-5), "{e}");
        assert_eq!(e["contended"], false, "{e}");
    }
    // The next plan takes every estimate from it, and says so; --fresh ignores it.
    let o = tandem_cached(&with(&["plan"], &SMALL), cache.path());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("17 of 17 estimates from the op-time history"),
        "{out}"
    );
    let o = tandem_cached(&with(&["plan", "--fresh"], &SMALL), cache.path());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("op-time history ignored (--fresh)"), "{out}");
    assert!(!out.contains("hist n="), "{out}");
    // Reset forgets it all.
    let o = tandem_cached(&["history", "reset"], cache.path());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains(&format!("{} entries removed", entries.len())),
        "{out}"
    );
    assert!(!file.exists());
    let o = tandem_cached(&["history", "show"], cache.path());
    assert!(text(&o).0.contains("0 entries"));
    Ok(())
}

#[test]
fn explain_shows_estimates_and_then_predicted_against_measured() {
    let o = tandem(&with(&["run", "--backend", "cpu", "--explain"], &SMALL));
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    // Before the run: per op its estimate and where it came from.
    assert!(
        err.contains("est. op ms") && err.contains("cpu: op ") && err.contains("(model)"),
        "{err}"
    );
    // After it: one line per node, predicted and measured.
    assert!(
        err.contains("predicted ms") && err.contains("measured ms"),
        "{err}"
    );
    let after = err.split("predicted ms").nth(1).unwrap_or_default();
    assert_eq!(
        after.lines().filter(|l| l.contains(" cpu ")).count(),
        17,
        "{err}"
    );
    assert!(out.contains("placement: cpu as requested"), "{out}");
}

#[test]
fn weights_without_config_json_need_the_head_count() -> TestResult {
    let w = reference("mixtral_layer_0.safetensors");
    let path = w.to_str().ok_or("path")?;
    let o = tandem(&["run", "--weights", path, "--backend", "cpu"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("head count is not known")
            && err.contains("config.json")
            && err.contains("--heads"),
        "{err}"
    );
    // --kv-heads is checked against the weights (this layer has 2).
    let o = tandem(&[
        "run",
        "--weights",
        path,
        "--heads",
        "4",
        "--kv-heads",
        "4",
        "--backend",
        "cpu",
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--kv-heads 4 does not match the weights"),
        "{err}"
    );
    // With them, the header names the weights file, not a seed.
    let o = tandem(&[
        "run",
        "--weights",
        path,
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--backend",
        "cpu",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let header = out.lines().next().unwrap_or_default();
    assert!(
        header.contains(&format!("Mixtral decoder layer, weights {path} (layer.*)")),
        "{header}"
    );
    assert!(
        !header.contains("seed=") && !header.contains("built-in"),
        "{header}"
    );
    Ok(())
}

#[test]
fn a_file_of_two_layers_needs_layer() -> TestResult {
    let dir = tempfile::tempdir()?;
    let one = tandem::io::read_safetensors(reference("mixtral_layer_0.safetensors"))?;
    let mut two = std::collections::BTreeMap::new();
    for (k, t) in &one {
        match k.strip_prefix("layer.") {
            Some(rest) => {
                two.insert(format!("model.layers.0.{rest}"), t.clone());
                two.insert(format!("model.layers.1.{rest}"), t.clone());
            }
            None => {
                two.insert(k.clone(), t.clone());
            }
        }
    }
    let file = dir.path().join("two.safetensors");
    tandem::io::write_safetensors(&file, &two)?;
    let path = file.to_str().ok_or("path")?;
    let o = tandem(&["run", "--weights", path, "--heads", "4", "--backend", "cpu"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "holds 2 layers: 0 (model.layers.0.*), 1 (model.layers.1.*); pick one with --layer N"
        ),
        "{err}"
    );
    let o = tandem(&[
        "run",
        "--weights",
        path,
        "--heads",
        "4",
        "--layer",
        "1",
        "--backend",
        "cpu",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("(model.layers.1.*)"), "{out}");
    let o = tandem(&[
        "run",
        "--weights",
        path,
        "--heads",
        "4",
        "--layer",
        "7",
        "--backend",
        "cpu",
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("has no layer 7"), "{err}");
    // --layer means nothing without --weights: a usage error.
    let o = tandem(&["run", "--layer", "1"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o).1);
    Ok(())
}
