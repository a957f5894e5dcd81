//! The MoE block (router logits -> routing -> experts -> combine) as one CUDA graph
//! (`CudaBackend::moe_block`): the eager block equals the three ops launched one by one through
//! the `Backend` trait; the replayed graph equals the eager block bit for bit on the same
//! inputs (T64 and T1024, small H and F, the grouped experts path, both storage precisions);
//! a replay after new input values gives the new eager result; the cuBLASLt experts path
//! (which reads the expert offsets on the host) is never captured and says why. Without a
//! usable GPU each test prints "skipped: <reason>" and returns.

use std::time::Duration;

use rand_chacha::ChaCha8Rng;
use tandem::backend::cuda::{
    BlockLaunch, BlockMode, CudaBackend, CudaDType, CudaOptions, GraphUse, MoeBlock,
    MoeBlockInputs, MoeExpertsPath,
};
use tandem::backend::{Backend, DeviceStorage};
use tandem::ops::{Activation, LinearParams, MoeExpertsParams, MoeRouteParams};
use tandem::{Op, Tensor};
use tandem_tests::cuda::{
    alone, backend_with as gpu_with, beside_others, clock_rng as rng, options, rand_rounded,
};

const ROUTE: MoeRouteParams = MoeRouteParams {
    top_k: 2,
    renormalize: true,
    block_size: 16,
};

/// Sizes of one case: T, H, F, E.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    t: usize,
    h: usize,
    f: usize,
    e: usize,
}

/// The block's weights on the device.
struct Weights {
    router: DeviceStorage,
    gate_up: DeviceStorage,
    down: DeviceStorage,
}

fn on_path(dt: CudaDType, path: MoeExpertsPath) -> CudaOptions {
    CudaOptions {
        moe_experts: Some(path),
        ..options(dt)
    }
}

fn up(be: &CudaBackend, t: &Tensor) -> DeviceStorage {
    be.upload(t).expect("upload")
}

fn weights(be: &CudaBackend, dt: CudaDType, r: &mut ChaCha8Rng, s: Sizes) -> Weights {
    let hs = 1.0 / (s.h as f32).sqrt();
    Weights {
        // router logits scaled up so the top-k choice is not a near tie everywhere
        router: up(be, &rand_rounded(r, dt, &[s.e, s.h], 4.0 * hs)),
        gate_up: up(be, &rand_rounded(r, dt, &[s.e, 2 * s.f, s.h], hs)),
        down: up(
            be,
            &rand_rounded(r, dt, &[s.e, s.h, s.f], 1.0 / (s.f as f32).sqrt()),
        ),
    }
}

fn block(be: &CudaBackend, x: &DeviceStorage, w: &Weights, mode: BlockMode) -> BlockLaunch {
    let l = be
        .moe_block(
            &MoeBlock { route: ROUTE },
            &MoeBlockInputs {
                x,
                router: &w.router,
                gate_up: &w.gate_up,
                down: &w.down,
            },
            mode,
        )
        .expect("moe block");
    l.done
        .wait(Duration::from_secs(120), "moe block")
        .expect("block finished");
    let t = l.info.lock().expect("info").device_time;
    println!(
        "  {mode:?}: {:?} path {} launches {:?} in {:.1} us",
        l.graph,
        l.experts_path,
        l.eager_launches,
        t.map_or(f64::NAN, |d| d.as_secs_f64() * 1e6)
    );
    l
}

/// The output's values as bits (16-bit storage widened exactly to f32).
fn bits(be: &CudaBackend, s: &DeviceStorage) -> Vec<u32> {
    let t = be.download(s).expect("download");
    let v = t.to_f32();
    let nan = v.iter().filter(|x| x.is_nan()).count();
    assert_eq!(
        nan, 0,
        "{nan} NaN in the block's output (unwritten poison?)"
    );
    v.iter().map(|x| x.to_bits()).collect()
}

/// The three ops launched one by one through the `Backend` trait (each waited for).
fn op_by_op(be: &CudaBackend, x: &DeviceStorage, w: &Weights) -> DeviceStorage {
    let run = |op: &Op, ins: &[&DeviceStorage]| -> Vec<DeviceStorage> {
        let l = be.launch(op, ins).expect("launch");
        l.done
            .wait(Duration::from_secs(120), op.name())
            .expect("finished");
        l.outputs
    };
    // f32 logits, as the block's router linear writes them
    let lin = Op::Linear(LinearParams {
        act: Activation::None,
        bias: false,
        f32_out: true,
    });
    let logits = run(&lin, &[x, &w.router]);
    let r = run(&Op::MoeRoute(ROUTE), &[&logits[0]]);
    let out = run(
        &Op::MoeExperts(MoeExpertsParams {}),
        &[x, &r[0], &r[1], &r[3], &r[4], &w.gate_up, &w.down],
    );
    out.into_iter().next().expect("one output")
}

fn same(what: &str, a: &[u32], b: &[u32]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let diff = a.iter().zip(b).filter(|(x, y)| x != y).count();
    assert_eq!(diff, 0, "{what}: {diff} of {} values differ", a.len());
}

