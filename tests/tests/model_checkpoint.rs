//! Whole models: N chained layers against N single-layer runs, model folders (config.json +
//! sharded or single safetensors) written and read back, the committed test model, and every
//! bad-input case of a model folder with its error.

use std::collections::BTreeMap;
use std::path::Path;

use tandem::plan::BackendChoice;
use tandem::run::{RunOptions, run_graph};
use tandem::tensor::rel_error;
use tandem::workload::checkpoint::INDEX_FILE;
use tandem::workload::{
    self, Checkpoint, MixtralConfig, ModelSizes, ModelWeights, SaveOptions, model_graph,
};
use tandem::{DType, DeviceRegistry, Tensor};
use tandem_tests::{TestResult, rng, uniform};

/// The model committed for `tandem run --weights` on a fresh clone.
const TINY: &str = "data/models/mixtral-tiny";

fn cpu_opts() -> RunOptions {
    RunOptions {
        backend: BackendChoice::Only(tandem::DeviceKind::Cpu),
        placement: Default::default(),
        backend_label: "cpu".into(),
        exec: Default::default(),
        check: true,
        workload: "model".into(),
        history: None,
        limits: tandem::limits::Limits::default(),
        allow_nonfinite: false,
        warmup: 0,
    }
}

fn small() -> MixtralConfig {
    MixtralConfig {
        batch: 2,
        seq_len: 9,
        d_model: 32,
        heads: 4,
        kv_heads: 2,
        experts: 4,
        top_k: 2,
        ffn: 48,
        ..MixtralConfig::default()
    }
}

/// The model's first output on the CPU, with the run's worst node error and its output error
/// against the graph's f64 chain.
fn run_cpu(g: &tandem::graph::Graph) -> TestResult<(Tensor, f64, f64)> {
    let reg = DeviceRegistry::cpu_only();
    let out = run_graph(g, &reg, &cpu_opts())?;
    let name = g.outputs.first().ok_or("no output")?;
    let y = out.exec.buffers[name].to_host(&reg)?;
    let worst = out
        .report
        .nodes
        .iter()
        .filter_map(|n| n.error.rel_error)
        .fold(0.0f64, f64::max);
    let e = out.report.output_rel_error.ok_or("no output error")?;
    Ok((y, worst, e))
}

#[test]
fn a_model_of_n_layers_equals_n_single_layer_runs_chained() -> TestResult {
    let c = small();
    let layers = 4;
    let w = ModelWeights::random(&c, layers, &mut rng(7));
    let x = Tensor::from_f32(uniform(&mut rng(8), &[c.tokens(), c.d_model], 1.0));
    let g = model_graph(
        &c,
        layers,
        Some(w.clone()),
        Some(x.clone()),
        &tandem::limits::Limits::host(),
    )?;
    assert_eq!(g.outputs[0], format!("layers.{}.out.y", layers - 1));
    let (model_out, worst_node, chain_err) = run_cpu(&g)?;
    // The runtime's own checks: every node against f64 on its inputs, and the whole chain.
    assert!(worst_node < 1e-5, "worst node rel. error {worst_node:.3e}");
    assert!(
        chain_err < 1e-5,
        "model output vs its f64 chain {chain_err:.3e}"
    );
    // The same weights, one layer per graph, each fed the previous one's output.
    let mut h = x;
    for (i, lw) in w.layers.iter().enumerate() {
        let g1 = workload::mixtral_layer(&c, Some(lw.clone()), Some(h))?;
        let reg = DeviceRegistry::cpu_only();
        let out = run_graph(&g1, &reg, &cpu_opts())?;
        h = out.exec.buffers[workload::OUTPUT].to_host(&reg)?;
        assert!(h.first_non_finite().is_none(), "layer {i} output");
    }
    let (a, b) = (model_out.to_f32(), h.to_f32());
    assert_eq!(a.shape(), b.shape());
    let diff = rel_error(&model_out.to_f64(), &h.to_f64());
    // The same ops on the same inputs on the same device: bit for bit.
    assert!(
        a == b,
        "the chained model differs from the chained single layers (rel. {diff:.3e})"
    );
    Ok(())
}

#[test]
fn the_built_in_model_passes_the_f64_check_at_several_layers() -> TestResult {
    let c = MixtralConfig { seed: 3, ..small() };
    let g = model_graph(&c, 3, None, None, &tandem::limits::Limits::host())?;
    assert_eq!(g.nodes.len(), 3 * 17);
    let (y, worst, e) = run_cpu(&g)?;
    assert_eq!(y.shape(), [c.tokens(), c.d_model]);
    assert!(worst < 1e-5 && e < 1e-5, "node {worst:.3e}, output {e:.3e}");
    Ok(())
}

