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
//! - [`CpuOptions`]: the CPU backend (its BLAS library, its thread count).
//! - [`FpgaOptions`]: the FPGA backend (clock, simulator cache, simulation settings, XRT).
//! - [`Options::history`]: where the planner keeps the op times it measured (none: it learns
//!   in memory only).

pub mod cpu;
pub mod cuda;
pub mod fpga;
pub mod memory;

use std::ffi::OsString;
use std::path::PathBuf;

pub use cpu::{CpuBlas, CpuOptions};
pub use cuda::CudaOptions;
pub use fpga::{FpgaOptions, SimMode, SimProfile};
pub use memory::{DeviceSelector, MEMORY_LIMIT_VAR, MemoryLimit, MemoryLimits};

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

    /// The value of `name` as a path, if set and not empty.
    fn path(&self, name: &str) -> Option<PathBuf> {
        self.get(name).filter(|v| !v.is_empty()).map(PathBuf::from)
    }
}

/// Two sources, the first winning: command-line values (by the variable they stand for) over
/// the process environment. A variable the first source sets is not read from the second, so
/// a flag also overrides a bad value in the environment.
#[derive(Clone, Copy)]
pub struct Layered<'a>(pub &'a dyn Env, pub &'a dyn Env);

impl std::fmt::Debug for Layered<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Layered")
    }
}

impl Env for Layered<'_> {
    fn get(&self, name: &str) -> Option<OsString> {
        self.0.get(name).or_else(|| self.1.get(name))
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
        Env::get(self.as_slice(), name)
    }
}

impl Env for [(&str, &str)] {
    fn get(&self, name: &str) -> Option<OsString> {
        self.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| OsString::from(*v))
    }
}

impl Env for Vec<(&str, &str)> {
    fn get(&self, name: &str) -> Option<OsString> {
        Env::get(self.as_slice(), name)
    }
}

/// tandem's folder in the user's cache: `$TANDEM_CACHE_DIR`, else `$XDG_CACHE_HOME/tandem`,
/// else `~/.cache/tandem` (`$HOME`); `None` when none is set. Every cache is a folder in it
/// (`cuda/`, `sim/`, `baselines/`, `history.json`); `TANDEM_SIM_CACHE_DIR` moves the
/// simulator's alone.
pub fn user_cache_dir(env: &dyn Env) -> Option<PathBuf> {
    env.path(cuda::CACHE_DIR_VAR)
        .or_else(|| env.path("XDG_CACHE_HOME").map(|d| d.join("tandem")))
        .or_else(|| env.path("HOME").map(|h| h.join(".cache").join("tandem")))
}

/// The environment variable that turns the op-time history off (`off`, `0` or `false`; `on`,
/// `1`, `true` or unset keep it; anything else is an error).
pub const HISTORY_VAR: &str = "TANDEM_HISTORY";
/// Where `tandem calibrate`'s measurements are kept (`off` or `0`: not used), for the planner.
pub const CALIBRATION_VAR: &str = "TANDEM_CALIBRATION";

/// Every run option of the library.
#[derive(Debug, Clone)]
pub struct Options {
    /// The CPU backend's options.
    pub cpu: CpuOptions,
    /// The CUDA backend's options.
    pub cuda: CudaOptions,
    /// The FPGA backend's options.
    pub fpga: FpgaOptions,
    /// The file the planner keeps measured op times in (`history.json` in
    /// [`user_cache_dir`]); `None` keeps them in memory only: `TANDEM_HISTORY=off` or `0`, no
    /// cache folder, and the default.
    pub history: Option<PathBuf>,
    /// The file `tandem calibrate` writes and the planner reads
    /// (`<cache>/calibration/<host name>.json`); `None`: `TANDEM_CALIBRATION=off` or `0`, or no
    /// cache folder. `TANDEM_CALIBRATION=PATH` names another file.
    pub calibration: Option<PathBuf>,
    /// Host memory a run may allocate (`TANDEM_MAX_MEMORY`: bytes, or with a K/M/G/T
    /// suffix); `None`: the host's available memory when the run starts
    /// ([`crate::limits::Limits::host`]).
    pub max_memory: Option<u64>,
    /// Memory each device may hold (`--memory-limit` / `TANDEM_MEMORY_LIMIT`); a device
    /// without an entry may use its real capacity.
    pub memory_limits: MemoryLimits,
}

