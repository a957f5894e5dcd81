//! Native CUDA, NVRTC and cuBLASLt errors as tandem errors: the message formatted
//! `LIB error 'NAME' (code): message`, the native error kept as the source, and the variant
//! chosen by what the code means:
//! - out of memory -> [`Error::OutOfMemory`] (with the bytes free, from `cuMemGetInfo`);
//! - an image the driver cannot load, any NVRTC failure -> [`Error::Compile`];
//! - a value, handle or launch shape the call refuses (the context stays usable) ->
//!   [`Error::BadArgument`];
//! - everything else (illegal address, launch failure, a lost context...) -> [`Error::Device`]:
//!   the device is treated as lost.

use cudarc::cublaslt::result::CublasError;
use cudarc::cublaslt::sys::cublasStatus_t;
use cudarc::driver::DriverError;
use cudarc::driver::sys::CUresult;
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

/// Bytes free on the current context's device, if the driver can say (never where the
/// driver library is missing: cudarc would panic on the call).
fn free_bytes() -> Option<u64> {
    // SAFETY: the presence check only dlopens and closes the library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return None;
    }
    cudarc::driver::result::mem_get_info()
        .ok()
        .map(|(free, _)| free as u64)
}

/// What a driver error code says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DriverClass {
    OutOfMemory,
    Image,
    Refused,
    Lost,
}

fn classify(code: CUresult) -> DriverClass {
    use CUresult::*;
    match code {
        CUDA_ERROR_OUT_OF_MEMORY => DriverClass::OutOfMemory,
        CUDA_ERROR_INVALID_IMAGE
        | CUDA_ERROR_NO_BINARY_FOR_GPU
        | CUDA_ERROR_INVALID_PTX
        | CUDA_ERROR_UNSUPPORTED_PTX_VERSION
        | CUDA_ERROR_INVALID_SOURCE
        | CUDA_ERROR_JIT_COMPILER_NOT_FOUND
        | CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND
        | CUDA_ERROR_SHARED_OBJECT_INIT_FAILED
        | CUDA_ERROR_NOT_FOUND => DriverClass::Image,
        CUDA_ERROR_INVALID_VALUE
        | CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
        | CUDA_ERROR_NOT_SUPPORTED
        | CUDA_ERROR_INVALID_HANDLE => DriverClass::Refused,
        _ => DriverClass::Lost,
    }
}

/// A driver error raised while doing `what` on `device` (the device's context current).
pub fn driver(device: &str, what: &str, e: DriverError) -> Error {
    let msg = format!("{what}: {}", driver_msg(&e));
    match classify(e.0) {
        DriverClass::OutOfMemory => Error::OutOfMemory {
            device: device.to_string(),
            bytes: None,
            free: free_bytes(),
            source: None,
        },
        DriverClass::Image => Error::compile(device, what, driver_msg(&e), ""),
        DriverClass::Refused => Error::bad_argument(device, msg),
        DriverClass::Lost => Error::device(device, msg),
    }
    .with_source(e)
}

/// A driver error raised loading the compiled `module` (a `.cu` path) on `device`: an image
/// the driver refuses is a compile error of that module; anything else as [`driver`].
pub fn module_load(device: &str, module: &str, e: DriverError) -> Error {
    if classify(e.0) == DriverClass::Image {
        return Error::compile(
            device,
            module,
            format!("cuModuleLoadData: {}", driver_msg(&e)),
            "",
        )
        .with_source(e);
    }
    driver(device, &format!("cuModuleLoadData({module})"), e)
}

/// A driver error raised by an allocation of `bytes` on `device`: out of memory names the
/// bytes asked and free; anything else as [`driver`].
pub fn alloc(device: &str, what: &str, bytes: usize, e: DriverError) -> Error {
    if classify(e.0) == DriverClass::OutOfMemory {
        return Error::out_of_memory(device, bytes as u64, free_bytes()).with_source(e);
    }
    driver(device, what, e)
}

/// A driver error raised by a pinned host allocation of `bytes` for `device`: out of memory
/// names the bytes asked (the device's free memory says nothing here); anything else as
/// [`driver`].
pub fn alloc_host(device: &str, what: &str, bytes: usize, e: DriverError) -> Error {
    if classify(e.0) == DriverClass::OutOfMemory {
        return Error::out_of_memory(format!("{device} (pinned host memory)"), bytes as u64, None)
            .with_source(e);
    }
    driver(device, what, e)
}

