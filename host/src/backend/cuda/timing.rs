//! Completions: each launch is bracketed by two events on the device's stream; one watcher
//! thread per device waits for the end events in order, fills in the event-timed device time
//! and advances the device's fence. A failed wait fails the fence (sticky: every waiter sees it).
//!
//! Holds ([`Hold`], with [`CudaOptions::hold_stream`](crate::options::CudaOptions::hold_stream)):
//! a host function queued on the stream before an op's start event, which waits until the
//! host has queued all of the op's work, so the region times that work alone.

use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use cudarc::driver::result as drv;
use cudarc::driver::sys;

use super::device::Device;
use super::error::{DrvResultExt, driver_msg};
use crate::backend::LaunchInfo;
use crate::error::Result;
use crate::sync::{Completion, Fence};

#[derive(Clone, Copy)]
struct Ev(sys::CUevent);
// SAFETY: events are driver handles usable from any thread with the context bound.
unsafe impl Send for Ev {}

struct Pending {
    start: Ev,
    end: Ev,
    value: u64,
    info: Arc<Mutex<LaunchInfo>>,
}

/// Event pool, fence and watcher of one device.
pub struct Timeline {
    fence: Fence,
    next: AtomicU64,
    free: Arc<Mutex<Vec<Ev>>>,
    tx: Sender<Pending>,
}

impl std::fmt::Debug for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Timeline(at {})", self.fence.value())
    }
}

/// A region being timed: started by [`Timeline::begin`], closed by [`Timeline::end`]. A
/// region dropped without being closed (its op failed after queueing device work) hands its
/// start event back to the pool.
pub struct Region {
    start: Option<Ev>,
    free: Arc<Mutex<Vec<Ev>>>,
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Some(e) = self.start.take() {
            // Re-recording an event still pending on the stream is allowed, so it is reusable
            // at once.
            self.free.lock().unwrap_or_else(|e| e.into_inner()).push(e);
        }
    }
}

impl Timeline {
    /// Starts the watcher thread of `dev`.
    pub fn new(dev: Arc<Device>) -> Self {
        let (tx, rx) = crossbeam_channel::unbounded();
        let fence = Fence::new();
        let free = Arc::new(Mutex::new(Vec::new()));
        let (f2, free2) = (fence.clone(), free.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("{}-watch", dev.label))
            .spawn(move || watch(dev, rx, f2, free2));
        if let Err(e) = spawned {
            fence.fail(format!("cannot start the completion thread: {e}"));
        }
        Self {
            fence,
            next: AtomicU64::new(1),
            free,
            tx,
        }
    }

    fn event(&self, dev: &Device) -> Result<Ev> {
        if let Some(e) = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(e);
        }
        drv::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map(Ev)
            .ctx(&dev.label, "cuEventCreate")
    }

    /// Records the start event on the device's stream.
    pub fn begin(&self, dev: &Device) -> Result<Region> {
        let start = self.event(dev)?;
        let region = Region {
            start: Some(start),
            free: self.free.clone(),
        };
        // SAFETY: event and stream are live.
        unsafe { drv::event::record(start.0, dev.stream) }.ctx(&dev.label, "cuEventRecord")?;
        Ok(region)
    }

    /// Events in the pool, free for the next regions.
    #[cfg(test)]
    pub fn pooled_events(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Records the end event and hands the pair to the watcher; returns the completion.
    pub fn end(
        &self,
        dev: &Device,
        mut r: Region,
        info: Arc<Mutex<LaunchInfo>>,
    ) -> Result<Completion> {
        let end = self.event(dev)?;
        // SAFETY: event and stream are live.
        if let Err(e) =
            unsafe { drv::event::record(end.0, dev.stream) }.ctx(&dev.label, "cuEventRecord")
        {
            self.free
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(end);
            return Err(e);
        }
        let Some(start) = r.start.take() else {
            return Err(crate::error::Error::Internal(
                "a timed region was closed twice".into(),
            ));
        };
        let value = self.next.fetch_add(1, Ordering::SeqCst);
        let p = Pending {
            start,
            end,
            value,
            info,
        };
        if self.tx.send(p).is_err() {
            self.fence.fail("the completion thread has stopped");
        }
        Ok(Completion::new(self.fence.clone(), value))
    }
}

fn watch(dev: Arc<Device>, rx: Receiver<Pending>, fence: Fence, free: Arc<Mutex<Vec<Ev>>>) {
    if let Err(e) = dev.bind() {
        fence.fail(e.to_string());
        return;
    }
    while let Ok(p) = rx.recv() {
        // SAFETY: both events were recorded on the device's stream.
        match unsafe { drv::event::synchronize(p.end.0) } {
            Ok(()) => {
                // SAFETY: as above; both have completed.
                if let Ok(ms) = unsafe { drv::event::elapsed(p.start.0, p.end.0) } {
                    let mut i = p.info.lock().unwrap_or_else(|e| e.into_inner());
                    i.device_time = Some(Duration::from_secs_f64(ms as f64 * 1e-3));
                }
                fence.signal(p.value);
            }
            Err(e) => {
                fence.fail(format!(
                    "{}: a kernel failed: {}",
                    dev.label,
                    driver_msg(&e)
                ));
            }
        }
        let mut f = free.lock().unwrap_or_else(|e| e.into_inner());
        f.push(p.start);
        f.push(p.end);
    }
}

