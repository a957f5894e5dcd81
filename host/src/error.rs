//! The one error type of the tandem library, with an IREE-like kind.
//!
//! A variant says what happened (a device was lost, a kernel did not compile, a device refused
//! an argument, memory ran out); its [`ErrorKind`] says what a caller can do about it. The
//! executor decides by kind alone: a lost device (and one that did not finish in time) takes
//! no more work and loses its resident weights; a compile failure, a refused argument, an
//! unsupported op or exhausted memory moves that one op elsewhere and keeps the device.
//! Where a lower error exists (a CUDA driver result, an NVRTC status, an FPGA driver error) it
//! is kept as the [`std::error::Error::source`] of the variant.

use std::time::Duration;

/// A lower-level error kept as the cause of an [`Error`].
pub type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What class of failure an [`Error`] is, so callers can decide what to do without matching
/// every variant (retry elsewhere on `Unavailable`, re-plan on `DeviceLost`, report on the rest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The caller passed something that can never work (bad shape, bad file, bad flag): it
    /// would fail on any device.
    InvalidArgument,
    /// A device or library is not present or not usable here.
    Unavailable,
    /// The device has this op but not with these parameters or precision.
    Unimplemented,
    /// A kernel did not compile or load for the device (NVRTC's log, a CUBIN the driver
    /// refuses). The device itself is fine: other ops still run there.
    Compile,
    /// A device refused the arguments of one call (a value out of its range, a launch asking
    /// for more resources than it has, an FPGA kernel's argument check). The op may run
    /// elsewhere; the device is fine.
    BadArgument,
    /// Out of memory or another finite resource; the device is fine.
    ResourceExhausted,
    /// A wait ran past its timeout.
    DeadlineExceeded,
    /// A device failed while running work; its results and the data it held are lost.
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
    /// A kernel module did not compile (or the driver refused the compiled image).
    #[error("{device}: {module} did not compile: {msg}{}{log}", if log.is_empty() { "" } else { "\n" })]
    Compile {
        /// The device (or compiler, where no device is involved) it was built for.
        device: String,
        /// The module or program (a `.cu` path, a kernel name).
        module: String,
        /// The compiler's or driver's status, formatted `LIB error 'NAME' (code)` where known.
        msg: String,
        /// The compiler's log (empty when there is none).
        log: String,
        /// The native error, where there is one.
        #[source]
        source: Option<Source>,
    },
    /// A device refused the arguments of one call.
    #[error("{device}: {msg}")]
    BadArgument {
        /// The device.
        device: String,
        /// The call and the native error, formatted `LIB error 'NAME' (code): message` where
        /// known.
        msg: String,
        /// The native error, where there is one.
        #[source]
        source: Option<Source>,
    },
    /// Out of device memory.
    #[error("out of memory on {device}{}", oom_detail(*bytes, *free))]
    OutOfMemory {
        /// The device.
        device: String,
        /// How much was asked for, where the failing call says (a driver call that allocates
        /// for itself, such as a module load, does not).
        bytes: Option<u64>,
        /// How much the device had free when the request failed, where it could be asked.
        free: Option<u64>,
        /// The native error, where there is one.
        #[source]
        source: Option<Source>,
    },
    /// A wait timed out.
    #[error("{what} did not finish within {timeout:?}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// The timeout.
        timeout: Duration,
    },
    /// A device failed while running work (it is treated as lost).
    #[error("{device}: {msg}")]
    Device {
        /// The device.
        device: String,
        /// The native error, formatted as `LIB error 'NAME' (code): message` where known.
        msg: String,
        /// The native error, where there is one.
        #[source]
        source: Option<Source>,
    },
    /// A file could not be read or written, or its contents are not acceptable.
    #[error("{path}: {msg}")]
    File {
        /// The file.
        path: String,
        /// What was wrong.
        msg: String,
    },
    /// A bounded queue is full: the request was not taken (`try_submit` of
    /// [`crate::exec::Service`]; its `submit` waits for room instead).
    #[error(
        "{queue} is full ({capacity} requests in flight): retry later, or submit and wait for room"
    )]
    QueueFull {
        /// The queue.
        queue: String,
        /// How many requests it holds at most.
        capacity: usize,
    },
    /// A bug in tandem.
    #[error("internal error: {0}")]
    Internal(String),
}

/// `: N bytes requested, M bytes free` with the parts that are known.
fn oom_detail(bytes: Option<u64>, free: Option<u64>) -> String {
    match (bytes, free) {
        (Some(b), Some(f)) => format!(": {b} bytes requested, {f} bytes free"),
        (Some(b), None) => format!(": {b} bytes requested"),
        (None, Some(f)) => format!(" ({f} bytes free)"),
        (None, None) => String::new(),
    }
}

