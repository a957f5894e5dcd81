//! Pinned (page-locked) host buffers through which uploads and downloads are staged, so copies
//! run at full link speed and asynchronously. One grows-on-demand buffer per device and
//! direction, held under a lock while a copy uses it.

use std::sync::Mutex;

use cudarc::driver::result as drv;

use super::super::error::{self, DrvResultExt};
use crate::error::Result;

#[derive(Debug)]
struct Block {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pinned block is plain host memory owned by this struct.
unsafe impl Send for Block {}

/// A pinned host buffer that grows to the largest copy seen.
#[derive(Debug)]
pub struct Staging {
    label: String,
    block: Mutex<Block>,
}

impl Staging {
    /// An empty staging buffer for device `label`.
    pub fn new(label: &str) -> Self {
        Self {
            label: label.to_string(),
            block: Mutex::new(Block {
                ptr: std::ptr::null_mut(),
                len: 0,
            }),
        }
    }

    /// Runs `f` with a pinned slice of at least `bytes` (the context must be current).
    pub fn with<R>(&self, bytes: usize, f: impl FnOnce(&mut [u8]) -> Result<R>) -> Result<R> {
        let mut b = self.block.lock().unwrap_or_else(|e| e.into_inner());
        if b.len < bytes {
            if !b.ptr.is_null() {
                // SAFETY: allocated by malloc_host below; no copy is in flight (we hold the lock
                // and every user waits for its copy before returning).
                unsafe { drv::free_host(b.ptr as *mut _) }.ctx(&self.label, "cuMemFreeHost")?;
                b.ptr = std::ptr::null_mut();
                b.len = 0;
            }
            let len = bytes.next_power_of_two().max(1 << 20);
            // SAFETY: plain pinned allocation.
            let p = unsafe { drv::malloc_host(len, 0) }
                .map_err(|e| error::alloc_host(&self.label, "cuMemHostAlloc", len, e))?;
            b.ptr = p as *mut u8;
            b.len = len;
        }
        // SAFETY: ptr is a live allocation of b.len >= bytes bytes, borrowed under the lock.
        let s = unsafe { std::slice::from_raw_parts_mut(b.ptr, bytes) };
        f(s)
    }
}
