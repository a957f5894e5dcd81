//! Bounded work, honest results and timeouts that fire, through the `tandem` binary as a user
//! meets them: sizes past what the machine has (flags, TOML, tiny files that ask for huge
//! work), NaN and infinities in inputs and in results, and `--timeout` on the CPU and on the
//! simulated card.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ndarray::{ArrayD, IxDyn};
use tandem::Tensor;

mod support;

use support::TestResult;

fn tandem_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    support::output(args, "warn", env)
}

fn tandem(args: &[&str]) -> Output {
    tandem_env(args, &[])
}

/// Asserts a clean failure: exit status 1 (not a signal, not a panic) and a `tandem:` line
/// holding every one of `needles`.
fn assert_refused(o: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(1),
        "status {:?}, stderr:\n{err}",
        o.status
    );
    assert!(!err.contains("panicked"), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("tandem:"))
        .unwrap_or_else(|| panic!("no `tandem:` line in:\n{err}"));
    for n in needles {
        assert!(line.contains(n), "`{n}` missing from: {line}");
    }
}

fn f32s(shape: &[usize], f: impl Fn(usize) -> f32) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(f).collect();
    Tensor::from_f32(ArrayD::from_shape_vec(IxDyn(shape), v).expect("shape matches"))
}

fn save(dir: &Path, name: &str, tensors: &[(&str, Tensor)]) -> Result<PathBuf, tandem::Error> {
    let path = dir.join(name);
    let map: BTreeMap<String, Tensor> = tensors
        .iter()
        .map(|(n, t)| ((*n).to_string(), t.clone()))
        .collect();
    tandem::io::write_safetensors(&path, &map)?;
    Ok(path)
}

