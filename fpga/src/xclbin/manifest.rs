//! `bitstreams/manifest.toml`: the xclbins tandem built, each with its platform, kernels,
//! clock and SHA-256, and the check a loader runs before XRT sees a file
//! ([`check_against_manifest`]).
//!
//! ```toml
//! [[xclbin]]
//! name = "gemm_u55c"                             # unique
//! path = "gemm_u55c.xclbin"                      # relative to the manifest's folder
//! platform = "xilinx_u55c_gen3x16_xdma_3_202210_1"
//! kernels = ["gemm"]
//! clock_mhz = 300                                # DATA_CLK (ap_clk) the link reached
//! sha256 = "<64 hex digits>"
//! uuid = "<the xclbin's UUID>"                    # optional
//! verilog_sha256 = "<from the emit manifest.json>" # optional
//! params = { rows = 16, k_max = 1024 }           # optional, the kernel's build parameters
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{Xclbin, XclbinError, read_file};

/// The comment block at the top of a manifest tandem writes.
pub const MANIFEST_HEADER: &str = "\
# xclbins built from tandem's kernels (`tandem fpga package` adds an entry per build).
# Building one needs Vivado/Vitis and the platform; none is checked in. Before XRT loads a
# file, tandem checks it against its entry: size and structure, SHA-256, platform, kernels,
# clock (tandem_fpga::xclbin::check_against_manifest). Format: fpga/src/xclbin/manifest.rs.
";

/// One built xclbin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestEntry {
    /// Unique name (`gemm_u55c`).
    pub name: String,
    /// The file, relative to the manifest's folder (or absolute).
    pub path: PathBuf,
    /// The platform VBNV it was linked for.
    pub platform: String,
    /// The kernels it holds.
    pub kernels: Vec<String>,
    /// The frequency of the kernels' clock (DATA_CLK) the link reached, MHz.
    pub clock_mhz: u32,
    /// SHA-256 of the file, lowercase hex.
    pub sha256: String,
    /// The xclbin's UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// SHA-256 of the Verilog it was built from (the emit folder's manifest.json).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verilog_sha256: Option<String>,
    /// The kernel's build parameters.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, i64>,
}

impl ManifestEntry {
    /// The entry's file, resolved against the manifest's folder `dir`.
    pub fn file_in(&self, dir: &Path) -> PathBuf {
        if self.path.is_absolute() {
            self.path.clone()
        } else {
            dir.join(&self.path)
        }
    }

    /// Checks the entry's own fields (a SHA-256 of 64 hex digits, at least one kernel).
    pub fn validate(&self) -> Result<(), ManifestError> {
        let bad = |msg: String| ManifestError::Entry {
            name: self.name.clone(),
            msg,
        };
        if self.sha256.len() != 64 || !self.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad(format!(
                "sha256 = \"{}\" is not 64 hex digits",
                self.sha256
            )));
        }
        if self.kernels.is_empty() {
            return Err(bad("kernels is empty".into()));
        }
        if self.name.trim().is_empty() {
            return Err(bad("name is empty".into()));
        }
        Ok(())
    }
}

/// The manifest file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BitstreamManifest {
    /// The entries (`[[xclbin]]` tables).
    #[serde(default, rename = "xclbin")]
    pub entries: Vec<ManifestEntry>,
}

/// Errors of the manifest and of checking a file against it.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The manifest could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The manifest is not valid TOML of the expected shape.
    #[error("{path}: not a bitstream manifest: {msg}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        msg: String,
    },
    /// An entry's fields are unusable.
    #[error("manifest entry `{name}`: {msg}")]
    Entry {
        /// The entry.
        name: String,
        /// What is wrong.
        msg: String,
    },
    /// Two entries share a name.
    #[error("manifest: two entries are named `{name}`")]
    Duplicate {
        /// The name.
        name: String,
    },
    /// The file is not a readable, well-formed xclbin.
    #[error(transparent)]
    Xclbin(#[from] XclbinError),
    /// The file's SHA-256 differs from the manifest's.
    #[error(
        "{path}: SHA-256 is {file}, the manifest entry `{name}` says {manifest}: the file changed or is not the one built"
    )]
    Hash {
        /// The file.
        path: PathBuf,
        /// The entry.
        name: String,
        /// What the manifest says.
        manifest: String,
        /// What the file hashes to.
        file: String,
    },
    /// The file was linked for another platform than the manifest says.
    #[error("{path}: built for platform {file}, the manifest entry `{name}` says {manifest}")]
    Platform {
        /// The file.
        path: PathBuf,
        /// The entry.
        name: String,
        /// What the manifest says.
        manifest: String,
        /// What the file's header says.
        file: String,
    },
    /// A kernel of the entry is not in the file.
    #[error(
        "{path}: no kernel `{kernel}` (the manifest entry `{name}` lists it; the file has: {present})"
    )]
    KernelMissing {
        /// The file.
        path: PathBuf,
        /// The entry.
        name: String,
        /// The kernel.
        kernel: String,
        /// The kernels the file has.
        present: String,
    },
    /// The kernel clock differs.
    #[error(
        "{path}: kernel clock (DATA_CLK) is {file}, the manifest entry `{name}` says {manifest} MHz"
    )]
    Clock {
        /// The file.
        path: PathBuf,
        /// The entry.
        name: String,
        /// What the manifest says, MHz.
        manifest: u32,
        /// What the file says.
        file: String,
    },
    /// The UUID differs.
    #[error("{path}: UUID is {file}, the manifest entry `{name}` says {manifest}")]
    Uuid {
        /// The file.
        path: PathBuf,
        /// The entry.
        name: String,
        /// What the manifest says.
        manifest: String,
        /// What the file says.
        file: String,
    },
    /// The board runs another platform than the xclbin was built for.
    #[error("{path}: built for platform {file}, the board runs {board}")]
    BoardPlatform {
        /// The file.
        path: PathBuf,
        /// The xclbin's platform.
        file: String,
        /// The board's platform (shell).
        board: String,
    },
}

