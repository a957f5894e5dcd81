//! CUDA C++ sources of tandem's GPU kernels, embedded at build time, and their catalog.
//!
//! The host's CUDA backend compiles these with NVRTC at first use. Kernel entry points are
//! named `{op}_{precision}[_{variant}]` (for example `mha_bf16_fwd_d128`, `rmsnorm_f16`).
//! Kernels on 16-bit storage are C++ templates over the storage (`BF16` / `F16` of
//! `common.cuh`) with one entry point per [`Storage`]: [`kernel`] finds the one to launch.
//! Sources are laid out per architecture: `common/` (helpers and kernels any sm_80+ runs),
//! `sm80/` (mma.sync main loops), `sm90a/` (Hopper-only main loops: wgmma attention).
//!
//! Each [`Module`] is compiled as one NVRTC program: the shared header `common/common.cuh`
//! followed by the module's own file, so no kernel needs a system header.

use std::borrow::Cow;
use std::path::Path;

use sha2::{Digest, Sha256};

/// The shared helpers every module starts with.
pub const COMMON_HEADER: &str = include_str!("cuda/common/common.cuh");
/// The Hopper building blocks (TMA, mbarriers, wgmma) the sm_90a modules take after
/// [`COMMON_HEADER`].
pub const HOPPER_HEADER: &str = include_str!("cuda/sm90a/hopper.cuh");

/// A compilation unit: one `.cu` file and the entry points it defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Module {
    /// Add, head split/merge, SiLU, poison fill, MoE experts' gather/SwiGLU/combine, casts.
    Elementwise,
    /// RMSNorm (+ residual).
    Norm,
    /// Rotary embedding.
    Rope,
    /// MoE routing: top-k softmax, align scan and scatter.
    MoeRoute,
    /// FlashAttention-2-style forward on mma.sync (sm_80 and later), bf16 and f16.
    AttentionSm80,
    /// Hopper forward in FlashAttention-3's structure (sm_90a only): a TMA producer warp and
    /// two consumer warpgroups taking turns on wgmma (`_ws`).
    AttentionSm90aWs,
    /// MoE experts as grouped GEMMs on mma.sync over the routing's padded permutation: tile
    /// map, gate/up GEMM with fused SwiGLU, down GEMM, weighted combine (bf16 and f16).
    MoeExpertsSm80,
    /// Decode attention (flash-decoding split-KV on CUDA cores, any sm_80+): per-chunk
    /// partials over a contiguous or paged KV cache, merged by LSE (bf16 and f16).
    AttentionDecode,
    /// MoE experts on Hopper (sm_90a only): persistent grouped GEMMs on wgmma fed by TMA,
    /// tiles found from the device-side expert offsets (gate/up with SwiGLU in the epilogue,
    /// down writing one row per slot).
    MoeExpertsSm90a,
}

impl Module {
    /// Every module.
    pub const ALL: [Module; 9] = [
        Module::Elementwise,
        Module::Norm,
        Module::Rope,
        Module::MoeRoute,
        Module::AttentionSm80,
        Module::AttentionSm90aWs,
        Module::MoeExpertsSm80,
        Module::AttentionDecode,
        Module::MoeExpertsSm90a,
    ];