impl Default for Options {
    /// Defaults that read nothing from the environment (no history file).
    fn default() -> Self {
        Self {
            cpu: CpuOptions::default(),
            cuda: CudaOptions::default(),
            fpga: FpgaOptions::default(),
            history: None,
            calibration: None,
            max_memory: None,
            memory_limits: MemoryLimits::default(),
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
            cpu: CpuOptions::from_source(env)?,
            cuda: CudaOptions::from_source(env)?,
            fpga: FpgaOptions::from_source(env)?,
            history: match cuda::flag(env, HISTORY_VAR)? {
                Some(false) => None,
                Some(true) | None => user_cache_dir(env).map(|d| d.join("history.json")),
            },
            calibration: match env.text(CALIBRATION_VAR)?.as_deref() {
                Some("off" | "0" | "false") => None,
                Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
                _ => user_cache_dir(env)
                    .map(|d| crate::plan::Calibration::path(&d, &crate::plan::machine_name())),
            },
            max_memory: match env.text(MAX_MEMORY_VAR)? {
                None => None,
                Some(t) => Some(
                    crate::limits::parse_bytes(&t)
                        .filter(|&b| b > 0)
                        .ok_or_else(|| {
                            crate::Error::invalid(
                                MAX_MEMORY_VAR,
                                format!(
                                    "{t:?} is not accepted: a positive byte count, optionally \
                                     with a K, M, G or T suffix (e.g. 24G)"
                                ),
                            )
                        })?,
                ),
            },
            memory_limits: match env.text(MEMORY_LIMIT_VAR)? {
                None => MemoryLimits::default(),
                Some(t) => MemoryLimits::parse(&t, MEMORY_LIMIT_VAR)?,
            },
        })
    }

    /// The memory limits of a run: [`Options::max_memory`] if set, else what the host has
    /// available now.
    pub fn limits(&self) -> crate::limits::Limits {
        match self.max_memory {
            Some(b) => crate::limits::Limits::with_memory(b),
            None => crate::limits::Limits::host(),
        }
    }
}

/// The environment variable that sets [`Options::max_memory`].
pub const MAX_MEMORY_VAR: &str = "TANDEM_MAX_MEMORY";

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn history_lives_in_the_user_cache_unless_off() -> Result<()> {
        let o = Options::from_source(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])?;
        assert_eq!(
            o.history.as_deref(),
            Some(Path::new("/x/tandem/history.json"))
        );
        let o = Options::from_source(&[("HOME", "/h")])?;
        assert_eq!(
            o.history.as_deref(),
            Some(Path::new("/h/.cache/tandem/history.json"))
        );
        for off in ["off", "0"] {
            let o = Options::from_source(&[("HOME", "/h"), (HISTORY_VAR, off)])?;
            assert_eq!(o.history, None, "{off}");
        }
        let e = Options::from_source(&[("HOME", "/h"), (HISTORY_VAR, "maybe")])
            .expect_err("not on or off");
        assert!(e.to_string().contains(HISTORY_VAR) && e.to_string().contains("maybe"));
        let none: [(&str, &str); 0] = [];
        assert_eq!(Options::from_source(&none)?.history, None);
        assert_eq!(Options::default().history, None);
        Ok(())
    }

    #[test]
    fn the_first_layer_wins_and_hides_the_second() -> Result<()> {
        let flags = [("TANDEM_CUDA_DTYPE", "f16")];
        let env = [("TANDEM_CUDA_DTYPE", "f8"), ("HOME", "/h")];
        let o = Options::from_source(&Layered(&flags, &env))?;
        assert_eq!(o.cuda.dtype, crate::backend::CudaDType::F16);
        assert!(o.history.is_some());
        assert!(Options::from_source(&env).is_err());
        Ok(())
    }

    #[test]
    fn every_cache_is_under_tandem_cache_dir() -> Result<()> {
        let env = [
            ("TANDEM_CACHE_DIR", "/c"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ];
        let o = Options::from_source(&env)?;
        assert_eq!(user_cache_dir(&env), Some(PathBuf::from("/c")));
        assert_eq!(o.cuda.cache_dir, PathBuf::from("/c/cuda"));
        assert_eq!(o.fpga.sim_cache, PathBuf::from("/c/sim"));
        assert_eq!(o.history, Some(PathBuf::from("/c/history.json")));
        let env = [("TANDEM_SIM_CACHE_DIR", "/s"), ("TANDEM_CACHE_DIR", "/c")];
        assert_eq!(
            Options::from_source(&env)?.fpga.sim_cache,
            PathBuf::from("/s")
        );
        let env = [("TANDEM_SIM_CACHE", "/old"), ("HOME", "/h")];
        assert_eq!(
            Options::from_source(&env)?.fpga.sim_cache,
            PathBuf::from("/old")
        );
        Ok(())
    }

    #[test]
    fn empty_values_are_unset() -> Result<()> {
        let env = [("HOME", ""), ("XDG_CACHE_HOME", "")];
        assert_eq!(user_cache_dir(&env), None);
        assert_eq!(env.text("HOME")?, None);
        Ok(())
    }
}
