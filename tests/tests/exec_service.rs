//! The executor service under many requests: 16 threads submitting 50 different small
//! workloads each at once, every result equal to a single-threaded run of the same request;
//! back-pressure (a full queue refuses `try_submit` and makes `submit` wait); a failed
//! request failing only itself; dropping the service finishing the requests in flight.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem::backend::{
    Backend, DeviceId, DeviceInfo, DeviceKind, DeviceStorage, Launch, LaunchInfo, Support,
};
use tandem::bench::random_tensor;
use tandem::exec::{ExecOptions, Executor, Prepared, Service, ServiceOptions, fetch};
use tandem::graph::Graph;
use tandem::ops::{Activation, LinearParams, RmsNormParams};
use tandem::plan::{BackendChoice, plan_with_history};
use tandem::sync::Completion;
use tandem::{DType, DeviceRegistry, Error, ErrorKind, Op, Result, Tensor, TensorMeta};
use tandem_tests::TestResult;

/// A small random workload, different for every seed: a linear layer (random sizes,
/// activation, bias or not), then an RMSNorm with or without a residual, or an add.
fn random_request(seed: u64) -> Result<Graph> {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    let (m, k, n) = (r.gen_range(1..12), r.gen_range(1..40), r.gen_range(1..40));
    let act = [
        Activation::None,
        Activation::Relu,
        Activation::Gelu,
        Activation::Silu,
    ][r.gen_range(0..4)];
    let bias = r.gen_bool(0.5);
    let mut g = Graph::default();
    g.constant("x", random_tensor(&[m, k], 1.0, seed)?);
    g.param("w", random_tensor(&[n, k], 0.3, seed + 1)?);
    let mut ins = vec!["x", "w"];
    if bias {
        g.param("b", random_tensor(&[n], 0.1, seed + 2)?);
        ins.push("b");
    }
    let y = g.add(
        "lin",
        Op::Linear(LinearParams {
            act,
            bias,
            f32_out: false,
        }),
        &ins,
    );
    let out = match r.gen_range(0..3) {
        0 => {
            g.param("g", random_tensor(&[n], 1.0, seed + 3)?);
            g.add(
                "norm",
                Op::RmsNorm(RmsNormParams {
                    residual: false,
                    ..RmsNormParams::default()
                }),
                &[&y[0], "g"],
            )
        }
        1 => {
            g.param("g", random_tensor(&[n], 1.0, seed + 3)?);
            g.constant("res", random_tensor(&[m, n], 1.0, seed + 4)?);
            g.add(
                "norm",
                Op::RmsNorm(RmsNormParams {
                    residual: true,
                    ..RmsNormParams::default()
                }),
                &[&y[0], "g", "res"],
            )
        }
        _ => {
            g.constant("z", random_tensor(&[m, n], 1.0, seed + 5)?);
            g.add("sum", Op::Add, &[&y[0], "z"])
        }
    };
    g.outputs = out;
    Ok(g)
}

fn outputs_of(
    exec: &tandem::exec::Execution,
    reg: &DeviceRegistry,
    g: &Graph,
) -> Result<Vec<Vec<f32>>> {
    fetch(exec, reg, &g.outputs)?
        .iter()
        .map(|t| Ok(t.to_f64().iter().map(|&v| v as f32).collect()))
        .collect()
}

