//! The ops on a CUDA device: which ones run, their output storage, and the launches of each.

mod attention;
mod attention_decode;
mod basic;
mod linear;
mod moe;
pub(crate) mod moe_fp8;

use std::cell::RefCell;
use std::time::Instant;

use super::kernels::{Arg, Dims};
use super::memory::DevBuf;
use super::timing::Region;
use super::{CudaBackend, CudaDType, CudaStorage};
use crate::backend::Support;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::Op;
use crate::tensor::TensorMeta;

/// What an op implementation needs of its device.
pub struct Cx<'a> {
    /// The backend.
    pub be: &'a CudaBackend,
    /// A timed op's region and when it started (host clock, for the trace log), started by
    /// its first device work ([`Cx::work_stream`]), so the host's preparation before it (plans,
    /// allocations, argument packing) is not counted as device time while the GPU waits for it.
    region: Option<RefCell<Option<(Region, Instant)>>>,
}

/// A view of an input in the storage precision (or f32), converted on the device when stored
/// otherwise.
pub struct View {
    /// Device address.
    pub ptr: u64,
    _tmp: Option<CudaStorage>,
}

impl<'a> Cx<'a> {
    /// A context whose work is not timed on its own (preparation, poison fills, a block timed
    /// as a whole by its caller).
    pub fn new(be: &'a CudaBackend) -> Self {
        Self { be, region: None }
    }

    /// A context that times its op from the first device work it queues.
    pub fn timed(be: &'a CudaBackend) -> Self {
        Self {
            be,
            region: Some(RefCell::new(None)),
        }
    }

    /// The region the op's device work started, if it queued any, and when (host clock).
    pub fn into_region(self) -> Option<(Region, Instant)> {
        self.region.and_then(RefCell::into_inner)
    }

    /// The compute stream, to queue device work on: a timed context starts its region here,
    /// at the first call.
    pub fn work_stream(&self) -> Result<cudarc::driver::sys::CUstream> {
        if let Some(r) = &self.region {
            let mut r = r.borrow_mut();
            if r.is_none() {
                // Held (with `hold_stream`) before the region starts, let go once the op's
                // work is queued.
                self.be.hold_stream()?;
                *r = Some((self.be.timeline.begin(&self.be.dev)?, Instant::now()));
            }
        }
        Ok(self.be.dev.stream)
    }

    /// The precision float tensors are stored in on this device.
    pub fn dtype(&self) -> CudaDType {
        self.be.opts.dtype
    }

    /// The storage precision as a tensor dtype (BF16 or F16), for allocations.
    pub fn phys(&self) -> DType {
        self.dtype().dtype()
    }

