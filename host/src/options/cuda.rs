//! Options of the CUDA backend (filled by [`super::Options`]).
//!
//! | variable | field | accepted |
//! | --- | --- | --- |
//! | `TANDEM_CUDA_DTYPE` | [`CudaOptions::dtype`] | `bf16` (default), `f16` |
//! | `TANDEM_CUDA_POISON` | [`CudaOptions::poison`] | `1`, `0` (default), `on`, `off`, `true`, `false` |
//! | `TANDEM_CUDA_HOLD_STREAM` | [`CudaOptions::hold_stream`] | `1`, `0` (default; `run --explain` and `calibrate` set it), `on`, `off`, `true`, `false` |
//! | `TANDEM_ATTN_VARIANT` | [`CudaOptions::attention_variant`] | `w4`, `w8`, `m2`, `m2n32`, `ws` (default: by arch) |
//! | `TANDEM_MOE_EXPERTS` | [`CudaOptions::moe_experts`] | `blaslt`, `grouped`, `wgmma` (default: by shape and device) |
//! | `TANDEM_MOE_FP8` | [`CudaOptions::moe_fp8`] | `1`, `0` (default), `on`, `off`, `true`, `false` |
//! | `TANDEM_MOE_WS_TILE` | [`CudaOptions::moe_ws_tile`] | `128`, `128-s4`, `192`, `192-s4`, `128-s4-c2`, `192-s4-c2` (default: a pair build by the rows an expert) |
//! | `TANDEM_MOE_TILE` | [`CudaOptions::moe_tile`] | `l`, `m`, `s` (default: by shape) |
//! | `TANDEM_ROUTE_KERNEL` | [`CudaOptions::route_kernel`] | `fused`, `fused-2`, `fused-1`, `fused-memset`, `three` (default: `fused` where the grid fits) |
//! | `TANDEM_DECODE_CHUNKS` | [`CudaOptions::decode_chunks`] | 1 to 4096 (default: by shape and device) |
//! | `TANDEM_DECODE_RING` | [`CudaOptions::decode_ring`] | `<8, 16 or 32>k-s<stages>[-p<paged stages>]`, e.g. `16k-s3` (default: `16k-s4-p3`) |
//! | `TANDEM_KERNEL_DIR` | [`CudaOptions::kernel_dir`] | a folder laid out like `gpu-kernels/src/cuda/` |
//! | `TANDEM_CACHE_DIR` | [`CudaOptions::cache_dir`] | a folder (`cuda/` in it holds the CUBINs) |
//! | `CUDA_HOME`, `CUDA_PATH` | [`CudaOptions::toolkit_roots`] | CUDA toolkit folders |
//! | `VIRTUAL_ENV` | [`CudaOptions::python_prefix`] | a Python prefix with NVIDIA's wheels |

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use super::Env;
use crate::backend::CudaDType;
use crate::error::{Error, Result};

/// `TANDEM_CUDA_POISON`: fill every output with NaN before each launch.
pub const POISON_VAR: &str = "TANDEM_CUDA_POISON";
/// `TANDEM_CUDA_HOLD_STREAM`: hold the compute stream while each op queues its work.
pub const HOLD_STREAM_VAR: &str = "TANDEM_CUDA_HOLD_STREAM";
/// `TANDEM_ATTN_VARIANT`: the attention build to run.
pub const ATTENTION_VARIANT_VAR: &str = "TANDEM_ATTN_VARIANT";
/// `TANDEM_MOE_EXPERTS`: the MoE experts path.
pub const MOE_EXPERTS_VAR: &str = "TANDEM_MOE_EXPERTS";
/// `TANDEM_MOE_FP8`: run the MoE experts on e4m3 weights and activations (Hopper).
pub const MOE_FP8_VAR: &str = "TANDEM_MOE_FP8";
/// `TANDEM_MOE_WS_TILE`: the block of the Hopper MoE experts GEMMs.
pub const MOE_WS_TILE_VAR: &str = "TANDEM_MOE_WS_TILE";
/// `TANDEM_MOE_TILE`: the grouped MoE GEMMs' tile.
pub const MOE_TILE_VAR: &str = "TANDEM_MOE_TILE";
/// `TANDEM_ROUTE_KERNEL`: the MoE routing kernel(s).
pub const ROUTE_KERNEL_VAR: &str = "TANDEM_ROUTE_KERNEL";
/// `TANDEM_DECODE_CHUNKS`: the KV chunks per sequence of decode attention.
pub const DECODE_CHUNKS_VAR: &str = "TANDEM_DECODE_CHUNKS";
/// The most KV chunks per sequence `TANDEM_DECODE_CHUNKS` accepts.
pub const MAX_DECODE_CHUNKS: usize = 4096;
/// `TANDEM_DECODE_RING`: decode attention's K/V ring (tile size and stages).
pub const DECODE_RING_VAR: &str = "TANDEM_DECODE_RING";
/// `TANDEM_KERNEL_DIR`: a folder the kernel sources are read from at run time.
pub const KERNEL_DIR_VAR: &str = "TANDEM_KERNEL_DIR";
/// `TANDEM_CACHE_DIR`: the folder of compiled kernels (in its `cuda/`).
pub const CACHE_DIR_VAR: &str = "TANDEM_CACHE_DIR";
/// The variables naming CUDA toolkit folders, in the order they are searched.
pub const TOOLKIT_VARS: [&str; 2] = ["CUDA_HOME", "CUDA_PATH"];
/// The variable naming the active Python prefix (NVIDIA's pip wheels).
pub const PYTHON_PREFIX_VAR: &str = "VIRTUAL_ENV";

