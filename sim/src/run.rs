//! Host-side drivers of the kernels on any [`FpgaDevice`]: lay the data out, set the
//! arguments, start, wait, read the results back.

use std::time::Duration;

use tandem_fpga::golden::router::{
    RouterOut, hist_words, logit_row_words, pack_logits, route_row_words, unpack_hist,
    unpack_routes,
};
use tandem_fpga::{FpgaDevice, FpgaError, RunStats};

/// Runs the router kernel on `dev` (which must have it loaded): int16 logits `[T, E]`
/// (unpadded, row-major) to top-`k` ids, Q0.15 weights and the histogram.
pub fn run_router(
    dev: &mut dyn FpgaDevice,
    logits: &[i16],
    tokens: usize,
    experts: usize,
    k: usize,
    timeout: Duration,
) -> Result<(RouterOut, RunStats), FpgaError> {
    let bad = |msg: String| FpgaError::BadArgument {
        kernel: "router".into(),
        msg,
    };
    if logits.len() != tokens * experts {
        return Err(bad(format!(
            "{} logits for [{tokens}, {experts}]",
            logits.len()
        )));
    }
    let to32 =
        |v: usize, what: &str| u32::try_from(v).map_err(|_| bad(format!("{what} = {v} too large")));
    let (t32, e32, k32) = (
        to32(tokens, "tokens")?,
        to32(experts, "experts")?,
        to32(k, "top_k")?,
    );
    to32(tokens * logit_row_words(experts), "logit words")?;
    let lbytes = (tokens * logit_row_words(experts) * 8).max(8) as u64;
    let rbytes = (tokens * route_row_words(k) * 8).max(8) as u64;
    let hbytes = (hist_words(experts) * 8).max(8) as u64;
    let lb = dev.alloc(0, lbytes)?;
    let rb = dev.alloc(0, rbytes)?;
    let hb = dev.alloc(0, hbytes)?;
    let result = (|| {
        dev.write(&lb, 0, &pack_logits(logits, tokens, experts))?;
        dev.set_pointer("logits", &lb)?;
        dev.set_pointer("routes", &rb)?;
        dev.set_pointer("hist", &hb)?;
        dev.set_scalar("tokens", t32)?;
        dev.set_scalar("experts", e32)?;
        dev.set_scalar("top_k", k32)?;
        dev.start()?;
        let stats = dev.wait(timeout)?;
        let mut r = vec![0u8; rbytes as usize];
        dev.read(&rb, 0, &mut r)?;
        let mut h = vec![0u8; hbytes as usize];
        dev.read(&hb, 0, &mut h)?;
        let (ids, weights) = unpack_routes(&r, tokens, k);
        Ok((
            RouterOut {
                ids,
                weights,
                hist: unpack_hist(&h, experts),
            },
            stats,
        ))
    })();
    dev.free(hb)?;
    dev.free(rb)?;
    dev.free(lb)?;
    result
}

/// Runs the GEMM kernel on `dev` (which must have it loaded): int8 `x [M, K]`, `w [N, K]`,
/// per-column `bias` and requantisation, optional ReLU, to int8 `y [M, N]` (semantics:
/// `tandem_fpga::golden::gemm::gemm`). N and K are zero padded to multiples of 8 here.
#[allow(clippy::too_many_arguments)]
pub fn run_gemm(
    dev: &mut dyn FpgaDevice,
    x: &[i8],
    w: &[i8],
    bias: &[i32],
    rq: &[tandem_fpga::golden::gemm::Requant],
    relu: bool,
    d: tandem_fpga::golden::gemm::GemmDims,
    timeout: Duration,
) -> Result<(Vec<i8>, RunStats), FpgaError> {
    use tandem_fpga::kernels::gemm::{pack_params, pack_w, pad_x, pad8};
    let bad = |msg: String| FpgaError::BadArgument {
        kernel: "gemm".into(),
        msg,
    };
    let (m, n, k) = (d.m, d.n, d.k);
    if x.len() != m * k || w.len() != n * k || bias.len() != n || rq.len() != n {
        return Err(bad(format!(
            "x {}, w {}, bias {}, requant {} for M={m} N={n} K={k}",
            x.len(),
            w.len(),
            bias.len(),
            rq.len()
        )));
    }
    let (np, kp) = (pad8(n), pad8(k));
    let to32 =
        |v: usize, what: &str| u32::try_from(v).map_err(|_| bad(format!("{what} = {v} too large")));
    let words = |v: Vec<u64>| -> Vec<u8> { v.iter().flat_map(|w| w.to_le_bytes()).collect() };
    let xb: Vec<u8> = pad_x(x, m, k).iter().map(|&v| v as u8).collect();
    let wb = words(pack_w(w, n, k));
    let pb = words(pack_params(bias, rq));
    let ybytes = (m * np).max(8) as u64;
    let bx = dev.alloc(0, xb.len().max(8) as u64)?;
    let bw = dev.alloc(0, wb.len().max(8) as u64)?;
    let bp = dev.alloc(0, pb.len().max(8) as u64)?;
    let by = dev.alloc(0, ybytes)?;
    let result = (|| {
        dev.write(&bx, 0, &xb)?;
        dev.write(&bw, 0, &wb)?;
        dev.write(&bp, 0, &pb)?;
        dev.set_pointer("x", &bx)?;
        dev.set_pointer("w", &bw)?;
        dev.set_pointer("params", &bp)?;
        dev.set_pointer("y", &by)?;
        dev.set_scalar("m", to32(m, "m")?)?;
        dev.set_scalar("n", to32(np, "n")?)?;
        dev.set_scalar("k", to32(kp, "k")?)?;
        dev.set_scalar("relu", u32::from(relu))?;
        dev.start()?;
        let stats = dev.wait(timeout)?;
        let mut yb = vec![0u8; ybytes as usize];
        dev.read(&by, 0, &mut yb)?;
        let y: Vec<i8> = (0..m)
            .flat_map(|i| yb[i * np..i * np + n].iter().map(|&v| v as i8))
            .collect();
        Ok((y, stats))
    })();
    dev.free(by)?;
    dev.free(bp)?;
    dev.free(bw)?;
    dev.free(bx)?;
    result
}
