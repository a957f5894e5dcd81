//! The GEMM kernel's driver: int8 `x [M, K]` times `w [N, K]`, per-column bias and
//! requantisation, optional ReLU, to int8 `y [M, N]` (semantics:
//! [`crate::golden::gemm::gemm`]). N and K are zero padded to multiples of the build's lanes
//! here (8 on a 64-bit port, 64 on a 512-bit one).
//!
//! [`run_gemm`] is one launch (K and N within the build); [`run_gemm_split`] takes any K and N:
//! N in chunks of at most `n_max` columns, and K in passes of at most `k_max` whose int32
//! partial sums stay in device memory (the kernel's `part` buffer: PART_OUT on every pass but
//! the last, ACC_IN on every pass but the first), with bias, ReLU and requantisation on the
//! last pass only. Bit for bit [`crate::golden::gemm::gemm`].

use std::time::Duration;

use super::{Scratch, WBufs, bad, bytes_of, launch, read, u32_of, with_scratch, words};
use crate::device::{DeviceBuffer, FpgaDevice, FpgaError, RunStats};
use crate::golden::gemm::k_slice;
use crate::golden::gemm::{GemmDims, MAX_SHIFT, Requant};
use crate::kernels::gemm::{
    GemmCore, MODE_ACC_IN, MODE_PART_OUT, pack_params_lanes, pack_w_lanes, pad_lanes, pad_x_lanes,
};

const KERNEL: &str = "gemm";

/// Runs the GEMM kernel on `dev` (which must have an 8-lane build, a 64-bit port, loaded):
/// the arguments of [`crate::golden::gemm::gemm`], returning y int8 `[M, N]` and the run's
/// counters. M may be 0 (the kernel finishes at once); N and K may not. Any build:
/// [`run_gemm_split`].
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
    run_gemm_lanes(dev, 8, x, w, bias, rq, relu, d, timeout)
}

/// [`run_gemm`] for a build of `lanes` lanes (its layouts padded to multiples of `lanes`).
#[allow(clippy::too_many_arguments)]
fn run_gemm_lanes(
    dev: &mut dyn FpgaDevice,
    lanes: usize,
    x: &[i8],
    w: &[i8],
    bias: &[i32],
    rq: &[Requant],
    relu: bool,
    d: GemmDims,
    timeout: Duration,
) -> Result<(Vec<i8>, RunStats), FpgaError> {
    check_args(x, w, bias, rq, d)?;
    let GemmDims { m, n, k } = d;
    let (np, kp) = (pad_lanes(n, lanes), pad_lanes(k, lanes));
    let scalars = [
        ("m", u32_of(KERNEL, "m", m)?),
        ("n", u32_of(KERNEL, "n", np)?),
        ("k", u32_of(KERNEL, "k", kp)?),
        ("relu", u32::from(relu)),
        ("mode", 0),
    ];
    let ybytes = m * np;
    with_scratch(dev, |dev, s: &mut Scratch| {
        let bx = s.upload(dev, &bytes_of(&pad_x_lanes(x, m, k, lanes)))?;
        let bw = s.upload_w(dev, &pack_w_lanes(w, n, k, lanes))?;
        let bp = s.upload(dev, &words(&pack_params_lanes(bias, rq, lanes)))?;
        let by = s.alloc(dev, ybytes)?;
        // mode 0 never touches `part`
        let pointers = [("x", &bx), ("params", &bp), ("y", &by), ("part", &by)];
        let stats = launch_gemm(dev, &bw, &pointers, &scalars, timeout)?;
        let y = read(dev, &by, ybytes)?;
        let out = y
            .chunks_exact(np)
            .flat_map(|row| row[..n].iter().map(|&v| v as i8))
            .collect();
        Ok((out, stats))
    })
}

/// Launches the GEMM kernel with W in `w` (one buffer, or two of alternate stripes) and the
/// other pointers and scalars as named.
pub fn launch_gemm(
    dev: &mut dyn FpgaDevice,
    w: &WBufs,
    pointers: &[(&str, &DeviceBuffer)],
    scalars: &[(&str, u32)],
    timeout: Duration,
) -> Result<RunStats, FpgaError> {
    w.set(dev)?;
    launch(dev, pointers, scalars, timeout)
}

/// Checks the arguments of a GEMM driver call.
fn check_args(
    x: &[i8],
    w: &[i8],
    bias: &[i32],
    rq: &[Requant],
    d: GemmDims,
) -> Result<(), FpgaError> {
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
    Ok(())
}

