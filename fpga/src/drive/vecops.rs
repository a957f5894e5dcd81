//! The vecops kernel's driver: rows of int16 elements in, rows out (semantics:
//! [`crate::golden::vecops::run`]). Operands are given as the golden model takes them, rows
//! padded to `4 words(n)` elements; the driver writes them as 64-bit words, sets the
//! registers, runs and reads `y` (and `s`) back.

use std::time::Duration;

use super::{Scratch, bad, launch, read, u32_of, with_scratch};
use crate::device::{FpgaDevice, FpgaError, RunStats};
use crate::golden::vecops::{LANES, VecArgs, VecOut, words};

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
