//! The state of one execution: its buffers, per-node dependency counters and results, what
//! failed; how a worker runs one node of it (`step`) and how the caller collects it
//! ([`Ticket`]).

use std::collections::{BTreeMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded};

use super::buffers::Slab;
use super::prepared::{Prepared, Role, Source};
use super::queue::Permit;
use super::runs::{NodeRuns, RunSlots};
use super::worker::Router;
use super::{Buffers, ExecOptions, Execution, NodeName, NodeRun};
use crate::backend::{Backend, DeviceId, DeviceRegistry, DeviceStorage, Launch, LaunchInfo};
use crate::error::{Error, ErrorKind, Result};
use crate::memory::Access;
use crate::ops::Op;
use crate::resident::ResidentCache;
use crate::sync::{Completion, Deadline};

/// What went wrong so far in an execution (touched only once something failed).
#[derive(Default)]
struct Trouble {
    /// Devices lost during this execution: their later nodes run on the CPU.
    failed_devices: BTreeMap<DeviceId, String>,
    /// Nodes moved off their planned device.
    moved: BTreeMap<u32, DeviceId>,
    /// Why each moved node runs elsewhere.
    notes: BTreeMap<u32, String>,
    /// The error that ends the execution.
    error: Option<Error>,
}

/// A node launched on a device that runs its launches in order
/// ([`Backend::orders_launches`]), its dependents on that device queued behind it: what is
/// left to do once it completes.
pub(crate) struct Queued {
    node: u32,
    /// Its record, the launch's timing and its wall still to come.
    run: NodeRun,
    done: Completion,
    info: Arc<Mutex<LaunchInfo>>,
    /// How errors name it.
    what: String,
    deadline: Deadline,
    t0: Instant,
    /// Its inputs, held until its work ran: no replica of them is evicted and no block of
    /// theirs reused meanwhile.
    inputs: Vec<DeviceStorage>,
    /// Its dependents on other devices: handed on once it completed.
    later: Vec<u32>,
}

/// The launches a worker has queued and not yet seen complete, oldest first; they complete
/// in this order (one stream per device).
pub(crate) type Pending = VecDeque<Queued>;

/// How a node's launch went.
enum Ran {
    /// Finished (or run on the host): its dependents may go.
    Done(NodeRun),
    /// Queued on an in-order device, outputs written: dependents on that device may launch
    /// behind it; it finishes in [`RunState::resolve`].
    Queued(Queued),
}

/// One execution in progress.
pub(crate) struct RunState {
    prep: Arc<Prepared>,
    reg: Arc<DeviceRegistry>,
    opts: ExecOptions,
    resident: Arc<ResidentCache>,
    buffers: Arc<Slab>,
    waiting: Vec<AtomicU32>,
    /// Per node (empty where the graph has no fusable group): whether it ran a fused unit
    /// (set before its dependents are released, so its members see it).
    fused: Vec<AtomicBool>,
    /// Nodes handed to a worker and not finished: the execution ends when it reaches 0.
    in_flight: AtomicUsize,
    runs: Arc<RunSlots>,
    /// Set once anything failed: nodes then consult `trouble`.
    troubled: AtomicBool,
    /// Set when the execution failed: remaining nodes are skipped.
    aborted: AtomicBool,
    trouble: Mutex<Trouble>,
    t0: Instant,
    wall: OnceLock<Duration>,
    done: Sender<()>,
    permit: Mutex<Option<Permit>>,
}

