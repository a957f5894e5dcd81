//! An opened Alveo board (`xrtDeviceOpen` / `xrtDeviceOpenByBDF`), closed on drop, and the
//! xclbin loaded onto it.

use std::ffi::CString;
use std::path::Path;
use std::sync::Arc;

use super::error::{check, null_handle};
use super::ffi;
use super::loader::Xrt;
use super::xclbin_handle::{Uuid, XrtXclbin};
use crate::FpgaError;

/// Which board to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BoardId {
    /// XRT's device index (0 for the first board).
    Index(u32),
    /// PCIe BDF of the user function, `0000:65:00.1`.
    Bdf(String),
}

impl std::fmt::Display for BoardId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BoardId::Index(i) => write!(f, "xrt:{i}"),
            BoardId::Bdf(b) => write!(f, "xrt:{b}"),
        }
    }
}

/// An opened board.
#[derive(Debug)]
pub struct XrtDevice {
    xrt: Arc<Xrt>,
    handle: ffi::xrtDeviceHandle,
    /// `xrt:0` or `xrt:<bdf>`.
    name: String,
}

// SAFETY: an XRT device handle is a key into XRT's own mutex-guarded tables; XRT's C API may be
// called from any thread. The handle is used through `&mut self` or `&self` of one owner.
unsafe impl Send for XrtDevice {}

impl XrtDevice {
    /// Opens a board; no board at `id` is an [`FpgaError::Unavailable`] naming it.
    pub fn open(xrt: Arc<Xrt>, id: &BoardId) -> Result<Self, FpgaError> {
        let name = id.to_string();
        let api = xrt.api();
        let handle = match id {
            // SAFETY: plain call; the environment was checked when `xrt` was loaded.
            BoardId::Index(i) => unsafe { api.xrtDeviceOpen(*i) },
            BoardId::Bdf(b) => {
                let c = CString::new(b.as_str()).map_err(|_| FpgaError::Unavailable {
                    device: name.clone(),
                    reason: format!("BDF `{b}` contains a NUL byte"),
                })?;
                // SAFETY: `c` is a valid C string for the duration of the call.
                unsafe { api.xrtDeviceOpenByBDF(c.as_ptr()) }
            }
        };
        if handle.is_null() {
            let why = null_handle(&name, "xrtDeviceOpen", &name);
            return Err(FpgaError::Unavailable {
                device: name,
                reason: format!(
                    "no Alveo board at {id} (XRT {}): {why}",
                    xrt.install.version.as_deref().unwrap_or("?")
                ),
            });
        }
        Ok(Self { xrt, handle, name })
    }

    /// `xrt:0` or `xrt:<bdf>`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The loaded library.
    pub fn xrt(&self) -> &Arc<Xrt> {
        &self.xrt
    }

    pub(crate) fn raw(&self) -> ffi::xrtDeviceHandle {
        self.handle
    }

    /// Reads `path` and loads it onto the board (`xrtDeviceLoadXclbinHandle`); returns the
    /// xclbin, whose uuid kernels are opened with.
    pub fn load_xclbin(&mut self, path: &Path) -> Result<XrtXclbin, FpgaError> {
        let x = XrtXclbin::open(self.xrt.clone(), path)?;
        // SAFETY: both handles are live.
        let rc = unsafe {
            self.xrt
                .api()
                .xrtDeviceLoadXclbinHandle(self.handle, x.raw())
        };
        check(
            &self.name,
            "xrtDeviceLoadXclbinHandle",
            &path.display().to_string(),
            rc,
        )?;
        Ok(x)
    }

    /// The uuid of the xclbin on the board now (which another process may have loaded).
    pub fn xclbin_uuid(&self) -> Result<Uuid, FpgaError> {
        let mut out = [0u8; 16];
        // SAFETY: `out` has the 16 bytes of an xuid_t.
        let rc = unsafe {
            self.xrt
                .api()
                .xrtDeviceGetXclbinUUID(self.handle, out.as_mut_ptr())
        };
        check(&self.name, "xrtDeviceGetXclbinUUID", "", rc)?;
        Ok(Uuid(out))
    }
}

impl Drop for XrtDevice {
    fn drop(&mut self) {
        // SAFETY: the handle is live and closed once; every kernel, BO and run of it holds an
        // `Arc` to nothing of this struct, so the owner (XrtCard) drops them first.
        let rc = unsafe { self.xrt.api().xrtDeviceClose(self.handle) };
        if rc != 0 {
            tracing::warn!(device = %self.name, rc, "xrtDeviceClose failed");
        }
    }
}