/// The weights of two loads, tensor by tensor.
fn same_weights(a: &ModelWeights, b: &ModelWeights) {
    assert_eq!(a.layers.len(), b.layers.len());
    for (i, (x, y)) in a.layers.iter().zip(&b.layers).enumerate() {
        for ((n, t), (_, u)) in x.all().into_iter().zip(y.all()) {
            assert_eq!(t, u, "layer {i} {n}");
        }
    }
    assert_eq!(a.embed, b.embed);
    assert_eq!(a.final_norm, b.final_norm);
    assert_eq!(a.lm_head, b.lm_head);
}

#[test]
fn sharded_and_single_file_checkpoints_round_trip() -> TestResult {
    let sizes = ModelSizes {
        layers: 3,
        ..workload::test_model_sizes()
    };
    let w = workload::random_model(&sizes, 11)?;
    let dir = tempfile::tempdir()?;
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        let one = dir.path().join(format!("one-{dtype}"));
        let three = dir.path().join(format!("three-{dtype}"));
        let files = workload::save_checkpoint(
            &one,
            &sizes,
            &w,
            SaveOptions {
                shards: 1,
                dtype,
                tie_word_embeddings: false,
            },
        )?;
        assert_eq!(files.len(), 2, "model.safetensors + config.json");
        let files = workload::save_checkpoint(
            &three,
            &sizes,
            &w,
            SaveOptions {
                shards: 3,
                dtype,
                tie_word_embeddings: false,
            },
        )?;
        assert_eq!(files.len(), 5, "3 shards + index + config.json");
        let (a, b) = (Checkpoint::open(&one)?, Checkpoint::open(&three)?);
        assert_eq!(a.sizes, sizes);
        assert_eq!(b.sizes, sizes);
        assert_eq!(b.files().len(), 3);
        let (wa, wb) = (a.load(3)?, b.load(3)?);
        same_weights(&wa, &wb);
        // What was saved, rounded to the stored dtype (exact for f32).
        let round = |t: &Tensor| t.cast(dtype).cast(DType::F32);
        for (x, y) in w.layers.iter().zip(&wa.layers) {
            for ((n, t), (_, u)) in x.all().into_iter().zip(y.all()) {
                assert_eq!(&round(t), u, "{dtype} {n}");
            }
        }
        assert_eq!(
            wa.lm_head.as_ref().map(round),
            w.lm_head.as_ref().map(round)
        );
        // Identical weights and ids give identical logits.
        let c = sizes.layer_config(&MixtralConfig {
            seq_len: 7,
            ..MixtralConfig::default()
        });
        let ga = model_graph(&c, 3, Some(wa), None, &tandem::limits::Limits::host())?;
        let gb = model_graph(&c, 3, Some(wb), None, &tandem::limits::Limits::host())?;
        assert_eq!(ga.outputs[0], "lm_head.y");
        let (ya, worst, e) = run_cpu(&ga)?;
        let (yb, _, _) = run_cpu(&gb)?;
        assert_eq!(ya.shape(), [7, sizes.vocab]);
        assert_eq!(ya, yb, "{dtype}: sharded and single-file outputs");
        assert!(
            worst < 1e-5 && e < 1e-5,
            "{dtype}: node {worst:.3e}, output {e:.3e}"
        );
    }
    Ok(())
}

/// A checkpoint with `tie_word_embeddings: true` stores no `lm_head.weight`; loading it gives
/// the embedding matrix as the head, and the model runs to logits with it. Tying a head that
/// differs from the embedding, or with no embedding, is refused by name.
#[test]
fn tied_word_embeddings_load_the_embedding_as_the_head() -> TestResult {
    let sizes = ModelSizes {
        layers: 2,
        ..workload::test_model_sizes()
    };
    let dir = tempfile::tempdir()?;
    let tied = dir.path().join("tied");
    let opts = SaveOptions {
        shards: 2,
        dtype: DType::F32,
        tie_word_embeddings: true,
    };
    workload::make_test_model(&tied, &sizes, 5, opts)?;
    let ck = Checkpoint::open(&tied)?;
    assert!(ck.tied, "config.json says tie_word_embeddings");
    assert!(!ck.has("lm_head.weight"), "a tied head is not stored");
    let w = ck.load(2)?;
    assert!(w.embed.is_some());
    assert_eq!(w.lm_head, w.embed, "the head is the embedding matrix");
    let c = sizes.layer_config(&MixtralConfig {
        seq_len: 5,
        ..MixtralConfig::default()
    });
    let g = model_graph(&c, 2, Some(w), None, &tandem::limits::Limits::host())?;
    assert_eq!(g.outputs[0], "lm_head.y");
    let (y, worst, e) = run_cpu(&g)?;
    assert_eq!(y.shape(), [5, sizes.vocab]);
    assert!(worst < 1e-5 && e < 1e-5, "node {worst:.3e}, output {e:.3e}");
    // A head that is not the embedding cannot be tied.
    let w = workload::random_model(&sizes, 6)?;
    let err = workload::save_checkpoint(dir.path().join("bad"), &sizes, &w, opts)
        .expect_err("a different head is refused")
        .to_string();
    assert!(err.contains("tie_word_embeddings"), "{err}");
    Ok(())
}