/// An execution handed to the workers: [`Ticket::wait`] returns its result.
#[must_use = "a ticket is how the result comes back"]
pub struct Ticket {
    run: Arc<RunState>,
    done: Receiver<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl RunState {
    /// Sets up the buffers of `prep` (parameters from `resident`) and hands its ready nodes to
    /// the workers. `permit` is released when the execution finishes.
    pub fn start(
        prep: Arc<Prepared>,
        reg: Arc<DeviceRegistry>,
        opts: ExecOptions,
        resident: Arc<ResidentCache>,
        router: &Router,
        permit: Option<Permit>,
    ) -> Result<Ticket> {
        let buffers = Arc::new(Slab::new(&prep, &resident));
        let n = prep.nodes.len();
        let waiting = prep.nodes.iter().map(|p| AtomicU32::new(p.deps)).collect();
        let fused = prep.roles.iter().map(|_| AtomicBool::new(false)).collect();
        let runs = Arc::new(RunSlots::new(n));
        let (done_tx, done_rx) = bounded(1);
        let run = Arc::new(RunState {
            reg,
            opts,
            resident,
            buffers,
            waiting,
            fused,
            in_flight: AtomicUsize::new(prep.roots.len()),
            runs,
            troubled: AtomicBool::new(false),
            aborted: AtomicBool::new(false),
            trouble: Mutex::new(Trouble::default()),
            t0: Instant::now(),
            wall: OnceLock::new(),
            done: done_tx,
            permit: Mutex::new(permit),
            prep,
        });
        let ticket = Ticket {
            run: run.clone(),
            done: done_rx,
        };
        if run.prep.roots.is_empty() {
            if n > 0 {
                run.fail(Error::Internal("the graph has a cycle".into()));
            }
            run.finish();
            return Ok(ticket);
        }
        // One message per device holding all its ready nodes.
        let mut by_device: BTreeMap<DeviceId, Vec<u32>> = BTreeMap::new();
        for &r in &run.prep.roots {
            by_device
                .entry(run.prep.nodes[r as usize].device)
                .or_default()
                .push(r);
        }
        for (device, nodes) in by_device {
            let count = nodes.len();
            if let Err(e) = router.send(device, run.clone(), nodes) {
                run.fail(e);
                for _ in 0..count {
                    run.node_finished();
                }
            }
        }
        Ok(ticket)
    }

    /// Records the error that ends this execution (the first one wins).
    fn fail(&self, e: Error) {
        let mut t = lock(&self.trouble);
        t.error.get_or_insert(e);
        self.aborted.store(true, Ordering::Release);
        self.troubled.store(true, Ordering::Release);
    }

    /// One node handed out is done with (run, skipped or failed): the last one finishes the
    /// execution.
    fn node_finished(&self) {
        if self.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.finish();
        }
    }

    fn finish(&self) {
        let _ = self.wall.set(self.t0.elapsed());
        // Room in the queue for the next request, before the caller collects this one.
        drop(lock(&self.permit).take());
        let _ = self.done.try_send(());
    }

    /// The device node `j` runs on: the planned one, unless it was moved or its device was
    /// lost earlier in this execution (then the CPU, with a note).
    fn device_for(&self, j: u32) -> DeviceId {
        let planned = self.prep.nodes[j as usize].device;
        if !self.troubled.load(Ordering::Acquire) {
            return planned;
        }
        let mut t = lock(&self.trouble);
        if let Some(d) = t.moved.get(&j) {
            return *d;
        }
        if let Some(why) = t.failed_devices.get(&planned).cloned() {
            t.notes
                .insert(j, format!("{planned} failed earlier: {why}"));
            t.moved.insert(j, DeviceId::CPU);
            return DeviceId::CPU;
        }
        planned
    }

    /// How many launches a worker may keep queued for this execution
    /// ([`super::ExecOptions::queue_ahead`]).
    pub fn queue_ahead(&self) -> usize {
        self.opts.queue_ahead
    }

    /// The worker ran through the nodes of one batch of this execution: `done` of the nodes
    /// it held in flight (those it was sent and those it kept, see [`RunState::step`]) are
    /// finished. One count change per batch, not per node.
    pub fn batch_finished(&self, done: usize) {
        if done > 0 && self.in_flight.fetch_sub(done, Ordering::AcqRel) == done {
            self.finish();
        }
    }