/// Options of the CUDA backend: filled from the environment once by
/// [`CudaOptions::from_source`], or built by hand (tests); the backend hands each op the
/// fields it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaOptions {
    /// Precision logical f32 tensors are stored in (bf16 by default). `TANDEM_CUDA_DTYPE`,
    /// or `--cuda-dtype` on the command line.
    pub dtype: CudaDType,
    /// Fill every output with NaN (bf16/f16/f32) or 0x7FC07FC0 (i32) before each launch, so
    /// elements a kernel fails to write show up (tests). `TANDEM_CUDA_POISON=1`.
    pub poison: bool,
    /// Hold the compute stream while an op queues its work, and let it go once all of it is
    /// queued, so the op's event-timed device time is its work alone, not the host's queueing
    /// the device would otherwise wait for on an idle stream (NVBench's blocking-kernel
    /// method, with a host function on the stream). Each op's start waits for the release
    /// (a few microseconds more of wall time an op); a hold not let go within
    /// [`crate::backend::cuda::HOLD_TIMEOUT`] lets the stream go by itself and says so in the
    /// log. `tandem run --explain` and `tandem calibrate` set it, so what they compare is
    /// device time on both sides. `TANDEM_CUDA_HOLD_STREAM=1`.
    pub hold_stream: bool,
    /// The attention build every launch runs; `None` picks by arch (the fastest measured).
    /// `TANDEM_ATTN_VARIANT`.
    pub attention_variant: Option<AttentionVariant>,
    /// The MoE experts path; `None` picks by shape. `TANDEM_MOE_EXPERTS`.
    pub moe_experts: Option<MoeExpertsPath>,
    /// Run the MoE experts in FP8 where the Hopper wgmma path runs: expert weights quantized
    /// once to e4m3 with one f32 scale per output channel (kept beside the weights on the
    /// device), activations to e4m3 with one scale per row, f32 accumulation, outputs in the
    /// storage precision. Lossy beyond the storage precision (relative error within
    /// [`crate::backend::Numerics::Fp8`]'s bound); off by default. Elsewhere (no sm_90, H or
    /// F not a multiple of 16, another path forced) the experts run as without it and the
    /// reason is logged. `TANDEM_MOE_FP8=1`.
    pub moe_fp8: bool,
    /// The block of the Hopper (wgmma) MoE experts GEMMs in bf16/f16; `None`: a pair build
    /// (`192-s4-c2` or `128-s4-c2`) picked by the rows an expert averages, one block where no
    /// cluster fits. `TANDEM_MOE_WS_TILE` (comparisons).
    pub moe_ws_tile: Option<MoeWsTile>,
    /// The grouped MoE GEMMs' tile (setting it asks for the grouped path); `None` picks by
    /// shape. `TANDEM_MOE_TILE`.
    pub moe_tile: Option<MoeTileSize>,
    /// The MoE routing kernel(s); `None`: the fused cooperative kernel where its grid fits
    /// the device, else three launches. `TANDEM_ROUTE_KERNEL` (comparisons).
    pub route_kernel: Option<RouteKernel>,
    /// KV chunks per sequence for decode attention's split (at most the cache's keys / 64);
    /// `None` picks by shape and device. `TANDEM_DECODE_CHUNKS` (comparisons).
    pub decode_chunks: Option<usize>,
    /// Decode attention's shared-memory ring of K/V tiles: the K tile (8, 16 or 32 KiB, as
    /// much of V) and the stages, contiguous and paged; `None`: 16 KiB x 4 stages, 3 paged
    /// ([`tandem_gpu_kernels::DecodeRing::default`]). `TANDEM_DECODE_RING`
    /// (comparisons; another ring compiles attention_decode.cu with its own `-D` options).
    pub decode_ring: Option<tandem_gpu_kernels::DecodeRing>,
    /// A folder laid out like `gpu-kernels/src/cuda/` whose `.cu` files replace the embedded
    /// ones (kernel work without rebuilding the host; a file missing there is taken from the
    /// embedded sources). `TANDEM_KERNEL_DIR`.
    pub kernel_dir: Option<PathBuf>,
    /// Where compiled kernels (CUBIN) are kept: `$TANDEM_CACHE_DIR/cuda`, else
    /// `$XDG_CACHE_HOME/tandem/cuda`, else `~/.cache/tandem/cuda`, else `tandem-cache/cuda`
    /// in the temp folder (the default).
    pub cache_dir: PathBuf,
    /// CUDA toolkit folders searched first for the libraries (`lib64/`, `lib/`) and headers
    /// (`include/`), before `/usr/local/cuda`. `CUDA_HOME`, `CUDA_PATH`.
    pub toolkit_roots: Vec<PathBuf>,
    /// A Python prefix searched first for NVIDIA's pip wheels (`lib/python3*/site-packages/
    /// nvidia/*`), before `/opt/torch/.venv`, `/usr/local` and `/usr`. `VIRTUAL_ENV`.
    pub python_prefix: Option<PathBuf>,
}

