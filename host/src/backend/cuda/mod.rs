//! The CUDA backend: cudarc with dynamic loading, kernels compiled by NVRTC at first use,
//! cuBLASLt for the matrix products.
//!
//! Logical f32 tensors are stored in 16 bits on the device, bf16 (the default) or f16
//! ([`CudaOptions::dtype`]; upload converts, download converts back); i32 stays i32; a few small
//! f32 results (attention LSE, routing weights, losses) stay f32. Math accumulates in f32.
//! Every op runs on the device's one compute stream, bracketed by two events: the completion
//! thread fills in the event-timed device time and advances the device's fence. The backend
//! keeps the [`CudaOptions`] it was opened with and hands each op the fields it needs (the
//! attention build, the MoE experts path and tile; the compiler its folders); nothing here
//! reads the environment.
//!
//! Files: `probe` (are the libraries and a device there), `device` (context, streams, info),
//! `memory` (pool, pinned staging), `compile` (NVRTC + disk cache), `kernels` (modules and
//! launches), `blaslt` (cuBLASLt plans), `timing` (events and completions), `ops` (each op),
//! `graph` (CUDA graph capture and replay), `block` (the MoE block as one unit: eager, or one
//! replayed graph when its shapes repeat).

mod blaslt;
mod block;
mod compile;
mod device;
mod error;
mod graph;
mod kernels;
mod memory;
mod ops;
mod probe;
mod timing;
mod tma;

use std::sync::{Arc, Mutex};

use cudarc::driver::result as drv;
use half::{bf16, f16};
use rayon::prelude::*;