#[test]
fn the_committed_test_model_runs_from_ids_to_logits() -> TestResult {
    let ck = Checkpoint::open(TINY)?;
    assert_eq!(ck.sizes.layers, 3);
    assert_eq!(ck.layers_listed(), [0, 1, 2]);
    assert!(ck.files().len() > 1, "the committed model is sharded");
    let w = ck.load(3)?;
    // Stored in bf16, as transformers saves Mixtral.
    let raw =
        tandem::io::read_safetensors(Path::new(TINY).join("model-00001-of-00002.safetensors"))?;
    assert!(raw.values().all(|t| t.dtype() == DType::BF16));
    let c = ck.sizes.layer_config(&MixtralConfig {
        seq_len: 12,
        ..MixtralConfig::default()
    });
    let ids = Tensor::from_vec_i32(&[12], (0..12).map(|i| (i * 37) % 128).collect())?;
    let g = model_graph(
        &c,
        3,
        Some(w.clone()),
        Some(ids),
        &tandem::limits::Limits::host(),
    )?;
    let (y, worst, e) = run_cpu(&g)?;
    assert_eq!(y.shape(), [12, 128]);
    assert!(worst < 1e-5 && e < 1e-5, "node {worst:.3e}, output {e:.3e}");
    // Fewer layers than the files hold: the first ones.
    let w2 = ck.load(2)?;
    assert_eq!(w2.layers.len(), 2);
    assert_eq!(w2.layers[1].wq, w.layers[1].wq);
    Ok(())
}

/// A fresh copy of the committed model in a temporary folder, to break.
fn copy_tiny() -> TestResult<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    for e in std::fs::read_dir(TINY)? {
        let e = e?;
        std::fs::copy(e.path(), dir.path().join(e.file_name()))?;
    }
    Ok(dir)
}

fn edit_config(
    dir: &Path,
    f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> TestResult {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p)?)?;
    f(v.as_object_mut().ok_or("config.json is an object")?);
    std::fs::write(&p, serde_json::to_string(&v)?)?;
    Ok(())
}

