//! The MoE router kernel's driver: int16 logits to top-k ids, Q0.15 weights and the expert
//! histogram (semantics: [`crate::golden::router::route`]).

use std::time::Duration;

use super::{Scratch, bad, launch, read, u32_of, with_scratch};
use crate::device::{FpgaDevice, FpgaError, RunStats};
use crate::golden::router::{
    RouterOut, hist_beats, logit_row_beats, pack_logits_w, route_row_beats, unpack_hist,
    unpack_routes_w,
};
use crate::kernels::router::RouterCore;

const KERNEL: &str = "router";

/// Runs the router kernel on `dev` (which must have the build `core` loaded: its data width
/// sets the memory layouts): int16 logits `[T, E]` (unpadded, row-major) to top-`k` ids,
/// Q0.15 weights (renormalised over the k chosen) and the histogram.
pub fn run_router(
    dev: &mut dyn FpgaDevice,
    core: &RouterCore,
    logits: &[i16],
    tokens: usize,
    experts: usize,
    k: usize,
    timeout: Duration,
) -> Result<(RouterOut, RunStats), FpgaError> {
    run_router_with(dev, core, logits, tokens, experts, k, true, timeout)
}

/// Runs the router as [`run_router`]; with `renormalize = false` the weights are the softmax
/// over all experts of the k chosen ([`crate::golden::router::route_with`]).
#[allow(clippy::too_many_arguments)] // the op's own arguments, the device, its build and a timeout
pub fn run_router_with(
    dev: &mut dyn FpgaDevice,
    core: &RouterCore,
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
    let bits = core.data_bits;
    let beat = bits as usize / 8;
    u32_of(
        KERNEL,
        "logit words",
        tokens * logit_row_beats(experts, bits),
    )?;
    let rbytes = (tokens * route_row_beats(k, bits) * beat).max(beat);
    let hbytes = (hist_beats(experts, bits) * beat).max(beat);
    with_scratch(dev, |dev, s: &mut Scratch| {
        let lb = s.upload(dev, &pack_logits_w(logits, tokens, experts, bits))?;
        let rb = s.alloc(dev, rbytes)?;
        let hb = s.alloc(dev, hbytes)?;
        let pointers = [("logits", &lb), ("routes", &rb), ("hist", &hb)];
        let stats = launch(dev, &pointers, &scalars, timeout)?;
        let (ids, weights) = unpack_routes_w(&read(dev, &rb, rbytes)?, tokens, k, bits);
        let hist = unpack_hist(&read(dev, &hb, hbytes)?, experts);
        Ok((RouterOut { ids, weights, hist }, stats))
    })
}
