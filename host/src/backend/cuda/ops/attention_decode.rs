//! Decode attention on a CUDA device (common/attention_decode.cu): flash-decoding split-KV.
//! A partial kernel per (KV chunk, kv head x row group, sequence) streams its chunk's K/V
//! tiles through a cp.async ring in dynamic shared memory ([`tandem_gpu_kernels::DecodeRing`]:
//! by default 128 KB contiguous, one block a SM, and 96 KB paged, two a SM; raised past the
//! 48 KB default at the first launch) and writes the chunk's (o, lse) to f32 scratch, then a
//! merge kernel combines the chunks by LSE; a cache left in one chunk (a batch that fills the
//! device unsplit) has its o and LSE written by the partial kernel, with no merge. The row
//! block (`_r1/_r2/_r4/_r8`) is the smallest that holds a kv head's query rows
//! (Hq/Hkv * Nq), and the chunk count is chosen by [`DecodePlan::new`].

use super::{Arg, Cx};
use crate::backend::cuda::kernels::Dims;
use crate::backend::cuda::{CudaDType, CudaStorage};
use crate::error::{Error, Result};
use crate::ops::AttentionDecodeParams;
use crate::ops::attention_decode::DecodeShape;
use crate::tensor::TensorMeta;

/// Blocks of a heavy build's partial kernel aimed for, per multiprocessor (several waves, so
/// the blocks of short sequences, which end early, leave no SM idle for long).
pub const HEAVY_BLOCKS_PER_SM: usize = 32;
/// Fewest keys a chunk takes (below this the merge costs more than it spreads).
const MIN_CHUNK: usize = 256;
/// Fewest keys a chunk takes when the chunk count is forced (`TANDEM_DECODE_CHUNKS`).
pub const MIN_FORCED_CHUNK: usize = 64;

/// How a decode problem is split over the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodePlan {
    /// Query rows per block (the kernel's `_r` suffix).
    pub rows: usize,
    /// Row groups per kv head (blocks along the group's rows).
    pub row_groups: usize,
    /// KV chunks per sequence.
    pub chunks: usize,
    /// Keys per chunk.
    pub chunk_len: usize,
}

impl DecodePlan {
    /// The split for shape `s` on a device of `sms` multiprocessors, each holding
    /// `blocks_per_sm` blocks at once, over tiles of `tile` keys; `chunks` forces the KV chunk
    /// count (clamped to 1..= the cache's keys / [`MIN_FORCED_CHUNK`]).
    ///
    /// Unforced, for the light builds (d 64 and 128 on the tensor cores, up to 4 rows), the
    /// cache is cut into as many chunks as one wave of resident blocks holds (at least one):
    /// a batch whose (sequence, kv head, row group) blocks fill the device is not split (no
    /// merge, each block streams its whole sequence, as cuDNN's decode does), and a split
    /// never leaves a short second wave. The heavy builds
    /// ([`tandem_gpu_kernels::DecodeRing::heavy`]), whose math needs many short blocks to
    /// hide it, are cut into [`HEAVY_BLOCKS_PER_SM`] blocks a SM (at least [`MIN_CHUNK`] keys
    /// a chunk), as measured best for them.
    pub fn new(
        s: &DecodeShape,
        sms: usize,
        blocks_per_sm: usize,
        chunks: Option<usize>,
        tile: usize,
    ) -> Self {
        let rows = Self::rows_for(s);
        let row_groups = s.group_rows().div_ceil(rows);
        let per_chunk = (s.b * s.hkv * row_groups).max(1);
        let resident = sms.max(1) * blocks_per_sm.max(1);
        let most = s.capacity.div_ceil(MIN_CHUNK).max(1);
        let heavy = tandem_gpu_kernels::DecodeRing::heavy(s.d, rows);
        let chunks = match chunks {
            Some(n) => n.clamp(1, s.capacity.div_ceil(MIN_FORCED_CHUNK).max(1)),
            None if heavy => (sms.max(1) * HEAVY_BLOCKS_PER_SM)
                .div_ceil(per_chunk)
                .clamp(1, most),
            None => (resident / per_chunk).clamp(1, most),
        };
        let chunk_len = s.capacity.div_ceil(chunks).next_multiple_of(tile);
        Self {
            rows,
            row_groups,
            chunks: s.capacity.div_ceil(chunk_len),
            chunk_len,
        }
    }

    /// Query rows per block (the kernel's `_r` suffix): the smallest build that holds a kv
    /// head's group (Hq/Hkv * Nq rows), else the largest (and several row groups).
    pub fn rows_for(s: &DecodeShape) -> usize {
        let group = s.group_rows();
        let blocks = tandem_gpu_kernels::DECODE_ROW_BLOCKS;
        blocks
            .iter()
            .copied()
            .find(|&r| r >= group)
            .unwrap_or(blocks[blocks.len() - 1])
    }

