//! Memory-bound ops: add, head split/merge, RMSNorm (+ residual), RoPE.

use super::{Arg, Cx, Dims};
use crate::backend::cuda::CudaStorage;
use crate::error::Result;
use crate::ops::{RmsNormParams, RopeParams, SplitHeadsParams};
use crate::tensor::TensorMeta;

pub fn add(
    cx: &Cx<'_>,
    ins: &[&CudaStorage],
    metas: &[TensorMeta],
    outs: &[CudaStorage],
) -> Result<String> {
    let n = metas[0].numel();
    let a = cx.half(ins[0], n)?;
    let b = cx.half(ins[1], n)?;
    let name = cx.kernel("add_{s}")?;
    if n > 0 {
        cx.k(
            name,
            Dims::stride((n as u64).div_ceil(8), 256, cx.sms()),
            &[
                Arg::Ptr(a.ptr),
                Arg::Ptr(b.ptr),
                Arg::Ptr(outs[0].ptr()),
                Arg::U64(n as u64),
            ],
        )?;
    }
    Ok(name.into())
}

pub fn split_heads(
    cx: &Cx<'_>,
    p: &SplitHeadsParams,
    ins: &[&CudaStorage],
    metas: &[TensorMeta],
    outs: &[CudaStorage],
) -> Result<String> {
    let n = metas[0].numel();
    let (rows, cols) = (metas[0].shape[0], metas[0].shape[1]);
    let (b, h) = (p.batch, p.heads);
    let (t, d) = (rows / b, cols / h);
    let x = cx.half(ins[0], n)?;
    let vec = if d % 8 == 0 { 8 } else { 1 };
    let name = cx.kernel("split_heads_{s}")?;
    if n > 0 {
        cx.k(
            name,
            Dims::stride((n / vec) as u64, 256, cx.sms()),
            &[
                Arg::Ptr(x.ptr),
                Arg::Ptr(outs[0].ptr()),
                Arg::I32(b as i32),
                Arg::I32(t as i32),
                Arg::I32(h as i32),
                Arg::I32(d as i32),
                Arg::I32(vec as i32),
            ],
        )?;
    }
    Ok(name.into())
}

pub fn merge_heads(
    cx: &Cx<'_>,
    ins: &[&CudaStorage],
    metas: &[TensorMeta],
    outs: &[CudaStorage],
) -> Result<String> {
    let n = metas[0].numel();
    let s = &metas[0].shape;
    let (b, h, t, d) = (s[0], s[1], s[2], s[3]);
    let x = cx.half(ins[0], n)?;
    let vec = if d % 8 == 0 { 8 } else { 1 };
    let name = cx.kernel("merge_heads_{s}")?;
    if n > 0 {
        cx.k(
            name,
            Dims::stride((n / vec) as u64, 256, cx.sms()),
            &[
                Arg::Ptr(x.ptr),
                Arg::Ptr(outs[0].ptr()),
                Arg::I32(b as i32),
                Arg::I32(h as i32),
                Arg::I32(t as i32),
                Arg::I32(d as i32),
                Arg::I32(vec as i32),
            ],
        )?;
    }
    Ok(name.into())
}

pub fn rmsnorm(
    cx: &Cx<'_>,
    p: &RmsNormParams,
    ins: &[&CudaStorage],
    metas: &[TensorMeta],
    outs: &[CudaStorage],
) -> Result<String> {
    let n = metas[0].numel();
    let cols = *metas[0].shape.last().unwrap_or(&1);
    let rows = n / cols.max(1);
    let x = cx.half(ins[0], n)?;
    let w = cx.half(ins[1], cols)?;
    let res = if p.residual {
        Some(cx.half(ins[2], n)?)
    } else {
        None
    };
    let vpt = tandem_gpu_kernels::RMSNORM_VECTORS_PER_THREAD;
    let nv = cols / 8;
    let vector = cols % 8 == 0 && nv <= vpt * 1024;
    let (name, threads) = if vector {
        (
            cx.kernel("rmsnorm_{s}")?,
            (nv.div_ceil(vpt).div_ceil(32) * 32).clamp(32, 1024),
        )
    } else {
        (
            cx.kernel("rmsnorm_{s}_scalar")?,
            (cols.div_ceil(32) * 32).clamp(32, 1024),
        )
    };
    if rows > 0 {
        cx.k(
            name,
            Dims::linear(rows as u32, threads as u32),
            &[
                Arg::Ptr(x.ptr),
                Arg::Ptr(w.ptr),
                Arg::Ptr(res.as_ref().map(|r| r.ptr).unwrap_or(0)),
                Arg::Ptr(outs[0].ptr()),
                Arg::Ptr(outs.get(1).map(|s| s.ptr()).unwrap_or(0)),
                Arg::I32(cols as i32),
                Arg::F32(p.eps),
            ],
        )?;
    }
    Ok(name.into())
}

pub fn rope(
    cx: &Cx<'_>,
    p: &RopeParams,
    ins: &[&CudaStorage],
    metas: &[TensorMeta],
    outs: &[CudaStorage],
) -> Result<String> {
    let n = metas[0].numel();
    let s = &metas[0].shape;
    let (t, d) = (s[2], s[3]);
    let rows = n / d.max(1);
    let x = cx.half(ins[0], n)?;
    let vector = d % 16 == 0;
    let (name, items) = if vector {
        (cx.kernel("rope_{s}")?, rows * d / 16)
    } else {
        (cx.kernel("rope_{s}_scalar")?, rows * d / 2)
    };
    if n > 0 {
        cx.k(
            name,
            Dims::stride(items as u64, 256, cx.sms()),
            &[
                Arg::Ptr(x.ptr),
                Arg::Ptr(outs[0].ptr()),
                Arg::U64(rows as u64),
                Arg::I32(t as i32),
                Arg::I32(d as i32),
                Arg::I32(p.position_offset as i32),
                Arg::F32(p.base.log2() as f32),
            ],
        )?;
    }
    Ok(name.into())
}
