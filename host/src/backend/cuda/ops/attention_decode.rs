//! Decode attention on a CUDA device (common/attention_decode.cu): flash-decoding split-KV in
//! one launch. A persistent grid (as many blocks as the device holds at once) cuts the line of
//! every (sequence, kv head, row group) pair's K/V tiles evenly, so all blocks stream the same
//! bytes and end together; each block streams its share through a cp.async ring in dynamic
//! shared memory (raised past the 48 KB default at the first launch). A pair held whole by one
//! block is written at once; a pair cut over blocks leaves its pieces' (o, lse) in f32 scratch
//! and the last piece to arrive merges them (a per-pair counter, zeroed before the launch). The
//! build is chosen per shape: the row block (`_r1/_r2/_r4/_r8`) is the smallest that holds a kv
//! head's query rows (Hq/Hkv * Nq).

use cudarc::driver::result as drv;

use super::{Arg, Cx};
use crate::backend::cuda::error::DrvResultExt;
use crate::backend::cuda::kernels::Dims;
use crate::backend::cuda::{CudaDType, CudaStorage};
use crate::error::{Error, Result};
use crate::ops::AttentionDecodeParams;
use crate::ops::attention_decode::DecodeShape;
use crate::tensor::TensorMeta;

/// Piece slots per pair, in units of the grid's blocks per pair: the fewest tiles a block
/// takes is the cache's tiles / (slots - 1), so with 4 the grid stays full while the
/// sequences hold a quarter of the cache or more.
const SLACK: usize = 4;

/// How a decode problem is laid over the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodePlan {
    /// Query rows per block (the kernel's `_r` suffix).
    pub rows: usize,
    /// Row groups per kv head.
    pub row_groups: usize,
    /// (sequence, kv head, row group) pairs: the counters the pieces' merge takes.
    pub pairs: usize,
    /// Blocks of the launch.
    pub blocks: usize,
    /// Piece slots per query row in the scratch: a pair is cut into at most this many pieces.
    pub parts: usize,
}

impl DecodePlan {
    /// The query rows per block for shape `s` (the smallest row block that holds a kv head's
    /// group, else the largest).
    pub fn rows(s: &DecodeShape) -> usize {
        let group = s.group_rows();
        let blocks = tandem_gpu_kernels::DECODE_ROW_BLOCKS;
        blocks
            .iter()
            .copied()
            .find(|&r| r >= group)
            .unwrap_or(blocks[blocks.len() - 1])
    }

    /// The launch for shape `s` with `blocks` blocks (the device's resident blocks, or
    /// `TANDEM_DECODE_BLOCKS`).
    pub fn new(s: &DecodeShape, blocks: usize) -> Self {
        let rows = Self::rows(s);
        let row_groups = s.group_rows().div_ceil(rows);
        let pairs = (s.b * s.hkv * row_groups).max(1);
        let blocks = blocks.max(1);
        let cap_tiles = s
            .capacity
            .div_ceil(tandem_gpu_kernels::decode_keys_per_tile(s.d))
            .max(1);
        let parts = (SLACK * blocks).div_ceil(pairs) + 2;
        Self {
            rows,
            row_groups,
            pairs,
            blocks,
            parts: parts.clamp(2, cap_tiles + 1),
        }
    }
}

/// The decode kernel taking `rows` query rows a block, for head dim `d`, paged or not, in
/// storage `dtype`.
pub fn kernel_name(rows: usize, d: usize, paged: bool, dtype: CudaDType) -> Result<&'static str> {
    let p = if paged { "paged_" } else { "" };
    super::kernel_for(&format!("attn_decode_{p}{{s}}_d{d}_r{rows}"), dtype)
}

fn i32_arg(what: &str, x: usize) -> Result<Arg> {
    i32::try_from(x)
        .map(Arg::I32)
        .map_err(|_| Error::invalid("attention_decode", format!("{what} {x} exceeds i32")))
}

