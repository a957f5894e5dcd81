//! Attention forward: the FlashAttention-2-style mma.sync builds (sm80/attention.cu, any
//! sm_80+ device) and the Hopper build in FlashAttention-3's structure (sm90a/attention_ws.cu:
//! TMA producer warp, two consumer warpgroups taking turns on wgmma), chosen by arch.

use cudarc::driver::result as drv;

use super::{Arg, Cx};
use crate::backend::cuda::error::DrvResultExt;
use crate::backend::cuda::kernels::Dims;
use crate::backend::cuda::tma;
use crate::backend::cuda::{CudaDType, CudaStorage};
use crate::error::Result;
use crate::ops::AttentionParams;
use crate::tensor::TensorMeta;

/// A build of the kernel (the options' name list; its geometry is here).
pub use crate::options::cuda::AttentionVariant as Variant;

impl Variant {
    /// The build for a device of compute capability `arch` and head dim `d`: `forced`
    /// ([`crate::options::CudaOptions::attention_variant`], `TANDEM_ATTN_VARIANT`) when given,
    /// else the fastest measured (docs/PERF.md): `ws` on sm_90, `m2` elsewhere.
    pub fn select(arch: u32, d: usize, forced: Option<Variant>) -> Self {
        match forced {
            Some(v) => v,
            None if arch == 90 && (d == 64 || d == 128) => Variant::Ws,
            None => Variant::M2,
        }
    }

    /// Query rows per block for head dim `d`.
    pub fn block_m(self, d: usize) -> usize {
        match self {
            Variant::W4 => 64,
            Variant::Ws => tandem_gpu_kernels::attention_ws_block_m(d),
            Variant::W8 | Variant::M2 | Variant::M2N32 => 128,
        }
    }

    /// Key rows per tile for head dim `d`.
    pub fn block_n(self, d: usize) -> usize {
        match self {
            Variant::M2N32 => 32,
            Variant::Ws => tandem_gpu_kernels::attention_ws_block_n(d),
            _ => tandem_gpu_kernels::ATTENTION_BLOCK_N,
        }
    }

    /// Threads per block for head dim `d`.
    pub fn threads(self, d: usize) -> usize {
        match self {
            Variant::Ws => tandem_gpu_kernels::attention_ws_threads(d) as usize,
            Variant::W8 => 256,
            Variant::W4 | Variant::M2 | Variant::M2N32 => 128,
        }
    }

    /// Whether this build needs sm_90 (wgmma, TMA).
    pub fn hopper_only(self) -> bool {
        self == Variant::Ws
    }

    /// The entry point's name pattern for head dim `d` (64 or 128); `{s}` is the storage.
    fn pattern(self, d: usize) -> &'static str {
        match (d, self) {
            (64, Variant::W4) => "mha_{s}_fwd_d64",
            (64, Variant::W8) => "mha_{s}_fwd_d64_w8",
            (64, Variant::M2) => "mha_{s}_fwd_d64_m2",
            (64, Variant::M2N32) => "mha_{s}_fwd_d64_m2n32",
            (64, Variant::Ws) => "mha_{s}_fwd_d64_ws",
            (_, Variant::W4) => "mha_{s}_fwd_d128",
            (_, Variant::W8) => "mha_{s}_fwd_d128_w8",
            (_, Variant::M2) => "mha_{s}_fwd_d128_m2",
            (_, Variant::M2N32) => "mha_{s}_fwd_d128_m2n32",
            (_, Variant::Ws) => "mha_{s}_fwd_d128_ws",
        }
    }

    /// The entry point of this build for head dim `d` in storage `dtype`.
    pub fn kernel(self, d: usize, dtype: CudaDType) -> Result<&'static str> {
        super::kernel_for(self.pattern(d), dtype)
    }
}

