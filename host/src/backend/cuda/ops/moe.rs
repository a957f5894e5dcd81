//! MoE routing (three fused kernels) and experts, three ways:
//! - `grouped` (default up to 32 rows per expert off Hopper): sm80/moe_experts.cu's grouped GEMMs over the routing's padded
//!   permutation (tile map, gate/up GEMM with the SwiGLU in its epilogue and the token gather in
//!   its operand load, down GEMM writing one row per slot, weighted combine). Nothing waits for
//!   the host: each block reads its expert and rows from device memory.
//! - `wgmma` (default on sm_90): sm90a/moe_experts_ws.cu's persistent grouped GEMMs on
//!   wgmma fed by the TMA (tile map, token gather, gate/up GEMM with the SwiGLU in its
//!   epilogue, down GEMM writing one row per slot, the same combine). No host synchronisation
//!   either: every block finds its tiles from the device-side offsets.
//! - `blaslt` (default above 32 rows per expert off Hopper): gather, one cuBLASLt GEMM per expert (twice), SwiGLU,
//!   combine; reads the expert offsets on the host first (a stream synchronisation).
//!
//! - `wgmma-fp8` (with [`CudaOptions::moe_fp8`] on sm_90): the wgmma kernels on e4m3 operands
//!   ([`super::moe_fp8`]).
//!
//! [`CudaOptions::moe_experts`] (`TANDEM_MOE_EXPERTS=blaslt|grouped|wgmma`) forces one,
//! [`CudaOptions::moe_tile`] (`TANDEM_MOE_TILE=l|m|s`) the grouped GEMMs' tile (default by the
//! mean rows per expert, T*k/E); see [`ExpertsPath::select`].
//!
//! [`CudaOptions::moe_experts`]: crate::options::CudaOptions::moe_experts
//! [`CudaOptions::moe_tile`]: crate::options::CudaOptions::moe_tile
//! [`CudaOptions::moe_fp8`]: crate::options::CudaOptions::moe_fp8

use cudarc::driver::result as drv;
use tandem_gpu_kernels::{MOE_TILE_MAP_THREADS, MOE_TILES, MoeTile};

use crate::options::cuda::{MoeExpertsPath, MoeTileSize, RouteKernel};
use tandem_gpu_kernels::MoeWsBlock;

use super::{Arg, Cx, Dims};
use crate::backend::cuda::CudaStorage;
use crate::backend::cuda::blaslt::Epilogue;
use crate::backend::cuda::error::DrvResultExt;
use crate::backend::cuda::tma;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::moe::ExpertsShape;
use crate::ops::{MoeExpertsParams, MoeRouteParams};
use crate::tensor::TensorMeta;

/// The three-launch path's top-k kernel for logits stored as `phys` (f32 math either way).
pub fn topk_kernel(phys: DType) -> &'static str {
    match phys {
        DType::F32 => "moe_topk_softmax_f32_f32",
        DType::F16 => "moe_topk_softmax_f32_f16",
        _ => "moe_topk_softmax_f32",
    }
}

/// The fused routing kernel for `e` experts (at most [`tandem_gpu_kernels::ROUTE_MAX_EXPERTS`])
/// whose logits are stored as `phys`: the build with the fewest logits per lane that holds
/// a row; `self_reset`: the build on the self-resetting barrier (`_g`, no memset before it).
pub fn fused_kernel(phys: DType, e: usize, self_reset: bool) -> Result<&'static str> {
    let v = FUSED_VPL.into_iter().find(|v| e <= 32 * v).ok_or_else(|| {
        Error::Internal(format!(
            "moe_route: {e} experts (the fused kernels take up to {})",
            tandem_gpu_kernels::ROUTE_MAX_EXPERTS
        ))
    })?;
    let input = match phys {
        DType::F32 => "f32",
        DType::F16 => "f16",
        _ => "bf16",
    };
    let name = format!(
        "moe_route_fused_{input}_v{v}{}",
        if self_reset { "_g" } else { "" }
    );
    tandem_gpu_kernels::Module::MoeRoute
        .entry_points()
        .iter()
        .find(|k| **k == name)
        .copied()
        .ok_or_else(|| Error::Internal(format!("no kernel {name}")))
}

/// Threads per block of the fused routing kernels `moe_route_fused_*` (FR_THREADS in
/// common/moe_route.cu).
const FUSED_THREADS: u32 = 512;
/// Logits per lane the fused routing kernels come in (`_v1` .. `_v8`): the build for E
/// experts is the smallest v with E <= 32 * v.
const FUSED_VPL: [usize; 4] = [1, 2, 4, 8];

/// Most blocks per multiprocessor the fused routing grid takes by default: 32 warps, and no
/// more blocks than that (more blocks make the barriers and the per-block column scan
/// longer); [`RouteKernel::Fused1`] takes 1.
const FUSED_MAX_BLOCKS_PER_SM: u32 = 2;
/// The same for the widest build (`_v8`, E > 128), whose phase 1 is issue-bound: 16 warps a
/// multiprocessor in one block (T8192 E256 k8 on an H200, 2026-11-28, probe: 24.7 us at one
/// 512-thread block a multiprocessor, 24.8-25.0 at two 256-thread blocks, 26.1 at three).
const FUSED_MAX_BLOCKS_PER_SM_WIDE: u32 = 1;
/// Fewest tokens per block of the fused grid (2 per warp): small batches take fewer blocks.
const FUSED_MIN_TOKENS_PER_BLOCK: usize = 32;

/// Blocks of the fused routing grid for `t` tokens on `sms` multiprocessors that each hold
/// `per_sm` blocks of it at once, at most `cap` a multiprocessor; `None` when it cannot be
/// co-resident at all (then the three-launch path runs).
pub fn fused_grid(t: usize, sms: u32, per_sm: u32, cap: u32) -> Option<u32> {
    let per_sm = per_sm.min(cap);
    if per_sm == 0 || sms == 0 {
        return None;
    }
    let want = t.div_ceil(FUSED_MIN_TOKENS_PER_BLOCK).max(1);
    Some(want.min((sms * per_sm) as usize) as u32)
}

