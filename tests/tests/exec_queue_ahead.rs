//! Queueing launches ahead (`ExecOptions::queue_ahead`) on a device that runs its launches in
//! order (`Backend::orders_launches`), with a test device whose own thread runs the launched
//! work later, in launch order, as a GPU's stream does: a node's dependents on that device are
//! launched before it completed (counted at each launch), never more than the depth; the
//! results equal those of waiting for every node; a node on the CPU that reads the device's
//! outputs gets them right; a launch that fails once it runs fails the execution, naming the
//! device's error, without a hang.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::sync::mpsc::{Sender, channel};
use tandem::backend::{
    Backend, DeviceId, DeviceInfo, DeviceKind, DeviceStorage, Launch, LaunchInfo, Support,
};
use tandem::bench::random_tensor;
use tandem::exec::{ExecOptions, Executor, fetch};
use tandem::graph::Graph;
use tandem::ops::{Activation, LinearParams};
use tandem::plan::{BackendChoice, Plan, plan_with_history};
use tandem::sync::{Completion, Fence};
use tandem::{DType, DeviceRegistry, Error, Op, Result, Tensor, TensorMeta};
use tandem_tests::TestResult;

/// The device's copy of a tensor: empty until the device thread has run the launch that
/// writes it.
#[derive(Debug, Default)]
struct Slot {
    data: Mutex<Option<Tensor>>,
}

impl Slot {
    fn filled(t: Tensor) -> Arc<Self> {
        Arc::new(Self {
            data: Mutex::new(Some(t)),
        })
    }

    fn read(&self, who: &str) -> Result<Tensor> {
        self.data
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| Error::Internal(format!("{who} read a tensor no launch wrote yet")))
    }
}

/// One launch for the device thread: its op, its inputs' and outputs' slots, its place on
/// the fence.
struct Job {
    op: Op,
    inputs: Vec<Arc<Slot>>,
    outputs: Vec<Arc<Slot>>,
    value: u64,
}

/// A device that runs launches on a thread of its own, in launch order, and signals a fence
/// as each one finishes. The thread starts on the first job only once `start_after` launches
/// are queued (or after 20 s), so a worker that queues ahead is seen doing it. Launch number
/// `fail_at` fails once it runs, as a kernel fault does: the fence fails, and so does every
/// later launch.
#[derive(Debug)]
struct InOrderDevice {
    info: DeviceInfo,
    fence: Fence,
    launched: Arc<AtomicU64>,
    /// The most launches seen queued and not complete when a launch was made.
    most_ahead: AtomicUsize,
    jobs: Mutex<Sender<Job>>,
}

impl InOrderDevice {
    fn new(start_after: u64, fail_at: Option<u64>) -> Arc<Self> {
        let (tx, rx) = channel::<Job>();
        let fence = Fence::new();
        let launched = Arc::new(AtomicU64::new(0));
        let (f, l) = (fence.clone(), launched.clone());
        std::thread::spawn(move || {
            let t0 = Instant::now();
            while l.load(Ordering::Acquire) < start_after && t0.elapsed() < Duration::from_secs(20)
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            while let Ok(job) = rx.recv() {
                if Some(job.value) == fail_at {
                    f.fail(format!("test kernel fault in launch {}", job.value));
                }
                let ran = (|| -> Result<()> {
                    let ins = job
                        .inputs
                        .iter()
                        .map(|s| s.read("the device thread"))
                        .collect::<Result<Vec<_>>>()?;
                    let refs: Vec<&Tensor> = ins.iter().collect();
                    for (slot, t) in job.outputs.iter().zip(job.op.run_cpu(&refs)?) {
                        *slot.data.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
                    }
                    Ok(())
                })();
                match ran {
                    Ok(()) => f.signal(job.value),
                    Err(e) => f.fail(e.to_string()),
                }
            }
        });
        Arc::new(Self {
            info: DeviceInfo {
                id: DeviceId {
                    kind: DeviceKind::FpgaXrt,
                    index: 0,
                },
                name: "in-order test device".into(),
                memory_bytes: 1 << 30,
                peak_flops: 1e18,
                peak_bandwidth: 1e15,
                compute_dtype: DType::F32,
                details: Vec::new(),
            },
            fence,
            launched,
            most_ahead: AtomicUsize::new(0),
            jobs: Mutex::new(tx),
        })
    }

