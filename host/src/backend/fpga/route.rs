//! `moe_route` on the router kernel (`tandem_fpga::kernels::router`).
//!
//! At the boundary the f32 logits are quantised to Q7.8 int16 and the kernel's Q0.15 weights
//! dequantised back (renormalised over the k chosen, or with `renormalize = false` the softmax
//! over all experts, as the op defines them); the outputs the kernel does not make (the block-aligned permutation, the
//! expert offsets and both losses) are computed on the host by `ops::moe` from the kernel's
//! ids and histogram and the logits, which the reported kernel name says
//! ([`ROUTER_KERNEL`]).

use std::time::Duration;

use tandem_fpga::golden::router::{RouterOut, WEIGHT_FRAC_BITS, quantize_logit};
use tandem_fpga::kernels::router::RouterCore;
use tandem_fpga::{FpgaDevice, FpgaError, RunStats, drive};

use super::Support;
use crate::error::{Error, Result};
use crate::ops::MoeRouteParams;
use crate::ops::moe::{align_blocks, router_losses};
use crate::tensor::{Tensor, TensorMeta};

/// Kernel name reported for routing.
pub const ROUTER_KERNEL: &str = "moe_router_int16+host_align";

/// Whether the router build `core` takes this routing.
pub(super) fn support(core: &RouterCore, p: &MoeRouteParams, inputs: &[TensorMeta]) -> Support {
    let Some(l) = inputs.first() else {
        return Support::No("moe_route takes logits".into());
    };
    let e = l.shape.get(1).copied().unwrap_or(0);
    if e > core.e_max as usize || p.top_k > core.k_max as usize {
        return Support::No(format!(
            "E = {e}, k = {} exceed the router build (e_max = {}, k_max = {})",
            p.top_k, core.e_max, core.k_max
        ));
    }
    Support::Native
}

/// One routing, quantised for the kernel.
pub(super) struct RouteJob {
    p: MoeRouteParams,
    metas: Vec<TensorMeta>,
    logits: Vec<f32>,
    q: Vec<i16>,
    t: usize,
    e: usize,
}

impl RouteJob {
    /// Checks the logits `[T, E]` (finite) and quantises them to Q7.8.
    pub(super) fn new(p: &MoeRouteParams, logits: &Tensor) -> Result<Self> {
        let metas = p.validate(&[logits.meta()])?;
        let x = logits.as_f32()?;
        let (t, e) = (x.shape()[0], x.shape()[1]);
        let flat: Vec<f32> = x.iter().copied().collect();
        if let Some(i) = flat.iter().position(|v| !v.is_finite()) {
            return Err(Error::invalid(
                "moe_route",
                format!("logit of token {} is not finite", i / e.max(1)),
            ));
        }
        let q = flat.iter().map(|&v| quantize_logit(v)).collect();
        Ok(Self {
            p: *p,
            metas: metas.into_vec(),
            logits: flat,
            q,
            t,
            e,
        })
    }

    /// Runs the router on `dev`, which has the build `core` loaded.
    pub(super) fn run(
        &self,
        dev: &mut dyn FpgaDevice,
        core: &RouterCore,
        timeout: Duration,
    ) -> std::result::Result<(RouterOut, RunStats), FpgaError> {
        drive::run_router_with(
            dev,
            core,
            &self.q,
            self.t,
            self.e,
            self.p.top_k,
            self.p.renormalize,
            timeout,
        )
    }

    /// The op's seven outputs from the kernel's: ids, dequantised weights and counts, then
    /// the permutation, offsets and losses made on the host.
    pub(super) fn outputs(&self, out: RouterOut) -> Result<Vec<Tensor>> {
        let m = &self.metas;
        let ids: Vec<i32> = out.ids.iter().map(|&v| i32::from(v)).collect();
        let scale = f32::from(1u16 << (WEIGHT_FRAC_BITS - 1)) * 2.0;
        let weights: Vec<f32> = out.weights.iter().map(|&w| f32::from(w) / scale).collect();
        let counts: Vec<i32> = out.hist.iter().map(|&c| c as i32).collect();
        let (sorted, offsets) = align_blocks(&ids, &counts, self.p.block_size, m[3].shape[0]);
        let wide: Vec<f64> = self.logits.iter().map(|&v| f64::from(v)).collect();
        let (aux, z) = router_losses(&wide, self.e, &counts);
        Ok(vec![
            Tensor::from_vec_i32(&m[0].shape, ids)?,
            Tensor::from_vec_f32(&m[1].shape, weights)?,
            Tensor::from_vec_i32(&m[2].shape, counts)?,
            Tensor::from_vec_i32(&m[3].shape, sorted)?,
            Tensor::from_vec_i32(&m[4].shape, offsets)?,
            Tensor::from_vec_f32(&[1], vec![aux as f32])?,
            Tensor::from_vec_f32(&[1], vec![z as f32])?,
        ])
    }
}
