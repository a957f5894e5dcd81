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

use sha2::{Digest, Sha256};

/// The shared helpers every module starts with.
pub const COMMON_HEADER: &str = include_str!("cuda/common/common.cuh");

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
    /// Hopper forward (sm_90a only, bf16 only): S = QK^T on wgmma (`_wg`), and PV too (`_wg2`).
    AttentionSm90a,
}

impl Module {
    /// Every module.
    pub const ALL: [Module; 6] = [
        Module::Elementwise,
        Module::Norm,
        Module::Rope,
        Module::MoeRoute,
        Module::AttentionSm80,
        Module::AttentionSm90a,
    ];

    /// Short name (used in cache file names and logs).
    pub fn name(self) -> &'static str {
        match self {
            Module::Elementwise => "elementwise",
            Module::Norm => "norm",
            Module::Rope => "rope",
            Module::MoeRoute => "moe_route",
            Module::AttentionSm80 => "attention_sm80",
            Module::AttentionSm90a => "attention_sm90a",
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
            Module::AttentionSm90a => "sm90a/attention.cu",
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
            Module::AttentionSm90a => include_str!("cuda/sm90a/attention.cu"),
        }
    }

    /// Modules whose source this one is compiled after (shared device helpers).
    pub fn prelude(self) -> &'static [Module] {
        match self {
            Module::AttentionSm90a => &[Module::AttentionSm80],
            _ => &[],
        }
    }

    /// The full source handed to NVRTC: the common header, then the module's file.
    pub fn source(self) -> String {
        let mut s = format!("// common/common.cuh\n{COMMON_HEADER}\n");
        for m in self.prelude() {
            s.push_str(&format!("// {}\n{}\n", m.path(), m.body()));
        }
        s.push_str(&format!("// {}\n{}", self.path(), self.body()));
        s
    }

    /// The lowest compute capability (major * 10 + minor) the module runs on.
    pub fn min_arch(self) -> u32 {
        match self {
            Module::AttentionSm90a => 90,
            _ => 80,
        }
    }

    /// Whether the module runs on a device of compute capability `arch` (sm_90a code runs on
    /// sm_90 only).
    pub fn runs_on(self, arch: u32) -> bool {
        match self {
            Module::AttentionSm90a => arch == 90,
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
                "moe_topk_softmax_f32",
                "moe_topk_softmax_f32_f16",
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
                "mha_f16_fwd_d64",
                "mha_f16_fwd_d128",
                "mha_f16_fwd_d64_w8",
                "mha_f16_fwd_d128_w8",
                "mha_f16_fwd_d64_m2",
                "mha_f16_fwd_d128_m2",
                "mha_f16_fwd_d64_m2n32",
                "mha_f16_fwd_d128_m2n32",
            ],
            Module::AttentionSm90a => &[
                "mha_bf16_fwd_d64_wg",
                "mha_bf16_fwd_d128_wg",
                "mha_bf16_fwd_d64_wg2",
                "mha_bf16_fwd_d128_wg2",
                "mha_bf16_fwd_d64_wgs",
                "mha_bf16_fwd_d128_wgs",
                "mha_bf16_fwd_d64_wg2s",
                "mha_bf16_fwd_d128_wg2s",
                "mha_bf16_fwd_d64_wgx2",
                "mha_bf16_fwd_d128_wgx2",
            ],
        }
    }

    /// The module that defines an entry point.
    pub fn of_kernel(kernel: &str) -> Option<Module> {
        Module::ALL
            .into_iter()
            .find(|m| m.entry_points().contains(&kernel))
    }

    /// sha256 of the full source, hex.
    pub fn source_hash(self) -> String {
        hex(&Sha256::digest(self.source().as_bytes()))
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
/// Largest expert count the routing kernel takes (32 lanes x 8 logits).
pub const ROUTE_MAX_EXPERTS: usize = 256;
/// Key rows per attention tile of the default builds (ATT_BN in attention.cu; `_n32` builds
/// use 32).
pub const ATTENTION_BLOCK_N: usize = 64;
/// 16-byte vectors per thread of `rmsnorm_bf16` (RMS_VPT in norm.cu).
pub const RMSNORM_VECTORS_PER_THREAD: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_point_is_defined_in_its_source() {
        for m in Module::ALL {
            let src = m.source();
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
        // the Hopper builds are bf16 only
        assert_eq!(kernel("mha_{s}_fwd_d128_wg", Storage::F16), None);
        // outside the Hopper module, every bf16 entry point has an f16 twin in its module
        for m in Module::ALL
            .into_iter()
            .filter(|&m| m != Module::AttentionSm90a)
        {
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
    }

    #[test]
    fn hashes_differ_between_modules() {
        let a = Module::Norm.source_hash();
        let b = Module::Rope.source_hash();
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
    }
}
