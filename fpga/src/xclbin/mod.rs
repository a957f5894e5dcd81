//! A reader for xclbin files (XRT's axlf container), and the manifest of built xclbins.
//!
//! [`Xclbin::parse`] checks the magic (`xclbin2\0`), `m_length` and `m_numSections` against
//! the file's size and every section's offset and size against `m_length`, then reads the
//! sections tandem needs: IP_LAYOUT ([`ip_layout`]), CONNECTIVITY ([`connectivity`]),
//! MEM_TOPOLOGY ([`mem_topology`]), CLOCK_FREQ_TOPOLOGY ([`clocks`]) and EMBEDDED_METADATA
//! ([`metadata`]), and joins them into [`Xclbin::kernels`]: each kernel's arguments and the
//! bank each argument is connected to. Every field is read little-endian through a bounds
//! check (module `bytes`), every count is checked against its section's size before anything is
//! allocated: truncated or corrupt input is an [`XclbinError`] that names the field, never a
//! panic. Layouts follow XRT 2.13's `xclbin.h`.
//!
//! [`manifest`] reads and writes `bitstreams/manifest.toml` and checks a file against its
//! entry ([`check_against_manifest`]) before XRT sees it.

mod bytes;
pub mod clocks;
pub mod connectivity;
pub mod header;
pub mod ip_layout;
pub mod kernels;
pub mod manifest;
pub mod mem_topology;
pub mod metadata;
pub mod summary;

use std::path::{Path, PathBuf};

pub use clocks::ClockFreq;
pub use connectivity::Connection;
pub use header::{Header, SectionHeader, SectionKind, Uuid};
pub use ip_layout::IpData;
pub use kernels::{ArgBank, ArgInfo, ComputeUnit, KernelInfo};
pub use manifest::{BitstreamManifest, ManifestEntry, ManifestError, check_against_manifest};
pub use mem_topology::MemData;
pub use metadata::{ArgMeta, KernelMeta, PortMeta};
pub use summary::Summary;

use bytes::Bytes;

/// Errors of the xclbin reader.
#[derive(Debug, thiserror::Error)]
pub enum XclbinError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Not a regular file (a folder, a device).
    #[error("{path}: not a regular file")]
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// The magic is not `xclbin2\0`.
    #[error("not an xclbin: the file starts with \"{found}\", expected \"xclbin2\\0\"")]
    BadMagic {
        /// The first 8 bytes, escaped.
        found: String,
    },
    /// A field lies past the end of the file or its section.
    #[error("truncated: {field} needs file bytes {start}..{end}, only {available} are there")]
    Truncated {
        /// The field.
        field: String,
        /// Its first byte (file offset).
        start: u64,
        /// One past its last byte.
        end: u64,
        /// Bytes available up to the end of the file or section (file offset).
        available: u64,
    },
    /// A field holds an impossible value.
    #[error("corrupt {field}: {msg}")]
    Corrupt {
        /// The field.
        field: String,
        /// What is wrong with it.
        msg: String,
    },
    /// The EMBEDDED_METADATA XML is unusable.
    #[error("EMBEDDED_METADATA: {msg}")]
    Metadata {
        /// What is wrong.
        msg: String,
    },
    /// A section a caller needs is absent.
    #[error("the xclbin has no {section} section (it has: {present})")]
    MissingSection {
        /// The section.
        section: String,
        /// The sections it has.
        present: String,
    },
    /// An error in the file `path` (the message includes the inner error, which is
    /// therefore not reported again as a source).
    #[error("{path}: {error}")]
    InFile {
        /// The file.
        path: PathBuf,
        /// The error.
        error: Box<XclbinError>,
    },
}

/// A parsed xclbin.
#[derive(Debug, Clone)]
pub struct Xclbin {
    /// The header.
    pub header: Header,
    /// The section table, in file order.
    pub sections: Vec<SectionHeader>,
    /// IP_LAYOUT entries, if the section is present.
    pub ip_layout: Option<Vec<IpData>>,
    /// MEM_TOPOLOGY entries, if present.
    pub mem_topology: Option<Vec<MemData>>,
    /// CONNECTIVITY entries, if present.
    pub connectivity: Option<Vec<Connection>>,
    /// CLOCK_FREQ_TOPOLOGY entries, if present.
    pub clocks: Option<Vec<ClockFreq>>,
    /// The kernels of EMBEDDED_METADATA, if present.
    pub metadata: Option<Vec<KernelMeta>>,
    /// The kernels joined across sections.
    pub kernels: Vec<KernelInfo>,
}

