//! The emitter: writes a kernel's Verilog, `kernel.xml` and a manifest of its parameters to
//! a folder, the input of both the simulator and `package_xo`.
//!
//! Files: `<name>.v` (top module `<name>` with Vitis port names, shell submodules, the core),
//! `kernel.xml`, `manifest.json` (kernel, parameters, shell options, the build's target clock,
//! register map, and a SHA-256 of the Verilog that the simulator uses as its cache key). A
//! device reads the manifest back ([`Manifest::read`]) to learn the clock of what it loaded.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::core::KernelCore;
use crate::regmap::{ArgSlot, KernelDesc};
use crate::shell::{ShellConfig, ShellError, kernel_verilog};

/// Errors of the emitter.
#[derive(Debug, thiserror::Error)]
pub enum EmitError {
    /// Generating the Verilog failed.
    #[error(transparent)]
    Shell(#[from] ShellError),
    /// The description is unusable.
    #[error(transparent)]
    Desc(#[from] crate::regmap::DescError),
    /// A manifest could not be parsed.
    #[error("{path}: not a kernel manifest: {msg}")]
    Manifest {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        msg: String,
    },
    /// Writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// What the manifest records.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    /// Kernel name (top module).
    pub kernel: String,
    /// Build parameters of the core.
    pub params: Vec<(String, i64)>,
    /// Shell options.
    pub shell: ShellConfig,
    /// Target clock of the build, MHz (what the pipelines are cut for; a manifest written
    /// before the field existed reads as [`crate::DEFAULT_CLOCK_MHZ`]).
    #[serde(default = "default_clock_mhz")]
    pub clock_mhz: f64,
    /// Width of the `m_axi_gmem` data bus in bits ([`KernelCore::data_bits`]; a manifest
    /// written before the field existed reads as 64).
    #[serde(default = "default_data_bits")]
    pub data_bits: u32,
    /// Register map of the arguments.
    pub args: Vec<ArgSlot>,
    /// SHA-256 of the Verilog, hex.
    pub verilog_sha256: String,
    /// The Verilog file name.
    pub verilog: String,
}

fn default_data_bits() -> u32 {
    64
}

fn default_clock_mhz() -> f64 {
    crate::DEFAULT_CLOCK_MHZ
}

impl Manifest {
    /// File name of the manifest in an emitted folder.
    pub const FILE: &'static str = "manifest.json";

    /// Reads the manifest of the emitted folder `dir`.
    pub fn read(dir: &Path) -> Result<Self, EmitError> {
        let path = dir.join(Self::FILE);
        let text = std::fs::read_to_string(&path).map_err(|source| EmitError::Io {
            path: path.clone(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|e| EmitError::Manifest {
            path,
            msg: e.to_string(),
        })
    }

    /// The interface of the emitted kernel, from its register map (written with the Verilog,
    /// so it describes that Verilog: its [`KernelDesc::axi_ports`] are the masters the top
    /// module has).
    pub fn desc(&self) -> KernelDesc {
        KernelDesc {
            name: self.kernel.clone(),
            args: self.args.iter().map(|s| s.arg.clone()).collect(),
        }
    }
}

/// An emitted kernel: where its files are.
#[derive(Debug, Clone)]
pub struct Emitted {
    /// The folder.
    pub dir: PathBuf,
    /// `<name>.v`.
    pub verilog: PathBuf,
    /// `kernel.xml`.
    pub kernel_xml: PathBuf,
    /// `manifest.json`.
    pub manifest_path: PathBuf,
    /// The manifest.
    pub manifest: Manifest,
    /// The interface.
    pub desc: KernelDesc,
}

/// The Verilog and manifest of a kernel, without writing anything.
pub fn generate(core: &dyn KernelCore, cfg: ShellConfig) -> Result<(String, Manifest), EmitError> {
    let v = kernel_verilog(core, cfg)?;
    let desc = core.desc();
    let hash = hex(&Sha256::digest(v.as_bytes()));
    let m = Manifest {
        kernel: core.name().to_string(),
        params: core.params(),
        shell: cfg,
        clock_mhz: crate::DEFAULT_CLOCK_MHZ,
        data_bits: core.data_bits(),
        args: desc.slots()?,
        verilog_sha256: hash,
        verilog: format!("{}.v", core.name()),
    };
    Ok((v, m))
}

/// Writes `<name>.v`, `kernel.xml` and `manifest.json` of `core` into `dir` (created).
pub fn emit(core: &dyn KernelCore, cfg: ShellConfig, dir: &Path) -> Result<Emitted, EmitError> {
    let (v, manifest) = generate(core, cfg)?;
    let desc = core.desc();
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| EmitError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let verilog = dir.join(&manifest.verilog);
    write_atomic(&verilog, v.as_bytes()).map_err(io(&verilog))?;
    let kernel_xml = dir.join("kernel.xml");
    write_atomic(&kernel_xml, desc.kernel_xml(core.data_bits())?.as_bytes())
        .map_err(io(&kernel_xml))?;
    let manifest_path = dir.join(Manifest::FILE);
    let json = serde_json::to_string_pretty(&manifest).unwrap_or_default();
    write_atomic(&manifest_path, json.as_bytes()).map_err(io(&manifest_path))?;
    tracing::debug!(kernel = core.name(), dir = %dir.display(), "emitted kernel");
    Ok(Emitted {
        dir: dir.to_path_buf(),
        verilog,
        kernel_xml,
        manifest_path,
        manifest,
        desc,
    })
}

/// Writes `bytes` to `path` through a temporary file of a name unique to this process and call,
/// renamed into place: a reader (Verilator building the same kernel in another test or process)
/// sees the old file or the new one, never a truncated one. A file that already holds `bytes`
/// is left alone (emitted once per content, not rewritten on every card load).
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.{n}.partial", std::process::id()));
    let r = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// Lower-case hex of bytes.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn the_manifest_gives_back_the_interface_and_its_masters() {
        for (w_ports, masters) in [(false, 1), (true, 3)] {
            let core = crate::kernels::gemm::GemmCore {
                rows: 4,
                k_max: 128,
                n_max: 128,
                lanes: 64,
                w_ports,
            };
            let (_, m) = generate(&core, ShellConfig::default()).expect("generate");
            let json = serde_json::to_string(&m).expect("json");
            let back: Manifest = serde_json::from_str(&json).expect("read back");
            assert_eq!(back.desc(), core.desc());
            assert_eq!(back.desc().axi_ports(), masters);
        }
    }

    #[test]
    fn identical_content_is_not_rewritten_changed_content_is() -> std::io::Result<()> {
        let d = tempfile::tempdir()?;
        let p = d.path().join("k.v");
        write_atomic(&p, b"module k; endmodule")?;
        let ino = std::fs::metadata(&p)?.ino();
        write_atomic(&p, b"module k; endmodule")?;
        assert_eq!(
            std::fs::metadata(&p)?.ino(),
            ino,
            "the same file, not a new one"
        );
        write_atomic(&p, b"module k2; endmodule")?;
        assert_ne!(
            std::fs::metadata(&p)?.ino(),
            ino,
            "new content: renamed into place"
        );
        assert_eq!(std::fs::read(&p)?, b"module k2; endmodule");
        let left: Vec<_> = std::fs::read_dir(d.path())?.flatten().collect();
        assert_eq!(left.len(), 1, "no temporary file left");
        Ok(())
    }
}
