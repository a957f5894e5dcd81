//! MoE routing (three fused kernels) and experts (gather, per-expert cuBLASLt GEMMs over the
//! permuted tokens, fused SwiGLU, weighted combine).

use cudarc::driver::result as drv;

use super::{Arg, Cx, Dims};
use crate::backend::cuda::blaslt::Epilogue;
use crate::backend::cuda::error::DrvResultExt;
use crate::backend::cuda::{CudaDType, CudaStorage};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{MoeExpertsParams, MoeRouteParams};
use crate::tensor::TensorMeta;

/// The routing top-k kernel for logits stored as `dtype` (f32 math either way).
pub fn topk_kernel(dtype: CudaDType) -> &'static str {
    match dtype {
        CudaDType::Bf16 => "moe_topk_softmax_f32",
        CudaDType::F16 => "moe_topk_softmax_f32_f16",
    }
}

pub fn route(
    cx: &Cx<'_>,
    p: &MoeRouteParams,
    ins: &[&CudaStorage],
    metas: &[TensorMeta],
    outs: &[CudaStorage],
) -> Result<String> {
    let (t, e) = (metas[0].shape[0], metas[0].shape[1]);
    let (k, bs) = (p.top_k, p.block_size);
    let plen = p.padded_len(t, e);
    let tpb = tandem_gpu_kernels::ROUTE_TOKENS_PER_BLOCK;
    let nb = t.div_ceil(tpb);
    let logits = cx.half(ins[0], t * e)?;
    let cells = (nb * e).max(1);
    let counts = cx.scratch(cells * 4)?;
    let psum = cx.scratch(cells * 4)?;
    let zs = cx.scratch(nb.max(1) * 4)?;
    let base = cx.scratch(cells * 4)?;
    let o: Vec<u64> = outs.iter().map(|s| s.ptr()).collect();
    let topk = topk_kernel(cx.dtype());
    if nb > 0 {
        cx.k(
            topk,
            Dims::linear(nb as u32, tandem_gpu_kernels::ROUTE_THREADS).smem(8 * e),
            &[
                Arg::Ptr(logits.ptr),
                Arg::I32(t as i32),
                Arg::I32(e as i32),
                Arg::I32(k as i32),
                Arg::I32(p.renormalize as i32),
                Arg::Ptr(o[0]),
                Arg::Ptr(o[1]),
                Arg::Ptr(counts.ptr()),
                Arg::Ptr(psum.ptr()),
                Arg::Ptr(zs.ptr()),
            ],
        )?;
    }
    cx.k(
        "moe_align_scan",
        Dims::linear(1, 1024).smem((2 * (1024 / e).max(1) * e + 2 * e + 1 + 64) * 4),
        &[
            Arg::Ptr(counts.ptr()),
            Arg::Ptr(psum.ptr()),
            Arg::Ptr(zs.ptr()),
            Arg::I32(nb as i32),
            Arg::I32(t as i32),
            Arg::I32(e as i32),
            Arg::I32(k as i32),
            Arg::I32(bs as i32),
            Arg::I32(plen as i32),
            Arg::Ptr(base.ptr()),
            Arg::Ptr(o[2]),
            Arg::Ptr(o[4]),
            Arg::Ptr(o[3]),
            Arg::Ptr(o[5]),
            Arg::Ptr(o[6]),
        ],
    )?;
    if nb > 0 {
        cx.k(
            "moe_align_scatter",
            Dims::linear(nb as u32, 32).smem(4 * e),
            &[
                Arg::Ptr(o[0]),
                Arg::Ptr(base.ptr()),
                Arg::I32(t as i32),
                Arg::I32(e as i32),
                Arg::I32(k as i32),
                Arg::Ptr(o[3]),
            ],
        )?;
    }
    Ok(format!("{topk}+moe_align_scan+moe_align_scatter"))
}

