//! The executor's fused units ([`ExecOptions::fuse`]): a test device that runs the MoE block
//! (router logits -> routing -> experts) as one launch, computed by the CPU's ops chained. With
//! fusion on, the block's three nodes run as one unit and the run's outputs (the layer output
//! and both routing losses) equal the node-by-node run's bit for bit; fusion is refused where
//! an intermediate of the block is read outside it, where it is off, where a run checks every
//! node, and on a device without the unit.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tandem::backend::cpu::CpuBackend;
use tandem::backend::{
    Backend, DeviceId, DeviceInfo, DeviceKind, DeviceStorage, FusedUnit, Launch, LaunchInfo,
    Support,
};
use tandem::exec::{ExecOptions, Execution, Executor, fetch};
use tandem::graph::Graph;
use tandem::ops::{Activation, LinearParams, MoeExpertsParams};
use tandem::plan::{BackendChoice, plan};
use tandem::run::{RunOptions, run_graph};
use tandem::workload::{self, MixtralConfig};
use tandem::{DType, DeviceRegistry, Op, Result, Tensor, TensorMeta};

const DEV: DeviceId = DeviceId {
    kind: DeviceKind::FpgaXrt,
    index: 0,
};

/// A fast device whose data are host tensors and whose ops the CPU computes; it runs the MoE
/// block as one launch where `fuses`. Its launches finish before they return, so it may say
/// they run in order (`in_order`), and the executor then takes its queue-ahead path.
#[derive(Debug)]
struct BlockDevice {
    info: DeviceInfo,
    cpu: CpuBackend,
    fuses: bool,
    units: AtomicUsize,
    in_order: AtomicBool,
}

impl BlockDevice {
    fn new(fuses: bool) -> Arc<Self> {
        Arc::new(Self {
            info: DeviceInfo {
                id: DEV,
                name: "block device".into(),
                memory_bytes: 1 << 40,
                peak_flops: 1e18,
                peak_bandwidth: 1e15,
                compute_dtype: DType::F32,
                details: Vec::new(),
            },
            cpu: CpuBackend::new(),
            fuses,
            units: AtomicUsize::new(0),
            in_order: AtomicBool::new(false),
        })
    }

    /// Runs `op` on the CPU and returns its outputs as host tensors.
    fn cpu_op(&self, op: &Op, ins: &[&DeviceStorage]) -> Result<Vec<Tensor>> {
        let l = self.cpu.launch(op, ins)?;
        l.outputs
            .iter()
            .map(|o| o.host_tensor("CPU").cloned())
            .collect()
    }

    fn store(&self, t: Tensor) -> DeviceStorage {
        DeviceStorage::new(self.id(), t.meta(), t)
    }
}