pub fn attention(
    cx: &Cx<'_>,
    p: &AttentionParams,
    ins: &[&CudaStorage],
    metas: &[TensorMeta],
    outs: &[CudaStorage],
) -> Result<String> {
    let s = p.shape(metas)?;
    let mut var = Variant::select(cx.be.dev.arch, s.d, cx.be.opts.attention_variant);
    if var == Variant::Ws && s.nkv == 0 {
        // no keys: nothing for the TMA to map; the mma.sync build writes the empty result
        var = Variant::M2;
    }
    if var == Variant::Ws && s.nq.div_ceil(var.block_m(s.d)) * s.hq * s.b > i32::MAX as usize {
        // the persistent build numbers its tiles in 32 bits
        var = Variant::M2;
    }
    let name = var.kernel(s.d, cx.dtype())?;
    let q = cx.half(ins[0], metas[0].numel())?;
    let k = cx.half(ins[1], metas[1].numel())?;
    let v = cx.half(ins[2], metas[2].numel())?;
    if s.nq == 0 {
        return Ok(name.into());
    }
    let bm = var.block_m(s.d);
    let bn = var.block_n(s.d);
    let scale_log2 = p.scale_for(s.d) * std::f32::consts::LOG2_E;
    // ws: persistent, one block a multiprocessor over every (row block, head, batch) tile
    let tiles = s.nq.div_ceil(bm) * s.hq * s.b;
    let grid = if var == Variant::Ws {
        (tiles.min(cx.sms() as usize).max(1) as u32, 1, 1)
    } else {
        (s.nq.div_ceil(bm) as u32, s.hq as u32, s.b as u32)
    };
    let block = (var.threads(s.d) as u32, 1, 1);
    let tail = [
        Arg::Ptr(outs[0].ptr()),
        Arg::Ptr(outs[1].ptr()),
        Arg::I32(s.hq as i32),
        Arg::I32(s.hkv as i32),
        Arg::I32(s.nq as i32),
        Arg::I32(s.nkv as i32),
        Arg::F32(scale_log2),
        Arg::I32(p.causal as i32),
    ];
    let mut args = Vec::with_capacity(11);
    let smem = if var == Variant::Ws {
        // Q in BM-row boxes, K and V in BN-row boxes, 64 columns (128 bytes) each
        let label = &cx.be.dev.label;
        let ty = cx.dtype().dtype();
        let kv = [s.b * s.hkv, s.nkv, s.d];
        let qd = [s.b * s.hq, s.nq, s.d];
        args.push(Arg::TensorMap(tma::tiled_3d_sw128(
            label, q.ptr, ty, qd, bm as u32, 64,
        )?));
        args.push(Arg::TensorMap(tma::tiled_3d_sw128(
            label, k.ptr, ty, kv, bn as u32, 64,
        )?));
        args.push(Arg::TensorMap(tma::tiled_3d_sw128(
            label, v.ptr, ty, kv, bn as u32, 64,
        )?));
        tandem_gpu_kernels::attention_ws_smem(s.d, bn)
    } else {
        // Q tile, one K tile, one V tile; rows padded by 8 elements (conflict-free ldmatrix)
        args.extend([Arg::Ptr(q.ptr), Arg::Ptr(k.ptr), Arg::Ptr(v.ptr)]);
        (bm + 2 * bn) * (s.d + 8) * 2
    };
    args.extend(tail);
    // ws: the batch, and the tile counter its blocks take tiles from after their first
    // (zeroed here, in stream order; returned to the pool after the kernel)
    let counter = if var == Variant::Ws {
        let c = cx.scratch(4)?;
        // SAFETY: c holds 4 bytes; the memset is ordered on the compute stream before the kernel.
        unsafe { drv::memset_d8_async(c.ptr(), 0, 4, cx.stream()) }
            .ctx(&cx.be.dev.label, "cuMemsetD8Async(attention tile counter)")?;
        args.push(Arg::I32(s.b as i32));
        args.push(Arg::Ptr(c.ptr()));
        Some(c)
    } else {
        None
    };
    let dims = Dims {
        grid,
        block,
        smem: smem as u32,
    };
    cx.k(name, dims, &args)?;
    drop(counter);
    Ok(name.into())
}