    /// Runs node `i` on `device` (this worker's), then makes its dependents ready: those of
    /// this device go on `ready`, the others to their workers.
    ///
    /// `done` counts the nodes this worker holds in flight and has finished with; the worker
    /// hands it to [`RunState::batch_finished`] once its ready list is empty. Deferring the
    /// decrement is safe: the nodes this worker holds stay counted in `in_flight` until then,
    /// so the count cannot reach zero while any of them (or a dependent it kept) is left.
    ///
    /// A node queued on an in-order device (see [`Ran::Queued`]) goes on `pending` instead,
    /// its dependents on this device on `ready` at once; [`RunState::resolve`] finishes it.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        self: &Arc<Self>,
        i: u32,
        device: DeviceId,
        backend: &dyn Backend,
        router: &Router,
        ready: &mut Vec<u32>,
        pending: &mut Pending,
        done: &mut usize,
    ) {
        if self.aborted.load(Ordering::Acquire) {
            *done += 1;
            return;
        }
        let start = self.t0.elapsed();
        let result = catch_unwind(AssertUnwindSafe(|| self.run_node(i, device, backend)))
            .unwrap_or_else(|p| {
                let what = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Err(Error::Internal(format!(
                    "node '{}' panicked on {device}: {what}",
                    self.prep.node_name(i)
                )))
            });
        match result {
            Ok(Ran::Queued(mut q)) => {
                q.run.start = start;
                if self.troubled.load(Ordering::Acquire) {
                    q.run.fallback = lock(&self.trouble).notes.remove(&i);
                }
                // Dependents here launch behind it now, each counted in flight; the others
                // wait for its completion.
                let mut kept = 0usize;
                for &j in self.prep.dependents(i) {
                    if self.device_for(j) == device {
                        if self.waiting[j as usize].fetch_sub(1, Ordering::AcqRel) == 1 {
                            ready.push(j);
                            kept += 1;
                        }
                    } else {
                        q.later.push(j);
                    }
                }
                if kept > 0 {
                    self.in_flight.fetch_add(kept, Ordering::AcqRel);
                }
                pending.push_back(q);
            }
            Ok(Ran::Done(mut run)) => {
                run.start = start;
                if self.troubled.load(Ordering::Acquire) {
                    run.fallback = lock(&self.trouble).notes.remove(&i);
                }
                if let Err(e) = self.runs.put(i as usize, run) {
                    self.fail(e);
                }
                // Dependents that become ready here and stay on this worker take over this
                // node's place in flight: one count change at the end (none for a chain),
                // instead of an increment per dependent and a decrement for this node. A
                // dependent sent to another worker is counted before it is sent, so the count
                // cannot reach zero while that worker runs it. The decrement for this node is
                // left to the worker's batch (`done`).
                let mut kept = 0usize;
                for &j in self.prep.dependents(i) {
                    if self.waiting[j as usize].fetch_sub(1, Ordering::AcqRel) == 1 {
                        let d = self.device_for(j);
                        if d == device {
                            ready.push(j);
                            kept += 1;
                        } else {
                            self.in_flight.fetch_add(1, Ordering::AcqRel);
                            if let Err(e) = router.send(d, self.clone(), vec![j]) {
                                self.fail(e);
                                self.node_finished();
                            }
                        }
                    }
                }
                match kept {
                    0 => *done += 1,
                    1 => {}
                    k => {
                        self.in_flight.fetch_add(k - 1, Ordering::AcqRel);
                    }
                }
            }
            Err(e) => self.failed(i, device, e, router),
        }
    }

    /// Finishes the oldest launches of `pending` that completed, without waiting.
    pub fn resolve_completed(
        self: &Arc<Self>,
        pending: &mut Pending,
        device: DeviceId,
        router: &Router,
        ready: &mut Vec<u32>,
        done: &mut usize,
    ) {
        while pending.front().is_some_and(|q| q.done.is_done()) {
            if let Some(q) = pending.pop_front() {
                self.resolve(q, device, router, ready, done);
            }
        }
    }

    /// Waits for queued launch `q` (until its deadline) and finishes its node: its record,
    /// and its dependents on other devices handed on. A failure now fails the execution:
    /// nodes queued behind it read its outputs, so it cannot move to the CPU alone.
    pub fn resolve(
        self: &Arc<Self>,
        q: Queued,
        device: DeviceId,
        router: &Router,
        ready: &mut Vec<u32>,
        done: &mut usize,
    ) {
        let Queued {
            node: i,
            mut run,
            done: completion,
            info,
            what,
            deadline,
            t0,
            inputs,
            later,
        } = q;
        let waited = completion.wait(deadline.remaining(), &what);
        drop(inputs);
        *done += 1;
        match waited {
            Ok(()) => {
                run.launch = lock(&info).clone();
                run.wall = t0.elapsed();
                if let Err(e) = self.runs.put(i as usize, run) {
                    self.fail(e);
                }
                for j in later {
                    if self.waiting[j as usize].fetch_sub(1, Ordering::AcqRel) == 1 {
                        self.in_flight.fetch_add(1, Ordering::AcqRel);
                        let d = self.device_for(j);
                        if d == device {
                            ready.push(j);
                        } else if let Err(e) = router.send(d, self.clone(), vec![j]) {
                            self.fail(e);
                            self.node_finished();
                        }
                    }
                }
            }
            Err(e) => {
                if device_lost(e.kind()) && device != DeviceId::CPU {
                    let n = self.resident.forget_device(device);
                    tracing::debug!(%device, replicas = n, "dropped resident weights");
                }
                tracing::warn!(
                    node = %self.prep.node_name(i), %device, error = %e,
                    "failed after nodes were queued behind it: the execution fails"
                );
                self.fail(e);
            }
        }
    }

    /// Node `i` failed on `device`: moved to the CPU where the CPU can avoid the failure
    /// (with fallback on), else the execution fails.
    fn failed(self: &Arc<Self>, i: u32, device: DeviceId, e: Error, router: &Router) {
        let kind = e.kind();
        let lost = device_lost(kind);
        if lost && device != DeviceId::CPU {
            // Its resident replicas may be gone or half-written: upload again.
            let n = self.resident.forget_device(device);
            tracing::debug!(%device, replicas = n, "dropped resident weights");
        }
        let name = self.prep.node_name(i);
        if self.opts.fallback && recoverable(kind) && device != DeviceId::CPU {
            tracing::warn!(node = %name, %device, error = %e, "re-planning onto the CPU");
            {
                let mut t = lock(&self.trouble);
                if lost {
                    t.failed_devices.insert(device, e.to_string());
                }
                t.notes.insert(i, format!("{device} failed: {e}"));
                t.moved.insert(i, DeviceId::CPU);
            }
            self.troubled.store(true, Ordering::Release);
            // The node stays in flight, on the CPU's worker.
            if let Err(e) = router.send(DeviceId::CPU, self.clone(), vec![i]) {
                self.fail(e);
                self.node_finished();
            }
        } else {
            self.fail(match kind {
                ErrorKind::InvalidArgument => {
                    Error::invalid(format!("node '{name}' on {device}"), e.to_string())
                }
                _ => e,
            });
            self.node_finished();
        }
    }

    fn run_node(&self, i: u32, device: DeviceId, backend: &dyn Backend) -> Result<Ran> {
        let node = &self.prep.nodes[i as usize];
        let quiet = |launch: LaunchInfo, fused: Option<String>| {
            let name = NodeName::of(&self.prep.node_names, i);
            NodeRun::quiet(name, node.op.name(), device, launch, fused)
        };
        if matches!(node.op, Op::Nop) {
            // Nothing to move, launch or write: the scheduling is the whole cost.
            return Ok(Ran::Done(quiet(LaunchInfo::default(), None)));
        }
        // A fused unit this node heads and its device runs, or this node alone.
        let unit = match self.prep.roles.get(i as usize).and_then(Option::as_ref) {
            Some(Role::Head {
                unit,
                inputs,
                outputs,
                members,
            }) if self.opts.fuse
                && !self.troubled.load(Ordering::Acquire)
                && backend.fuses(unit) =>
            {
                Some((unit, inputs, outputs, members))
            }
            Some(Role::Member { head }) if self.fused[*head as usize].load(Ordering::Acquire) => {
                let head = self.prep.node_name(*head);
                return Ok(Ran::Done(quiet(
                    LaunchInfo {
                        kernel: format!("(inside the fused unit of {head})"),
                        ..LaunchInfo::default()
                    },
                    Some(format!("{}{head}", super::INSIDE_THE_UNIT_OF)),
                )));
            }
            _ => None,
        };
        let ins = self.acquire(unit.map_or(self.prep.inputs(i), |u| u.1), device)?;
        let refs: Vec<&DeviceStorage> = ins.storages.iter().collect();
        let t0 = Instant::now();
        let deadline = Deadline::after(self.opts.timeout);
        let (what, launch, outputs, fused) = match unit {
            Some((unit, _, outputs, members)) => {
                let names: Vec<&str> = std::iter::once(i)
                    .chain(members.iter().copied())
                    .map(|n| self.prep.node_name(n))
                    .collect();
                let names = names.join(" + ");
                let what = format!("{names} ({}) on {device}", unit.name());
                let launch = backend.launch_fused(unit, &refs)?;
                let fused = format!("{}: {names} {}", unit.name(), super::RUNS_THE_UNIT);
                (what, launch, outputs.clone(), Some(fused))
            }
            None => {
                let what = format!(
                    "{} ({}) on {device}",
                    self.prep.node_name(i),
                    node.op.name()
                );
                let launch =
                    backend
                        .launch_within(&node.op, &refs, &deadline)
                        .map_err(|e| match e {
                            // Name the node, as the wait below does.
                            Error::Timeout { timeout, .. } => Error::Timeout {
                                what: what.clone(),
                                timeout,
                            },
                            e => e,
                        })?;
                (what, launch, self.prep.outputs(i).collect(), None)
            }
        };
        drop(refs);
        // A fused head is marked once its outputs are written, before any member looks.
        let head = fused.is_some();
        // Queue dependents behind this launch instead of waiting for it.
        if self.opts.queue_ahead > 0 && backend.orders_launches() {
            self.write_outputs(launch.outputs, &outputs, &what)?;
            if head {
                self.fused[i as usize].store(true, Ordering::Release);
            }
            return Ok(Ran::Queued(Queued {
                node: i,
                run: ins.record(quiet(LaunchInfo::default(), fused)),
                done: launch.done,
                info: launch.info,
                what,
                deadline,
                t0,
                inputs: ins.storages,
                later: Vec::new(),
            }));
        }
        let info = self.wait_and_write(launch, &outputs, &what, &deadline)?;
        if head {
            self.fused[i as usize].store(true, Ordering::Release);
        }
        Ok(Ran::Done(NodeRun {
            wall: t0.elapsed(),
            ..ins.record(quiet(info, fused))
        }))
    }

    /// The data of `slots` on `device`, migrated there where needed, with what moving it took.
    fn acquire(&self, slots: &[u32], device: DeviceId) -> Result<Acquired> {
        let mut a = Acquired {
            storages: Vec::with_capacity(slots.len()),
            ..Acquired::default()
        };
        for &s in slots {
            let slot = &self.prep.slots[s as usize];
            let name = || self.prep.names.name(s);
            let t_in = Instant::now();
            let (st, moved) =
                self.buffers[s as usize].acquire_counted(&self.reg, device, Access::Read)?;
            let st =
                st.ok_or_else(|| Error::Internal(format!("'{}' has no data on {device}", name())))?;
            if matches!(slot.source, Source::Param(_)) {
                a.resident_transfer += t_in.elapsed();
                a.resident_bytes += moved.uploaded + moved.peer + moved.downloaded;
            } else {
                a.transfer += t_in.elapsed();
                // Copies toward this device: uploads, peer copies, and downloads for the host.
                a.transfer_bytes += moved.uploaded + moved.peer + moved.downloaded;
            }
            a.storages.push(st);
        }
        Ok(a)
    }

    /// Waits for `launch` (until `deadline`, `what` naming it), makes its outputs
    /// the data of `outputs` (slots), and returns its kernels and timing.
    fn wait_and_write(
        &self,
        launch: Launch,
        outputs: &[u32],
        what: &str,
        deadline: &Deadline,
    ) -> Result<LaunchInfo> {
        launch.done.wait(deadline.remaining(), what)?;
        self.write_outputs(launch.outputs, outputs, what)?;
        Ok(lock(&launch.info).clone())
    }

    /// Makes a launch's `storages` the data of `outputs` (slots); `what` names the launch.
    fn write_outputs(
        &self,
        storages: Vec<DeviceStorage>,
        outputs: &[u32],
        what: &str,
    ) -> Result<()> {
        if storages.len() != outputs.len() {
            return Err(Error::Internal(format!(
                "{what} returned {} outputs, expected {}",
                storages.len(),
                outputs.len()
            )));
        }
        for (&s, st) in outputs.iter().zip(storages) {
            self.buffers[s as usize].set_written_in(&self.reg, st)?;
        }
        Ok(())
    }
}

