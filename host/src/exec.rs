//! The executor: a worker thread per device, nodes dispatched as their inputs become ready,
//! transfers done by the worker of the device that needs the data (so they overlap with
//! compute on the other devices), and failures re-planned onto the CPU. An [`Executor`] keeps
//! the graph's parameters (weights) resident on the devices from one execution to the next.
//!
//! A failure is judged by its [`ErrorKind`]: a lost device (or one past its timeout) takes no
//! more nodes and drops its resident weights; any other device failure (a kernel that did not
//! compile, a refused argument, out of memory, an unsupported op) moves only that node to the
//! CPU, and the device keeps its weights and its later nodes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, unbounded};
use serde::Serialize;

use crate::backend::{Backend, DeviceId, DeviceRegistry, LaunchInfo};
use crate::error::{Error, ErrorKind, Result};
use crate::graph::Graph;
use crate::memory::{Access, Buffer};
use crate::plan::Plan;
use crate::resident::ResidentCache;
use crate::sync::Deadline;
use crate::tensor::Tensor;

/// Options of a run.
#[derive(Debug, Clone)]
pub struct ExecOptions {
    /// Longest wait for one op's completion.
    pub timeout: Duration,
    /// Re-run an op on the CPU when its device fails with an error the CPU can avoid.
    pub fallback: bool,
}

impl Default for ExecOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(300),
            fallback: true,
        }
    }
}

/// What happened to one node.
#[derive(Debug, Clone, Serialize)]
pub struct NodeRun {
    /// Node name.
    pub node: String,
    /// Op family.
    pub op: String,
    /// Device it finally ran on.
    pub device: DeviceId,
    /// Kernel and device timing.
    #[serde(flatten)]
    pub launch: LaunchInfo,
    /// When its input transfers began, from the start of the run.
    pub start: Duration,
    /// Wall time of the launch and its wait (excludes input transfers).
    pub wall: Duration,
    /// Wall time of moving its inputs to the device, resident parameters (weights) excluded.
    pub transfer: Duration,
    /// Wall time of making its parameters resident on the device (zero where they were).
    pub resident_transfer: Duration,
    /// Bytes moved to the device for its inputs, resident parameters (weights) excluded.
    pub transfer_bytes: u64,
    /// Bytes moved to the device to make its parameters (weights) resident there: non-zero
    /// only where a weight was not resident yet (first use on the device, changed weights, or
    /// after the device failed).
    pub resident_bytes: u64,
    /// Why it ran elsewhere than planned, if it did.
    pub fallback: Option<String>,
}

/// The result of executing a graph.
#[derive(Debug)]
pub struct Execution {
    /// Every tensor of the run, by name. The parameters' buffers are the executor's resident
    /// ones, shared with later executions: read them, never write them.
    pub buffers: BTreeMap<String, Arc<Buffer>>,
    /// Node runs in graph order.
    pub runs: Vec<NodeRun>,
    /// Wall time of the whole run.
    pub wall: Duration,
}

impl Execution {
    /// Bytes uploaded in this execution to make parameters resident (see
    /// [`NodeRun::resident_bytes`]).
    pub fn resident_bytes(&self) -> u64 {
        self.runs.iter().map(|r| r.resident_bytes).sum()
    }

    /// Bytes moved to devices for inputs other than resident parameters.
    pub fn transfer_bytes(&self) -> u64 {
        self.runs.iter().map(|r| r.transfer_bytes).sum()
    }
}

/// Runs graphs, keeping their parameters (weights, [`Graph::params`]) resident on the devices
/// across executions: the first execution that needs a weight on a device uploads it, later
/// ones reuse that replica as long as the graph holds the same host data (replaced weights are
/// uploaded again). Inputs and activations are moved on every execution. A device that is
/// lost (or past its timeout) loses its resident replicas; other failures keep them.
#[derive(Debug, Default)]
pub struct Executor {
    resident: ResidentCache,
}

impl Executor {
    /// An executor with nothing resident.
    pub fn new() -> Self {
        Self::default()
    }

    /// The resident parameter buffers (how many, how many bytes on devices).
    pub fn resident(&self) -> &ResidentCache {
        &self.resident
    }

    /// Drops every resident parameter: the next execution uploads the weights again. Device
    /// memory is freed once no [`Execution`] still holds the buffers.
    pub fn evict_resident(&self) {
        self.resident.clear();
    }

    /// Runs `graph` as `plan` places it.
    pub fn execute(
        &self,
        graph: &Graph,
        plan: &Plan,
        reg: &DeviceRegistry,
        opts: &ExecOptions,
    ) -> Result<Execution> {
        execute_with(graph, plan, reg, opts, &self.resident)
    }
}

struct Job {
    index: usize,
    device: DeviceId,
}

struct Done {
    index: usize,
    result: Result<NodeRun>,
}

