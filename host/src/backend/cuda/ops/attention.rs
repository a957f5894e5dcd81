//! Attention forward: the FlashAttention-2-style mma.sync builds (sm80/attention.cu, any
//! sm_80+ device) and the Hopper build in FlashAttention-3's structure (sm90a/attention_ws.cu:
//! TMA producer warp, two consumer warpgroups taking turns on wgmma), chosen by arch.

use cudarc::driver::result as drv;

use super::{Arg, Cx};
use crate::backend::cuda::error::DrvResultExt;
use crate::backend::cuda::kernels::Dims;
use crate::backend::cuda::tma;
use crate::backend::cuda::{CudaDType, CudaStorage};
use crate::error::{Error, Result};
use crate::ops::AttentionParams;
use crate::tensor::TensorMeta;

/// A build of the kernel (the options' name list; its geometry is here).
pub use crate::options::cuda::AttentionVariant as Variant;

impl Variant {
    /// The build for a device of compute capability `arch` and head dim `d`: `forced`
    /// ([`crate::options::CudaOptions::attention_variant`], `TANDEM_ATTN_VARIANT`) when given,
    /// else the fastest measured (docs/PERF.md): `ws` on sm_90, `m2` elsewhere (`w4` for head
    /// dim 256, which has no `m2` build).
    pub fn select(arch: u32, d: usize, forced: Option<Variant>) -> Self {
        match forced {
            Some(v) => v,
            None if arch == 90 && HEAD_DIMS.contains(&d) => Variant::Ws,
            None if d == 256 => Variant::W4,
            None => Variant::M2,
        }
    }

    /// Whether this build has a kernel for head dim `d`: every build for 64 and 128; `w4`,
    /// `w8` and `ws` for 256 (the two-m-tile builds would need 256 registers a thread for O).
    pub fn has_head_dim(self, d: usize) -> bool {
        self.pattern(d).is_some()
    }

    /// Why this build cannot take head dim `d` (for a decline or an error).
    pub fn missing_head_dim(self, d: usize) -> String {
        format!(
            "the {} attention build has no head dim {d} kernel (builds for it: {})",
            self.name(),
            Variant::names_for(d)
        )
    }

    /// The builds with a kernel for head dim `d`, by name ("w4, w8, ws").
    pub fn names_for(d: usize) -> String {
        Variant::ALL
            .iter()
            .filter(|v| v.has_head_dim(d))
            .map(|v| v.name())
            .collect::<Vec<_>>()
            .join(", ")
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

    /// Dynamic shared memory a block of this build takes for head dim `d`, bytes.
    pub fn smem(self, d: usize) -> usize {
        let (bm, bn) = (self.block_m(d), self.block_n(d));
        if self == Variant::Ws {
            tandem_gpu_kernels::attention_ws_smem(d, bn)
        } else {
            // Q tile, one K tile, one V tile; rows padded by 8 elements (conflict-free ldmatrix)
            (bm + 2 * bn) * (d + 8) * 2
        }
    }

    /// Whether this build needs sm_90 (wgmma, TMA).
    pub fn hopper_only(self) -> bool {
        self == Variant::Ws
    }

    /// The entry point's name pattern for head dim `d`; `{s}` is the storage. None where the
    /// build has no kernel for `d`.
    fn pattern(self, d: usize) -> Option<&'static str> {
        Some(match (d, self) {
            (64, Variant::W4) => "mha_{s}_fwd_d64",
            (64, Variant::W8) => "mha_{s}_fwd_d64_w8",
            (64, Variant::M2) => "mha_{s}_fwd_d64_m2",
            (64, Variant::M2N32) => "mha_{s}_fwd_d64_m2n32",
            (64, Variant::Ws) => "mha_{s}_fwd_d64_ws",
            (128, Variant::W4) => "mha_{s}_fwd_d128",
            (128, Variant::W8) => "mha_{s}_fwd_d128_w8",
            (128, Variant::M2) => "mha_{s}_fwd_d128_m2",
            (128, Variant::M2N32) => "mha_{s}_fwd_d128_m2n32",
            (128, Variant::Ws) => "mha_{s}_fwd_d128_ws",
            (256, Variant::W4) => "mha_{s}_fwd_d256",
            (256, Variant::W8) => "mha_{s}_fwd_d256_w8",
            (256, Variant::Ws) => "mha_{s}_fwd_d256_ws",
            _ => return None,
        })
    }

    /// The entry point of this build for head dim `d` in storage `dtype`.
    pub fn kernel(self, d: usize, dtype: CudaDType) -> Result<&'static str> {
        let pattern = self.pattern(d).ok_or_else(|| Error::Unsupported {
            op: "attention".into(),
            device: "cuda".into(),
            why: self.missing_head_dim(d),
        })?;
        super::kernel_for(pattern, dtype)
    }
}

/// Head dims the CUDA attention kernels take.
pub const HEAD_DIMS: [usize; 3] = [64, 128, 256];

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
    if var == Variant::Ws {
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
    } else {
        args.extend([Arg::Ptr(q.ptr), Arg::Ptr(k.ptr), Arg::Ptr(v.ptr)]);
    }
    let smem = var.smem(s.d);
    args.extend(tail);
    // ws: the batch, and the tile counter its blocks take tiles from after their first
    // (zeroed here, in stream order; returned to the pool after the kernel)
    let counter = if var == Variant::Ws {
        let c = cx.scratch(4)?;
        // SAFETY: c holds 4 bytes; the memset is ordered on the compute stream before the kernel.
        unsafe { drv::memset_d8_async(c.ptr(), 0, 4, cx.work_stream()?) }
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
