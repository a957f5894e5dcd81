//! One way of finding and running Verilator and the C++ compiler, and of caching what they
//! build: the card's models ([`crate::model`]) and the bare-core harness
//! ([`crate::core_sim`]) both go through a [`Toolchain`].
//!
//! A build lands in `<cache_dir>/<name>-<key>`, where the key hashes the build's inputs and
//! the Verilator version. It is made in a private folder and renamed into place, so
//! concurrent builds (threads or processes) of the same inputs cannot collide.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::SimError;

/// Oldest Verilator release tandem supports.
pub const MIN_VERILATOR: (u32, u32) = (5, 6);

/// Install hint shown when Verilator is missing.
pub const INSTALL_HINT: &str =
    "install Verilator >= 5.006 (Debian/Ubuntu: apt-get install verilator) and a C++ compiler";

/// The Verilator executable.
const VERILATOR: &str = "verilator";

/// Lines of a failed command's output kept in the error.
const LOG_TAIL: usize = 40;

/// How Verilator builds are made and where they are kept. The host fills it from its options
/// (`TANDEM_SIM_CACHE`, `CXX`); nothing here reads the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toolchain {
    /// Folder the builds are cached in.
    pub cache_dir: PathBuf,
    /// The C++ compiler: links the card's models, and is handed to Verilator's make as `CXX`.
    pub cxx: String,
}

impl Default for Toolchain {
    /// A cache in the temp folder (`tandem-sim`) and `g++`.
    fn default() -> Self {
        Self {
            cache_dir: std::env::temp_dir().join("tandem-sim"),
            cxx: "g++".into(),
        }
    }
}

impl Toolchain {
    /// A `verilator` command whose make uses this toolchain's C++ compiler.
    pub fn verilator(&self) -> Command {
        let mut c = Command::new(VERILATOR);
        c.env("CXX", &self.cxx);
        c
    }

    /// A command running the C++ compiler.
    pub fn cxx(&self) -> Command {
        Command::new(&self.cxx)
    }

    /// Verilator's install folder (its `include/` holds the runtime sources).
    pub fn verilator_root(&self) -> String {
        Command::new(VERILATOR)
            .arg("--getenv")
            .arg("VERILATOR_ROOT")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|_| "/usr/share/verilator".into())
    }

    /// The cache folder of the build `name` whose inputs are `inputs` (hashed in order, then
    /// the Verilator version): if it does not hold `artifact` yet, `build` makes it in a
    /// private folder that is then renamed into place. Returns the folder.
    pub fn cached(
        &self,
        name: &str,
        inputs: &[&[u8]],
        artifact: &str,
        build: impl FnOnce(&Path) -> Result<(), SimError>,
    ) -> Result<PathBuf, SimError> {
        let (maj, min) = version()?;
        let mut h = Sha256::new();
        for i in inputs {
            h.update(i);
        }
        h.update(format!("{maj}.{min}").as_bytes());
        let key: String = h
            .finalize()
            .iter()
            .take(12)
            .map(|b| format!("{b:02x}"))
            .collect();
        let dir = self.cache_dir.join(format!("{name}-{key}"));
        if dir.join(artifact).exists() {
            return Ok(dir);
        }
        // One build at a time in this process; other processes build in their own folder.
        static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
        if dir.join(artifact).exists() {
            return Ok(dir);
        }
        let tmp = self
            .cache_dir
            .join(format!(".{name}-{key}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
        let t0 = std::time::Instant::now();
        if let Err(e) = build(&tmp) {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        if std::fs::rename(&tmp, &dir).is_err() {
            // Another process built the same thing first; use theirs.
            let _ = std::fs::remove_dir_all(&tmp);
        }
        tracing::info!(name, dir = %dir.display(), secs = t0.elapsed().as_secs_f64(), "built with Verilator");
        if !dir.join(artifact).exists() {
            return Err(SimError::Build(format!(
                "{} missing after the build",
                dir.join(artifact).display()
            )));
        }
        Ok(dir)
    }
}

/// The installed Verilator's version, or why it cannot be used (with an install hint).
pub fn version() -> Result<(u32, u32), SimError> {
    verilator_version_of(VERILATOR)
}

/// The version of the Verilator at `bin`, or why it cannot be used.
pub fn verilator_version_of(bin: &str) -> Result<(u32, u32), SimError> {
    let out = Command::new(bin)
        .arg("--version")
        .output()
        .map_err(|e| SimError::Unavailable(format!("verilator not found ({e}); {INSTALL_HINT}")))?;
    let s = String::from_utf8_lossy(&out.stdout);
    // "Verilator 5.006 2023-01-22 rev ..."
    let v = s
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.split_once('.'))
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
        .ok_or_else(|| {
            SimError::Unavailable(format!(
                "cannot read the Verilator version from `{}`",
                s.trim()
            ))
        })?;
    if v < MIN_VERILATOR {
        return Err(SimError::Unavailable(format!(
            "Verilator {}.{:03} is older than 5.006; {INSTALL_HINT}",
            v.0, v.1
        )));
    }
    Ok(v)
}

/// Runs `cmd` (`what` names it in errors); a failure keeps the tail of its error output.
pub fn run(cmd: &mut Command, what: &str) -> Result<(), SimError> {
    let out = cmd
        .output()
        .map_err(|e| SimError::Build(format!("{what}: cannot run: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().collect();
        return Err(SimError::Build(format!(
            "{what} failed:\n{}",
            lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n")
        )));
    }
    Ok(())
}

/// Parallel jobs for a build: the cores, at most `max`.
pub fn jobs(max: usize) -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(max)
}

/// Maps an I/O error on `path` to a [`SimError::Io`].
pub fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SimError + '_ {
    move |source| SimError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_verilator_is_unavailable_with_a_hint() {
        let e = verilator_version_of("verilator-that-is-not-installed").expect_err("missing");
        assert!(matches!(e, SimError::Unavailable(_)));
        assert!(e.to_string().contains("apt-get install verilator"), "{e}");
    }
}