/// Routing: the fused cooperative kernel where the device can run its grid co-resident,
/// else three launches ([`CudaOptions::route_kernel`] forces one, for comparisons). Logits
/// are read in the precision they are stored in (f32 when uploaded for this op:
/// [`crate::backend::CudaDType::input_precision`]); the math is f32. Returns the kernels that
/// ran, with the fused grid's size and blocks per multiprocessor.
///
/// [`CudaOptions::route_kernel`]: crate::options::CudaOptions::route_kernel
pub fn route(
    cx: &Cx<'_>,
    p: &MoeRouteParams,
    ins: &[&CudaStorage],
    metas: &[TensorMeta],
    outs: &[CudaStorage],
) -> Result<String> {
    let (t, e) = (metas[0].shape[0], metas[0].shape[1]);
    let phys = match ins[0].phys {
        x @ (DType::F32 | DType::BF16 | DType::F16) => x,
        other => {
            return Err(Error::Internal(format!(
                "moe_route: logits stored as {other} on the device"
            )));
        }
    };
    let choice = cx.be.opts.route_kernel.unwrap_or(RouteKernel::Fused);
    if choice == RouteKernel::Three && p.top_k <= 32 {
        return route_three(cx, p, ins[0], t, e, outs);
    }
    let self_reset = choice != RouteKernel::FusedMemset;
    let cap = match choice {
        RouteKernel::Fused2 => 2,
        RouteKernel::Fused1 => 1,
        _ if e > 32 * FUSED_VPL[2] => FUSED_MAX_BLOCKS_PER_SM_WIDE,
        _ => FUSED_MAX_BLOCKS_PER_SM,
    };
    let fused = fused_kernel(phys, e, self_reset)?;
    let per_sm = cx.be.kernels.blocks_per_sm(fused, FUSED_THREADS, 0)?;
    match fused_grid(t, cx.sms(), per_sm, cap) {
        Some(g) => route_fused(cx, p, fused, self_reset, g, ins[0], t, e, outs),
        None if p.top_k <= 32 => route_three(cx, p, ins[0], t, e, outs),
        None => Err(Error::Unsupported {
            op: "moe_route".into(),
            device: cx.be.dev.label.clone(),
            why: format!(
                "top_k {} > 32 needs the fused routing kernel, whose grid does not fit this \
                 device co-resident",
                p.top_k
            ),
        }),
    }
}

/// The fused path: one cooperative launch of `g` blocks; `self_reset` false: after zeroing its
/// barrier counter (a 4-byte memset), true: on the kernel's self-resetting barrier.
#[allow(clippy::too_many_arguments)]
fn route_fused(
    cx: &Cx<'_>,
    p: &MoeRouteParams,
    kernel: &'static str,
    self_reset: bool,
    g: u32,
    logits: &CudaStorage,
    t: usize,
    e: usize,
    outs: &[CudaStorage],
) -> Result<String> {
    let (k, bs) = (p.top_k, p.block_size);
    let plen = p.padded_len(t, e);
    let gs = g as usize;
    // bar (256 bytes, aligned), cnt [E][G], ps [E][G], zs [G], tot_cnt [E], tot_p [E], tot_z
    let cells = e * gs * 4;
    let (o_cnt, o_ps) = (256, 256 + cells);
    let o_zs = o_ps + cells;
    let o_tc = o_zs + gs * 4;
    let o_tp = o_tc + e * 4;
    let o_tz = o_tp + e * 4;
    let ws = cx.scratch(o_tz + 4)?;
    let base = ws.ptr();
    let label = &cx.be.dev.label;
    if !self_reset {
        // SAFETY: ws holds at least 4 bytes at base; ordered on the compute stream before the
        // kernel that counts on it.
        unsafe { drv::memset_d8_async(base, 0, 4, cx.work_stream()?) }
            .ctx(label, "cuMemsetD8Async(moe_route barrier)")?;
    }
    let o: Vec<u64> = outs.iter().map(|s| s.ptr()).collect();
    let at = |off: usize| base + off as u64;
    cx.be.kernels.launch_cooperative(
        kernel,
        Dims::linear(g, FUSED_THREADS),
        cx.work_stream()?,
        &[
            Arg::Ptr(logits.ptr()),
            Arg::I32(t as i32),
            Arg::I32(e as i32),
            Arg::I32(k as i32),
            Arg::I32(p.renormalize as i32),
            Arg::I32(bs as i32),
            Arg::I32(plen as i32),
            Arg::Ptr(o[0]),
            Arg::Ptr(o[1]),
            Arg::Ptr(o[2]),
            Arg::Ptr(o[3]),
            Arg::Ptr(o[4]),
            Arg::Ptr(o[5]),
            Arg::Ptr(o[6]),
            Arg::Ptr(at(o_cnt)),
            Arg::Ptr(at(o_ps)),
            Arg::Ptr(at(o_zs)),
            Arg::Ptr(at(o_tc)),
            Arg::Ptr(at(o_tp)),
            Arg::Ptr(at(o_tz)),
            Arg::Ptr(base),
        ],
    )?;
    let per_sm = g.div_ceil(cx.sms().max(1));
    let memset = if self_reset { "" } else { "memset_d8+" };
    Ok(format!("{memset}{kernel}(cooperative x{g}, {per_sm}/SM)"))
}