    /// Short name (used in cache file names and logs).
    pub fn name(self) -> &'static str {
        match self {
            Module::Elementwise => "elementwise",
            Module::Norm => "norm",
            Module::Rope => "rope",
            Module::MoeRoute => "moe_route",
            Module::AttentionSm80 => "attention_sm80",
            Module::AttentionSm90aWs => "attention_sm90a_ws",
            Module::MoeExpertsSm80 => "moe_experts_sm80",
            Module::AttentionDecode => "attention_decode",
            Module::MoeExpertsSm90a => "moe_experts_sm90a",
        }
    }

    /// Path of the module's file under `gpu-kernels/src/cuda/`.
    pub fn path(self) -> &'static str {
        match self {
            Module::Elementwise => "common/elementwise.cu",
            Module::Norm => "common/norm.cu",
            Module::Rope => "common/rope.cu",
            Module::MoeRoute => "common/moe_route.cu",
            Module::AttentionSm80 => "sm80/attention.cu",
            Module::AttentionSm90aWs => "sm90a/attention_ws.cu",
            Module::MoeExpertsSm80 => "sm80/moe_experts.cu",
            Module::AttentionDecode => "common/attention_decode.cu",
            Module::MoeExpertsSm90a => "sm90a/moe_experts_ws.cu",
        }
    }

    /// The module's own source (without the common header).
    pub fn body(self) -> &'static str {
        match self {
            Module::Elementwise => include_str!("cuda/common/elementwise.cu"),
            Module::Norm => include_str!("cuda/common/norm.cu"),
            Module::Rope => include_str!("cuda/common/rope.cu"),
            Module::MoeRoute => include_str!("cuda/common/moe_route.cu"),
            Module::AttentionSm80 => include_str!("cuda/sm80/attention.cu"),
            Module::AttentionSm90aWs => include_str!("cuda/sm90a/attention_ws.cu"),
            Module::MoeExpertsSm80 => include_str!("cuda/sm80/moe_experts.cu"),
            Module::AttentionDecode => include_str!("cuda/common/attention_decode.cu"),
            Module::MoeExpertsSm90a => include_str!("cuda/sm90a/moe_experts_ws.cu"),
        }
    }

    /// The module's source as compiled: the embedded text, or, when `dir` names a folder laid
    /// out like `gpu-kernels/src/cuda/` (the host's `TANDEM_KERNEL_DIR`), the file there (for
    /// working on a kernel without rebuilding the host; the disk cache is keyed by the text,
    /// so an edited file is recompiled). A file missing in `dir` is taken from the embedded
    /// sources.
    pub fn text(self, dir: Option<&Path>) -> Cow<'static, str> {
        read_or(dir, self.path(), self.body())
    }

    /// The full source handed to NVRTC: the common header, then the module's file, each read
    /// from `dir` where it is given and holds the file (see [`Module::text`]).
    pub fn source(self, dir: Option<&Path>) -> String {
        let header = read_or(dir, "common/common.cuh", COMMON_HEADER);
        let mut s = format!("// common/common.cuh\n{header}\n");
        if self.min_arch() >= 90 {
            let hopper = read_or(dir, "sm90a/hopper.cuh", HOPPER_HEADER);
            s.push_str(&format!("// sm90a/hopper.cuh\n{hopper}\n"));
        }
        s.push_str(&format!("// {}\n{}", self.path(), self.text(dir)));
        s
    }

    /// The lowest compute capability (major * 10 + minor) the module runs on.
    pub fn min_arch(self) -> u32 {
        match self {
            Module::AttentionSm90aWs | Module::MoeExpertsSm90a => 90,
            _ => 80,
        }
    }

    /// Whether the module runs on a device of compute capability `arch` (sm_90a code runs on
    /// sm_90 only).
    pub fn runs_on(self, arch: u32) -> bool {
        match self {
            Module::AttentionSm90aWs | Module::MoeExpertsSm90a => arch == 90,
            _ => arch >= 80,
        }
    }

    /// Entry points the module defines.
    pub fn entry_points(self) -> &'static [&'static str] {
        match self {
            Module::Elementwise => &[
                "add_bf16",
                "add_f16",
                "split_heads_bf16",
                "split_heads_f16",
                "merge_heads_bf16",
                "merge_heads_f16",
                "silu_bf16",
                "silu_f16",
                "fill_u16",
                "moe_gather_bf16",
                "moe_gather_f16",
                "moe_swiglu_bf16",
                "moe_swiglu_f16",
                "moe_inverse_i32",
                "moe_combine_bf16",
                "moe_combine_f16",
                "cast_f32_bf16",
                "cast_f32_f16",
                "cast_bf16_f32",
                "cast_f16_f32",
            ],
            Module::Norm => &[
                "rmsnorm_bf16",
                "rmsnorm_f16",
                "rmsnorm_bf16_scalar",
                "rmsnorm_f16_scalar",
            ],
            Module::Rope => &[
                "rope_bf16",
                "rope_f16",
                "rope_bf16_scalar",
                "rope_f16_scalar",
            ],
            Module::MoeRoute => &[
                "moe_route_fused_f32_v1",
                "moe_route_fused_f32_v2",
                "moe_route_fused_f32_v4",
                "moe_route_fused_f32_v8",
                "moe_route_fused_bf16_v1",
                "moe_route_fused_bf16_v2",
                "moe_route_fused_bf16_v4",
                "moe_route_fused_bf16_v8",
                "moe_route_fused_f16_v1",
                "moe_route_fused_f16_v2",
                "moe_route_fused_f16_v4",
                "moe_route_fused_f16_v8",
                "moe_route_fused_f32_v1_g",
                "moe_route_fused_f32_v2_g",
                "moe_route_fused_f32_v4_g",
                "moe_route_fused_f32_v8_g",
                "moe_route_fused_bf16_v1_g",
                "moe_route_fused_bf16_v2_g",
                "moe_route_fused_bf16_v4_g",
                "moe_route_fused_bf16_v8_g",
                "moe_route_fused_f16_v1_g",
                "moe_route_fused_f16_v2_g",
                "moe_route_fused_f16_v4_g",
                "moe_route_fused_f16_v8_g",
                "moe_topk_softmax_f32",
                "moe_topk_softmax_f32_f16",
                "moe_topk_softmax_f32_f32",
                "moe_align_scan",
                "moe_align_scatter",
            ],
            Module::AttentionSm80 => &[
                "mha_bf16_fwd_d64",
                "mha_bf16_fwd_d128",
                "mha_bf16_fwd_d64_w8",
                "mha_bf16_fwd_d128_w8",
                "mha_bf16_fwd_d64_m2",
                "mha_bf16_fwd_d128_m2",
                "mha_bf16_fwd_d64_m2n32",
                "mha_bf16_fwd_d128_m2n32",
                "mha_bf16_fwd_d256",
                "mha_bf16_fwd_d256_w8",
                "mha_f16_fwd_d64",
                "mha_f16_fwd_d128",
                "mha_f16_fwd_d64_w8",
                "mha_f16_fwd_d128_w8",
                "mha_f16_fwd_d64_m2",
                "mha_f16_fwd_d128_m2",
                "mha_f16_fwd_d64_m2n32",
                "mha_f16_fwd_d128_m2n32",
                "mha_f16_fwd_d256",
                "mha_f16_fwd_d256_w8",
            ],
            Module::AttentionSm90aWs => &[
                "mha_bf16_fwd_d64_ws",
                "mha_bf16_fwd_d128_ws",
                "mha_bf16_fwd_d256_ws",
                "mha_f16_fwd_d64_ws",
                "mha_f16_fwd_d128_ws",
                "mha_f16_fwd_d256_ws",
            ],
            Module::MoeExpertsSm80 => &[
                "moe_tile_map",
                "moe_gemm_swiglu_bf16_l",
                "moe_gemm_swiglu_bf16_m",
                "moe_gemm_swiglu_bf16_s",
                "moe_gemm_down_bf16_l",
                "moe_gemm_down_bf16_m",
                "moe_gemm_down_bf16_s",
                "moe_gemm_swiglu_f16_l",
                "moe_gemm_swiglu_f16_m",
                "moe_gemm_swiglu_f16_s",
                "moe_gemm_down_f16_l",
                "moe_gemm_down_f16_m",
                "moe_gemm_down_f16_s",
                "moe_combine_slots_bf16",
                "moe_combine_slots_f16",
            ],
            Module::MoeExpertsSm90a => &[
                "moe_ws_swiglu_bf16",
                "moe_ws_down_bf16",
                "moe_ws_swiglu_f16",
                "moe_ws_down_f16",
                "moe_ws_s4_swiglu_bf16",
                "moe_ws_s4_down_bf16",
                "moe_ws_s4_swiglu_f16",
                "moe_ws_s4_down_f16",
                "moe_ws3_swiglu_bf16",
                "moe_ws3_down_bf16",
                "moe_ws3_swiglu_f16",
                "moe_ws3_down_f16",
                "moe_ws3_s4_swiglu_bf16",
                "moe_ws3_s4_down_bf16",
                "moe_ws3_s4_swiglu_f16",
                "moe_ws3_s4_down_f16",
                "moe_ws_s4_c2_swiglu_bf16",
                "moe_ws_s4_c2_down_bf16",
                "moe_ws_s4_c2_swiglu_f16",
                "moe_ws_s4_c2_down_f16",
                "moe_ws3_s4_c2_swiglu_bf16",
                "moe_ws3_s4_c2_down_bf16",
                "moe_ws3_s4_c2_swiglu_f16",
                "moe_ws3_s4_c2_down_f16",
                "moe_ws_swiglu_e4m3_bf16",
                "moe_ws_down_e4m3_bf16",
                "moe_ws_swiglu_e4m3_f16",
                "moe_ws_down_e4m3_f16",
                "moe_ws_s4_swiglu_e4m3_bf16",
                "moe_ws_s4_down_e4m3_bf16",
                "moe_ws_s4_swiglu_e4m3_f16",
                "moe_ws_s4_down_e4m3_f16",
                "moe_quant_e4m3_bf16",
                "moe_quant_e4m3_f16",
            ],
            Module::AttentionDecode => &[
                "attn_decode_bf16_d64_r1",
                "attn_decode_bf16_d64_r2",
                "attn_decode_bf16_d64_r4",
                "attn_decode_bf16_d64_r8",
                "attn_decode_paged_bf16_d64_r1",
                "attn_decode_paged_bf16_d64_r2",
                "attn_decode_paged_bf16_d64_r4",
                "attn_decode_paged_bf16_d64_r8",
                "attn_decode_merge_bf16_d64",
                "attn_decode_bf16_d128_r1",
                "attn_decode_bf16_d128_r2",
                "attn_decode_bf16_d128_r4",
                "attn_decode_bf16_d128_r8",
                "attn_decode_paged_bf16_d128_r1",
                "attn_decode_paged_bf16_d128_r2",
                "attn_decode_paged_bf16_d128_r4",
                "attn_decode_paged_bf16_d128_r8",
                "attn_decode_merge_bf16_d128",
                "attn_decode_bf16_d256_r1",
                "attn_decode_bf16_d256_r2",
                "attn_decode_bf16_d256_r4",
                "attn_decode_bf16_d256_r8",
                "attn_decode_paged_bf16_d256_r1",
                "attn_decode_paged_bf16_d256_r2",
                "attn_decode_paged_bf16_d256_r4",
                "attn_decode_paged_bf16_d256_r8",
                "attn_decode_merge_bf16_d256",
                "attn_decode_f16_d64_r1",
                "attn_decode_f16_d64_r2",
                "attn_decode_f16_d64_r4",
                "attn_decode_f16_d64_r8",
                "attn_decode_paged_f16_d64_r1",
                "attn_decode_paged_f16_d64_r2",
                "attn_decode_paged_f16_d64_r4",
                "attn_decode_paged_f16_d64_r8",
                "attn_decode_merge_f16_d64",
                "attn_decode_f16_d128_r1",
                "attn_decode_f16_d128_r2",
                "attn_decode_f16_d128_r4",
                "attn_decode_f16_d128_r8",
                "attn_decode_paged_f16_d128_r1",
                "attn_decode_paged_f16_d128_r2",
                "attn_decode_paged_f16_d128_r4",
                "attn_decode_paged_f16_d128_r8",
                "attn_decode_merge_f16_d128",
                "attn_decode_f16_d256_r1",
                "attn_decode_f16_d256_r2",
                "attn_decode_f16_d256_r4",
                "attn_decode_f16_d256_r8",
                "attn_decode_paged_f16_d256_r1",
                "attn_decode_paged_f16_d256_r2",
                "attn_decode_paged_f16_d256_r4",
                "attn_decode_paged_f16_d256_r8",
                "attn_decode_merge_f16_d256",
            ],
        }
    }

    /// The module that defines an entry point.
    pub fn of_kernel(kernel: &str) -> Option<Module> {
        Module::ALL
            .into_iter()
            .find(|m| m.entry_points().contains(&kernel))
    }

    /// sha256 of the full source (read as [`Module::source`] does), hex.
    pub fn source_hash(self, dir: Option<&Path>) -> String {
        hex(&Sha256::digest(self.source(dir).as_bytes()))
    }
}

