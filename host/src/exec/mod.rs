//! The executor: a worker thread per device (crossbeam channels), dependencies counted per
//! node, inputs migrated by the worker of the device that needs them (overlapping other
//! devices' compute), failure -> the node is re-planned onto the CPU. Weights stay resident
//! across executions.
//!
//! Two ways in: [`Executor::execute`] runs one graph on workers of its own (started and
//! stopped by the call), and [`Service`] keeps the workers running and takes requests from
//! many threads at once, each with its own [`Ticket`], through a bounded queue.
//!
//! - `prepared`: a graph and its plan, checked and indexed once ([`Prepared`])
//! - `names`: its tensors' and nodes' names in one string each; [`NodeName`]
//! - `request`: one execution's state; how a worker runs one of its nodes; [`Ticket`]
//! - `runs`: the node runs of an execution, written in place by the workers ([`NodeRuns`])
//! - `worker`: the per-device worker threads and the channels between them
//! - `queue`: admission (at most N requests in flight; wait, or [`Error::QueueFull`])
//! - `service`: [`Service`], the many-request front

mod buffers;
mod names;
mod prepared;
mod queue;
mod request;
mod runs;
mod service;
mod worker;

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

pub use buffers::Buffers;
pub use names::NodeName;
pub use prepared::Prepared;
pub use request::Ticket;
pub use runs::NodeRuns;
pub use service::{Service, ServiceOptions};

use crate::backend::{DeviceId, DeviceRegistry, LaunchInfo};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::plan::Plan;
use crate::resident::ResidentCache;
use crate::tensor::Tensor;

/// Options of a run.
#[derive(Debug, Clone)]
pub struct ExecOptions {
    /// Longest wait for one op's completion.
    pub timeout: Duration,
    /// Re-run an op on the CPU when its device fails with an error the CPU can avoid.
    pub fallback: bool,
    /// Run groups of nodes as one unit where their device can ([`crate::backend::FusedUnit`]:
    /// the MoE block, one CUDA graph on a GPU) and nothing outside the group reads what stays
    /// inside it. Those intermediates are then never written: leave it off to read or check
    /// every node's outputs.
    pub fuse: bool,
    /// How many launches a worker may keep queued on a device that runs its launches in order
    /// ([`crate::backend::Backend::orders_launches`]: a GPU's one compute stream) before it
    /// waits for the oldest. A node's dependents on the same device are launched behind it
    /// without waiting for it, so the device goes from op to op without a round trip through
    /// the host; dependents elsewhere are handed on once it completed. 0 waits for every
    /// node before its dependents launch.
    ///
    /// The price: a node that fails only once it runs (a kernel fault, a timeout: the
    /// device's work is lost) after dependents were queued behind it fails the execution
    /// instead of moving to the CPU, since those dependents read what it did not write.
    /// Failures a launch reports (no kernel, out of memory, an unsupported op) still move
    /// just that node.
    pub queue_ahead: usize,
}

/// The default of [`ExecOptions::queue_ahead`]: enough to cover the host's queueing of the
/// next op (tens of microseconds) while the device runs this one.
pub const QUEUE_AHEAD: usize = 4;

impl Default for ExecOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(300),
            fallback: true,
            fuse: false,
            queue_ahead: QUEUE_AHEAD,
        }
    }
}

/// How [`NodeRun::fused`] ends for the node that ran its unit.
pub const RUNS_THE_UNIT: &str = "(this node runs it)";
/// How [`NodeRun::fused`] starts for a node that ran inside another node's unit, before that
/// node's name.
pub const INSIDE_THE_UNIT_OF: &str = "ran inside the unit of ";

