//! Tensor maps for Hopper's tensor memory accelerator (TMA): the descriptors that
//! `cp.async.bulk.tensor` copies tiles through.

use cudarc::driver::sys;

use super::error::DrvResultExt;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// A 3-D tiled map over a row-major `[outer][rows][cols]` tensor of 16-bit elements (bf16,
/// f16) or bytes (`I8`: e4m3 or int8 bits, read as unsigned bytes) at `ptr`, read in boxes of
/// `box_rows x box_cols` (`box_cols` elements <= 128 bytes), stored in shared memory
/// with the 128-byte swizzle that wgmma's swizzled operand layout expects. Rows and columns past
/// the tensor read as zero.
pub fn tiled_3d_sw128(
    device: &str,
    ptr: u64,
    dtype: DType,
    dims: [usize; 3],
    box_rows: u32,
    box_cols: u32,
) -> Result<sys::CUtensorMap> {
    let [outer, rows, cols] = dims;
    let ty = match dtype {
        DType::BF16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DType::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::I8 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        other => {
            return Err(Error::Internal(format!(
                "TMA maps are built for bf16, f16 and byte tensors, not {other}"
            )));
        }
    };
    let size = dtype.size();
    if outer == 0 || rows == 0 || cols == 0 || (cols * size) % 16 != 0 || ptr % 16 != 0 {
        return Err(Error::Internal(format!(
            "a TMA map needs non-empty dims, rows of a multiple of 16 bytes and a 16-byte aligned \
             address (dims {dims:?}, address {ptr:#x})"
        )));
    }
    let global_dim = [cols as u64, rows as u64, outer as u64];
    let global_strides = [(cols * size) as u64, (rows * cols * size) as u64];
    let box_dim = [box_cols, box_rows, 1u32];
    let element_strides = [1u32; 3];
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: every pointer refers to a live local array of the length the rank (3) implies; the
    // driver only encodes the descriptor (the address is not dereferenced here).
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            ty,
            3,
            ptr as *mut std::ffi::c_void,
            global_dim.as_ptr(),
            global_strides.as_ptr(),
            box_dim.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()
    .ctx(device, "cuTensorMapEncodeTiled")?;
    Ok(map)
}
