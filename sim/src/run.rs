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