pub fn experts(
    cx: &Cx<'_>,
    p: &MoeExpertsParams,
    ins: &[&CudaStorage],
    metas: &[TensorMeta],
    outs: &[CudaStorage],
) -> Result<String> {
    let s = p.shape(metas)?;
    let (t, h, e, k, f) = (s.t, s.h, s.e, s.k, s.f);
    let x = cx.half(ins[0], t * h)?;
    let w = cx.f32(ins[2], t * k)?;
    let sorted = ins[3];
    let gate_up = cx.half(ins[5], e * 2 * f * h)?;
    let down = cx.half(ins[6], e * h * f)?;
    // The segment bounds decide the GEMM shapes: read them (this waits for queued work).
    let mut off = vec![0i32; e + 1];
    let label = &cx.be.dev.label;
    // SAFETY: the stream is live; off has e+1 ints, the size of expert_offsets.
    unsafe {
        drv::stream::synchronize(cx.stream()).ctx(label, "cuStreamSynchronize")?;
        drv::memcpy_dtoh_sync(&mut off, ins[4].ptr()).ctx(label, "cuMemcpyDtoH(expert_offsets)")?;
    }
    let pu = off[e].max(0) as usize;
    if pu > s.p || off.windows(2).any(|w| w[1] < w[0]) {
        return Err(Error::invalid(
            "moe_experts",
            format!(
                "expert_offsets {off:?} are not a partition of sorted_token_ids (length {})",
                s.p
            ),
        ));
    }
    let sentinel = (t * k) as i32;
    let xg = cx.alloc(pu * h, cx.phys())?;
    let hb = cx.alloc(pu * 2 * f, cx.phys())?;
    let act = cx.alloc(pu * f, cx.phys())?;
    let ob = cx.alloc(pu * h, cx.phys())?;
    let inv = cx.alloc(t * k, DType::I32)?;
    if pu > 0 {
        cx.k(
            cx.kernel("moe_gather_{s}")?,
            Dims::linear(pu as u32, 128),
            &[
                Arg::Ptr(x.ptr),
                Arg::Ptr(sorted.ptr()),
                Arg::Ptr(xg.ptr()),
                Arg::I32(pu as i32),
                Arg::I32(h as i32),
                Arg::I32(k as i32),
                Arg::I32(sentinel),
            ],
        )?;
    }
    let mut gemms = 0;
    for ex in 0..e {
        let (a, len) = (off[ex] as usize, (off[ex + 1] - off[ex]) as usize);
        if len == 0 {
            continue;
        }
        cx.be.blas.matmul(
            cx.stream(),
            cx.dtype(),
            len,
            2 * f,
            h,
            Epilogue::None,
            xg.ptr() + (a * h * 2) as u64,
            gate_up.ptr + (ex * 2 * f * h * 2) as u64,
            0,
            hb.ptr() + (a * 2 * f * 2) as u64,
        )?;
        gemms += 1;
    }
    if pu > 0 {
        cx.k(
            cx.kernel("moe_swiglu_{s}")?,
            Dims::stride((pu * f) as u64, 256, cx.sms()),
            &[
                Arg::Ptr(hb.ptr()),
                Arg::Ptr(act.ptr()),
                Arg::I32(pu as i32),
                Arg::I32(f as i32),
            ],
        )?;
    }
    for ex in 0..e {
        let (a, len) = (off[ex] as usize, (off[ex + 1] - off[ex]) as usize);
        if len == 0 {
            continue;
        }
        cx.be.blas.matmul(
            cx.stream(),
            cx.dtype(),
            len,
            h,
            f,
            Epilogue::None,
            act.ptr() + (a * f * 2) as u64,
            down.ptr + (ex * h * f * 2) as u64,
            0,
            ob.ptr() + (a * h * 2) as u64,
        )?;
    }
    if pu > 0 {
        cx.k(
            "moe_inverse_i32",
            Dims::stride(pu as u64, 256, cx.sms()),
            &[
                Arg::Ptr(sorted.ptr()),
                Arg::Ptr(inv.ptr()),
                Arg::I32(pu as i32),
                Arg::I32(sentinel),
            ],
        )?;
    }
    if t > 0 {
        cx.k(
            cx.kernel("moe_combine_{s}")?,
            Dims::linear(t as u32, (h.div_ceil(32) * 32).clamp(32, 256) as u32),
            &[
                Arg::Ptr(ob.ptr()),
                Arg::Ptr(inv.ptr()),
                Arg::Ptr(w.ptr),
                Arg::Ptr(outs[0].ptr()),
                Arg::I32(t as i32),
                Arg::I32(h as i32),
                Arg::I32(k as i32),
            ],
        )?;
    }
    let s = cx.dtype();
    Ok(format!(
        "moe_gather_{s}+cublaslt_{s}_gemm(x{gemms})+moe_swiglu_{s}+cublaslt_{s}_gemm(x{gemms})+moe_inverse_i32+moe_combine_{s}"
    ))
}