/// Runs `graph` as `plan` places it, on an [`Executor`] of its own: nothing stays resident
/// afterwards, so every call uploads the weights again.
pub fn execute(
    graph: &Graph,
    plan: &Plan,
    reg: &DeviceRegistry,
    opts: &ExecOptions,
) -> Result<Execution> {
    Executor::new().execute(graph, plan, reg, opts)
}

fn execute_with(
    graph: &Graph,
    plan: &Plan,
    reg: &DeviceRegistry,
    opts: &ExecOptions,
    resident: &ResidentCache,
) -> Result<Execution> {
    let metas = graph.validate()?;
    resident.prune();
    let mut buffers: BTreeMap<String, Arc<Buffer>> = BTreeMap::new();
    for (name, t) in &graph.constants {
        let b = if graph.is_param(name) {
            resident.buffer(name, t)
        } else {
            Arc::new(Buffer::from_host(name, (**t).clone()))
        };
        buffers.insert(name.clone(), b);
    }
    for node in &graph.nodes {
        for o in &node.outputs {
            buffers.insert(o.clone(), Arc::new(Buffer::empty(o, metas[o].clone())));
        }
    }
    let deps = graph.dependencies();
    let mut waiting: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); graph.nodes.len()];
    for (i, d) in deps.iter().enumerate() {
        for &j in d {
            dependents[j].push(i);
        }
    }
    let t0 = Instant::now();
    let (done_tx, done_rx) = unbounded::<Done>();
    let mut runs: Vec<Option<NodeRun>> = vec![None; graph.nodes.len()];
    let mut device_of: Vec<DeviceId> = plan.placements.iter().map(|p| p.device).collect();
    let mut failed_devices: BTreeMap<DeviceId, String> = BTreeMap::new();
    let mut fallback_note: BTreeMap<usize, String> = BTreeMap::new();

    std::thread::scope(|scope| -> Result<()> {
        let mut senders: BTreeMap<DeviceId, Sender<Job>> = BTreeMap::new();
        for b in reg.backends() {
            let (tx, rx) = unbounded::<Job>();
            senders.insert(b.id(), tx);
            let done_tx = done_tx.clone();
            let backend = b.clone();
            let buffers = &buffers;
            scope.spawn(move || worker(backend, rx, done_tx, graph, buffers, reg, opts, t0));
        }
        let send = |senders: &BTreeMap<DeviceId, Sender<Job>>, index: usize, device: DeviceId| {
            senders
                .get(&device)
                .ok_or_else(|| Error::Internal(format!("no worker for {device}")))?
                .send(Job { index, device })
                .map_err(|_| Error::Internal(format!("worker of {device} stopped")))
        };
        let mut outstanding = 0usize;
        for i in 0..graph.nodes.len() {
            if waiting[i] == 0 {
                send(&senders, i, device_of[i])?;
                outstanding += 1;
            }
        }
        let mut finished = 0usize;
        let result = loop {
            if finished == graph.nodes.len() {
                break Ok(());
            }
            if outstanding == 0 {
                break Err(Error::Internal("the graph has a cycle".into()));
            }
            let Ok(d) = done_rx.recv() else {
                break Err(Error::Internal("all workers stopped".into()));
            };
            outstanding -= 1;
            match d.result {
                Ok(mut run) => {
                    run.fallback = fallback_note.remove(&d.index);
                    runs[d.index] = Some(run);
                    finished += 1;
                    for &j in &dependents[d.index] {
                        waiting[j] -= 1;
                        if waiting[j] == 0 {
                            let mut dev = device_of[j];
                            if let Some(why) = failed_devices.get(&dev) {
                                fallback_note.insert(j, format!("{dev} failed earlier: {why}"));
                                dev = DeviceId::CPU;
                                device_of[j] = dev;
                            }
                            send(&senders, j, dev)?;
                            outstanding += 1;
                        }
                    }
                }
                Err(e) => {
                    let dev = device_of[d.index];
                    let lost = device_lost(e.kind());
                    if lost && dev != DeviceId::CPU {
                        // Its resident replicas may be gone or half-written: upload again.
                        let n = resident.forget_device(dev);
                        tracing::debug!(%dev, replicas = n, "dropped resident weights");
                    }
                    if opts.fallback && recoverable(e.kind()) && dev != DeviceId::CPU {
                        tracing::warn!(node = %graph.nodes[d.index].name, %dev, error = %e, "re-planning onto the CPU");
                        if lost {
                            failed_devices.insert(dev, e.to_string());
                        }
                        fallback_note.insert(d.index, format!("{dev} failed: {e}"));
                        device_of[d.index] = DeviceId::CPU;
                        send(&senders, d.index, DeviceId::CPU)?;
                        outstanding += 1;
                    } else {
                        let name = &graph.nodes[d.index].name;
                        break Err(match e.kind() {
                            ErrorKind::InvalidArgument => {
                                Error::invalid(format!("node '{name}' on {dev}"), e.to_string())
                            }
                            _ => e,
                        });
                    }
                }
            }
        };
        // Closing the job channels stops the workers.
        drop(senders);
        result
    })?;
    let wall = t0.elapsed();
    let runs = runs
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            r.ok_or_else(|| Error::Internal(format!("node {} never ran", graph.nodes[i].name)))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Execution {
        buffers,
        runs,
        wall,
    })
}

