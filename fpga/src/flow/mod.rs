//! The flow from a kernel to a bitstream, where Vivado/Vitis exist: the commands of
//! `tandem fpga package` (emit, `package_xo`, `v++ --link` with generated connectivity) and
//! `tandem fpga hls` (`vitis_hls`), generated in plain Rust ([`link_config`], [`package`],
//! [`hls`]) and run by [`tools`]. Without the tools the commands fail with
//! [`FlowError::ToolsMissing`] before running anything, after writing every generated file,
//! so a user can run them by hand.

pub mod command;
pub mod hls;
pub mod link_config;
pub mod package;
pub mod tools;

use std::path::PathBuf;

pub use command::ToolCommand;
pub use package::{PackagePlan, PackageRequest, prepare};

/// Errors of the flow.
#[derive(Debug, thiserror::Error)]
pub enum FlowError {
    /// A file could not be written or read, or a program could not be started.
    #[error("{path}: {source}")]
    Io {
        /// The file or program.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The kernel or platform does not allow the build.
    #[error("{msg}")]
    Config {
        /// What is wrong.
        msg: String,
    },
    /// Emitting the kernel failed.
    #[error(transparent)]
    Emit(#[from] crate::emit::EmitError),
    /// Reading an xclbin or kernel.xml failed.
    #[error(transparent)]
    Xclbin(#[from] crate::xclbin::XclbinError),
    /// Updating the manifest failed.
    #[error(transparent)]
    Manifest(#[from] crate::xclbin::ManifestError),
    /// Tools are not on the PATH; nothing was run.
    #[error("{} not found on the PATH: this needs {needs} (source <Vitis>/settings64.sh first); nothing was run{}", missing.join(", "), script.as_ref().map(|s| format!(", the commands are in {}", s.display())).unwrap_or_default())]
    ToolsMissing {
        /// The programs not found.
        missing: Vec<String>,
        /// What provides them.
        needs: String,
        /// The script with the commands, where one was written.
        script: Option<PathBuf>,
    },
    /// A tool failed.
    #[error("{step} failed ({status}): {command}; its output is in {}", log.display())]
    ToolFailed {
        /// The step.
        step: &'static str,
        /// The command line.
        command: String,
        /// The exit status.
        status: String,
        /// Its log.
        log: PathBuf,
    },
    /// A tool's output is not what was asked for.
    #[error("{msg}")]
    Output {
        /// What is wrong.
        msg: String,
    },
}