/// Queues decode attention; returns the kernel that ran, with its grid.
pub fn attention_decode(
    cx: &Cx<'_>,
    p: &AttentionDecodeParams,
    ins: &[&CudaStorage],
    metas: &[TensorMeta],
    outs: &[CudaStorage],
) -> Result<String> {
    let s = p.shape(metas)?;
    let paged = p.block_size.is_some();
    let rows = DecodePlan::rows(&s);
    let kernel = kernel_name(rows, s.d, paged, cx.dtype())?;
    let threads = 32 * tandem_gpu_kernels::DECODE_WARPS;
    let smem = tandem_gpu_kernels::decode_smem_bytes(s.d, rows);
    let blocks = match cx.be.opts.decode_blocks {
        Some(n) => n,
        None => {
            let per_sm = cx.be.kernels.blocks_per_sm(kernel, threads, smem)?.max(1);
            (cx.sms() * per_sm) as usize
        }
    };
    let plan = DecodePlan::new(&s, blocks);
    let q = cx.half(ins[0], metas[0].numel())?;
    let k = cx.half(ins[1], metas[1].numel())?;
    let v = cx.half(ins[2], metas[2].numel())?;
    let lens = ins[3].ptr();
    let table = if paged { ins[4].ptr() } else { 0 };
    let rows_total = s.b * s.hq * s.nq;
    let part_o = cx.scratch(rows_total * plan.parts * s.d * 4)?;
    let part_lse = cx.scratch(rows_total * plan.parts * 4)?;
    let counters = cx.scratch(plan.pairs * 4)?;
    // SAFETY: counters holds pairs * 4 bytes; the memset is ordered on the compute stream
    // before the kernel that counts on it.
    unsafe { drv::memset_d8_async(counters.ptr(), 0, plan.pairs * 4, cx.stream()) }.ctx(
        &cx.be.dev.label,
        "cuMemsetD8Async(attention_decode counters)",
    )?;
    tracing::debug!(
        "attention_decode: {kernel} rows {} x {} groups, {} blocks, {} piece slots",
        plan.rows,
        plan.row_groups,
        plan.blocks,
        plan.parts
    );
    let scale_log2 = p.scale_for(s.d) * std::f32::consts::LOG2_E;
    cx.k(
        kernel,
        Dims {
            grid: (
                u32::try_from(plan.blocks).map_err(|_| {
                    Error::invalid("attention_decode", format!("{} blocks", plan.blocks))
                })?,
                1,
                1,
            ),
            block: (threads, 1, 1),
            smem: smem as u32,
        },
        &[
            Arg::Ptr(q.ptr),
            Arg::Ptr(k.ptr),
            Arg::Ptr(v.ptr),
            Arg::Ptr(lens),
            Arg::Ptr(table),
            Arg::Ptr(part_o.ptr()),
            Arg::Ptr(part_lse.ptr()),
            Arg::Ptr(outs[0].ptr()),
            Arg::Ptr(outs[1].ptr()),
            Arg::Ptr(counters.ptr()),
            i32_arg("batch", s.b)?,
            i32_arg("query heads", s.hq)?,
            i32_arg("kv heads", s.hkv)?,
            i32_arg("new tokens", s.nq)?,
            i32_arg("cache capacity", s.capacity)?,
            Arg::I32(s.block.trailing_zeros() as i32),
            i32_arg("block-table width", s.max_blocks)?,
            i32_arg("cache blocks", s.num_blocks.unwrap_or(0))?,
            i32_arg("piece slots", plan.parts)?,
            Arg::F32(scale_log2),
        ],
    )?;
    Ok(format!("memset_d8+{kernel}(x{})", plan.blocks))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(b: usize, hq: usize, hkv: usize, nq: usize, d: usize, cap: usize) -> DecodeShape {
        DecodeShape {
            b,
            hq,
            hkv,
            nq,
            d,
            capacity: cap,
            num_blocks: None,
            max_blocks: 0,
            block: cap,
        }
    }

    #[test]
    fn the_plan_fits_the_group_and_bounds_the_pieces() {
        // the target shape: 4 rows per kv head, 512 pairs over 396 blocks (3 a SM, 132 SMs)
        let p = DecodePlan::new(&shape(64, 32, 8, 1, 128, 8192), 396);
        assert_eq!((p.rows, p.row_groups, p.pairs, p.blocks), (4, 1, 512, 396));
        assert_eq!(p.parts, 6);
        // one sequence: many pieces a pair, bounded by the cache's tiles
        let p = DecodePlan::new(&shape(1, 32, 8, 1, 128, 8192), 396);
        assert_eq!((p.pairs, p.parts), (8, 200));
        let p = DecodePlan::new(&shape(1, 32, 8, 1, 128, 100), 396);
        assert_eq!(p.parts, 100usize.div_ceil(32) + 1);
        // MQA with 16 new tokens: 512 rows in groups of 8
        let p = DecodePlan::new(&shape(1, 32, 1, 16, 64, 100), 132);
        assert_eq!((p.rows, p.row_groups, p.pairs), (8, 64, 64));
        // MHA, one token: one row per block
        let p = DecodePlan::new(&shape(2, 4, 4, 1, 256, 5000), 132);
        assert_eq!(p.rows, 1);
        // a pair is cut into at most `parts` pieces whatever the lengths: the kernel's smallest
        // share is ceil(cap_tiles / (parts - 1)) tiles
        for (b, cap, blocks) in [(64, 8192, 396), (1, 8192, 396), (3, 50, 7), (1000, 64, 264)] {
            let s = shape(b, 32, 8, 1, 128, cap);
            let p = DecodePlan::new(&s, blocks);
            let cap_tiles = cap.div_ceil(32);
            let minw = cap_tiles.div_ceil(p.parts - 1);
            assert!(
                p.parts >= 2 && (cap_tiles - 1) / minw + 2 <= p.parts,
                "{p:?}"
            );
        }
        for dt in CudaDType::ALL {
            for d in [64, 128, 256] {
                for paged in [false, true] {
                    for rows in tandem_gpu_kernels::DECODE_ROW_BLOCKS {
                        assert!(kernel_name(rows, d, paged, dt).is_ok());
                    }
                }
            }
        }
    }
}
