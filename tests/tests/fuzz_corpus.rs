//! Replays the fuzz corpus kept in `tests/data/fuzz/<target>/` (seeded by `make_corpus.py` with
//! the inputs that broke or strained tandem, grown with what the harnesses in `fuzz_inputs.rs`
//! find): every input must come back as `Ok` or `Err`, never a panic. Inputs are parsed and
//! validated (and workload graphs built), never run.
//!
//! Targets: `safetensors` (read both ways, then the attention or routing op it feeds is
//! validated), `workload` (TOML workload files: loaded and checked, then the layer's graph is
//! built), `config_json` (transformers' config.json: parsed, applied, checked), `history` (the
//! planner's op-time history: opened, then a plan made with it, also with its entries under the
//! keys a real plan looks up).
//!
//! `must_be_refused.txt` lists the inputs whose sizes no machine has (they used to panic or
//! abort where the graph was built): loading or building them must be an error.

use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tandem::graph::Graph;
use tandem::ops::{AttentionParams, MoeRouteParams, Op};
use tandem::plan::{BackendChoice, History, plan_with_history};
use tandem::workload::{HfConfig, MixtralConfig, WorkloadFile, mixtral_layer};
use tandem::{DeviceId, DeviceRegistry, TensorMeta};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/fuzz")
}

/// The corpus files of `target`, sorted.
fn corpus(target: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fuzz_dir().join(target))
        .unwrap_or_else(|e| panic!("corpus folder {target}: {e}"))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no corpus files for {target}");
    v
}

/// `target/name` of a corpus file.
fn id(target: &str, p: &Path) -> String {
    format!(
        "{target}/{}",
        p.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    )
}

/// The inputs listed in `must_be_refused.txt`: sizes no machine has (they used to panic or
/// abort where the graph was built; admission control refuses them before any allocation).
fn must_be_refused() -> BTreeSet<String> {
    std::fs::read_to_string(fuzz_dir().join("must_be_refused.txt"))
        .unwrap_or_default()
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// Runs `f` on every corpus file of `target`; fails listing each input that panicked.
fn replay(target: &str, f: impl Fn(&str, &Path) -> String) {
    let mut panicked = Vec::new();
    let files = corpus(target);
    for p in &files {
        let name = id(target, p);
        match catch_unwind(AssertUnwindSafe(|| f(&name, p))) {
            Ok(outcome) => println!("{name}: {outcome}"),
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panicked.push(format!("{name}: {msg}"));
            }
        }
    }
    assert!(
        panicked.is_empty(),
        "{} of {} {target} inputs panicked:\n{}",
        panicked.len(),
        files.len(),
        panicked.join("\n")
    );
}

/// `ok` or the error's first line.
fn outcome<T>(r: &tandem::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("error: {}", e.to_string().lines().next().unwrap_or("")),
    }
}

#[test]
fn safetensors_corpus() {
    replay("safetensors", |_, p| {
        let _ = tandem::io::read_safetensors_f64(p);
        let t = match tandem::io::read_safetensors(p) {
            Ok(t) => t,
            Err(e) => return outcome::<()>(&Err(e)),
        };
        // Validate the op the file would feed (`tandem op`), without running it.
        let (op, inputs) = if ["q", "k", "v"].iter().all(|n| t.contains_key(*n)) {
            let op = Op::Attention(AttentionParams {
                causal: true,
                scale: None,
            });
            (op, vec!["q", "k", "v"])
        } else if t.contains_key("logits") {
            let op = Op::MoeRoute(MoeRouteParams {
                top_k: 2,
                renormalize: true,
                block_size: 16,
            });
            (op, vec!["logits"])
        } else {
            return format!("read {} tensors", t.len());
        };
        let mut g = Graph::default();
        for n in &inputs {
            g.constant(n, t[*n].clone());
        }
        g.outputs = g.add("op", op, &inputs);
        format!(
            "read; {} validates: {}",
            g.nodes[0].op.name(),
            outcome(&g.validate())
        )
    });
}

