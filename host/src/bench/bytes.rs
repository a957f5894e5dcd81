//! The byte floors a bench divides by: what an op must move at the device's storage
//! precision, and how many input sets keep caches from flattering the figure.

use crate::dtype::DType;
use crate::ops::Op;
use crate::tensor::TensorMeta;

/// Bytes of inputs the rotated sets together should exceed (larger than any cache).
pub const ROTATION_BYTES: f64 = 256.0 * 1048576.0;

/// Most input sets rotated by default.
pub const MAX_SETS: usize = 8;

/// The precision a device stores logical f32 tensors in, given the precision its math runs
/// in: bf16 or f16 on a GPU; f32 on the CPU and on int8 devices (whose scales are f32).
pub fn storage_dtype(compute: DType) -> DType {
    if compute == DType::F32 || compute == DType::I8 {
        DType::F32
    } else {
        compute
    }
}

/// Bytes the figure of merit counts, and what they are: the expert weights for moe_experts
/// (what a decode step must stream; one byte each where the experts ran on the e4m3
/// kernels, `fp8_experts`), the KV cache for attention_decode (every sequence at the cache's capacity,
/// as the bench fills it), else every input and output once at `storage`.
pub fn counted_bytes(
    op: &Op,
    metas: &[TensorMeta],
    storage: DType,
    fp8_experts: bool,
) -> (f64, &'static str) {
    match op {
        Op::MoeExperts(_) => {
            let w: usize = metas.iter().skip(5).take(2).map(TensorMeta::numel).sum();
            if fp8_experts {
                return (w as f64, "expert weights (e4m3)");
            }
            let size = if storage.size() < 4 {
                storage.size()
            } else {
                4
            };
            ((w * size) as f64, "expert weights")
        }
        Op::AttentionDecode(p) => {
            let size = storage.size().min(4);
            (p.kv_bytes(metas, size), "KV cache")
        }
        _ => (device_bytes(op, metas, storage), "inputs and outputs"),
    }
}

/// Bytes an op moves at the device's storage precision (floats as bf16 on a bf16 device;
/// ids and counts at their own size).
pub fn device_bytes(op: &Op, metas: &[TensorMeta], storage: DType) -> f64 {
    let outs = op.validate(metas).unwrap_or_default();
    metas
        .iter()
        .chain(outs.iter())
        .map(|m| {
            let size = if m.dtype == DType::F32 && storage.size() < 4 {
                storage.size()
            } else {
                m.dtype.size()
            };
            (m.numel() * size) as f64
        })
        .sum()
}

/// Input sets to rotate by default: enough that together they exceed [`ROTATION_BYTES`] at
/// `storage`, between 1 and [`MAX_SETS`].
pub fn default_sets(metas: &[TensorMeta], storage: DType) -> usize {
    let in_bytes: f64 = metas
        .iter()
        .map(|m| (m.numel() * storage.size().min(m.dtype.size())) as f64)
        .sum();
    ((ROTATION_BYTES / in_bytes.max(1.0)).ceil() as usize).clamp(1, MAX_SETS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{MoeExpertsParams, RmsNormParams};

    #[test]
    fn bf16_devices_count_half_the_float_bytes() {
        let op = Op::RmsNorm(RmsNormParams::default());
        let m = vec![
            TensorMeta::new(vec![4, 8], DType::F32),
            TensorMeta::new(vec![8], DType::F32),
        ];
        assert_eq!(
            device_bytes(&op, &m, DType::F32),
            ((32 + 8 + 32) * 4) as f64
        );
        assert_eq!(
            device_bytes(&op, &m, DType::BF16),
            ((32 + 8 + 32) * 2) as f64
        );
        assert_eq!(default_sets(&m, DType::F32), MAX_SETS);
        let big = [TensorMeta::new(vec![1 << 27], DType::F32)];
        assert_eq!(default_sets(&big, DType::F32), 1);
        assert_eq!(default_sets(&big, DType::BF16), 1);
        let mid = [TensorMeta::new(vec![1 << 24], DType::F32)];
        assert_eq!(default_sets(&mid, DType::F32), 4);
    }

    #[test]
    fn moe_experts_count_the_expert_weights() -> crate::error::Result<()> {
        let p = crate::bench::BenchShape {
            tokens: Some(7),
            hidden: 16,
            ffn: 8,
            experts: Some(4),
            top_k: Some(2),
            ..crate::bench::BenchShape::DEFAULT
        }
        .problem(crate::ops::OpKind::MoeExperts)?;
        assert!(matches!(p.op, Op::MoeExperts(MoeExpertsParams {})));
        let (bytes, what) = counted_bytes(&p.op, &p.inputs, DType::BF16, false);
        assert_eq!(what, "expert weights");
        assert_eq!(bytes, (2 * (4 * 16 * 16 + 4 * 16 * 8)) as f64);
        let (bytes, what) = counted_bytes(&p.op, &p.inputs, DType::BF16, true);
        assert_eq!(what, "expert weights (e4m3)");
        assert_eq!(bytes, (4 * 16 * 16 + 4 * 16 * 8) as f64);
        assert_eq!(storage_dtype(DType::I8), DType::F32);
        assert_eq!(storage_dtype(DType::F16), DType::F16);
        Ok(())
    }
}
