//! XRT failures as [`FpgaError`]s. XRT 2.13's C API reports a failure as a null handle or a
//! non-zero return (a negative errno for some calls) and sets `errno`; it prints its own
//! message to stderr as "[XRT] ERROR: ..." (its C API has no `xrtErrorGetString`). The
//! messages here name the call, what it was asked, and the error code.

use crate::FpgaError;

/// The device name errors of the XRT layer carry when no board is open yet.
pub const XRT: &str = "xrt";

/// An [`FpgaError::Unavailable`] of XRT.
pub(crate) fn unavailable(reason: String) -> FpgaError {
    FpgaError::Unavailable {
        device: XRT.into(),
        reason,
    }
}

/// The OS error XRT left in `errno`, as text.
pub(crate) fn last_os_error() -> String {
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(0) | None => "no error code".into(),
        Some(_) => e.to_string(),
    }
}

/// A call that returned a null handle.
pub(crate) fn null_handle(device: &str, call: &str, what: &str) -> FpgaError {
    FpgaError::Device {
        device: device.into(),
        msg: format!(
            "{call}({what}) failed: {} (XRT prints its reason as `[XRT] ERROR` on stderr)",
            last_os_error()
        ),
    }
}

/// A call that returned the non-zero `rc`.
pub(crate) fn code(device: &str, call: &str, what: &str, rc: i32) -> FpgaError {
    let why = if rc < 0 {
        std::io::Error::from_raw_os_error(-rc).to_string()
    } else {
        last_os_error()
    };
    FpgaError::Device {
        device: device.into(),
        msg: format!("{call}({what}) returned {rc}: {why}"),
    }
}

/// Checks the return code of a call.
pub(crate) fn check(device: &str, call: &str, what: &str, rc: i32) -> Result<(), FpgaError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(code(device, call, what, rc))
    }
}
