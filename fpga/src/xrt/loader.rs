//! Finding XRT and loading `libxrt_coreutil` at run time.
//!
//! XRT 2.13's libxrt_coreutil throws out of a `noexcept` path, and so **aborts the process**,
//! on the first call into it when `XILINX_XRT` is unset ("XILINX_XRT not set") or when
//! `$XILINX_XRT/lib` lacks the shim library it loads next (`libxrt_core.so.2`, or
//! `libxrt_swemu.so.2` / `libxrt_hwemu.so.2` under `XCL_EMULATION_MODE`). So nothing here calls
//! into the library until [`XrtEnv::check`] has seen that the process environment names a
//! prefix that holds those files; a machine without that setup gets an error, never an abort.
//! Enumerating boards for `tandem devices` goes further and runs in a child process
//! (`super::probe`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::unavailable;
use super::ffi::XrtApi;
use crate::FpgaError;

/// The library tandem loads.
pub const COREUTIL: &str = "libxrt_coreutil.so.2";
/// The shim libxrt_coreutil loads from `$XILINX_XRT/lib` for a board.
pub const CORE_SHIM: &str = "libxrt_core.so.2";

/// Where to look for XRT (filled from `FpgaOptions`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XrtSearch {
    /// `XILINX_XRT`: the install prefix; `lib/` below it is searched first.
    pub xilinx_xrt: Option<PathBuf>,
    /// Search only this folder (`TANDEM_XRT_LIB`), nothing else: for a test, or an XRT outside
    /// the usual places.
    pub only: Option<PathBuf>,
}

impl XrtSearch {
    /// The folders searched, in order: `$XILINX_XRT/lib`, `/opt/xilinx/xrt/lib`, then the
    /// system's library folders (Debian's `/usr/lib/<arch>-linux-gnu` among them); or just
    /// [`XrtSearch::only`].
    pub fn dirs(&self) -> Vec<PathBuf> {
        if let Some(d) = &self.only {
            return vec![d.clone()];
        }
        let mut v = Vec::new();
        if let Some(x) = &self.xilinx_xrt {
            v.push(x.join("lib"));
        }
        v.push(PathBuf::from("/opt/xilinx/xrt/lib"));
        let multiarch = format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH);
        for d in [
            "/usr/local/lib",
            multiarch.as_str(),
            "/usr/lib64",
            "/usr/lib",
        ] {
            v.push(PathBuf::from(d));
        }
        v
    }
}

/// An XRT installation found on disk (nothing loaded yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XrtInstall {
    /// The `libxrt_coreutil.so.2` found.
    pub library: PathBuf,
    /// XRT's version, from the library's real file name (`libxrt_coreutil.so.2.13.0`).
    pub version: Option<String>,
    /// A prefix `P` with `P/lib/libxrt_core.so.2`, what `XILINX_XRT` must name; `None` when the
    /// library's folder is not called `lib` (Debian's multiarch folder: see
    /// [`XrtInstall::make_prefix`]).
    pub prefix: Option<PathBuf>,
}

impl XrtInstall {
    /// Looks for `libxrt_coreutil.so.2` in the folders of `search`; the error says where it
    /// looked and how to install XRT.
    pub fn find(search: &XrtSearch) -> Result<Self, FpgaError> {
        let dirs = search.dirs();
        let Some(dir) = dirs.iter().find(|d| d.join(COREUTIL).is_file()) else {
            let list: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
            return Err(unavailable(format!(
                "XRT not found: no {COREUTIL} in {} (install XRT: Debian `apt-get install \
                 libxrt1 libxrt-dev libxrt-utils`, or Xilinx's package into /opt/xilinx/xrt and \
                 `source /opt/xilinx/xrt/setup.sh`)",
                list.join(", ")
            )));
        };
        let library = dir.join(COREUTIL);
        let version = std::fs::canonicalize(&library)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .and_then(|n| n.strip_prefix("libxrt_coreutil.so.").map(str::to_string))
            .filter(|v| v.contains('.'));
        let prefix = (dir.file_name().is_some_and(|n| n == "lib") && dir.join(CORE_SHIM).is_file())
            .then(|| dir.parent().map(Path::to_path_buf))
            .flatten();
        Ok(Self {
            library,
            version,
            prefix,
        })
    }

    /// The folder the library was found in.
    pub fn lib_dir(&self) -> &Path {
        self.library.parent().unwrap_or(Path::new("/"))
    }

