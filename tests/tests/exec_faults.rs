//! The executor and `Buffer` with devices that misbehave: a device that fails every launch,
//! one that never completes (timeout), one whose kernel for one op does not compile or runs
//! out of memory, and a healthy second device (data migrates through host memory and is
//! counted). Results must stay right and say where they ran. Weights stay resident on the
//! device between executions of one `Executor`, are uploaded again when their host data
//! changes, and a lost device leaves no replica from before it in use; a compile failure or
//! an out-of-memory moves only that node to the CPU and keeps the device and its weights.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tandem::backend::{
    Backend, DeviceId, DeviceInfo, DeviceKind, DeviceStorage, Launch, LaunchInfo, Support,
};
use tandem::exec::{ExecOptions, Executor};
use tandem::memory::{Access, Buffer};
use tandem::plan::BackendChoice;
use tandem::run::{RunOptions, RunOutcome, run_graph, run_graph_with};
use tandem::sync::{Completion, Fence};
use tandem::workload::{self, MixtralConfig};
use tandem::{DType, DeviceRegistry, Error, Op, Result, Tensor, TensorMeta};
use tandem_tests::TestResult;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Runs ops with the CPU code, storing tensors as its own replicas.
    Healthy,
    /// Every launch fails as a lost device would, and the device is reset: data stored on it
    /// before is gone.
    Fails,
    /// Every upload fails as a lost device would (launches work).
    UploadFails,
    /// Launches never complete.
    Hangs,
    /// Launches of this op fail as a kernel that does not compile would; the rest run.
    CompileFails(&'static str),
    /// Launches of this op run out of device memory; the rest run.
    OutOfMemory(&'static str),
}

/// What the test device stores: the data and the reset epoch it was stored in.
#[derive(Debug)]
struct Stored {
    epoch: u64,
    tensor: Tensor,
}

/// A test device that claims to be very fast, so the planner gives it every op.
#[derive(Debug)]
struct TestDevice {
    info: DeviceInfo,
    mode: Mutex<Mode>,
    launches: Mutex<usize>,
    /// Bytes the device received from the host.
    uploaded: Mutex<u64>,
    /// Resets so far; storage from an earlier epoch is gone.
    epoch: Mutex<u64>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl TestDevice {
    fn set_mode(&self, mode: Mode) {
        *locked(&self.mode) = mode;
    }

    fn uploaded(&self) -> u64 {
        *locked(&self.uploaded)
    }

    fn new(mode: Mode) -> Arc<Self> {
        Arc::new(Self {
            info: DeviceInfo {
                id: DeviceId {
                    kind: DeviceKind::FpgaXrt,
                    index: 0,
                },
                name: format!("test device ({mode:?})"),
                memory_bytes: 1 << 30,
                peak_flops: 1e18,
                peak_bandwidth: 1e15,
                compute_dtype: DType::F32,
                details: Vec::new(),
            },
            mode: Mutex::new(mode),
            launches: Mutex::new(0),
            uploaded: Mutex::new(0),
            epoch: Mutex::new(0),
        })
    }

    fn lost(&self) -> Error {
        Error::device(
            self.id().to_string(),
            "test error 'LOST' (1): the device fell off the bus",
        )
    }
}

impl Backend for TestDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn supports(&self, _op: &Op, _inputs: &[TensorMeta]) -> Support {
        Support::Native
    }
    fn upload(&self, host: &Tensor) -> Result<DeviceStorage> {
        if *locked(&self.mode) == Mode::UploadFails {
            return Err(self.lost());
        }
        *locked(&self.uploaded) += host.meta().bytes() as u64;
        let stored = Stored {
            epoch: *locked(&self.epoch),
            tensor: host.clone(),
        };
        Ok(DeviceStorage::new(self.id(), host.meta(), stored))
    }
    fn download(&self, s: &DeviceStorage) -> Result<Tensor> {
        let stored = s
            .downcast::<Stored>()
            .ok_or_else(|| Error::Internal("foreign storage".into()))?;
        let epoch = *locked(&self.epoch);
        if stored.epoch != epoch {
            // A real device would hand back garbage; make the use of lost data a hard error.
            return Err(Error::Internal(format!(
                "{} read storage from before its reset (epoch {} != {epoch})",
                self.id(),
                stored.epoch
            )));
        }
        Ok(stored.tensor.clone())
    }
    fn launch(&self, op: &Op, inputs: &[&DeviceStorage]) -> Result<Launch> {
        *self
            .launches
            .lock()
            .map_err(|_| Error::Internal("lock".into()))? += 1;
        let mode = *locked(&self.mode);
        match mode {
            Mode::Fails => {
                *locked(&self.epoch) += 1;
                Err(self.lost())
            }
            Mode::Hangs => Ok(Launch {
                outputs: Vec::new(),
                done: Completion::new(Fence::new(), 1),
                info: Arc::new(Mutex::new(LaunchInfo::default())),
            }),
            Mode::CompileFails(name) if op.name() == name => Err(Error::compile(
                self.id().to_string(),
                format!("{name}.cu"),
                "test compiler error 'SYNTAX' (6)",
                "line 1: expected a ';'",
            )),
            Mode::OutOfMemory(name) if op.name() == name => Err(Error::out_of_memory(
                self.id().to_string(),
                1 << 40,
                Some(1 << 20),
            )),
            Mode::Healthy | Mode::UploadFails | Mode::CompileFails(_) | Mode::OutOfMemory(_) => {
                let ts: Vec<Tensor> = inputs
                    .iter()
                    .map(|s| self.download(s))
                    .collect::<Result<_>>()?;
                let refs: Vec<&Tensor> = ts.iter().collect();
                let outs = op.run_cpu(&refs)?;
                Ok(Launch {
                    outputs: outs
                        .into_iter()
                        .map(|t| {
                            let epoch = *locked(&self.epoch);
                            DeviceStorage::new(self.id(), t.meta(), Stored { epoch, tensor: t })
                        })
                        .collect(),
                    done: Completion::done(),
                    info: Arc::new(Mutex::new(LaunchInfo {
                        kernel: format!("{}_test", op.name()),
                        ..Default::default()
                    })),
                })
            }
        }
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

fn small_layer() -> Result<tandem::graph::Graph> {
    workload::mixtral_layer(
        &MixtralConfig {
            seq_len: 12,
            d_model: 32,
            heads: 4,
            ffn: 16,
            ..MixtralConfig::default()
        },
        None,
        None,
    )
}

fn opts(timeout: Duration) -> RunOptions {
    RunOptions {
        backend: BackendChoice::Only(DeviceKind::FpgaXrt),
        placement: Default::default(),
        backend_label: "fpga".into(),
        exec: ExecOptions {
            timeout,
            fallback: true,
            fuse: false,
            ..ExecOptions::default()
        },
        check: true,
        workload: "faults".into(),
        history: None,
        limits: tandem::limits::Limits::default(),
        allow_nonfinite: false,
        warmup: 0,
    }
}

fn with(dev: Arc<TestDevice>) -> DeviceRegistry {
    let mut reg = DeviceRegistry::cpu_only();
    reg.add(dev);
    reg
}

#[test]
fn failing_device_is_replanned_onto_the_cpu() -> TestResult {
    let dev = TestDevice::new(Mode::Fails);
    let reg = with(dev.clone());
    let out = run_graph(&small_layer()?, &reg, &opts(Duration::from_secs(10)))?;
    // The first op failed there; every later op went straight to the CPU.
    assert_eq!(*dev.launches.lock().map_err(|_| "lock")?, 1);
    assert!(
        out.report
            .nodes
            .iter()
            .all(|n| n.run.device == DeviceId::CPU)
    );
    assert!(
        out.report.nodes[0]
            .run
            .fallback
            .as_deref()
            .unwrap_or("")
            .contains("fell off the bus")
    );
    assert!(
        out.report.nodes[1]
            .run
            .fallback
            .as_deref()
            .unwrap_or("")
            .contains("failed earlier")
    );
    assert!(out.report.output_rel_error.unwrap_or(1.0) < 1e-5);
    Ok(())
}

#[test]
fn hanging_device_times_out_and_work_moves_on() -> TestResult {
    let dev = TestDevice::new(Mode::Hangs);
    let reg = with(dev.clone());
    let out = run_graph(&small_layer()?, &reg, &opts(Duration::from_millis(200)))?;
    // Timed out once, then treated as lost: no later node waits on it.
    assert_eq!(*dev.launches.lock().map_err(|_| "lock")?, 1);
    let note = out.report.nodes[0].run.fallback.clone().unwrap_or_default();
    assert!(note.contains("did not finish within"), "{note}");
    assert!(out.report.output_rel_error.unwrap_or(1.0) < 1e-5);
    Ok(())
}

#[test]
fn without_fallback_a_hang_is_reported_as_a_timeout() -> TestResult {
    let reg = with(TestDevice::new(Mode::Hangs));
    let mut o = opts(Duration::from_millis(100));
    o.exec.fallback = false;
    let Err(e) = run_graph(&small_layer()?, &reg, &o) else {
        return Err("the run must fail without fallback".into());
    };
    assert_eq!(e.kind(), tandem::ErrorKind::DeadlineExceeded, "{e}");
    assert!(e.to_string().contains("did not finish within"), "{e}");
    Ok(())
}

/// With `mode` failing every launch of `op` (and nothing else): each execution moves those
/// nodes to the CPU with a note containing `needle`, every other node still runs on the device,
/// and the weights stay resident there (the second execution uploads none). Without fallback
/// the run fails with `kind`.
fn one_op_fails(mode: Mode, op: &str, needle: &str, kind: tandem::ErrorKind) -> TestResult {
    let dev = TestDevice::new(mode);
    let reg = with(dev.clone());
    let g = small_layer()?;
    let ex = Executor::new();
    let o = opts(Duration::from_secs(10));
    let first = run_graph_with(&ex, &g, &reg, &o)?;
    let moved = first.report.nodes.iter().filter(|n| n.run.op == op).count();
    assert!(moved > 0, "the layer has no {op} node");
    for n in &first.report.nodes {
        if n.run.op == op {
            assert_eq!(n.run.device, DeviceId::CPU, "{} stayed", n.run.node);
            let note = n.run.fallback.as_deref().unwrap_or("");
            assert!(note.contains(needle), "{note}");
        } else {
            assert_eq!(n.run.device, dev.id(), "{} left the device", n.run.node);
            assert_eq!(n.run.fallback, None, "{}", n.run.node);
        }
    }
    assert!(first.report.output_rel_error.unwrap_or(1.0) < 1e-5);
    // Every node was launched there once, the failed ones included; every weight is resident
    // there (those of a failed node were uploaded before its launch) and none was dropped.
    assert_eq!(*dev.launches.lock().map_err(|_| "lock")?, g.nodes.len());
    assert_eq!(ex.resident().device_bytes(), weight_bytes(&g));

    let second = run_graph_with(&ex, &g, &reg, &o)?;
    assert_eq!(second.exec.resident_bytes(), 0);
    assert_eq!(second.report.weights_uploaded_bytes, 0);
    assert_eq!(ex.resident().device_bytes(), weight_bytes(&g));
    for (a, b) in first.report.nodes.iter().zip(&second.report.nodes) {
        assert_eq!(a.run.device, b.run.device, "{}", a.run.node);
    }
    assert_eq!(output(&second, &reg)?, output(&first, &reg)?);

    let mut o = opts(Duration::from_secs(10));
    o.exec.fallback = false;
    let Err(e) = run_graph(&g, &reg, &o) else {
        return Err("the run must fail without fallback".into());
    };
    assert_eq!(e.kind(), kind, "{e}");
    assert!(e.to_string().contains(needle), "{e}");
    Ok(())
}

#[test]
fn a_compile_failure_replans_the_node_and_keeps_the_device_and_its_weights() -> TestResult {
    one_op_fails(
        Mode::CompileFails("attention"),
        "attention",
        "attention.cu did not compile: test compiler error",
        tandem::ErrorKind::Compile,
    )
}

#[test]
fn out_of_memory_replans_the_node_and_keeps_the_device_and_its_weights() -> TestResult {
    // The experts node reads two weights: they were made resident before its launch failed.
    one_op_fails(
        Mode::OutOfMemory("moe_experts"),
        "moe_experts",
        "out of memory on fpga:0: 1099511627776 bytes requested, 1048576 bytes free",
        tandem::ErrorKind::ResourceExhausted,
    )
}

#[test]
fn without_fallback_the_failure_is_reported() -> TestResult {
    let reg = with(TestDevice::new(Mode::Fails));
    let mut o = opts(Duration::from_secs(10));
    o.exec.fallback = false;
    let Err(e) = run_graph(&small_layer()?, &reg, &o) else {
        return Err("the run must fail without fallback".into());
    };
    assert_eq!(e.kind(), tandem::ErrorKind::DeviceLost);
    assert!(e.to_string().contains("fell off the bus"), "{e}");
    Ok(())
}

#[test]
fn a_lost_device_is_dropped_and_takes_no_more_nodes() -> TestResult {
    let dev = TestDevice::new(Mode::Healthy);
    let reg = with(dev.clone());
    let g = small_layer()?;
    let ex = Executor::new();
    let o = opts(Duration::from_secs(10));
    run_graph_with(&ex, &g, &reg, &o)?;
    let before = *dev.launches.lock().map_err(|_| "lock")?;
    dev.set_mode(Mode::Fails);
    let lost = run_graph_with(&ex, &g, &reg, &o)?;
    // One launch failed; no later node was sent there, and its weights were dropped.
    assert_eq!(*dev.launches.lock().map_err(|_| "lock")?, before + 1);
    assert!(
        lost.report
            .nodes
            .iter()
            .all(|n| n.run.device == DeviceId::CPU)
    );
    assert_eq!(ex.resident().device_bytes(), 0);
    Ok(())
}

#[test]
fn healthy_second_device_runs_everything_and_data_migrates() -> TestResult {
    let dev = TestDevice::new(Mode::Healthy);
    let reg = with(dev.clone());
    let g = small_layer()?;
    let out = run_graph(&g, &reg, &opts(Duration::from_secs(10)))?;
    assert!(out.report.nodes.iter().all(|n| n.run.device == dev.id()));
    assert!(
        out.report
            .nodes
            .iter()
            .all(|n| n.run.launch.kernel.ends_with("_test"))
    );
    // Constants were uploaded once each (the weights counted apart, as made resident);
    // intermediate tensors never came back to the host until the check read them.
    assert_eq!(out.exec.transfer_bytes(), input_bytes(&g));
    assert_eq!(out.exec.resident_bytes(), weight_bytes(&g));
    assert_eq!(dev.uploaded(), input_bytes(&g) + weight_bytes(&g));
    assert!(out.report.output_rel_error.unwrap_or(1.0) < 1e-5);
    Ok(())
}

/// Bytes of the graph's weights.
fn weight_bytes(g: &tandem::graph::Graph) -> u64 {
    g.params
        .iter()
        .map(|p| g.constants[p].meta().bytes() as u64)
        .sum()
}

/// Bytes of the graph's per-run inputs.
fn input_bytes(g: &tandem::graph::Graph) -> u64 {
    g.constants
        .iter()
        .filter(|(n, _)| !g.is_param(n))
        .map(|(_, t)| t.meta().bytes() as u64)
        .sum()
}

fn output(out: &RunOutcome, reg: &DeviceRegistry) -> Result<Tensor> {
    out.exec.buffers[workload::OUTPUT].to_host(reg)
}

/// Every node ran on `dev`, and the layer output is within f32 rounding of the f64 chain.
fn ran_right(out: &RunOutcome, dev: &TestDevice) -> TestResult {
    for n in &out.report.nodes {
        assert_eq!(n.run.device, dev.id(), "{} ran elsewhere", n.run.node);
    }
    let e = out.report.output_rel_error.ok_or("no output error")?;
    assert!(e < 1e-5, "layer output rel. error {e:.2e}");
    Ok(())
}

#[test]
fn weights_stay_resident_between_executions() -> TestResult {
    let dev = TestDevice::new(Mode::Healthy);
    let reg = with(dev.clone());
    let g = small_layer()?;
    assert_eq!(g.params.len(), 9);
    assert!(!g.is_param("x"));
    let ex = Executor::new();
    let o = opts(Duration::from_secs(10));
    let first = run_graph_with(&ex, &g, &reg, &o)?;
    ran_right(&first, &dev)?;
    assert_eq!(first.exec.resident_bytes(), weight_bytes(&g));
    assert_eq!(first.report.weights_uploaded_bytes, weight_bytes(&g));
    assert_eq!(first.report.weights_resident_bytes, weight_bytes(&g));
    assert_eq!(ex.resident().device_bytes(), weight_bytes(&g));
    let after_first = dev.uploaded();

    // The second execution moves the input again, and no weight byte.
    let second = run_graph_with(&ex, &g, &reg, &o)?;
    ran_right(&second, &dev)?;
    assert_eq!(second.exec.resident_bytes(), 0);
    assert_eq!(second.report.weights_uploaded_bytes, 0);
    assert_eq!(second.exec.transfer_bytes(), input_bytes(&g));
    assert_eq!(dev.uploaded() - after_first, input_bytes(&g));
    assert_eq!(output(&second, &reg)?, output(&first, &reg)?);
    assert!(tandem::report::table(&second.report).contains("uploaded before this run"));

    // Evicting drops them: the next execution uploads them again.
    ex.evict_resident();
    assert!(ex.resident().is_empty());
    let third = run_graph_with(&ex, &g, &reg, &o)?;
    ran_right(&third, &dev)?;
    assert_eq!(third.exec.resident_bytes(), weight_bytes(&g));
    Ok(())
}

#[test]
fn warmup_uploads_the_weights_and_the_timed_run_does_not() -> TestResult {
    let dev = TestDevice::new(Mode::Healthy);
    let reg = with(dev.clone());
    let g = small_layer()?;
    let mut o = opts(Duration::from_secs(10));
    o.warmup = 1;
    let out = run_graph(&g, &reg, &o)?;
    ran_right(&out, &dev)?;
    assert_eq!(out.exec.resident_bytes(), 0);
    assert_eq!(out.exec.transfer_bytes(), input_bytes(&g));
    assert_eq!(out.report.weights_uploaded_bytes, weight_bytes(&g));
    // Two executions, the weights uploaded by the first only.
    assert_eq!(dev.uploaded(), 2 * input_bytes(&g) + weight_bytes(&g));
    let table = tandem::report::table(&out.report);
    let line = format!(
        "weights resident: {:.2} MB uploaded once (during warm-up",
        weight_bytes(&g) as f64 / 1e6
    );
    assert!(table.contains(&line), "{table}");
    let json = serde_json::to_value(&out.report)?;
    assert_eq!(json["weights_uploaded_bytes"], weight_bytes(&g));
    assert_eq!(json["nodes"][1]["resident_bytes"], 0);
    Ok(())
}

#[test]
fn changed_weights_are_uploaded_again_never_served_stale() -> TestResult {
    let dev = TestDevice::new(Mode::Healthy);
    let reg = with(dev.clone());
    let mut g = small_layer()?;
    let ex = Executor::new();
    let o = opts(Duration::from_secs(10));
    let first = run_graph_with(&ex, &g, &reg, &o)?;
    ran_right(&first, &dev)?;

    // Replace one weight through the graph, keeping the old graph (and its data) alive.
    let before = g.clone();
    let wq_bytes = g.constants["wq"].meta().bytes() as u64;
    let wq = g.constants["wq"].to_f32().mapv(|v| -2.0 * v);
    g.param("wq", Tensor::from_f32(wq));
    let second = run_graph_with(&ex, &g, &reg, &o)?;
    // ran_right checks against the f64 chain of the new weights: stale ones would be far off.
    ran_right(&second, &dev)?;
    assert_eq!(second.exec.resident_bytes(), wq_bytes);
    assert_ne!(output(&second, &reg)?, output(&first, &reg)?);
    // The same as a run that never saw the old weights.
    let cold = run_graph_with(&Executor::new(), &g, &reg, &o)?;
    assert_eq!(output(&second, &reg)?, output(&cold, &reg)?);
    // Both versions are resident side by side (as two layers with the same names would be).
    let old_again = run_graph_with(&ex, &before, &reg, &o)?;
    ran_right(&old_again, &dev)?;
    assert_eq!(old_again.exec.resident_bytes(), 0);
    assert_eq!(output(&old_again, &reg)?, output(&first, &reg)?);
    drop(before);

    // Change another in place: Arc::make_mut moves the data to a new allocation.
    let down_bytes = g.constants["down"].meta().bytes() as u64;
    let down = Arc::make_mut(g.constants.get_mut("down").ok_or("no down")?);
    *down = Tensor::from_f32(down.to_f32().mapv(|v| v * 0.5));
    let third = run_graph_with(&ex, &g, &reg, &o)?;
    ran_right(&third, &dev)?;
    assert_eq!(third.exec.resident_bytes(), down_bytes);
    // The replaced weights' entries are gone, not kept on the device.
    assert_eq!(ex.resident().len(), g.params.len());
    assert_eq!(ex.resident().device_bytes(), weight_bytes(&g));

    // A clone of the graph shares the host data, and so the resident weights.
    let fourth = run_graph_with(&ex, &g.clone(), &reg, &o)?;
    assert_eq!(fourth.exec.resident_bytes(), 0);
    Ok(())
}

#[test]
fn a_device_failure_leaves_no_stale_resident_weights() -> TestResult {
    let dev = TestDevice::new(Mode::Healthy);
    let reg = with(dev.clone());
    let g = small_layer()?;
    let ex = Executor::new();
    let o = opts(Duration::from_secs(10));
    let first = run_graph_with(&ex, &g, &reg, &o)?;
    ran_right(&first, &dev)?;

    // The device is lost on its first launch and reset: what it held is gone. The run
    // falls back to the CPU and stays right.
    dev.set_mode(Mode::Fails);
    let lost = run_graph_with(&ex, &g, &reg, &o)?;
    assert!(
        lost.report
            .nodes
            .iter()
            .all(|n| n.run.device == DeviceId::CPU)
    );
    assert!(lost.report.output_rel_error.unwrap_or(1.0) < 1e-5);
    assert_eq!(ex.resident().device_bytes(), 0);

    // Back to health: the weights are uploaded again (the old replicas would fail to read).
    dev.set_mode(Mode::Healthy);
    let again = run_graph_with(&ex, &g, &reg, &o)?;
    ran_right(&again, &dev)?;
    assert_eq!(again.exec.resident_bytes(), weight_bytes(&g));
    assert_eq!(output(&again, &reg)?, output(&first, &reg)?);
    Ok(())
}

#[test]
fn a_failed_upload_leaves_no_resident_entry_behind() -> TestResult {
    let dev = TestDevice::new(Mode::UploadFails);
    let reg = with(dev.clone());
    let g = small_layer()?;
    let ex = Executor::new();
    let o = opts(Duration::from_secs(10));
    let failed = run_graph_with(&ex, &g, &reg, &o)?;
    assert!(
        failed
            .report
            .nodes
            .iter()
            .all(|n| n.run.device == DeviceId::CPU)
    );
    assert!(failed.report.output_rel_error.unwrap_or(1.0) < 1e-5);
    assert_eq!(failed.report.weights_uploaded_bytes, 0);
    assert_eq!(ex.resident().device_bytes(), 0);

    dev.set_mode(Mode::Healthy);
    let ok = run_graph_with(&ex, &g, &reg, &o)?;
    ran_right(&ok, &dev)?;
    assert_eq!(ok.exec.resident_bytes(), weight_bytes(&g));
    assert_eq!(dev.uploaded(), input_bytes(&g) + weight_bytes(&g));
    Ok(())
}

#[test]
fn without_a_second_device_nothing_is_resident_off_the_host() -> TestResult {
    let reg = DeviceRegistry::cpu_only();
    let g = small_layer()?;
    let ex = Executor::new();
    let mut o = opts(Duration::from_secs(10));
    o.backend = BackendChoice::Only(tandem::DeviceKind::Cpu);
    o.warmup = 1;
    let out = run_graph_with(&ex, &g, &reg, &o)?;
    assert_eq!(out.exec.transfer_bytes(), 0);
    assert_eq!(out.report.weights_uploaded_bytes, 0);
    assert_eq!(out.report.weights_resident_bytes, 0);
    assert!(!tandem::report::table(&out.report).contains("weights resident"));
    assert!(out.report.output_rel_error.unwrap_or(1.0) < 1e-5);
    Ok(())
}

#[test]
fn buffer_replicas_follow_reads_and_writes() -> TestResult {
    let dev = TestDevice::new(Mode::Healthy);
    let reg = with(dev.clone());
    let t = Tensor::from_vec_f32(&[2, 3], vec![1., 2., 3., 4., 5., 6.])?;
    let b = Buffer::from_host("t", t.clone());
    assert_eq!(b.valid_on(), vec![DeviceId::CPU]);
    let on_dev = b
        .acquire(&reg, dev.id(), Access::Read)?
        .ok_or("no replica")?;
    assert_eq!(dev.download(&on_dev)?, t);
    assert_eq!(b.valid_on().len(), 2);
    assert_eq!(b.stats().uploaded, 24);
    // A second read does not copy again.
    b.acquire(&reg, dev.id(), Access::Read)?;
    assert_eq!(b.stats().uploaded, 24);
    // Writing on the device invalidates the host copy; reading on the host downloads.
    let t2 = Tensor::from_vec_f32(&[2, 3], vec![0.; 6])?;
    b.set_written(dev.upload(&t2)?)?;
    assert_eq!(b.valid_on(), vec![dev.id()]);
    assert_eq!(b.to_host(&reg)?, t2);
    assert_eq!(b.stats().downloaded, 24);
    // A write of the wrong shape is refused.
    let bad = dev.upload(&Tensor::from_vec_f32(&[3], vec![0.; 3])?)?;
    assert!(b.set_written(bad).is_err());
    // Reading a buffer nothing wrote is an error, not garbage.
    let empty = Buffer::empty("e", TensorMeta::new(vec![2], DType::F32));
    assert!(empty.acquire(&reg, DeviceId::CPU, Access::Read).is_err());
    Ok(())
}
