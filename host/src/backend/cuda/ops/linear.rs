//! Fused linear on cuBLASLt: bias and GELU/ReLU in its epilogue; SiLU by a small kernel after.

use super::{Arg, Cx, Dims};
use crate::backend::cuda::CudaStorage;
use crate::backend::cuda::blaslt::Epilogue;
use crate::error::Result;
use crate::ops::{Activation, LinearParams};
use crate::tensor::TensorMeta;

/// The cuBLASLt epilogue for an activation, and whether SiLU must follow.
pub fn epilogue(act: Activation, bias: bool) -> (Epilogue, bool) {
    match act {
        Activation::None | Activation::Silu => (
            if bias { Epilogue::Bias } else { Epilogue::None },
            act == Activation::Silu,
        ),
        Activation::Relu => (Epilogue::Relu { bias }, false),
        Activation::Gelu => (Epilogue::Gelu { bias }, false),
    }
}

/// Whether the output is stored in f32 ([`LinearParams::f32_out`], every activation but
/// SiLU, which runs as a 16-bit kernel after the GEMM).
pub fn writes_f32(p: &LinearParams) -> bool {
    p.f32_out && p.act != Activation::Silu
}

pub fn linear(
    cx: &Cx<'_>,
    p: &LinearParams,
    ins: &[&CudaStorage],
    metas: &[TensorMeta],
    outs: &[CudaStorage],
) -> Result<String> {
    let (m, n, k) = p.mnk(metas)?;
    let x = cx.half(ins[0], m * k)?;
    let w = cx.half(ins[1], n * k)?;
    let f32_out = writes_f32(p);
    // The bias is stored as the output is.
    let b = match (p.bias, f32_out) {
        (false, _) => None,
        (true, false) => Some(cx.half(ins[2], n)?),
        (true, true) => Some(cx.f32(ins[2], n)?),
    };
    let (epi, silu) = epilogue(p.act, p.bias);
    cx.be.blas.matmul(
        cx.work_stream()?,
        cx.dtype(),
        f32_out,
        m,
        n,
        k,
        epi,
        x.ptr,
        w.ptr,
        b.as_ref().map(|b| b.ptr).unwrap_or(0),
        outs[0].ptr(),
    )?;
    let mut name = format!(
        "cublaslt_{}_gemm{}{}",
        cx.dtype(),
        epi.name(),
        if f32_out { "_f32out" } else { "" }
    );
    if silu && m * n > 0 {
        let total = (m * n) as u64;
        let silu = cx.kernel("silu_{s}")?;
        cx.k(
            silu,
            Dims::stride(total, 256, cx.sms()),
            &[Arg::Ptr(outs[0].ptr()), Arg::U64(total)],
        )?;
        name.push('+');
        name.push_str(silu);
    }
    Ok(name)
}
