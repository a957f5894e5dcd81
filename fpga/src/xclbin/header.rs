//! The axlf container's fixed part: `struct axlf` (magic, signature length, key block, unique
//! id), its inline `struct axlf_header` and the table of `struct axlf_section_header`, laid out
//! as in XRT's `xclbin.h` (sizes 496, 152 and 40 bytes; all fields little-endian).

use serde::Serialize;

use super::XclbinError;
use super::bytes::Bytes;

/// The file magic, `xclbin2\0`.
pub const MAGIC: &[u8; 8] = b"xclbin2\0";
/// File offset of the inline `axlf_header` (after magic, signature length, reserved bytes,
/// key block and unique id).
pub const HEADER_OFFSET: usize = 304;
/// Size of `struct axlf_header`.
pub const HEADER_SIZE: usize = 152;
/// File offset of the first section header.
pub const SECTIONS_OFFSET: usize = HEADER_OFFSET + HEADER_SIZE;
/// Size of one `struct axlf_section_header`.
pub const SECTION_HEADER_SIZE: usize = 40;
/// XRT's limit on the number of sections (`XCLBIN_MAX_NUM_SECTION`).
pub const MAX_SECTIONS: u32 = 0x10000;

/// A UUID as stored in the file (16 bytes), shown as `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`
/// like `xclbinutil --info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Uuid(pub [u8; 16]);

impl Uuid {
    /// Whether all bytes are zero (no UUID set).
    pub fn is_nil(&self) -> bool {
        self.0.iter().all(|&b| b == 0)
    }
}

impl std::fmt::Display for Uuid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl Serialize for Uuid {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// `axlf_section_kind`: the kind of a section, named as xclbinutil names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SectionKind(pub u32);

/// Section names as xclbinutil 2.13 spells them (`--add-section NAME:...`, `--info`), indexed
/// by `enum axlf_section_kind`.
const SECTION_NAMES: [&str; 32] = [
    "BITSTREAM",
    "CLEARING_BITSTREAM",
    "EMBEDDED_METADATA",
    "FIRMWARE",
    "DEBUG_DATA",
    "SCHED_FIRMWARE",
    "MEM_TOPOLOGY",
    "CONNECTIVITY",
    "IP_LAYOUT",
    "DEBUG_IP_LAYOUT",
    "DESIGN_CHECKPOINT",
    "CLOCK_FREQ_TOPOLOGY",
    "MCS",
    "BMC",
    "BUILD_METADATA",
    "KEYVALUE_METADATA",
    "USER_METADATA",
    "DNA_CERTIFICATE",
    "PDI",
    "BITSTREAM_PARTIAL_PDI",
    "PARTITION_METADATA",
    "EMULATION_DATA",
    "SYSTEM_METADATA",
    "SOFT_KERNEL",
    "FLASH",
    "AIE_METADATA",
    "GROUP_TOPOLOGY",
    "GROUP_CONNECTIVITY",
    "SMARTNIC",
    "AIE_RESOURCES",
    "OVERLAY",
    "VENDER_METADATA",
];

impl SectionKind {
    /// `BITSTREAM`.
    pub const BITSTREAM: Self = Self(0);
    /// `EMBEDDED_METADATA`: the kernels' XML.
    pub const EMBEDDED_METADATA: Self = Self(2);
    /// `MEM_TOPOLOGY`: the memory banks.
    pub const MEM_TOPOLOGY: Self = Self(6);
    /// `CONNECTIVITY`: which bank each kernel argument is connected to.
    pub const CONNECTIVITY: Self = Self(7);
    /// `IP_LAYOUT`: the compute units and other IPs on the control bus.
    pub const IP_LAYOUT: Self = Self(8);
    /// `CLOCK_FREQ_TOPOLOGY`: the clocks.
    pub const CLOCK_FREQ_TOPOLOGY: Self = Self(11);
    /// `BUILD_METADATA`.
    pub const BUILD_METADATA: Self = Self(14);