use super::{
    Backend, DeviceId, DeviceInfo, DeviceKind, DeviceStorage, Launch, LaunchInfo, Missing, Support,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::Op;
use crate::tensor::{HostData, Tensor, TensorMeta};
use error::DrvResultExt;

pub use super::CudaDType;
pub use crate::options::cuda::{
    AttentionVariant, CudaOptions, MoeExpertsPath, MoeTileSize, MoeWsTile, RouteKernel,
};
pub use block::{BlockLaunch, BlockMode, GRAPHS_KEPT, GraphUse, MoeBlock, MoeBlockInputs};
pub use graph::NodeCounts;
pub use memory::bench::TransferFigure;
pub use memory::pool::{PoolStats, size_class};
/// The decode kernels' K/V ring ([`CudaOptions::decode_ring`]).
pub use tandem_gpu_kernels::DecodeRing;
pub use timing::HOLD_TIMEOUT;

/// Looks for CUDA devices: checks the libraries and the driver first (cudarc panics on a
/// missing library, so the libraries are looked for where `opts` says and in the usual
/// places), then opens each device with `opts`.
pub fn discover_with(opts: &CudaOptions) -> (Vec<Arc<dyn Backend>>, Vec<Missing>) {
    let missing = |reason: String| Missing {
        kind: DeviceKind::Cuda,
        reason,
    };
    let n = match probe::check(opts) {
        Ok(n) => n,
        Err(reason) => return (Vec::new(), vec![missing(reason)]),
    };
    let mut found: Vec<Arc<dyn Backend>> = Vec::new();
    let mut lost = Vec::new();
    for i in 0..n {
        match CudaBackend::open(i, opts.clone()) {
            Ok(b) => found.push(Arc::new(b)),
            Err(e) => lost.push(missing(format!("cuda:{i}: {e}"))),
        }
    }
    (found, lost)
}

/// Why no CUDA device can be used here (the libraries looked for as [`discover_with`] does),
/// or `None` when at least one can.
pub fn unavailable_reason(opts: &CudaOptions) -> Option<String> {
    probe::check(opts).err()
}
/// Device data: a pool allocation and the precision it is stored in.
///
/// A storage is written only while it is made (an upload, an op's output, a copy), never
/// after, so forms derived from its data on the device (the FP8 experts' e4m3 weights) are
/// kept beside it and stay valid as long as it lives.
#[derive(Debug)]
pub struct CudaStorage {
    buf: memory::DevBuf,
    /// Precision on the device (bf16 or f16 as the backend stores, f32 or i32).
    pub phys: DType,
    /// The data quantized to e4m3 rows, made at first use by the FP8 experts path.
    e4m3: std::sync::Mutex<Option<ops::moe_fp8::Kept>>,
}

impl CudaStorage {
    /// A storage of `buf`, holding data in `phys`.
    fn new(buf: memory::DevBuf, phys: DType) -> Self {
        Self {
            buf,
            phys,
            e4m3: std::sync::Mutex::new(None),
        }
    }

    /// Device address.
    pub fn ptr(&self) -> u64 {
        self.buf.ptr()
    }
}

/// One NVIDIA GPU.
#[derive(Debug)]
pub struct CudaBackend {
    info: DeviceInfo,
    /// Host tensors pinned in place; released before the device (declared first: dropped first).
    registered: memory::Registered,
    /// Reused, registered host tensors that downloads land in; released before the device.
    landings: memory::Landings,
    /// Captured MoE blocks; destroyed before the device.
    blocks: block::BlockGraphs,
    dev: Arc<device::Device>,
    pool: Arc<memory::Pool>,
    up: memory::Staging,
    down: memory::Staging,
    kernels: kernels::Kernels,
    blas: blaslt::BlasLt,
    timeline: timing::Timeline,
    /// The hold on the compute stream of the op being queued ([`CudaOptions::hold_stream`]),
    /// shared with the kernels and cuBLASLt, which let it go before loading code.
    holder: Arc<timing::Holder>,
    launch_lock: Mutex<()>,
    /// Taken shared by every host call that touches the compute stream outside a launch (the
    /// events that order copies against it, waits for it) and exclusively by a graph capture
    /// on it (`block`), so a capture records nothing another thread queues meanwhile. Launches
    /// are kept out by `launch_lock`, which a capture holds too.
    capturing: std::sync::RwLock<()>,
    opts: CudaOptions,
    /// The registry's memory accounts, charged for the derived forms kept beside storages.
    accounts: std::sync::OnceLock<Arc<crate::memory::DeviceMemory>>,
}

impl CudaBackend {
    /// Opens device `ordinal` (after [`unavailable_reason`] returned `None`) with `opts`.
    pub fn open(ordinal: usize, opts: CudaOptions) -> Result<Self> {
        if let Some(r) = probe::check(&opts).err() {
            return Err(Error::Unavailable {
                device: format!("cuda:{ordinal}"),
                reason: r,
            });
        }
        let (dev, mut info) = device::Device::open(ordinal)?;
        let dev = Arc::new(dev);
        info.compute_dtype = opts.dtype.dtype();
        for (k, v) in info.details.iter_mut() {
            if k == "storage" {
                *v = format!("{} (f32 accumulate)", opts.dtype);
            }
        }
        let (a, b) = compile::nvrtc_version();
        info.details.push(("nvrtc".into(), format!("{a}.{b}")));
        let compiler = compile::Compiler::new(&opts);
        info.details.push((
            "kernel cache".into(),
            compiler.cache_dir().display().to_string(),
        ));
        let pool = memory::Pool::new(&dev.label);
        let holder = Arc::new(timing::Holder::default());
        let blas = blaslt::BlasLt::new(&dev.label, &pool, holder.clone())?;
        Ok(Self {
            info,
            registered: memory::Registered::new(&dev.label, memory::registered::MAX_BYTES),
            landings: memory::Landings::new(&dev.label, memory::landing::MAX_BYTES),
            blocks: block::block_graphs(),
            up: memory::Staging::new(&dev.label),
            down: memory::Staging::new(&dev.label),
            kernels: kernels::Kernels::new(&dev.label, dev.arch, compiler, holder.clone()),
            timeline: timing::Timeline::new(dev.clone()),
            blas,
            pool,
            dev,
            holder,
            launch_lock: Mutex::new(()),
            capturing: std::sync::RwLock::new(()),
            accounts: std::sync::OnceLock::new(),
            opts,
        })
    }

    /// With [`CudaOptions::hold_stream`], holds the compute stream here until
    /// [`CudaBackend::release_stream`] (an op about to queue its work, under `launch_lock`);
    /// without it, nothing.
    fn hold_stream(&self) -> Result<()> {
        if !self.opts.hold_stream {
            return Ok(());
        }
        self.holder.hold(&self.dev)
    }

    /// Lets the held compute stream go: once an op's work is queued, and before any host
    /// wait for the stream inside an op.
    fn release_stream(&self) {
        self.holder.release();
    }

    /// How many of this device's stream holds ([`CudaOptions::hold_stream`]) went on by
    /// themselves at [`HOLD_TIMEOUT`] before their op was queued (each logged; such an op's
    /// device time includes host time). Zero when nothing inside an op waits for the stream.
    pub fn holds_timed_out(&self) -> u64 {
        self.holder.timed_out()
    }

    /// Pool statistics.
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Frees the pool's cached blocks (after waiting for queued work).
    pub fn trim_pool(&self) -> Result<()> {
        let _c = self.capturing.read().unwrap_or_else(|e| e.into_inner());
        self.dev.bind()?;
        self.pool.trim()
    }

    /// Compute capability, major * 10 + minor (90 on Hopper).
    pub fn arch(&self) -> u32 {
        self.dev.arch
    }

    /// Device ordinal.
    pub fn ordinal(&self) -> usize {
        self.dev.ordinal
    }

    /// Largest dynamic shared memory one block may use, bytes.
    pub fn max_shared_memory(&self) -> usize {
        self.dev.max_smem_optin
    }

    /// The precision logical f32 tensors are stored in.
    pub fn dtype(&self) -> CudaDType {
        self.opts.dtype
    }

    /// The options the device was opened with.
    pub fn options(&self) -> &CudaOptions {
        &self.opts
    }

    /// Turns output poisoning on or off.
    pub fn set_poison(&mut self, on: bool) {
        self.opts.poison = on;
    }

    /// Compiles (or loads from the disk cache) every kernel module now.
    pub fn warm_up(&self) -> Result<()> {
        self.dev.bind()?;
        for m in tandem_gpu_kernels::Module::ALL {
            if let Some(k) = m.entry_points().first() {
                self.kernels.preload(k)?;
            }
        }
        Ok(())
    }

    fn storage<'a>(&self, s: &'a DeviceStorage) -> Result<&'a CudaStorage> {
        if s.device != self.info.id {
            return Err(Error::Internal(format!("{s:?} is not on {}", self.info.id)));
        }
        s.downcast::<CudaStorage>()
            .ok_or_else(|| Error::Internal(format!("{s:?} is not CUDA storage")))
    }

    fn wrap(&self, meta: TensorMeta, st: CudaStorage) -> DeviceStorage {
        DeviceStorage::new(self.info.id, meta, st)
    }

    /// Uploads a float host tensor stored as f32 on the device (see
    /// [`CudaDType::input_precision`]), through the same pinned staging as [`Backend::upload`].
    fn upload_f32(&self, host: &Tensor) -> Result<DeviceStorage> {
        self.dev.bind()?;
        let meta = host.meta();
        let v: Vec<f32> = host.to_f32().iter().copied().collect();
        let bytes = v.len() * 4;
        let buf = self.pool.alloc(bytes)?;
        if bytes > 0 {
            self.order_copies_after_compute()?;
            let src: &[u8] = bytemuck::cast_slice(&v);
            self.up
                .upload(buf.ptr(), bytes, 4, self.dev.copy_stream, |off, stage| {
                    let n = stage.len();
                    stage.copy_from_slice(&src[off..off + n]);
                    Ok(())
                })?;
            self.order_after_copies()?;
        }
        Ok(self.wrap(meta, CudaStorage::new(buf, DType::F32)))
    }

    /// Uploads `host` (the tensor of the CPU replica `st`) by DMA straight from its pages when
    /// they are registered ([`memory::Registered`]: a tensor uploaded the second time or
    /// later); f32 goes over raw and is rounded to the storage precision on the device, on
    /// the copy stream. `None`: the caller stages it.
    fn upload_registered(
        &self,
        st: &DeviceStorage,
        host: &Tensor,
    ) -> Result<Option<DeviceStorage>> {
        fn bytes_of<T: bytemuck::Pod>(a: &ndarray::ArrayD<T>) -> Option<&[u8]> {
            a.as_slice().map(bytemuck::cast_slice)
        }
        let half = self.opts.dtype.dtype();
        let (bytes, phys, cast) = match host.data() {
            HostData::F32(a) => (
                bytes_of(a),
                half,
                Some(if half == DType::F16 {
                    "cast_f32_f16"
                } else {
                    "cast_f32_bf16"
                }),
            ),
            HostData::BF16(a) if half == DType::BF16 => (bytes_of(a), half, None),
            HostData::F16(a) if half == DType::F16 => (bytes_of(a), half, None),
            HostData::I32(a) => (bytes_of(a), DType::I32, None),
            _ => return Ok(None),
        };
        let Some(bytes) = bytes else { return Ok(None) };
        self.dev.bind()?;
        let Some(range) = self.registered.range(st, bytes)? else {
            return Ok(None);
        };
        let n = host.meta().numel();
        let out = self.pool.alloc(n * phys.size())?;
        let l = &self.dev.label;
        let copy = self.dev.copy_stream;
        // SAFETY: the range is registered and kept alive (with its tensor) until the event
        // `copied` records completes.
        let src = unsafe { std::slice::from_raw_parts(range.ptr, range.len) };
        // Raw f32 lands in `raw` and is rounded into `out` by a kernel on the copy stream.
        let raw = match cast {
            Some(_) => Some(self.pool.alloc(range.len)?),
            None => None,
        };
        let landing = raw.as_ref().map_or(out.ptr(), |r| r.ptr());
        self.order_copies_after_compute()?;
        // SAFETY: the landing buffer holds range.len bytes.
        unsafe { drv::memcpy_htod_async(landing, src, copy) }.ctx(l, "cuMemcpyHtoDAsync")?;
        self.registered.copied(range, copy)?;
        if let Some(kernel) = cast {
            self.kernels.launch(
                kernel,
                kernels::Dims::stride(n as u64, 256, self.dev.sms),
                copy,
                &[
                    kernels::Arg::Ptr(landing),
                    kernels::Arg::Ptr(out.ptr()),
                    kernels::Arg::U64(n as u64),
                ],
            )?;
        }
        self.order_after_copies()?;
        // `raw` goes back to the pool only now: later users of its block, on either stream,
        // are ordered after the cast.
        drop(raw);
        Ok(Some(self.wrap(host.meta(), CudaStorage::new(out, phys))))
    }

    /// Registered host memory now: (bytes, tensors).
    pub fn registered_host(&self) -> (usize, usize) {
        self.registered.usage()
    }

    /// Copies `src` (storage of another CUDA device, `st` its CUDA storage) straight over the
    /// GPUs' link (NVLink or PCIe peer-to-peer) with `cuMemcpyPeerAsync`, after everything
    /// queued on the source device; `None` when the two GPUs cannot access each other (the
    /// caller then stages through the host). Returns once the copy completed, so the source
    /// may be freed at once.
    fn peer_copy(&self, src: &DeviceStorage, st: &CudaStorage) -> Result<Option<DeviceStorage>> {
        use cudarc::driver::sys;
        let l = &self.dev.label;
        let call = |r: sys::CUresult, what: &str| -> Result<()> {
            if r == sys::CUresult::CUDA_SUCCESS {
                Ok(())
            } else {
                Err(Error::Device {
                    device: l.clone(),
                    msg: format!("{what} failed: {r:?}"),
                    source: None,
                })
            }
        };
        let src_ord = src.device.index;
        let mut src_dev: sys::CUdevice = 0;
        let mut can: std::os::raw::c_int = 0;
        // SAFETY: plain queries; cuInit ran when this device opened.
        unsafe {
            call(
                sys::cuDeviceGet(&mut src_dev, src_ord as std::os::raw::c_int),
                "cuDeviceGet",
            )?;
            let mut own: sys::CUdevice = 0;
            call(
                sys::cuDeviceGet(&mut own, self.dev.ordinal as std::os::raw::c_int),
                "cuDeviceGet",
            )?;
            call(
                sys::cuDeviceCanAccessPeer(&mut can, own, src_dev),
                "cuDeviceCanAccessPeer",
            )?;
        }
        if can == 0 {
            return Ok(None);
        }
        let mut src_ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the source's primary context is retained by its backend (for the process's
        // life); retaining again only counts up, released below.
        unsafe {
            call(
                sys::cuDevicePrimaryCtxRetain(&mut src_ctx, src_dev),
                "cuDevicePrimaryCtxRetain",
            )?;
        }
        let copied = (|| -> Result<DeviceStorage> {
            // The source's queued kernels (the one that wrote `src` among them) finish first.
            // SAFETY: the source context is alive (retained); set current on this thread only
            // for the wait.
            unsafe {
                call(sys::cuCtxSetCurrent(src_ctx), "cuCtxSetCurrent")?;
                call(sys::cuCtxSynchronize(), "cuCtxSynchronize (source device)")?;
            }
            self.dev.bind()?;
            // SAFETY: this device's context is current; enabling twice is reported and fine.
            let r = unsafe { sys::cuCtxEnablePeerAccess(src_ctx, 0) };
            if r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
                call(r, "cuCtxEnablePeerAccess")?;
            }
            let bytes = src.meta.numel() * st.phys.size();
            let buf = self.pool.alloc(bytes)?;
            if bytes > 0 {
                self.order_copies_after_compute()?;
                let copy = self.dev.copy_stream;
                // SAFETY: both allocations hold `bytes`; the source completed its writes
                // (synchronized above) and is held by the caller until this returns.
                unsafe {
                    call(
                        sys::cuMemcpyPeerAsync(
                            buf.ptr(),
                            self.dev.context(),
                            st.ptr(),
                            src_ctx,
                            bytes,
                            copy,
                        ),
                        "cuMemcpyPeerAsync",
                    )?;
                }
                // SAFETY: the copy stream is alive.
                unsafe { drv::stream::synchronize(copy) }.ctx(l, "cuStreamSynchronize")?;
            }
            Ok(self.wrap(src.meta.clone(), CudaStorage::new(buf, st.phys)))
        })();
        // SAFETY: balances the retain above.
        unsafe {
            let _ = sys::cuDevicePrimaryCtxRelease_v2(src_dev);
        }
        self.dev.bind()?;
        copied.map(Some)
    }

    /// Registered download landings now: (bytes, tensors).
    pub fn landing_host(&self) -> (usize, usize) {
        self.landings.usage()
    }

    /// Downloads `storage` by DMA into a reused registered host tensor ([`memory::Landings`]:
    /// a result of the same shape and dtype seen before); 16-bit storage read back as f32 is
    /// widened on the device first, on the copy stream. `None`: the caller downloads into a
    /// fresh tensor.
    fn download_landed(&self, storage: &DeviceStorage) -> Result<Option<DeviceStorage>> {
        let st = self.storage(storage)?;
        let meta = &storage.meta;
        // The device words and, where they differ, the kernel that widens them.
        let widen = match (st.phys, meta.dtype) {
            (DType::BF16, DType::BF16) | (DType::F16, DType::F16) | (DType::F32, DType::F32) => {
                None
            }
            (DType::I32, DType::I32) => None,
            (DType::BF16, DType::F32) => Some("cast_bf16_f32"),
            (DType::F16, DType::F32) => Some("cast_f16_f32"),
            _ => return Ok(None),
        };
        self.dev.bind()?;
        let Some(taken) = self.landings.take(meta)? else {
            return Ok(None);
        };
        let copied = (|| -> Result<()> {
            let n = meta.numel();
            let l = &self.dev.label;
            let copy = self.dev.copy_stream;
            self.order(self.dev.stream, copy)?;
            let wide = match widen {
                Some(kernel) => {
                    let wide = self.pool.alloc(n * 4)?;
                    self.kernels.launch(
                        kernel,
                        kernels::Dims::stride(n as u64, 256, self.dev.sms),
                        copy,
                        &[
                            kernels::Arg::Ptr(st.ptr()),
                            kernels::Arg::Ptr(wide.ptr()),
                            kernels::Arg::U64(n as u64),
                        ],
                    )?;
                    Some(wide)
                }
                None => None,
            };
            let src = wide.as_ref().map_or(st.ptr(), |w| w.ptr());
            // SAFETY: the landing is registered, `taken.len()` bytes long, held by this call
            // alone (taken out of the pool) and read by nobody until the copy completed.
            let dst = unsafe { std::slice::from_raw_parts_mut(taken.ptr(), taken.len()) };
            // SAFETY: `src` holds `taken.len()` bytes on this device (the storage, or the
            // widened copy of it).
            unsafe { drv::memcpy_dtoh_async(dst, src, copy) }.ctx(l, "cuMemcpyDtoHAsync")?;
            // SAFETY: the copy stream is alive; waiting makes the landing safe to read.
            unsafe { drv::stream::synchronize(copy) }.ctx(l, "cuStreamSynchronize")?;
            drop(wide);
            Ok(())
        })();
        match copied {
            Ok(()) => {
                let t = self.landings.give_back(taken);
                Ok(Some(DeviceStorage::shared(DeviceId::CPU, meta.clone(), t)))
            }
            Err(e) => {
                self.landings.discard(taken);
                Err(e)
            }
        }
    }

    /// Makes the compute stream wait (on the device, not the host) for everything queued on
    /// the copy stream so far.
    fn order_after_copies(&self) -> Result<()> {
        self.order(self.dev.copy_stream, self.dev.stream)
    }

    /// Makes the copy stream wait for everything queued on the compute stream so far, before
    /// a copy writes a block from the pool: the block may have been returned by an op whose
    /// kernels are still queued (the executor queues launches ahead of their completion,
    /// [`Backend::orders_launches`], and an op frees its scratch as soon as it is queued).
    /// Reuse on the compute stream is ordered by the stream itself; the copy stream needs this.
    fn order_copies_after_compute(&self) -> Result<()> {
        self.order(self.dev.stream, self.dev.copy_stream)
    }

    /// Makes `waiter` wait for the work queued on `first` so far, with an event.
    fn order(
        &self,
        first: cudarc::driver::sys::CUstream,
        waiter: cudarc::driver::sys::CUstream,
    ) -> Result<()> {
        // Not while a graph is being captured on the compute stream (one end of every order).
        let _c = self.capturing.read().unwrap_or_else(|e| e.into_inner());
        let l = &self.dev.label;
        let ev = drv::event::create(cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .ctx(l, "cuEventCreate")?;
        // SAFETY: both streams were created by `device::Device::open`; an event destroyed
        // after being waited on is released once it completed.
        unsafe {
            drv::event::record(ev, first).ctx(l, "cuEventRecord")?;
            drv::stream::wait_event(
                waiter,
                ev,
                cudarc::driver::sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
            .ctx(l, "cuStreamWaitEvent")?;
            drv::event::destroy(ev).ctx(l, "cuEventDestroy")
        }
    }

    /// Downloads `bytes` of `st` (after the compute stream's queued work) through the pinned
    /// slots, converting each landed chunk of device words `S` into `T` on the rayon threads.
    fn fetch<S, T>(
        &self,
        st: &CudaStorage,
        n: usize,
        f: impl Fn(S) -> T + Sync + Send,
    ) -> Result<Vec<T>>
    where
        S: bytemuck::Pod + Sync,
        T: Copy + Default + Send,
    {
        let elem = std::mem::size_of::<S>();
        let mut out = vec![T::default(); n];
        advise_huge_pages(&mut out);
        if n == 0 {
            return Ok(out);
        }
        self.order(self.dev.stream, self.dev.copy_stream)?;
        self.down.download(
            st.ptr(),
            n * elem,
            elem,
            self.dev.copy_stream,
            |off, bytes| {
                let src: &[S] = bytemuck::cast_slice(bytes);
                let first = off / elem;
                let dst = out.get_mut(first..first + src.len()).ok_or_else(|| {
                    Error::Internal(format!("download chunk at {off} past {n} values"))
                })?;
                dst.par_chunks_mut(1 << 15)
                    .zip(src.par_chunks(1 << 15))
                    .for_each(|(d, s)| {
                        for (d, s) in d.iter_mut().zip(s) {
                            *d = f(*s);
                        }
                    });
                Ok(())
            },
        )?;
        Ok(out)
    }
}

/// A host tensor's values as one contiguous slice (borrowed where the array already is).
enum Source<'a> {
    F32(std::borrow::Cow<'a, [f32]>),
    Bf16(std::borrow::Cow<'a, [bf16]>),
    F16(std::borrow::Cow<'a, [f16]>),
    I32(std::borrow::Cow<'a, [i32]>),
}

/// Asks the kernel to back a large fresh host allocation (still untouched: a zeroed `Vec`
/// is mapped lazily) with transparent huge pages, so the download's first writes fault it in
/// 2 MiB at a time instead of 4 KiB: faulting fresh pages in, not the link, bounded downloads
/// (6 GB/s for 256 MiB on the H100 machine against 55 GB/s pinned). Advice only: a kernel
/// without THP, or with it off, ignores it.
fn advise_huge_pages<T>(v: &mut [T]) {
    const HUGE: usize = 2 << 20;
    let bytes = std::mem::size_of_val(v);
    if bytes < 2 * HUGE {
        return;
    }
    let start = v.as_mut_ptr() as usize;
    let first = start.next_multiple_of(HUGE);
    let end = (start + bytes) / HUGE * HUGE;
    if end > first {
        // SAFETY: [first, end) lies inside `v`'s allocation; MADV_HUGEPAGE changes how pages
        // are backed, never their contents.
        let r =
            unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) };
        if r != 0 {
            tracing::trace!("madvise(MADV_HUGEPAGE) declined");
        }
    }
}

fn contiguous<T: Clone>(a: &ndarray::ArrayD<T>) -> std::borrow::Cow<'_, [T]> {
    match a.as_slice() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(a.iter().cloned().collect()),
    }
}

