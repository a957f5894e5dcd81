//! Bounds-checked little-endian reads from a byte slice. Every read names the field it reads,
//! so a truncated or corrupt file yields an error that says which field ran past the end.

use super::XclbinError;

/// A view of `data` (a section payload or the whole file) whose reads are checked against its
/// length. `base` is the file offset of `data[0]`, so errors report file offsets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bytes<'a> {
    data: &'a [u8],
    base: u64,
}

impl<'a> Bytes<'a> {
    /// A view of `data` starting at file offset `base`.
    pub(crate) fn new(data: &'a [u8], base: u64) -> Self {
        Self { data, base }
    }

    /// Length of the view.
    pub(crate) fn len(&self) -> usize {
        self.data.len()
    }

    /// The `n` bytes at `off`, or a truncation error naming `field`.
    pub(crate) fn slice(&self, off: usize, n: usize, field: &str) -> Result<&'a [u8], XclbinError> {
        let end = off.checked_add(n);
        match end {
            Some(end) if end <= self.data.len() => Ok(&self.data[off..end]),
            _ => Err(XclbinError::Truncated {
                field: field.to_string(),
                start: self.base.saturating_add(off as u64),
                end: self
                    .base
                    .saturating_add(off as u64)
                    .saturating_add(n as u64),
                available: self.base.saturating_add(self.data.len() as u64),
            }),
        }
    }

    fn array<const N: usize>(&self, off: usize, field: &str) -> Result<[u8; N], XclbinError> {
        let s = self.slice(off, N, field)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    /// `u8` at `off`.
    pub(crate) fn u8(&self, off: usize, field: &str) -> Result<u8, XclbinError> {
        Ok(self.array::<1>(off, field)?[0])
    }

    /// Little-endian `u16` at `off`.
    pub(crate) fn u16(&self, off: usize, field: &str) -> Result<u16, XclbinError> {
        Ok(u16::from_le_bytes(self.array(off, field)?))
    }

    /// Little-endian `i16` at `off`.
    pub(crate) fn i16(&self, off: usize, field: &str) -> Result<i16, XclbinError> {
        Ok(i16::from_le_bytes(self.array(off, field)?))
    }

    /// Little-endian `u32` at `off`.
    pub(crate) fn u32(&self, off: usize, field: &str) -> Result<u32, XclbinError> {
        Ok(u32::from_le_bytes(self.array(off, field)?))
    }

    /// Little-endian `i32` at `off`.
    pub(crate) fn i32(&self, off: usize, field: &str) -> Result<i32, XclbinError> {
        Ok(i32::from_le_bytes(self.array(off, field)?))
    }

    /// Little-endian `u64` at `off`.
    pub(crate) fn u64(&self, off: usize, field: &str) -> Result<u64, XclbinError> {
        Ok(u64::from_le_bytes(self.array(off, field)?))
    }

    /// 16 raw bytes at `off` (a UUID).
    pub(crate) fn bytes16(&self, off: usize, field: &str) -> Result<[u8; 16], XclbinError> {
        self.array(off, field)
    }

    /// A NUL-terminated string in the fixed `n`-byte field at `off` (the whole field when it
    /// has no NUL). Bytes that are not UTF-8 are replaced, never rejected: names are shown,
    /// not interpreted.
    pub(crate) fn cstr(&self, off: usize, n: usize, field: &str) -> Result<String, XclbinError> {
        let s = self.slice(off, n, field)?;
        let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
        Ok(String::from_utf8_lossy(&s[..end]).into_owned())
    }

    /// A count of `elem`-byte entries starting at `first` read from a signed field: rejects a
    /// negative count and one whose entries would run past the end of the view, before
    /// anything is allocated for them.
    pub(crate) fn count(
        &self,
        raw: i64,
        first: usize,
        elem: usize,
        field: &str,
    ) -> Result<usize, XclbinError> {
        let n = usize::try_from(raw).map_err(|_| XclbinError::Corrupt {
            field: field.to_string(),
            msg: format!("{raw} is negative"),
        })?;
        let need = n.checked_mul(elem).and_then(|b| b.checked_add(first));
        match need {
            Some(need) if need <= self.data.len() => Ok(n),
            _ => Err(XclbinError::Corrupt {
                field: field.to_string(),
                msg: format!(
                    "{n} entries of {elem} bytes do not fit in the {} bytes of the section",
                    self.data.len()
                ),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_and_names_the_field_past_the_end() {
        let b = Bytes::new(&[1, 2, 3, 4, 5, b'a', b'b', 0, b'c'], 100);
        assert_eq!(b.u16(0, "x").ok(), Some(0x0201));
        assert_eq!(b.u32(1, "x").ok(), Some(0x0504_0302));
        assert_eq!(b.cstr(5, 4, "s").ok().as_deref(), Some("ab"));
        let e = b.u64(4, "m_length").err().map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("truncated: m_length needs file bytes 104..112, only 109 are there")
        );
        assert!(b.count(-1, 0, 1, "m_count").is_err());
        assert!(b.count(3, 0, 3, "m_count").is_ok());
        assert!(b.count(4, 0, 3, "m_count").is_err());
        assert!(b.count(i64::MAX, 8, 80, "m_count").is_err());
    }
}
