//! An xclbin file as XRT reads it (`xrtXclbinAllocFilename`), freed on drop. Checking a file
//! against bitstreams/manifest.toml before XRT sees it is `crate::xclbin`'s business.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::{check, null_handle};
use super::ffi;
use super::loader::Xrt;
use crate::FpgaError;

/// An xclbin's (or a board's loaded xclbin's) uuid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Uuid(pub [u8; 16]);

impl Uuid {
    /// All zero: no xclbin loaded.
    pub fn is_nil(&self) -> bool {
        self.0 == [0; 16]
    }
}

impl std::fmt::Display for Uuid {
    /// `8-4-4-4-12` lower-case hex.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// An xclbin read by XRT.
#[derive(Debug)]
pub struct XrtXclbin {
    xrt: Arc<Xrt>,
    handle: ffi::xrtXclbinHandle,
    /// The file.
    pub path: PathBuf,
}

// SAFETY: as for `XrtDevice`: a key into XRT's mutex-guarded tables, one owner.
unsafe impl Send for XrtXclbin {}

impl XrtXclbin {
    /// Reads `path`; a missing or malformed file is an [`FpgaError::Load`] naming it.
    pub fn open(xrt: Arc<Xrt>, path: &Path) -> Result<Self, FpgaError> {
        let load_err = |msg: String| FpgaError::Load {
            kernel: path.display().to_string(),
            msg,
        };
        if !path.is_file() {
            return Err(load_err("no such xclbin file".into()));
        }
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| load_err("the path contains a NUL byte".into()))?;
        // SAFETY: `c` is a valid C string for the duration of the call.
        let handle = unsafe { xrt.api().xrtXclbinAllocFilename(c.as_ptr()) };
        if handle.is_null() {
            let e = null_handle("xrt", "xrtXclbinAllocFilename", &path.display().to_string());
            return Err(load_err(format!("XRT does not read it as an xclbin: {e}")));
        }
        Ok(Self {
            xrt,
            handle,
            path: path.to_path_buf(),
        })
    }

    pub(crate) fn raw(&self) -> ffi::xrtXclbinHandle {
        self.handle
    }

    /// The xclbin's uuid.
    pub fn uuid(&self) -> Result<Uuid, FpgaError> {
        let mut out = [0u8; 16];
        // SAFETY: `out` has the 16 bytes of an xuid_t.
        let rc = unsafe {
            self.xrt
                .api()
                .xrtXclbinGetUUID(self.handle, out.as_mut_ptr())
        };
        check(
            "xrt",
            "xrtXclbinGetUUID",
            &self.path.display().to_string(),
            rc,
        )?;
        Ok(Uuid(out))
    }

    /// The platform (shell) the xclbin was linked for, e.g.
    /// `xilinx_u55c_gen3x16_xdma_3_202210_1`.
    pub fn platform(&self) -> Result<String, FpgaError> {
        let mut buf = vec![0u8; 512];
        let mut len: i32 = 0;
        // SAFETY: `buf` holds `buf.len()` bytes; XRT writes at most that many and the length.
        let rc = unsafe {
            self.xrt.api().xrtXclbinGetXSAName(
                self.handle,
                buf.as_mut_ptr().cast(),
                buf.len() as i32,
                &mut len,
            )
        };
        check(
            "xrt",
            "xrtXclbinGetXSAName",
            &self.path.display().to_string(),
            rc,
        )?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }
}

impl Drop for XrtXclbin {
    fn drop(&mut self) {
        // SAFETY: the handle is live and freed once.
        let rc = unsafe { self.xrt.api().xrtXclbinFreeHandle(self.handle) };
        if rc != 0 {
            tracing::warn!(path = %self.path.display(), rc, "xrtXclbinFreeHandle failed");
        }
    }
}