fn replay_case(tag: &str, dt: CudaDType, s: Sizes, path: MoeExpertsPath) {
    replay_case_with(tag, dt, s, on_path(dt, path));
}

/// [`replay_case`] on a backend opened with `opts` (its experts path forced).
fn replay_case_with(tag: &str, dt: CudaDType, s: Sizes, opts: CudaOptions) {
    let Some(path) = opts.moe_experts else {
        panic!("replay_case_with needs the experts path forced");
    };
    let Some(be) = gpu_with(opts) else {
        return;
    };
    println!(
        " {dt} T{} H{} F{} E{} k{} experts {path}",
        s.t, s.h, s.f, s.e, ROUTE.top_k
    );
    let mut r = rng(tag);
    let w = weights(&be, dt, &mut r, s);
    let x = up(&be, &rand_rounded(&mut r, dt, &[s.t, s.h], 1.0));

    // The eager block is the three ops one by one.
    let eager = block(&be, &x, &w, BlockMode::Eager);
    assert!(matches!(&eager.graph, GraphUse::Eager { why } if why.contains("asked")));
    let want_path = match path {
        MoeExpertsPath::Wgmma if be.arch() == 90 => "wgmma",
        _ => "grouped-",
    };
    assert!(
        eager.experts_path.starts_with(want_path),
        "asked for {path}, ran {}",
        eager.experts_path
    );
    let want = bits(&be, &eager.output);
    same(
        "eager block vs op by op",
        &want,
        &bits(&be, &op_by_op(&be, &x, &w)),
    );
    let counted = eager.eager_launches.expect("eager launches counted");
    assert!(
        counted >= 5,
        "linear + routing + 4 experts kernels, counted {counted}"
    );

    // First sight in Auto: eager; second: captured and replayed; third: replayed.
    let first = block(&be, &x, &w, BlockMode::Auto);
    assert!(
        matches!(&first.graph, GraphUse::Eager { why } if why.contains("first run")),
        "{:?}",
        first.graph
    );
    same("first auto run", &want, &bits(&be, &first.output));
    let captured = block(&be, &x, &w, BlockMode::Auto);
    let GraphUse::Captured { nodes } = captured.graph else {
        panic!("expected a capture, got {:?}", captured.graph);
    };
    println!("  graph: {nodes}; eager counted {counted} launches");
    assert!(
        nodes.kernels as u64 >= counted,
        "{nodes} vs {counted} counted"
    );
    assert!(be.block_graphs() >= 1);
    same("captured run vs eager", &want, &bits(&be, &captured.output));
    for i in 0..2 {
        let again = block(&be, &x, &w, BlockMode::Auto);
        assert!(
            matches!(again.graph, GraphUse::Replayed { .. }),
            "{:?}",
            again.graph
        );
        same(
            &format!("replay {i} vs eager"),
            &want,
            &bits(&be, &again.output),
        );
    }
    // The first replay's output is the caller's: a later replay leaves it alone.
    same(
        "captured output after later replays",
        &want,
        &bits(&be, &captured.output),
    );

    // New input values (a new x): the replay copies them in and gives the new result.
    let x2 = up(&be, &rand_rounded(&mut r, dt, &[s.t, s.h], 1.0));
    let want2 = bits(&be, &block(&be, &x2, &w, BlockMode::Eager).output);
    assert_ne!(want, want2, "new x, new output");
    let replayed = block(&be, &x2, &w, BlockMode::Auto);
    assert!(
        matches!(replayed.graph, GraphUse::Replayed { .. }),
        "{:?}",
        replayed.graph
    );
    same(
        "replay on new x vs eager on new x",
        &want2,
        &bits(&be, &replayed.output),
    );
    // And back to the first x.
    let back = block(&be, &x, &w, BlockMode::Auto);
    same(
        "replay on the first x again",
        &want,
        &bits(&be, &back.output),
    );
    // No clearing of the backend's graphs here: the tests of one process share a backend
    // per option set and run at once (the other test's keys would vanish under it).
}

#[test]
fn cuda_moe_block_graph_is_bit_exact_with_eager_at_t64() {
    let _beside = beside_others();
    for dt in CudaDType::ALL {
        replay_case(
            "moe_block T64",
            dt,
            Sizes {
                t: 64,
                h: 256,
                f: 512,
                e: 8,
            },
            MoeExpertsPath::Grouped,
        );
    }
}

/// With the stream held while each block queues (`CudaOptions::hold_stream`, what `run
/// --explain` sets), eager, captured and replayed blocks still agree bit for bit, and no hold
/// times out (nothing in the block waits for the held stream).
#[test]
fn cuda_moe_block_on_a_held_stream_agrees_and_never_times_out() {
    let _alone = alone();
    let dt = CudaDType::Bf16;
    let opts = CudaOptions {
        hold_stream: true,
        ..on_path(dt, MoeExpertsPath::Wgmma)
    };
    let Some(be) = gpu_with(opts.clone()) else {
        return;
    };
    let before = be.holds_timed_out();
    let s = Sizes {
        t: 200,
        h: 256,
        f: 512,
        e: 8,
    };
    replay_case_with("moe_block held", dt, s, opts);
    assert_eq!(
        be.holds_timed_out(),
        before,
        "a hold timed out in the block"
    );
}