    /// The entry point `pattern` names in this device's storage precision: `{s}` is replaced
    /// by `bf16` or `f16` (`cx.kernel("rmsnorm_{s}_scalar")`).
    pub fn kernel(&self, pattern: &str) -> Result<&'static str> {
        kernel_for(pattern, self.dtype())
    }

    /// Storage for `numel` elements of `phys`.
    pub fn alloc(&self, numel: usize, phys: DType) -> Result<CudaStorage> {
        Ok(CudaStorage::new(
            self.be.pool.alloc(numel * phys.size())?,
            phys,
        ))
    }

    /// Scratch memory (returned to the pool, in stream order, when dropped).
    pub fn scratch(&self, bytes: usize) -> Result<DevBuf> {
        self.be.pool.alloc(bytes)
    }

    /// Launches a kernel on the compute stream.
    pub fn k(&self, name: &'static str, dims: Dims, args: &[Arg]) -> Result<()> {
        self.be
            .kernels
            .launch(name, dims, self.work_stream()?, args)
    }

    /// Lets a held compute stream go: before a host wait for the stream inside an op.
    pub fn release_stream(&self) {
        self.be.release_stream();
    }

    /// Multiprocessors.
    pub fn sms(&self) -> u32 {
        self.be.dev.sms
    }

    /// The compute stream, for what queues no work on it (capture status, waits); work goes
    /// through [`Cx::work_stream`].
    pub fn stream(&self) -> cudarc::driver::sys::CUstream {
        self.be.dev.stream
    }

    /// Fills a storage with the poison pattern 0x7FC0 in every 16-bit word.
    pub fn poison(&self, s: &CudaStorage) -> Result<()> {
        let n = (s.buf.len() / 2) as u64;
        if n == 0 {
            return Ok(());
        }
        self.k(
            "fill_u16",
            Dims::stride(n, 256, self.sms()),
            &[Arg::Ptr(s.ptr()), Arg::U64(n), Arg::U16(0x7FC0)],
        )
    }

    fn cast(&self, s: &CudaStorage, n: usize, to: DType) -> Result<View> {
        if s.phys == to || n == 0 {
            return Ok(View {
                ptr: s.ptr(),
                _tmp: None,
            });
        }
        let t = self.alloc(n, to)?;
        let name = match (s.phys, to) {
            (DType::F32, DType::BF16) => "cast_f32_bf16",
            (DType::F32, DType::F16) => "cast_f32_f16",
            (DType::BF16, DType::F32) => "cast_bf16_f32",
            (DType::F16, DType::F32) => "cast_f16_f32",
            (a, b) => {
                return Err(Error::Internal(format!(
                    "no cast from {a} to {b} on the device"
                )));
            }
        };
        self.k(
            name,
            Dims::stride(n as u64, 256, self.sms()),
            &[Arg::Ptr(s.ptr()), Arg::Ptr(t.ptr()), Arg::U64(n as u64)],
        )?;
        Ok(View {
            ptr: t.ptr(),
            _tmp: Some(t),
        })
    }

    /// The input in the storage precision (bf16 or f16: [`Cx::dtype`]).
    pub fn half(&self, s: &CudaStorage, n: usize) -> Result<View> {
        self.cast(s, n, self.phys())
    }

    /// The input as f32.
    pub fn f32(&self, s: &CudaStorage, n: usize) -> Result<View> {
        self.cast(s, n, DType::F32)
    }
}

/// The entry point `pattern` names for storage `dtype` (`{s}` -> `bf16` / `f16`).
pub fn kernel_for(pattern: &str, dtype: CudaDType) -> Result<&'static str> {
    tandem_gpu_kernels::kernel(pattern, storage(dtype)).ok_or_else(|| {
        Error::Internal(format!(
            "no kernel {} in the catalog",
            pattern.replace("{s}", dtype.name())
        ))
    })
}

/// The kernels' name for a storage precision.
fn storage(dtype: CudaDType) -> tandem_gpu_kernels::Storage {
    match dtype {
        CudaDType::Bf16 => tandem_gpu_kernels::Storage::Bf16,
        CudaDType::F16 => tandem_gpu_kernels::Storage::F16,
    }
}

/// Whether the device (compute capability `arch`, `max_smem` bytes of shared memory a block
/// may opt in to, running the attention build `attention` where one is forced) runs `op` on
/// these inputs.
pub fn supports(
    arch: u32,
    max_smem: usize,
    attention: Option<attention::Variant>,
    op: &Op,
    inputs: &[TensorMeta],
) -> Support {
    if arch < 80 {
        return Support::No(format!(
            "tandem's CUDA kernels need sm_80 or later (this device is sm_{arch})"
        ));
    }
    if let Err(e) = op.validate(inputs) {
        return Support::No(e.to_string());
    }
    match op {
        Op::Attention(p) => match p.shape(inputs) {
            Ok(s) if !attention::HEAD_DIMS.contains(&s.d) => {
                Support::No(format!("head dim {} (64, 128 and 256 are supported)", s.d))
            }
            Ok(s) => {
                let v = attention::Variant::select(arch, s.d, attention);
                if v.hopper_only() && arch != 90 {
                    Support::No(format!(
                        "the wgmma attention builds need sm_90 (this device is sm_{arch})"
                    ))
                } else if !v.has_head_dim(s.d) {
                    Support::No(v.missing_head_dim(s.d))
                } else if v.smem(s.d) > max_smem {
                    Support::No(format!(
                        "the {v} attention build at head dim {} needs {} KiB of shared memory a \
                         block; this device allows {} KiB (w4 fits every sm_80+ part)",
                        s.d,
                        v.smem(s.d).div_ceil(1024),
                        max_smem / 1024
                    ))
                } else {
                    Support::Native
                }
            }
            Err(e) => Support::No(e.to_string()),
        },
        Op::MoeRoute(_) => {
            let e = inputs[0].shape[1];
            if e > tandem_gpu_kernels::ROUTE_MAX_EXPERTS {
                Support::No(format!(
                    "{e} experts (at most {} are supported)",
                    tandem_gpu_kernels::ROUTE_MAX_EXPERTS
                ))
            } else {
                Support::Native
            }
        }
        // Every shape: the grouped kernels take hidden and ffn multiples of 8 (16-byte rows);
        // other sizes run the cuBLASLt path (moe::ExpertsPath::select says which and why).
        Op::MoeExperts(_) => Support::Native,
        Op::Embedding(_) => {
            Support::No("no CUDA kernel for the embedding lookup (the CPU gathers the rows)".into())
        }
        _ => Support::Native,
    }
}