/// The file `rel` of `dir`, or `embedded` where no folder is given or the file cannot be read.
fn read_or(dir: Option<&Path>, rel: &str, embedded: &'static str) -> Cow<'static, str> {
    match dir.map(|d| std::fs::read_to_string(d.join(rel))) {
        Some(Ok(s)) => Cow::Owned(s),
        _ => Cow::Borrowed(embedded),
    }
}

/// A 16-bit storage precision of the kernels: the template argument of the storage-generic
/// kernels, and the `{s}` in their entry-point names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Storage {
    /// bfloat16 (`BF16` in common.cuh).
    Bf16,
    /// IEEE binary16 (`F16` in common.cuh).
    F16,
}

impl Storage {
    /// Both storages.
    pub const ALL: [Storage; 2] = [Storage::Bf16, Storage::F16];

    /// The name in entry points: `bf16` or `f16`.
    pub fn name(self) -> &'static str {
        match self {
            Storage::Bf16 => "bf16",
            Storage::F16 => "f16",
        }
    }
}

/// The entry point `pattern` names for storage `s`, with `{s}` replaced by `bf16` or `f16`
/// (`kernel("rmsnorm_{s}_scalar", Storage::F16)` is `Some("rmsnorm_f16_scalar")`); `None` when
/// no module defines it.
pub fn kernel(pattern: &str, s: Storage) -> Option<&'static str> {
    let name = pattern.replace("{s}", s.name());
    Module::ALL
        .into_iter()
        .flat_map(|m| m.entry_points().iter().copied())
        .find(|e| *e == name)
}

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Tokens per block of `moe_topk_softmax_f32` (ROUTE_TPB in moe_route.cu).
pub const ROUTE_TOKENS_PER_BLOCK: usize = 64;
/// Threads per block of `moe_topk_softmax_f32`.
pub const ROUTE_THREADS: u32 = 256;
/// Largest expert count the routing kernels take (32 lanes x 8 logits).
pub const ROUTE_MAX_EXPERTS: usize = 256;
/// Key rows per attention tile of the default builds (ATT_BN in attention.cu; `_n32` builds
/// use 32).
pub const ATTENTION_BLOCK_N: usize = 64;
/// Consumer warpgroups (64 query rows each) of the `_ws` attention builds for head dims 256,
/// 128 and 64 (WS_NC_D256, WS_NC_D128, WS_NC_D64 in sm90a/attention_ws.cu); one producer
/// warpgroup beside them.
pub const ATTENTION_WS_CONSUMERS: [(usize, usize); 3] = [(256, 2), (128, 2), (64, 3)];
/// Key rows per tile of the `_ws` builds for head dims 256, 128 and 64 (WS_BN_D256,
/// WS_BN_D128, WS_BN_D64), also the rows of their K and V TMA boxes.
pub const ATTENTION_WS_BLOCK_N: [(usize, usize); 3] = [(256, 80), (128, 176), (64, 128)];

