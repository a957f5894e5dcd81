//! Run options, filled once where the program starts and passed down.
//!
//! The order is: command-line flags (the binary applies them on top), then the environment
//! (`TANDEM_*`, read here and only here), then defaults. Nothing below this point reads the
//! environment: backends, ops and kernels get their settings from an [`Options`] value, so
//! tests build one by hand instead of setting variables under a mutex. The workspace's
//! `clippy.toml` disallows `std::env::var*` everywhere else.
//!
//! - [`CudaOptions`]: the CUDA backend (storage precision, attention build, MoE experts path
//!   and tile, kernel source folder, compile cache, output poisoning, library folders).
//! - [`FpgaOptions`]: the FPGA backend (clock, simulator cache, simulation settings).
//! - [`Options::history`]: whether the planner learns from measured op times.

pub mod cuda;
pub mod fpga;

use std::ffi::OsString;

pub use cuda::CudaOptions;
pub use fpga::FpgaOptions;

use crate::error::Result;

/// A source of environment variables: the process environment, or a map in tests.
pub trait Env {
    /// The value of `name`, if set.
    fn get(&self, name: &str) -> Option<OsString>;

    /// The value of `name` as UTF-8 text, if set and not empty (trimmed); an error names the
    /// variable when the value is not UTF-8.
    fn text(&self, name: &str) -> Result<Option<String>> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => match v.into_string() {
                Ok(s) if s.trim().is_empty() => Ok(None),
                Ok(s) => Ok(Some(s.trim().to_string())),
                Err(v) => Err(crate::Error::invalid(
                    name,
                    format!("{v:?} is not UTF-8 text"),
                )),
            },
        }
    }
}

/// The process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    #[allow(clippy::disallowed_methods)] // the one place the process environment is read
    fn get(&self, name: &str) -> Option<OsString> {
        std::env::var_os(name)
    }
}

impl Env for std::collections::HashMap<String, String> {
    fn get(&self, name: &str) -> Option<OsString> {
        std::collections::HashMap::get(self, name).map(OsString::from)
    }
}

impl<const N: usize> Env for [(&str, &str); N] {
    fn get(&self, name: &str) -> Option<OsString> {
        self.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| OsString::from(*v))
    }
}

/// Every run option of the library.
#[derive(Debug, Clone)]
pub struct Options {
    /// The CUDA backend's options.
    pub cuda: CudaOptions,
    /// The FPGA backend's options.
    pub fpga: FpgaOptions,
    /// Whether the planner keeps and reads the op-time history (`TANDEM_HISTORY=off` or `0`
    /// turns it off).
    pub history: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            cuda: CudaOptions::default(),
            fpga: FpgaOptions::default(),
            history: true,
        }
    }
}

impl Options {
    /// Options from the process environment, defaults for what is unset; a value that is
    /// set but not accepted is an error naming the variable, the value and what is accepted.
    pub fn from_env() -> Result<Self> {
        Self::from_source(&ProcessEnv)
    }

    /// Options from any [`Env`] (tests pass a map).
    pub fn from_source(env: &dyn Env) -> Result<Self> {
        Ok(Self {
            cuda: CudaOptions::from_source(env)?,
            fpga: FpgaOptions::from_source(env)?,
            history: !matches!(env.text("TANDEM_HISTORY")?.as_deref(), Some("off" | "0")),
        })
    }
}