impl Source<'_> {
    /// Writes the device words of values `first..` into `stage` (as many as it holds):
    /// floats rounded to nearest even into `half`, i32 as is.
    fn encode(&self, half: CudaDType, first: usize, stage: &mut [u8]) -> Result<()> {
        fn conv<T: Copy + Sync, D: bytemuck::Pod + Send>(
            src: &[T],
            first: usize,
            stage: &mut [u8],
            f: impl Fn(T) -> D + Sync + Send,
        ) -> Result<()> {
            let dst: &mut [D] = bytemuck::cast_slice_mut(stage);
            let src = src.get(first..first + dst.len()).ok_or_else(|| {
                Error::Internal(format!("upload chunk at value {first} past the tensor"))
            })?;
            dst.par_chunks_mut(1 << 15)
                .zip(src.par_chunks(1 << 15))
                .for_each(|(d, s)| {
                    for (d, s) in d.iter_mut().zip(s) {
                        *d = f(*s);
                    }
                });
            Ok(())
        }
        match (self, half) {
            (Source::F32(a), CudaDType::Bf16) => {
                conv(a, first, stage, |x| bf16::from_f32(x).to_bits())
            }
            (Source::F32(a), CudaDType::F16) => {
                conv(a, first, stage, |x| f16::from_f32(x).to_bits())
            }
            (Source::Bf16(a), CudaDType::Bf16) => conv(a, first, stage, |x| x.to_bits()),
            (Source::Bf16(a), CudaDType::F16) => {
                conv(a, first, stage, |x| f16::from_f32(x.into()).to_bits())
            }
            (Source::F16(a), CudaDType::Bf16) => {
                conv(a, first, stage, |x| bf16::from_f32(x.into()).to_bits())
            }
            (Source::F16(a), CudaDType::F16) => conv(a, first, stage, |x| x.to_bits()),
            (Source::I32(a), _) => conv(a, first, stage, |x| x),
        }
    }
}