fn per_head_dim(table: &[(usize, usize)], d: usize, default: usize) -> usize {
    table
        .iter()
        .find(|(hd, _)| *hd == d)
        .map_or(default, |(_, v)| *v)
}

/// Query rows per block of the `_ws` build for head dim `d` (64 per consumer warpgroup).
pub fn attention_ws_block_m(d: usize) -> usize {
    64 * per_head_dim(&ATTENTION_WS_CONSUMERS, d, 2)
}

/// Threads per block of the `_ws` build for head dim `d`: the producer and the consumers.
pub fn attention_ws_threads(d: usize) -> u32 {
    128 * (1 + per_head_dim(&ATTENTION_WS_CONSUMERS, d, 2)) as u32
}

/// Key rows per tile of the `_ws` build for head dim `d`.
pub fn attention_ws_block_n(d: usize) -> usize {
    per_head_dim(&ATTENTION_WS_BLOCK_N, d, 128)
}

/// Dynamic shared memory of a `_ws` build for head dim `d` and `bn`-key tiles (WsLayout in
/// attention_ws.cu): Q, two K and two V stages, the mbarriers, and slack for 1024-byte
/// alignment.
pub fn attention_ws_smem(d: usize, bn: usize) -> usize {
    attention_ws_block_m(d) * d * 2 + 4 * bn * d * 2 + 128 + 1024
}

/// Rows of a Hopper MoE experts tile each consumer warpgroup takes (MWS_WG_ROWS in
/// sm90a/moe_experts_ws.cu).
pub const MOE_WS_WG_ROWS: usize = 64;

/// A block shape of the Hopper MoE experts GEMMs (sm90a/moe_experts_ws.cu): how many consumer
/// warpgroups share a tile, each taking 64 of its rows, beside one producer warpgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeWsBlock {
    /// Two consumers, 128-row tiles, 384 threads (`moe_ws_*`; the FP8 builds too).
    Two,
    /// Two consumers with a 4-stage ring (`moe_ws_s4_*`, bf16/f16 only).
    TwoDeep,
    /// Three consumers, 192-row tiles, 512 threads (`moe_ws3_*`, bf16/f16 only): a fifth less
    /// operand traffic per product than `Two`, more padding on an expert's last tile.
    Three,
    /// Three consumers with a 4-stage ring (`moe_ws3_s4_*`, bf16/f16 only).
    ThreeDeep,
    /// `TwoDeep` in clusters of two blocks (`moe_ws_s4_c2_*`): the pair takes two 128-row
    /// tiles of one expert and n-tile, each block loads one of a stage's two weight tiles and
    /// multicasts it into both, so each reads half the weight bytes from L2; an expert's odd
    /// last tile is taken with two n-tiles at a time instead, each block loading its own.
    TwoDeepPair,
    /// `ThreeDeep` in clusters of two blocks (`moe_ws3_s4_c2_*`).
    ThreeDeepPair,
}

impl MoeWsBlock {
    /// Every build.
    pub const ALL: [MoeWsBlock; 6] = [
        Self::Two,
        Self::TwoDeep,
        Self::Three,
        Self::ThreeDeep,
        Self::TwoDeepPair,
        Self::ThreeDeepPair,
    ];

    /// Consumer warpgroups.
    pub const fn consumers(self) -> usize {
        match self {
            Self::Two | Self::TwoDeep | Self::TwoDeepPair => 2,
            Self::Three | Self::ThreeDeep | Self::ThreeDeepPair => 3,
        }
    }

    /// Stages of the TMA ring.
    pub const fn stages(self) -> usize {
        match self {
            Self::TwoDeep | Self::ThreeDeep | Self::TwoDeepPair | Self::ThreeDeepPair => 4,
            Self::Two | Self::Three => MOE_WS_STAGES,
        }
    }

