//! Host tensors pinned in place (`cuMemHostRegister`), so that a tensor uploaded again and
//! again goes to the device by DMA straight from its own memory, at the link's pinned rate.
//!
//! Why: an upload from pageable memory needs one pass of the host's cores over the data (into
//! the pinned staging slots, [`super::Staging`]), and that pass, not the link, is the limit:
//! measured on the H100 machine (benches/peers/staging_probe.cu), sixteen threads convert or
//! copy pageable memory into pinned memory at ~35 GB/s, against 55 GB/s for a copy from pinned
//! memory. Registering the tensor's own pages removes the pass; registering costs about as
//! much as a few staged uploads, so a tensor is registered the second time it is uploaded
//! (a per-run input of a workload executed again, a benchmark's tensor), not the first.
//!
//! Safety of the pages: an entry holds a clone of the host [`DeviceStorage`] (so the tensor's
//! memory cannot be freed while registered) and the event of its last copy. An entry is
//! released (copy waited for, pages unregistered, storage dropped) once nothing else holds the
//! tensor, or when the registered bytes exceed the cap (least recently used first).

use std::any::Any;
use std::sync::{Mutex, Weak};

use cudarc::driver::result as drv;
use cudarc::driver::sys;

use super::super::error::DrvResultExt;
use crate::backend::DeviceStorage;
use crate::error::Result;

/// Tensors smaller than this are staged: registering pages costs more than the copy saves.
pub const MIN_BYTES: usize = 4 << 20;
/// Most bytes kept registered per device (pinned pages are taken from the OS's pageable pool).
pub const MAX_BYTES: usize = 8 << 30;
/// Tensors remembered as seen once (by weak reference) before the oldest is forgotten.
const SEEN: usize = 64;

/// A registered host range ready for a copy: its address and length.
#[derive(Debug, Clone, Copy)]
pub struct Range {
    /// First byte.
    pub ptr: *const u8,
    /// Bytes.
    pub len: usize,
}

struct Entry {
    /// Keeps the tensor (and so the registered pages) alive.
    holder: DeviceStorage,
    ptr: *mut u8,
    len: usize,
    /// Recorded after the last copy from the range; `None` before any.
    event: Option<sys::CUevent>,
    used: u64,
}

#[derive(Default)]
struct State {
    seen: Vec<Weak<dyn Any + Send + Sync>>,
    entries: Vec<Entry>,
    bytes: usize,
    clock: u64,
    /// Registration failed once (e.g. the OS refuses to lock more pages): stop trying.
    refused: bool,
}

// SAFETY: the raw pointers and event handles are only used under the lock, with the device's
// context current (every caller binds it first).
unsafe impl Send for State {}

/// The registered host tensors of one device.
pub struct Registered {
    label: String,
    cap: usize,
    state: Mutex<State>,
}

impl std::fmt::Debug for Registered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("Registered")
            .field("tensors", &s.entries.len())
            .field("bytes", &s.bytes)
            .finish()
    }
}