/// The three-launch path: top-k + per-block histograms, one-block scan, scatter.
fn route_three(
    cx: &Cx<'_>,
    p: &MoeRouteParams,
    logits: &CudaStorage,
    t: usize,
    e: usize,
    outs: &[CudaStorage],
) -> Result<String> {
    let (k, bs) = (p.top_k, p.block_size);
    let plen = p.padded_len(t, e);
    let tpb = tandem_gpu_kernels::ROUTE_TOKENS_PER_BLOCK;
    let nb = t.div_ceil(tpb);
    let cells = (nb * e).max(1);
    let counts = cx.scratch(cells * 4)?;
    let psum = cx.scratch(cells * 4)?;
    let zs = cx.scratch(nb.max(1) * 4)?;
    let base = cx.scratch(cells * 4)?;
    let o: Vec<u64> = outs.iter().map(|s| s.ptr()).collect();
    let topk = topk_kernel(logits.phys);
    if nb > 0 {
        cx.k(
            topk,
            Dims::linear(nb as u32, tandem_gpu_kernels::ROUTE_THREADS).smem(8 * e),
            &[
                Arg::Ptr(logits.ptr()),
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

/// How the experts op runs on a CUDA device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertsPath {
    /// Grouped GEMMs over the padded permutation with this tile (no host synchronisation).
    Grouped(MoeTile),
    /// Gather + cuBLASLt per expert + SwiGLU + combine (reads the offsets on the host).
    Blaslt,
    /// Hopper persistent grouped GEMMs on wgmma (no host synchronisation).
    Wgmma,
    /// The same on e4m3 weights and activations with f32 scales
    /// ([`crate::options::CudaOptions::moe_fp8`]; [`super::moe_fp8`]).
    WgmmaFp8,
}

/// Mean rows per expert up to which the `s` tile is picked (decode-sized batches).
const SMALL_TILE_MAX_ROWS: usize = 32;
/// Mean rows per expert up to which the `m` tile is picked; above it, `l`.
const MEDIUM_TILE_MAX_ROWS: usize = 96;

impl ExpertsPath {
    /// [`ExpertsPath::select`] on `cx`'s device with its options.
    pub fn on_device(cx: &Cx<'_>, s: &ExpertsShape) -> (Self, Option<String>) {
        Self::on_arch(cx.be.dev.arch, &cx.be.opts, s)
    }

    /// [`ExpertsPath::select`] then [`ExpertsPath::fp8`] on a device of compute capability
    /// `arch` with options `o` (what [`ExpertsPath::on_device`] runs; the planner's question
    /// about the FP8 weights kept beside the experts' weights asks it too).
    pub fn on_arch(
        arch: u32,
        o: &crate::options::CudaOptions,
        s: &ExpertsShape,
    ) -> (Self, Option<String>) {
        let hopper = tandem_gpu_kernels::Module::MoeExpertsSm90a.runs_on(arch);
        let (path, why) = Self::select(s, hopper, o.moe_experts, o.moe_tile);
        let (path, not_fp8) = path.fp8(s, o.moe_fp8);
        (path, not_fp8.or(why))
    }

    /// The FP8 build of this path where it is asked for (`fp8`) and runs: the wgmma path with
    /// H and F multiples of 16 (16-byte e4m3 rows for the TMA); else this path and why not.
    pub fn fp8(self, s: &ExpertsShape, fp8: bool) -> (Self, Option<String>) {
        if !fp8 {
            return (self, None);
        }
        match self {
            ExpertsPath::Wgmma if s.h % 16 == 0 && s.f % 16 == 0 => (ExpertsPath::WgmmaFp8, None),
            ExpertsPath::Wgmma => (
                self,
                Some(format!(
                    "hidden {} and ffn {} must be multiples of 16 for the FP8 experts \
                     (16-byte e4m3 rows); they run in the storage precision",
                    s.h, s.f
                )),
            ),
            other => (
                other,
                Some(
                    "the FP8 experts run on the Hopper wgmma path only (sm_90, not another \
                     path forced); they run in the storage precision"
                        .to_string(),
                ),
            ),
        }
    }

    /// The path for this shape on a device where the Hopper kernels run or not (`hopper`:
    /// sm_90): `forced` (blaslt, grouped, wgmma) and the tile `forced_tile` (l, m, s; naming
    /// one asks for the grouped path) where given ([`crate::options::CudaOptions`]'s
    /// `moe_experts` and `moe_tile`); else on Hopper the wgmma kernels (an H100, 2026-11-27:
    /// 1.01 ms at T64 against 1.06 for grouped `s`, 4.80 ms at T4096 against 4.77 for
    /// cuBLASLt, and no host synchronisation), elsewhere grouped with the `s` tile up to 32
    /// rows per expert on average (decode-sized batches: 1.42x PyTorch at T64 on an H200,
    /// docs/gpu-notes.md v9) and cuBLASLt above (its GEMMs beat the mma.sync grouped tiles 2x
    /// at T4096). The grouped and wgmma kernels need H and F to be
    /// multiples of 8 (16-byte rows) and a grid under 2^31 blocks, and wgmma at most
    /// [`tandem_gpu_kernels::MOE_WS_MAX_EXPERTS`] experts; otherwise another path runs and the
    /// second value says why.
    pub fn select(
        s: &ExpertsShape,
        hopper: bool,
        forced: Option<MoeExpertsPath>,
        forced_tile: Option<MoeTileSize>,
    ) -> (Self, Option<String>) {
        if forced == Some(MoeExpertsPath::Blaslt) {
            return (ExpertsPath::Blaslt, None);
        }
        if let Err(why) = grouped_fits(s) {
            return (ExpertsPath::Blaslt, Some(why));
        }
        let rows = (s.t * s.k).div_ceil(s.e.max(1));
        let wgmma = if !hopper {
            Err("the wgmma experts kernels run on sm_90 (Hopper) only".to_string())
        } else if s.e > tandem_gpu_kernels::MOE_WS_MAX_EXPERTS {
            Err(format!(
                "{} experts (the wgmma experts kernels take up to {})",
                s.e,
                tandem_gpu_kernels::MOE_WS_MAX_EXPERTS
            ))
        } else {
            Ok(())
        };
        let mut why = None;
        if forced == Some(MoeExpertsPath::Wgmma) && forced_tile.is_none() {
            match &wgmma {
                Ok(()) => return (ExpertsPath::Wgmma, None),
                Err(w) => why = Some(w.clone()),
            }
        }
        let asked_grouped = forced == Some(MoeExpertsPath::Grouped) || forced_tile.is_some();
        if !asked_grouped && wgmma.is_ok() {
            return (ExpertsPath::Wgmma, why);
        }
        if !asked_grouped && rows > SMALL_TILE_MAX_ROWS {
            return (ExpertsPath::Blaslt, why);
        }
        let default = if rows <= SMALL_TILE_MAX_ROWS {
            MoeTileSize::S
        } else if rows <= MEDIUM_TILE_MAX_ROWS {
            MoeTileSize::M
        } else {
            MoeTileSize::L
        };
        (
            ExpertsPath::Grouped(forced_tile.unwrap_or(default).tile()),
            why,
        )
    }
}

/// Whether the grouped kernels take this shape (every tile), else why not.
fn grouped_fits(s: &ExpertsShape) -> std::result::Result<(), String> {
    if s.h % 8 != 0 || s.f % 8 != 0 {
        return Err(format!(
            "hidden {} and ffn {} must be multiples of 8 for the grouped kernels (16-byte rows)",
            s.h, s.f
        ));
    }
    for t in MOE_TILES {
        let (g1, g2) = grids(s, t);
        if g1.max(g2) > i32::MAX as usize
            || s.t * s.k > i32::MAX as usize
            || s.p > i32::MAX as usize
        {
            return Err(format!(
                "{} tokens x top-{} need more than 2^31 blocks for the grouped kernels",
                s.t, s.k
            ));
        }
    }
    Ok(())
}

/// Blocks of the two grouped GEMMs: the most tiles the segments can need (P/BM + E, one partial
/// tile per expert) times the n-tiles.
fn grids(s: &ExpertsShape, t: MoeTile) -> (usize, usize) {
    let tiles = s.p.div_ceil(t.block_m) + s.e;
    (
        tiles * s.f.div_ceil(t.block_n / 2),
        tiles * s.h.div_ceil(t.block_n),
    )
}

/// The element type of the grouped kernels for an output stored as `phys`.
pub(super) fn precision(phys: DType) -> Result<&'static str> {
    match phys {
        DType::BF16 => Ok("bf16"),
        DType::F16 => Ok("f16"),
        other => Err(Error::Internal(format!(
            "moe_experts: no grouped kernels for {other} storage (bf16 and f16 have them)"
        ))),
    }
}

/// The entry point `name` of `module`.
fn entry_point(module: tandem_gpu_kernels::Module, name: String) -> Result<&'static str> {
    module
        .entry_points()
        .iter()
        .find(|k| **k == name)
        .copied()
        .ok_or_else(|| Error::Internal(format!("no kernel {name}")))
}

/// The entry point `{gemm}_{prec}_{tile}` (`gemm` is moe_gemm_swiglu or moe_gemm_down).
fn gemm_kernel(gemm: &str, prec: &str, tile: &str) -> Result<&'static str> {
    entry_point(
        tandem_gpu_kernels::Module::MoeExpertsSm80,
        format!("{gemm}_{prec}_{tile}"),
    )
}

