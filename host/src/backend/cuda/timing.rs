//! Completions: each launch is bracketed by two events on the device's stream; one watcher
//! thread per device waits for the end events in order, fills in the event-timed device time
//! and advances the device's fence. A failed wait fails the fence (sticky: every waiter sees it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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