    /// Blocks of a partial kernel a multiprocessor holds at once: as many as its shared memory
    /// (`smem` bytes a block) allows, at most 3 (2 for 8-row blocks: their registers).
    pub fn blocks_per_sm(rows: usize, smem: usize) -> usize {
        let regs = if rows <= 4 { 3 } else { 2 };
        (tandem_gpu_kernels::DecodeRing::MAX_SMEM / smem.max(1)).clamp(1, regs)
    }

    /// The partial kernel's entry point for head dim `d`, paged or not, in storage `dtype`.
    pub fn kernel(&self, d: usize, paged: bool, dtype: CudaDType) -> Result<&'static str> {
        let p = if paged { "paged_" } else { "" };
        super::kernel_for(&format!("attn_decode_{p}{{s}}_d{d}_r{}", self.rows), dtype)
    }
}

/// The merge kernel's entry point for head dim `d` in storage `dtype`.
pub fn merge_kernel(d: usize, dtype: CudaDType) -> Result<&'static str> {
    super::kernel_for(&format!("attn_decode_merge_{{s}}_d{d}"), dtype)
}

fn i32_arg(what: &str, x: usize) -> Result<Arg> {
    i32::try_from(x)
        .map(Arg::I32)
        .map_err(|_| Error::invalid("attention_decode", format!("{what} {x} exceeds i32")))
}

