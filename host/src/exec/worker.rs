//! One worker thread per device, persistent across executions: it takes batches of ready
//! nodes of any execution, runs them, and hands the nodes they made ready to the worker of
//! their device. A ready node of its own device it runs next without a channel round trip
//! (a dependency chain on one device never leaves its worker), so the per-node cost is a few
//! atomic operations. Workers stop on [`Msg::Stop`], sent when [`Workers`] is dropped.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, unbounded};

use super::request::{Pending, RunState};
use crate::backend::{Backend, DeviceId, DeviceRegistry};
use crate::error::{Error, Result};

/// What a worker is sent.
pub(crate) enum Msg {
    /// Ready nodes of one execution.
    Nodes(Arc<RunState>, Vec<u32>),
    /// Finish: no more work will come.
    Stop,
}

/// The job channels of the workers, by device.
pub(crate) struct Router {
    ids: Vec<DeviceId>,
    senders: Vec<Sender<Msg>>,
}

impl Router {
    /// Hands `nodes` of `run` to the worker of `device`.
    pub fn send(&self, device: DeviceId, run: Arc<RunState>, nodes: Vec<u32>) -> Result<()> {
        let i = self
            .ids
            .iter()
            .position(|d| *d == device)
            .ok_or_else(|| Error::Internal(format!("no worker for {device}")))?;
        self.senders[i]
            .send(Msg::Nodes(run, nodes))
            .map_err(|_| Error::Internal(format!("the worker of {device} stopped")))
    }
}

/// A worker thread per device of a registry.
pub(crate) struct Workers {
    router: Arc<Router>,
    handles: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Starts a worker for each device of `reg`.
    pub fn start(reg: &DeviceRegistry) -> Result<Self> {
        let mut ids = Vec::new();
        let mut senders = Vec::new();
        let mut receivers = Vec::new();
        for b in reg.backends() {
            let (tx, rx) = unbounded::<Msg>();
            ids.push(b.id());
            senders.push(tx);
            receivers.push((b.clone(), rx));
        }
        let router = Arc::new(Router { ids, senders });
        let mut handles = Vec::with_capacity(receivers.len());
        for (backend, rx) in receivers {
            let r = router.clone();
            let h = std::thread::Builder::new()
                .name(format!("tandem-{}", backend.id()))
                .spawn(move || work(backend, rx, r))
                .map_err(|e| Error::Internal(format!("could not start a worker thread: {e}")))?;
            handles.push(h);
        }
        Ok(Self { router, handles })
    }

    /// The workers' job channels.
    pub fn router(&self) -> &Arc<Router> {
        &self.router
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for s in &self.router.senders {
            let _ = s.send(Msg::Stop);
        }
        for h in self.handles.drain(..) {
            if h.join().is_err() {
                tracing::error!("an executor worker panicked");
            }
        }
    }
}

fn work(backend: Arc<dyn Backend>, jobs: Receiver<Msg>, router: Arc<Router>) {
    let device = backend.id();
    let mut ready: Vec<u32> = Vec::new();
    // Launches queued on an in-order device and not yet seen complete (only this batch's:
    // the batch ends when they have all completed).
    let mut pending = Pending::new();
    while let Ok(msg) = jobs.recv() {
        let (run, nodes) = match msg {
            Msg::Stop => return,
            Msg::Nodes(run, nodes) => (run, nodes),
        };
        let depth = run.queue_ahead();
        // Last in, first out: a node's dependents run right after it.
        ready.clear();
        ready.extend(nodes.into_iter().rev());
        // The nodes of this batch finished, counted off the execution's in-flight count
        // once the batch is through (an atomic per batch, not per node).
        let mut done = 0usize;
        loop {
            // Completed launches first: their dependents elsewhere go without delay.
            run.resolve_completed(&mut pending, device, &router, &mut ready, &mut done);
            if let Some(i) = ready.pop() {
                while pending.len() >= depth.max(1) {
                    if let Some(q) = pending.pop_front() {
                        run.resolve(q, device, &router, &mut ready, &mut done);
                    }
                }
                run.step(
                    i,
                    device,
                    &*backend,
                    &router,
                    &mut ready,
                    &mut pending,
                    &mut done,
                );
            } else if let Some(q) = pending.pop_front() {
                run.resolve(q, device, &router, &mut ready, &mut done);
            } else {
                break;
            }
        }
        run.batch_finished(done);
    }
}