/// What happened to one node.
#[derive(Debug, Clone, Serialize)]
pub struct NodeRun {
    /// Node name.
    pub node: NodeName,
    /// Op family.
    pub op: &'static str,
    /// Device it finally ran on.
    pub device: DeviceId,
    /// Kernel and device timing.
    #[serde(flatten)]
    pub launch: LaunchInfo,
    /// When its input transfers began, from the start of the run.
    pub start: Duration,
    /// Wall time of the launch and its wait (excludes input transfers). For a node queued
    /// ahead ([`ExecOptions::queue_ahead`]), until its worker saw it complete: the worker may
    /// have launched the nodes after it meanwhile.
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
    /// Where it ran as part of a fused unit ([`ExecOptions::fuse`]): the unit and its nodes.
    /// The first node of the unit carries the unit's launch, kernels and time; the others
    /// ran inside it (no launch, no time of their own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fused: Option<String>,
}

impl NodeRun {
    /// A run that moved nothing and took no time of its own: `launch` and `fused` as given,
    /// every time, byte count and fallback zero or absent (an empty op, a fused unit's
    /// member; the caller fills in what it measured).
    pub fn quiet(
        node: NodeName,
        op: &'static str,
        device: DeviceId,
        launch: LaunchInfo,
        fused: Option<String>,
    ) -> Self {
        Self {
            node,
            op,
            device,
            launch,
            start: Duration::ZERO,
            wall: Duration::ZERO,
            transfer: Duration::ZERO,
            resident_transfer: Duration::ZERO,
            transfer_bytes: 0,
            resident_bytes: 0,
            fallback: None,
            fused,
        }
    }

    /// Whether this node ran a fused unit (its launch and time are the unit's).
    pub fn runs_unit(&self) -> bool {
        self.fused
            .as_deref()
            .is_some_and(|f| f.ends_with(RUNS_THE_UNIT))
    }

    /// The node whose fused unit this node ran inside (no launch or time of its own).
    pub fn unit_head(&self) -> Option<&str> {
        self.fused.as_deref()?.strip_prefix(INSIDE_THE_UNIT_OF)
    }
}

/// The result of executing a graph.
#[derive(Debug)]
pub struct Execution {
    /// Every tensor of the run, by name. The parameters' buffers are the executor's resident
    /// ones, shared with later executions: read them, never write them.
    pub buffers: Buffers,
    /// Node runs in graph order (a slice of [`NodeRun`]).
    pub runs: NodeRuns,
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
///
/// Each [`Executor::execute`] starts a worker per device and stops them when it returns;
/// [`Service`] keeps them running for many requests.
#[derive(Debug, Default, Clone)]
pub struct Executor {
    resident: Arc<ResidentCache>,
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
        let prepared = Arc::new(Prepared::new(graph, plan)?);
        self.execute_prepared(prepared, reg, opts)
    }

    /// Runs a prepared graph (see [`Prepared`]) on workers started for this call.
    pub fn execute_prepared(
        &self,
        prepared: Arc<Prepared>,
        reg: &DeviceRegistry,
        opts: &ExecOptions,
    ) -> Result<Execution> {
        self.resident.prune();
        let workers = worker::Workers::start(reg)?;
        let ticket = request::RunState::start(
            prepared,
            Arc::new(reg.clone()),
            opts.clone(),
            self.resident.clone(),
            workers.router(),
            None,
        )?;
        let result = ticket.wait();
        drop(workers);
        result
    }
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

/// Host copies of the named tensors of an execution.
pub fn fetch(exec: &Execution, reg: &DeviceRegistry, names: &[String]) -> Result<Vec<Tensor>> {
    Ok(fetch_shared(exec, reg, names)?
        .into_iter()
        .map(Arc::unwrap_or_clone)
        .collect())
}

/// The named tensors of an execution as shared host replicas (no copy of the data; a result
/// downloaded run after run lands in reused registered memory on CUDA devices).
pub fn fetch_shared(
    exec: &Execution,
    reg: &DeviceRegistry,
    names: &[String],
) -> Result<Vec<Arc<Tensor>>> {
    names
        .iter()
        .map(|n| {
            exec.buffers
                .get(n)
                .ok_or_else(|| Error::invalid("run", format!("no tensor named '{n}'")))?
                .to_host_shared(reg)
        })
        .collect()
}
