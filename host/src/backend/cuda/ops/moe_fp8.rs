//! The MoE experts in FP8 on Hopper ([`crate::options::CudaOptions::moe_fp8`]): the wgmma
//! path of [`super::moe`] on e4m3 operands.
//!
//! - The expert weights are quantized once per weight storage, on the device, to e4m3 rows
//!   with one f32 scale per row (an output channel: `gate_up` has `E * 2F` rows of `H`, `down`
//!   `E * H` rows of `F`), and kept beside the storage ([`CudaStorage`]'s derived forms) for
//!   as long as it lives: 1 byte + 4/K bytes per weight on top of the 16-bit copy.
//! - Each call quantizes the permuted activations per row (`moe_quant_e4m3_{s}` gathering x
//!   through the permutation), runs `moe_ws_swiglu_e4m3_{s}` (f32 accumulation, both scales
//!   applied in the epilogue, SwiGLU, h stored in the storage precision), quantizes h per row,
//!   runs `moe_ws_down_e4m3_{s}` into one row per slot and combines as the 16-bit path (the
//!   `moe_ws_s4_*` builds, 128-row tiles with a 4-stage ring, where the device's shared
//!   memory allows).
//!
//! Every quantization is `scale = amax / 448`, `q = e4m3_rn_satfinite(v * (448 / amax))` with
//! correctly rounded f32 division and product, so a host model reproduces every byte
//! (`tests/tests/cuda_moe_experts.rs` checks the op against one, and against the f64
//! reference of the unquantized op within [`crate::backend::Numerics::Fp8`]'s bound).

use std::sync::Arc;

use tandem_gpu_kernels::{MOE_QUANT_THREADS, MOE_WS_BLOCK_N};

use super::moe::{
    WsGemm, combine_kernel, combine_slots, precision, slot_rows, tile_map, ws_block, ws_gemm,
    ws_kernels,
};
use super::{Arg, Cx, Dims};
use crate::backend::cuda::CudaStorage;
use crate::backend::cuda::error::DrvResultExt;
use crate::backend::cuda::memory::pool::DevBuf;
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::moe::ExpertsShape;

/// A matrix quantized to e4m3 by rows: `rows x cols` bytes and one f32 scale a row.
#[derive(Debug)]
pub struct E4m3Rows {
    q: DevBuf,
    scale: DevBuf,
}

/// The e4m3 rows kept beside a weight storage, with their charge to the device's memory
/// accounts (none where the backend belongs to no registry); both go with the storage.
#[derive(Debug)]
pub struct Kept {
    rows: Arc<E4m3Rows>,
    _charge: Option<crate::memory::Charge>,
}

/// The experts op's input `gate_up` ([E, 2F, H]), kept in e4m3 beside its storage.
const GATE_UP: usize = 5;
/// The experts op's input `down` ([E, H, F]), kept in e4m3 beside its storage.
const DOWN: usize = 6;

/// The weights kept in e4m3 beside their storage, as `(input, rows, cols)` with one scale a
/// row (an output channel): `gate_up` as `E * 2F` rows of `H`, `down` as `E * H` rows of `F`.
fn kept_weights(s: &ExpertsShape) -> [(usize, usize, usize); 2] {
    [(GATE_UP, s.e * 2 * s.f, s.h), (DOWN, s.e * s.h, s.f)]
}

/// Bytes of the e4m3 rows kept beside a `rows x cols` weight, what the device's memory
/// accounts are charged for them: a byte a weight and a 4-byte f32 scale a row.
pub fn kept_bytes(rows: usize, cols: usize) -> u64 {
    let (rows, cols) = (rows as u64, cols as u64);
    rows.saturating_mul(cols)
        .saturating_add(rows.saturating_mul(4))
}

/// Bytes the FP8 experts keep beside input `input` of an experts op of shape `s` (run on
/// this path) for as long as that input's storage lives: [`kept_bytes`] of `gate_up` or
/// `down`; 0 for the other inputs, and where no token is routed (`T = 0`: nothing is
/// quantized then).
pub fn kept_beside(s: &ExpertsShape, input: usize) -> u64 {
    if s.t == 0 {
        return 0;
    }
    kept_weights(s)
        .into_iter()
        .find(|&(i, ..)| i == input)
        .map_or(0, |(_, rows, cols)| kept_bytes(rows, cols))
}

/// The quantization kernel for data stored as `phys`.
fn quant_kernel(phys: DType) -> &'static str {
    match phys {
        DType::F16 => "moe_quant_e4m3_f16",
        _ => "moe_quant_e4m3_bf16",
    }
}