    /// Blocks a cluster (`__cluster_dims__`): 2 for the pair builds, else 1.
    pub const fn cluster(self) -> usize {
        match self {
            Self::TwoDeepPair | Self::ThreeDeepPair => 2,
            _ => 1,
        }
    }

    /// The same tile and ring in one block (a pair build's own block; the others themselves).
    pub const fn single(self) -> Self {
        match self {
            Self::TwoDeepPair => Self::TwoDeep,
            Self::ThreeDeepPair => Self::ThreeDeep,
            other => other,
        }
    }

    /// Rows of a tile (one block's share).
    pub const fn block_m(self) -> usize {
        MOE_WS_WG_ROWS * self.consumers()
    }

    /// Threads per block: the producer warpgroup and the consumers.
    pub const fn threads(self) -> u32 {
        128 * (1 + self.consumers() as u32)
    }

    /// Dynamic shared memory (MwsLayout::BYTES): the ring (each stage a `block_m` x 128-byte
    /// activation tile and two 128 x 128-byte weight tiles), the mbarriers, in the pair builds
    /// their table of units per expert (`MOE_WS_MAX_EXPERTS + 1` ints), and slack for
    /// 1024-byte alignment.
    pub const fn smem(self) -> usize {
        let table = if self.cluster() > 1 {
            4 * (MOE_WS_MAX_EXPERTS + 1)
        } else {
            0
        };
        self.stages() * (self.block_m() * 128 + 2 * MOE_WS_BLOCK_N * 128)
            + 2 * 8 * self.stages()
            + table
            + 1024
    }

    /// The entry points' prefix: `moe_ws`, `moe_ws_s4`, `moe_ws3`, `moe_ws3_s4`,
    /// `moe_ws_s4_c2` or `moe_ws3_s4_c2` (then `_swiglu_{s}` / `_down_{s}`).
    pub const fn prefix(self) -> &'static str {
        match self {
            Self::Two => "moe_ws",
            Self::TwoDeep => "moe_ws_s4",
            Self::Three => "moe_ws3",
            Self::ThreeDeep => "moe_ws3_s4",
            Self::TwoDeepPair => "moe_ws_s4_c2",
            Self::ThreeDeepPair => "moe_ws3_s4_c2",
        }
    }
}

/// Output columns of a tile of the Hopper gate/up GEMM (MWS_BN): 128 gate and 128 up weight
/// rows give 128 SwiGLU columns. The down GEMM's tiles are `2 * MOE_WS_BLOCK_N` wide.
pub const MOE_WS_BLOCK_N: usize = 128;
/// Threads per block of `moe_quant_e4m3_{s}` (one block a row).
pub const MOE_QUANT_THREADS: u32 = 256;
/// Most experts the Hopper MoE experts GEMMs take (MWS_MAX_E, the range their tests cover).
pub const MOE_WS_MAX_EXPERTS: usize = 256;
/// Stages of their TMA ring in the default builds (MWS_STAGES).
pub const MOE_WS_STAGES: usize = 3;

/// Warps per block of the decode attention's partial kernels (DEC_WARPS in
/// attention_decode.cu).
pub const DECODE_WARPS: u32 = 4;
/// Query rows per block of the decode partial kernels (their `_r{RB}` suffix): the host
/// takes the smallest that holds a kv head's group (Hq/Hkv * Nq rows), else the largest and
/// several row groups.
pub const DECODE_ROW_BLOCKS: [usize; 4] = [1, 2, 4, 8];
/// Threads per block of the decode merge kernels.
pub const DECODE_MERGE_THREADS: u32 = 128;

/// Stages of the decode partial kernels' shared-memory ring of K/V tiles on a contiguous
/// cache, filled by cp.async (DEC_STAGES in attention_decode.cu): `DECODE_STAGES - 1` tiles in
/// flight, one block a SM.
pub const DECODE_STAGES: usize = 4;
/// Stages of that ring on a paged cache (DEC_PAGED_STAGES): two blocks a SM, so one block's
/// block-table reads overlap the other's copies.
pub const DECODE_PAGED_STAGES: usize = 3;
/// Elements of K, and as many of V, per stage of that ring (DEC_TILE_ELEMS): 16 KB each.
pub const DECODE_TILE_ELEMS: usize = 8192;
/// Elements of K (and of V) per stage of the heavy builds' ring (DEC_HEAVY_TILE_ELEMS: 8 query
/// rows, or d 256; see [`DecodeRing::heavy`]), whatever ring is set: 8 KB each.
pub const DECODE_HEAVY_TILE_ELEMS: usize = 4096;
/// Stages of the heavy builds' ring (DEC_HEAVY_STAGES): 64 KB a block.
pub const DECODE_HEAVY_STAGES: usize = 4;

/// The decode partial kernels' ring: elements of K (and as many of V) per stage and the
/// number of stages (contiguous and paged). The default is [`DECODE_TILE_ELEMS`] x
/// [`DECODE_STAGES`] ([`DECODE_PAGED_STAGES`] paged); another ring is built by compiling
/// attention_decode.cu with [`DecodeRing::defines`]. The heavy builds ([`DecodeRing::heavy`])
/// keep their own ring of [`DECODE_HEAVY_TILE_ELEMS`] x [`DECODE_HEAVY_STAGES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecodeRing {
    /// Elements of K per stage (as many of V): 4096, 8192 or 16384 (8, 16, 32 KiB of 16-bit
    /// values; 32, 64, 128 keys at d 128).
    pub tile_elems: usize,
    /// Stages of the ring on a contiguous cache (2 or more): `stages - 1` tiles in flight.
    pub stages: usize,
    /// Stages of the ring on a paged cache.
    pub paged_stages: usize,
}

