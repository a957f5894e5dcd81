//! [`Service`]: an executor whose workers keep running, taking requests from many threads.

use std::sync::Arc;

use super::queue::Admission;
use super::request::{RunState, Ticket};
use super::worker::Workers;
use super::{ExecOptions, Execution, Executor, Prepared};
use crate::backend::DeviceRegistry;
use crate::error::Result;
use crate::graph::Graph;
use crate::plan::Plan;
use crate::resident::ResidentCache;

/// Options of a [`Service`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceOptions {
    /// Most requests in flight (submitted, not finished) at once; a submit beyond it waits
    /// ([`Service::submit`]) or is refused ([`Service::try_submit`]). At least 1.
    pub queue_depth: usize,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        Self { queue_depth: 64 }
    }
}

/// An executor for many requests at once: a worker per device, started once and kept until
/// the service is dropped, shared by every request; weights resident across requests (see
/// [`Executor`]). `Service` is `Sync`: any number of threads submit to one `&Service`, each
/// getting a [`Ticket`] for its own request's result. Requests run concurrently: a worker
/// takes ready nodes of any request in the order they became ready.
///
/// Back-pressure: at most [`ServiceOptions::queue_depth`] requests are in flight. Beyond it
/// [`Service::submit`] blocks the submitting thread until one finishes, and
/// [`Service::try_submit`] returns [`crate::Error::QueueFull`] (kind `ResourceExhausted`)
/// without taking the request. The per-device job channels are unbounded but hold at most
/// the nodes of the admitted requests.
///
/// A failed request fails only itself: its remaining nodes are skipped, its ticket returns
/// the error, the others go on. Dropping the service waits for the requests in flight, then
/// stops and joins the workers.
pub struct Service {
    executor: Executor,
    reg: Arc<DeviceRegistry>,
    admission: Arc<Admission>,
    // Dropped last (fields drop in order): after `Drop::drop` waited for the requests.
    workers: Workers,
}

impl Service {
    /// Starts a worker for each device of `reg`, with nothing resident.
    pub fn new(reg: &DeviceRegistry, opts: ServiceOptions) -> Result<Self> {
        Self::with_executor(Executor::new(), reg, opts)
    }

    /// Like [`Service::new`], sharing `executor`'s resident weights.
    pub fn with_executor(
        executor: Executor,
        reg: &DeviceRegistry,
        opts: ServiceOptions,
    ) -> Result<Self> {
        let admission = Admission::new(opts.queue_depth)?;
        Ok(Self {
            executor,
            reg: Arc::new(reg.clone()),
            admission,
            workers: Workers::start(reg)?,
        })
    }

    /// The devices the workers drive.
    pub fn registry(&self) -> &DeviceRegistry {
        &self.reg
    }

    /// The resident parameter buffers shared by the requests.
    pub fn resident(&self) -> &ResidentCache {
        self.executor.resident()
    }

    /// Most requests in flight at once.
    pub fn queue_depth(&self) -> usize {
        self.admission.capacity()
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> usize {
        self.admission.in_flight()
    }

    /// Submits a prepared graph, waiting for room in the queue first; returns at once after
    /// that. [`Ticket::wait`] gives the result.
    pub fn submit(&self, prepared: Arc<Prepared>, opts: &ExecOptions) -> Result<Ticket> {
        let permit = self.admission.acquire();
        self.start(prepared, opts, permit)
    }

    /// Submits a prepared graph if the queue has room; else [`crate::Error::QueueFull`] and
    /// nothing is submitted.
    pub fn try_submit(&self, prepared: Arc<Prepared>, opts: &ExecOptions) -> Result<Ticket> {
        let permit = self.admission.try_acquire()?;
        self.start(prepared, opts, permit)
    }

    /// Prepares `graph` with `plan`, submits it (waiting for room) and waits for its result.
    pub fn execute(&self, graph: &Graph, plan: &Plan, opts: &ExecOptions) -> Result<Execution> {
        let prepared = Arc::new(Prepared::new(graph, plan)?);
        self.submit(prepared, opts)?.wait()
    }

    fn start(
        &self,
        prepared: Arc<Prepared>,
        opts: &ExecOptions,
        permit: super::queue::Permit,
    ) -> Result<Ticket> {
        RunState::start(
            prepared,
            self.reg.clone(),
            opts.clone(),
            self.executor.resident.clone(),
            self.workers.router(),
            Some(permit),
        )
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // Let every admitted request finish; the workers stop when `workers` drops.
        self.admission.wait_idle();
        self.executor.resident().prune();
    }
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("devices", &self.reg.backends().len())
            .field("queue_depth", &self.admission.capacity())
            .field("in_flight", &self.admission.in_flight())
            .finish()
    }
}