impl Default for CudaOptions {
    /// bf16 storage, nothing forced, no poisoning, the CUBIN cache in the temp folder, the
    /// libraries in the usual places only.
    fn default() -> Self {
        Self {
            dtype: CudaDType::default(),
            poison: false,
            hold_stream: false,
            attention_variant: None,
            moe_experts: None,
            moe_fp8: false,
            moe_ws_tile: None,
            moe_tile: None,
            route_kernel: None,
            decode_chunks: None,
            decode_ring: None,
            kernel_dir: None,
            cache_dir: default_cache_dir(),
            toolkit_roots: Vec::new(),
            python_prefix: None,
        }
    }
}

/// The CUBIN cache when no variable names one: `tandem-cache/cuda` in the temp folder.
fn default_cache_dir() -> PathBuf {
    std::env::temp_dir().join("tandem-cache").join("cuda")
}

impl CudaOptions {
    /// The defaults, with where this machine keeps things read from `env`: the CUDA toolkit
    /// roots (`CUDA_HOME`, `CUDA_PATH`), the Python prefix (`VIRTUAL_ENV`) and the CUBIN
    /// cache ([`CudaOptions::cache_dir`]); nothing that changes what runs. What tests build
    /// their options on, so they find CUDA where the programs do.
    pub fn machine(env: &dyn Env) -> Self {
        let cache_dir = match env.path(CACHE_DIR_VAR) {
            Some(d) => d.join("cuda"),
            None => super::user_cache_dir(env)
                .map(|d| d.join("cuda"))
                .unwrap_or_else(default_cache_dir),
        };
        Self {
            cache_dir,
            toolkit_roots: TOOLKIT_VARS.iter().filter_map(|v| env.path(v)).collect(),
            python_prefix: env.path(PYTHON_PREFIX_VAR),
            ..Self::default()
        }
    }

    /// Options from `env` (see the module's table); a value that is set but not accepted is
    /// an error naming the variable, the value and what is accepted.
    pub fn from_source(env: &dyn Env) -> Result<Self> {
        let kernel_dir = env.path(KERNEL_DIR_VAR);
        if let Some(d) = &kernel_dir
            && !d.is_dir()
        {
            return Err(Error::invalid(
                KERNEL_DIR_VAR,
                format!(
                    "'{}' is not a folder (accepted: a folder laid out like gpu-kernels/src/cuda/)",
                    d.display()
                ),
            ));
        }
        Ok(Self {
            dtype: named(env, CudaDType::ENV, CudaDType::parse_from)?.unwrap_or_default(),
            poison: flag(env, POISON_VAR)?.unwrap_or(false),
            hold_stream: flag(env, HOLD_STREAM_VAR)?.unwrap_or(false),
            attention_variant: named(env, ATTENTION_VARIANT_VAR, AttentionVariant::parse_from)?,
            moe_experts: named(env, MOE_EXPERTS_VAR, MoeExpertsPath::parse_from)?,
            moe_fp8: flag(env, MOE_FP8_VAR)?.unwrap_or(false),
            moe_ws_tile: named(env, MOE_WS_TILE_VAR, MoeWsTile::parse_from)?,
            moe_tile: named(env, MOE_TILE_VAR, MoeTileSize::parse_from)?,
            route_kernel: named(env, ROUTE_KERNEL_VAR, RouteKernel::parse_from)?,
            decode_chunks: named(env, DECODE_CHUNKS_VAR, parse_chunks)?,
            decode_ring: named(env, DECODE_RING_VAR, parse_ring)?,
            kernel_dir,
            ..Self::machine(env)
        })
    }
}

/// The value of `var` parsed by `parse` (which names `var` in its error), if set.
fn named<T>(
    env: &dyn Env,
    var: &str,
    parse: impl Fn(&str, &str) -> Result<T>,
) -> Result<Option<T>> {
    env.text(var)?.map(|v| parse(&v, var)).transpose()
}