fn load_err(dir: &Path, layers: usize) -> String {
    match Checkpoint::open(dir).and_then(|c| c.load(layers)) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn has_all(m: &str, needles: &[&str]) {
    for n in needles {
        assert!(m.contains(n), "'{n}' not in: {m}");
    }
}

#[test]
fn a_missing_shard_names_the_file_and_a_tensor() -> TestResult {
    let d = copy_tiny()?;
    std::fs::remove_file(d.path().join("model-00002-of-00002.safetensors"))?;
    let m = load_err(d.path(), 3);
    has_all(
        &m,
        &[
            "model-00002-of-00002.safetensors",
            "missing shard",
            INDEX_FILE,
            "model.layers.",
        ],
    );
    // One layer still needs the final norm and LM head, which were in the lost shard.
    has_all(
        &load_err(d.path(), 1),
        &["model-00002-of-00002.safetensors", "missing shard"],
    );
    Ok(())
}

#[test]
fn a_tensor_listed_but_not_in_its_shard_is_named() -> TestResult {
    let d = copy_tiny()?;
    let shard = d.path().join("model-00001-of-00002.safetensors");
    let mut t: BTreeMap<String, Tensor> = tandem::io::read_safetensors(&shard)?;
    let gone = "model.layers.0.block_sparse_moe.experts.2.w3.weight";
    t.remove(gone).ok_or("the shard held it")?;
    tandem::io::write_safetensors(&shard, &t)?;
    let m = load_err(d.path(), 3);
    has_all(
        &m,
        &[
            "model-00001-of-00002.safetensors",
            &format!("no tensor '{gone}'"),
            INDEX_FILE,
        ],
    );
    Ok(())
}

#[test]
fn a_shape_that_disagrees_with_config_json_is_named() -> TestResult {
    let d = copy_tiny()?;
    edit_config(d.path(), |c| {
        c.insert("intermediate_size".into(), 48.into());
    })?;
    let m = load_err(d.path(), 1);
    has_all(
        &m,
        &[
            "model-00001-of-00002.safetensors",
            "model.layers.0.block_sparse_moe.experts.0.w1.weight",
            "has shape [64, 32]",
            "intermediate_size = 48",
            "[48, 32]",
        ],
    );
    let d = copy_tiny()?;
    edit_config(d.path(), |c| {
        c.insert("num_key_value_heads".into(), 4.into());
    })?;
    has_all(
        &load_err(d.path(), 1),
        &[
            "self_attn.k_proj.weight",
            "has shape [16, 32]",
            "num_key_value_heads = 4",
        ],
    );
    Ok(())
}

#[test]
fn layers_beyond_the_files_or_the_config_are_refused() -> TestResult {
    let d = copy_tiny()?;
    // More layers than num_hidden_layers: both named.
    has_all(
        &load_err(d.path(), 4),
        &["4 layers asked for", "num_hidden_layers = 3", "config.json"],
    );
    has_all(&load_err(d.path(), 0), &["0 layers asked for"]);
    // config.json claims more layers than the files hold.
    edit_config(d.path(), |c| {
        c.insert("num_hidden_layers".into(), 5.into());
    })?;
    let ck = Checkpoint::open(d.path())?;
    ck.load(3)?;
    has_all(
        &load_err(d.path(), 4),
        &[
            INDEX_FILE,
            "model.layers.3.self_attn.q_proj.weight",
            "num_hidden_layers = 5",
            "layers 0 to 2",
        ],
    );
    Ok(())
}

#[test]
fn a_missing_config_key_or_file_is_named() -> TestResult {
    for key in [
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "num_local_experts",
        "num_experts_per_tok",
        "num_hidden_layers",
        "rms_norm_eps",
        "rope_theta",
        "vocab_size",
    ] {
        let d = copy_tiny()?;
        edit_config(d.path(), |c| {
            c.remove(key);
        })?;
        let m = Checkpoint::open(d.path()).expect_err(key).to_string();
        has_all(&m, &["config.json", &format!("missing key '{key}'")]);
    }
    let d = copy_tiny()?;
    std::fs::remove_file(d.path().join("config.json"))?;
    has_all(
        &Checkpoint::open(d.path())
            .expect_err("no config")
            .to_string(),
        &["config.json", "missing"],
    );
    let d = copy_tiny()?;
    std::fs::remove_file(d.path().join(INDEX_FILE))?;
    has_all(
        &Checkpoint::open(d.path())
            .expect_err("no weights")
            .to_string(),
        &["holds neither", INDEX_FILE, "model.safetensors"],
    );
    let m = Checkpoint::open(Path::new(TINY).join("config.json"))
        .expect_err("a file")
        .to_string();
    has_all(&m, &["not a model folder"]);
    Ok(())
}

#[test]
fn integer_weights_and_token_ids_outside_the_vocabulary_are_refused() -> TestResult {
    let d = copy_tiny()?;
    let shard = d.path().join("model-00002-of-00002.safetensors");
    let mut t = tandem::io::read_safetensors(&shard)?;
    let name = "model.norm.weight";
    let ints = Tensor::from_vec_i32(&[32], vec![1; 32])?;
    t.insert(name.into(), ints);
    tandem::io::write_safetensors(&shard, &t)?;
    has_all(
        &load_err(d.path(), 3),
        &["model-00002-of-00002.safetensors", name, "is i32", "float"],
    );
    let ck = Checkpoint::open(TINY)?;
    let c = ck.sizes.layer_config(&MixtralConfig {
        seq_len: 4,
        ..MixtralConfig::default()
    });
    let ids = Tensor::from_vec_i32(&[4], vec![0, 127, 128, 5])?;
    let m = model_graph(
        &c,
        1,
        Some(ck.load(1)?),
        Some(ids),
        &tandem::limits::Limits::host(),
    )
    .expect_err("id 128")
    .to_string();
    has_all(
        &m,
        &["token id 128 at position 2", "vocabulary of 128 tokens"],
    );
    Ok(())
}