    fn slot(s: &DeviceStorage) -> Result<Arc<Slot>> {
        s.downcast::<Arc<Slot>>()
            .cloned()
            .ok_or_else(|| Error::Internal("foreign storage".into()))
    }
}

impl Backend for InOrderDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn supports(&self, op: &Op, _inputs: &[TensorMeta]) -> Support {
        match op {
            // The add runs on the CPU: it reads what the device wrote.
            Op::Add => Support::No("the test device has no add".into()),
            _ => Support::Native,
        }
    }
    fn orders_launches(&self) -> bool {
        true
    }
    fn upload(&self, host: &Tensor) -> Result<DeviceStorage> {
        Ok(DeviceStorage::new(
            self.id(),
            host.meta(),
            Slot::filled(host.clone()),
        ))
    }
    fn download(&self, s: &DeviceStorage) -> Result<Tensor> {
        // The in-order promise: a copy off the device waits for the launches before it.
        let last = self.launched.load(Ordering::Acquire);
        if last > 0 {
            self.fence.wait(
                last,
                Duration::from_secs(60),
                "a download from the test device",
            )?;
        }
        Self::slot(s)?.read("a download")
    }
    fn launch(&self, op: &Op, inputs: &[&DeviceStorage]) -> Result<Launch> {
        let metas: Vec<TensorMeta> = inputs.iter().map(|s| s.meta.clone()).collect();
        let out_metas = op.validate(&metas)?;
        let ins = inputs
            .iter()
            .map(|s| Self::slot(s))
            .collect::<Result<Vec<_>>>()?;
        let outs: Vec<Arc<Slot>> = out_metas.iter().map(|_| Arc::default()).collect();
        let value = self.launched.fetch_add(1, Ordering::AcqRel) + 1;
        let ahead = (value - 1).saturating_sub(self.fence.value()) as usize;
        self.most_ahead.fetch_max(ahead, Ordering::AcqRel);
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Job {
                op: op.clone(),
                inputs: ins,
                outputs: outs.clone(),
                value,
            })
            .map_err(|_| Error::Internal("the device thread stopped".into()))?;
        Ok(Launch {
            outputs: out_metas
                .into_iter()
                .zip(outs)
                .map(|(m, s)| DeviceStorage::new(self.id(), m, s))
                .collect(),
            done: Completion::new(self.fence.clone(), value),
            info: Arc::new(Mutex::new(LaunchInfo {
                kernel: format!("{}_in_order", op.name()),
                ..LaunchInfo::default()
            })),
        })
    }
    fn synchronize(&self) -> Result<()> {
        let last = self.launched.load(Ordering::Acquire);
        self.fence
            .wait(last, Duration::from_secs(60), "the test device's work")
    }
}

/// Eight square linears in a chain on the device, and an add on the CPU of the second and
/// fifth, the chain's end and the add as outputs.
fn chain() -> Result<Graph> {
    let (m, k) = (5, 16);
    let mut g = Graph::default();
    g.constant("x", random_tensor(&[m, k], 1.0, 7)?);
    let mut prev = "x".to_string();
    let mut outs = Vec::new();
    for i in 0..8 {
        let w = format!("w{i}");
        g.param(&w, random_tensor(&[k, k], 0.4, 100 + i)?);
        let y = g.add(
            &format!("lin{i}"),
            Op::Linear(LinearParams {
                act: Activation::Silu,
                bias: false,
                f32_out: false,
            }),
            &[&prev, &w],
        );
        prev = y[0].clone();
        outs.push(prev.clone());
    }
    let sum = g.add("side", Op::Add, &[&outs[1], &outs[4]]);
    g.outputs = vec![prev, sum[0].clone()];
    Ok(g)
}

