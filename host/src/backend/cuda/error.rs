//! Native CUDA, NVRTC and cuBLASLt errors as tandem errors, formatted
//! `LIB error 'NAME' (code): message`.

use cudarc::cublaslt::result::CublasError;
use cudarc::driver::DriverError;
use cudarc::nvrtc::result::NvrtcError;

use crate::error::Error;

/// Formats a driver error as `CUDA error 'NAME' (code): message`.
pub fn driver_msg(e: &DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "UNKNOWN".into());
    let text = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("CUDA error '{name}' ({}): {text}", e.0 as i32)
}

/// A driver error raised while doing `what` on `device`.
pub fn driver(device: &str, what: &str, e: DriverError) -> Error {
    use cudarc::driver::sys::CUresult;
    if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return Error::OutOfMemory {
            device: device.to_string(),
            bytes: 0,
        };
    }
    Error::Device {
        device: device.to_string(),
        msg: format!("{what}: {}", driver_msg(&e)),
    }
}

/// A cuBLASLt error raised while doing `what` on `device`.
pub fn cublas(device: &str, what: &str, e: CublasError) -> Error {
    Error::Device {
        device: device.to_string(),
        msg: format!("{what}: cuBLASLt error '{:?}' ({})", e.0, e.0 as i32),
    }
}

/// An NVRTC error with the compiler's log.
pub fn nvrtc(what: &str, e: NvrtcError, log: &str) -> Error {
    Error::Device {
        device: "nvrtc".into(),
        msg: format!(
            "{what}: NVRTC error '{:?}' ({}){}{}",
            e.0,
            e.0 as i32,
            if log.is_empty() { "" } else { "\n" },
            log
        ),
    }
}

/// Extension: attach device and context to driver results.
pub trait DrvResultExt<T> {
    /// Maps the error with [`driver`].
    fn ctx(self, device: &str, what: &str) -> crate::error::Result<T>;
}

impl<T> DrvResultExt<T> for Result<T, DriverError> {
    fn ctx(self, device: &str, what: &str) -> crate::error::Result<T> {
        self.map_err(|e| driver(device, what, e))
    }
}

/// Extension: attach device and context to cuBLASLt results.
pub trait BlasResultExt<T> {
    /// Maps the error with [`cublas`].
    fn ctx(self, device: &str, what: &str) -> crate::error::Result<T>;
}

impl<T> BlasResultExt<T> for Result<T, CublasError> {
    fn ctx(self, device: &str, what: &str) -> crate::error::Result<T> {
        self.map_err(|e| cublas(device, what, e))
    }
}