impl Backend for BlockDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn supports(&self, op: &Op, inputs: &[TensorMeta]) -> Support {
        self.cpu.supports(op, inputs)
    }
    fn orders_launches(&self) -> bool {
        self.in_order.load(Ordering::Relaxed)
    }
    fn upload(&self, host: &Tensor) -> Result<DeviceStorage> {
        Ok(self.store(host.clone()))
    }
    fn download(&self, storage: &DeviceStorage) -> Result<Tensor> {
        storage.host_tensor("block device").cloned()
    }
    fn launch(&self, op: &Op, inputs: &[&DeviceStorage]) -> Result<Launch> {
        let outs = self.cpu_op(op, inputs)?;
        Ok(Launch::finished_on_host(
            self.id(),
            outs,
            LaunchInfo {
                kernel: format!("cpu {}", op.name()),
                ..LaunchInfo::default()
            },
        ))
    }
    fn fuses(&self, _unit: &FusedUnit) -> bool {
        self.fuses
    }
    fn launch_fused(&self, unit: &FusedUnit, ins: &[&DeviceStorage]) -> Result<Launch> {
        let FusedUnit::MoeBlock(route) = unit;
        let run = || -> Result<Launch> {
            let &[x, router, gate_up, down] = ins else {
                return Err(tandem::Error::Internal("4 inputs expected".into()));
            };
            let lin = Op::Linear(LinearParams {
                act: Activation::None,
                bias: false,
                f32_out: true,
            });
            let logits = self.store(self.cpu_op(&lin, &[x, router])?.remove(0));
            let r: Vec<DeviceStorage> = self
                .cpu_op(&Op::MoeRoute(*route), &[&logits])?
                .into_iter()
                .map(|t| self.store(t))
                .collect();
            let experts = Op::MoeExperts(MoeExpertsParams {});
            let y = self
                .cpu_op(&experts, &[x, &r[0], &r[1], &r[3], &r[4], gate_up, down])?
                .remove(0);
            self.units.fetch_add(1, Ordering::Relaxed);
            let (aux, z) = (r[5].host_tensor("")?.clone(), r[6].host_tensor("")?.clone());
            Ok(Launch::finished_on_host(
                self.id(),
                vec![y, aux, z],
                LaunchInfo {
                    kernel: "test moe block".into(),
                    ..LaunchInfo::default()
                },
            ))
        };
        run()
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

fn layer() -> Result<Graph> {
    let c = MixtralConfig {
        seq_len: 12,
        d_model: 32,
        heads: 4,
        kv_heads: 2,
        experts: 4,
        top_k: 2,
        ffn: 24,
        ..MixtralConfig::default()
    };
    workload::mixtral_layer(&c, None, None)
}

fn registry(dev: Arc<BlockDevice>) -> DeviceRegistry {
    let mut r = DeviceRegistry::cpu_only();
    r.add(dev);
    r
}

fn exec(g: &Graph, reg: &DeviceRegistry, fuse: bool) -> Result<Execution> {
    let p = plan(g, reg, BackendChoice::Only(DeviceKind::FpgaXrt))?;
    assert!(p.placements.iter().all(|p| p.device == DEV));
    let opts = ExecOptions {
        fuse,
        ..ExecOptions::default()
    };
    Executor::new().execute(g, &p, reg, &opts)
}

fn bits(ts: &[Tensor]) -> Vec<Vec<u32>> {
    ts.iter()
        .map(|t| t.to_f32().iter().map(|v| v.to_bits()).collect())
        .collect()
}

fn fused_nodes(e: &Execution) -> Vec<String> {
    e.runs
        .iter()
        .filter(|r| r.fused.is_some())
        .map(|r| r.node.as_str().to_string())
        .collect()
}

#[test]
fn the_moe_block_runs_as_one_unit_with_the_same_outputs() -> Result<()> {
    let g = layer()?;
    let dev = BlockDevice::new(true);
    let reg = registry(dev.clone());
    let apart = exec(&g, &reg, false)?;
    assert!(fused_nodes(&apart).is_empty());
    assert_eq!(dev.units.load(Ordering::Relaxed), 0);
    let want = bits(&fetch(&apart, &reg, &g.outputs)?);
    let fused = exec(&g, &reg, true)?;
    assert_eq!(dev.units.load(Ordering::Relaxed), 1);
    assert_eq!(fused_nodes(&fused), ["router_logits", "router", "experts"]);
    assert_eq!(bits(&fetch(&fused, &reg, &g.outputs)?), want);
    let head = fused
        .runs
        .iter()
        .find(|r| r.node.as_str() == "router_logits");
    let head = head.expect("router_logits ran");
    assert_eq!(head.launch.kernel, "test moe block");
    let fused_note = head.fused.clone().unwrap_or_default();
    assert!(
        fused_note.contains("router_logits + router + experts"),
        "{fused_note}"
    );
    let experts = fused.runs.iter().find(|r| r.node.as_str() == "experts");
    let kernel = &experts.expect("experts ran").launch.kernel;
    assert!(
        kernel.contains("inside the fused unit of router_logits"),
        "{kernel}"
    );
    // Queued ahead (the path a GPU takes): the unit runs once more, its members still see it,
    // and the outputs are the same.
    dev.in_order.store(true, Ordering::Relaxed);
    let queued = exec(&g, &reg, true)?;
    assert_eq!(dev.units.load(Ordering::Relaxed), 2);
    assert_eq!(fused_nodes(&queued), ["router_logits", "router", "experts"]);
    assert_eq!(bits(&fetch(&queued, &reg, &g.outputs)?), want);
    let apart = exec(&g, &reg, false)?;
    assert!(fused_nodes(&apart).is_empty());
    assert_eq!(bits(&fetch(&apart, &reg, &g.outputs)?), want);
    Ok(())
}

#[test]
fn a_block_whose_intermediates_are_read_outside_runs_node_by_node() -> Result<()> {
    let mut g = layer()?;
    // The router's logits become an output of the graph: the unit would not write them.
    let logits = g
        .nodes
        .iter()
        .find(|n| n.name == "router_logits")
        .map(|n| n.outputs[0].clone())
        .expect("router_logits node");
    g.outputs.push(logits);
    let dev = BlockDevice::new(true);
    let reg = registry(dev.clone());
    let e = exec(&g, &reg, true)?;
    assert_eq!(dev.units.load(Ordering::Relaxed), 0);
    assert!(fused_nodes(&e).is_empty());
    assert_eq!(fetch(&e, &reg, &g.outputs)?.len(), g.outputs.len());
    Ok(())
}

#[test]
fn a_device_without_the_unit_runs_the_nodes() -> Result<()> {
    let g = layer()?;
    let dev = BlockDevice::new(false);
    let reg = registry(dev.clone());
    let e = exec(&g, &reg, true)?;
    assert!(fused_nodes(&e).is_empty());
    assert_eq!(fetch(&e, &reg, &g.outputs)?.len(), 3);
    Ok(())
}

#[test]
fn a_checked_run_never_fuses() -> Result<()> {
    let g = layer()?;
    let dev = BlockDevice::new(true);
    let reg = registry(dev.clone());
    let mut opts = RunOptions {
        backend: BackendChoice::Only(DeviceKind::FpgaXrt),
        placement: Default::default(),
        backend_label: "block device".into(),
        exec: ExecOptions {
            fuse: true,
            ..ExecOptions::default()
        },
        check: true,
        workload: "fused".into(),
        history: None,
        limits: tandem::limits::Limits::default(),
        allow_nonfinite: false,
        warmup: 1,
    };
    let out = run_graph(&g, &reg, &opts)?;
    assert_eq!(dev.units.load(Ordering::Relaxed), 0);
    assert!(fused_nodes(&out.exec).is_empty());
    // Unchecked, the same run fuses (the warm-up and the timed execution).
    opts.check = false;
    let out = run_graph(&g, &reg, &opts)?;
    assert_eq!(dev.units.load(Ordering::Relaxed), 2);
    assert_eq!(fused_nodes(&out.exec).len(), 3);
    Ok(())
}
