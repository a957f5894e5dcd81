//! The MoE router kernel's driver: int16 logits to top-k ids, Q0.15 weights and the expert
//! histogram (semantics: [`crate::golden::router::route`]).

use std::time::Duration;

use super::{Scratch, bad, launch, read, u32_of, with_scratch};
use crate::device::{FpgaDevice, FpgaError, RunStats};
use crate::golden::router::{
    RouterOut, hist_words, logit_row_words, pack_logits, route_row_words, unpack_hist,
    unpack_routes,
};

const KERNEL: &str = "router";

/// Runs the router kernel on `dev` (which must have it loaded): int16 logits `[T, E]`
/// (unpadded, row-major) to top-`k` ids, Q0.15 weights (renormalised over the k chosen) and
/// the histogram.
pub fn run_router(
    dev: &mut dyn FpgaDevice,
    logits: &[i16],
    tokens: usize,
    experts: usize,
    k: usize,
    timeout: Duration,
) -> Result<(RouterOut, RunStats), FpgaError> {
    run_router_with(dev, logits, tokens, experts, k, true, timeout)
}

/// Runs the router as [`run_router`]; with `renormalize = false` the weights are the softmax
/// over all experts of the k chosen ([`crate::golden::router::route_with`]).
pub fn run_router_with(
    dev: &mut dyn FpgaDevice,
    logits: &[i16],
    tokens: usize,
    experts: usize,
    k: usize,
    renormalize: bool,
    timeout: Duration,
) -> Result<(RouterOut, RunStats), FpgaError> {
    if logits.len() != tokens * experts {
        return Err(bad(
            KERNEL,
            format!("{} logits for [{tokens}, {experts}]", logits.len()),
        ));
    }
    let scalars = [
        ("tokens", u32_of(KERNEL, "tokens", tokens)?),
        ("experts", u32_of(KERNEL, "experts", experts)?),
        ("top_k", u32_of(KERNEL, "top_k", k)?),
        ("renormalize", u32::from(renormalize)),
    ];
    u32_of(KERNEL, "logit words", tokens * logit_row_words(experts))?;
    let rbytes = (tokens * route_row_words(k) * 8).max(8);
    let hbytes = (hist_words(experts) * 8).max(8);
    with_scratch(dev, |dev, s: &mut Scratch| {
        let lb = s.upload(dev, &pack_logits(logits, tokens, experts))?;
        let rb = s.alloc(dev, rbytes)?;
        let hb = s.alloc(dev, hbytes)?;
        let pointers = [("logits", &lb), ("routes", &rb), ("hist", &hb)];
        let stats = launch(dev, &pointers, &scalars, timeout)?;
        let (ids, weights) = unpack_routes(&read(dev, &rb, rbytes)?, tokens, k);
        let hist = unpack_hist(&read(dev, &hb, hbytes)?, experts);
        Ok((RouterOut { ids, weights, hist }, stats))
    })
}
