//! Download landings: host tensors kept registered (`cuMemHostRegister`) and reused, so that
//! a result downloaded again and again (a workload's output run after run, a server's logits
//! step after step) lands by DMA straight into memory the link can write at its pinned rate.
//!
//! Why: a download into a fresh host allocation is bounded by faulting its pages in, not by
//! the link: measured on the H100 machine (benches/peers/staging_probe.cu, 256 MiB), 8.2 GB/s
//! into fresh `malloc` memory, 10.1 GB/s with transparent huge pages, against 55 GB/s for a copy
//! into pinned memory. Memory that is already faulted in and registered removes both the
//! faults and the pass through staging slots. Registering costs about as much as one slow
//! download, so a landing is made the second time a result of the same shape and dtype comes
//! back, not the first.
//!
//! Ownership: the pool owns each landing's tensor (`Arc<Tensor>`); a download takes a landing
//! only while the pool holds the sole reference (`Arc::get_mut`), writes it with the device,
//! and hands out a clone. The landing is free again once every clone was dropped. Its pages
//! are unregistered before its tensor is freed (least recently used first when the bytes
//! exceed the cap, and when the device goes), so freed memory is never left registered.

use std::sync::{Arc, Mutex};

use cudarc::driver::sys;

use crate::error::Result;
use crate::tensor::{HostData, Tensor, TensorMeta};

/// Results smaller than this come back through the staging slots (a fresh tensor each time).
pub const MIN_BYTES: usize = 4 << 20;
/// Most bytes of landings kept registered per device.
pub const MAX_BYTES: usize = 4 << 30;
/// Result shapes remembered as seen once before the oldest is forgotten.
const SEEN: usize = 64;

struct Entry {
    tensor: Arc<Tensor>,
    ptr: *mut u8,
    len: usize,
    used: u64,
}

#[derive(Default)]
struct State {
    seen: Vec<TensorMeta>,
    entries: Vec<Entry>,
    bytes: usize,
    clock: u64,
    /// Registration failed once (the OS refuses to lock more pages): stop trying.
    refused: bool,
}

// SAFETY: the raw pointers are only dereferenced by the device, and only between `take` and
// `give_back`, while the taking thread holds the entry alone.
unsafe impl Send for State {}

/// A landing taken for one download: the caller writes `len` bytes at `ptr` (host memory the
/// device can write by DMA), then gives it back with [`Landings::give_back`], which returns the
/// tensor to hand out.
pub struct Taken {
    entry: Entry,
}

impl Taken {
    /// First byte of the landing's data (registered, `len` bytes).
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.entry.ptr
    }

    /// Bytes of the landing's data.
    pub(crate) fn len(&self) -> usize {
        self.entry.len
    }
}

/// The download landings of one device.
pub struct Landings {
    label: String,
    cap: usize,
    state: Mutex<State>,
}

impl std::fmt::Debug for Landings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("Landings")
            .field("tensors", &s.entries.len())
            .field("bytes", &s.bytes)
            .finish()
    }
}

/// The bytes of a host tensor's data, mutable, when it is one contiguous slice.
fn data_mut(t: &mut Tensor) -> Option<&mut [u8]> {
    fn bytes<T: bytemuck::Pod>(a: &mut ndarray::ArrayD<T>) -> Option<&mut [u8]> {
        a.as_slice_mut().map(bytemuck::cast_slice_mut)
    }
    match t.data_mut() {
        HostData::F32(a) => bytes(a),
        HostData::BF16(a) => bytes(a),
        HostData::F16(a) => bytes(a),
        HostData::I32(a) => bytes(a),
        _ => None,
    }
}

impl Landings {
    /// No landings yet, for device `label`, at most `cap` bytes registered.
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