/// How `moe_quant_e4m3_{s}` picks its source rows.
#[derive(Clone, Copy)]
enum Rows<'a> {
    /// Row r from row r.
    All,
    /// Row r from x's row `sorted[r] / k` for a real slot, else zeros (the permuted x).
    Gather(&'a CudaStorage, usize, usize),
    /// Row r from row r for a real slot, else zeros (h: its padding rows are never written).
    Slots(&'a CudaStorage, usize),
}

/// Queues the quantization of `rows x cols` of `src` (stored as `phys`) into new buffers.
fn quantize(
    cx: &Cx<'_>,
    src: u64,
    phys: DType,
    rows: usize,
    cols: usize,
    how: Rows<'_>,
) -> Result<E4m3Rows> {
    let out = E4m3Rows {
        q: cx.scratch(rows * cols)?,
        scale: cx.scratch(rows * 4)?,
    };
    if rows == 0 {
        return Ok(out);
    }
    let (sorted, k, sentinel, gather) = match how {
        Rows::All => (0, 1, 0, 0),
        Rows::Gather(s, k, slots) => (s.ptr(), k, slots, 1),
        Rows::Slots(s, slots) => (s.ptr(), 1, slots, 0),
    };
    cx.k(
        quant_kernel(phys),
        Dims::linear(rows as u32, MOE_QUANT_THREADS),
        &[
            Arg::Ptr(src),
            Arg::Ptr(sorted),
            Arg::Ptr(out.q.ptr()),
            Arg::Ptr(out.scale.ptr()),
            Arg::I32(rows as i32),
            Arg::I32(cols as i32),
            Arg::I32(k as i32),
            Arg::I32(sentinel as i32),
            Arg::I32(gather),
        ],
    )?;
    Ok(out)
}

/// The e4m3 rows of weight storage `w` (`rows x cols`), quantized at first use and kept
/// beside it, charged to the device's memory accounts (`rows x cols` bytes and a 4-byte scale a
/// row; a device at its `--memory-limit` evicts replicas for them, or fails with
/// [`crate::error::Error::OutOfMemory`]). Under graph capture nothing runs and the blocks
/// allocated belong to the graph, so a first use there is quantized into the graph (each replay
/// quantizes again) and not kept; a block's automatic capture comes at its second call, after
/// an eager one kept the weights.
fn weights(
    cx: &Cx<'_>,
    w: &CudaStorage,
    phys: DType,
    rows: usize,
    cols: usize,
) -> Result<Arc<E4m3Rows>> {
    let mut slot = w.e4m3.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(k) = slot.as_ref() {
        return Ok(k.rows.clone());
    }
    // SAFETY: the compute stream is live for the backend's lifetime.
    let status = unsafe { cudarc::driver::result::stream::is_capturing(cx.stream()) }
        .ctx(&cx.be.dev.label, "cuStreamIsCapturing")?;
    let keep = status == cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let charge = match cx.be.accounts.get() {
        Some(acc) if keep => Some(acc.charge_derived(
            cx.be.info.id,
            cx.be.info.memory_bytes,
            kept_bytes(rows, cols),
            "the e4m3 copy of an expert weight (FP8 experts)",
        )?),
        _ => None,
    };
    let src = cx.cast(w, rows * cols, phys)?;
    let q = Arc::new(quantize(cx, src.ptr, phys, rows, cols, Rows::All)?);
    if keep {
        *slot = Some(Kept {
            rows: q.clone(),
            _charge: charge,
        });
    }
    Ok(q)
}

/// The FP8 experts op (see the module doc); the kernels it queued, `+`-joined.
pub fn experts(
    cx: &Cx<'_>,
    s: &ExpertsShape,
    ins: &[&CudaStorage],
    outs: &[CudaStorage],
) -> Result<String> {
    let (t, h, k, f) = (s.t, s.h, s.k, s.f);
    let phys = outs[0].phys;
    let block = ws_block(s, cx.be.dev.max_smem_optin, true);
    let (up, down_k) = ws_kernels(block, precision(phys)?, true)?;
    let quant = quant_kernel(phys);
    let combine = combine_kernel(phys);
    let names = format!("moe_tile_map+{quant}+memset_d8+{up}+{quant}+{down_k}+{combine}");
    if t == 0 {
        return Ok(names);
    }
    let [(up_in, up_rows, up_cols), (down_in, down_rows, down_cols)] = kept_weights(s);
    let wq_up = weights(cx, ins[up_in], phys, up_rows, up_cols)?;
    let wq_down = weights(cx, ins[down_in], phys, down_rows, down_cols)?;
    let x = cx.cast(ins[0], t * h, phys)?;
    let w = cx.f32(ins[2], t * k)?;
    let (sorted, offsets) = (ins[3], ins[4]);
    let map = tile_map(cx, s, offsets, block.block_m())?;
    let slots = t * k;
    let xq = quantize(cx, x.ptr, phys, s.p, h, Rows::Gather(sorted, k, slots))?;
    let hbuf = cx.alloc(s.p * f, phys)?;
    let rows = slot_rows(cx, s, phys)?;
    ws_gemm(
        cx,
        s,
        &map,
        sorted,
        &WsGemm {
            name: up,
            block,
            n_tile: MOE_WS_BLOCK_N,
            a: xq.q.ptr(),
            w: wq_up.q.ptr(),
            elem: DType::I8,
            k_len: h,
            w_rows: 2 * f,
            out: hbuf.ptr(),
            n: f,
            scales: Some((xq.scale.ptr(), wq_up.scale.ptr())),
        },
    )?;
    let hq = quantize(cx, hbuf.ptr(), phys, s.p, f, Rows::Slots(sorted, slots))?;
    ws_gemm(
        cx,
        s,
        &map,
        sorted,
        &WsGemm {
            name: down_k,
            block,
            n_tile: 2 * MOE_WS_BLOCK_N,
            a: hq.q.ptr(),
            w: wq_down.q.ptr(),
            elem: DType::I8,
            k_len: f,
            w_rows: h,
            out: rows.ptr(),
            n: h,
            scales: Some((hq.scale.ptr(), wq_down.scale.ptr())),
        },
    )?;
    combine_slots(cx, s, combine, rows.ptr(), w.ptr, outs[0].ptr())?;
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(t: usize, h: usize, e: usize, f: usize) -> ExpertsShape {
        ExpertsShape {
            t,
            h,
            e,
            k: 2,
            f,
            p: t * 2 + e * 128,
        }
    }

    #[test]
    fn kept_bytes_are_a_byte_a_weight_and_a_scale_a_row() {
        // E = 8, F = 64, H = 32: gate_up [8, 128, 32] is 1024 rows of 32, down [8, 32, 64]
        // 256 rows of 64.
        let s = shape(16, 32, 8, 64);
        assert_eq!(kept_bytes(1024, 32), 1024 * 32 + 1024 * 4);
        assert_eq!(kept_beside(&s, GATE_UP), 32_768 + 4_096);
        assert_eq!(kept_beside(&s, DOWN), 16_384 + 1_024);
        // The other inputs (x, routing) keep nothing.
        for i in 0..5 {
            assert_eq!(kept_beside(&s, i), 0, "input {i}");
        }
        assert_eq!(kept_beside(&s, 7), 0);
        // No token routed: nothing is quantized, nothing kept.
        assert_eq!(kept_beside(&shape(0, 32, 8, 64), GATE_UP), 0);
        assert_eq!(kept_beside(&shape(0, 32, 8, 64), DOWN), 0);
    }

    /// The experts op's input metas for T tokens, top-2 of E experts, hidden H, ffn F.
    fn metas(t: usize, h: usize, e: usize, f: usize) -> Vec<crate::tensor::TensorMeta> {
        use crate::tensor::TensorMeta;
        vec![
            TensorMeta::new([t, h], DType::F32),
            TensorMeta::new([t, 2], DType::I32),
            TensorMeta::new([t, 2], DType::F32),
            TensorMeta::new([t * 2 + e * 128], DType::I32),
            TensorMeta::new([e + 1], DType::I32),
            TensorMeta::new([e, 2 * f, h], DType::F32),
            TensorMeta::new([e, h, f], DType::F32),
        ]
    }

    #[test]
    fn the_device_reports_the_kept_bytes_where_the_fp8_path_runs() {
        use crate::ops::{MoeExpertsParams, Op};
        use crate::options::CudaOptions;
        use crate::options::cuda::MoeExpertsPath;
        let op = Op::MoeExperts(MoeExpertsParams {});
        let fp8 = CudaOptions {
            moe_fp8: true,
            ..CudaOptions::default()
        };
        let m = metas(16, 32, 8, 64);
        let kept = |o: &CudaOptions, arch: u32, m: &[crate::tensor::TensorMeta]| -> Vec<u64> {
            (0..7)
                .map(|i| super::super::derived_bytes(arch, o, &op, m, i))
                .collect()
        };
        // sm_90 with FP8 experts: gate_up's and down's e4m3 rows and scales, nothing else.
        assert_eq!(kept(&fp8, 90, &m), [0, 0, 0, 0, 0, 36_864, 17_408]);
        // FP8 not asked for, another arch, another path forced, rows not of 16 bytes, no
        // token: the experts run in the storage precision and nothing is kept.
        assert_eq!(kept(&CudaOptions::default(), 90, &m), [0; 7]);
        assert_eq!(kept(&fp8, 80, &m), [0; 7]);
        assert_eq!(kept(&fp8, 89, &m), [0; 7]);
        let forced = CudaOptions {
            moe_experts: Some(MoeExpertsPath::Grouped),
            ..fp8.clone()
        };
        assert_eq!(kept(&forced, 90, &m), [0; 7]);
        assert_eq!(kept(&fp8, 90, &metas(16, 40, 8, 64)), [0; 7]);
        assert_eq!(kept(&fp8, 90, &metas(0, 32, 8, 64)), [0; 7]);
        // Other ops keep nothing.
        let norm = Op::RmsNorm(crate::ops::RmsNormParams::default());
        let x = [crate::tensor::TensorMeta::new([16, 32], DType::F32)];
        assert_eq!(super::super::derived_bytes(90, &fp8, &norm, &x, 0), 0);
    }
}
