//! The GEMM kernel's driver: int8 `x [M, K]` times `w [N, K]`, per-column bias and
//! requantisation, optional ReLU, to int8 `y [M, N]` (semantics:
//! [`crate::golden::gemm::gemm`]). N and K are zero padded to multiples of 8 here.

use std::time::Duration;

use super::{Scratch, bad, bytes_of, launch, read, u32_of, with_scratch, words};
use crate::device::{FpgaDevice, FpgaError, RunStats};
use crate::golden::gemm::{GemmDims, MAX_SHIFT, Requant};
use crate::kernels::gemm::{pack_params, pack_w, pad_x, pad8};

const KERNEL: &str = "gemm";

/// Runs the GEMM kernel on `dev` (which must have it loaded): the arguments of
/// [`crate::golden::gemm::gemm`], returning y int8 `[M, N]` and the run's counters. M may be
/// 0 (the kernel finishes at once); N and K may not.
#[allow(clippy::too_many_arguments)]
pub fn run_gemm(
    dev: &mut dyn FpgaDevice,
    x: &[i8],
    w: &[i8],
    bias: &[i32],
    rq: &[Requant],
    relu: bool,
    d: GemmDims,
    timeout: Duration,
) -> Result<(Vec<i8>, RunStats), FpgaError> {
    let GemmDims { m, n, k } = d;
    if n == 0 || k == 0 {
        return Err(bad(KERNEL, format!("zero-sized {d:?}")));
    }
    if x.len() != m * k || w.len() != n * k || bias.len() != n || rq.len() != n {
        return Err(bad(
            KERNEL,
            format!(
                "x {}, w {}, bias {}, requant {} for M={m} N={n} K={k}",
                x.len(),
                w.len(),
                bias.len(),
                rq.len()
            ),
        ));
    }
    if let Some(r) = rq.iter().find(|r| r.shift > MAX_SHIFT) {
        return Err(bad(
            KERNEL,
            format!("requant shift {} > {MAX_SHIFT}", r.shift),
        ));
    }
    let (np, kp) = (pad8(n), pad8(k));
    let scalars = [
        ("m", u32_of(KERNEL, "m", m)?),
        ("n", u32_of(KERNEL, "n", np)?),
        ("k", u32_of(KERNEL, "k", kp)?),
        ("relu", u32::from(relu)),
    ];
    let ybytes = m * np;
    with_scratch(dev, |dev, s: &mut Scratch| {
        let bx = s.upload(dev, &bytes_of(&pad_x(x, m, k)))?;
        let bw = s.upload(dev, &words(&pack_w(w, n, k)))?;
        let bp = s.upload(dev, &words(&pack_params(bias, rq)))?;
        let by = s.alloc(dev, ybytes)?;
        let pointers = [("x", &bx), ("w", &bw), ("params", &bp), ("y", &by)];
        let stats = launch(dev, &pointers, &scalars, timeout)?;
        let y = read(dev, &by, ybytes)?;
        let out = y
            .chunks_exact(np)
            .flat_map(|row| row[..n].iter().map(|&v| v as i8))
            .collect();
        Ok((out, stats))
    })
}
