//! CONNECTIVITY: `struct connectivity` (`m_count`, then `struct connection` of 12 bytes each
//! at offset 4): which memory bank each argument of each compute unit is connected to.

use serde::Serialize;

use super::XclbinError;
use super::bytes::Bytes;

const CONNECTION_SIZE: usize = 12;
const FIRST: usize = 4;

/// One `struct connection`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Connection {
    /// `arg_index`: the argument's `id` in the kernel's metadata.
    pub arg_index: u32,
    /// `m_ip_layout_index`: the compute unit (index into IP_LAYOUT).
    pub ip_layout_index: u32,
    /// `mem_data_index`: the bank (index into MEM_TOPOLOGY).
    pub mem_data_index: u32,
}

/// Parses a CONNECTIVITY payload (`base`: its file offset).
pub(crate) fn parse(data: &[u8], base: u64) -> Result<Vec<Connection>, XclbinError> {
    let b = Bytes::new(data, base);
    let raw = b.i32(0, "CONNECTIVITY m_count")?;
    let n = b.count(
        i64::from(raw),
        FIRST,
        CONNECTION_SIZE,
        "CONNECTIVITY m_count",
    )?;
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let at = FIRST + i * CONNECTION_SIZE;
        let index = |off: usize, name: &str| -> Result<u32, XclbinError> {
            let field = format!("CONNECTIVITY[{i}].{name}");
            let x = b.i32(at + off, &field)?;
            u32::try_from(x).map_err(|_| XclbinError::Corrupt {
                field,
                msg: format!("{x} is negative"),
            })
        };
        v.push(Connection {
            arg_index: index(0, "arg_index")?,
            ip_layout_index: index(4, "m_ip_layout_index")?,
            mem_data_index: index(8, "mem_data_index")?,
        });
    }
    Ok(v)
}