/// A chunk count for `TANDEM_DECODE_CHUNKS`: 1 to [`MAX_DECODE_CHUNKS`].
fn parse_chunks(value: &str, var: &str) -> Result<usize> {
    match value.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_DECODE_CHUNKS).contains(&n) => Ok(n),
        _ => Err(Error::invalid(
            var,
            format!("'{value}' is not a chunk count (accepted: 1 to {MAX_DECODE_CHUNKS})"),
        )),
    }
}

/// A ring for `TANDEM_DECODE_RING`: `<KiB>k-s<stages>[-p<paged stages>]` (`16k-s3`: 16 KiB K
/// tiles, 3 stages paged or not; `16k-s4-p3`: 4 stages, 3 on a paged cache).
fn parse_ring(value: &str, var: &str) -> Result<tandem_gpu_kernels::DecodeRing> {
    let bad = |why: String| {
        Error::invalid(
            var,
            format!(
                "'{value}' is not a decode ring: {why} (accepted: <8, 16 or 32>k-s<stages>[-p<paged stages>], e.g. 8k-s4, 16k-s3, 16k-s4-p3, 32k-s2)"
            ),
        )
    };
    let v = value.trim().to_ascii_lowercase();
    let (kib, stages) = v
        .split_once("k-s")
        .ok_or_else(|| bad("no '<KiB>k-s<stages>' form".into()))?;
    let (stages, paged) = match stages.split_once("-p") {
        Some((s, p)) => (s, Some(p)),
        None => (stages, None),
    };
    let kib: usize = kib
        .parse()
        .map_err(|_| bad(format!("'{kib}' is not a size in KiB")))?;
    let count = |s: &str| {
        s.parse::<usize>()
            .map_err(|_| bad(format!("'{s}' is not a stage count")))
    };
    let stages = count(stages)?;
    let paged = paged.map(count).transpose()?.unwrap_or(stages);
    tandem_gpu_kernels::DecodeRing::new(kib * 512, stages, paged).map_err(bad)
}

/// An on/off variable: `1`, `on`, `true` or `0`, `off`, `false` (any case), if set.
pub(crate) fn flag(env: &dyn Env, var: &str) -> Result<Option<bool>> {
    let Some(v) = env.text(var)? else {
        return Ok(None);
    };
    match v.to_ascii_lowercase().as_str() {
        "1" | "on" | "true" => Ok(Some(true)),
        "0" | "off" | "false" => Ok(Some(false)),
        _ => Err(Error::invalid(
            var,
            format!("'{v}' is not on or off (accepted: 1, 0, on, off, true, false)"),
        )),
    }
}

/// The value of `all` named `value` (any case, trimmed); else an error from `source` (a
/// variable or flag) naming the value, `what` it should be and the accepted names.
fn parse_name<T: Copy>(
    all: &[T],
    name: fn(T) -> &'static str,
    value: &str,
    source: &str,
    what: &str,
) -> Result<T> {
    let v = value.trim().to_ascii_lowercase();
    all.iter().copied().find(|&t| name(t) == v).ok_or_else(|| {
        let accepted: Vec<&str> = all.iter().map(|&t| name(t)).collect();
        Error::invalid(
            source,
            format!(
                "'{value}' is not {what} (accepted: {})",
                accepted.join(", ")
            ),
        )
    })
}

/// A build of the attention kernel (`mha_{s}_fwd_d{64,128}[_{variant}]`); the CUDA backend
/// knows each one's geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttentionVariant {
    /// mma.sync, 4 warps x 1 m-tile (64-row blocks).
    W4,
    /// mma.sync, 8 warps x 1 m-tile (128-row blocks).
    W8,
    /// mma.sync, 4 warps x 2 m-tiles (128-row blocks, FA2's layout): each K/V fragment feeds
    /// two mma's.
    M2,
    /// As M2 with 32-key tiles (fewer registers for S, Q kept in registers).
    M2N32,
    /// Hopper (sm_90 only), FlashAttention-3's structure: a TMA producer warp and consumer
    /// warpgroups taking turns on wgmma (two for d128: 128-row blocks; three for d64: 192).
    Ws,
}

impl AttentionVariant {
    /// Every build.
    pub const ALL: [AttentionVariant; 5] = [
        AttentionVariant::W4,
        AttentionVariant::W8,
        AttentionVariant::M2,
        AttentionVariant::M2N32,
        AttentionVariant::Ws,
    ];

    /// The name in `TANDEM_ATTN_VARIANT` and in entry points (`w4` has no suffix there).
    pub fn name(self) -> &'static str {
        match self {
            AttentionVariant::W4 => "w4",
            AttentionVariant::W8 => "w8",
            AttentionVariant::M2 => "m2",
            AttentionVariant::M2N32 => "m2n32",
            AttentionVariant::Ws => "ws",
        }
    }

    /// Parses a name (any case); `source` names where it came from in the error.
    pub fn parse_from(value: &str, source: &str) -> Result<Self> {
        parse_name(&Self::ALL, Self::name, value, source, "an attention build")
    }
}

