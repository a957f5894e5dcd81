//! Pinned (page-locked) host buffers through which uploads and downloads are staged, in
//! chunks, so copies run at link speed and overlap the host's share of the work.
//!
//! Each direction of a device has a few pinned slots of [`CHUNK`] bytes, allocated once and
//! reused. An upload fills slot k (the caller converts f32 to bf16/f16 straight into it, on the
//! rayon threads) while slot k-1 is on the link, and returns as soon as the last chunk is
//! queued: the copy stream carries the copies, an event per slot says when its slot may be
//! filled again, and the caller makes the compute stream wait for the copies with an event,
//! so no host thread waits for an upload. A download keeps [`SLOTS`] chunks in flight and
//! drains (converts) each into the host tensor as it lands.
//!
//! Why the conversion is on the host: a host tensor lives in pageable memory, so one pass
//! over it into pinned memory is needed whatever happens; converting in that pass writes
//! half the bytes a raw f32 copy would and puts half the bytes on the link, where converting
//! on the GPU would move all four bytes of every value over PCIe and then run a kernel.

use std::sync::Mutex;

use cudarc::driver::result as drv;
use cudarc::driver::sys;

use super::super::error::{self, DrvResultExt};
use crate::error::Result;

/// Bytes of one staging slot: large enough for the link's full rate (a few MiB), small
/// enough that the first chunk's conversion is a short head start.
pub const CHUNK: usize = 8 << 20;
/// Slots per direction: chunks in flight at once.
pub const SLOTS: usize = 3;

/// The chunks of a copy of `total` bytes: (offset, length), each at most `chunk` bytes and a
/// multiple of `align` except perhaps the last (`align` divides `chunk`).
pub fn chunks(total: usize, chunk: usize, align: usize) -> Vec<(usize, usize)> {
    let step = (chunk / align.max(1)).max(1) * align.max(1);
    (0..total)
        .step_by(step)
        .map(|off| (off, step.min(total - off)))
        .collect()
}

#[derive(Debug)]
struct Slot {
    ptr: *mut u8,
    /// Recorded on the copy stream after the slot's last copy; `None` before any.
    event: Option<sys::CUevent>,
}

// SAFETY: a slot is plain pinned host memory and an event handle owned by its `Staging`, used
// only under its lock.
unsafe impl Send for Slot {}

/// The pinned slots of one device and direction.
#[derive(Debug)]
pub struct Staging {
    label: String,
    slots: Mutex<Vec<Slot>>,
}

impl Staging {
    /// No slots yet (allocated at first use) for device `label`.
    pub fn new(label: &str) -> Self {
        Self {
            label: label.to_string(),
            slots: Mutex::new(Vec::new()),
        }
    }

    fn ready(&self, slots: &mut Vec<Slot>) -> Result<()> {
        while slots.len() < SLOTS {
            // SAFETY: plain pinned allocation (the device's context is current).
            let p = unsafe { drv::malloc_host(CHUNK, 0) }
                .map_err(|e| error::alloc_host(&self.label, "cuMemHostAlloc", CHUNK, e))?;
            slots.push(Slot {
                ptr: p as *mut u8,
                event: None,
            });
        }
        Ok(())
    }

    /// Waits until the slot's last copy is done (it may be filled or read).
    fn wait(&self, slot: &Slot) -> Result<()> {
        if let Some(ev) = slot.event {
            // SAFETY: the event was created by `record` below and is alive.
            unsafe { drv::event::synchronize(ev) }.ctx(&self.label, "cuEventSynchronize")?;
        }
        Ok(())
    }

    fn record(&self, slot: &mut Slot, stream: sys::CUstream) -> Result<()> {
        let ev = match slot.event {
            Some(e) => e,
            None => {
                let e = drv::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                    .ctx(&self.label, "cuEventCreate")?;
                slot.event = Some(e);
                e
            }
        };
        // SAFETY: the event and the stream are alive.
        unsafe { drv::event::record(ev, stream) }.ctx(&self.label, "cuEventRecord")
    }

