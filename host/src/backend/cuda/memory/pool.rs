//! A device memory pool with size classes.
//!
//! Every kernel of a device runs on one stream, so a buffer returned to the pool may be handed
//! out again at once: any later use is queued behind the work that used it before (stream-ordered
//! reuse). A copy on the copy stream that writes a block first makes that stream wait for the
//! compute stream (`CudaBackend::order_copies_after_compute`): ops return their scratch as soon
//! as they are queued, and the executor queues launches ahead of their completion. Classes are
//! powers of two and their midpoints (at most 33% waste) from 512 bytes; on
//! an allocation failure the pool frees its cached blocks and tries once more.
//!
//! While a CUDA graph is being captured on a thread ([`Pool::hold`]), blocks that thread
//! returns are *held* instead of freed: the captured kernels keep their addresses, so no
//! other user may get them while the graph lives. The capture takes them
//! ([`Pool::take_held`]) and gives them back when its graph is destroyed
//! ([`Pool::give_back`]). Fresh blocks asked for during a capture are allocated with the
//! thread's capture mode relaxed for that one call (`cuMemAlloc` is not a stream operation,
//! but strict capture modes refuse it), and an allocation failure then does not free the
//! cached blocks (that waits for the device, which a capture forbids).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::result as drv;
use cudarc::driver::sys;

use super::super::error::{self, DrvResultExt};
use crate::error::Result;

/// Statistics of a pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes allocated from the driver and not yet freed.
    pub reserved: usize,
    /// Bytes handed out and not yet returned.
    pub in_use: usize,
    /// Allocations served from the free lists.
    pub reused: u64,
    /// Allocations that went to the driver.
    pub fresh: u64,
}

#[derive(Debug, Default)]
struct State {
    free: HashMap<usize, Vec<sys::CUdeviceptr>>,
    stats: PoolStats,
    /// The thread capturing a graph, and the blocks it returned since ([`Pool::hold`]).
    held: Option<(std::thread::ThreadId, Vec<HeldBlock>)>,
}

/// A block kept out of the free lists for a captured graph: its address and size class.
#[derive(Debug)]
pub struct HeldBlock {
    ptr: sys::CUdeviceptr,
    class: usize,
}

impl HeldBlock {
    /// Bytes of the block (its size class).
    pub fn class(&self) -> usize {
        self.class
    }
}

/// The pool of one device.
#[derive(Debug)]
pub struct Pool {
    label: String,
    state: Mutex<State>,
}

/// A device allocation from a [`Pool`]; returned to it on drop.
#[derive(Debug)]
pub struct DevBuf {
    pool: Arc<Pool>,
    ptr: sys::CUdeviceptr,
    class: usize,
    len: usize,
}

/// The size class of a request: the next power of two or power-of-two midpoint, >= 512.
pub fn size_class(bytes: usize) -> usize {
    let b = bytes.max(512);
    let p = b.next_power_of_two();
    let mid = p / 2 + p / 4;
    if b <= mid { mid } else { p }
}