/// A pseudo-random value in [-1, 1) from an index.
fn noise(i: usize) -> f32 {
    let x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
    (x as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

#[test]
fn sizes_past_the_machine_are_refused_before_anything_is_allocated() {
    for (flags, needle) in [
        (&["--batch", "9223372036854775807"][..], "overflow"),
        (&["--d-model", "4294967296"], "overflow"),
        (&["--seq-len", "1000000000"], "needs"),
        (&["--ffn", "12345678901"], "needs"),
        (&["--experts", "100000000"], "experts = 100000000"),
    ] {
        let mut args = vec!["run", "--backend", "cpu"];
        args.extend(flags);
        assert_refused(&tandem(&args), &[needle]);
        // `tandem plan` builds the same graph.
        args[0] = "plan";
        assert_refused(&tandem(&args), &[needle]);
    }
}

#[test]
fn the_memory_limit_is_a_setting() {
    let o = tandem_env(&["run", "--backend", "cpu"], &[("TANDEM_MAX_MEMORY", "1M")]);
    assert_refused(&o, &["needs", "1.0 MiB allowed (TANDEM_MAX_MEMORY)"]);
    let o = tandem_env(
        &["run", "--backend", "cpu"],
        &[("TANDEM_MAX_MEMORY", "lots")],
    );
    assert_refused(&o, &["TANDEM_MAX_MEMORY", "\"lots\""]);
}

#[test]
fn huge_toml_workloads_are_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    for (body, needle) in [
        ("[mixtral]\nbatch = 9223372036854775807\n", "overflow"),
        (
            "[mixtral]\nd_model = 4294967296\nheads = 1\nkv_heads = 1\n",
            "overflow",
        ),
        ("[mixtral]\nseq_len = 1000000000\n", "needs"),
        ("[mixtral]\nexperts = 100000000\n", "experts"),
    ] {
        let p = dir.path().join("w.toml");
        std::fs::write(&p, body)?;
        let path = p.to_str().ok_or("path")?;
        assert_refused(&tandem(&["run", "--backend", "cpu", path]), &[needle]);
    }
    Ok(())
}

#[test]
fn tiny_files_cannot_ask_for_unbounded_work() -> TestResult {
    let dir = tempfile::tempdir()?;
    // 2^40 planes of zero queries: nothing to compute, so it finishes at once with empty
    // outputs (it used to loop over every plane for about 17 hours).
    let empty = Tensor::zeros(&tandem::TensorMeta::new(
        vec![1 << 40, 1, 0, 16],
        tandem::DType::F32,
    ));
    let att = save(
        dir.path(),
        "att.safetensors",
        &[("q", empty.clone()), ("k", empty.clone()), ("v", empty)],
    )?;
    let out = dir.path().join("out.safetensors");
    let o = tandem(&[
        "op",
        "attention",
        "--backend",
        "cpu",
        "--inputs",
        att.to_str().ok_or("path")?,
        "--save",
        out.to_str().ok_or("path")?,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let saved = tandem::io::read_safetensors(&out)?;
    assert_eq!(saved["o"].shape(), &[1 << 40, 1, 0, 16]);
    // Logits [0, 2^26]: 2^26 experts would pad a permutation of gigabytes.
    let logits = Tensor::zeros(&tandem::TensorMeta::new(
        vec![0, 1 << 26],
        tandem::DType::F32,
    ));
    let route = save(dir.path(), "route.safetensors", &[("logits", logits)])?;
    let o = tandem(&[
        "op",
        "moe-route",
        "--backend",
        "cpu",
        "--inputs",
        route.to_str().ok_or("path")?,
    ]);
    assert_refused(&o, &["67108864 experts", "1..=65536"]);
    Ok(())
}

fn attention_inputs(dir: &Path, name: &str, poison: Option<(&str, usize, f32)>) -> TestResult {
    let shape = [1, 2, 24, 16];
    let mut t = vec![
        ("q", f32s(&shape, noise)),
        ("k", f32s(&shape, |i| noise(i + 7919))),
        ("v", f32s(&shape, |i| noise(i + 104_729))),
    ];
    if let Some((which, at, value)) = poison {
        let slot = t.iter_mut().find(|(n, _)| *n == which).ok_or("tensor")?;
        slot.1 = f32s(&shape, |i| if i == at { value } else { noise(i + 31) });
    }
    save(dir, name, &t)?;
    Ok(())
}

#[test]
fn non_finite_inputs_are_refused_on_every_backend_and_never_saved() -> TestResult {
    let dir = tempfile::tempdir()?;
    // k[0, 1, 2, 3] = NaN: flat index 1*24*16 + 2*16 + 3 = 419.
    attention_inputs(dir.path(), "nan.safetensors", Some(("k", 419, f32::NAN)))?;
    let nan = dir.path().join("nan.safetensors");
    let out = dir.path().join("out.safetensors");
    for backend in ["cpu", "fpga-sim", "auto"] {
        let o = tandem(&[
            "op",
            "attention",
            "--backend",
            backend,
            "--inputs",
            nan.to_str().ok_or("path")?,
            "--save",
            out.to_str().ok_or("path")?,
        ]);
        assert_refused(&o, &["input 'k'", "NaN", "[0, 1, 2, 3]"]);
        assert!(!out.exists(), "{backend}: a result was saved");
    }
    // Let through on request: the NaN reaches the output and the run fails, nothing saved.
    let o = tandem(&[
        "op",
        "attention",
        "--backend",
        "cpu",
        "--allow-nonfinite",
        "--inputs",
        nan.to_str().ok_or("path")?,
        "--save",
        out.to_str().ok_or("path")?,
    ]);
    assert_refused(&o, &["attention", "output", "NaN"]);
    assert!(!out.exists());
    // Finite inputs whose result overflows f32: v = 3e38 in column 0 of every key, equal
    // scores, so the f32 accumulation passes f32::MAX.
    let inf = f32s(&[1, 2, 24, 16], |i| if i % 16 == 0 { 3e38 } else { 0.5 });
    save(
        dir.path(),
        "inf.safetensors",
        &[
            ("q", f32s(&[1, 2, 24, 16], |_| 0.0)),
            ("k", f32s(&[1, 2, 24, 16], |_| 0.0)),
            ("v", inf),
        ],
    )?;
    let infp = dir.path().join("inf.safetensors");
    let o = tandem(&[
        "op",
        "attention",
        "--backend",
        "cpu",
        "--inputs",
        infp.to_str().ok_or("path")?,
        "--save",
        out.to_str().ok_or("path")?,
    ]);
    assert_refused(&o, &["output 'attention.o'", "inf"]);
    assert!(!out.exists());
    Ok(())
}

#[test]
fn router_losses_that_overflow_are_errors() -> TestResult {
    let dir = tempfile::tempdir()?;
    let logits = f32s(&[4, 8], |i| if i == 5 { 3e38 } else { noise(i) });
    let p = save(dir.path(), "route.safetensors", &[("logits", logits)])?;
    let o = tandem(&[
        "op",
        "moe-route",
        "--backend",
        "cpu",
        "--inputs",
        p.to_str().ok_or("path")?,
    ]);
    assert_refused(&o, &["moe_route", "z_loss", "inf"]);
    Ok(())
}

#[test]
fn timeout_ends_cpu_work() -> TestResult {
    // --timeout 0: the first op stops before it starts.
    let o = tandem(&["run", "--backend", "cpu", "--timeout", "0"]);
    assert_refused(&o, &["on cpu", "did not finish within 0ns"]);
    // A long CPU attention (about 70 GFLOP: many seconds on these cores) under --timeout 1
    // is stopped between blocks of queries.
    let dir = tempfile::tempdir()?;
    let shape = [1, 8, 4096, 128];
    let p = save(
        dir.path(),
        "long.safetensors",
        &[
            ("q", f32s(&shape, noise)),
            ("k", f32s(&shape, |i| noise(i + 1))),
            ("v", f32s(&shape, |i| noise(i + 2))),
        ],
    )?;
    let o = tandem(&[
        "op",
        "attention",
        "--backend",
        "cpu",
        "--timeout",
        "1",
        "--inputs",
        p.to_str().ok_or("path")?,
    ]);
    assert_refused(&o, &["attention", "did not finish within 1s"]);
    Ok(())
}

#[test]
fn timeout_ends_simulated_card_work() -> TestResult {
    if tandem_sim::available().is_err() {
        println!("SKIP: Verilator is not installed (the simulated card cannot run)");
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    attention_inputs(dir.path(), "att.safetensors", None)?;
    let p = dir.path().join("att.safetensors");
    let o = tandem(&[
        "op",
        "attention",
        "--backend",
        "fpga-sim",
        "--timeout",
        "0",
        "--inputs",
        p.to_str().ok_or("path")?,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    // The card's run stops at the deadline (and the CPU, where the node is re-planned, too).
    assert!(
        err.contains("on fpga-sim:0 did not finish within 0ns"),
        "{err}"
    );
    assert_refused(&o, &["did not finish within 0ns"]);
    Ok(())
}

#[test]
fn concurrent_fpga_sim_runs_on_an_empty_cache_agree() -> TestResult {
    if tandem_sim::available().is_err() {
        println!("SKIP: Verilator is not installed (the simulated card cannot run)");
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let cache = dir.path().join("cache");
    let logits = f32s(&[64, 8], |i| noise(i) * 3.0);
    let p = save(dir.path(), "route.safetensors", &[("logits", logits)])?;
    let runs = 4;
    let children = (0..runs)
        .map(|i| {
            let out = dir.path().join(format!("out{i}.safetensors"));
            let child = Command::new(support::bin())
                .args(["op", "moe-route", "--backend", "fpga-sim", "--renormalize"])
                .arg("--inputs")
                .arg(&p)
                .arg("--save")
                .arg(&out)
                .env("TANDEM_LOG", "warn")
                .env("TANDEM_HISTORY", "off")
                .env("TANDEM_SIM_CACHE", &cache)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()?;
            Ok((out, child))
        })
        .collect::<Result<Vec<_>, std::io::Error>>()?;
    let mut saved = Vec::new();
    for (out, child) in children {
        let o = child.wait_with_output()?;
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        // Every run used the card: no build failure sent the router back to the CPU.
        assert!(!err.contains("re-planning onto the CPU"), "{err}");
        saved.push(tandem::io::read_safetensors(&out)?);
    }
    for s in &saved[1..] {
        assert_eq!(s, &saved[0], "concurrent runs disagree");
    }
    // Builds land through private folders renamed into place: none is left behind.
    let mut leftovers = Vec::new();
    for entry in walk(&cache)? {
        let name = entry.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.as_deref().is_some_and(|n| n.starts_with('.')) {
            leftovers.push(entry);
        }
    }
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
    Ok(())
}

/// Every path under `dir`.
fn walk(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    if !dir.exists() {
        return Ok(out);
    }
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            out.extend(walk(&p)?);
        }
        out.push(p);
    }
    Ok(out)
}

#[test]
fn fpga_sim_refuses_shapes_the_build_cannot_take() {
    // Nkv 512 on the default attention build (nkv_max 256): refused with the limit before
    // anything is built or run, instead of a silent all-zero result reported as a mismatch.
    let o = tandem(&[
        "fpga",
        "sim",
        "--kernel",
        "attention",
        "--shape",
        "32,512,16",
    ]);
    assert_refused(&o, &["Nkv = 512", "nkv_max"]);
    let o = tandem(&["fpga", "sim", "--kernel", "router", "--experts", "4096"]);
    assert_refused(&o, &["experts = 4096", "e_max"]);
}