impl Xclbin {
    /// Reads and parses the file at `path`; errors name the file.
    pub fn read(path: &Path) -> Result<Self, XclbinError> {
        let bytes = read_file(path)?;
        Self::parse(&bytes).map_err(|e| XclbinError::InFile {
            path: path.to_path_buf(),
            error: Box::new(e),
        })
    }

    /// Parses the bytes of an xclbin.
    pub fn parse(data: &[u8]) -> Result<Self, XclbinError> {
        let file = Bytes::new(data, 0);
        let header = Header::parse(&file)?;
        let mut sections = Vec::with_capacity(header.num_sections as usize);
        for i in 0..header.num_sections as usize {
            sections.push(SectionHeader::parse(&file, i, header.length)?);
        }
        // XRT uses the first section of a kind (xclbin::get_axlf_section).
        let payload = |kind: SectionKind| -> Result<Option<(&[u8], u64)>, XclbinError> {
            let Some(s) = sections.iter().find(|s| s.kind == kind) else {
                return Ok(None);
            };
            let field = format!("{kind} section");
            let too_big = || XclbinError::Corrupt {
                field: field.clone(),
                msg: format!("offset {} size {} do not fit in memory", s.offset, s.size),
            };
            let a = usize::try_from(s.offset).map_err(|_| too_big())?;
            let n = usize::try_from(s.size).map_err(|_| too_big())?;
            Ok(Some((file.slice(a, n, &field)?, s.offset)))
        };
        let ip_layout = payload(SectionKind::IP_LAYOUT)?
            .map(|(d, o)| ip_layout::parse(d, o))
            .transpose()?;
        let mem_topology = payload(SectionKind::MEM_TOPOLOGY)?
            .map(|(d, o)| mem_topology::parse(d, o))
            .transpose()?;
        let connectivity = payload(SectionKind::CONNECTIVITY)?
            .map(|(d, o)| connectivity::parse(d, o))
            .transpose()?;
        let clocks = payload(SectionKind::CLOCK_FREQ_TOPOLOGY)?
            .map(|(d, o)| clocks::parse(d, o))
            .transpose()?;
        let metadata = payload(SectionKind::EMBEDDED_METADATA)?
            .map(|(d, _)| metadata::parse_kernels(d))
            .transpose()?;
        let kernels = kernels::join(
            metadata.as_deref(),
            ip_layout.as_deref(),
            connectivity.as_deref(),
            mem_topology.as_deref(),
        )?;
        Ok(Self {
            header,
            sections,
            ip_layout,
            mem_topology,
            connectivity,
            clocks,
            metadata,
            kernels,
        })
    }

    /// The target platform (`m_platformVBNV`).
    pub fn platform(&self) -> &str {
        &self.header.platform_vbnv
    }

    /// The xclbin's UUID.
    pub fn uuid(&self) -> Uuid {
        self.header.uuid
    }

    /// The kernel `name`.
    pub fn kernel(&self, name: &str) -> Option<&KernelInfo> {
        self.kernels.iter().find(|k| k.name == name)
    }

    /// The first section of `kind`.
    pub fn section(&self, kind: SectionKind) -> Option<&SectionHeader> {
        self.sections.iter().find(|s| s.kind == kind)
    }

    /// The first section of `kind`, or an error that lists the sections present.
    pub fn require(&self, kind: SectionKind) -> Result<&SectionHeader, XclbinError> {
        self.section(kind)
            .ok_or_else(|| XclbinError::MissingSection {
                section: kind.name(),
                present: self.section_names(),
            })
    }

    /// The names of the sections present, comma-separated (`none` if there are none).
    pub fn section_names(&self) -> String {
        if self.sections.is_empty() {
            return "none".into();
        }
        self.sections
            .iter()
            .map(|s| s.kind.name())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The frequency of the clock that drives the kernels' `ap_clk` (the first clock of type
    /// DATA, `DATA_CLK` in a Vitis build), MHz.
    pub fn kernel_clock_mhz(&self) -> Option<u16> {
        self.clocks
            .as_deref()?
            .iter()
            .find(|c| c.clock_type == clocks::CT_DATA)
            .map(|c| c.freq_mhz)
    }
}

/// Reads a regular file (never a device or a folder, which could hang or be huge).
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>, XclbinError> {
    let io = |source| XclbinError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(XclbinError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    std::fs::read(path).map_err(io)
}