impl Registered {
    /// No registrations yet, for device `label`, at most `cap` bytes registered.
    pub fn new(label: &str, cap: usize) -> Self {
        Self {
            label: label.to_string(),
            cap,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The registered range of `bytes` (the data of `host`) for a copy, registering it if this
    /// is the second time `host` is seen; `None`: stage the copy instead. After queuing the
    /// copies from the range, call [`Registered::copied`].
    pub fn range(&self, host: &DeviceStorage, bytes: &[u8]) -> Result<Option<Range>> {
        if bytes.len() < MIN_BYTES || bytes.len() > self.cap {
            return Ok(None);
        }
        let mut s = self.lock();
        self.release_unheld(&mut s)?;
        s.clock += 1;
        let now = s.clock;
        if let Some(e) = s
            .entries
            .iter_mut()
            .find(|e| e.holder.same_data(host) && std::ptr::eq(e.ptr, bytes.as_ptr()))
        {
            e.used = now;
            return Ok(Some(Range {
                ptr: e.ptr,
                len: e.len,
            }));
        }
        if s.refused {
            return Ok(None);
        }
        let weak = host.downgrade();
        if let Some(i) = s.seen.iter().position(|w| w.ptr_eq(&weak)) {
            s.seen.remove(i);
        } else {
            s.seen.retain(|w| w.strong_count() > 0);
            if s.seen.len() >= SEEN {
                s.seen.remove(0);
            }
            s.seen.push(weak);
            return Ok(None);
        }
        // Seen before: register, making room under the cap first.
        while s.bytes + bytes.len() > self.cap {
            let Some(i) = (0..s.entries.len()).min_by_key(|&i| s.entries[i].used) else {
                break;
            };
            let e = s.entries.swap_remove(i);
            s.bytes -= e.len;
            self.release(e)?;
        }
        let ptr = bytes.as_ptr() as *mut u8;
        // SAFETY: `bytes` is the live data of `host`, which the entry keeps alive until it is
        // unregistered; READ_ONLY: the device only reads it.
        let r = unsafe {
            sys::cuMemHostRegister_v2(ptr.cast(), bytes.len(), sys::CU_MEMHOSTREGISTER_READ_ONLY)
        };
        if r == sys::CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED {
            // A download landing ([`super::Landings`]) uploaded again: staged, and nothing
            // is refused for the tensors after it.
            return Ok(None);
        }
        if r != sys::CUresult::CUDA_SUCCESS {
            tracing::debug!(device = %self.label, result = ?r, bytes = bytes.len(),
                "registering host memory failed; staging uploads from now on");
            s.refused = true;
            return Ok(None);
        }
        s.entries.push(Entry {
            holder: host.clone(),
            ptr,
            len: bytes.len(),
            event: None,
            used: now,
        });
        s.bytes += bytes.len();
        Ok(Some(Range {
            ptr,
            len: bytes.len(),
        }))
    }

    /// Records, on `stream`, that the copies from `range` queued so far must finish before its
    /// pages are unregistered.
    pub fn copied(&self, range: Range, stream: sys::CUstream) -> Result<()> {
        let mut s = self.lock();
        let Some(e) = s
            .entries
            .iter_mut()
            .find(|e| std::ptr::eq(e.ptr, range.ptr))
        else {
            return Ok(());
        };
        let ev = match e.event {
            Some(ev) => ev,
            None => {
                let ev = drv::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                    .ctx(&self.label, "cuEventCreate")?;
                e.event = Some(ev);
                ev
            }
        };
        // SAFETY: the event and the stream are alive.
        unsafe { drv::event::record(ev, stream) }.ctx(&self.label, "cuEventRecord")
    }

    /// Registered bytes and tensors now.
    pub fn usage(&self) -> (usize, usize) {
        let s = self.lock();
        (s.bytes, s.entries.len())
    }

    /// Releases the entries whose tensor nothing else holds any more.
    fn release_unheld(&self, s: &mut State) -> Result<()> {
        let mut i = 0;
        while i < s.entries.len() {
            if s.entries[i].holder.holders() <= 1 {
                let e = s.entries.swap_remove(i);
                s.bytes -= e.len;
                self.release(e)?;
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Waits for the entry's last copy, unregisters its pages, then lets its tensor go.
    fn release(&self, e: Entry) -> Result<()> {
        // SAFETY: the event is ours and alive; the pages were registered by `range` and no
        // copy reads them once the event completed.
        unsafe {
            if let Some(ev) = e.event {
                drv::event::synchronize(ev).ctx(&self.label, "cuEventSynchronize")?;
                drv::event::destroy(ev).ctx(&self.label, "cuEventDestroy")?;
            }
            let r = sys::cuMemHostUnregister(e.ptr.cast());
            if r != sys::CUresult::CUDA_SUCCESS {
                tracing::warn!(device = %self.label, result = ?r, "cuMemHostUnregister failed");
            }
        }
        drop(e.holder);
        Ok(())
    }

    /// Releases everything (before the device's context goes).
    pub fn clear(&self) {
        let mut s = self.lock();
        let entries = std::mem::take(&mut s.entries);
        s.bytes = 0;
        for e in entries {
            if let Err(err) = self.release(e) {
                tracing::warn!(device = %self.label, error = %err, "releasing registered memory");
            }
        }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.clear();
    }
}