/// The Hopper gate/up and down entry points of `block` in precision `prec` (bf16 or f16),
/// the e4m3 builds where `fp8`: `{prefix}_swiglu_[e4m3_]{prec}`, `{prefix}_down_[e4m3_]{prec}`.
pub(super) fn ws_kernels(
    block: MoeWsBlock,
    prec: &str,
    fp8: bool,
) -> Result<(&'static str, &'static str)> {
    let elem = if fp8 { "e4m3_" } else { "" };
    let module = tandem_gpu_kernels::Module::MoeExpertsSm90a;
    let prefix = block.prefix();
    Ok((
        entry_point(module, format!("{prefix}_swiglu_{elem}{prec}"))?,
        entry_point(module, format!("{prefix}_down_{elem}{prec}"))?,
    ))
}

/// The experts op (see the module doc for the two paths).
pub fn experts(
    cx: &Cx<'_>,
    p: &MoeExpertsParams,
    ins: &[&CudaStorage],
    metas: &[TensorMeta],
    outs: &[CudaStorage],
) -> Result<String> {
    let s = p.shape(metas)?;
    match ExpertsPath::on_device(cx, &s) {
        (ExpertsPath::Grouped(t), why) => {
            if let Some(why) = why {
                tracing::debug!(%why, "moe_experts: grouped path");
            }
            experts_grouped(cx, &s, t, ins, outs)
        }
        (ExpertsPath::Wgmma, why) => {
            if let Some(why) = why {
                tracing::debug!(%why, "moe_experts: wgmma path");
            }
            experts_wgmma(cx, &s, ins, outs)
        }
        (ExpertsPath::WgmmaFp8, _) => super::moe_fp8::experts(cx, &s, ins, outs),
        (ExpertsPath::Blaslt, why) => {
            if let Some(why) = why {
                tracing::debug!(%why, "moe_experts: cuBLASLt path");
            }
            experts_blaslt(cx, &s, ins, outs)
        }
    }
}

/// The experts op's inputs as the grouped kernels (mma.sync or wgmma) read them: x, gate_up
/// and down in the storage type `phys`, the routing weights in f32.
struct GroupedInputs<'a> {
    x: super::View,
    w: super::View,
    sorted: &'a CudaStorage,
    offsets: &'a CudaStorage,
    gate_up: super::View,
    down: super::View,
}

impl<'a> GroupedInputs<'a> {
    fn of(cx: &Cx<'_>, s: &ExpertsShape, ins: &[&'a CudaStorage], phys: DType) -> Result<Self> {
        let (t, h, e, k, f) = (s.t, s.h, s.e, s.k, s.f);
        Ok(Self {
            x: cx.cast(ins[0], t * h, phys)?,
            w: cx.f32(ins[2], t * k)?,
            sorted: ins[3],
            offsets: ins[4],
            gate_up: cx.cast(ins[5], e * 2 * f * h, phys)?,
            down: cx.cast(ins[6], e * h * f, phys)?,
        })
    }
}

/// The combine kernel for outputs stored as `phys`.
pub(super) fn combine_kernel(phys: DType) -> &'static str {
    match phys {
        DType::F16 => "moe_combine_slots_f16",
        _ => "moe_combine_slots_bf16",
    }
}

/// The down GEMM's output, one zeroed row per slot ([T*k, H] in `phys`): a slot missing from
/// the permutation (dropped by a capacity limit) adds nothing in the combine.
pub(super) fn slot_rows(cx: &Cx<'_>, s: &ExpertsShape, phys: DType) -> Result<CudaStorage> {
    let n = s.t * s.k * s.h;
    let rows = cx.alloc(n, phys)?;
    // SAFETY: rows holds n elements of phys; the memset is ordered on the compute stream after
    // the allocation and before the kernels that use rows.
    unsafe { drv::memset_d8_async(rows.ptr(), 0, n * phys.size(), cx.work_stream()?) }
        .ctx(&cx.be.dev.label, "cuMemsetD8Async(moe rows)")?;
    Ok(rows)
}