/// Whether a failure of this kind means the device is gone: it takes no more nodes and its
/// resident replicas are dropped. A lost device, and one that did not finish in time (its work
/// may still be running and writing its memory). A compile failure, a refused argument, an
/// unsupported op or exhausted memory concern one op: the device keeps its weights and its
/// later nodes.
fn device_lost(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::DeviceLost | ErrorKind::DeadlineExceeded)
}

/// Whether a node failing with this kind can run on the CPU instead. A bad input
/// (`InvalidArgument`) would fail there too; a bug (`Internal`) is reported.
fn recoverable(kind: ErrorKind) -> bool {
    match kind {
        ErrorKind::Unavailable
        | ErrorKind::Unimplemented
        | ErrorKind::Compile
        | ErrorKind::BadArgument
        | ErrorKind::ResourceExhausted
        | ErrorKind::DeadlineExceeded
        | ErrorKind::DeviceLost => true,
        ErrorKind::InvalidArgument | ErrorKind::Internal => false,
    }
}

#[allow(clippy::too_many_arguments)]
fn worker(
    backend: Arc<dyn Backend>,
    jobs: Receiver<Job>,
    done: Sender<Done>,
    graph: &Graph,
    buffers: &BTreeMap<String, Arc<Buffer>>,
    reg: &DeviceRegistry,
    opts: &ExecOptions,
    t0: Instant,
) {
    for job in jobs.iter() {
        let start = t0.elapsed();
        let result = run_node(&*backend, job.device, job.index, graph, buffers, reg, opts)
            .map(|r| NodeRun { start, ..r });
        if done
            .send(Done {
                index: job.index,
                result,
            })
            .is_err()
        {
            return;
        }
    }
}

fn run_node(
    backend: &dyn Backend,
    device: DeviceId,
    index: usize,
    graph: &Graph,
    buffers: &BTreeMap<String, Arc<Buffer>>,
    reg: &DeviceRegistry,
    opts: &ExecOptions,
) -> Result<NodeRun> {
    let node = &graph.nodes[index];
    let buf = |n: &str| {
        buffers
            .get(n)
            .ok_or_else(|| Error::Internal(format!("no buffer '{n}'")))
    };
    let (mut transfer, mut resident_transfer) = (Duration::ZERO, Duration::ZERO);
    let (mut transfer_bytes, mut resident_bytes) = (0u64, 0u64);
    let mut inputs = Vec::with_capacity(node.inputs.len());
    for name in &node.inputs {
        let t_in = Instant::now();
        let (s, moved) = buf(name)?.acquire_counted(reg, device, Access::Read)?;
        let s = s.ok_or_else(|| Error::Internal(format!("'{name}' has no data on {device}")))?;
        if graph.is_param(name) {
            resident_transfer += t_in.elapsed();
            resident_bytes += moved.uploaded + moved.peer + moved.downloaded;
        } else {
            transfer += t_in.elapsed();
            // Copies toward this device: uploads, peer copies, and downloads for the host.
            transfer_bytes += moved.uploaded + moved.peer + moved.downloaded;
        }
        inputs.push(s);
    }
    let refs: Vec<_> = inputs.iter().collect();
    let t0 = Instant::now();
    let what = format!("{} ({}) on {device}", node.name, node.op.name());
    let deadline = Deadline::after(opts.timeout);
    let launch = backend
        .launch_within(&node.op, &refs, &deadline)
        .map_err(|e| match e {
            // Name the node, as the wait below does.
            Error::Timeout { timeout, .. } => Error::Timeout {
                what: what.clone(),
                timeout,
            },
            e => e,
        })?;
    launch.done.wait(deadline.remaining(), &what)?;
    let wall = t0.elapsed();
    if launch.outputs.len() != node.outputs.len() {
        return Err(Error::Internal(format!(
            "{device} returned {} outputs for {}, expected {}",
            launch.outputs.len(),
            node.op.name(),
            node.outputs.len()
        )));
    }
    for (name, s) in node.outputs.iter().zip(launch.outputs) {
        buf(name)?.set_written_in(reg, s)?;
    }
    let info = launch
        .info
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    Ok(NodeRun {
        node: node.name.clone(),
        op: node.op.name().to_string(),
        device,
        launch: info,
        start: Duration::ZERO,
        wall,
        transfer,
        resident_transfer,
        transfer_bytes,
        resident_bytes,
        fallback: None,
    })
}

/// Host copies of the named tensors of an execution.
pub fn fetch(exec: &Execution, reg: &DeviceRegistry, names: &[String]) -> Result<Vec<Tensor>> {
    names
        .iter()
        .map(|n| {
            exec.buffers
                .get(n)
                .ok_or_else(|| Error::invalid("run", format!("no tensor named '{n}'")))?
                .to_host(reg)
        })
        .collect()
}
