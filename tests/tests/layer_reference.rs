//! The whole Mixtral decoder layer against transformers' output (float64 reference,
//! `data/reference/mixtral_layer_0`), and the built-in workload against its own f64 chain.

use tandem::DeviceRegistry;
use tandem::plan::BackendChoice;
use tandem::run::{RunOptions, run_graph};
use tandem::tensor::rel_error;
use tandem::workload::{self, MixtralConfig};
use tandem_tests::{TestResult, get, load_reference};

fn cpu_opts(name: &str) -> RunOptions {
    RunOptions {
        backend: BackendChoice::Only(tandem::DeviceKind::Cpu),
        placement: Default::default(),
        backend_label: "cpu".into(),
        exec: Default::default(),
        check: true,
        workload: name.into(),
        history: None,
        limits: tandem::limits::Limits::default(),
        allow_nonfinite: false,
        warmup: 0,
    }
}

#[test]
fn mixtral_layer_matches_transformers() -> TestResult {
    let path = "data/reference/mixtral_layer_0.safetensors";
    let cfg = MixtralConfig {
        heads: 4,
        ..MixtralConfig::default()
    };
    let layer = workload::load_layer(path, &cfg)?;
    let (x, b, t) = layer.input.clone().ok_or("reference file has no input")?;
    let mut c = layer.config.clone();
    c.batch = b;
    c.seq_len = t;
    assert_eq!((c.d_model, c.kv_heads, c.experts, c.ffn), (64, 2, 8, 96));
    let g = workload::mixtral_layer(&c, Some(layer.weights), Some(x))?;
    let reg = DeviceRegistry::cpu_only();
    let out = run_graph(&g, &reg, &cpu_opts("mixtral_layer_0"))?;
    let y = out.exec.buffers[workload::OUTPUT].to_host(&reg)?;
    let y = workload::output_as_btd(&y, &c)?.to_f64();
    let reference = load_reference("mixtral_layer_0")?;
    let want = get(&reference, "output")?;
    let err = rel_error(&y, want);
    assert!(err < 1e-5, "layer output rel. error {err:.3e} >= 1e-5");
    // Our own f64 chain agrees with transformers far more tightly (its RMSNorm runs in f32).
    let chain = tandem::verify::reference_chain(&g)?;
    let y64 = workload::output_as_btd(
        &tandem::Tensor::from_f32(chain[workload::OUTPUT].mapv(|v| v as f32)),
        &c,
    )?
    .to_f64();
    assert!(rel_error(&y64, want) < 1e-5);
    Ok(())
}

#[test]
fn default_workload_matches_its_f64_chain() -> TestResult {
    let c = MixtralConfig {
        seq_len: 33,
        d_model: 128,
        ffn: 96,
        ..MixtralConfig::default()
    };
    let g = workload::mixtral_layer(&c, None, None)?;
    let reg = DeviceRegistry::cpu_only();
    let out = run_graph(&g, &reg, &cpu_opts("default"))?;
    let e = out.report.output_rel_error.ok_or("no output error")?;
    assert!(e < 1e-5, "output rel. error {e:.3e}");
    for n in &out.report.nodes {
        if let Some(e) = n.error.rel_error {
            assert!(e < 1e-5, "{}: rel. error {e:.3e}", n.run.node);
        }
        assert_eq!(n.error.id_mismatches.unwrap_or(0), 0, "{}", n.run.node);
    }
    Ok(())
}

#[test]
fn bf16_workload_rounds_inputs_but_stays_close() -> TestResult {
    let base = MixtralConfig {
        seq_len: 16,
        d_model: 64,
        heads: 4,
        ffn: 32,
        ..MixtralConfig::default()
    };
    let reg = DeviceRegistry::cpu_only();
    let f32_run = run_graph(
        &workload::mixtral_layer(&base, None, None)?,
        &reg,
        &cpu_opts("f32"),
    )?;
    let bf = MixtralConfig {
        dtype: tandem::DType::BF16,
        ..base.clone()
    };
    let bf_run = run_graph(
        &workload::mixtral_layer(&bf, None, None)?,
        &reg,
        &cpu_opts("bf16"),
    )?;
    let a = f32_run.exec.buffers[workload::OUTPUT]
        .to_host(&reg)?
        .to_f64();
    let b = bf_run.exec.buffers[workload::OUTPUT]
        .to_host(&reg)?
        .to_f64();
    let e = rel_error(&b, &a);
    assert!(
        e > 0.0 && e < 5e-2,
        "bf16-rounded inputs moved the output by {e:.3e}"
    );
    Ok(())
}

#[test]
fn bad_workloads_are_rejected_with_the_key() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cases = [
        ("[mixtral]\nheads = 3\n", "heads = 3"),
        ("[mixtral]\ntop_k = 9\n", "top_k = 9"),
        ("[mixtral]\nkv_heads = 3\n", "kv_heads = 3"),
        ("[mixtral]\nbogus = 1\n", "bogus"),
        ("[mixtral]\nseq_len = \"long\"\n", "seq_len"),
        ("[mixtral\n", "expected"),
        ("[mixtral]\ndtype = \"i8\"\n", "dtype"),
    ];
    for (i, (text, needle)) in cases.iter().enumerate() {
        let p = dir.path().join(format!("w{i}.toml"));
        std::fs::write(&p, text)?;
        let e = workload::WorkloadFile::load(&p).expect_err(text);
        let msg = e.to_string();
        assert!(
            msg.contains(needle),
            "{text:?}: message {msg:?} lacks {needle:?}"
        );
        assert!(msg.contains(&p.display().to_string()), "{msg}");
    }
    Ok(())
}

#[test]
fn small_toml_workload_loads() -> TestResult {
    let w = workload::WorkloadFile::load("data/workloads/small.toml")?;
    assert_eq!(w.mixtral.batch, 2);
    let g = workload::mixtral_layer(&w.mixtral, None, None)?;
    let out = run_graph(&g, &DeviceRegistry::cpu_only(), &cpu_opts("small"))?;
    assert!(out.report.output_rel_error.unwrap_or(1.0) < 1e-5);
    Ok(())
}
