//! Property-based fuzzing of the inputs tandem reads from users and caches, with a bounded
//! number of cases so it runs in CI: mutated safetensors files, safetensors headers with
//! extreme shapes, TOML workloads, transformers' config.json and the op-time history file.
//! Each must come back as `Ok` or `Err`, never panic. Nothing is run; what is found belongs in
//! the replayed corpus (`tests/data/fuzz/<target>/`, see `fuzz_corpus.rs`).

use std::path::Path;
use std::time::Duration;

use proptest::prelude::*;
use tandem::graph::Graph;
use tandem::ops::{AttentionParams, MoeRouteParams, Op};
use tandem::plan::{BackendChoice, History, plan_with_history};
use tandem::workload::{HfConfig, MixtralConfig, WorkloadFile};
use tandem::{DeviceId, DeviceRegistry, TensorMeta};

/// Cases per property: enough to shake out shallow bugs on every CI run, small enough to keep
/// this file's run in seconds.
const CASES: u32 = 96;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: CASES,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn seed_file(name: &str) -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Reads `bytes` as a safetensors file both ways and validates the op it would feed.
fn read_and_validate(bytes: &[u8]) {
    let dir = tempfile::tempdir().expect("temp dir");
    let p = dir.path().join("x.safetensors");
    std::fs::write(&p, bytes).expect("write");
    let _ = tandem::io::read_safetensors_f64(&p);
    let Ok(t) = tandem::io::read_safetensors(&p) else {
        return;
    };
    let (op, inputs) = if ["q", "k", "v"].iter().all(|n| t.contains_key(*n)) {
        let op = Op::Attention(AttentionParams {
            causal: false,
            scale: None,
        });
        (op, vec!["q", "k", "v"])
    } else if t.contains_key("logits") {
        let op = Op::MoeRoute(MoeRouteParams {
            top_k: 2,
            renormalize: false,
            block_size: 16,
        });
        (op, vec!["logits"])
    } else {
        return;
    };
    let mut g = Graph::default();
    for n in &inputs {
        g.constant(n, t[*n].clone());
    }
    g.outputs = g.add("op", op, &inputs);
    let _ = g.validate();
}

/// Dimensions that broke things: zero, one, powers of two at type edges, and any.
fn dim() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(16),
        Just(1 << 26),
        Just(1 << 32),
        Just(1 << 40),
        Just(i64::MAX as u64),
        Just(u64::MAX),
        0u64..64,
        any::<u64>(),
    ]
}