impl Default for DecodeRing {
    fn default() -> Self {
        Self {
            tile_elems: DECODE_TILE_ELEMS,
            stages: DECODE_STAGES,
            paged_stages: DECODE_PAGED_STAGES,
        }
    }
}

impl DecodeRing {
    /// The K tile sizes a ring may take (elements).
    pub const TILE_ELEMS: [usize; 3] = [4096, 8192, 16384];
    /// Most dynamic shared memory a block may take on sm_80 and sm_90 (227 KiB).
    pub const MAX_SMEM: usize = 227 * 1024;
    /// Least a block's ring may hold: the merge of its warps reuses it (f32 accumulators,
    /// maxima and sums of 4 rows of d 128 per warp, the most of a build the ring applies to).
    pub const MERGE_BYTES: usize = DECODE_WARPS as usize * 4 * (128 + 2) * 4;

    /// Whether the build of head dim `d` and `rows` query rows a block is a heavy one (8 rows,
    /// or d 256 on the CUDA cores), which keeps the ring of [`DECODE_HEAVY_TILE_ELEMS`] x
    /// [`DECODE_HEAVY_STAGES`] (its math needs other blocks on the SM to hide it).
    pub fn heavy(d: usize, rows: usize) -> bool {
        rows == 8 || d == 256
    }

    /// The ring of `tile_elems` x `stages` (`paged_stages` on a paged cache), or why it cannot
    /// be built.
    pub fn new(tile_elems: usize, stages: usize, paged_stages: usize) -> Result<Self, String> {
        if !Self::TILE_ELEMS.contains(&tile_elems) {
            return Err(format!(
                "a K tile of {tile_elems} elements is not one of {:?}",
                Self::TILE_ELEMS
            ));
        }
        for n in [stages, paged_stages] {
            if n < 2 {
                return Err(format!("{n} stages are fewer than 2"));
            }
            let bytes = n * 2 * tile_elems * 2;
            if !(Self::MERGE_BYTES..=Self::MAX_SMEM).contains(&bytes) {
                return Err(format!(
                    "{n} stages of {tile_elems} elements take {} KiB, outside {} to {} KiB of shared memory",
                    bytes / 1024,
                    Self::MERGE_BYTES.div_ceil(1024),
                    Self::MAX_SMEM / 1024
                ));
            }
        }
        Ok(Self {
            tile_elems,
            stages,
            paged_stages,
        })
    }

    /// Keys a block of head dim `d` and `rows` query rows takes per tile (DecGeom::TK).
    pub fn keys_per_tile(&self, d: usize, rows: usize) -> usize {
        if Self::heavy(d, rows) {
            DECODE_HEAVY_TILE_ELEMS / d
        } else {
            self.tile_elems / d
        }
    }

    /// Stages of that block's ring, on a paged cache or not (NS in attention_decode.cu).
    pub fn stages_for(&self, d: usize, rows: usize, paged: bool) -> usize {
        if Self::heavy(d, rows) {
            DECODE_HEAVY_STAGES
        } else if paged {
            self.paged_stages
        } else {
            self.stages
        }
    }

    /// Dynamic shared memory of that block: the ring's stages of K and V tiles.
    pub fn smem_bytes(&self, d: usize, rows: usize, paged: bool) -> usize {
        self.stages_for(d, rows, paged) * 2 * self.keys_per_tile(d, rows) * d * 2
    }

    /// NVRTC options that build attention_decode.cu with this ring (none for the default).
    pub fn defines(&self) -> Vec<String> {
        if *self == Self::default() {
            return Vec::new();
        }
        vec![
            format!("-DDEC_TILE_ELEMS={}", self.tile_elems),
            format!("-DDEC_STAGES={}", self.stages),
            format!("-DDEC_PAGED_STAGES={}", self.paged_stages),
        ]
    }
}

/// 16-byte vectors per thread of `rmsnorm_bf16` (RMS_VPT in norm.cu).
pub const RMSNORM_VECTORS_PER_THREAD: usize = 4;
/// Threads of the one block of `moe_tile_map` (MOE_MAP_THREADS in moe_experts.cu).
pub const MOE_TILE_MAP_THREADS: u32 = 256;

/// A tile shape of the grouped MoE GEMMs (one `MOE_GEMM_ENTRY` line per GEMM and precision in
/// moe_experts.cu; a test checks they agree).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeTile {
    /// Suffix of the entry points (`moe_gemm_swiglu_bf16_{name}`, `moe_gemm_down_bf16_{name}`).
    pub name: &'static str,
    /// Permuted rows per block (one expert's).
    pub block_m: usize,
    /// Weight rows per block: output columns for the down GEMM; gate and up rows (half each)
    /// for the SwiGLU GEMM, so `block_n / 2` output columns there.
    pub block_n: usize,
    /// Depth of a k-tile.
    pub block_k: usize,
    /// Warps along M and along N.
    pub warps: (usize, usize),
    /// k-tiles in flight (cp.async stages).
    pub stages: usize,
}

impl MoeTile {
    /// Threads per block.
    pub const fn threads(&self) -> u32 {
        (32 * self.warps.0 * self.warps.1) as u32
    }

    /// Dynamic shared memory per block, bytes (rows padded to block_k + 8 elements).
    pub const fn shared_bytes(&self) -> usize {
        self.stages * (self.block_m + self.block_n) * (self.block_k + 8) * 2
    }
}

