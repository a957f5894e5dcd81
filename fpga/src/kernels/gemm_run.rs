//! Host-side drivers of the GEMM and attention kernels on any [`FpgaDevice`] (the simulated
//! card or a board): lay the data out as the cores read it, set the arguments, start, wait and
//! read the results back in the golden models' shapes.

use std::time::Duration;

use crate::device::{DeviceBuffer, FpgaDevice, FpgaError, RunStats};
use crate::golden::attention::{AttentionConfig, AttentionOut};
use crate::golden::gemm::{GemmDims, MAX_SHIFT, Requant};
use crate::kernels::gemm::{pack_params, pack_w, pad_x, pad8};

fn bad(kernel: &str, msg: String) -> FpgaError {
    FpgaError::BadArgument {
        kernel: kernel.into(),
        msg,
    }
}

fn u32_of(kernel: &str, what: &str, v: usize) -> Result<u32, FpgaError> {
    u32::try_from(v).map_err(|_| bad(kernel, format!("{what} = {v} is too large")))
}

fn words(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Allocates buffers of `sizes` bytes in bank 0, runs `f`, frees them whatever happened.
fn with_buffers<T>(
    dev: &mut dyn FpgaDevice,
    sizes: &[usize],
    f: impl FnOnce(&mut dyn FpgaDevice, &[DeviceBuffer]) -> Result<T, FpgaError>,
) -> Result<T, FpgaError> {
    let mut bufs = Vec::with_capacity(sizes.len());
    for &s in sizes {
        match dev.alloc(0, s.max(8) as u64) {
            Ok(b) => bufs.push(b),
            Err(e) => {
                for b in bufs {
                    let _ = dev.free(b);
                }
                return Err(e);
            }
        }
    }
    let r = f(dev, &bufs);
    for b in bufs.into_iter().rev() {
        dev.free(b)?;
    }
    r
}

/// Runs the GEMM kernel on `dev` (which must have it loaded): the arguments of
/// [`crate::golden::gemm::gemm`], returning y int8 `[M, N]` and the run's counters.
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
    let kn = "gemm";
    let GemmDims { m, n, k } = d;
    if m == 0 || n == 0 || k == 0 {
        return Err(bad(kn, format!("zero-sized {d:?}")));
    }
    if x.len() != m * k || w.len() != n * k || bias.len() != n || rq.len() != n {
        return Err(bad(kn, format!("buffer lengths do not match {d:?}")));
    }
    if let Some(r) = rq.iter().find(|r| r.shift > MAX_SHIFT) {
        return Err(bad(kn, format!("requant shift {} > {MAX_SHIFT}", r.shift)));
    }
    let (np, kp) = (pad8(n), pad8(k));
    let (m32, n32, k32) = (
        u32_of(kn, "m", m)?,
        u32_of(kn, "n", np)?,
        u32_of(kn, "k", kp)?,
    );
    let xp: Vec<u8> = pad_x(x, m, k).iter().map(|&v| v as u8).collect();
    let wp = words(&pack_w(w, n, k));
    let pp = words(&pack_params(bias, rq));
    let sizes = [xp.len(), wp.len(), pp.len(), m * np];
    with_buffers(dev, &sizes, |dev, b| {
        dev.write(&b[0], 0, &xp)?;
        dev.write(&b[1], 0, &wp)?;
        dev.write(&b[2], 0, &pp)?;
        for (name, buf) in ["x", "w", "params", "y"].iter().zip(b) {
            dev.set_pointer(name, buf)?;
        }
        for (name, v) in [
            ("m", m32),
            ("n", n32),
            ("k", k32),
            ("relu", u32::from(relu)),
        ] {
            dev.set_scalar(name, v)?;
        }
        dev.start()?;
        let st = dev.wait(timeout)?;
        let mut y = vec![0u8; m * np];
        dev.read(&b[3], 0, &mut y)?;
        let out = y
            .chunks_exact(np)
            .flat_map(|row| row[..n].iter().map(|&v| v as i8))
            .collect();
        Ok((out, st))
    })
}

/// Runs the attention kernel on `dev` (which must have it loaded with
/// `kv_tile == cfg.kv_tile`): one head, the arguments of
/// [`crate::golden::attention::attention`], returning its output and the run's counters.
pub fn run_attention(
    dev: &mut dyn FpgaDevice,
    q: &[i8],
    k: &[i8],
    v: &[i8],
    cfg: &AttentionConfig,
    timeout: Duration,
) -> Result<(AttentionOut, RunStats), FpgaError> {
    let kn = "attention";
    let (nq, nkv, d) = (cfg.nq, cfg.nkv, cfg.d);
    if nq == 0 || nkv == 0 || d == 0 {
        return Err(bad(kn, format!("zero-sized {cfg:?}")));
    }
    if q.len() != nq * d || k.len() != nkv * d || v.len() != nkv * d {
        return Err(bad(kn, format!("buffer lengths do not match {cfg:?}")));
    }
    let dp = pad8(d);
    let pad = |x: &[i8], rows: usize| -> Vec<u8> {
        let mut out = vec![0u8; rows * dp];
        for (o, i) in out.chunks_exact_mut(dp).zip(x.chunks_exact(d)) {
            for (a, &b) in o.iter_mut().zip(i) {
                *a = b as u8;
            }
        }
        out
    };
    let (qp, kp, vp) = (pad(q, nq), pad(k, nkv), pad(v, nkv));
    let args = [
        ("nq", u32_of(kn, "nq", nq)?),
        ("nkv", u32_of(kn, "nkv", nkv)?),
        ("d", u32_of(kn, "d", dp)?),
        ("causal", u32::from(cfg.causal)),
        ("score_mult", u32::from(cfg.score_mult)),
        ("score_shift", u32::from(cfg.score_shift)),
    ];
    let sizes = [qp.len(), kp.len(), vp.len(), nq * dp * 2, nq * 8];
    with_buffers(dev, &sizes, |dev, b| {
        dev.write(&b[0], 0, &qp)?;
        dev.write(&b[1], 0, &kp)?;
        dev.write(&b[2], 0, &vp)?;
        for (name, buf) in ["q", "k", "v", "o", "stats"].iter().zip(b) {
            dev.set_pointer(name, buf)?;
        }
        for (name, val) in args {
            dev.set_scalar(name, val)?;
        }
        dev.start()?;
        let st = dev.wait(timeout)?;
        let mut o = vec![0u8; nq * dp * 2];
        dev.read(&b[3], 0, &mut o)?;
        let mut s = vec![0u8; nq * 8];
        dev.read(&b[4], 0, &mut s)?;
        let mut out = AttentionOut {
            o: Vec::with_capacity(nq * d),
            e: Vec::with_capacity(nq),
            l: Vec::with_capacity(nq),
        };
        for row in o.chunks_exact(dp * 2) {
            out.o.extend(
                row.chunks_exact(2)
                    .take(d)
                    .map(|c| i16::from_le_bytes([c[0], c[1]])),
            );
        }
        for w in s.chunks_exact(8) {
            out.e.push(i32::from_le_bytes([w[0], w[1], w[2], w[3]]));
            out.l.push(u32::from_le_bytes([w[4], w[5], w[6], w[7]]));
        }
        Ok((out, st))
    })
}