/// Device precision of each output of `op`, floats stored as `half`.
fn output_precisions(op: &Op, metas: &[TensorMeta], half: DType) -> Vec<DType> {
    match op {
        Op::Attention(_) | Op::AttentionDecode(_) => vec![half, DType::F32],
        Op::Linear(p) if linear::writes_f32(p) => vec![DType::F32],
        Op::MoeRoute(_) => vec![
            DType::I32,
            DType::F32,
            DType::I32,
            DType::I32,
            DType::I32,
            DType::F32,
            DType::F32,
        ],
        _ => metas
            .iter()
            .map(|m| {
                if m.dtype == DType::I32 {
                    DType::I32
                } else {
                    half
                }
            })
            .collect(),
    }
}

/// Allocates the outputs of `op`.
pub fn alloc_outputs(cx: &Cx<'_>, op: &Op, metas: &[TensorMeta]) -> Result<Vec<CudaStorage>> {
    metas
        .iter()
        .zip(output_precisions(op, metas, cx.phys()))
        .map(|(m, p)| cx.alloc(m.numel(), p))
        .collect()
}

/// Loads (compiling at first use) every module `op` needs, so compile time stays out of the
/// event-timed region.
pub fn prepare(cx: &Cx<'_>, op: &Op) -> Result<()> {
    // One entry point per module the op launches from.
    let first: Vec<&'static str> = match op {
        Op::Attention(_) => {
            let mut v = vec![cx.kernel("mha_{s}_fwd_d64")?, "fill_u16"];
            if cx.be.dev.arch == 90 {
                v.push("mha_bf16_fwd_d64_ws");
            }
            v
        }
        Op::AttentionDecode(_) => vec![cx.kernel("attn_decode_merge_{s}_d64")?, "fill_u16"],
        Op::MoeRoute(_) => vec![moe::topk_kernel(DType::F32), "fill_u16"],
        Op::RmsNorm(_) => vec![cx.kernel("rmsnorm_{s}")?, "fill_u16"],
        Op::Rope(_) => vec![cx.kernel("rope_{s}")?, "fill_u16"],
        Op::MoeExperts(_) => vec!["moe_tile_map", cx.kernel("moe_gather_{s}")?, "fill_u16"],
        _ => vec!["fill_u16"],
    };
    for k in first {
        cx.be.kernels.preload(k)?;
    }
    Ok(())
}