/// The tiles of the grouped MoE GEMMs: `l` for many tokens per expert, `m`, and `s` for
/// decode-sized batches (few rows per expert: the weights stream through deep k-tiles).
pub const MOE_TILES: [MoeTile; 3] = [
    MoeTile {
        name: "l",
        block_m: 128,
        block_n: 128,
        block_k: 32,
        warps: (2, 2),
        stages: 4,
    },
    MoeTile {
        name: "m",
        block_m: 64,
        block_n: 128,
        block_k: 32,
        warps: (2, 2),
        stages: 4,
    },
    MoeTile {
        name: "s",
        block_m: 32,
        block_n: 128,
        block_k: 64,
        warps: (1, 4),
        stages: 4,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_point_is_defined_in_its_source() {
        for m in Module::ALL {
            let src = m.source(None);
            for e in m.entry_points() {
                // defined directly, or by one of the modules' `*_ENTRY(name, ...)` macros
                let defined =
                    src.contains(&format!(" {e}(")) || src.contains(&format!("_ENTRY({e},"));
                assert!(defined, "{e} not found in {}", m.path());
                assert_eq!(Module::of_kernel(e), Some(m));
            }
        }
    }

    #[test]
    fn storage_generic_kernels_have_both_entry_points() {
        let generic = [
            "add_{s}",
            "split_heads_{s}",
            "merge_heads_{s}",
            "silu_{s}",
            "moe_gather_{s}",
            "moe_swiglu_{s}",
            "moe_combine_{s}",
            "cast_f32_{s}",
            "cast_{s}_f32",
            "rmsnorm_{s}",
            "rmsnorm_{s}_scalar",
            "rope_{s}",
            "rope_{s}_scalar",
        ];
        for s in Storage::ALL {
            for p in generic {
                let k = kernel(p, s).unwrap_or_else(|| panic!("{p} has no {} entry", s.name()));
                assert!(k.ends_with(s.name()) || k.contains(&format!("_{}_", s.name())));
            }
            for d in [64, 128] {
                for v in ["", "_w8", "_m2", "_m2n32"] {
                    let p = format!("mha_{{s}}_fwd_d{d}{v}");
                    assert!(kernel(&p, s).is_some(), "{p} for {}", s.name());
                }
            }
        }
        assert_eq!(kernel("rmsnorm_{s}", Storage::F16), Some("rmsnorm_f16"));
        assert_eq!(kernel("no_such_{s}", Storage::F16), None);
        assert_eq!(
            kernel("mha_{s}_fwd_d128_ws", Storage::F16),
            Some("mha_f16_fwd_d128_ws")
        );
        // every bf16 entry point has an f16 twin in its module
        for m in Module::ALL {
            for e in m.entry_points().iter().filter(|e| e.contains("bf16")) {
                let twin = e.replace("bf16", "f16");
                assert_eq!(Module::of_kernel(&twin), Some(m), "{twin}");
            }
        }
        assert_eq!(
            Module::of_kernel("moe_topk_softmax_f32_f16"),
            Some(Module::MoeRoute)
        );
    }

    #[test]
    fn constants_match_the_sources() {
        let route = Module::MoeRoute.body();
        assert!(route.contains("#define ROUTE_WARPS 8"));
        assert!(route.contains("#define ROUTE_TOKENS_PER_WARP 8"));
        assert!(route.contains("#define ROUTE_MAX_VPL 8"));
        assert_eq!(ROUTE_TOKENS_PER_BLOCK, 8 * 8);
        assert!(Module::AttentionSm80.body().contains("#define ATT_BN 64"));
        assert!(Module::Norm.body().contains("#define RMS_VPT 4"));
        let dec = Module::AttentionDecode.body();
        assert!(dec.contains(&format!("#define DEC_WARPS {DECODE_WARPS}")));
        assert!(dec.contains("__launch_bounds__(128) name("));
        assert_eq!(DECODE_MERGE_THREADS, 128);
        assert!(dec.contains(&format!("#define DEC_STAGES {DECODE_STAGES}")));
        assert!(dec.contains(&format!("#define DEC_PAGED_STAGES {DECODE_PAGED_STAGES}")));
        assert!(dec.contains(&format!("#define DEC_TILE_ELEMS {DECODE_TILE_ELEMS}")));
        assert!(dec.contains("TK = (HEAVY ? DEC_HEAVY_TILE_ELEMS : DEC_TILE_ELEMS) / D;"));
        assert!(dec.contains(&format!(
            "#define DEC_HEAVY_TILE_ELEMS {DECODE_HEAVY_TILE_ELEMS}"
        )));
        assert!(dec.contains(&format!("#define DEC_HEAVY_STAGES {DECODE_HEAVY_STAGES}")));
        assert!(dec.contains("#define DEC_HEAVY(D, RB) ((RB) == 8 || (D) == 256)"));
        assert!(dec.contains("STAGE = 2 * TK * D;"));
        assert!(
            dec.contains(
                "NS = G::HEAVY ? DEC_HEAVY_STAGES : PAGED ? DEC_PAGED_STAGES : DEC_STAGES;"
            )
        );
        // d128, up to 4 rows: 64-key tiles, 32 KB a stage; 128 KB a block contiguous (one a
        // SM), 96 KB paged (two fit 227 KB); the heavy builds 64 KB (as many as registers allow)
        let ring = DecodeRing::default();
        assert_eq!(ring.keys_per_tile(128, 4), 64);
        assert!(ring.defines().is_empty());
        for d in [64, 128, 256] {
            for rows in DECODE_ROW_BLOCKS {
                let heavy = DecodeRing::heavy(d, rows);
                for paged in [false, true] {
                    let smem = ring.smem_bytes(d, rows, paged);
                    let want = match (heavy, paged) {
                        (true, _) => 64,
                        (false, false) => 128,
                        (false, true) => 96,
                    };
                    assert_eq!(smem, want * 1024, "d {d} rows {rows} paged {paged}");
                }
            }
        }
        assert!(
            DecodeRing::heavy(256, 1) && DecodeRing::heavy(64, 8) && !DecodeRing::heavy(128, 4)
        );
        assert_eq!(DecodeRing::new(8192, 4, 3), Ok(ring));
        assert!(DecodeRing::new(16384, 4, 3).is_err());
        assert!(DecodeRing::new(4096, 4, 1).is_err());
        let ws = Module::AttentionSm90aWs.body();
        for (d, nc) in ATTENTION_WS_CONSUMERS {
            assert!(ws.contains(&format!("#define WS_NC_D{d} {nc}")));
        }
        for (d, bn) in ATTENTION_WS_BLOCK_N {
            assert!(ws.contains(&format!("#define WS_BN_D{d} {bn}")));
            assert!(attention_ws_smem(d, bn) <= 227 * 1024);
        }
        assert!(ws.contains("BYTES = BARS + 128 + 1024"));
        assert!(ws.contains("K = 64 * NC * D * 2"));
        assert!(
            Module::MoeExpertsSm80
                .body()
                .contains(&format!("#define MOE_MAP_THREADS {MOE_TILE_MAP_THREADS}"))
        );
    }

    #[test]
    fn the_hopper_experts_constants_match_their_source() {
        let src = Module::MoeExpertsSm90a.body();
        assert!(src.contains(&format!("#define MWS_WG_ROWS {MOE_WS_WG_ROWS}")));
        assert!(src.contains(&format!("#define MWS_BN {MOE_WS_BLOCK_N}")));
        assert!(src.contains(&format!("#define MWS_STAGES {MOE_WS_STAGES}")));
        assert!(src.contains(&format!("#define MWS_MAX_E {MOE_WS_MAX_EXPERTS}")));
        assert!(src.contains("#define MWS_BK 64"));
        assert!(src.contains("TILE_A = BM * 128;"));
        assert!(src.contains("STAGE = TILE_A + 2 * TILE_W;"));
        assert!(src.contains("BYTES = BARS + 2 * 8 * S + TABLE + 1024;"));
        assert!(src.contains("TABLE = CL > 1 ? 4 * (MWS_MAX_E + 1) : 0;"));
        assert!(src.contains("__launch_bounds__(128 * (CONS + 1), 1)"));
        assert!(src.contains("__cluster_dims__(2, 1, 1)"));
        // every block in both 16-bit precisions; the FP8 builds: the two-consumer blocks'
        let fp8 = [MoeWsBlock::Two, MoeWsBlock::TwoDeep];
        for (macro_name, elem, blocks) in [
            ("MWS_ENTRY", "", &MoeWsBlock::ALL[..]),
            ("MWS_FP8_ENTRY", "e4m3_", &fp8[..]),
        ] {
            for b in blocks {
                assert!(b.smem() <= 227 * 1024, "{b:?}: {} bytes", b.smem());
                for (gemm, swiglu) in [("swiglu", true), ("down", false)] {
                    for (prec, f16) in [("bf16", false), ("f16", true)] {
                        let macro_name = if b.cluster() == 2 {
                            "MWS_PAIR_ENTRY"
                        } else {
                            macro_name
                        };
                        let line = format!(
                            "{macro_name}({}_{gemm}_{elem}{prec}, {swiglu}, {f16}, {}, {})",
                            b.prefix(),
                            b.consumers(),
                            b.stages()
                        );
                        assert!(src.contains(&line), "missing: {line}");
                        let name = format!("{}_{gemm}_{elem}{prec}", b.prefix());
                        assert!(
                            Module::MoeExpertsSm90a
                                .entry_points()
                                .contains(&name.as_str()),
                            "not among the entry points: {name}"
                        );
                    }
                }
            }
        }
        // the Hopper header comes first in the sm_90a programs only
        assert!(Module::MoeExpertsSm90a.source(None).contains(HOPPER_HEADER));
        assert!(
            Module::AttentionSm90aWs
                .source(None)
                .contains(HOPPER_HEADER)
        );
        assert!(!Module::MoeExpertsSm80.source(None).contains(HOPPER_HEADER));
    }

    #[test]
    fn moe_tiles_match_the_entry_points() {
        let src = Module::MoeExpertsSm80.body();
        for t in MOE_TILES {
            for (prec, traits) in [("bf16", "MoeBf16"), ("f16", "MoeF16")] {
                for (gemm, swiglu) in [("swiglu", true), ("down", false)] {
                    let line = format!(
                        "MOE_GEMM_ENTRY(moe_gemm_{gemm}_{prec}_{}, {traits}, {}, {}, {}, {}, {}, {}, {swiglu})",
                        t.name, t.block_m, t.block_n, t.block_k, t.warps.0, t.warps.1, t.stages
                    );
                    assert!(src.contains(&line), "missing: {line}");
                }
            }
            assert!(t.shared_bytes() <= 227 * 1024);
        }
    }

    #[test]
    fn hashes_differ_between_modules() {
        let a = Module::Norm.source_hash(None);
        let b = Module::Rope.source_hash(None);
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
    }

    #[test]
    fn a_kernel_folder_replaces_the_files_it_holds() {
        let dir = std::env::temp_dir().join(format!("tandem-kernel-dir-{}", std::process::id()));
        let common = dir.join("common");
        std::fs::create_dir_all(&common).expect("temp folder");
        std::fs::write(common.join("norm.cu"), "// edited norm\n").expect("write");
        let d = Some(dir.as_path());
        assert_eq!(Module::Norm.text(d), "// edited norm\n");
        assert!(
            Module::Norm
                .source(d)
                .ends_with("// common/norm.cu\n// edited norm\n")
        );
        assert_ne!(Module::Norm.source_hash(d), Module::Norm.source_hash(None));
        // Files the folder lacks come from the embedded sources.
        assert!(Module::Norm.source(d).contains(COMMON_HEADER));
        assert_eq!(Module::Rope.text(d), Module::Rope.body());
        assert_eq!(Module::Rope.source(d), Module::Rope.source(None));
        std::fs::remove_dir_all(&dir).ok();
    }
}