proptest! {
    #![proptest_config(config())]

    /// Byte flips, insertions and truncations of real files.
    #[test]
    fn mutated_safetensors_files(
        which in 0usize..3,
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..12),
        cut in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let seeds = [
            "data/reference/moe_route_0.safetensors",
            "data/reference/attention_2.safetensors",
            "data/fuzz/safetensors/attention_q_nan.safetensors",
        ];
        let mut bytes = seed_file(seeds[which]);
        // Mostly in the header (8-byte length + JSON), where the structure is.
        let header_end = bytes.len().min(8 + 400);
        for (at, b) in flips {
            let i = at.index(header_end);
            bytes[i] = b;
        }
        if let Some(c) = cut {
            bytes.truncate(c.index(bytes.len() + 1));
        }
        read_and_validate(&bytes);
    }

    /// Well-formed headers with extreme shapes, dtypes and offsets.
    #[test]
    fn safetensors_headers_with_extreme_shapes(
        names in prop::sample::select(vec![vec!["q", "k", "v"], vec!["logits"], vec!["x"]]),
        shapes in prop::collection::vec(prop::collection::vec(dim(), 0..5), 3),
        dtype in prop::sample::select(vec!["F32", "F64", "F16", "BF16", "I64", "I32", "I8", "U8", "BOOL"]),
        data_len in prop::sample::select(vec![0usize, 4, 64, 1024]),
        bad_offsets in any::<bool>(),
    ) {
        let mut header = serde_json::Map::new();
        for (i, n) in names.iter().enumerate() {
            let shape = &shapes[i % shapes.len()];
            let offsets = if bad_offsets { vec![0, data_len as u64 + 4] } else { vec![0, data_len as u64] };
            header.insert((*n).to_string(), serde_json::json!({
                "dtype": dtype, "shape": shape, "data_offsets": offsets,
            }));
        }
        let mut h = serde_json::to_vec(&serde_json::Value::Object(header)).expect("json");
        h.resize(h.len().div_ceil(8) * 8, b' ');
        let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(&h);
        bytes.resize(bytes.len() + data_len, 0x3f);
        read_and_validate(&bytes);
    }

    /// TOML workloads with any sizes (loaded and checked; graphs are not built here).
    #[test]
    fn toml_workloads(
        sizes in prop::collection::vec(dim(), 8),
        rope_theta in prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(-1.0), Just(1e300), any::<f64>()],
        rms_eps in prop_oneof![Just(f32::NAN), Just(-0.0f32), any::<f32>()],
        dtype in prop::sample::select(vec!["f32", "bf16", "f16", "i8", "i32", "f64", ""]),
        extra in prop::sample::select(vec!["", "layers = 3\n", "batch = -1\n", "[other]\n"]),
    ) {
        let keys = ["batch", "seq_len", "d_model", "heads", "kv_heads", "experts", "top_k", "ffn"];
        let mut text = String::from("[mixtral]\n");
        for (k, v) in keys.iter().zip(&sizes) {
            // TOML integers are i64: larger values must be errors, not wraps.
            text.push_str(&format!("{k} = {v}\n"));
        }
        text.push_str(&format!("rope_theta = {rope_theta:?}\nrms_eps = {rms_eps:?}\n"));
        text.push_str(&format!("dtype = \"{dtype}\"\n{extra}"));
        let text = text.replace("NaN", "nan");
        let dir = tempfile::tempdir().expect("temp dir");
        let p = dir.path().join("w.toml");
        std::fs::write(&p, &text).expect("write");
        let _ = WorkloadFile::load(&p);
    }

    /// Character-level mutations of a valid workload file.
    #[test]
    fn mutated_toml_workloads(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<char>()), 1..8),
    ) {
        let mut chars: Vec<char> = String::from_utf8(seed_file("data/workloads/small.toml"))
            .expect("utf-8")
            .chars()
            .collect();
        for (at, c) in edits {
            let i = at.index(chars.len());
            chars[i] = c;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let p = dir.path().join("w.toml");
        std::fs::write(&p, chars.into_iter().collect::<String>()).expect("write");
        let _ = WorkloadFile::load(&p);
    }

    /// config.json with any value for the keys tandem reads, applied and checked.
    #[test]
    fn config_json(
        values in prop::collection::vec(prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<u64>().prop_map(serde_json::Value::from),
            any::<f64>().prop_map(serde_json::Value::from),
            dim().prop_map(serde_json::Value::from),
            ".{0,8}".prop_map(serde_json::Value::from),
            Just(serde_json::json!([1, 2])),
            Just(serde_json::json!({"rope_theta": 5})),
        ], 5),
    ) {
        let keys = ["num_attention_heads", "num_experts_per_tok", "rope_theta", "rms_norm_eps", "rope_parameters"];
        let obj: serde_json::Map<String, serde_json::Value> =
            keys.iter().map(|k| (*k).to_string()).zip(values).collect();
        let text = serde_json::to_string(&obj).expect("json");
        if let Ok(hf) = HfConfig::parse(&text, "config.json") {
            let mut c = MixtralConfig { d_model: 64, seq_len: 8, ffn: 32, ..MixtralConfig::default() };
            hf.apply(&mut c);
            let _ = c.check();
        }
    }

    /// History files with any counts and means, under the keys a plan looks up.
    #[test]
    fn history_files(
        stats in prop::collection::vec((
            prop_oneof![Just("0".to_string()), Just("-1".to_string()), any::<u64>().prop_map(|n| n.to_string()), Just("1.5".to_string())],
            prop_oneof![
                Just("NaN".to_string()), Just("1e300".to_string()), Just("1.5e19".to_string()),
                Just("-1".to_string()), Just("1e400".to_string()), Just("\"x\"".to_string()),
                any::<f64>().prop_map(|x| format!("{x:e}")),
                (0.0f64..1e6).prop_map(|x| format!("{x}")),
            ],
        ), 1..20),
        version in prop::sample::select(vec!["2", "1", "3", "\"2\"", "null", "18446744073709551616"]),
        cut in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let (g, keys) = &*GRAPH;
        let entries: Vec<String> = stats
            .iter()
            .zip(keys.iter().cycle())
            .map(|((n, m), k)| format!("{}: {{\"n\": {n}, \"mean_s\": {m}}}", serde_json::to_string(k).expect("key")))
            .collect();
        let mut text = format!("{{\"version\": {version}, \"entries\": {{{}}}}}", entries.join(", "));
        if let Some(c) = cut {
            text.truncate(c.index(text.len() + 1));
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("history.json");
        std::fs::write(&path, &text).expect("write");
        let mut h = History::open(path);
        let reg = DeviceRegistry::cpu_only();
        let _ = plan_with_history(g, &reg, BackendChoice::Auto, Some(&h));
        if let Some(n) = g.nodes.first() {
            let metas = g.validate().expect("validates");
            let ins: Vec<TensorMeta> = n.inputs.iter().map(|i| metas[i].clone()).collect();
            h.record(DeviceId::CPU, &n.op, &ins, Duration::from_millis(1));
        }
        prop_assert!(h.save().is_ok());
    }
}

/// A small layer graph and the history keys a CPU plan of it looks up.
static GRAPH: std::sync::LazyLock<(Graph, Vec<String>)> = std::sync::LazyLock::new(|| {
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
    let g = tandem::workload::mixtral_layer(&c, None, None).expect("small layer");
    let metas = g.validate().expect("validates");
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
    let keys = v["entries"]
        .as_object()
        .expect("entries")
        .keys()
        .cloned()
        .collect();
    (g, keys)
});