/// Whether `op` on inputs `metas` may be recorded into a CUDA graph on this device
/// ([`super::graph`]): all of its work queued on the compute stream, nothing waiting for the
/// device or reading device memory on the host. `Err`: why not. Only the ops of the MoE block
/// have been checked (linear: cuBLASLt with its fixed workspace; routing: fused cooperative or
/// three kernels; experts: the grouped and wgmma paths); the others answer that they were not.
pub fn capture_safe(cx: &Cx<'_>, op: &Op, metas: &[TensorMeta]) -> std::result::Result<(), String> {
    match op {
        Op::Linear(_) | Op::MoeRoute(_) => Ok(()),
        Op::MoeExperts(p) => {
            let s = p.shape(metas).map_err(|e| e.to_string())?;
            match moe::ExpertsPath::on_device(cx, &s) {
                (
                    moe::ExpertsPath::Grouped(_)
                    | moe::ExpertsPath::Wgmma
                    | moe::ExpertsPath::WgmmaFp8,
                    _,
                ) => Ok(()),
                (moe::ExpertsPath::Blaslt, why) => Err(format!(
                    "the experts run on the cuBLASLt path{}, which synchronises the stream to \
                     read the expert offsets on the host",
                    why.map(|w| format!(" ({w})")).unwrap_or_default()
                )),
            }
        }
        other => Err(format!(
            "{} has not been checked for graph capture",
            other.name()
        )),
    }
}

/// The experts path the experts op takes on inputs `metas` on this device: `grouped-<tile>`,
/// `wgmma`, `wgmma-fp8` or `blaslt`.
pub fn experts_path_name(
    cx: &Cx<'_>,
    p: &crate::ops::MoeExpertsParams,
    metas: &[TensorMeta],
) -> Result<String> {
    let s = p.shape(metas)?;
    Ok(match moe::ExpertsPath::on_device(cx, &s).0 {
        moe::ExpertsPath::Grouped(t) => format!("grouped-{}", t.name),
        moe::ExpertsPath::Blaslt => "blaslt".to_string(),
        moe::ExpertsPath::Wgmma => "wgmma".to_string(),
        moe::ExpertsPath::WgmmaFp8 => "wgmma-fp8".to_string(),
    })
}

/// Bytes a device of compute capability `arch` with options `opts` keeps beside input `input`
/// of `op` on inputs `metas` for as long as that input's storage lives: the e4m3 copy of
/// `gate_up` or `down` ([`moe_fp8::kept_beside`], the bytes its first use charges to the
/// device's memory accounts) where the experts take the FP8 path
/// ([`moe::ExpertsPath::on_arch`], the choice the launch makes); 0 for every other op, input
/// and path.
pub fn derived_bytes(
    arch: u32,
    opts: &crate::options::CudaOptions,
    op: &Op,
    metas: &[TensorMeta],
    input: usize,
) -> u64 {
    let Op::MoeExperts(p) = op else {
        return 0;
    };
    let Ok(s) = p.shape(metas) else {
        return 0;
    };
    match moe::ExpertsPath::on_arch(arch, opts, &s).0 {
        moe::ExpertsPath::WgmmaFp8 => moe_fp8::kept_beside(&s, input),
        _ => 0,
    }
}