/// Queues decode attention; returns the kernels that ran (`partial+merge`).
pub fn attention_decode(
    cx: &Cx<'_>,
    p: &AttentionDecodeParams,
    ins: &[&CudaStorage],
    metas: &[TensorMeta],
    outs: &[CudaStorage],
) -> Result<String> {
    let s = p.shape(metas)?;
    let paged = p.block_size.is_some();
    let ring = cx.be.opts.decode_ring.unwrap_or_default();
    let rows = DecodePlan::rows_for(&s);
    let smem = ring.smem_bytes(s.d, rows, paged);
    let plan = DecodePlan::new(
        &s,
        cx.sms() as usize,
        DecodePlan::blocks_per_sm(rows, smem),
        cx.be.opts.decode_chunks,
        ring.keys_per_tile(s.d, rows),
    );
    let partial = plan.kernel(s.d, paged, cx.dtype())?;
    let merge = merge_kernel(s.d, cx.dtype())?;
    let q = cx.half(ins[0], metas[0].numel())?;
    let k = cx.half(ins[1], metas[1].numel())?;
    let v = cx.half(ins[2], metas[2].numel())?;
    let lens = ins[3].ptr();
    let table = if paged { ins[4].ptr() } else { 0 };
    let rows_total = s.b * s.hq * s.nq;
    // One chunk: the partial kernel writes o and lse itself and there is no merge.
    let direct = plan.chunks == 1;
    let (part_o, part_lse) = if direct {
        (None, None)
    } else {
        (
            Some(cx.scratch(rows_total * plan.chunks * s.d * 4)?),
            Some(cx.scratch(rows_total * plan.chunks * 4)?),
        )
    };
    let ptr = |b: &Option<crate::backend::cuda::memory::DevBuf>| b.as_ref().map_or(0, |b| b.ptr());
    tracing::debug!(
        "attention_decode: {partial} rows {} x {} groups, {} chunks of {} keys",
        plan.rows,
        plan.row_groups,
        plan.chunks,
        plan.chunk_len
    );
    let grid = (
        plan.chunks as u32,
        (s.hkv * plan.row_groups) as u32,
        s.b as u32,
    );
    let threads = 32 * tandem_gpu_kernels::DECODE_WARPS;
    let scale_log2 = p.scale_for(s.d) * std::f32::consts::LOG2_E;
    let (o_out, lse_out) = if direct {
        (outs[0].ptr(), outs[1].ptr())
    } else {
        (0, 0)
    };
    cx.k(
        partial,
        Dims {
            grid,
            block: (threads, 1, 1),
            smem: smem as u32,
        },
        &[
            Arg::Ptr(q.ptr),
            Arg::Ptr(k.ptr),
            Arg::Ptr(v.ptr),
            Arg::Ptr(lens),
            Arg::Ptr(table),
            Arg::Ptr(ptr(&part_o)),
            Arg::Ptr(ptr(&part_lse)),
            Arg::Ptr(o_out),
            Arg::Ptr(lse_out),
            i32_arg("query heads", s.hq)?,
            i32_arg("kv heads", s.hkv)?,
            i32_arg("new tokens", s.nq)?,
            i32_arg("cache capacity", s.capacity)?,
            Arg::I32(s.block.trailing_zeros() as i32),
            i32_arg("block-table width", s.max_blocks)?,
            i32_arg("cache blocks", s.num_blocks.unwrap_or(0))?,
            i32_arg("chunk length", plan.chunk_len)?,
            Arg::F32(scale_log2),
        ],
    )?;
    if direct {
        return Ok(partial.to_string());
    }
    cx.k(
        merge,
        Dims::linear(rows_total as u32, tandem_gpu_kernels::DECODE_MERGE_THREADS),
        &[
            Arg::Ptr(ptr(&part_o)),
            Arg::Ptr(ptr(&part_lse)),
            Arg::Ptr(outs[0].ptr()),
            Arg::Ptr(outs[1].ptr()),
            i32_arg("chunks", plan.chunks)?,
        ],
    )?;
    Ok(format!("{partial}+{merge}"))
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
    fn the_split_fits_the_group_and_fills_the_device() {
        let ring = tandem_gpu_kernels::DecodeRing::default();
        let plan = |s: &DecodeShape, paged: bool, chunks: Option<usize>| {
            let rows = DecodePlan::rows_for(s);
            let per_sm = DecodePlan::blocks_per_sm(rows, ring.smem_bytes(s.d, rows, paged));
            DecodePlan::new(s, 132, per_sm, chunks, ring.keys_per_tile(s.d, rows))
        };
        // the default ring: one block a SM contiguous, two paged; the old 64 KB ring, three
        assert_eq!(
            DecodePlan::blocks_per_sm(4, ring.smem_bytes(128, 4, false)),
            1
        );
        assert_eq!(
            DecodePlan::blocks_per_sm(4, ring.smem_bytes(128, 4, true)),
            2
        );
        assert_eq!(DecodePlan::blocks_per_sm(4, 64 * 1024), 3);
        assert_eq!(DecodePlan::blocks_per_sm(8, 64 * 1024), 2);
        // the target shape: 4 rows per kv head, 512 blocks fill the device unsplit
        let target = shape(64, 32, 8, 1, 128, 8192);
        for paged in [false, true] {
            let p = plan(&target, paged, None);
            assert_eq!((p.rows, p.row_groups, p.chunks), (4, 1, 1), "{p:?}");
            assert!(p.chunk_len >= 8192);
        }
        // one long sequence: split into one wave of blocks (8 kv heads x 16 chunks)
        let p = plan(&shape(1, 32, 8, 1, 128, 65536), false, None);
        assert_eq!((p.chunks, p.chunk_len), (16, 4096), "{p:?}");
        assert!(8 * p.chunks <= 132);
        assert!(p.chunks * p.chunk_len >= 65536 && (p.chunks - 1) * p.chunk_len < 65536);
        // paged, two blocks a SM: 8 sequences of 8 kv heads, 4 chunks (256 of 264 blocks)
        let p = plan(&shape(8, 32, 8, 1, 128, 16384), true, None);
        assert_eq!(p.chunks, 4, "{p:?}");
        // MQA with 16 new tokens: 512 rows in groups of 8, a cache too short to split
        let p = plan(&shape(1, 32, 1, 16, 64, 100), false, None);
        assert_eq!((p.rows, p.row_groups, p.chunks), (8, 64, 1));
        // MHA, one token, d 256 (a heavy build): one row per block, chunks of at least
        // MIN_CHUNK keys
        let p = plan(&shape(2, 4, 4, 1, 256, 5000), false, None);
        assert_eq!(p.rows, 1);
        assert!(p.chunk_len >= MIN_CHUNK && p.chunks * p.chunk_len >= 5000);
        assert_eq!(p.chunks, 5000usize.div_ceil(MIN_CHUNK));
        // heavy builds split as before: Nq 4 (8 rows) into 5 chunks, d 256 B16 into 32
        let p = plan(&shape(64, 32, 8, 4, 128, 8192), false, None);
        assert_eq!((p.rows, p.row_groups, p.chunks), (8, 2, 5), "{p:?}");
        let p = plan(&shape(16, 16, 2, 1, 256, 8192), false, None);
        assert_eq!((p.rows, p.chunks), (8, 32), "{p:?}");
        // a forced count is kept where the cache has the keys, clamped where it has not
        let f = plan(&target, false, Some(16));
        assert_eq!((f.chunks, f.chunk_len), (16, 512));
        let f = plan(&shape(64, 32, 8, 1, 128, 300), false, Some(100));
        assert_eq!(f.chunks, 300usize.div_ceil(MIN_FORCED_CHUNK));
        assert!(f.chunks * f.chunk_len >= 300);
        for dt in CudaDType::ALL {
            for d in [64, 128, 256] {
                for paged in [false, true] {
                    assert!(p.kernel(d, paged, dt).is_ok());
                }
                assert!(merge_kernel(d, dt).is_ok());
            }
        }
    }
}