/// The tile map's two tables, `soff` and `tstart` ([E+1] i32 each), in one scratch block.
pub(super) struct TileMap(crate::backend::cuda::memory::pool::DevBuf, usize);

impl TileMap {
    /// Device addresses of `soff` and `tstart`.
    pub(super) fn tables(&self) -> (u64, u64) {
        (self.0.ptr(), self.0.ptr() + ((self.1 + 1) * 4) as u64)
    }
}

/// Queues `moe_tile_map`: the routing's offsets made monotone (`soff`) and the prefix count of
/// `block_m`-row tiles per expert segment (`tstart`), both read by the grouped GEMMs on the
/// device.
pub(super) fn tile_map(
    cx: &Cx<'_>,
    s: &ExpertsShape,
    offsets: &CudaStorage,
    block_m: usize,
) -> Result<TileMap> {
    let map = TileMap(cx.scratch(2 * (s.e + 1) * 4)?, s.e);
    let (soff, tstart) = map.tables();
    cx.k(
        "moe_tile_map",
        Dims::linear(1, MOE_TILE_MAP_THREADS),
        &[
            Arg::Ptr(offsets.ptr()),
            Arg::I32(s.e as i32),
            Arg::I32(s.p as i32),
            Arg::I32(block_m as i32),
            Arg::Ptr(soff),
            Arg::Ptr(tstart),
        ],
    )?;
    Ok(map)
}

/// Queues `kernel` (`moe_combine_slots_{prec}`): y[t] = sum_j w[t, j] * rows[t*k + j], j
/// ascending.
pub(super) fn combine_slots(
    cx: &Cx<'_>,
    s: &ExpertsShape,
    kernel: &'static str,
    rows: u64,
    w: u64,
    y: u64,
) -> Result<()> {
    cx.k(
        kernel,
        Dims::stride((s.t * s.h / 8) as u64, 256, cx.sms()),
        &[
            Arg::Ptr(rows),
            Arg::Ptr(w),
            Arg::Ptr(y),
            Arg::I32(s.t as i32),
            Arg::I32(s.h as i32),
            Arg::I32(s.k as i32),
        ],
    )
}

/// Grouped GEMMs: tile map, gate/up + SwiGLU, down (one row per slot), combine.
fn experts_grouped(
    cx: &Cx<'_>,
    s: &ExpertsShape,
    tile: MoeTile,
    ins: &[&CudaStorage],
    outs: &[CudaStorage],
) -> Result<String> {
    let (t, h, e, k, f) = (s.t, s.h, s.e, s.k, s.f);
    let phys = outs[0].phys;
    let prec = precision(phys)?;
    let up = gemm_kernel("moe_gemm_swiglu", prec, tile.name)?;
    let down_k = gemm_kernel("moe_gemm_down", prec, tile.name)?;
    let combine = combine_kernel(phys);
    let names = format!("moe_tile_map+memset_d8+{up}+{down_k}+{combine}");
    if t == 0 {
        return Ok(names);
    }
    let GroupedInputs {
        x,
        w,
        sorted,
        offsets,
        gate_up,
        down,
    } = GroupedInputs::of(cx, s, ins, phys)?;
    let map = tile_map(cx, s, offsets, tile.block_m)?;
    let (soff, tstart) = map.tables();
    let hbuf = cx.alloc(s.p * f, phys)?;
    let rows = slot_rows(cx, s, phys)?;
    let (g1, g2) = grids(s, tile);
    let slots = (t * k) as i32;
    let gemm = |name: &'static str, grid: usize, a: u64, wt: u64, c: u64, n: usize, kd: usize| {
        cx.k(
            name,
            Dims::linear(grid as u32, tile.threads()).smem(tile.shared_bytes()),
            &[
                Arg::Ptr(a),
                Arg::Ptr(wt),
                Arg::Ptr(c),
                Arg::Ptr(sorted.ptr()),
                Arg::Ptr(soff),
                Arg::Ptr(tstart),
                Arg::I32(e as i32),
                Arg::I32(n as i32),
                Arg::I32(kd as i32),
                Arg::I32(k as i32),
                Arg::I32(slots),
            ],
        )
    };
    gemm(up, g1, x.ptr, gate_up.ptr, hbuf.ptr(), f, h)?;
    gemm(down_k, g2, hbuf.ptr(), down.ptr, rows.ptr(), h, f)?;
    combine_slots(cx, s, combine, rows.ptr(), w.ptr, outs[0].ptr())?;
    Ok(names)
}

/// Hopper: tile map, gather, persistent wgmma gate/up + SwiGLU, down (one row per slot),
/// combine; nothing waits for the host.
fn experts_wgmma(
    cx: &Cx<'_>,
    s: &ExpertsShape,
    ins: &[&CudaStorage],
    outs: &[CudaStorage],
) -> Result<String> {
    let (t, h, k, f) = (s.t, s.h, s.k, s.f);
    let phys = outs[0].phys;
    let prec = precision(phys)?;
    let block = match cx.be.opts.moe_ws_tile {
        Some(tile) => tile.block(),
        None => {
            let b = ws_block(s, cx.be.dev.max_smem_optin, false);
            if b.cluster() > 1 && !clusters_fit(cx, b, prec)? {
                b.single()
            } else {
                b
            }
        }
    };
    let (up, down_k) = ws_kernels(block, prec, false)?;
    let gather = cx.kernel("moe_gather_{s}")?;
    let combine = combine_kernel(phys);
    let names = format!("moe_tile_map+{gather}+memset_d8+{up}+{down_k}+{combine}");
    if t == 0 {
        return Ok(names);
    }
    let GroupedInputs {
        x,
        w,
        sorted,
        offsets,
        gate_up,
        down,
    } = GroupedInputs::of(cx, s, ins, phys)?;
    let map = tile_map(cx, s, offsets, block.block_m())?;
    let slots = (t * k) as i32;
    // Every row of the permutation (the host does not know where the segments end); padding
    // rows are zeros.
    let xg = cx.alloc(s.p * h, phys)?;
    cx.k(
        gather,
        Dims::linear(s.p as u32, 128),
        &[
            Arg::Ptr(x.ptr),
            Arg::Ptr(sorted.ptr()),
            Arg::Ptr(xg.ptr()),
            Arg::I32(s.p as i32),
            Arg::I32(h as i32),
            Arg::I32(k as i32),
            Arg::I32(slots),
        ],
    )?;
    let hbuf = cx.alloc(s.p * f, phys)?;
    let rows = slot_rows(cx, s, phys)?;
    let bn = tandem_gpu_kernels::MOE_WS_BLOCK_N;
    ws_gemm(
        cx,
        s,
        &map,
        sorted,
        &WsGemm {
            name: up,
            block,
            n_tile: bn,
            a: xg.ptr(),
            w: gate_up.ptr,
            elem: phys,
            k_len: h,
            w_rows: 2 * f,
            out: hbuf.ptr(),
            n: f,
            scales: None,
        },
    )?;
    ws_gemm(
        cx,
        s,
        &map,
        sorted,
        &WsGemm {
            name: down_k,
            block,
            n_tile: 2 * bn,
            a: hbuf.ptr(),
            w: down.ptr,
            elem: phys,
            k_len: f,
            w_rows: h,
            out: rows.ptr(),
            n: h,
            scales: None,
        },
    )?;
    combine_slots(cx, s, combine, rows.ptr(), w.ptr, outs[0].ptr())?;
    Ok(names)
}

