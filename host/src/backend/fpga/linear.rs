//! `linear` (no activation or ReLU) on the GEMM kernel (`tandem_fpga::kernels::gemm`):
//! x per tensor and w per output channel quantised to int8, int32 bias, y requantised to int8
//! at a scale calibrated on up to 16 rows of x and dequantised on the host
//! (`fpga::golden::gemm::QuantLinear`). Any N and K: beyond the build's `n_max` / `k_max` the
//! driver (`tandem_fpga::drive::run_gemm_split`) runs column chunks and K passes whose int32
//! partial sums stay in device memory, bit for bit the single-launch result.

use std::time::Duration;

use tandem_fpga::golden::gemm as gq;
use tandem_fpga::kernels::gemm::GemmCore;
use tandem_fpga::{FpgaDevice, FpgaError, RunStats, drive};

use super::Support;
use crate::error::{Error, Result};
use crate::ops::{Activation, LinearParams};
use crate::tensor::{Tensor, TensorMeta};

/// Kernel name reported for linear (fused GEMM + bias + ReLU + requantisation).
pub const GEMM_KERNEL: &str = "linear_int8_gemm";

/// Largest linear (M*N*K multiply-adds) the simulated card takes: about a million cycles on
/// the 8x8 array, a second or so of simulation.
pub(super) const MAX_SIM_MACS: u128 = 1 << 26;

/// Largest linear the modelled card takes (the golden GEMM's time on the host: ~60 G
/// multiply-adds a second on two cores).
pub(super) const MAX_MODEL_MACS: u128 = 1 << 42;

/// Whether the GEMM build takes this linear: any N and K (past the build's `n_max` /
/// `k_max` as column chunks and K passes), up to `max_macs` multiply-adds.
pub(super) fn support(
    _core: &GemmCore,
    p: &LinearParams,
    inputs: &[TensorMeta],
    max_macs: u128,
) -> Support {
    let Ok((m, n, k)) = p.mnk(inputs) else {
        return Support::No("invalid linear inputs".into());
    };
    if !matches!(p.act, Activation::None | Activation::Relu) {
        return Support::No(format!("the GEMM kernel has ReLU only, not {:?}", p.act));
    }
    if (m as u128) * (n as u128) * (k as u128) > max_macs {
        return Support::No(format!(
            "{m}x{n}x{k} MACs is more than the simulated card runs quickly ({max_macs}; the \
             modelled card takes more: --fpga-sim-mode model or auto)"
        ));
    }
    Support::Native
}

/// One linear, quantised for the kernel.
pub(super) struct LinearJob {
    out: TensorMeta,
    xq: Vec<i8>,
    ql: gq::QuantLinear,
    relu: bool,
    d: gq::GemmDims,
    y_scale: f32,
}

impl LinearJob {
    /// x per tensor and w per output channel to int8, bias to int32, y per tensor (scale
    /// calibrated on up to 16 rows of x, 25% margin).
    pub(super) fn new(p: &LinearParams, inputs: &[&Tensor]) -> Result<Self> {
        let metas: Vec<TensorMeta> = inputs.iter().map(|t| t.meta()).collect();
        let outs = p.validate(&metas)?;
        let (m, n, k) = p.mnk(&metas)?;
        let x: Vec<f32> = inputs[0].as_f32()?.iter().copied().collect();
        let w: Vec<f32> = inputs[1].as_f32()?.iter().copied().collect();
        let b: Option<Vec<f32>> = if p.bias {
            Some(inputs[2].as_f32()?.iter().copied().collect())
        } else {
            None
        };
        let relu = p.act == Activation::Relu;
        let step = m.div_ceil(16).max(1);
        let sample: Vec<f32> = (0..m)
            .step_by(step)
            .flat_map(|r| x[r * k..(r + 1) * k].iter().copied())
            .collect();
        let x_scale = super::quant::scale_of(&x);
        let y_scale = gq::QuantLinear::calibrate_y_scale(&sample, &w, b.as_deref(), n, k, relu);
        let ql = gq::QuantLinear::new(&w, b.as_deref(), n, k, x_scale, y_scale)
            .map_err(|e| Error::invalid("linear", e.to_string()))?;
        let xq = super::quant::quantize(&x, x_scale);
        let out = outs
            .into_iter()
            .next()
            .ok_or_else(|| Error::Internal("linear has no output".into()))?;
        Ok(Self {
            out,
            xq,
            ql,
            relu,
            d: gq::GemmDims { m, n, k },
            y_scale,
        })
    }

    /// Runs the GEMM on `dev`, which has the build `core` loaded.
    pub(super) fn run(
        &self,
        dev: &mut dyn FpgaDevice,
        core: &tandem_fpga::kernels::gemm::GemmCore,
        timeout: Duration,
    ) -> std::result::Result<(Vec<i8>, RunStats), FpgaError> {
        let ql = &self.ql;
        drive::run_gemm_split(
            dev,
            core,
            &self.xq,
            &ql.w,
            &ql.bias,
            &ql.requant,
            self.relu,
            self.d,
            timeout,
        )
    }

    /// y dequantised.
    pub(super) fn output(&self, yq: &[i8]) -> Result<Tensor> {
        let y = super::quant::dequantize(yq, self.y_scale);
        Tensor::from_vec_f32(&self.out.shape, y)
    }
}