impl Backend for CudaBackend {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn numerics(&self) -> super::Numerics {
        if self.opts.moe_fp8 && tandem_gpu_kernels::Module::MoeExpertsSm90a.runs_on(self.dev.arch) {
            return super::Numerics::Fp8;
        }
        super::Numerics::of_dtype(self.opts.dtype.dtype())
    }

    fn supports(&self, op: &Op, inputs: &[TensorMeta]) -> Support {
        ops::supports(
            self.dev.arch,
            self.dev.max_smem_optin,
            self.opts.attention_variant,
            op,
            inputs,
        )
    }

    fn attach_memory(&self, accounts: &Arc<crate::memory::DeviceMemory>) {
        // Set once: a backend belongs to one registry.
        let _ = self.accounts.set(accounts.clone());
    }

    fn derived_weight_bytes(&self, op: &Op, inputs: &[TensorMeta], input: usize) -> u64 {
        // The FP8 experts' e4m3 weights, as their first use charges them.
        ops::derived_bytes(self.dev.arch, &self.opts, op, inputs, input)
    }

    fn stored_bytes(&self, meta: &TensorMeta) -> u64 {
        // Floats in 16 bits (bf16 or f16), i32 as is.
        let size = if meta.dtype.is_float() {
            2
        } else {
            meta.dtype.size()
        };
        (meta.numel() * size) as u64
    }