/// Queues `op`; returns the name(s) of the kernels that ran, joined by '+'.
pub fn run(
    cx: &Cx<'_>,
    op: &Op,
    ins: &[&CudaStorage],
    metas: &[TensorMeta],
    outs: &[CudaStorage],
) -> Result<String> {
    match op {
        Op::Add => basic::add(cx, ins, metas, outs),
        Op::SplitHeads(p) => basic::split_heads(cx, p, ins, metas, outs),
        Op::MergeHeads => basic::merge_heads(cx, ins, metas, outs),
        Op::RmsNorm(p) => basic::rmsnorm(cx, p, ins, metas, outs),
        Op::Rope(p) => basic::rope(cx, p, ins, metas, outs),
        Op::Linear(p) => linear::linear(cx, p, ins, metas, outs),
        Op::Attention(p) => attention::attention(cx, p, ins, metas, outs),
        Op::AttentionDecode(p) => attention_decode::attention_decode(cx, p, ins, metas, outs),
        Op::MoeRoute(p) => moe::route(cx, p, ins, metas, outs),
        Op::MoeExperts(p) => moe::experts(cx, p, ins, metas, outs),
        // No elements to write.
        Op::Nop => Ok("nop".to_string()),
        Op::Embedding(_) => Err(crate::error::Error::Unsupported {
            op: op.name().into(),
            device: cx.be.dev.label.clone(),
            why: "no CUDA kernel for the embedding lookup (the CPU gathers the rows)".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::attention::Variant;
    use super::*;
    use crate::ops::{AttentionParams, MoeRouteParams};

    /// Every kernel name pattern the ops launch, in both precisions.
    #[test]
    fn every_storage_kernel_exists_in_both_precisions() {
        let patterns = [
            "add_{s}",
            "split_heads_{s}",
            "merge_heads_{s}",
            "rmsnorm_{s}",
            "rmsnorm_{s}_scalar",
            "rope_{s}",
            "rope_{s}_scalar",
            "silu_{s}",
            "moe_gather_{s}",
            "moe_swiglu_{s}",
            "moe_combine_{s}",
            "mha_{s}_fwd_d64",
        ];
        for dt in CudaDType::ALL {
            for p in patterns {
                let k = kernel_for(p, dt).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(k, p.replace("{s}", dt.name()));
            }
        }
        for phys in [DType::F32, DType::BF16, DType::F16] {
            let topk = moe::topk_kernel(phys);
            assert!(
                tandem_gpu_kernels::Module::of_kernel(topk).is_some(),
                "{topk}"
            );
            for self_reset in [false, true] {
                for e in [1, 8, 32, 33, 64, 65, 128, 129, 256] {
                    let k = moe::fused_kernel(phys, e, self_reset)
                        .unwrap_or_else(|err| panic!("{err}"));
                    assert_eq!(k.ends_with("_g"), self_reset, "{k}");
                    let v: usize = k
                        .trim_end_matches("_g")
                        .rsplit("_v")
                        .next()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    // the fewest logits per lane that hold a row of e
                    assert!(e <= 32 * v && (v == 1 || e > 16 * v), "E{e}: {k}");
                }
                assert!(moe::fused_kernel(phys, 257, self_reset).is_err());
            }
        }
        assert_eq!(moe::topk_kernel(DType::BF16), "moe_topk_softmax_f32");
        assert_eq!(
            moe::fused_kernel(DType::F32, 64, false).ok(),
            Some("moe_route_fused_f32_v2")
        );
        assert_eq!(
            moe::fused_kernel(DType::F32, 256, true).ok(),
            Some("moe_route_fused_f32_v8_g")
        );
        assert!(kernel_for("nope_{s}", CudaDType::F16).is_err());
    }

    /// The opt-in shared memory of each arch's data-centre part (227 KiB on sm_90, 163 on sm_80,
    /// 99 on sm_86/89).
    fn smem_of(arch: u32) -> usize {
        match arch {
            90 => 227 * 1024,
            80 => 163 * 1024,
            _ => 99 * 1024,
        }
    }

    #[test]
    fn attention_builds_exist_in_both_precisions() {
        assert_eq!(Variant::select(90, 128, None), Variant::Ws);
        assert_eq!(Variant::select(90, 64, None), Variant::Ws);
        assert_eq!(Variant::select(80, 128, None), Variant::M2);
        assert_eq!(Variant::select(89, 64, None), Variant::M2);
        // A forced build wins on every arch.
        for v in Variant::ALL {
            for arch in [80, 89, 90] {
                assert_eq!(Variant::select(arch, 128, Some(v)), v);
            }
        }
        for (var, d, want) in [
            (Variant::M2, 128, "mha_{s}_fwd_d128_m2"),
            (Variant::W4, 64, "mha_{s}_fwd_d64"),
            (Variant::W8, 128, "mha_{s}_fwd_d128_w8"),
            (Variant::M2N32, 64, "mha_{s}_fwd_d64_m2n32"),
            (Variant::Ws, 128, "mha_{s}_fwd_d128_ws"),
            (Variant::Ws, 64, "mha_{s}_fwd_d64_ws"),
            (Variant::W4, 256, "mha_{s}_fwd_d256"),
            (Variant::W8, 256, "mha_{s}_fwd_d256_w8"),
            (Variant::Ws, 256, "mha_{s}_fwd_d256_ws"),
        ] {
            for dt in CudaDType::ALL {
                let name = want.replace("{s}", dt.name());
                assert_eq!(var.kernel(d, dt).ok(), Some(name.as_str()));
            }
        }
        let f = |s: Vec<usize>| TensorMeta::new(s, DType::F32);
        let op = Op::Attention(AttentionParams {
            causal: true,
            scale: None,
        });
        let ins = [
            f(vec![1, 4, 32, 128]),
            f(vec![1, 2, 32, 128]),
            f(vec![1, 2, 32, 128]),
        ];
        for arch in [80, 89, 90] {
            for dt in CudaDType::ALL {
                assert_eq!(
                    supports(arch, smem_of(arch), None, &op, &ins),
                    Support::Native,
                    "sm_{arch} {dt}"
                );
            }
        }
        // The Hopper build, forced elsewhere, is refused with the reason.
        assert_eq!(
            supports(90, smem_of(90), Some(Variant::Ws), &op, &ins),
            Support::Native
        );
        assert!(matches!(
            supports(80, smem_of(80), Some(Variant::Ws), &op, &ins),
            Support::No(why) if why.contains("sm_90")
        ));
        // Head dim 256: ws on sm_90, w4 elsewhere; the two-m-tile builds have no kernel, and
        // forcing one is declined naming the builds that have.
        let d256 = [
            f(vec![1, 4, 32, 256]),
            f(vec![1, 2, 32, 256]),
            f(vec![1, 2, 32, 256]),
        ];
        assert_eq!(Variant::select(90, 256, None), Variant::Ws);
        assert_eq!(Variant::select(80, 256, None), Variant::W4);
        for arch in [80, 89, 90] {
            assert_eq!(
                supports(arch, smem_of(arch), None, &op, &d256),
                Support::Native
            );
        }
        for v in [Variant::M2, Variant::M2N32] {
            assert!(!v.has_head_dim(256));
            assert!(matches!(
                supports(90, smem_of(90), Some(v), &op, &d256),
                Support::No(why) if why.contains("no head dim 256 kernel (builds for it: w4, w8, ws)")
            ));
            assert!(v.kernel(256, CudaDType::Bf16).is_err());
        }
        // w8 at d256 takes 132 KiB: declined on a 99 KiB part, run on sm_80 and sm_90
        assert!(matches!(
            supports(89, smem_of(89), Some(Variant::W8), &op, &d256),
            Support::No(why) if why.contains("needs 132 KiB of shared memory")
        ));
        assert_eq!(
            supports(80, smem_of(80), Some(Variant::W8), &op, &d256),
            Support::Native
        );
        assert_eq!(
            supports(89, smem_of(89), Some(Variant::W4), &op, &d256),
            Support::Native
        );
        let d96 = [
            f(vec![1, 4, 32, 96]),
            f(vec![1, 2, 32, 96]),
            f(vec![1, 2, 32, 96]),
        ];
        assert!(matches!(
            supports(90, smem_of(90), None, &op, &d96),
            Support::No(why) if why.contains("head dim 96 (64, 128 and 256 are supported)")
        ));
    }

    #[test]
    fn outputs_are_stored_in_the_storage_precision() {
        let op = Op::MoeRoute(MoeRouteParams {
            top_k: 2,
            renormalize: true,
            block_size: 16,
        });
        let metas = op
            .validate(&[TensorMeta::new(vec![5, 4], DType::F32)])
            .unwrap_or_else(|e| panic!("{e}"));
        // routing: ids and counts i32, weights and losses f32, whatever the storage
        assert!(
            output_precisions(&op, &metas, DType::F16)
                .iter()
                .all(|&p| p == DType::I32 || p == DType::F32)
        );
        let op = Op::Attention(AttentionParams {
            causal: false,
            scale: None,
        });
        assert_eq!(
            output_precisions(&op, &[], DType::F16),
            vec![DType::F16, DType::F32]
        );
        let add = [TensorMeta::new(vec![3, 8], DType::F32)];
        assert_eq!(
            output_precisions(&Op::Add, &add, DType::F16),
            vec![DType::F16]
        );
        assert_eq!(
            output_precisions(&Op::Add, &add, DType::BF16),
            vec![DType::BF16]
        );
    }
}