#[test]
fn workload_corpus() {
    let refused = must_be_refused();
    replay("workload", |name, p| {
        let built = WorkloadFile::load(p)
            .and_then(|w| mixtral_layer(&w.mixtral, None, None).and_then(|g| g.validate()));
        assert!(
            !(refused.contains(name) && built.is_ok()),
            "{name} asks for more than any machine has and must be refused"
        );
        format!("load + graph: {}", outcome(&built))
    });
    for name in &refused {
        assert!(
            fuzz_dir().join(name).exists(),
            "{name} is listed in must_be_refused.txt but not in the corpus"
        );
    }
}

#[test]
fn config_json_corpus() {
    replay("config_json", |_, p| match HfConfig::read(p) {
        Err(e) => outcome::<()>(&Err(e)),
        Ok(hf) => {
            let mut c = MixtralConfig {
                d_model: 64,
                seq_len: 8,
                ffn: 32,
                ..MixtralConfig::default()
            };
            hf.apply(&mut c);
            format!("parsed; applied config checks: {}", outcome(&c.check()))
        }
    });
}

/// A small layer graph and its tensor metas (what the planner sees).
fn small_graph() -> (Graph, std::collections::BTreeMap<String, TensorMeta>) {
    let c = MixtralConfig {
        batch: 1,
        seq_len: 8,
        d_model: 64,
        heads: 4,
        kv_heads: 2,
        experts: 4,
        top_k: 2,
        ffn: 32,
        ..MixtralConfig::default()
    };
    let g = mixtral_layer(&c, None, None).expect("the small layer builds");
    let metas = g.validate().expect("the small layer validates");
    (g, metas)
}

/// The history keys a plan of `g` on the CPU looks up (as written by `History::save`).
fn real_keys(g: &Graph, metas: &std::collections::BTreeMap<String, TensorMeta>) -> Vec<String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("history.json");
    let mut h = History::open(path.clone());
    for n in &g.nodes {
        let ins: Vec<TensorMeta> = n.inputs.iter().map(|i| metas[i].clone()).collect();
        h.record(DeviceId::CPU, &n.op, &ins, Duration::from_millis(1));
    }
    h.save().expect("save");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
    v["entries"]
        .as_object()
        .expect("entries")
        .keys()
        .cloned()
        .collect()
}

/// `text` with its entry `"k": {...}` repeated under each of `keys`; `None` without one.
fn under_real_keys(text: &str, keys: &[String]) -> Option<String> {
    let at = text.find("\"k\":")?;
    let end = at + text[at..].find('}')?;
    let stat = &text[at + 4..=end];
    let entries: Vec<String> = keys
        .iter()
        .map(|k| format!("{}: {stat}", serde_json::to_string(k).unwrap_or_default()))
        .collect();
    Some(format!(
        "{}{}{}",
        &text[..at],
        entries.join(", "),
        &text[end + 1..]
    ))
}

#[test]
fn history_corpus() {
    let (g, metas) = small_graph();
    let keys = real_keys(&g, &metas);
    let reg = DeviceRegistry::cpu_only();
    // The variants do reach the keys a plan looks up: a good entry is kept under every one.
    let good = r#"{"version": 2, "entries": {"k": {"n": 2, "mean_s": 0.001}}}"#;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("history.json");
    std::fs::write(&path, under_real_keys(good, &keys).expect("has k")).expect("write");
    let h = History::open(path);
    assert_eq!(h.len(), keys.len());
    let plan = plan_with_history(&g, &reg, BackendChoice::Auto, Some(&h)).expect("plan");
    assert!(
        plan.placements
            .iter()
            .all(|p| p.reason.to_string().contains("measured"))
    );
    replay("history", |_, p| {
        let text = std::fs::read(p).expect("corpus file");
        let mut outcomes = Vec::new();
        // As it is, and with its entry `k` (where it has one) under every key the plan uses.
        let mut variants = vec![text.clone()];
        if let Some(v) = under_real_keys(&String::from_utf8_lossy(&text), &keys) {
            variants.push(v.into_bytes());
        }
        for v in variants {
            let dir = tempfile::tempdir().expect("temp dir");
            let path = dir.path().join("history.json");
            std::fs::write(&path, &v).expect("write");
            let h = History::open(path);
            let plan = plan_with_history(&g, &reg, BackendChoice::Auto, Some(&h));
            outcomes.push(format!(
                "{} entries kept, plan: {}",
                h.len(),
                outcome(&plan)
            ));
        }
        outcomes.join("; ")
    });
}
