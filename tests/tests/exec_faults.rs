//! The executor and `Buffer` with devices that misbehave: a device that fails every launch,
//! one that never completes (timeout), and a healthy second device (data migrates through
//! host memory and is counted). Results must stay right and say where they ran.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tandem::backend::{
    Backend, DeviceId, DeviceInfo, DeviceKind, DeviceStorage, Launch, LaunchInfo, Support,
};
use tandem::exec::ExecOptions;
use tandem::memory::{Access, Buffer};
use tandem::plan::BackendChoice;
use tandem::run::{RunOptions, run_graph};
use tandem::sync::{Completion, Fence};
use tandem::workload::{self, MixtralConfig};
use tandem::{DType, DeviceRegistry, Error, Op, Result, Tensor, TensorMeta};
use tandem_tests::TestResult;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Runs ops with the CPU code, storing tensors as its own replicas.
    Healthy,
    /// Every launch fails as a lost device would.
    Fails,
    /// Launches never complete.
    Hangs,
}

/// A test device that claims to be very fast, so the planner gives it every op.
#[derive(Debug)]
struct TestDevice {
    info: DeviceInfo,
    mode: Mode,
    launches: Mutex<usize>,
}

impl TestDevice {
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
            mode,
            launches: Mutex::new(0),
        })
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
        Ok(DeviceStorage::new(self.id(), host.meta(), host.clone()))
    }
    fn download(&self, s: &DeviceStorage) -> Result<Tensor> {
        s.downcast::<Tensor>()
            .cloned()
            .ok_or_else(|| Error::Internal("foreign storage".into()))
    }
    fn launch(&self, op: &Op, inputs: &[&DeviceStorage]) -> Result<Launch> {
        *self
            .launches
            .lock()
            .map_err(|_| Error::Internal("lock".into()))? += 1;
        match self.mode {
            Mode::Fails => Err(Error::Device {
                device: self.id().to_string(),
                msg: "test error 'LOST' (1): the device fell off the bus".into(),
            }),
            Mode::Hangs => Ok(Launch {
                outputs: Vec::new(),
                done: Completion::new(Fence::new(), 1),
                info: Arc::new(Mutex::new(LaunchInfo::default())),
            }),
            Mode::Healthy => {
                let ts: Vec<Tensor> = inputs
                    .iter()
                    .map(|s| self.download(s))
                    .collect::<Result<_>>()?;
                let refs: Vec<&Tensor> = ts.iter().collect();
                let outs = op.run_cpu(&refs)?;
                Ok(Launch {
                    outputs: outs
                        .into_iter()
                        .map(|t| DeviceStorage::new(self.id(), t.meta(), t))
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
        backend_label: "fpga".into(),
        exec: ExecOptions {
            timeout,
            fallback: true,
        },
        check: true,
        workload: "faults".into(),
        history: None,
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
    let t = std::time::Instant::now();
    let out = run_graph(&small_layer()?, &reg, &opts(Duration::from_millis(200)))?;
    assert!(t.elapsed() < Duration::from_secs(30));
    assert_eq!(*dev.launches.lock().map_err(|_| "lock")?, 1);
    let note = out.report.nodes[0].run.fallback.clone().unwrap_or_default();
    assert!(note.contains("did not finish within"), "{note}");
    assert!(out.report.output_rel_error.unwrap_or(1.0) < 1e-5);
    Ok(())
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
    // Constants were uploaded once each; intermediate tensors never came back to the host
    // until the check read them.
    let uploaded: u64 = out.report.nodes.iter().map(|n| n.run.transfer_bytes).sum();
    let constants: u64 = g.constants.values().map(|t| t.meta().bytes() as u64).sum();
    assert_eq!(uploaded, constants);
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