    fn upload(&self, host: &Tensor) -> Result<DeviceStorage> {
        self.dev.bind()?;
        let meta = host.meta();
        let half = self.opts.dtype;
        let (phys, bytes) = match host.data() {
            HostData::F32(_) | HostData::BF16(_) | HostData::F16(_) => {
                (half.dtype(), meta.numel() * 2)
            }
            HostData::I32(_) => (DType::I32, meta.numel() * 4),
            other => {
                return Err(Error::Unsupported {
                    op: "upload".into(),
                    device: self.dev.label.clone(),
                    why: format!(
                        "{} tensors are not stored on CUDA devices (f32, bf16, f16 and i32 are)",
                        Tensor::new(other.clone()).dtype()
                    ),
                });
            }
        };
        let buf = self.pool.alloc(bytes)?;
        if bytes > 0 {
            self.order_copies_after_compute()?;
            let src = match host.data() {
                HostData::F32(a) => Source::F32(contiguous(a)),
                HostData::BF16(a) => Source::Bf16(contiguous(a)),
                HostData::F16(a) => Source::F16(contiguous(a)),
                HostData::I32(a) => Source::I32(contiguous(a)),
                _ => return Err(Error::Internal("upload: unexpected host data".into())),
            };
            let elem = phys.size();
            self.up.upload(
                buf.ptr(),
                bytes,
                elem,
                self.dev.copy_stream,
                |off, stage| src.encode(half, off / elem, stage),
            )?;
            // Kernels that read the data run after the copies; no host thread waits for them.
            self.order_after_copies()?;
        }
        Ok(self.wrap(meta, CudaStorage::new(buf, phys)))
    }

