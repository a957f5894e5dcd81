//! One CUDA device: its primary context, streams, and what it is (name, capability, rates).

use std::ffi::c_int;

use cudarc::driver::result as drv;
use cudarc::driver::sys;

use super::error::DrvResultExt;
use crate::backend::{DeviceId, DeviceInfo, DeviceKind};
use crate::dtype::DType;
use crate::error::Result;

/// A device's primary context and its two streams (compute, copy).
#[derive(Debug)]
pub struct Device {
    /// Ordinal.
    pub ordinal: usize,
    /// Name used in errors (`cuda:N`).
    pub label: String,
    ctx: sys::CUcontext,
    /// Stream every kernel of this device runs on, in submission order.
    pub stream: sys::CUstream,
    /// Stream for host<->device copies.
    pub copy_stream: sys::CUstream,
    /// Compute capability, major * 10 + minor.
    pub arch: u32,
    /// Multiprocessors.
    pub sms: u32,
    /// Largest dynamic shared memory a block may opt in to, bytes.
    pub max_smem_optin: usize,
}

// SAFETY: the CUDA driver API is thread-safe; the handles are only used after `bind()` makes
// the context current on the calling thread.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

fn attr(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<i32> {
    // SAFETY: `dev` came from cuDeviceGet.
    unsafe { drv::device::get_attribute(dev, a) }.ctx("cuda", "cuDeviceGetAttribute")
}

impl Device {
    /// Opens device `ordinal` (cuInit must have succeeded).
    pub fn open(ordinal: usize) -> Result<(Self, DeviceInfo)> {
        let label = format!("cuda:{ordinal}");
        let dev = drv::device::get(ordinal as c_int).ctx(&label, "cuDeviceGet")?;
        // SAFETY: `dev` is valid; the primary context lives as long as the process.
        let ctx =
            unsafe { drv::primary_ctx::retain(dev) }.ctx(&label, "cuDevicePrimaryCtxRetain")?;
        // SAFETY: ctx was just retained.
        unsafe { drv::ctx::set_current(ctx) }.ctx(&label, "cuCtxSetCurrent")?;
        let stream = drv::stream::create(drv::stream::StreamKind::NonBlocking)
            .ctx(&label, "cuStreamCreate")?;
        let copy_stream = drv::stream::create(drv::stream::StreamKind::NonBlocking)
            .ctx(&label, "cuStreamCreate")?;
        use sys::CUdevice_attribute as A;
        let major = attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sms = attr(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let clock_khz = attr(dev, A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)?;
        let mem_khz = attr(dev, A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)?;
        let bus = attr(dev, A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)?;
        let l2 = attr(dev, A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?;
        let smem = attr(
            dev,
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )?;
        let name = drv::device::get_name(dev).ctx(&label, "cuDeviceGetName")?;
        // SAFETY: `dev` is valid.
        let mem = unsafe { drv::device::total_mem(dev) }.ctx(&label, "cuDeviceTotalMem")?;
        let arch = (major * 10 + minor) as u32;
        // Dense bf16 tensor-core FLOP per clock per SM (datasheet leads, refined by calibration).
        let per_sm = match major {
            9 | 10 => 4096.0,
            8 if minor == 0 => 2048.0,
            _ => 1024.0,
        };
        let peak_flops = sms as f64 * clock_khz as f64 * 1e3 * per_sm;
        let peak_bw = 2.0 * mem_khz as f64 * 1e3 * bus as f64 / 8.0;
        let mut driver_version: c_int = 0;
        // SAFETY: writes one int.
        let _ = unsafe { sys::cuDriverGetVersion(&mut driver_version) };
        let id = DeviceId {
            kind: DeviceKind::Cuda,
            index: ordinal,
        };
        let kernels = if arch == 90 {
            "sm90a (TMA + wgmma warp-specialized attention) + sm80 (mma.sync, cp.async)"
        } else if arch >= 80 {
            "sm80 (mma.sync, cp.async)"
        } else {
            "none (needs sm_80+)"
        };
        let info = DeviceInfo {
            id,
            name,
            memory_bytes: mem as u64,
            peak_flops,
            peak_bandwidth: peak_bw,
            compute_dtype: DType::BF16,
            details: vec![
                ("compute capability".into(), format!("{major}.{minor}")),
                ("SMs".into(), sms.to_string()),
                ("clock".into(), format!("{} MHz", clock_khz / 1000)),
                ("L2".into(), format!("{} MiB", l2 / (1 << 20))),
                (
                    "memory bus".into(),
                    format!("{bus}-bit @ {} MHz", mem_khz / 1000),
                ),
                (
                    "driver".into(),
                    format!("{}.{}", driver_version / 1000, (driver_version % 1000) / 10),
                ),
                ("storage".into(), "bf16 (f32 accumulate)".into()),
                ("kernels".into(), kernels.into()),
            ],
        };
        Ok((
            Self {
                ordinal,
                label,
                ctx,
                stream,
                copy_stream,
                arch,
                sms: sms as u32,
                max_smem_optin: smem as usize,
            },
            info,
        ))
    }

    /// The device's (primary) context.
    pub fn context(&self) -> sys::CUcontext {
        self.ctx
    }

    /// Makes this device's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: the context was retained in `open` and is never released.
        unsafe { drv::ctx::set_current(self.ctx) }.ctx(&self.label, "cuCtxSetCurrent")
    }

    /// Waits for all work on both streams.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: both streams were created in `open`.
        unsafe {
            drv::stream::synchronize(self.stream).ctx(&self.label, "cuStreamSynchronize")?;
            drv::stream::synchronize(self.copy_stream).ctx(&self.label, "cuStreamSynchronize")
        }
    }
}