/// The Hopper experts block for `s` on a device allowing `max_smem` bytes of shared memory a
/// block: in 16 bits, the pair builds (clusters of two blocks sharing the weight tiles) of
/// 192-row tiles (three consumers) where the experts average at least 192 rows, else of
/// 128-row tiles (the third consumer would only add padding), both with a 4-stage ring; in
/// e4m3 (`fp8`), one block of 128-row tiles with a 4-stage ring (the 192-row e4m3 down GEMM
/// spills, so it is not built); one block where a pair's shared memory does not fit, the
/// 3-stage 128-row block where no 4-stage ring does.
/// Measured on an H100 (2026-11-28, one call, bf16, H4096 F14336 E8 k2): T4096 4.79 / 4.74 ms
/// for 192 rows and 4 stages against 5.25 / 5.09 for 128 rows and 3 stages (the GPU held at
/// its 700 W cap: fewer operand bytes a product is what pays); T64 0.969 ms for 128 rows and 4
/// stages against 0.996. On an H200 (2026-11-29, twenty-third session), the 192-row pair
/// against one block, two rounds: T4096 4.747 / 4.715 against 4.923 / 4.957 ms, T3072 3.585 /
/// 3.629 against 3.771 / 3.728, T3584 4.127 / 4.100 against 4.218 / 4.125, T2048 and T8192 and
/// T64 within 2% either way (the pairs split an expert's odd last tile by n-tiles; before they
/// did, they were 6-16% slower where an expert had an odd count of tiles).
pub(super) fn ws_block(s: &ExpertsShape, max_smem: usize, fp8: bool) -> MoeWsBlock {
    let rows = (s.t * s.k).div_ceil(s.e.max(1));
    let want = if fp8 {
        MoeWsBlock::TwoDeep
    } else if rows >= MoeWsBlock::ThreeDeep.block_m() {
        MoeWsBlock::ThreeDeepPair
    } else {
        MoeWsBlock::TwoDeepPair
    };
    if want.smem() <= max_smem {
        want
    } else if want.single().smem() <= max_smem {
        want.single()
    } else {
        MoeWsBlock::Two
    }
}

/// Whether the device runs at least one cluster of `block`'s gate/up build at once (not where
/// clusters cannot be placed, as under some partitionings): else the caller takes one block
/// (the occupancy query is memoised and warns once where no cluster fits).
fn clusters_fit(cx: &Cx<'_>, block: MoeWsBlock, prec: &str) -> Result<bool> {
    let (up, _) = ws_kernels(block, prec, false)?;
    let n = cx.be.kernels.max_active_clusters(
        up,
        block.threads(),
        block.smem(),
        block.cluster() as u32,
    )?;
    Ok(n > 0)
}

/// One launch of a Hopper experts GEMM (`moe_ws_*`, sm90a/moe_experts_ws.cu).
pub(super) struct WsGemm {
    /// Entry point.
    pub name: &'static str,
    /// The entry point's block shape (its tile height and threads).
    pub block: MoeWsBlock,
    /// Output columns a tile: [`tandem_gpu_kernels::MOE_WS_BLOCK_N`] for gate/up, twice that
    /// for down.
    pub n_tile: usize,
    /// A [P, k_len] (the permuted activations).
    pub a: u64,
    /// W [E * w_rows, k_len] (the expert weights, K-major).
    pub w: u64,
    /// The element type of A and W: bf16 or f16, or `I8` for e4m3 bytes.
    pub elem: DType,
    /// K.
    pub k_len: usize,
    /// Weight rows per expert.
    pub w_rows: usize,
    /// The output: h [P, n] for gate/up, one row per slot [T*k, n] for down.
    pub out: u64,
    /// Output columns.
    pub n: usize,
    /// The e4m3 builds' f32 scales: per row of A and per row (channel) of W.
    pub scales: Option<(u64, u64)>,
}