impl Pool {
    /// An empty pool for the device named `label`.
    pub fn new(label: &str) -> Arc<Self> {
        Arc::new(Self {
            label: label.to_string(),
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A buffer of at least `bytes` (the device's context must be current).
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> Result<DevBuf> {
        let class = size_class(bytes);
        let mut s = self.lock();
        if let Some(ptr) = s.free.get_mut(&class).and_then(|v| v.pop()) {
            s.stats.reused += 1;
            s.stats.in_use += class;
            return Ok(self.buf(ptr, class, bytes));
        }
        let capturing = s
            .held
            .as_ref()
            .is_some_and(|(t, _)| *t == std::thread::current().id());
        if capturing {
            let ptr = malloc_relaxed(class)
                .map_err(|e| error::alloc(&self.label, "cuMemAlloc (during capture)", class, e))?;
            return Ok(self.fresh(&mut s, ptr, class, bytes));
        }
        // SAFETY: plain allocation in the current context.
        let ptr = match unsafe { drv::malloc_sync(class) } {
            Ok(p) => p,
            Err(_) => {
                // release cached blocks, then try once more
                Self::release_locked(&mut s, &self.label)?;
                // SAFETY: as above.
                unsafe { drv::malloc_sync(class) }
                    .map_err(|e| error::alloc(&self.label, "cuMemAlloc", class, e))?
            }
        };
        Ok(self.fresh(&mut s, ptr, class, bytes))
    }

    /// A block just allocated from the driver, counted as reserved and in use.
    fn fresh(self: &Arc<Self>, s: &mut State, ptr: u64, class: usize, bytes: usize) -> DevBuf {
        s.stats.fresh += 1;
        s.stats.reserved += class;
        s.stats.in_use += class;
        self.buf(ptr, class, bytes)
    }

    /// The handle of block `ptr` of size class `class`, `bytes` of it asked for.
    fn buf(self: &Arc<Self>, ptr: u64, class: usize, bytes: usize) -> DevBuf {
        DevBuf {
            pool: self.clone(),
            ptr,
            class,
            len: bytes,
        }
    }

    fn release_locked(s: &mut State, label: &str) -> Result<()> {
        // Blocks in the free lists may still be read by queued work: wait for it first.
        drv::ctx::synchronize().ctx(label, "cuCtxSynchronize")?;
        for (class, v) in s.free.drain() {
            for p in v {
                // SAFETY: the block came from malloc_sync and nothing uses it any more.
                unsafe { drv::free_sync(p) }.ctx(label, "cuMemFree")?;
                s.stats.reserved -= class;
            }
        }
        Ok(())
    }

    /// Frees every cached block (the device's context must be current).
    pub fn trim(&self) -> Result<()> {
        let mut s = self.lock();
        Self::release_locked(&mut s, &self.label)
    }

    /// Current statistics.
    pub fn stats(&self) -> PoolStats {
        self.lock().stats
    }

    /// From now on, blocks the calling thread returns are held (kept from every other user)
    /// until [`Pool::take_held`]: a graph being captured on this thread keeps their addresses.
    /// One capture at a time per pool: a second is [`crate::Error::Internal`].
    pub fn hold(&self) -> Result<()> {
        let mut s = self.lock();
        if let Some((t, _)) = &s.held {
            return Err(crate::Error::Internal(format!(
                "{}: a graph capture is already holding the pool (thread {t:?})",
                self.label
            )));
        }
        s.held = Some((std::thread::current().id(), Vec::new()));
        Ok(())
    }

    /// Ends [`Pool::hold`]: the blocks held since, still counted in use, for the graph to keep
    /// and later hand to [`Pool::give_back`].
    pub fn take_held(&self) -> Vec<HeldBlock> {
        self.lock().held.take().map(|(_, v)| v).unwrap_or_default()
    }

    /// Returns blocks a graph held to the free lists (its launches are queued on the one
    /// compute stream, so later users are ordered after them).
    pub fn give_back(&self, blocks: Vec<HeldBlock>) {
        let mut s = self.lock();
        for b in blocks {
            s.stats.in_use -= b.class;
            s.free.entry(b.class).or_default().push(b.ptr);
        }
    }
}

/// `cuMemAlloc` with the calling thread's stream-capture mode relaxed for the call (a capture
/// in thread-local or global mode refuses allocations otherwise), restored after.
fn malloc_relaxed(
    bytes: usize,
) -> std::result::Result<sys::CUdeviceptr, cudarc::driver::DriverError> {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: exchanges the calling thread's mode; restored below whatever the allocation did.
    unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }.result()?;
    // SAFETY: plain allocation in the current context.
    let r = unsafe { drv::malloc_sync(bytes) };
    // SAFETY: puts back the mode the exchange returned.
    let back = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }.result();
    let p = r?;
    back?;
    Ok(p)
}

impl DevBuf {
    /// Device address.
    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// Bytes asked for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether zero bytes were asked for.
    #[allow(dead_code)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        let mut s = self.pool.lock();
        if let Some((t, held)) = &mut s.held
            && *t == std::thread::current().id()
        {
            held.push(HeldBlock {
                ptr: self.ptr,
                class: self.class,
            });
            return;
        }
        s.stats.in_use -= self.class;
        s.free.entry(self.class).or_default().push(self.ptr);
    }
}

#[cfg(test)]
mod tests {
    use super::size_class;

    #[test]
    fn classes_cover_requests_with_bounded_waste() {
        assert_eq!(size_class(0), 512);
        assert_eq!(size_class(512), 512);
        assert_eq!(size_class(513), 768);
        assert_eq!(size_class(769), 1024);
        for b in [1000usize, 4097, 1 << 20, 3 << 20, (1 << 30) + 1] {
            let c = size_class(b);
            assert!(c >= b);
            assert!((c as f64) <= b as f64 * 1.5 + 1.0, "{b} -> {c}");
        }
    }
}