/// On the grouped path and on the Hopper wgmma path (other GPUs: its fallback).
#[test]
fn cuda_moe_block_graph_is_bit_exact_with_eager_at_t1024() {
    let _beside = beside_others();
    for dt in CudaDType::ALL {
        for path in [MoeExpertsPath::Grouped, MoeExpertsPath::Wgmma] {
            replay_case(
                "moe_block T1024",
                dt,
                Sizes {
                    t: 1024,
                    h: 256,
                    f: 512,
                    e: 8,
                },
                path,
            );
        }
    }
}

#[test]
fn cuda_moe_block_on_the_cublaslt_path_runs_eagerly_and_says_why() {
    let _beside = beside_others();
    let dt = CudaDType::Bf16;
    let Some(be) = gpu_with(on_path(dt, MoeExpertsPath::Blaslt)) else {
        return;
    };
    let s = Sizes {
        t: 64,
        h: 256,
        f: 512,
        e: 8,
    };
    let mut r = rng("moe_block blaslt");
    let w = weights(&be, dt, &mut r, s);
    let x = up(&be, &rand_rounded(&mut r, dt, &[s.t, s.h], 1.0));
    let want = bits(&be, &block(&be, &x, &w, BlockMode::Eager).output);
    for i in 0..3 {
        let l = block(&be, &x, &w, BlockMode::Auto);
        assert_eq!(l.experts_path, "blaslt");
        match &l.graph {
            GraphUse::Eager { why } => assert!(
                why.contains("cuBLASLt") && why.contains("host"),
                "run {i}: {why}"
            ),
            other => panic!("run {i}: the cuBLASLt path must not be captured, got {other:?}"),
        }
        assert!(l.eager_launches.is_some());
        same(
            &format!("auto run {i} vs eager"),
            &want,
            &bits(&be, &l.output),
        );
    }
    assert_eq!(be.block_graphs(), 0, "no graph kept");
}

/// A whole layer run by the executor with fusion on (`ExecOptions::fuse`): its MoE block runs
/// as one unit, eagerly the first time, captured the second, replayed after, and the layer's
/// outputs (hidden state, aux and z losses) equal the node-by-node run's bit for bit.
#[test]
fn cuda_layer_runs_its_moe_block_as_one_graph() {
    let _beside = beside_others();
    use std::sync::Arc;
    use tandem::DeviceRegistry;
    use tandem::backend::DeviceKind;
    use tandem::exec::{ExecOptions, Executor, fetch};
    use tandem::plan::{BackendChoice, plan};
    use tandem::workload::{self, MixtralConfig};
    let opts = options(CudaDType::Bf16);
    if gpu_with(opts.clone()).is_none() {
        return;
    }
    // A backend of its own, in a registry of its own.
    let be = Arc::new(CudaBackend::open(0, opts).expect("open cuda:0"));
    let mut reg = DeviceRegistry::cpu_only();
    reg.add(be);
    let c = MixtralConfig {
        seq_len: 64,
        d_model: 256,
        heads: 4,
        kv_heads: 2,
        experts: 8,
        top_k: 2,
        ffn: 96,
        ..MixtralConfig::default()
    };
    let g = workload::mixtral_layer(&c, None, None).expect("layer");
    let p = plan(&g, &reg, BackendChoice::Only(DeviceKind::Cuda)).expect("plan");
    let ex = Executor::new();
    let bits = |e: &tandem::exec::Execution| -> Vec<Vec<u32>> {
        fetch(e, &reg, &g.outputs)
            .expect("fetch")
            .iter()
            .map(|t| t.to_f32().iter().map(|v| v.to_bits()).collect())
            .collect()
    };
    let apart = ex
        .execute(&g, &p, &reg, &ExecOptions::default())
        .expect("node by node");
    assert!(apart.runs.iter().all(|r| r.fused.is_none()));
    let want = bits(&apart);
    let fuse = ExecOptions {
        fuse: true,
        ..ExecOptions::default()
    };
    for how in ["eager", "captured as one graph", "one graph replayed"] {
        let e = ex.execute(&g, &p, &reg, &fuse).expect("fused");
        let head = e
            .runs
            .iter()
            .find(|r| r.node.as_str() == "router_logits")
            .expect("router_logits ran");
        println!("  {}: {}", head.node.as_str(), head.launch.kernel);
        assert!(
            head.launch.kernel.starts_with("moe block ["),
            "{}",
            head.launch.kernel
        );
        assert!(
            head.launch.kernel.contains(how),
            "{how}: {}",
            head.launch.kernel
        );
        let fused = e.runs.iter().filter(|r| r.fused.is_some()).count();
        assert_eq!(fused, 3, "router_logits, router and experts in one unit");
        assert_eq!(
            bits(&e),
            want,
            "{how}: the outputs differ from the node-by-node run"
        );
    }
}