/// Queues `g` over the tile map `map` (built with the block's tile rows): one block a
/// multiprocessor (in the pair builds, as many clusters of two as the device runs at once), at
/// most the units the segments can need (one partial unit per expert) times the n-tiles; A and
/// W through 128-byte swizzled tensor maps (A in 64-row boxes, one a consumer warpgroup, so a
/// tile loads only the rows its expert has; W in 128-row boxes), 128 bytes of K a stage (64
/// bf16/f16 elements, 128 e4m3).
pub(super) fn ws_gemm(
    cx: &Cx<'_>,
    s: &ExpertsShape,
    map: &TileMap,
    sorted: &CudaStorage,
    g: &WsGemm,
) -> Result<()> {
    // tiles (a pair build has fewer units: two tiles, or one tile and two n-tiles)
    let units = (s.p.div_ceil(g.block.block_m()) + s.e) * g.n.div_ceil(g.n_tile);
    let cluster = g.block.cluster();
    let grid = if cluster > 1 {
        // every cluster resident at once: the persistent blocks walk the units themselves
        let resident = cx.be.kernels.max_active_clusters(
            g.name,
            g.block.threads(),
            g.block.smem(),
            cluster as u32,
        )? as usize;
        if resident == 0 {
            return Err(Error::Unsupported {
                op: g.name.into(),
                device: cx.be.dev.label.clone(),
                why: format!(
                    "no cluster of {cluster} blocks of {} bytes of shared memory fits",
                    g.block.smem()
                ),
            });
        }
        (units.min(resident) * cluster) as u32
    } else {
        units.min(cx.sms() as usize).max(1) as u32
    };
    let box_k = (128 / g.elem.size()) as u32;
    let label = &cx.be.dev.label;
    let (soff, tstart) = map.tables();
    let mut args = vec![
        Arg::TensorMap(tma::tiled_3d_sw128(
            label,
            g.a,
            g.elem,
            [1, s.p, g.k_len],
            tandem_gpu_kernels::MOE_WS_WG_ROWS as u32,
            box_k,
        )?),
        Arg::TensorMap(tma::tiled_3d_sw128(
            label,
            g.w,
            g.elem,
            [1, s.e * g.w_rows, g.k_len],
            tandem_gpu_kernels::MOE_WS_BLOCK_N as u32,
            box_k,
        )?),
        Arg::Ptr(g.out),
        Arg::Ptr(sorted.ptr()),
        Arg::Ptr(soff),
        Arg::Ptr(tstart),
        Arg::I32(s.e as i32),
        Arg::I32(g.n as i32),
        Arg::I32(g.k_len as i32),
        Arg::I32((s.t * s.k) as i32),
    ];
    if let Some((sa, sw)) = g.scales {
        args.extend([Arg::Ptr(sa), Arg::Ptr(sw)]);
    }
    let dims = Dims::linear(grid, g.block.threads()).smem(g.block.smem());
    cx.k(g.name, dims, &args)
}