    /// A free landing for a host tensor of `meta` (its host dtype), made if this shape was
    /// seen before; `None`: download into a fresh tensor instead.
    pub fn take(&self, meta: &TensorMeta) -> Result<Option<Taken>> {
        let bytes = meta.bytes();
        if bytes < MIN_BYTES || bytes > self.cap {
            return Ok(None);
        }
        let mut s = self.lock();
        s.clock += 1;
        let now = s.clock;
        // A free landing of this shape: the pool holds the only reference to its tensor.
        if let Some(i) = s
            .entries
            .iter_mut()
            .position(|e| e.tensor.meta() == *meta && Arc::get_mut(&mut e.tensor).is_some())
        {
            let mut entry = s.entries.swap_remove(i);
            entry.used = now;
            return Ok(Some(Taken { entry }));
        }
        if s.refused {
            return Ok(None);
        }
        // Seen before: a landing of this shape exists (held by a caller), or the shape came
        // back once already.
        if let Some(i) = s.seen.iter().position(|m| m == meta) {
            s.seen.remove(i);
        } else if !s.entries.iter().any(|e| e.tensor.meta() == *meta) {
            if s.seen.len() >= SEEN {
                s.seen.remove(0);
            }
            s.seen.push(meta.clone());
            return Ok(None);
        }
        // Make room under the cap with free landings (least recently used
        // first); landings still held by callers are never released.
        while s.bytes + bytes > self.cap {
            let free = (0..s.entries.len())
                .filter(|&i| Arc::strong_count(&s.entries[i].tensor) == 1)
                .min_by_key(|&i| s.entries[i].used);
            let Some(i) = free else {
                return Ok(None);
            };
            let e = s.entries.swap_remove(i);
            s.bytes -= e.len;
            self.release(e);
        }
        let mut tensor = Tensor::zeros(meta);
        let Some(data) = data_mut(&mut tensor) else {
            return Ok(None);
        };
        let (ptr, len) = (data.as_mut_ptr(), data.len());
        // SAFETY: `data` is the live, owned data of `tensor`, which the entry keeps (unmoved:
        // its buffer is on the heap) until it is unregistered by `release`.
        let r = unsafe { sys::cuMemHostRegister_v2(ptr.cast(), len, 0) };
        if r != sys::CUresult::CUDA_SUCCESS {
            tracing::debug!(device = %self.label, result = ?r, bytes = len,
                "registering a download landing failed; fresh tensors from now on");
            s.refused = true;
            return Ok(None);
        }
        s.bytes += len;
        Ok(Some(Taken {
            entry: Entry {
                tensor: Arc::new(tensor),
                ptr,
                len,
                used: now,
            },
        }))
    }

    /// Puts a landing back after its copy completed and returns its tensor to hand out
    /// (free again once every clone of it was dropped).
    pub fn give_back(&self, taken: Taken) -> Arc<Tensor> {
        let out = taken.entry.tensor.clone();
        self.lock().entries.push(taken.entry);
        out
    }

    /// Drops a landing whose copy failed: its pages are unregistered, its tensor freed.
    pub fn discard(&self, taken: Taken) {
        self.lock().bytes -= taken.entry.len;
        self.release(taken.entry);
    }

    /// Registered landing bytes and tensors now.
    pub fn usage(&self) -> (usize, usize) {
        let s = self.lock();
        (s.bytes, s.entries.len())
    }

    fn release(&self, e: Entry) {
        // SAFETY: the pages were registered by `take`; no copy writes them (a landing in the
        // pool has no copy in flight: `give_back` comes after the copy completed).
        let r = unsafe { sys::cuMemHostUnregister(e.ptr.cast()) };
        if r != sys::CUresult::CUDA_SUCCESS {
            tracing::warn!(device = %self.label, result = ?r, "cuMemHostUnregister failed");
        }
        drop(e.tensor);
    }

    /// Releases every landing (before the device's context goes). Landings still held by
    /// callers are unregistered too; their tensors stay valid host memory.
    pub fn clear(&self) {
        let mut s = self.lock();
        let entries = std::mem::take(&mut s.entries);
        s.bytes = 0;
        for e in entries {
            self.release(e);
        }
    }
}

impl Drop for Landings {
    fn drop(&mut self) {
        self.clear();
    }
}