/// How the CUDA backend runs the MoE experts op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MoeExpertsPath {
    /// Gather, one cuBLASLt GEMM per expert (twice), SwiGLU, combine.
    Blaslt,
    /// Grouped GEMMs over the routing's padded permutation (no host synchronisation).
    Grouped,
    /// Hopper (sm_90) persistent grouped GEMMs on wgmma and the TMA (no host
    /// synchronisation).
    Wgmma,
}

impl MoeExpertsPath {
    /// Every path.
    pub const ALL: [MoeExpertsPath; 3] = [
        MoeExpertsPath::Blaslt,
        MoeExpertsPath::Grouped,
        MoeExpertsPath::Wgmma,
    ];

    /// The name in `TANDEM_MOE_EXPERTS`.
    pub fn name(self) -> &'static str {
        match self {
            MoeExpertsPath::Blaslt => "blaslt",
            MoeExpertsPath::Grouped => "grouped",
            MoeExpertsPath::Wgmma => "wgmma",
        }
    }

    /// Parses a name (any case); `source` names where it came from in the error.
    pub fn parse_from(value: &str, source: &str) -> Result<Self> {
        parse_name(&Self::ALL, Self::name, value, source, "a MoE experts path")
    }
}

/// A tile of the grouped MoE GEMMs, by the suffix of its entry points
/// (`tandem_gpu_kernels::MOE_TILES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MoeTileSize {
    /// 128 rows per block: many tokens per expert.
    L,
    /// 64 rows per block.
    M,
    /// 32 rows per block, deep k-tiles: decode-sized batches.
    S,
}

impl MoeTileSize {
    /// Every tile, in the order of `tandem_gpu_kernels::MOE_TILES`.
    pub const ALL: [MoeTileSize; 3] = [MoeTileSize::L, MoeTileSize::M, MoeTileSize::S];

    /// The name in `TANDEM_MOE_TILE` and in entry points.
    pub fn name(self) -> &'static str {
        match self {
            MoeTileSize::L => "l",
            MoeTileSize::M => "m",
            MoeTileSize::S => "s",
        }
    }

    /// Parses a name (any case); `source` names where it came from in the error.
    pub fn parse_from(value: &str, source: &str) -> Result<Self> {
        parse_name(&Self::ALL, Self::name, value, source, "a MoE tile")
    }

    /// The tile's shape.
    pub fn tile(self) -> tandem_gpu_kernels::MoeTile {
        let tiles = tandem_gpu_kernels::MOE_TILES;
        tiles
            .into_iter()
            .find(|t| t.name == self.name())
            .unwrap_or(tiles[0])
    }
}

/// The block of the Hopper MoE experts GEMMs in bf16/f16 (`TANDEM_MOE_WS_TILE`): a tile's rows
/// (64 a consumer warpgroup) and the depth of the TMA ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MoeWsTile {
    /// 128 rows, two consumers, 3 stages (`moe_ws_*`).
    R128,
    /// 128 rows, two consumers, 4 stages (`moe_ws_s4_*`).
    R128S4,
    /// 192 rows, three consumers, 3 stages (`moe_ws3_*`): less operand traffic per product,
    /// more padding on each expert's last tile.
    R192,
    /// 192 rows, three consumers, 4 stages (`moe_ws3_s4_*`).
    R192S4,
    /// 128 rows, 4 stages, clusters of two blocks sharing the weight tiles (`moe_ws_s4_c2_*`;
    /// an expert's odd last tile split by n-tiles): the default below 192 rows an expert.
    R128S4C2,
    /// 192 rows, 4 stages, clusters of two blocks sharing the weight tiles (`moe_ws3_s4_c2_*`):
    /// the default from 192 rows an expert.
    R192S4C2,
}

impl MoeWsTile {
    /// Every choice.
    pub const ALL: [MoeWsTile; 6] = [
        MoeWsTile::R128,
        MoeWsTile::R128S4,
        MoeWsTile::R192,
        MoeWsTile::R192S4,
        MoeWsTile::R128S4C2,
        MoeWsTile::R192S4C2,
    ];

    /// The name in `TANDEM_MOE_WS_TILE`.
    pub fn name(self) -> &'static str {
        match self {
            MoeWsTile::R128 => "128",
            MoeWsTile::R128S4 => "128-s4",
            MoeWsTile::R192 => "192",
            MoeWsTile::R192S4 => "192-s4",
            MoeWsTile::R128S4C2 => "128-s4-c2",
            MoeWsTile::R192S4C2 => "192-s4-c2",
        }
    }

    /// Parses a name (any case); `source` names where it came from in the error.
    pub fn parse_from(value: &str, source: &str) -> Result<Self> {
        parse_name(
            &Self::ALL,
            Self::name,
            value,
            source,
            "a Hopper experts tile",
        )
    }

    /// The kernels' block shape.
    pub fn block(self) -> tandem_gpu_kernels::MoeWsBlock {
        match self {
            MoeWsTile::R128 => tandem_gpu_kernels::MoeWsBlock::Two,
            MoeWsTile::R128S4 => tandem_gpu_kernels::MoeWsBlock::TwoDeep,
            MoeWsTile::R192 => tandem_gpu_kernels::MoeWsBlock::Three,
            MoeWsTile::R192S4 => tandem_gpu_kernels::MoeWsBlock::ThreeDeep,
            MoeWsTile::R128S4C2 => tandem_gpu_kernels::MoeWsBlock::TwoDeepPair,
            MoeWsTile::R192S4C2 => tandem_gpu_kernels::MoeWsBlock::ThreeDeepPair,
        }
    }
}

