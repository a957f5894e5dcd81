//! criterion benches of the standalone ops on every device kind found (cpu, cuda, fpga-sim),
//! through the `Backend` trait and `tandem::bench::Harness`: the inputs, set rotation,
//! warm-up and per-launch timing of `tandem bench` (device time where the device reports it,
//! else the wall clock), with criterion's statistics on top. An op a device lacks is skipped
//! with the reason. `cargo bench -p tandem-benches --bench backend_ops -- --quick`.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tandem::bench::{self, BenchShape, Harness};
use tandem::ops::{Activation, OpKind};
use tandem::{DeviceKind, DeviceRegistry};

/// Small sizes every backend can hold (the FPGA kernels' bounds included).
const SMALL: BenchShape = BenchShape {
    batch: 1,
    heads: 4,
    kv_heads: Some(2),
    seq_len: 128,
    kv_len: None,
    head_dim: 64,
    causal: true,
    context: 128,
    new_tokens: 1,
    block_size: None,
    tokens: Some(256),
    experts: Some(8),
    top_k: Some(2),
    hidden: 256,
    ffn: 512,
    m: 64,
    n: 64,
    k: 64,
    act: Activation::Relu,
    bias: true,
    rows: 64,
    cols: 1024,
};

/// Input sets rotated between launches.
const SETS: usize = 2;

fn backend_ops(c: &mut Criterion) {
    let reg = DeviceRegistry::discover();
    for kind in DeviceKind::ALL {
        let Ok(be) = bench::pick_backend(&reg, Some(kind)) else {
            continue;
        };
        let mut g = c.benchmark_group(format!("backend_ops/{}", be.id()));
        g.sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(1));
        for op in OpKind::STANDALONE {
            let p = SMALL
                .problem(op)
                .unwrap_or_else(|e| panic!("{op} problem: {e}"));
            if let Err(e) = bench::check(be.as_ref(), &p) {
                println!("skipped: {e}");
                continue;
            }
            let h = Harness::new(be.as_ref(), &p, SETS, bench::SEED, Duration::from_secs(60))
                .unwrap_or_else(|e| panic!("{op} on {}: {e}", be.id()));
            let first = h
                .warm_up(2, Duration::ZERO)
                .and_then(|_| h.first_launch())
                .unwrap_or_else(|e| panic!("{op} on {}: {e}", be.id()));
            g.bench_function(BenchmarkId::new(op.name(), &p.label), |b| {
                b.iter_custom(
                    |iters| match h.measure(iters as usize, first.timing, false) {
                        Ok(s) => s.total(),
                        Err(e) => panic!("{op} on {}: {e}", be.id()),
                    },
                )
            });
        }
        g.finish();
    }
}

criterion_group!(backends, backend_ops);
criterion_main!(backends);
