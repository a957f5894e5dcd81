//! Attention forward: the FlashAttention-2-style mma.sync kernel (sm80/attention.cu).

use super::{Arg, Cx};
use crate::backend::cuda::CudaStorage;
use crate::backend::cuda::kernels::Dims;
use crate::error::Result;
use crate::ops::AttentionParams;
use crate::tensor::TensorMeta;

/// Warps per block of the attention kernel: `TANDEM_ATTN_WARPS` (4 or 8), default 4.
fn warps() -> usize {
    match std::env::var("TANDEM_ATTN_WARPS").ok().as_deref() {
        Some("8") => 8,
        _ => 4,
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
    let nw = warps();
    let name: &'static str = match (s.d, nw) {
        (64, 8) => "mha_bf16_fwd_d64_w8",
        (64, _) => "mha_bf16_fwd_d64",
        (_, 8) => "mha_bf16_fwd_d128_w8",
        _ => "mha_bf16_fwd_d128",
    };
    let q = cx.bf16(ins[0], metas[0].numel())?;
    let k = cx.bf16(ins[1], metas[1].numel())?;
    let v = cx.bf16(ins[2], metas[2].numel())?;
    if s.nq == 0 {
        return Ok(name.into());
    }
    let bm = 16 * nw;
    let bn = tandem_gpu_kernels::ATTENTION_BLOCK_N;
    let smem = (bm + 4 * bn) * (s.d + 8) * 2;
    let scale_log2 = p.scale_for(s.d) * std::f32::consts::LOG2_E;
    let dims = Dims {
        grid: (s.nq.div_ceil(bm) as u32, s.hq as u32, s.b as u32),
        block: ((32 * nw) as u32, 1, 1),
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
