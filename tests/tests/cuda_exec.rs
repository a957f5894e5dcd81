//! The executor on a GPU, its launches queued ahead of their completion
//! (`ExecOptions::queue_ahead`): a whole layer gives the same bits as waiting for every node,
//! with weights uploaded while earlier ops are still queued (the copy stream writing pool blocks
//! that queued kernels returned), on fresh executors and on one whose weights stay resident,
//! with and without the MoE block fused; and it agrees with the f64 reference.

use std::sync::Arc;

use tandem::DeviceRegistry;
use tandem::backend::DeviceKind;
use tandem::backend::cuda::{CudaBackend, CudaDType};
use tandem::exec::{ExecOptions, Execution, Executor, fetch};
use tandem::plan::{BackendChoice, plan};
use tandem::workload::{self, MixtralConfig};
use tandem_tests::cuda::{backend_with, options};

fn bits(e: &Execution, reg: &DeviceRegistry, names: &[String]) -> Vec<Vec<u32>> {
    // test-only: a fetch that fails fails the test
    fetch(e, reg, names)
        .expect("fetch")
        .iter()
        .map(|t| t.to_f32().iter().map(|v| v.to_bits()).collect())
        .collect()
}

#[test]
fn cuda_layer_queued_ahead_agrees_with_waiting_bit_for_bit() {
    let opts = options(CudaDType::Bf16);
    if backend_with(opts.clone()).is_none() {
        return;
    }
    // A backend of its own, in a registry of its own (test-only expects below: a GPU that is
    // present must open, plan and run).
    let be = Arc::new(CudaBackend::open(0, opts).expect("open cuda:0"));
    let mut reg = DeviceRegistry::cpu_only();
    reg.add(be);
    let c = MixtralConfig {
        seq_len: 384,
        d_model: 512,
        heads: 8,
        kv_heads: 2,
        experts: 8,
        top_k: 2,
        ffn: 1024,
        ..MixtralConfig::default()
    };
    let g = workload::mixtral_layer(&c, None, None).expect("layer");
    let p = plan(&g, &reg, BackendChoice::Only(DeviceKind::Cuda)).expect("plan");
    assert!(
        p.placements
            .iter()
            .all(|p| p.device.kind == DeviceKind::Cuda)
    );
    let with = |depth: usize, fuse: bool| ExecOptions {
        queue_ahead: depth,
        fuse,
        ..ExecOptions::default()
    };
    let waited = Executor::new()
        .execute(&g, &p, &reg, &with(0, false))
        .expect("waiting for each node");
    let want = bits(&waited, &reg, &g.outputs);
    // The f64 reference of the layer, for the queued runs' bits.
    let reference = tandem::verify::reference_chain(&g).expect("reference");
    let resident = Executor::new();
    for round in 0..4 {
        for (depth, fuse) in [(4, false), (1, false), (8, false), (4, true)] {
            // A fresh executor uploads each weight at its node's first use, while the nodes
            // before it are still queued; the resident one uploads them in round 0 only.
            let fresh = Executor::new();
            for (how, ex) in [("fresh", &fresh), ("resident", &resident)] {
                let e = ex
                    .execute(&g, &p, &reg, &with(depth, fuse))
                    .expect("queued ahead");
                let got = bits(&e, &reg, &g.outputs);
                assert!(
                    got == want,
                    "round {round}, {how} executor, depth {depth}, fuse {fuse}: outputs differ \
                     from waiting for each node"
                );
                if round == 0 && depth == 4 && !fuse {
                    let out = fetch(&e, &reg, &g.outputs[..1]).expect("fetch");
                    let err =
                        tandem::tensor::rel_error(&out[0].to_f64(), &reference[&g.outputs[0]]);
                    println!("  {how}: layer output error {err:.3e} against the f64 reference");
                    // A layer chains about fifteen ops, each rounding to bf16 (1e-2 per op):
                    // `tandem run --backend cuda --seq-len 512` reports 1.12e-2 on this shape.
                    assert!(err < 3e-2, "bf16 layer error {err:e} over the layer's 3e-2");
                }
            }
        }
    }
}