/// The MoE routing kernel(s) the CUDA backend runs (`TANDEM_ROUTE_KERNEL`; the default picks
/// [`RouteKernel::Fused`] where its grid fits the device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteKernel {
    /// One cooperative launch (`moe_route_fused_*_g`, 512-thread blocks), its grid barriers on
    /// a self-resetting module global (no memset before it), up to 2 blocks per
    /// multiprocessor (1 for the widest build, E > 128).
    Fused,
    /// The same kernel with at most 2 blocks per multiprocessor (the widest build too).
    Fused2,
    /// The same kernel with one block per multiprocessor.
    Fused1,
    /// One cooperative launch (`moe_route_fused_*`) after a 4-byte memset of its barrier
    /// counter, blocks per multiprocessor as [`RouteKernel::Fused`] (the 2026-11-23 design).
    FusedMemset,
    /// Three launches: top-k and block histograms, a one-block scan, the scatter (k <= 32).
    Three,
}

impl RouteKernel {
    /// Every choice.
    pub const ALL: [RouteKernel; 5] = [
        RouteKernel::Fused,
        RouteKernel::Fused2,
        RouteKernel::Fused1,
        RouteKernel::FusedMemset,
        RouteKernel::Three,
    ];

    /// The name in `TANDEM_ROUTE_KERNEL`.
    pub fn name(self) -> &'static str {
        match self {
            RouteKernel::Fused => "fused",
            RouteKernel::Fused2 => "fused-2",
            RouteKernel::Fused1 => "fused-1",
            RouteKernel::FusedMemset => "fused-memset",
            RouteKernel::Three => "three",
        }
    }

    /// Parses a name (any case); `source` names where it came from in the error.
    pub fn parse_from(value: &str, source: &str) -> Result<Self> {
        parse_name(&Self::ALL, Self::name, value, source, "a routing kernel")
    }
}

macro_rules! name_list_traits {
    ($($t:ty: $what:literal),+ $(,)?) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl FromStr for $t {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self> {
                Self::parse_from(s, $what)
            }
        }
    )+};
}