    fn upload_storage(&self, st: &DeviceStorage) -> Result<DeviceStorage> {
        let host = st.host_tensor("CPU")?;
        match self.upload_registered(st, host)? {
            Some(d) => Ok(d),
            None => self.upload(host),
        }
    }

    fn upload_for(&self, host: &Tensor, op: &Op, input: usize) -> Result<DeviceStorage> {
        let float = matches!(
            host.data(),
            HostData::F32(_) | HostData::BF16(_) | HostData::F16(_)
        );
        if float && self.opts.dtype.input_precision(op, input) == DType::F32 {
            self.upload_f32(host)
        } else {
            self.upload(host)
        }
    }

    fn copy_peer(&self, src: &DeviceStorage) -> Result<Option<DeviceStorage>> {
        if src.device.kind != DeviceKind::Cuda || src.device == self.info.id {
            return Ok(None);
        }
        let Some(st) = src.downcast::<CudaStorage>() else {
            return Ok(None);
        };
        self.peer_copy(src, st)
    }

    fn download_storage(&self, storage: &DeviceStorage) -> Result<DeviceStorage> {
        match self.download_landed(storage)? {
            Some(d) => Ok(d),
            None => Ok(DeviceStorage::new(
                DeviceId::CPU,
                storage.meta.clone(),
                self.download(storage)?,
            )),
        }
    }

    fn download(&self, storage: &DeviceStorage) -> Result<Tensor> {
        self.dev.bind()?;
        let st = self.storage(storage)?;
        let meta = storage.meta.clone();
        let n = meta.numel();
        let shape = ndarray::IxDyn(&meta.shape);
        let bad = |e: ndarray::ShapeError| Error::Internal(format!("download: {e}"));
        let phys = st.phys;
        let half_to_f32 = move |bits: u16| match phys {
            DType::F16 => f32::from(f16::from_bits(bits)),
            _ => f32::from(bf16::from_bits(bits)),
        };
        Ok(match (phys, meta.dtype) {
            (DType::BF16 | DType::F16, DType::BF16) => {
                let v: Vec<bf16> = if phys == DType::BF16 {
                    self.fetch(st, n, bf16::from_bits)?
                } else {
                    self.fetch(st, n, |b: u16| bf16::from_f32(half_to_f32(b)))?
                };
                Tensor::new(HostData::BF16(
                    ndarray::ArrayD::from_shape_vec(shape, v).map_err(bad)?,
                ))
            }
            (DType::BF16 | DType::F16, DType::F16) => {
                let v: Vec<f16> = if phys == DType::F16 {
                    self.fetch(st, n, f16::from_bits)?
                } else {
                    self.fetch(st, n, |b: u16| f16::from_f32(half_to_f32(b)))?
                };
                Tensor::new(HostData::F16(
                    ndarray::ArrayD::from_shape_vec(shape, v).map_err(bad)?,
                ))
            }
            (DType::BF16 | DType::F16, _) => {
                let v: Vec<f32> = self.fetch(st, n, half_to_f32)?;
                Tensor::from_f32(ndarray::ArrayD::from_shape_vec(shape, v).map_err(bad)?)
            }
            (DType::F32, _) => {
                let v: Vec<f32> = self.fetch(st, n, |x: f32| x)?;
                Tensor::from_f32(ndarray::ArrayD::from_shape_vec(shape, v).map_err(bad)?)
            }
            (DType::I32, _) => {
                let v: Vec<i32> = self.fetch(st, n, |x: i32| x)?;
                Tensor::from_i32(ndarray::ArrayD::from_shape_vec(shape, v).map_err(bad)?)
            }
            (p, _) => return Err(Error::Internal(format!("unexpected device precision {p}"))),
        })
    }

    fn orders_launches(&self) -> bool {
        // Every op's kernels (and a fused unit's graph) run on the one compute stream;
        // downloads and peer copies wait for it (`fetch`, `download_landed`, `peer_copy`),
        // and uploads into pool blocks wait for it too (`order_copies_after_compute`).
        true
    }

    fn fuses(&self, unit: &super::FusedUnit) -> bool {
        matches!(unit, super::FusedUnit::MoeBlock(_))
    }