/// Gather, per-expert cuBLASLt GEMMs, SwiGLU, combine (synchronises the stream to read the
/// expert offsets).
fn experts_blaslt(
    cx: &Cx<'_>,
    s: &ExpertsShape,
    ins: &[&CudaStorage],
    outs: &[CudaStorage],
) -> Result<String> {
    let (t, h, e, k, f) = (s.t, s.h, s.e, s.k, s.f);
    let x = cx.half(ins[0], t * h)?;
    let w = cx.f32(ins[2], t * k)?;
    let sorted = ins[3];
    let gate_up = cx.half(ins[5], e * 2 * f * h)?;
    let down = cx.half(ins[6], e * h * f)?;
    // The segment bounds decide the GEMM shapes: read them (this waits for queued work).
    let mut off = vec![0i32; e + 1];
    let label = &cx.be.dev.label;
    // A held stream would not reach what this waits for.
    cx.release_stream();
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
            cx.work_stream()?,
            cx.dtype(),
            false,
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
            cx.work_stream()?,
            cx.dtype(),
            false,
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
    // Slots missing from the permutation (dropped by a capacity limit) keep inv = -1 and add
    // nothing in the combine.
    // SAFETY: inv holds t*k i32; ordered on the compute stream before its users.
    unsafe { drv::memset_d8_async(inv.ptr(), 0xFF, t * k * 4, cx.work_stream()?) }
        .ctx(label, "cuMemsetD8Async(moe inverse)")?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(t: usize, h: usize, f: usize, e: usize, k: usize) -> ExpertsShape {
        let p = MoeRouteParams {
            top_k: k,
            renormalize: true,
            block_size: 16,
        }
        .padded_len(t, e);
        ExpertsShape { t, h, e, k, f, p }
    }

    #[test]
    fn the_fused_routing_grid_fits_the_device() {
        // at most `cap` blocks per SM, at least 32 tokens per block, one block for T = 0
        assert_eq!(
            fused_grid(65536, 132, 4, FUSED_MAX_BLOCKS_PER_SM),
            Some(264)
        );
        assert_eq!(
            fused_grid(65536, 132, 1, FUSED_MAX_BLOCKS_PER_SM),
            Some(132)
        );
        assert_eq!(
            fused_grid(65536, 132, 3, FUSED_MAX_BLOCKS_PER_SM_WIDE),
            Some(132)
        );
        assert_eq!(fused_grid(65536, 132, 8, 4), Some(528));
        assert_eq!(fused_grid(16384, 132, 2, 2), Some(264));
        assert_eq!(fused_grid(8192, 132, 2, 2), Some(256));
        assert_eq!(fused_grid(1000, 132, 2, 2), Some(32));
        assert_eq!(fused_grid(1, 132, 2, 2), Some(1));
        assert_eq!(fused_grid(0, 132, 2, 2), Some(1));
        // nothing co-resident: the three-launch path
        assert_eq!(fused_grid(4096, 132, 0, 2), None);
    }

    #[test]
    fn the_hopper_block_follows_the_rows_an_expert_and_the_shared_memory() {
        let h100 = 227 * 1024;
        // (T, H, F, shared memory, block): 1024 rows an expert: 192-row tiles; 16: 128-row
        // tiles; both in pairs with 4 stages; 192 rows on average is the bound; a part with less
        // shared memory than the 4-stage rings need takes the 3-stage 128-row block
        for (t, h, f, smem, want) in [
            (4096, 4096, 14336, h100, MoeWsBlock::ThreeDeepPair),
            (64, 4096, 14336, h100, MoeWsBlock::TwoDeepPair),
            (768, 64, 64, h100, MoeWsBlock::ThreeDeepPair),
            (760, 64, 64, h100, MoeWsBlock::TwoDeepPair),
            (0, 64, 64, h100, MoeWsBlock::TwoDeepPair),
            // room for the ring but not for a pair's unit table: one block
            (
                4096,
                4096,
                14336,
                MoeWsBlock::ThreeDeep.smem(),
                MoeWsBlock::ThreeDeep,
            ),
            (4096, 4096, 14336, 160 * 1024, MoeWsBlock::Two),
        ] {
            assert_eq!(
                ws_block(&shape(t, h, f, 8, 2), smem, false),
                want,
                "T{t} smem {smem}"
            );
        }
        assert!(MoeWsBlock::ThreeDeepPair.smem() <= h100);
        assert!(MoeWsBlock::ThreeDeepPair.smem() > MoeWsBlock::ThreeDeep.smem());
        // e4m3: the 128-row block at every size
        let big = shape(4096, 4096, 14336, 8, 2);
        assert_eq!(ws_block(&big, h100, true), MoeWsBlock::TwoDeep);
        assert_eq!(ws_block(&big, 160 * 1024, true), MoeWsBlock::Two);
    }

    #[test]
    fn grids_cover_the_worst_case_tiles() {
        let s = shape(4096, 4096, 14336, 8, 2);
        assert_eq!(s.p, 8320);
        let l = MoeTileSize::L.tile();
        // 65 full tiles of 128 rows + one partial tile per expert; 64 SwiGLU columns and 128
        // down columns per block
        assert_eq!(grids(&s, l), (73 * 224, 73 * 32));
        let st = MoeTileSize::S.tile();
        assert_eq!(grids(&s, st), ((260 + 8) * 224, (260 + 8) * 32));
    }

    #[test]
    fn shapes_off_multiples_of_8_take_the_cublaslt_path() {
        assert!(grouped_fits(&shape(64, 4096, 14336, 8, 2)).is_ok());
        let why = grouped_fits(&shape(20, 60, 36, 4, 2)).expect_err("H 60 is not a multiple of 8");
        assert!(why.contains("multiples of 8"), "{why}");
        // Even when the grouped path or a tile is asked for.
        for (path, tile) in [
            (None, None),
            (Some(MoeExpertsPath::Grouped), None),
            (None, Some(MoeTileSize::S)),
        ] {
            for hopper in [false, true] {
                let (p, why) = ExpertsPath::select(&shape(20, 60, 36, 4, 2), hopper, path, tile);
                assert_eq!(p, ExpertsPath::Blaslt);
                assert!(why.is_some_and(|w| w.contains("multiples of 8")));
            }
        }
    }

    fn pick_on(
        hopper: bool,
        t: usize,
        path: Option<MoeExpertsPath>,
        tile: Option<MoeTileSize>,
    ) -> &'static str {
        match ExpertsPath::select(&shape(t, 4096, 14336, 8, 2), hopper, path, tile).0 {
            ExpertsPath::Grouped(tile) => tile.name,
            ExpertsPath::Blaslt => "blaslt",
            ExpertsPath::Wgmma => "wgmma",
            ExpertsPath::WgmmaFp8 => "wgmma-fp8",
        }
    }

    fn pick(t: usize, path: Option<MoeExpertsPath>, tile: Option<MoeTileSize>) -> &'static str {
        pick_on(false, t, path, tile)
    }

    #[test]
    fn the_default_path_follows_the_rows_per_expert() {
        assert_eq!(pick(64, None, None), "s");
        assert_eq!(pick(256, None, None), "blaslt");
        assert_eq!(pick(4096, None, None), "blaslt");
        // Hopper: the wgmma kernels at every size
        assert_eq!(pick_on(true, 64, None, None), "wgmma");
        assert_eq!(pick_on(true, 256, None, None), "wgmma");
        assert_eq!(pick_on(true, 4096, None, None), "wgmma");
    }

    #[test]
    fn wgmma_off_hopper_or_past_256_experts_falls_back_with_the_reason() {
        let (p, why) = ExpertsPath::select(
            &shape(4096, 4096, 14336, 8, 2),
            false,
            Some(MoeExpertsPath::Wgmma),
            None,
        );
        assert_eq!(p, ExpertsPath::Blaslt);
        assert!(why.is_some_and(|w| w.contains("sm_90")));
        let (p, why) = ExpertsPath::select(
            &shape(64, 4096, 14336, 8, 2),
            false,
            Some(MoeExpertsPath::Wgmma),
            None,
        );
        assert_eq!(p, ExpertsPath::Grouped(MoeTileSize::S.tile()));
        assert!(why.is_some());
        let (p, why) = ExpertsPath::select(
            &shape(16384, 512, 1024, 300, 2),
            true,
            Some(MoeExpertsPath::Wgmma),
            None,
        );
        assert_eq!(p, ExpertsPath::Blaslt);
        assert!(why.is_some_and(|w| w.contains("300 experts")));
        // forced on Hopper: wgmma even for decode-sized batches
        assert_eq!(
            pick_on(true, 64, Some(MoeExpertsPath::Wgmma), None),
            "wgmma"
        );
        assert_eq!(
            pick_on(true, 64, Some(MoeExpertsPath::Blaslt), None),
            "blaslt"
        );
    }

    #[test]
    fn fp8_runs_on_the_wgmma_path_with_rows_of_16_bytes() {
        let big = shape(4096, 4096, 14336, 8, 2);
        assert_eq!(
            ExpertsPath::Wgmma.fp8(&big, false),
            (ExpertsPath::Wgmma, None)
        );
        assert_eq!(
            ExpertsPath::Wgmma.fp8(&big, true),
            (ExpertsPath::WgmmaFp8, None)
        );
        let (p, why) = ExpertsPath::Wgmma.fp8(&shape(64, 72, 40, 4, 2), true);
        assert_eq!(p, ExpertsPath::Wgmma);
        assert!(why.is_some_and(|w| w.contains("multiples of 16")));
        for other in [
            ExpertsPath::Blaslt,
            ExpertsPath::Grouped(MoeTileSize::S.tile()),
        ] {
            let (p, why) = other.fp8(&big, true);
            assert_eq!(p, other);
            assert!(why.is_some_and(|w| w.contains("wgmma path only")));
        }
    }

    #[test]
    fn forced_paths_and_tiles_win() {
        use MoeExpertsPath::{Blaslt, Grouped};
        assert_eq!(pick(64, Some(Blaslt), None), "blaslt");
        assert_eq!(pick(64, Some(Blaslt), Some(MoeTileSize::L)), "blaslt");
        // grouped without a tile: the tile by rows per expert (16, 64, 1024 rows)
        assert_eq!(pick(64, Some(Grouped), None), "s");
        assert_eq!(pick(256, Some(Grouped), None), "m");
        assert_eq!(pick(4096, Some(Grouped), None), "l");
        // a tile alone asks for the grouped path with that tile
        for t in MoeTileSize::ALL {
            assert_eq!(pick(4096, None, Some(t)), t.name());
            assert_eq!(pick(64, Some(Grouped), Some(t)), t.name());
        }
    }
}
