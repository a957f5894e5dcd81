//! The one error type of the tandem library, with an IREE-like kind.

use std::time::Duration;

/// What class of failure an [`Error`] is, so callers can decide what to do without matching
/// every variant (retry elsewhere on `Unavailable`, re-plan on `DeviceLost`, report on the rest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The caller passed something that can never work (bad shape, bad file, bad flag).
    InvalidArgument,
    /// A device or library is not present or not usable here.
    Unavailable,
    /// The device has this op but not with these parameters or precision.
    Unimplemented,
    /// Out of memory or another finite resource.
    ResourceExhausted,
    /// A wait ran past its timeout.
    DeadlineExceeded,
    /// A device failed while running work; its results are lost.
    DeviceLost,
    /// A bug in tandem.
    Internal,
}

/// Errors of the tandem library. Each variant names what it concerns and the offending value.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An op was given inputs it cannot accept.
    #[error("{op}: {msg}")]
    InvalidArgument {
        /// The op or API that rejected its input.
        op: String,
        /// What was wrong and what is accepted.
        msg: String,
    },
    /// A device is missing or unusable.
    #[error("{device} is unavailable: {reason}")]
    Unavailable {
        /// Device or backend name.
        device: String,
        /// Why, with a hint where there is one.
        reason: String,
    },
    /// The device lacks this op or precision.
    #[error("{op} is not supported on {device}: {why}")]
    Unsupported {
        /// The op.
        op: String,
        /// The device.
        device: String,
        /// What it lacks.
        why: String,
    },
    /// Out of device memory.
    #[error("out of memory on {device}: {bytes} bytes requested")]
    OutOfMemory {
        /// The device.
        device: String,
        /// How much was asked for.
        bytes: usize,
    },
    /// A wait timed out.
    #[error("{what} did not finish within {timeout:?}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// The timeout.
        timeout: Duration,
    },
    /// A device failed while running work.
    #[error("{device}: {msg}")]
    Device {
        /// The device.
        device: String,
        /// The native error, formatted as `LIB error 'NAME' (code): message` where known.
        msg: String,
    },
    /// A file could not be read or written, or its contents are not acceptable.
    #[error("{path}: {msg}")]
    File {
        /// The file.
        path: String,
        /// What was wrong.
        msg: String,
    },
    /// A bug in tandem.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// The class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidArgument { .. } | Error::File { .. } => ErrorKind::InvalidArgument,
            Error::Unavailable { .. } => ErrorKind::Unavailable,
            Error::Unsupported { .. } => ErrorKind::Unimplemented,
            Error::OutOfMemory { .. } => ErrorKind::ResourceExhausted,
            Error::Timeout { .. } => ErrorKind::DeadlineExceeded,
            Error::Device { .. } => ErrorKind::DeviceLost,
            Error::Internal(_) => ErrorKind::Internal,
        }
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(op: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::InvalidArgument {
            op: op.into(),
            msg: msg.into(),
        }
    }

    /// Shorthand for [`Error::File`].
    pub fn file(path: impl AsRef<std::path::Path>, msg: impl Into<String>) -> Self {
        Error::File {
            path: path.as_ref().display().to_string(),
            msg: msg.into(),
        }
    }
}

/// Result with tandem's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