fn registry(dev: Arc<InOrderDevice>) -> DeviceRegistry {
    let mut reg = DeviceRegistry::cpu_only();
    reg.add(dev);
    reg
}

fn planned(g: &Graph, reg: &DeviceRegistry) -> Result<Plan> {
    let plan = plan_with_history(g, reg, BackendChoice::Only(DeviceKind::FpgaXrt), None)?;
    // Placements are in the graph's order.
    let on = |name: &str| {
        g.nodes
            .iter()
            .position(|n| n.name == name)
            .map(|i| plan.placements[i].device.kind)
    };
    assert_eq!(on("lin3"), Some(DeviceKind::FpgaXrt), "{plan:?}");
    assert_eq!(on("side"), Some(DeviceKind::Cpu), "{plan:?}");
    Ok(plan)
}

fn bits(ts: &[Tensor]) -> Vec<Vec<u32>> {
    ts.iter()
        .map(|t| t.to_f32().iter().map(|v| v.to_bits()).collect())
        .collect()
}

/// Runs the chain with `depth` launches queued ahead, the device holding its first job until
/// `start_after` are queued: the outputs and the most launches seen ahead of the device.
fn run(depth: usize, start_after: u64) -> Result<(Vec<Tensor>, usize)> {
    let g = chain()?;
    let dev = InOrderDevice::new(start_after, None);
    let reg = registry(dev.clone());
    let plan = planned(&g, &reg)?;
    let opts = ExecOptions {
        queue_ahead: depth,
        ..ExecOptions::default()
    };
    let e = Executor::new().execute(&g, &plan, &reg, &opts)?;
    for r in e.runs.iter() {
        assert!(r.fallback.is_none(), "{} moved: {:?}", r.node, r.fallback);
        if r.device.kind == DeviceKind::FpgaXrt {
            assert!(r.launch.kernel.ends_with("_in_order"), "{r:?}");
        }
    }
    Ok((
        fetch(&e, &reg, &g.outputs)?,
        dev.most_ahead.load(Ordering::Acquire),
    ))
}

#[test]
fn dependents_are_queued_behind_their_producer_and_agree_with_waiting() -> TestResult {
    // Waiting for every node: nothing is ever queued ahead of the device.
    let (waited, ahead) = run(0, 1)?;
    assert_eq!(ahead, 0, "queue_ahead 0 launched behind unfinished work");
    // Four ahead: the device starts only once four launches are queued, which happens only
    // if dependents launch before their producer completed; never more than four.
    let (queued, ahead) = run(4, 4)?;
    assert_eq!(ahead, 3, "launches seen queued ahead at the fourth launch");
    assert_eq!(bits(&queued), bits(&waited));
    // Two ahead: at most one launch waits behind the one running.
    let (two, ahead) = run(2, 2)?;
    assert!(ahead <= 1, "{ahead} queued ahead with a depth of 2");
    assert_eq!(bits(&two), bits(&waited));
    // Against the f64 reference of the whole graph.
    let g = chain()?;
    let reference = tandem::verify::reference_chain(&g)?;
    for (got, name) in queued.iter().zip(&g.outputs) {
        let want = &reference[name];
        let err = tandem::tensor::rel_error(&got.to_f64(), want);
        assert!(
            err < 1e-5,
            "{name}: error {err:e} against the f64 reference"
        );
    }
    Ok(())
}

#[test]
fn a_launch_that_fails_once_it_runs_fails_the_execution_without_a_hang() -> TestResult {
    let g = chain()?;
    // The third launch faults; three more are queued behind it by then.
    let dev = InOrderDevice::new(4, Some(3));
    let reg = registry(dev);
    let plan = planned(&g, &reg)?;
    let t0 = Instant::now();
    let e = Executor::new()
        .execute(&g, &plan, &reg, &ExecOptions::default())
        .expect_err("a faulted launch must fail the execution"); // test-only: the test's point
    assert!(
        e.to_string().contains("test kernel fault in launch 3"),
        "the device's error is lost: {e}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t0.elapsed()
    );
    Ok(())
}