name_list_traits!(
    AttentionVariant: "attention build",
    MoeExpertsPath: "MoE experts path",
    MoeTileSize: "MoE tile",
    RouteKernel: "routing kernel",
);

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::error::ErrorKind;

    /// The error of `env`'s options names the variable, the value and every accepted name.
    fn refused(env: &dyn Env, var: &str, value: &str, accepted: &[&str]) {
        let e = CudaOptions::from_source(env).expect_err(value);
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let m = e.to_string();
        assert!(m.starts_with(&format!("{var}: '{value}'")), "{m}");
        assert!(
            m.contains(&format!("(accepted: {})", accepted.join(", "))),
            "{m}"
        );
    }

    #[test]
    fn defaults_force_nothing() -> Result<()> {
        let none: [(&str, &str); 0] = [];
        let o = CudaOptions::from_source(&none)?;
        let d = CudaOptions::default();
        assert_eq!(o, d);
        assert_eq!(d.dtype, CudaDType::Bf16);
        assert!(!d.poison);
        assert_eq!(
            (
                d.attention_variant,
                d.moe_experts,
                d.moe_ws_tile,
                d.moe_tile,
                d.route_kernel,
                d.decode_chunks
            ),
            (None, None, None, None, None, None)
        );
        assert!(d.decode_ring.is_none());
        assert!(d.kernel_dir.is_none() && d.toolkit_roots.is_empty());
        assert!(d.python_prefix.is_none());
        assert!(d.cache_dir.ends_with("tandem-cache/cuda"));
        Ok(())
    }

    #[test]
    fn storage_precision() -> Result<()> {
        for (v, want) in [
            ("bf16", CudaDType::Bf16),
            ("f16", CudaDType::F16),
            (" F16 ", CudaDType::F16),
        ] {
            let o = CudaOptions::from_source(&[("TANDEM_CUDA_DTYPE", v)])?;
            assert_eq!(o.dtype, want, "{v}");
        }
        assert_eq!(
            CudaOptions::from_source(&[("TANDEM_CUDA_DTYPE", "")])?.dtype,
            CudaDType::Bf16
        );
        for bad in ["f8", "fp16"] {
            refused(
                &[("TANDEM_CUDA_DTYPE", bad)],
                "TANDEM_CUDA_DTYPE",
                bad,
                &["bf16", "f16"],
            );
        }
        let e = CudaOptions::from_source(&[("TANDEM_CUDA_DTYPE", "f8")]).expect_err("f8");
        assert_eq!(
            e.to_string(),
            "TANDEM_CUDA_DTYPE: 'f8' is not a CUDA storage precision (accepted: bf16, f16)"
        );
        Ok(())
    }

    #[test]
    fn poisoning() -> Result<()> {
        for (v, want) in [
            ("1", true),
            ("on", true),
            ("TRUE", true),
            ("0", false),
            ("off", false),
            ("false", false),
        ] {
            let o = CudaOptions::from_source(&[(POISON_VAR, v)])?;
            assert_eq!(o.poison, want, "{v}");
        }
        refused(
            &[(POISON_VAR, "yes")],
            POISON_VAR,
            "yes",
            &["1", "0", "on", "off", "true", "false"],
        );
        Ok(())
    }

    #[test]
    fn attention_variant() -> Result<()> {
        for v in AttentionVariant::ALL {
            let o = CudaOptions::from_source(&[(ATTENTION_VARIANT_VAR, v.name())])?;
            assert_eq!(o.attention_variant, Some(v));
            assert_eq!(v.name().parse::<AttentionVariant>()?, v);
            assert_eq!(v.to_string(), v.name());
        }
        // Unknown builds were ignored once; now they say so.
        for bad in ["w5", "m3", "fa3"] {
            refused(
                &[(ATTENTION_VARIANT_VAR, bad)],
                ATTENTION_VARIANT_VAR,
                bad,
                &["w4", "w8", "m2", "m2n32", "ws"],
            );
        }
        let e = CudaOptions::from_source(&[(ATTENTION_VARIANT_VAR, "w5")]).expect_err("w5");
        assert!(e.to_string().contains("is not an attention build"), "{e}");
        Ok(())
    }

    #[test]
    fn moe_path_and_tile() -> Result<()> {
        for p in MoeExpertsPath::ALL {
            let o = CudaOptions::from_source(&[(MOE_EXPERTS_VAR, p.name())])?;
            assert_eq!(o.moe_experts, Some(p));
            assert_eq!(p.name().parse::<MoeExpertsPath>()?, p);
        }
        for t in MoeTileSize::ALL {
            let o = CudaOptions::from_source(&[(MOE_TILE_VAR, t.name())])?;
            assert_eq!(o.moe_tile, Some(t));
            assert_eq!(t.name().parse::<MoeTileSize>()?, t);
            assert_eq!(t.tile().name, t.name());
        }
        assert_eq!(MoeTileSize::ALL.len(), tandem_gpu_kernels::MOE_TILES.len());
        refused(
            &[(MOE_EXPERTS_VAR, "cublas")],
            MOE_EXPERTS_VAR,
            "cublas",
            &["blaslt", "grouped", "wgmma"],
        );
        refused(
            &[(MOE_TILE_VAR, "xl")],
            MOE_TILE_VAR,
            "xl",
            &["l", "m", "s"],
        );
        for r in MoeWsTile::ALL {
            let o = CudaOptions::from_source(&[(MOE_WS_TILE_VAR, r.name())])?;
            assert_eq!(o.moe_ws_tile, Some(r));
            assert!(r.name().starts_with(&r.block().block_m().to_string()));
        }
        refused(
            &[(MOE_WS_TILE_VAR, "256")],
            MOE_WS_TILE_VAR,
            "256",
            &["128", "128-s4", "192", "192-s4", "128-s4-c2", "192-s4-c2"],
        );
        for k in RouteKernel::ALL {
            let o = CudaOptions::from_source(&[(ROUTE_KERNEL_VAR, k.name())])?;
            assert_eq!(o.route_kernel, Some(k));
            assert_eq!(k.name().parse::<RouteKernel>()?, k);
        }
        refused(
            &[(ROUTE_KERNEL_VAR, "fused-3")],
            ROUTE_KERNEL_VAR,
            "fused-3",
            &["fused", "fused-2", "fused-1", "fused-memset", "three"],
        );
        let o = CudaOptions::from_source(&[(DECODE_CHUNKS_VAR, " 12 ")])?;
        assert_eq!(o.decode_chunks, Some(12));
        for bad in ["0", "4097", "-3", "many"] {
            let e = CudaOptions::from_source(&[(DECODE_CHUNKS_VAR, bad)]).expect_err(bad);
            assert_eq!(
                e.to_string(),
                format!("{DECODE_CHUNKS_VAR}: '{bad}' is not a chunk count (accepted: 1 to 4096)")
            );
        }
        let o = CudaOptions::from_source(&[(DECODE_RING_VAR, "16K-S3")])?;
        let ring = o.decode_ring.expect("a ring");
        assert_eq!(
            (ring.tile_elems, ring.stages, ring.paged_stages),
            (8192, 3, 3)
        );
        assert_eq!(ring.keys_per_tile(128, 4), 64);
        assert_eq!(ring.smem_bytes(128, 4, false), 96 * 1024);
        let o = CudaOptions::from_source(&[(DECODE_RING_VAR, "16k-s4-p3")])?;
        assert_eq!(
            o.decode_ring,
            Some(tandem_gpu_kernels::DecodeRing::default())
        );
        let o = CudaOptions::from_source(&[(DECODE_RING_VAR, "8k-s4")])?;
        let ring = o.decode_ring.expect("a ring");
        assert_eq!(
            (ring.tile_elems, ring.stages, ring.paged_stages),
            (4096, 4, 4)
        );
        for (bad, why) in [
            ("16k", "no '<KiB>k-s<stages>' form"),
            (
                "12k-s3",
                "a K tile of 6144 elements is not one of [4096, 8192, 16384]",
            ),
            (
                "32k-s4",
                "4 stages of 16384 elements take 256 KiB, outside 9 to 227 KiB of shared memory",
            ),
            (
                "16k-s3-p8",
                "8 stages of 8192 elements take 256 KiB, outside 9 to 227 KiB of shared memory",
            ),
            ("8k-s1", "1 stages are fewer than 2"),
            ("8k-sx", "'x' is not a stage count"),
            ("8k-s4-p", "'' is not a stage count"),
        ] {
            let e = CudaOptions::from_source(&[(DECODE_RING_VAR, bad)]).expect_err(bad);
            assert_eq!(
                e.to_string(),
                format!(
                    "{DECODE_RING_VAR}: '{bad}' is not a decode ring: {why} (accepted: <8, 16 or 32>k-s<stages>[-p<paged stages>], e.g. 8k-s4, 16k-s3, 16k-s4-p3, 32k-s2)"
                )
            );
        }
        let e = "xl".parse::<MoeTileSize>().expect_err("xl");
        assert_eq!(
            e.to_string(),
            "MoE tile: 'xl' is not a MoE tile (accepted: l, m, s)"
        );
        Ok(())
    }

    #[test]
    fn folders() -> Result<()> {
        let dir = std::env::temp_dir();
        let d = dir.to_str().ok_or(Error::Internal("temp dir".into()))?;
        let o = CudaOptions::from_source(&[
            (KERNEL_DIR_VAR, d),
            ("CUDA_HOME", "/opt/cuda"),
            ("CUDA_PATH", "/usr/cuda"),
            ("VIRTUAL_ENV", "/venv"),
        ])?;
        assert_eq!(o.kernel_dir.as_deref(), Some(dir.as_path()));
        assert_eq!(
            o.toolkit_roots,
            vec![PathBuf::from("/opt/cuda"), PathBuf::from("/usr/cuda")]
        );
        assert_eq!(o.python_prefix.as_deref(), Some(Path::new("/venv")));
        let e = CudaOptions::from_source(&[(KERNEL_DIR_VAR, "/no/such/folder")])
            .expect_err("missing folder");
        assert_eq!(
            e.to_string(),
            "TANDEM_KERNEL_DIR: '/no/such/folder' is not a folder (accepted: a folder laid out like gpu-kernels/src/cuda/)"
        );
        Ok(())
    }

    #[test]
    fn machine_reads_only_where_things_are() -> Result<()> {
        let env = [
            ("CUDA_HOME", "/opt/cuda"),
            ("VIRTUAL_ENV", "/venv"),
            ("HOME", "/h"),
            ("TANDEM_CUDA_DTYPE", "f8"),
            (ATTENTION_VARIANT_VAR, "w4"),
            (POISON_VAR, "1"),
        ];
        let m = CudaOptions::machine(&env);
        assert_eq!(m.toolkit_roots, vec![PathBuf::from("/opt/cuda")]);
        assert_eq!(m.python_prefix.as_deref(), Some(Path::new("/venv")));
        assert_eq!(m.cache_dir, Path::new("/h/.cache/tandem/cuda"));
        assert_eq!(
            CudaOptions {
                toolkit_roots: Vec::new(),
                python_prefix: None,
                cache_dir: default_cache_dir(),
                ..m
            },
            CudaOptions::default()
        );
        Ok(())
    }

    #[test]
    fn cache_dir_order() -> Result<()> {
        let all = [
            (CACHE_DIR_VAR, "/c"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ];
        let at = |env: &dyn Env| CudaOptions::from_source(env).map(|o| o.cache_dir);
        assert_eq!(at(&all)?, Path::new("/c/cuda"));
        assert_eq!(
            at(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])?,
            Path::new("/x/tandem/cuda")
        );
        assert_eq!(at(&[("HOME", "/h")])?, Path::new("/h/.cache/tandem/cuda"));
        assert_eq!(at(&[("HOME", "")])?, default_cache_dir());
        Ok(())
    }
}