/// A node's inputs on its device and what moving them took.
#[derive(Default)]
struct Acquired {
    storages: Vec<DeviceStorage>,
    transfer: Duration,
    resident_transfer: Duration,
    transfer_bytes: u64,
    resident_bytes: u64,
}

impl Acquired {
    /// `run` with what moving the inputs took.
    fn record(&self, run: NodeRun) -> NodeRun {
        NodeRun {
            transfer: self.transfer,
            resident_transfer: self.resident_transfer,
            transfer_bytes: self.transfer_bytes,
            resident_bytes: self.resident_bytes,
            ..run
        }
    }
}

impl Ticket {
    /// Whether the execution has finished (then [`Ticket::wait`] returns at once).
    pub fn is_done(&self) -> bool {
        self.run.wall.get().is_some()
    }

    /// Waits for the execution and returns its buffers and node runs, or the error that
    /// ended it. Each node is bounded by the executor's timeout, so this returns.
    pub fn wait(self) -> Result<Execution> {
        if self.done.recv().is_err() && self.run.wall.get().is_none() {
            return Err(Error::Internal(
                "the execution was dropped unfinished".into(),
            ));
        }
        let run = &self.run;
        if let Some(e) = lock(&run.trouble).error.take() {
            return Err(e);
        }
        let runs = NodeRuns::complete(run.runs.clone()).map_err(|i| {
            Error::Internal(format!("node {} never ran", run.prep.node_name(i as u32)))
        })?;
        let buffers = Buffers::new(run.buffers.clone());
        Ok(Execution {
            buffers,
            runs,
            wall: run.wall.get().copied().unwrap_or_default(),
        })
    }
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("nodes", &self.run.prep.nodes.len())
            .field("done", &self.is_done())
            .finish()
    }
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