#[test]
fn sixteen_threads_of_fifty_requests_each_get_their_own_results() -> TestResult {
    const THREADS: u64 = 16;
    const PER_THREAD: u64 = 50;
    let reg = DeviceRegistry::cpu_only();
    let mut requests = Vec::new();
    for s in 0..THREADS * PER_THREAD {
        let g = random_request(1000 + 17 * s)?;
        let plan = plan_with_history(&g, &reg, BackendChoice::Only(DeviceKind::Cpu), None)?;
        requests.push((g, plan));
    }
    // Single-threaded: one request at a time, on executors of their own.
    let opts = ExecOptions::default();
    let mut expected = Vec::new();
    for (g, plan) in &requests {
        let e = Executor::new().execute(g, plan, &reg, &opts)?;
        expected.push(outputs_of(&e, &reg, g)?);
    }
    // Concurrent: 16 threads submitting to one service whose queue is smaller than the
    // number of threads, so submits also wait for room.
    let service = Service::new(&reg, ServiceOptions { queue_depth: 6 })?;
    let got: Vec<Vec<(usize, Vec<Vec<f32>>)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS as usize)
            .map(|t| {
                let (service, requests, reg, opts) = (&service, &requests, &reg, &opts);
                scope.spawn(move || -> Result<Vec<(usize, Vec<Vec<f32>>)>> {
                    // Submit several before waiting, so one thread has requests in flight
                    // together too.
                    let mut out = Vec::new();
                    let mine: Vec<usize> = (0..PER_THREAD as usize)
                        .map(|i| t * PER_THREAD as usize + i)
                        .collect();
                    for chunk in mine.chunks(3) {
                        let mut tickets = Vec::new();
                        for &i in chunk {
                            let (g, plan) = &requests[i];
                            let p = Arc::new(Prepared::new(g, plan)?);
                            tickets.push((i, service.submit(p, opts)?));
                        }
                        for (i, ticket) in tickets {
                            let e = ticket.wait()?;
                            assert_eq!(e.runs.len(), requests[i].0.nodes.len());
                            out.push((i, outputs_of(&e, reg, &requests[i].0)?));
                        }
                    }
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| Error::Internal("a client thread panicked".into()))?
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let mut seen = vec![false; requests.len()];
    for (i, outs) in got.into_iter().flatten() {
        assert!(!seen[i], "request {i} answered twice");
        seen[i] = true;
        assert_eq!(outs.len(), expected[i].len(), "request {i}");
        for (o, e) in outs.iter().zip(&expected[i]) {
            assert_eq!(o.len(), e.len(), "request {i}");
            assert!(o.iter().all(|v| v.is_finite()), "request {i}");
            let diff = o
                .iter()
                .zip(e)
                .map(|(a, b)| f64::from(a - b).powi(2))
                .sum::<f64>()
                .sqrt();
            let norm = e.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
            assert!(
                diff <= 1e-6 * norm.max(1e-30),
                "request {i}: ||out-single||/||single|| = {}",
                diff / norm
            );
        }
    }
    assert!(seen.iter().all(|s| *s), "some requests never answered");
    assert_eq!(service.in_flight(), 0);
    Ok(())
}

/// A device whose launches wait until the test opens its gate, and fail for ops named
/// `fail_op` with an error the CPU could not avoid (a bad input).
#[derive(Debug)]
struct GateDevice {
    info: DeviceInfo,
    open: Mutex<bool>,
    opened: Condvar,
    fail_op: Option<&'static str>,
}

impl GateDevice {
    fn new(open: bool, fail_op: Option<&'static str>) -> Arc<Self> {
        Arc::new(Self {
            info: DeviceInfo {
                id: DeviceId {
                    kind: DeviceKind::FpgaXrt,
                    index: 0,
                },
                name: "gated test device".into(),
                memory_bytes: 1 << 30,
                peak_flops: 1e18,
                peak_bandwidth: 1e15,
                compute_dtype: DType::F32,
                details: Vec::new(),
            },
            open: Mutex::new(open),
            opened: Condvar::new(),
            fail_op,
        })
    }

    fn open(&self) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.opened.notify_all();
    }
}

impl Backend for GateDevice {
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
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        while !*open {
            open = self.opened.wait(open).unwrap_or_else(|e| e.into_inner());
        }
        drop(open);
        if Some(op.name()) == self.fail_op {
            return Err(Error::invalid(op.name(), "refused by the test device"));
        }
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
            info: Arc::new(Mutex::new(LaunchInfo::default())),
        })
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

fn gated_registry(dev: Arc<GateDevice>) -> DeviceRegistry {
    let mut reg = DeviceRegistry::cpu_only();
    reg.add(dev);
    reg
}

fn on_gate(g: &Graph, reg: &DeviceRegistry) -> Result<Arc<Prepared>> {
    let plan = plan_with_history(g, reg, BackendChoice::Only(DeviceKind::FpgaXrt), None)?;
    assert!(
        plan.placements
            .iter()
            .all(|p| p.device.kind == DeviceKind::FpgaXrt)
    );
    Ok(Arc::new(Prepared::new(g, &plan)?))
}