    /// A prefix for `XILINX_XRT`: [`XrtInstall::prefix`], or else (Debian's packages put the
    /// libraries in `/usr/lib/<arch>-linux-gnu`, which XRT 2.13 cannot be pointed at) a folder
    /// `under/xrt-prefix` whose `lib` is a link to the library's folder, made if missing.
    pub fn make_prefix(&self, under: &Path) -> Result<PathBuf, FpgaError> {
        if let Some(p) = &self.prefix {
            return Ok(p.clone());
        }
        let prefix = under.join("xrt-prefix");
        let lib = prefix.join("lib");
        let io = |path: &Path, source| FpgaError::Io {
            path: path.to_path_buf(),
            source,
        };
        if std::fs::read_link(&lib).ok().as_deref() != Some(self.lib_dir()) {
            std::fs::create_dir_all(&prefix).map_err(|e| io(&prefix, e))?;
            // A unique temporary link renamed into place: concurrent callers never see a
            // half-made prefix.
            let tmp = prefix.join(format!("lib.{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(self.lib_dir(), &tmp).map_err(|e| io(&tmp, e))?;
            std::fs::rename(&tmp, &lib).map_err(|e| io(&lib, e))?;
        }
        Ok(prefix)
    }
}

/// What the process environment says to XRT: the values libxrt will read with `getenv`
/// (passed in from `FpgaOptions`, which read them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XrtEnv {
    /// `XILINX_XRT`.
    pub xilinx_xrt: Option<PathBuf>,
    /// `XCL_EMULATION_MODE` (`sw_emu`, `hw_emu`), if set.
    pub emulation: Option<String>,
    /// `XILINX_VITIS`: emulation runs Vitis's device process from there.
    pub xilinx_vitis: Option<PathBuf>,
}

/// The device process XRT 2.13's software emulation forks and execs (below `XILINX_VITIS`); it
/// ships with Vitis only. Without it XRT prints "[SW-EM 10]" / "[SW-EM 11]" and then ends the
/// whole process with exit code 1 ("[SDx-EM 08-0] Failed to connect to device process").
pub const SW_EMU_MODELS: [&str; 2] = [
    "data/emulation/unified/sw_emu/generic_pcie/model/genericpciemodel",
    "data/emulation/unified/cpu_em/generic_pcie/model/genericpciemodel",
];

impl XrtEnv {
    /// Checks that calling into libxrt cannot abort for want of its environment: `XILINX_XRT`
    /// names a prefix whose `lib/` holds the shim XRT will load (the board shim, or the
    /// emulation shim under `XCL_EMULATION_MODE`).
    pub fn check(&self, install: &XrtInstall) -> Result<(), FpgaError> {
        let hint = match &install.prefix {
            Some(p) => format!("export XILINX_XRT={}", p.display()),
            None => format!(
                "make a prefix and name it: mkdir -p ~/.local/xrt && ln -s {} ~/.local/xrt/lib \
                 && export XILINX_XRT=~/.local/xrt",
                install.lib_dir().display()
            ),
        };
        let Some(prefix) = &self.xilinx_xrt else {
            return Err(unavailable(format!(
                "XRT {} found ({}), but XILINX_XRT is not set, and XRT 2.13 aborts the process \
                 without it; {hint}",
                install.version.as_deref().unwrap_or("(version unknown)"),
                install.library.display()
            )));
        };
        let shim = match self.emulation.as_deref() {
            None | Some("") => CORE_SHIM,
            Some("sw_emu") => "libxrt_swemu.so.2",
            Some("hw_emu") => "libxrt_hwemu.so.2",
            Some(other) => {
                return Err(unavailable(format!(
                    "XCL_EMULATION_MODE={other} is not accepted; expected sw_emu or hw_emu, or \
                     unset for a board"
                )));
            }
        };
        let want = prefix.join("lib").join(shim);
        if !want.is_file() {
            return Err(unavailable(format!(
                "XILINX_XRT={} has no lib/{shim}, and XRT 2.13 aborts the process without it; {hint}",
                prefix.display()
            )));
        }
        if shim != CORE_SHIM {
            let vitis = self.xilinx_vitis.as_deref();
            let model = vitis.and_then(|v| {
                SW_EMU_MODELS
                    .iter()
                    .map(|m| v.join(m))
                    .find(|m| m.is_file())
            });
            if model.is_none() {
                return Err(unavailable(format!(
                    "XCL_EMULATION_MODE={}: XRT's emulation forks Vitis's device process \
                     ($XILINX_VITIS/{}), which is not here (XILINX_VITIS {}); without it XRT ends \
                     the process. Emulation needs a Vitis install",
                    self.emulation.as_deref().unwrap_or_default(),
                    SW_EMU_MODELS[1],
                    vitis.map_or("is not set".to_string(), |v| format!("= {}", v.display()))
                )));
            }
        }
        Ok(())
    }
}

/// libxrt_coreutil, loaded, with the installation it came from.
#[derive(Debug)]
pub struct Xrt {
    api: XrtApi,
    /// Where it came from.
    pub install: XrtInstall,
}

impl std::fmt::Debug for XrtApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("XrtApi")
    }
}

impl Xrt {
    /// Finds XRT, checks the environment (see [`XrtEnv::check`]) and loads the library with
    /// every function tandem binds.
    pub fn load(search: &XrtSearch, env: &XrtEnv) -> Result<Arc<Self>, FpgaError> {
        let install = XrtInstall::find(search)?;
        env.check(&install)?;
        Self::load_unchecked(install)
    }

    /// Loads the library of `install` without checking the environment: for the probe child,
    /// whose environment its parent set up.
    pub(crate) fn load_unchecked(install: XrtInstall) -> Result<Arc<Self>, FpgaError> {
        // SAFETY: loading runs libxrt_coreutil's static constructors, which only set up
        // XRT's own state (checked: loading it with no XILINX_XRT is harmless; calls are not).
        let api = unsafe { XrtApi::new(&install.library) }.map_err(|e| {
            unavailable(format!(
                "{} does not load as XRT 2.13's C API: {e}",
                install.library.display()
            ))
        })?;
        Ok(Arc::new(Self { api, install }))
    }

    /// The bound functions.
    pub(crate) fn api(&self) -> &XrtApi {
        &self.api
    }
}
