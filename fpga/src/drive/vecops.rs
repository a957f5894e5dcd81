//! The vecops kernel's driver: rows of int16 elements in, rows out (semantics:
//! [`crate::golden::vecops::run`]). Operands are given as the golden model takes them, rows
//! padded to `4 words(n)` elements; the driver writes them as 64-bit words, sets the
//! registers, runs and reads `y` (and `s`) back.

use std::time::Duration;

use super::{Scratch, bad, bytes_of, launch, read, u32_of, with_scratch};
use crate::device::{DeviceBuffer, FpgaDevice, FpgaError, RunStats};
use crate::golden::vecops::{
    LANES, LANES8, OP_COMBINE, OP_SILU_MUL8, VecArgs, VecOut, words, words8,
};

const KERNEL: &str = "vecops";

fn bytes16(v: &[i16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn elems16(b: &[u8]) -> Vec<i16> {
    b.chunks_exact(2)
        .map(|c| i16::from_le_bytes([c[0], c[1]]))
        .collect()
}

/// Runs the vecops kernel on `dev` (which must have it loaded): `a`, `b` (ops that read it)
/// and `p` (the weight row or the RoPE cos/sin rows) as padded rows; returns `y` (and, for
/// RMSNorm + residual, `s`) as padded rows and the run's counters.
pub fn run_vecops(
    dev: &mut dyn FpgaDevice,
    args: &VecArgs,
    a: &[i16],
    b: &[i16],
    p: &[i16],
    timeout: Duration,
) -> Result<(VecOut, RunStats), FpgaError> {
    if matches!(args.op, OP_SILU_MUL8 | OP_COMBINE) {
        return Err(bad(
            KERNEL,
            format!(
                "op {} takes int8 rows: run_silu_mul8 / run_combine",
                args.op
            ),
        ));
    }
    let np = LANES * words(args.n);
    let want_b = if args.reads_b() { args.rows * np } else { 0 };
    if a.len() != args.rows * np || b.len() != want_b || p.len() != args.p_rows() * np {
        return Err(bad(
            KERNEL,
            format!(
                "a {}, b {}, p {} elements for op {} rows {} n {} (rows of {np})",
                a.len(),
                b.len(),
                p.len(),
                args.op,
                args.rows,
                args.n
            ),
        ));
    }
    let scalars = [
        ("op", args.op),
        ("rows", u32_of(KERNEL, "rows", args.rows)?),
        ("n", u32_of(KERNEL, "n", args.n)?),
        ("shift", args.shift),
        ("c0", args.c0),
        ("c1", args.c1),
    ];
    u32_of(KERNEL, "words", args.rows * words(args.n))?;
    let ybytes = a.len() * 2;
    with_scratch(dev, |dev, s: &mut Scratch| {
        let ba = s.upload(dev, &bytes16(a))?;
        let bb = s.upload(dev, &bytes16(b))?;
        let bp = s.upload(dev, &bytes16(p))?;
        let by = s.alloc(dev, ybytes)?;
        let sbytes = if args.writes_s() { ybytes } else { 0 };
        let bs = s.alloc(dev, sbytes)?;
        let pointers = [("a", &ba), ("b", &bb), ("p", &bp), ("y", &by), ("s", &bs)];
        let stats = launch(dev, &pointers, &scalars, timeout)?;
        let y = elems16(&read(dev, &by, ybytes)?);
        let sv = if sbytes > 0 {
            elems16(&read(dev, &bs, sbytes)?)
        } else {
            Vec::new()
        };
        Ok((VecOut { y, s: sv }, stats))
    })
}

fn scalars(args: &VecArgs) -> Result<[(&'static str, u32); 6], FpgaError> {
    u32_of(KERNEL, "words", args.rows * words(args.n))?;
    Ok([
        ("op", args.op),
        ("rows", u32_of(KERNEL, "rows", args.rows)?),
        ("n", u32_of(KERNEL, "n", args.n)?),
        ("shift", args.shift),
        ("c0", args.c0),
        ("c1", args.c1),
    ])
}

/// Launches `silu_mul8` (op 5) on buffers already in card memory: `a` (gate) and `b` (up),
/// `rows` padded int8 rows each, into `y` (the same layout). The card must have the vecops
/// kernel loaded.
pub fn launch_silu_mul8(
    dev: &mut dyn FpgaDevice,
    args: &VecArgs,
    a: &DeviceBuffer,
    b: &DeviceBuffer,
    y: &DeviceBuffer,
    timeout: Duration,
) -> Result<RunStats, FpgaError> {
    if args.op != OP_SILU_MUL8 {
        return Err(bad(KERNEL, format!("op {} is not silu_mul8", args.op)));
    }
    let bytes = (args.rows * LANES8 * words8(args.n)) as u64;
    if a.len < bytes || b.len < bytes || y.len < bytes {
        return Err(bad(
            KERNEL,
            format!(
                "silu_mul8 buffers of {}, {}, {} bytes for {bytes}",
                a.len, b.len, y.len
            ),
        ));
    }
    let pointers = [("a", a), ("b", b), ("p", y), ("y", y), ("s", y)];
    launch(dev, &pointers, &scalars(args)?, timeout)
}

/// Launches `combine` (op 6) on buffers already in card memory: the table `p` (`rows * c0`
/// entries, [`crate::golden::vecops::table_entry`]) over the padded int8 rows in `b`, into
/// `y` (`rows` padded int16 rows). The card must have the vecops kernel loaded.
pub fn launch_combine(
    dev: &mut dyn FpgaDevice,
    args: &VecArgs,
    p: &DeviceBuffer,
    b: &DeviceBuffer,
    y: &DeviceBuffer,
    timeout: Duration,
) -> Result<RunStats, FpgaError> {
    if args.op != OP_COMBINE {
        return Err(bad(KERNEL, format!("op {} is not combine", args.op)));
    }
    let ybytes = (args.rows * LANES * words(args.n) * 2) as u64;
    if p.len < (args.table_len() * 8) as u64 || y.len < ybytes {
        return Err(bad(
            KERNEL,
            format!(
                "combine table of {} bytes for {} entries, y of {} for {ybytes}",
                p.len,
                args.table_len(),
                y.len
            ),
        ));
    }
    let pointers = [("a", y), ("b", b), ("p", p), ("y", y), ("s", y)];
    launch(dev, &pointers, &scalars(args)?, timeout)
}

/// Runs `silu_mul8` (op 5) on host data: padded int8 rows `a` and `b` (semantics:
/// [`crate::golden::vecops::silu_mul8`]); returns `y`, padded int8 rows.
pub fn run_silu_mul8(
    dev: &mut dyn FpgaDevice,
    args: &VecArgs,
    a: &[i8],
    b: &[i8],
    timeout: Duration,
) -> Result<(Vec<i8>, RunStats), FpgaError> {
    let len = args.rows * LANES8 * words8(args.n);
    if a.len() != len || b.len() != len {
        return Err(bad(
            KERNEL,
            format!(
                "a {}, b {} elements for {args:?} (rows of {})",
                a.len(),
                b.len(),
                len
            ),
        ));
    }
    with_scratch(dev, |dev, s: &mut Scratch| {
        let ba = s.upload(dev, &bytes_of(a))?;
        let bb = s.upload(dev, &bytes_of(b))?;
        let by = s.alloc(dev, len)?;
        let st = launch_silu_mul8(dev, args, &ba, &bb, &by, timeout)?;
        let y = read(dev, &by, len)?.into_iter().map(|v| v as i8).collect();
        Ok((y, st))
    })
}

/// Runs `combine` (op 6) on host data: the padded int8 rows `b` and the table (semantics:
/// [`crate::golden::vecops::combine`]); returns `y`, padded int16 rows.
pub fn run_combine(
    dev: &mut dyn FpgaDevice,
    args: &VecArgs,
    b: &[i8],
    table: &[u64],
    timeout: Duration,
) -> Result<(Vec<i16>, RunStats), FpgaError> {
    let np8 = LANES8 * words8(args.n);
    let rows_b = b.len() / np8.max(1);
    if table.len() != args.table_len()
        || !b.len().is_multiple_of(np8.max(1))
        || table.iter().any(|&e| (e & 0xffff_ffff) as usize >= rows_b)
    {
        return Err(bad(
            KERNEL,
            format!(
                "combine: table of {} entries ({} expected) over {} rows of b",
                table.len(),
                args.table_len(),
                rows_b
            ),
        ));
    }
    let ybytes = args.rows * LANES * words(args.n) * 2;
    with_scratch(dev, |dev, s: &mut Scratch| {
        let bp = s.upload(dev, &super::words(table))?;
        let bb = s.upload(dev, &bytes_of(b))?;
        let by = s.alloc(dev, ybytes)?;
        let st = launch_combine(dev, args, &bp, &bb, &by, timeout)?;
        Ok((elems16(&read(dev, &by, ybytes)?), st))
    })
}