    /// Copies `total` bytes to device address `dst` on `stream`, chunk by chunk: `fill(offset,
    /// slot)` writes the bytes at `offset` of the copy into the pinned slot, then the slot's
    /// copy is queued. Returns once every copy is queued (the slots stay guarded by their
    /// events); the caller orders later work after `stream`. `align` (the size of the
    /// destination's elements) divides every chunk but the last.
    pub fn upload(
        &self,
        dst: sys::CUdeviceptr,
        total: usize,
        align: usize,
        stream: sys::CUstream,
        mut fill: impl FnMut(usize, &mut [u8]) -> Result<()>,
    ) -> Result<()> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        self.ready(&mut slots)?;
        for (k, (off, len)) in chunks(total, CHUNK, align).into_iter().enumerate() {
            let slot = &mut slots[k % SLOTS];
            self.wait(slot)?;
            // SAFETY: the slot holds CHUNK >= len bytes and no copy reads it any more (waited).
            let buf = unsafe { std::slice::from_raw_parts_mut(slot.ptr, len) };
            fill(off, buf)?;
            // SAFETY: `buf` stays allocated and untouched until the slot's event completes
            // (every later user waits for it, and `Drop` too); dst + off + len is within the
            // caller's allocation.
            unsafe { drv::memcpy_htod_async(dst + off as u64, &*buf, stream) }
                .ctx(&self.label, "cuMemcpyHtoDAsync")?;
            self.record(slot, stream)?;
        }
        Ok(())
    }

    /// Copies `total` bytes from device address `src` on `stream` (after the work the caller
    /// ordered before it there), [`SLOTS`] chunks in flight, and hands each to `drain(offset,
    /// bytes)` as it lands. Returns when every chunk was drained.
    pub fn download(
        &self,
        src: sys::CUdeviceptr,
        total: usize,
        align: usize,
        stream: sys::CUstream,
        mut drain: impl FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        self.ready(&mut slots)?;
        let parts = chunks(total, CHUNK, align);
        let issue = |slots: &mut Vec<Slot>, k: usize| -> Result<()> {
            let (off, len) = parts[k];
            let slot = &mut slots[k % SLOTS];
            self.wait(slot)?;
            // SAFETY: the slot holds CHUNK >= len bytes, no copy writes it (waited), and it is
            // not read before its event completes.
            let buf = unsafe { std::slice::from_raw_parts_mut(slot.ptr, len) };
            // SAFETY: src + off + len is within the caller's allocation; `buf` is read only
            // after the slot's event completes.
            unsafe { drv::memcpy_dtoh_async(buf, src + off as u64, stream) }
                .ctx(&self.label, "cuMemcpyDtoHAsync")?;
            self.record(slot, stream)
        };
        for k in 0..parts.len().min(SLOTS) {
            issue(&mut slots, k)?;
        }
        for (k, &(off, len)) in parts.iter().enumerate() {
            self.wait(&slots[k % SLOTS])?;
            // SAFETY: the slot's copy completed (waited); it holds len valid bytes.
            let buf = unsafe { std::slice::from_raw_parts(slots[k % SLOTS].ptr, len) };
            drain(off, buf)?;
            if k + SLOTS < parts.len() {
                issue(&mut slots, k + SLOTS)?;
            }
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let slots = self.slots.get_mut().unwrap_or_else(|e| e.into_inner());
        for s in slots.drain(..) {
            // SAFETY: the event and the allocation are ours; the copy using the slot is
            // waited for before the memory goes. Failures here are a device already lost.
            unsafe {
                if let Some(ev) = s.event {
                    let _ = drv::event::synchronize(ev);
                    let _ = drv::event::destroy(ev);
                }
                let _ = drv::free_host(s.ptr as *mut _);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::chunks;

    #[test]
    fn chunks_cover_the_copy_aligned() {
        assert!(chunks(0, 8, 2).is_empty());
        assert_eq!(chunks(5, 8, 2), [(0, 5)]);
        assert_eq!(chunks(20, 8, 2), [(0, 8), (8, 8), (16, 4)]);
        // A chunk is rounded down to the alignment.
        assert_eq!(chunks(20, 9, 4), [(0, 8), (8, 8), (16, 4)]);
        let c = chunks(super::CHUNK * 3 + 6, super::CHUNK, 2);
        assert_eq!(c.len(), 4);
        assert_eq!(c.iter().map(|p| p.1).sum::<usize>(), super::CHUNK * 3 + 6);
        assert!(c.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
    }
}
