//! A device memory pool with size classes.
//!
//! Every kernel of a device runs on one stream, so a buffer returned to the pool may be handed
//! out again at once: any later use is queued behind the work that used it before (stream-ordered
//! reuse). Classes are powers of two and their midpoints (at most 33% waste) from 512 bytes; on
//! an allocation failure the pool frees its cached blocks and tries once more.

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
            return Ok(DevBuf {
                pool: self.clone(),
                ptr,
                class,
                len: bytes,
            });
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
        s.stats.fresh += 1;
        s.stats.reserved += class;
        s.stats.in_use += class;
        Ok(DevBuf {
            pool: self.clone(),
            ptr,
            class,
            len: bytes,
        })
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
