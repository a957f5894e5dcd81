//! Attention forward: the FlashAttention-2-style mma.sync kernel (sm80/attention.cu).

use super::{Arg, Cx};
use crate::backend::cuda::kernels::Dims;
use crate::backend::cuda::{CudaDType, CudaStorage};
use crate::error::Result;
use crate::ops::AttentionParams;
use crate::tensor::TensorMeta;

/// A build of the kernel: warps per block and 16-row m-tiles per warp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// 4 warps x 1 m-tile (64-row blocks).
    W4,
    /// 8 warps x 1 m-tile (128-row blocks).
    W8,
    /// 4 warps x 2 m-tiles (128-row blocks, FA2's layout): each K/V fragment feeds two mma's.
    M2,
    /// As M2 with 32-key tiles (fewer registers for S, Q kept in registers).
    M2N32,
    /// Hopper (sm_90 only): S = QK^T on wgmma from shared memory, PV on mma.sync; 128-row blocks.
    Wg,
    /// Hopper (sm_90 only): both products on wgmma (P from registers, V N-major in shared memory).
    Wg2,
    /// As Wg with 64-row blocks (fewer registers, more blocks per SM).
    Wgs,
    /// As Wg2 with 64-row blocks.
    Wg2s,
    /// As Wg with two consumer warpgroups per block (256 rows, 256 threads).
    Wgx2,
}

impl Variant {
    /// The build for a device of compute capability `arch` and head dim `d`:
    /// `TANDEM_ATTN_VARIANT` (w4, w8, m2, m2n32, wg, wg2, wgs, wg2s, wgx2) when set, else the fastest
    /// measured (docs/PERF.md): `wg` for d128 on sm_90, `m2` otherwise.
    pub fn select(arch: u32, d: usize) -> Self {
        match std::env::var("TANDEM_ATTN_VARIANT").ok().as_deref() {
            Some("w4") => Variant::W4,
            Some("w8") => Variant::W8,
            Some("m2") => Variant::M2,
            Some("m2n32") => Variant::M2N32,
            Some("wg") => Variant::Wg,
            Some("wg2") => Variant::Wg2,
            Some("wgs") => Variant::Wgs,
            Some("wg2s") => Variant::Wg2s,
            Some("wgx2") => Variant::Wgx2,
            _ if arch == 90 && d == 128 => Variant::Wg,
            _ => Variant::M2,
        }
    }

    /// Query rows per block.
    pub fn block_m(self) -> usize {
        match self {
            Variant::W4 | Variant::Wgs | Variant::Wg2s => 64,
            Variant::Wgx2 => 256,
            Variant::W8 | Variant::M2 | Variant::M2N32 | Variant::Wg | Variant::Wg2 => 128,
        }
    }

    /// Key rows per tile.
    pub fn block_n(self) -> usize {
        match self {
            Variant::M2N32 => 32,
            _ => tandem_gpu_kernels::ATTENTION_BLOCK_N,
        }
    }

    /// Threads per block.
    pub fn threads(self) -> usize {
        match self {
            Variant::W8 | Variant::Wgx2 => 256,
            Variant::W4
            | Variant::M2
            | Variant::M2N32
            | Variant::Wg
            | Variant::Wg2
            | Variant::Wgs
            | Variant::Wg2s => 128,
        }
    }

    /// Whether this build needs sm_90 (wgmma).
    pub fn hopper_only(self) -> bool {
        matches!(
            self,
            Variant::Wg | Variant::Wg2 | Variant::Wgs | Variant::Wg2s | Variant::Wgx2
        )
    }