#[test]
fn a_full_queue_refuses_try_submit_and_makes_submit_wait() -> TestResult {
    let dev = GateDevice::new(false, None);
    let reg = gated_registry(dev.clone());
    let service = Service::new(&reg, ServiceOptions { queue_depth: 1 })?;
    let opts = ExecOptions::default();
    let (ga, gb) = (random_request(1)?, random_request(2)?);
    let (a, b) = (on_gate(&ga, &reg)?, on_gate(&gb, &reg)?);
    // A cannot finish while the gate is shut: the queue stays full.
    let ta = service.submit(a, &opts)?;
    assert_eq!(service.in_flight(), 1);
    let e = service
        .try_submit(b.clone(), &opts)
        .expect_err("queue full");
    assert_eq!(e.kind(), ErrorKind::ResourceExhausted);
    assert!(matches!(e, Error::QueueFull { capacity: 1, .. }), "{e}");
    assert!(e.to_string().contains("full"), "{e}");
    std::thread::scope(|scope| -> TestResult {
        let (tx, rx) = std::sync::mpsc::channel();
        let (service, opts) = (&service, &opts);
        let h = scope.spawn(move || -> Result<Vec<Tensor>> {
            let t = service.submit(b, opts)?;
            let _ = tx.send(());
            let e = t.wait()?;
            fetch(&e, service.registry(), &gb.outputs)
        });
        // The submit waits for room while A holds the queue.
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        assert!(!ta.is_done());
        dev.open();
        let ea = ta.wait()?;
        let b_out = h
            .join()
            .map_err(|_| Error::Internal("submitter panicked".into()))??;
        assert!(rx.recv_timeout(Duration::from_secs(60)).is_ok());
        // Both right: equal to single-threaded runs on the CPU.
        let cpu = DeviceRegistry::cpu_only();
        for (g, got) in [
            (&ga, fetch(&ea, &reg, &ga.outputs)?),
            (&random_request(2)?, b_out),
        ] {
            let plan = plan_with_history(g, &cpu, BackendChoice::Only(DeviceKind::Cpu), None)?;
            let want = Executor::new().execute(g, &plan, &cpu, &ExecOptions::default())?;
            let want = fetch(&want, &cpu, &g.outputs)?;
            // The test device computes with the plain CPU code, the CPU backend through its
            // BLAS: equal up to f32 rounding.
            for (w, o) in want.iter().zip(&got) {
                let (w, o) = (w.to_f64(), o.to_f64());
                assert_eq!(w.shape(), o.shape());
                let e = tandem::tensor::rel_error(&o, &w);
                assert!(e <= 1e-5, "||out-cpu||/||cpu|| = {e}");
            }
        }
        Ok(())
    })?;
    Ok(())
}

#[test]
fn a_failed_request_fails_only_itself() -> TestResult {
    let dev = GateDevice::new(true, Some("add"));
    let reg = gated_registry(dev);
    let service = Service::new(&reg, ServiceOptions { queue_depth: 8 })?;
    let opts = ExecOptions::default();
    // Requests whose last op is an add fail on the device (a bad input: not moved to the
    // CPU); the others must come back whole.
    let mut tickets = Vec::new();
    for s in 0..24u64 {
        let g = random_request(500 + s)?;
        let fails = g.nodes.iter().any(|n| n.op == Op::Add);
        tickets.push((g.clone(), fails, service.submit(on_gate(&g, &reg)?, &opts)?));
    }
    let (mut failed, mut ok) = (0, 0);
    for (g, fails, t) in tickets {
        match t.wait() {
            Err(e) => {
                assert!(fails, "an unaffected request failed: {e}");
                assert_eq!(e.kind(), ErrorKind::InvalidArgument);
                assert!(e.to_string().contains("node 'sum'"), "{e}");
                failed += 1;
            }
            Ok(e) => {
                assert!(!fails, "a request with an add succeeded");
                let outs = fetch(&e, &reg, &g.outputs)?;
                assert!(
                    outs.iter()
                        .all(|t| t.to_f64().iter().all(|v| v.is_finite()))
                );
                ok += 1;
            }
        }
    }
    assert!(failed > 0 && ok > 0, "failed {failed}, ok {ok}");
    Ok(())
}

#[test]
fn dropping_the_service_finishes_the_requests_in_flight() -> TestResult {
    let dev = GateDevice::new(false, None);
    let reg = gated_registry(dev.clone());
    let service = Service::new(&reg, ServiceOptions { queue_depth: 4 })?;
    let g = random_request(9)?;
    let t = service.submit(on_gate(&g, &reg)?, &ExecOptions::default())?;
    let opener = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        dev.open();
    });
    drop(service);
    // The drop waited for the request: it is finished, with its result.
    assert!(t.is_done());
    let e = t.wait()?;
    assert_eq!(e.runs.len(), g.nodes.len());
    opener
        .join()
        .map_err(|_| Error::Internal("opener panicked".into()))?;
    Ok(())
}