    fn launch_fused(&self, unit: &super::FusedUnit, inputs: &[&DeviceStorage]) -> Result<Launch> {
        let super::FusedUnit::MoeBlock(route) = unit;
        let &[x, router, gate_up, down] = inputs else {
            return Err(Error::Internal(format!(
                "moe block: {} inputs given, 4 expected (x, router, gate_up, down)",
                inputs.len()
            )));
        };
        let ins = MoeBlockInputs {
            x,
            router,
            gate_up,
            down,
        };
        let block = MoeBlock { route: *route };
        self.moe_block(&block, &ins, BlockMode::Auto).map(|b| {
            {
                let mut info = b.info.lock().unwrap_or_else(|e| e.into_inner());
                let how = match &b.graph {
                    GraphUse::Eager { why } => match b.eager_launches {
                        Some(n) => format!("eager, {n} launches ({why})"),
                        None => format!("eager ({why})"),
                    },
                    GraphUse::Captured { nodes } => format!("captured as one graph, {nodes}"),
                    GraphUse::Replayed { nodes } => format!("one graph replayed, {nodes}"),
                };
                info.kernel = format!("moe block [{how}]: {}", info.kernel);
            }
            let [aux, z] = b.losses;
            Launch {
                outputs: vec![b.output, aux, z],
                done: b.done,
                info: b.info,
            }
        })
    }

    fn launch(&self, op: &Op, inputs: &[&DeviceStorage]) -> Result<Launch> {
        self.dev.bind()?;
        let metas: Vec<TensorMeta> = inputs.iter().map(|s| s.meta.clone()).collect();
        let out_metas = op.validate(&metas)?;
        if let Support::No(why) = self.supports(op, &metas) {
            return Err(Error::Unsupported {
                op: op.name().into(),
                device: self.dev.label.clone(),
                why,
            });
        }
        let ins = inputs
            .iter()
            .map(|s| self.storage(s))
            .collect::<Result<Vec<_>>>()?;
        let _g = self.launch_lock.lock().unwrap_or_else(|e| e.into_inner());
        // Whatever way this returns, a hold its op took is let go.
        let _release = Release(self);
        let locked = std::time::Instant::now();
        let prep = ops::Cx::new(self);
        ops::prepare(&prep, op)?;
        let outs = ops::alloc_outputs(&prep, op, &out_metas)?;
        if self.opts.poison {
            for o in &outs {
                prep.poison(o)?;
            }
        }
        // timed from the op's first device work (its host preparation is not device time)
        let cx = ops::Cx::timed(self);
        let kernel = ops::run(&cx, op, &ins, &metas, &outs)?;
        let region = match cx.into_region() {
            Some((r, at)) => {
                tracing::trace!(
                    device = %self.dev.label, op = op.name(), %kernel,
                    "host: {:.1} us before the first device work, {:.1} us queueing inside the timed region",
                    at.duration_since(locked).as_secs_f64() * 1e6,
                    at.elapsed().as_secs_f64() * 1e6
                );
                r
            }
            None => self.timeline.begin(&self.dev)?,
        };
        let info = Arc::new(Mutex::new(LaunchInfo {
            kernel,
            device_time: None,
            cycles: None,
        }));
        let done = self.timeline.end(&self.dev, region, info.clone())?;
        self.release_stream();
        let outputs = out_metas
            .into_iter()
            .zip(outs)
            .map(|(m, s)| self.wrap(m, s))
            .collect();
        Ok(Launch {
            outputs,
            done,
            info,
        })
    }

    fn launch_overhead(&self) -> std::time::Duration {
        std::time::Duration::from_micros(8)
    }

    fn synchronize(&self) -> Result<()> {
        let _c = self.capturing.read().unwrap_or_else(|e| e.into_inner());
        self.dev.synchronize()
    }
}