    /// xclbinutil's name of the kind (`IP_LAYOUT`), or `UNKNOWN(n)`.
    pub fn name(self) -> String {
        SECTION_NAMES
            .get(self.0 as usize)
            .map_or_else(|| format!("UNKNOWN({})", self.0), |s| (*s).to_string())
    }
}

impl std::fmt::Display for SectionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl Serialize for SectionKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// `struct axlf_header` and the fields of `struct axlf` before it.
#[derive(Debug, Clone, Serialize)]
pub struct Header {
    /// `m_signature_length`: bytes of the signature appended after `m_length`; -1 for none.
    pub signature_length: i32,
    /// `m_uniqueId`.
    pub unique_id: u64,
    /// `m_length`: the total size of the xclbin (without an appended signature).
    pub length: u64,
    /// `m_timeStamp`: creation time, seconds since the Unix epoch.
    pub timestamp: u64,
    /// `m_featureRomTimeStamp`.
    pub feature_rom_timestamp: u64,
    /// `m_versionMajor.m_versionMinor.m_versionPatch`: the XRT/Vitis version that wrote it.
    pub version: String,
    /// `m_mode` (`XCLBIN_MODE`).
    pub mode: u16,
    /// `m_actionMask`.
    pub action_mask: u16,
    /// `rom_uuid`: the feature ROM (static shell) UUID the xclbin was built for.
    pub rom_uuid: Uuid,
    /// `m_platformVBNV`: the target platform, e.g. `xilinx_u55c_gen3x16_xdma_3_202210_1`.
    pub platform_vbnv: String,
    /// `uuid`: this xclbin's UUID (XRT's handle for a loaded xclbin).
    pub uuid: Uuid,
    /// `m_debug_bin`.
    pub debug_bin: String,
    /// `m_numSections`.
    pub num_sections: u32,
}

impl Header {
    /// Name of `m_mode` (`XCLBIN_MODE`): `FLAT`, `PR`, `HW_EMU`, `SW_EMU` ...
    pub fn mode_name(&self) -> String {
        const MODES: [&str; 7] = [
            "FLAT",
            "PR",
            "TANDEM_STAGE2",
            "TANDEM_STAGE2_WITH_PR",
            "HW_EMU",
            "SW_EMU",
            "HW_EMU_PR",
        ];
        MODES
            .get(self.mode as usize)
            .map_or_else(|| format!("UNKNOWN({})", self.mode), |s| (*s).to_string())
    }

