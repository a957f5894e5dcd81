//! criterion benches of the runtime's own cost: graphs of 10k empty ops (`Op::Nop`, see
//! `tandem::bench::overhead`) in a chain and independent, planned (plan + prepare) and
//! executed (submit, wait, drop the result) on the CPU through a running `Service`; divide by
//! 10k for the time per op. `tandem bench overhead` gives the per-op figures at 100k ops, and
//! benches/peers/starpu/run.sh puts them beside StarPU's.
//! `cargo bench -p tandem-benches --bench overhead -- --quick` for a fast pass.

use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tandem::bench::overhead::{DepShape, nop_graph};
use tandem::exec::{ExecOptions, Prepared, Service, ServiceOptions};
use tandem::plan::{BackendChoice, PlacementPolicy, plan_with};
use tandem::{DeviceKind, DeviceRegistry};

const OPS: usize = 10_000;

fn overhead(c: &mut Criterion) {
    let reg = DeviceRegistry::cpu_only();
    let service = Service::new(&reg, ServiceOptions { queue_depth: 1 })
        .unwrap_or_else(|e| panic!("service: {e}"));
    let opts = ExecOptions::default();
    let policy = PlacementPolicy::default();
    let cpu = BackendChoice::Only(DeviceKind::Cpu);
    let mut g = c.benchmark_group("overhead_10k_ops");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for shape in DepShape::ALL {
        let graph = nop_graph(shape, OPS);
        let plan =
            plan_with(&graph, &reg, cpu, None, &policy).unwrap_or_else(|e| panic!("plan: {e}"));
        let prepared =
            Arc::new(Prepared::new(&graph, &plan).unwrap_or_else(|e| panic!("prepare: {e}")));
        g.bench_function(BenchmarkId::new("plan", shape.name()), |b| {
            b.iter(|| {
                let p = plan_with(&graph, &reg, cpu, None, &policy)?;
                Prepared::new(&graph, &p)
            })
        });
        g.bench_function(BenchmarkId::new("execute", shape.name()), |b| {
            b.iter(|| service.submit(prepared.clone(), &opts)?.wait())
        });
    }
    g.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