/// Lets a held compute stream go when dropped (an op's launch, on every way out).
struct Release<'a>(&'a CudaBackend);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.release_stream();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Env as _;

    /// Skips a test that needs the GPU or NVRTC (printed), or fails it where the machine must
    /// run the GPU tests (`TANDEM_REQUIRE_GPU=1`, as tandem_tests::skip does).
    fn skip_gpu(why: &str) {
        let required = crate::options::ProcessEnv
            .text("TANDEM_REQUIRE_GPU")
            .ok()
            .flatten()
            .is_some_and(|v| matches!(v.as_str(), "1" | "on" | "true"));
        assert!(
            !required,
            "TANDEM_REQUIRE_GPU=1 but the GPU test cannot run: {why}"
        );
        println!("skipped: {why}");
    }

    /// Device 0, or `None` once [`skip_gpu`] has said why there is none.
    fn device_or_skip() -> Option<device::Device> {
        if let Err(why) = probe::check(&CudaOptions::default()) {
            skip_gpu(&why);
            return None;
        }
        match device::Device::open(0) {
            Ok((d, _)) => Some(d),
            Err(e) => {
                skip_gpu(&e.to_string());
                None
            }
        }
    }

    #[test]
    fn discovery_finds_devices_or_says_why_not() {
        let (found, missing) = discover_with(&CudaOptions::default());
        if found.is_empty() {
            assert!(!missing.is_empty(), "no device and no reason");
            for m in &missing {
                assert_eq!(m.kind, DeviceKind::Cuda);
                assert!(!m.reason.is_empty());
                skip_gpu(&m.reason);
            }
        } else {
            for b in &found {
                assert_eq!(b.id().kind, DeviceKind::Cuda);
                assert!(b.info().memory_bytes > 0);
            }
        }
    }

    /// Every module, bf16 and f16 entry points alike, compiles to CUBIN for sm_80 and sm_90a
    /// wherever NVRTC is installed (no GPU needed).
    #[test]
    fn every_module_compiles_for_sm80_and_sm90a_where_nvrtc_is_present() {
        let opts = CudaOptions::default();
        if !probe::nvrtc_present(&opts) {
            skip_gpu("NVRTC not found");
            return;
        }
        let (a, b) = compile::nvrtc_version();
        let compiler = compile::Compiler::new(&opts);
        for m in tandem_gpu_kernels::Module::ALL {
            for arch in [80, 90] {
                if !m.runs_on(arch) {
                    continue;
                }
                let bin = compiler
                    .compile("nvrtc", m, &compiler.options(m, arch))
                    .unwrap_or_else(|e| panic!("NVRTC {a}.{b}, {} for sm_{arch}: {e}", m.path()));
                assert!(!bin.is_empty());
                let flag = compile::arch_flag(arch);
                println!(
                    "NVRTC {a}.{b}: {} {flag}: {} bytes of CUBIN",
                    m.name(),
                    bin.len()
                );
            }
        }
    }

    /// A timed region dropped without being closed (its op failed after queueing work) hands
    /// its start event back to the pool; a closed one returns both events once they complete.
    #[test]
    fn timed_regions_return_their_events_to_the_pool() {
        let Some(dev) = device_or_skip().map(Arc::new) else {
            return;
        };
        let tl = timing::Timeline::new(dev.clone());
        let r = tl.begin(&dev).expect("begin");
        assert_eq!(tl.pooled_events(), 0);
        drop(r);
        assert_eq!(tl.pooled_events(), 1, "an unclosed region kept its event");
        let r = tl.begin(&dev).expect("begin");
        assert_eq!(tl.pooled_events(), 0, "the pooled event was not reused");
        let info = Arc::new(Mutex::new(crate::backend::LaunchInfo {
            kernel: "empty region".into(),
            device_time: None,
            cycles: None,
        }));
        let done = tl.end(&dev, r, info.clone()).expect("end");
        done.wait(std::time::Duration::from_secs(10), "an empty region")
            .expect("wait");
        // the watcher signals the fence, then returns the pair
        let t0 = std::time::Instant::now();
        while tl.pooled_events() < 2 && t0.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(tl.pooled_events(), 2);
        let i = info.lock().unwrap_or_else(|e| e.into_inner());
        assert!(
            i.device_time.is_some(),
            "no device time for a completed region"
        );
    }

    /// Work queued after a hold waits for its release; a hold nobody lets go lets the stream
    /// go by itself at [`HOLD_TIMEOUT`], so a host wait for a held stream returns.
    #[test]
    fn a_held_stream_waits_for_its_release_or_its_timeout() {
        // Test code: each `expect` below is a driver call on a device the test opened; its
        // failure is the test failing, and no user, file or device path reaches it.
        use cudarc::driver::sys::{CUevent_flags, cudaError_enum};
        let Some(dev) = device_or_skip() else {
            return;
        };
        let ev = drv::event::create(CUevent_flags::CU_EVENT_DEFAULT).expect("event");
        // A long hold first, so a busy host (other tests compiling) cannot outlast it.
        let hold = timing::Hold::queue_for(&dev, std::time::Duration::from_secs(30)).expect("hold");
        // SAFETY: event and stream are live.
        unsafe { drv::event::record(ev, dev.stream) }.expect("record");
        std::thread::sleep(std::time::Duration::from_millis(5));
        // SAFETY: the event is live.
        let ran = unsafe { drv::event::query(ev) };
        assert!(
            matches!(ran, Err(e) if e.0 == cudaError_enum::CUDA_ERROR_NOT_READY),
            "work after the hold ran before its release: {ran:?}"
        );
        hold.release();
        // SAFETY: as above.
        unsafe { drv::event::synchronize(ev) }.expect("released");
        assert!(!hold.timed_out(), "let go in time, yet timed out");
        drop(hold);
        // Never let go: waiting for the stream still returns, once the hold times out.
        let t0 = std::time::Instant::now();
        let hold = timing::Hold::queue(&dev).expect("hold");
        dev.synchronize().expect("a wait behind a hold");
        assert!(
            hold.timed_out(),
            "the stream went on without a release or a timeout"
        );
        assert!(
            t0.elapsed() >= HOLD_TIMEOUT,
            "the stream went on before the timeout"
        );
        // SAFETY: the event completed and is not used again.
        unsafe { drv::event::destroy(ev) }.expect("destroy");
    }

    /// Each K tile size of a decode ring builds (NVRTC for sm_90a, no GPU needed; a module
    /// takes about half a minute, so one ring a tile size, at its fewest or most stages), and
    /// another ring is another cache entry.
    #[test]
    fn decode_rings_of_every_tile_size_compile_where_nvrtc_is_present() {
        use tandem_gpu_kernels::{DecodeRing, Module};
        let base = CudaOptions::default();
        if !probe::nvrtc_present(&base) {
            skip_gpu("NVRTC not found");
            return;
        }
        let default_key = {
            let c = compile::Compiler::new(&base);
            c.cache_key(
                Module::AttentionDecode,
                90,
                &c.options(Module::AttentionDecode, 90),
            )
        };
        for (tile, stages) in [(4096, 3), (8192, 2), (16384, 3)] {
            let ring = DecodeRing::new(tile, stages, stages).expect("an accepted ring");
            let c = compile::Compiler::new(&CudaOptions {
                decode_ring: Some(ring),
                ..base.clone()
            });
            let o = c.options(Module::AttentionDecode, 90);
            assert!(o.contains(&format!("-DDEC_TILE_ELEMS={tile}")), "{o:?}");
            let bin = c
                .compile("nvrtc", Module::AttentionDecode, &o)
                .unwrap_or_else(|e| panic!("{ring:?}: {e}"));
            assert!(!bin.is_empty());
            assert_ne!(c.cache_key(Module::AttentionDecode, 90, &o), default_key);
            println!("decode ring {ring:?}: built for sm_90a");
        }
    }

    #[test]
    fn cache_keys_depend_on_arch_and_options() {
        use tandem_gpu_kernels::Module;
        let compiler = compile::Compiler::new(&CudaOptions::default());
        let o80 = vec!["--gpu-architecture=sm_80".to_string()];
        let o90 = vec!["--gpu-architecture=sm_90a".to_string()];
        let a = compiler.cache_key(Module::Norm, 80, &o80);
        let b = compiler.cache_key(Module::Norm, 90, &o90);
        let c = compiler.cache_key(Module::Rope, 80, &o80);
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(compile::arch_flag(90), "sm_90a");
        assert_eq!(compile::arch_flag(89), "sm_89");
    }
}