/// A cuBLASLt error raised while doing `what` on `device`.
pub fn cublas(device: &str, what: &str, e: CublasError) -> Error {
    use cublasStatus_t::*;
    let msg = format!("{what}: cuBLASLt error '{:?}' ({})", e.0, e.0 as i32);
    match e.0 {
        CUBLAS_STATUS_ALLOC_FAILED => Error::OutOfMemory {
            device: device.to_string(),
            bytes: None,
            free: free_bytes(),
            source: None,
        },
        CUBLAS_STATUS_INVALID_VALUE | CUBLAS_STATUS_NOT_SUPPORTED | CUBLAS_STATUS_ARCH_MISMATCH => {
            Error::bad_argument(device, msg)
        }
        _ => Error::device(device, msg),
    }
    .with_source(e)
}

/// An NVRTC failure while doing `what` for `module` (built for `device`), with the compiler's
/// log.
pub fn nvrtc(device: &str, module: &str, what: &str, e: NvrtcError, log: &str) -> Error {
    Error::compile(
        device,
        module,
        format!("{what}: NVRTC error '{:?}' ({})", e.0, e.0 as i32),
        log,
    )
    .with_source(e)
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

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;
    use crate::error::ErrorKind;

    // Formatting asks the driver for the error's name; where the library is missing cudarc
    // would panic, so these tests check the classes, which need no library.
    #[test]
    fn driver_codes_map_to_what_happened() {
        use CUresult::*;
        assert_eq!(classify(CUDA_ERROR_OUT_OF_MEMORY), DriverClass::OutOfMemory);
        for c in [CUDA_ERROR_INVALID_IMAGE, CUDA_ERROR_NO_BINARY_FOR_GPU] {
            assert_eq!(classify(c), DriverClass::Image, "{c:?}");
        }
        for c in [CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES] {
            assert_eq!(classify(c), DriverClass::Refused, "{c:?}");
        }
        for c in [
            CUDA_ERROR_ILLEGAL_ADDRESS,
            CUDA_ERROR_LAUNCH_FAILED,
            CUDA_ERROR_ILLEGAL_INSTRUCTION,
            CUDA_ERROR_MISALIGNED_ADDRESS,
            CUDA_ERROR_ECC_UNCORRECTABLE,
            CUDA_ERROR_CONTEXT_IS_DESTROYED,
        ] {
            assert_eq!(classify(c), DriverClass::Lost, "{c:?}");
        }
    }

    #[test]
    fn nvrtc_failures_are_compile_errors_with_the_log() {
        use cudarc::nvrtc::sys::nvrtcResult;
        let e = nvrtc(
            "cuda:0",
            "sm80/attention.cu",
            "compiling",
            NvrtcError(nvrtcResult::NVRTC_ERROR_COMPILATION),
            "attention.cu(3): error: expected a ';'",
        );
        assert_eq!(e.kind(), ErrorKind::Compile);
        let m = e.to_string();
        assert!(m.starts_with("cuda:0: sm80/attention.cu did not compile: compiling: NVRTC error 'NVRTC_ERROR_COMPILATION' (6)"), "{m}");
        assert!(
            m.ends_with("\nattention.cu(3): error: expected a ';'"),
            "{m}"
        );
        assert!(e.source().is_some_and(|s| s.is::<NvrtcError>()));
    }

    #[test]
    fn cublas_statuses_map_to_what_happened() {
        use cublasStatus_t::*;
        let kind = |s| cublas("cuda:0", "cublasLtMatmul", CublasError(s)).kind();
        assert_eq!(
            kind(CUBLAS_STATUS_ALLOC_FAILED),
            ErrorKind::ResourceExhausted
        );
        assert_eq!(kind(CUBLAS_STATUS_NOT_SUPPORTED), ErrorKind::BadArgument);
        assert_eq!(kind(CUBLAS_STATUS_INVALID_VALUE), ErrorKind::BadArgument);
        assert_eq!(kind(CUBLAS_STATUS_EXECUTION_FAILED), ErrorKind::DeviceLost);
        let e = cublas(
            "cuda:0",
            "cublasLtMatmul",
            CublasError(CUBLAS_STATUS_EXECUTION_FAILED),
        );
        assert!(e.source().is_some_and(|s| s.is::<CublasError>()));
        assert!(
            e.to_string().contains("CUBLAS_STATUS_EXECUTION_FAILED"),
            "{e}"
        );
    }
}