/// Launches the GEMM kernel on `dev` (loaded with the build `core`) for any N and K: N in
/// chunks of at most `n_max` columns, K in passes of at most `k_max` (see the module docs).
/// Returns y int8 `[M, N]` and the counters summed over the launches (`cycles`: all launches;
/// `total_cycles`: the card's after the last). One launch, as [`run_gemm`], when the problem
/// fits the build.
#[allow(clippy::too_many_arguments)]
pub fn run_gemm_split(
    dev: &mut dyn FpgaDevice,
    core: &GemmCore,
    x: &[i8],
    w: &[i8],
    bias: &[i32],
    rq: &[Requant],
    relu: bool,
    d: GemmDims,
    timeout: Duration,
) -> Result<(Vec<i8>, RunStats), FpgaError> {
    check_args(x, w, bias, rq, d)?;
    let GemmDims { m, n, k } = d;
    let (n_max, k_max) = (core.n_max as usize, core.k_max as usize);
    let lanes = core.lanes as usize;
    if n <= n_max && k <= k_max {
        return run_gemm_lanes(dev, lanes, x, w, bias, rq, relu, d, timeout);
    }
    let mut y = vec![0i8; m * n];
    let mut total = RunStats::default();
    let passes = crate::golden::gemm::k_passes(k, k_max);
    for n0 in (0..n).step_by(n_max.max(8)) {
        let nc = (n - n0).min(n_max);
        let wc = &w[n0 * k..(n0 + nc) * k];
        let (yc, st) = with_scratch(dev, |dev, s: &mut Scratch| {
            gemm_passes(
                dev,
                s,
                x,
                wc,
                &bias[n0..n0 + nc],
                &rq[n0..n0 + nc],
                relu,
                (m, nc, k),
                lanes,
                &passes,
                timeout,
            )
        })?;
        for (row, out) in yc.chunks_exact(nc.max(1)).zip(y.chunks_exact_mut(n)) {
            out[n0..n0 + nc].copy_from_slice(row);
        }
        total.cycles += st.cycles;
        total.total_cycles = st.total_cycles;
        total.wall += st.wall;
    }
    Ok((y, total))
}

/// The K passes of one column chunk (`nc <= n_max`), the partials in one device buffer.
#[allow(clippy::too_many_arguments)]
fn gemm_passes(
    dev: &mut dyn FpgaDevice,
    s: &mut Scratch,
    x: &[i8],
    w: &[i8],
    bias: &[i32],
    rq: &[Requant],
    relu: bool,
    (m, n, k): (usize, usize, usize),
    lanes: usize,
    passes: &[std::ops::Range<usize>],
    timeout: Duration,
) -> Result<(Vec<i8>, RunStats), FpgaError> {
    let np = pad_lanes(n, lanes);
    let ybytes = m * np;
    let bp = s.upload(dev, &words(&pack_params_lanes(bias, rq, lanes)))?;
    let by = s.alloc(dev, ybytes)?;
    let bpart = s.alloc(dev, m * np * 4)?;
    let mut total = RunStats::default();
    for (i, r) in passes.iter().enumerate() {
        let kc = r.len();
        let kp = pad_lanes(kc, lanes);
        let (first, last) = (i == 0, i + 1 == passes.len());
        let mode = if first { 0 } else { MODE_ACC_IN } | if last { 0 } else { MODE_PART_OUT };
        let xs = k_slice(x, k, r.clone());
        let ws = k_slice(w, k, r.clone());
        let bx = s.upload(dev, &bytes_of(&pad_x_lanes(&xs, m, kc, lanes)))?;
        let bw = s.upload_w(dev, &pack_w_lanes(&ws, n, kc, lanes))?;
        let scalars = [
            ("m", u32_of(KERNEL, "m", m)?),
            ("n", u32_of(KERNEL, "n", np)?),
            ("k", u32_of(KERNEL, "k", kp)?),
            ("relu", u32::from(relu)),
            ("mode", mode),
        ];
        let pointers = [("x", &bx), ("params", &bp), ("y", &by), ("part", &bpart)];
        let st = launch_gemm(dev, &bw, &pointers, &scalars, timeout)?;
        total.cycles += st.cycles;
        total.total_cycles = st.total_cycles;
        total.wall += st.wall;
        // this pass's x and w are no longer needed: keep device memory to one pass's worth
        s.free_last(dev, 1 + bw.buffers())?;
    }
    let y = read(dev, &by, ybytes)?;
    let out = y
        .chunks_exact(np)
        .flat_map(|row| row[..n].iter().map(|&v| v as i8))
        .collect();
    Ok((out, total))
}