    /// Reads `struct axlf` up to and including its header from the start of the file, and
    /// checks the magic, `m_length` and `m_numSections` against the file's size.
    pub(crate) fn parse(file: &Bytes<'_>) -> Result<Self, XclbinError> {
        let magic = file.slice(0, 8, "magic")?;
        if magic != MAGIC {
            return Err(XclbinError::BadMagic {
                found: String::from_utf8_lossy(magic).escape_debug().to_string(),
            });
        }
        let h = HEADER_OFFSET;
        // `struct axlf` declares one section header, so a valid file is at least 496 bytes
        // long; the header itself ends at 456.
        file.slice(0, SECTIONS_OFFSET, "axlf_header")?;
        let hdr = Header {
            signature_length: file.i32(8, "m_signature_length")?,
            unique_id: file.u64(296, "m_uniqueId")?,
            length: file.u64(h, "m_length")?,
            timestamp: file.u64(h + 8, "m_timeStamp")?,
            feature_rom_timestamp: file.u64(h + 16, "m_featureRomTimeStamp")?,
            version: format!(
                "{}.{}.{}",
                file.u8(h + 26, "m_versionMajor")?,
                file.u8(h + 27, "m_versionMinor")?,
                file.u16(h + 24, "m_versionPatch")?
            ),
            mode: file.u16(h + 28, "m_mode")?,
            action_mask: file.u16(h + 30, "m_actionMask")?,
            rom_uuid: Uuid(file.bytes16(h + 32, "rom_uuid")?),
            platform_vbnv: file.cstr(h + 48, 64, "m_platformVBNV")?,
            uuid: Uuid(file.bytes16(h + 112, "uuid")?),
            debug_bin: file.cstr(h + 128, 16, "m_debug_bin")?,
            num_sections: file.u32(h + 144, "m_numSections")?,
        };
        let size = file.len() as u64;
        if hdr.length > size {
            return Err(XclbinError::Corrupt {
                field: "m_length".into(),
                msg: format!(
                    "the header says the file is {} bytes, it has {size}: truncated",
                    hdr.length
                ),
            });
        }
        if hdr.length < size {
            // A signed xclbin carries its signature after m_length.
            let sig = u64::try_from(hdr.signature_length).unwrap_or(0);
            if hdr.length.checked_add(sig) != Some(size) {
                return Err(XclbinError::Corrupt {
                    field: "m_length".into(),
                    msg: format!(
                        "the header says the file is {} bytes, it has {size} (signature length {})",
                        hdr.length, hdr.signature_length
                    ),
                });
            }
        }
        if hdr.num_sections > MAX_SECTIONS {
            return Err(XclbinError::Corrupt {
                field: "m_numSections".into(),
                msg: format!(
                    "{} is more than XRT's limit of {MAX_SECTIONS}",
                    hdr.num_sections
                ),
            });
        }
        let table_end =
            SECTIONS_OFFSET as u64 + u64::from(hdr.num_sections) * SECTION_HEADER_SIZE as u64;
        if table_end > hdr.length {
            return Err(XclbinError::Corrupt {
                field: "m_numSections".into(),
                msg: format!(
                    "{} section headers end at byte {table_end}, past m_length {}",
                    hdr.num_sections, hdr.length
                ),
            });
        }
        Ok(hdr)
    }
}

/// `struct axlf_section_header`: where one section's payload lies.
#[derive(Debug, Clone, Serialize)]
pub struct SectionHeader {
    /// `m_sectionKind`.
    pub kind: SectionKind,
    /// `m_sectionName`.
    pub name: String,
    /// `m_sectionOffset`: file offset of the payload.
    pub offset: u64,
    /// `m_sectionSize`: payload bytes.
    pub size: u64,
}

impl SectionHeader {
    /// Reads section header `i` and checks that its payload lies within `m_length`.
    pub(crate) fn parse(file: &Bytes<'_>, i: usize, length: u64) -> Result<Self, XclbinError> {
        let at = SECTIONS_OFFSET + i * SECTION_HEADER_SIZE;
        let field = |f: &str| format!("section header {i} {f}");
        let s = SectionHeader {
            kind: SectionKind(file.u32(at, &field("m_sectionKind"))?),
            name: file.cstr(at + 4, 16, &field("m_sectionName"))?,
            offset: file.u64(at + 24, &field("m_sectionOffset"))?,
            size: file.u64(at + 32, &field("m_sectionSize"))?,
        };
        match s.offset.checked_add(s.size) {
            Some(end) if end <= length => Ok(s),
            _ => Err(XclbinError::Corrupt {
                field: format!("section header {i} ({})", s.kind),
                msg: format!(
                    "payload at offset {} of {} bytes runs past m_length {length}",
                    s.offset, s.size
                ),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_prints_like_xclbinutil() {
        let u = Uuid([
            0xad, 0x06, 0xb9, 0x4c, 0xf9, 0x95, 0x3c, 0x00, 0xac, 0x2d, 0xf9, 0x15, 0xf6, 0x70,
            0x79, 0x3a,
        ]);
        assert_eq!(u.to_string(), "ad06b94c-f995-3c00-ac2d-f915f670793a");
        assert!(!u.is_nil());
        assert!(Uuid([0; 16]).is_nil());
    }

    #[test]
    fn section_kinds_have_xrt_names() {
        assert_eq!(SectionKind::IP_LAYOUT.name(), "IP_LAYOUT");
        assert_eq!(
            SectionKind::CLOCK_FREQ_TOPOLOGY.name(),
            "CLOCK_FREQ_TOPOLOGY"
        );
        assert_eq!(SectionKind(31).name(), "VENDER_METADATA");
        assert_eq!(SectionKind(99).name(), "UNKNOWN(99)");
    }
}