impl BitstreamManifest {
    /// Parses manifest text (`path` for errors); entries are validated and names unique.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ManifestError> {
        let m: Self = toml::from_str(text).map_err(|e| ManifestError::Parse {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
        for (i, e) in m.entries.iter().enumerate() {
            e.validate()?;
            if m.entries[..i].iter().any(|o| o.name == e.name) {
                return Err(ManifestError::Duplicate {
                    name: e.name.clone(),
                });
            }
        }
        Ok(m)
    }

    /// Reads the manifest at `path`.
    pub fn load(path: &Path) -> Result<Self, ManifestError> {
        let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Reads the manifest at `path`, or an empty one if the file does not exist.
    pub fn load_or_empty(path: &Path) -> Result<Self, ManifestError> {
        if path.exists() {
            Self::load(path)
        } else {
            Ok(Self::default())
        }
    }

    /// The manifest as TOML, under [`MANIFEST_HEADER`].
    pub fn to_toml(&self) -> Result<String, ManifestError> {
        let body = toml::to_string(self).map_err(|e| ManifestError::Parse {
            path: PathBuf::from("<manifest>"),
            msg: e.to_string(),
        })?;
        Ok(format!("{MANIFEST_HEADER}\n{body}"))
    }

    /// Writes the manifest to `path`.
    pub fn write(&self, path: &Path) -> Result<(), ManifestError> {
        let text = self.to_toml()?;
        std::fs::write(path, text).map_err(|source| ManifestError::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    /// The entry `name`.
    pub fn entry(&self, name: &str) -> Option<&ManifestEntry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// The first entry that holds `kernel` and was built for `platform` (a VBNV, a base shell
    /// name or a platform key such as `u55c`).
    pub fn find(&self, kernel: &str, platform: &str) -> Option<&ManifestEntry> {
        let want = crate::platform::platform(platform).ok();
        self.entries.iter().find(|e| {
            e.kernels.iter().any(|k| k == kernel)
                && (e.platform == platform || want.is_some_and(|p| p.matches(&e.platform)))
        })
    }

    /// Adds `entry`, replacing the entry of the same name.
    pub fn upsert(&mut self, entry: ManifestEntry) -> Result<(), ManifestError> {
        entry.validate()?;
        match self.entries.iter_mut().find(|e| e.name == entry.name) {
            Some(e) => *e = entry,
            None => self.entries.push(entry),
        }
        Ok(())
    }
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Checks the xclbin at `path` against its manifest `entry` before XRT sees it: the file is
/// a well-formed xclbin (magic, lengths, section table and sections; truncated or corrupt
/// files fail here naming the field), its SHA-256 is the entry's, it was linked for the
/// entry's platform, it holds every kernel the entry lists, its kernel clock is the entry's
/// and, where the entry records one, its UUID. Returns the parsed file.
pub fn check_against_manifest(path: &Path, entry: &ManifestEntry) -> Result<Xclbin, ManifestError> {
    entry.validate()?;
    let bytes = read_file(path)?;
    let in_file = |e: XclbinError| XclbinError::InFile {
        path: path.to_path_buf(),
        error: Box::new(e),
    };
    let x = Xclbin::parse(&bytes).map_err(in_file)?;
    let name = entry.name.clone();
    let p = || path.to_path_buf();
    let hash = sha256_hex(&bytes);
    if !hash.eq_ignore_ascii_case(&entry.sha256) {
        return Err(ManifestError::Hash {
            path: p(),
            name,
            manifest: entry.sha256.clone(),
            file: hash,
        });
    }
    if x.platform() != entry.platform {
        return Err(ManifestError::Platform {
            path: p(),
            name,
            manifest: entry.platform.clone(),
            file: x.platform().to_string(),
        });
    }
    for k in &entry.kernels {
        if x.kernel(k).is_none() {
            let present = x
                .kernels
                .iter()
                .map(|k| k.name.as_str())
                .collect::<Vec<_>>();
            return Err(ManifestError::KernelMissing {
                path: p(),
                name,
                kernel: k.clone(),
                present: if present.is_empty() {
                    "no kernels".into()
                } else {
                    present.join(", ")
                },
            });
        }
    }
    match x.kernel_clock_mhz() {
        Some(mhz) if u32::from(mhz) == entry.clock_mhz => {}
        found => {
            return Err(ManifestError::Clock {
                path: p(),
                name,
                manifest: entry.clock_mhz,
                file: found.map_or_else(
                    || "absent (no DATA clock in CLOCK_FREQ_TOPOLOGY)".into(),
                    |m| format!("{m} MHz"),
                ),
            });
        }
    }
    if let Some(u) = &entry.uuid {
        let file = x.uuid().to_string();
        if !file.eq_ignore_ascii_case(u) {
            return Err(ManifestError::Uuid {
                path: p(),
                name,
                manifest: u.clone(),
                file,
            });
        }
    }
    Ok(x)
}

/// Checks that the xclbin `x` (read from `path`) was built for the platform a board runs
/// (`board`: the board's VBNV or base shell name, as XRT reports it). Two names of one
/// platform in tandem's table ([`crate::platform`]) match; unknown names must be equal.
pub fn check_board_platform(x: &Xclbin, path: &Path, board: &str) -> Result<(), ManifestError> {
    let file = x.platform();
    let same = file == board || crate::platform::platform(file).is_ok_and(|p| p.matches(board));
    if same {
        Ok(())
    } else {
        Err(ManifestError::BoardPlatform {
            path: path.to_path_buf(),
            file: file.to_string(),
            board: board.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> ManifestEntry {
        ManifestEntry {
            name: "gemm_u55c".into(),
            path: "gemm_u55c.xclbin".into(),
            platform: crate::platform::U55C.vbnv.into(),
            kernels: vec!["gemm".into()],
            clock_mhz: 300,
            sha256: "ab".repeat(32),
            uuid: None,
            verilog_sha256: None,
            params: BTreeMap::from([("rows".to_string(), 16)]),
        }
    }

    #[test]
    fn toml_round_trips_and_keeps_the_header() {
        let mut m = BitstreamManifest::default();
        m.upsert(entry()).expect("upsert");
        let text = m.to_toml().expect("toml");
        assert!(text.starts_with(MANIFEST_HEADER));
        assert!(text.contains("[[xclbin]]"), "{text}");
        let back = BitstreamManifest::parse(&text, Path::new("m.toml")).expect("parse");
        assert_eq!(back, m);
        assert!(back.find("gemm", "u55c").is_some());
        assert!(
            back.find("gemm", "xilinx_u55c_gen3x16_xdma_base_3")
                .is_some()
        );
        assert!(back.find("gemm", "u250").is_none());
        assert!(back.find("router", "u55c").is_none());
        // Replacing keeps one entry of the name.
        let mut e = entry();
        e.clock_mhz = 250;
        m.upsert(e).expect("upsert");
        assert_eq!(m.entries.len(), 1);
        assert_eq!(m.entries[0].clock_mhz, 250);
    }

    #[test]
    fn bad_manifests_say_why() {
        let p = Path::new("m.toml");
        let e = |t: &str| {
            BitstreamManifest::parse(t, p)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let ok = BitstreamManifest {
            entries: vec![entry()],
        }
        .to_toml()
        .expect("toml");
        assert!(
            e(&ok.replace(&"ab".repeat(32), "xyz"))
                .contains("sha256 = \"xyz\" is not 64 hex digits")
        );
        assert!(
            e(&ok.replace("kernels = [\"gemm\"]", "kernels = []")).contains("kernels is empty")
        );
        assert!(
            e(&format!("{ok}\n{}", ok.replace(MANIFEST_HEADER, "")))
                .contains("two entries are named `gemm_u55c`")
        );
        assert!(e("[[xclbin]]\nname = \"x\"\n").contains("missing field"));
        assert!(e(&ok.replace("clock_mhz", "clock_hz")).contains("unknown field"));
        // The manifest checked in parses.
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bitstreams/manifest.toml");
        BitstreamManifest::load(&repo).expect("bitstreams/manifest.toml parses");
    }
}