/// The longest a [`Hold`] keeps the stream: past it, the stream goes on by itself (a host wait
/// on the stream inside a held op, or a driver call that waits for the device such as a
/// kernel's first, lazy load, would otherwise never return).
pub const HOLD_TIMEOUT: Duration = Duration::from_millis(20);

/// What the host function and the host share.
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
    timed_out: AtomicBool,
    /// The longest the host function waits.
    timeout: Duration,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.opened.notify_all();
    }
}

/// The stream held at a point: work queued after it waits until [`Hold::release`] (or the
/// drop), or [`HOLD_TIMEOUT`].
pub struct Hold {
    gate: Arc<Gate>,
    label: String,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Hold({})", self.label)
    }
}

/// The host function a [`Hold`] queues: waits for the gate to open, at most [`HOLD_TIMEOUT`].
extern "C" fn hold_here(user: *mut std::ffi::c_void) {
    // SAFETY: `user` is the `Arc::into_raw` of `Hold::queue`, handed to this call alone.
    let gate = unsafe { Arc::from_raw(user as *const Gate) };
    let open = gate.open.lock().unwrap_or_else(|e| e.into_inner());
    let waited = gate
        .opened
        .wait_timeout_while(open, gate.timeout, |open| !*open);
    let (_open, r) = waited.unwrap_or_else(|e| e.into_inner());
    if r.timed_out() {
        gate.timed_out.store(true, Ordering::SeqCst);
    }
}

impl Hold {
    /// Queues a hold of at most [`HOLD_TIMEOUT`] on the device's compute stream.
    pub fn queue(dev: &Device) -> Result<Self> {
        Self::queue_for(dev, HOLD_TIMEOUT)
    }

    /// Queues a hold of at most `timeout` on the device's compute stream.
    pub fn queue_for(dev: &Device, timeout: Duration) -> Result<Self> {
        let gate = Arc::new(Gate {
            open: Mutex::new(false),
            opened: Condvar::new(),
            timed_out: AtomicBool::new(false),
            timeout,
        });
        let raw = Arc::into_raw(gate.clone()) as *mut std::ffi::c_void;
        // SAFETY: the stream is live; the host function makes no CUDA call and owns `raw`.
        let queued = unsafe { drv::stream::launch_host_function(dev.stream, hold_here, raw) };
        if let Err(e) = queued {
            // Never to run: take back the reference it was given.
            // SAFETY: `raw` came from `Arc::into_raw` above and was not handed on.
            drop(unsafe { Arc::from_raw(raw as *const Gate) });
            return Err(e).ctx(&dev.label, "cuLaunchHostFunc");
        }
        Ok(Self {
            gate,
            label: dev.label.clone(),
        })
    }

    /// Lets the stream go (again: no effect).
    pub fn release(&self) {
        self.gate.open();
    }

    /// Whether the stream went on by itself, at [`HOLD_TIMEOUT`], before the release (known
    /// once the stream has passed the hold).
    pub fn timed_out(&self) -> bool {
        self.gate.timed_out.load(Ordering::SeqCst)
    }
}

/// The hold on one device's compute stream, if any ([`Hold`]): taken by an op about to queue
/// its work and let go once it is queued, or earlier by what inside the op would wait for it:
/// a host wait for the stream, a module's first load, a new cuBLASLt plan (whose kernel the
/// library loads at first use). At most one at a time (ops queue under the launch lock).
#[derive(Debug, Default)]
pub struct Holder {
    held: Mutex<Option<Hold>>,
    timed_out: AtomicU64,
}

impl Holder {
    /// Holds the compute stream of `dev` here, unless it is held already.
    pub fn hold(&self, dev: &Device) -> Result<()> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.is_none() {
            *held = Some(Hold::queue(dev)?);
        }
        Ok(())
    }

    /// Lets the stream go, if held.
    pub fn release(&self) {
        let hold = self.held.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = hold {
            h.release();
            if h.timed_out() {
                self.timed_out.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Holds that went on by themselves, at [`HOLD_TIMEOUT`], before they were let go.
    pub fn timed_out(&self) -> u64 {
        self.timed_out.load(Ordering::Relaxed)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.gate.open();
        if self.timed_out() {
            tracing::warn!(
                device = %self.label,
                "the compute stream was held {:?} and went on before the op was queued: the op's device time includes host time",
                self.gate.timeout
            );
        }
    }
}