    /// Entry point for a head dim (64 or 128).
    pub fn kernel(self, d: usize) -> &'static str {
        match (d, self) {
            (64, Variant::W4) => "mha_bf16_fwd_d64",
            (64, Variant::W8) => "mha_bf16_fwd_d64_w8",
            (64, Variant::M2) => "mha_bf16_fwd_d64_m2",
            (64, Variant::M2N32) => "mha_bf16_fwd_d64_m2n32",
            (_, Variant::M2N32) => "mha_bf16_fwd_d128_m2n32",
            (64, Variant::Wg) => "mha_bf16_fwd_d64_wg",
            (_, Variant::Wg) => "mha_bf16_fwd_d128_wg",
            (64, Variant::Wg2) => "mha_bf16_fwd_d64_wg2",
            (_, Variant::Wg2) => "mha_bf16_fwd_d128_wg2",
            (64, Variant::Wgs) => "mha_bf16_fwd_d64_wgs",
            (_, Variant::Wgs) => "mha_bf16_fwd_d128_wgs",
            (64, Variant::Wg2s) => "mha_bf16_fwd_d64_wg2s",
            (_, Variant::Wg2s) => "mha_bf16_fwd_d128_wg2s",
            (64, Variant::Wgx2) => "mha_bf16_fwd_d64_wgx2",
            (_, Variant::Wgx2) => "mha_bf16_fwd_d128_wgx2",
            (_, Variant::W4) => "mha_bf16_fwd_d128",
            (_, Variant::W8) => "mha_bf16_fwd_d128_w8",
            (_, Variant::M2) => "mha_bf16_fwd_d128_m2",
        }
    }
}

/// The build for storage `dtype`: bf16 as [`Variant::select`] says; f16 has the sm80 (mma.sync)
/// builds only, so where that choice is a Hopper build (the default `wg` for d128 on sm_90, or
/// `TANDEM_ATTN_VARIANT=wg*`) f16 runs `m2`, which runs on sm_90 too.
pub fn select_for(arch: u32, d: usize, dtype: CudaDType) -> Variant {
    let v = Variant::select(arch, d);
    if dtype == CudaDType::F16 && v.hopper_only() {
        Variant::M2
    } else {
        v
    }
}

/// The entry point of build `var` for head dim `d` in storage `dtype`: `mha_bf16_fwd_*`, or its
/// `mha_f16_fwd_*` twin.
pub fn kernel_for(var: Variant, d: usize, dtype: CudaDType) -> Result<&'static str> {
    match dtype {
        CudaDType::Bf16 => Ok(var.kernel(d)),
        CudaDType::F16 => {
            super::kernel_for(&var.kernel(d).replacen("mha_bf16_", "mha_{s}_", 1), dtype)
        }
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
    let var = select_for(cx.be.dev.arch, s.d, cx.dtype());
    let name = kernel_for(var, s.d, cx.dtype())?;
    let q = cx.half(ins[0], metas[0].numel())?;
    let k = cx.half(ins[1], metas[1].numel())?;
    let v = cx.half(ins[2], metas[2].numel())?;
    if s.nq == 0 {
        return Ok(name.into());
    }
    let bm = var.block_m();
    let bn = var.block_n();
    // Q tile, one K tile, one V tile; rows padded by 8 bf16 (conflict-free ldmatrix), except Q
    // and K of the wgmma build (core-matrix layout, unpadded)
    let smem = if matches!(var, Variant::Wg2 | Variant::Wg2s) {
        (bm + 2 * bn) * s.d * 2
    } else if matches!(var, Variant::Wg | Variant::Wgs | Variant::Wgx2) {
        ((bm + bn) * s.d + bn * (s.d + 8)) * 2
    } else {
        (bm + 2 * bn) * (s.d + 8) * 2
    };
    let scale_log2 = p.scale_for(s.d) * std::f32::consts::LOG2_E;
    let dims = Dims {
        grid: (s.nq.div_ceil(bm) as u32, s.hq as u32, s.b as u32),
        block: (var.threads() as u32, 1, 1),
        smem: smem as u32,
    };
    cx.k(
        name,
        dims,
        &[
            Arg::Ptr(q.ptr),
            Arg::Ptr(k.ptr),
            Arg::Ptr(v.ptr),
            Arg::Ptr(outs[0].ptr()),
            Arg::Ptr(outs[1].ptr()),
            Arg::I32(s.hq as i32),
            Arg::I32(s.hkv as i32),
            Arg::I32(s.nq as i32),
            Arg::I32(s.nkv as i32),
            Arg::F32(scale_log2),
            Arg::I32(p.causal as i32),
        ],
    )?;
    Ok(name.into())
}
