//! A kernel of the loaded xclbin (`xrtPLKernelOpen`), closed on drop.

use std::ffi::CString;
use std::sync::Arc;

use super::device::XrtDevice;
use super::error::{check, null_handle};
use super::ffi;
use super::loader::Xrt;
use super::xclbin_handle::Uuid;
use crate::FpgaError;

/// An opened kernel (all its compute units, shared access).
#[derive(Debug)]
pub struct XrtKernel {
    xrt: Arc<Xrt>,
    handle: ffi::xrtKernelHandle,
    /// Kernel name.
    pub name: String,
    device: String,
}

// SAFETY: as for `XrtDevice`: a key into XRT's mutex-guarded tables, one owner.
unsafe impl Send for XrtKernel {}

impl XrtKernel {
    /// Opens kernel `name` of the xclbin `uuid` loaded on `dev`, in shared access (what XRT
    /// allows several processes, and what runs through XRT's scheduler need). A kernel the
    /// xclbin lacks is an [`FpgaError::Load`].
    pub fn open(dev: &XrtDevice, uuid: &Uuid, name: &str) -> Result<Self, FpgaError> {
        let c = CString::new(name).map_err(|_| FpgaError::Load {
            kernel: name.into(),
            msg: "the kernel name contains a NUL byte".into(),
        })?;
        let xrt = dev.xrt().clone();
        // SAFETY: the device handle is live, `uuid` is 16 bytes, `c` a valid C string.
        let handle = unsafe {
            xrt.api()
                .xrtPLKernelOpen(dev.raw(), uuid.0.as_ptr(), c.as_ptr())
        };
        if handle.is_null() {
            let e = null_handle(dev.name(), "xrtPLKernelOpen", name);
            return Err(FpgaError::Load {
                kernel: name.into(),
                msg: format!(
                    "the xclbin {uuid} on {} has no usable kernel `{name}`: {e}",
                    dev.name()
                ),
            });
        }
        Ok(Self {
            xrt,
            handle,
            name: name.into(),
            device: dev.name().into(),
        })
    }

    pub(crate) fn raw(&self) -> ffi::xrtKernelHandle {
        self.handle
    }

    pub(crate) fn xrt(&self) -> &Arc<Xrt> {
        &self.xrt
    }

    /// The memory group (bank index of the xclbin's MEM_TOPOLOGY) argument `argno` is connected
    /// to: where its buffer must be allocated.
    pub fn group_id(&self, argno: usize) -> Result<u32, FpgaError> {
        // SAFETY: the kernel handle is live.
        let g = unsafe {
            self.xrt
                .api()
                .xrtKernelArgGroupId(self.handle, argno as i32)
        };
        u32::try_from(g).map_err(|_| FpgaError::BadArgument {
            kernel: self.name.clone(),
            msg: format!("argument {argno} has no memory connection (xrtKernelArgGroupId: {g})"),
        })
    }

    /// Register offset of argument `argno` as the xclbin's metadata says.
    pub fn arg_offset(&self, argno: usize) -> Result<u32, FpgaError> {
        // SAFETY: the kernel handle is live.
        let off = unsafe { self.xrt.api().xrtKernelArgOffset(self.handle, argno as i32) };
        if off == u32::MAX {
            return Err(FpgaError::BadArgument {
                kernel: self.name.clone(),
                msg: format!("argument {argno} is not in the xclbin's metadata"),
            });
        }
        Ok(off)
    }

    /// Reads a control register. XRT 2.13 allows it only on a kernel opened with exclusive
    /// access (`xrtPLKernelOpenExclusive`) and never in software emulation; the card drives
    /// runs through [`super::run::XrtRun`] instead.
    pub fn read_register(&self, offset: u32) -> Result<u32, FpgaError> {
        let mut v = 0u32;
        // SAFETY: the kernel handle is live, `v` a valid out pointer.
        let rc = unsafe {
            self.xrt
                .api()
                .xrtKernelReadRegister(self.handle, offset, &mut v)
        };
        check(
            &self.device,
            "xrtKernelReadRegister",
            &format!("{offset:#x}"),
            rc,
        )?;
        Ok(v)
    }

    /// Writes a control register (exclusive access only, as [`XrtKernel::read_register`]).
    pub fn write_register(&self, offset: u32, value: u32) -> Result<(), FpgaError> {
        // SAFETY: the kernel handle is live.
        let rc = unsafe {
            self.xrt
                .api()
                .xrtKernelWriteRegister(self.handle, offset, value)
        };
        check(
            &self.device,
            "xrtKernelWriteRegister",
            &format!("{offset:#x}"),
            rc,
        )
    }
}

impl Drop for XrtKernel {
    fn drop(&mut self) {
        // SAFETY: the handle is live and closed once.
        let rc = unsafe { self.xrt.api().xrtKernelClose(self.handle) };
        if rc != 0 {
            tracing::warn!(kernel = %self.name, rc, "xrtKernelClose failed");
        }
    }
}
