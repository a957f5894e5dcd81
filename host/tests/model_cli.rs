//! Model folders through the binary: `tandem model make-test` and `show`, `tandem run
//! --weights DIR` from token ids to logits with the f64 check on, `--layers N` on the built-in
//! layer and on a folder, a TOML `layers`, and the errors of a bad folder or layer count.

use std::process::Output;

mod support;

use support::{TestResult, text};

/// The model committed for a fresh clone, relative to this crate.
const TINY: &str = "../tests/data/models/mixtral-tiny";

fn tandem(args: &[&str]) -> Output {
    support::output(args, "error", &[])
}

/// `tandem ARGS`, which must succeed: its stdout.
fn ok(args: &[&str]) -> String {
    let o = tandem(args);
    let (out, err) = text(&o);
    assert!(o.status.success(), "tandem {args:?} failed:\n{err}\n{out}");
    out
}

/// `tandem ARGS`, which must fail with exit code 1: its stderr.
fn fails(args: &[&str]) -> String {
    let o = tandem(args);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "tandem {args:?}:\n{err}\n{out}");
    err
}

/// The JSON report of `tandem run ARGS --json`: its nodes' names and its output error.
fn run_json(args: &[&str]) -> Result<(Vec<String>, f64), Box<dyn std::error::Error>> {
    let mut all = vec!["run", "--backend", "cpu", "--json", "--warmup", "0"];
    all.extend_from_slice(args);
    let v: serde_json::Value = serde_json::from_str(&ok(&all))?;
    let nodes = v["nodes"]
        .as_array()
        .ok_or("no nodes")?
        .iter()
        .filter_map(|n| n["run"]["node"].as_str().or(n["node"].as_str()))
        .map(str::to_string)
        .collect();
    let e = v["output_rel_error"]
        .as_f64()
        .ok_or("no output_rel_error")?;
    Ok((nodes, e))
}

#[test]
fn the_committed_model_runs_from_ids_to_logits_with_the_check_on() -> TestResult {
    let (nodes, e) = run_json(&["--weights", TINY, "--seq-len", "8"])?;
    assert!(e < 1e-5, "logits vs the f64 chain: {e:.3e}");
    let out = ok(&[
        "run",
        "--backend",
        "cpu",
        "--weights",
        TINY,
        "--seq-len",
        "8",
    ]);
    for want in [
        "embed_tokens",
        "layers.2.experts",
        "final_norm",
        "lm_head",
        "layers 3 of 3",
    ] {
        assert!(out.contains(want), "'{want}' not in:\n{out}");
    }
    assert_eq!(nodes.len(), 3 * 17 + 3, "{nodes:?}");
    // The first two layers only.
    let out = ok(&[
        "run",
        "--backend",
        "cpu",
        "--weights",
        TINY,
        "--layers",
        "2",
        "--seq-len",
        "4",
    ]);
    assert!(
        out.contains("layers 2 of 3") && !out.contains("layers.2."),
        "{out}"
    );
    Ok(())
}

#[test]
fn layers_chain_the_built_in_layer_from_the_flag_or_the_workload_file() -> TestResult {
    let sizes = [
        "--seq-len",
        "8",
        "--d-model",
        "32",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--ffn",
        "32",
        "--experts",
        "4",
    ];
    let mut args = vec!["run", "--backend", "cpu", "--layers", "3"];
    args.extend(sizes);
    let out = ok(&args);
    assert!(
        out.contains("3 layers") && out.contains("layers.2.out"),
        "{out}"
    );
    let dir = tempfile::tempdir()?;
    let toml = dir.path().join("w.toml");
    std::fs::write(
        &toml,
        "layers = 2\n[mixtral]\nseq_len = 8\nd_model = 32\nheads = 4\nkv_heads = 2\nffn = 32\nexperts = 4\n",
    )?;
    let out = ok(&["run", "--backend", "cpu", toml.to_str().ok_or("path")?]);
    assert!(
        out.contains("2 layers") && out.contains("layers.1.out"),
        "{out}"
    );
    std::fs::write(&toml, "layers = 0\n")?;
    let err = fails(&["run", toml.to_str().ok_or("path")?]);
    assert!(
        err.contains("w.toml") && err.contains("layers = 0"),
        "{err}"
    );
    let err = fails(&["run", "--layers", "0"]);
    assert!(err.contains("--layers 0"), "{err}");
    Ok(())
}

#[test]
fn make_test_writes_a_folder_that_show_and_run_read() -> TestResult {
    let dir = tempfile::tempdir()?;
    let m = dir.path().join("m");
    let m = m.to_str().ok_or("path")?;
    let out = ok(&[
        "model",
        "make-test",
        "--out",
        m,
        "--layers",
        "2",
        "--shards",
        "2",
        "--vocab",
        "64",
    ]);
    assert!(out.contains("model.safetensors.index.json"), "{out}");
    let out = ok(&["model", "show", m]);
    assert!(
        out.contains("layers=2") && out.contains("vocab_size=64"),
        "{out}"
    );
    // An existing model is not overwritten by accident.
    let err = fails(&["model", "make-test", "--out", m]);
    assert!(err.contains("--force"), "{err}");
    ok(&[
        "model",
        "make-test",
        "--out",
        m,
        "--layers",
        "1",
        "--shards",
        "1",
        "--force",
    ])
    .contains("model.safetensors");
    assert!(
        !std::path::Path::new(m)
            .join("model.safetensors.index.json")
            .exists()
    );
    let (_, e) = run_json(&["--weights", m, "--seq-len", "5"])?;
    assert!(e < 1e-5, "{e:.3e}");
    let err = fails(&[
        "model",
        "make-test",
        "--out",
        m,
        "--layers",
        "2",
        "--shards",
        "3",
        "--force",
    ]);
    assert!(err.contains("shards = 3"), "{err}");
    Ok(())
}

#[test]
fn bad_layer_counts_and_flags_are_named() {
    let err = fails(&["run", "--weights", TINY, "--layers", "4"]);
    assert!(
        err.contains("--layers 4")
            && err.contains("num_hidden_layers = 3")
            && err.contains("config.json"),
        "{err}"
    );
    let err = fails(&["run", "--weights", TINY, "--d-model", "64"]);
    assert!(
        err.contains("--d-model 64") && err.contains("hidden_size = 32"),
        "{err}"
    );
    let err = fails(&["run", "--weights", TINY, "--layer", "1"]);
    assert!(err.contains("--layers N"), "{err}");
    let err = fails(&["model", "show", "../tests/data/reference"]);
    assert!(err.contains("config.json"), "{err}");
}
