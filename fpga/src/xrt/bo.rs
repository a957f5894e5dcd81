//! Buffer objects (`xrtBOAlloc`) in one memory group of the board, freed on drop. XRT keeps a
//! host-side copy of each; `write`/`read` touch it, `sync` moves it over PCIe.

use std::sync::Arc;

use super::device::XrtDevice;
use super::error::{check, null_handle};
use super::ffi;
use super::loader::Xrt;
use crate::FpgaError;
use crate::device::SyncDir;

/// A buffer in device memory.
#[derive(Debug)]
pub struct XrtBo {
    xrt: Arc<Xrt>,
    handle: ffi::xrtBufferHandle,
    /// Memory group (bank) it lives in.
    pub group: u32,
    /// Device address (what a pointer argument gets).
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
    device: String,
}

// SAFETY: as for `XrtDevice`: a key into XRT's mutex-guarded tables, one owner.
unsafe impl Send for XrtBo {}

impl XrtBo {
    /// Allocates `bytes` in memory group `group`. XRT refuses a size its bank cannot hold: that
    /// is an [`FpgaError::OutOfMemory`] (XRT does not say how much is free: `free` is 0).
    pub fn alloc(dev: &XrtDevice, bytes: u64, group: u32) -> Result<Self, FpgaError> {
        let xrt = dev.xrt().clone();
        let size = usize::try_from(bytes.max(1)).map_err(|_| FpgaError::OutOfRange {
            msg: format!("{bytes} bytes do not fit this host's address space"),
        })?;
        // SAFETY: the device handle is live.
        let handle = unsafe {
            xrt.api()
                .xrtBOAlloc(dev.raw(), size, u64::from(ffi::XRT_BO_FLAGS_NONE), group)
        };
        if handle.is_null() {
            let e = null_handle(
                dev.name(),
                "xrtBOAlloc",
                &format!("{bytes} bytes, group {group}"),
            );
            tracing::debug!(%e, "BO allocation failed");
            return Err(FpgaError::OutOfMemory {
                bank: group,
                bytes,
                free: 0,
            });
        }
        // SAFETY: the BO handle is live.
        let addr = unsafe { xrt.api().xrtBOAddress(handle) };
        Ok(Self {
            xrt,
            handle,
            group,
            addr,
            size: bytes,
            device: dev.name().into(),
        })
    }

    pub(crate) fn raw(&self) -> ffi::xrtBufferHandle {
        self.handle
    }

    fn range(&self, what: &str, offset: u64, len: usize) -> Result<(), FpgaError> {
        if offset
            .checked_add(len as u64)
            .is_none_or(|end| end > self.size)
        {
            return Err(FpgaError::OutOfRange {
                msg: format!(
                    "{what} of {len} bytes at {offset} in a {}-byte buffer",
                    self.size
                ),
            });
        }
        Ok(())
    }

    /// Copies `data` into the host copy at `offset`.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), FpgaError> {
        self.range("write", offset, data.len())?;
        // SAFETY: the range was checked against the BO's size; `data` is valid for its length.
        let rc = unsafe {
            self.xrt.api().xrtBOWrite(
                self.handle,
                data.as_ptr().cast(),
                data.len(),
                offset as usize,
            )
        };
        check(
            &self.device,
            "xrtBOWrite",
            &format!("{} bytes at {offset}", data.len()),
            rc,
        )
    }

    /// Copies the host copy at `offset` into `out`.
    pub fn read(&mut self, offset: u64, out: &mut [u8]) -> Result<(), FpgaError> {
        self.range("read", offset, out.len())?;
        // SAFETY: the range was checked against the BO's size; `out` is valid for its length.
        let rc = unsafe {
            self.xrt.api().xrtBORead(
                self.handle,
                out.as_mut_ptr().cast(),
                out.len(),
                offset as usize,
            )
        };
        check(
            &self.device,
            "xrtBORead",
            &format!("{} bytes at {offset}", out.len()),
            rc,
        )
    }

    /// Moves the whole buffer between the host copy and the device.
    pub fn sync(&mut self, dir: SyncDir) -> Result<(), FpgaError> {
        let d = match dir {
            SyncDir::ToDevice => ffi::XCL_BO_SYNC_BO_TO_DEVICE,
            SyncDir::FromDevice => ffi::XCL_BO_SYNC_BO_FROM_DEVICE,
        };
        // SAFETY: the BO handle is live; size and offset cover exactly the buffer.
        let rc = unsafe {
            self.xrt
                .api()
                .xrtBOSync(self.handle, d, self.size as usize, 0)
        };
        check(
            &self.device,
            "xrtBOSync",
            &format!("{dir:?}, {} bytes", self.size),
            rc,
        )
    }
}

impl Drop for XrtBo {
    fn drop(&mut self) {
        // SAFETY: the handle is live and freed once.
        let rc = unsafe { self.xrt.api().xrtBOFree(self.handle) };
        if rc != 0 {
            tracing::warn!(addr = self.addr, rc, "xrtBOFree failed");
        }
    }
}