impl Error {
    /// The class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidArgument { .. } | Error::File { .. } => ErrorKind::InvalidArgument,
            Error::Unavailable { .. } => ErrorKind::Unavailable,
            Error::Unsupported { .. } => ErrorKind::Unimplemented,
            Error::Compile { .. } => ErrorKind::Compile,
            Error::BadArgument { .. } => ErrorKind::BadArgument,
            Error::OutOfMemory { .. } | Error::QueueFull { .. } => ErrorKind::ResourceExhausted,
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

    /// A lost device ([`Error::Device`]) without a lower error; add one with
    /// [`Error::with_source`].
    pub fn device(device: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Device {
            device: device.into(),
            msg: msg.into(),
            source: None,
        }
    }

    /// A kernel that did not compile ([`Error::Compile`]): `msg` is the compiler's status,
    /// `log` its output (may be empty).
    pub fn compile(
        device: impl Into<String>,
        module: impl Into<String>,
        msg: impl Into<String>,
        log: impl Into<String>,
    ) -> Self {
        Error::Compile {
            device: device.into(),
            module: module.into(),
            msg: msg.into(),
            log: log.into(),
            source: None,
        }
    }

    /// A call whose arguments the device refused ([`Error::BadArgument`]).
    pub fn bad_argument(device: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::BadArgument {
            device: device.into(),
            msg: msg.into(),
            source: None,
        }
    }

    /// Out of memory on `device` asking for `bytes`, with the bytes `free` where known.
    pub fn out_of_memory(device: impl Into<String>, bytes: u64, free: Option<u64>) -> Self {
        Error::OutOfMemory {
            device: device.into(),
            bytes: Some(bytes),
            free,
            source: None,
        }
    }

    /// This error with `source` as its cause, for the variants that keep one
    /// ([`Error::Device`], [`Error::Compile`], [`Error::BadArgument`],
    /// [`Error::OutOfMemory`]); the others are returned unchanged.
    pub fn with_source(mut self, source: impl Into<Source>) -> Self {
        match &mut self {
            Error::Device { source: s, .. }
            | Error::Compile { source: s, .. }
            | Error::BadArgument { source: s, .. }
            | Error::OutOfMemory { source: s, .. } => *s = Some(source.into()),
            _ => {}
        }
        self
    }
}

/// Result with tandem's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("native error 42")]
    struct Native;

    #[test]
    fn kinds_say_what_happened() {
        assert_eq!(Error::device("d", "gone").kind(), ErrorKind::DeviceLost);
        assert_eq!(
            Error::compile("d", "m.cu", "bad", "").kind(),
            ErrorKind::Compile
        );
        assert_eq!(
            Error::bad_argument("d", "no").kind(),
            ErrorKind::BadArgument
        );
        assert_eq!(
            Error::out_of_memory("d", 1, None).kind(),
            ErrorKind::ResourceExhausted
        );
        assert_eq!(
            Error::invalid("op", "no").kind(),
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn out_of_memory_says_how_much_was_asked_and_free() {
        let e = Error::out_of_memory("cuda:0", 1 << 30, Some(4096));
        assert_eq!(
            e.to_string(),
            "out of memory on cuda:0: 1073741824 bytes requested, 4096 bytes free"
        );
        let e = Error::out_of_memory("cuda:0", 512, None);
        assert_eq!(
            e.to_string(),
            "out of memory on cuda:0: 512 bytes requested"
        );
        let e = Error::OutOfMemory {
            device: "cuda:1".into(),
            bytes: None,
            free: Some(7),
            source: None,
        };
        assert_eq!(e.to_string(), "out of memory on cuda:1 (7 bytes free)");
    }

    #[test]
    fn compile_errors_carry_the_log() {
        let e = Error::compile(
            "cuda:0",
            "sm80/attention.cu",
            "NVRTC error 'X' (6)",
            "line 3",
        );
        assert_eq!(
            e.to_string(),
            "cuda:0: sm80/attention.cu did not compile: NVRTC error 'X' (6)\nline 3"
        );
        let e = Error::compile("cuda:0", "m.cu", "bad image", "");
        assert_eq!(e.to_string(), "cuda:0: m.cu did not compile: bad image");
    }

    #[test]
    fn sources_chain() {
        for e in [
            Error::device("d", "lost").with_source(Native),
            Error::compile("d", "m", "x", "").with_source(Native),
            Error::bad_argument("d", "x").with_source(Native),
            Error::out_of_memory("d", 1, None).with_source(Native),
        ] {
            let s = e.source().map(|s| s.to_string());
            assert_eq!(s.as_deref(), Some("native error 42"), "{e}");
        }
        assert!(Error::device("d", "lost").source().is_none());
        // Variants without a cause stay as they were.
        let e = Error::invalid("op", "no").with_source(Native);
        assert!(e.source().is_none());
        assert_eq!(e.to_string(), "op: no");
    }
}
