//! Loaded kernel modules of one device and a checked launch helper.

use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::{Arc, Mutex};

use cudarc::driver::result as drv;
use cudarc::driver::sys;
use tandem_gpu_kernels::Module;

use super::compile::Compiler;
use super::error::{self, DrvResultExt};
use super::timing::Holder;
use crate::error::{Error, Result};

/// A kernel argument, passed by value.
#[derive(Debug, Clone, Copy)]
pub enum Arg {
    /// A device pointer (0 for null).
    Ptr(sys::CUdeviceptr),
    /// int.
    I32(i32),
    /// unsigned long long.
    U64(u64),
    /// float.
    F32(f32),
    /// unsigned short.
    U16(u16),
    /// A tensor map for the TMA (`CUtensorMap`, 128 bytes; `__grid_constant__` in the kernel).
    TensorMap(sys::CUtensorMap),
}

#[derive(Clone, Copy)]
struct Func(sys::CUfunction);
// SAFETY: function handles are plain driver handles, valid in every thread that binds the context.
unsafe impl Send for Func {}

#[derive(Default)]
struct Loaded {
    modules: HashMap<Module, usize>,
    funcs: HashMap<&'static str, Func>,
    /// Dynamic shared memory limit already raised to, per kernel.
    smem: HashMap<&'static str, u32>,
    /// Blocks per multiprocessor, per (kernel, threads, dynamic shared memory).
    per_sm: HashMap<(&'static str, u32, usize), u32>,
    /// Clusters resident at once, per (kernel, threads, dynamic shared memory, cluster size).
    clusters: HashMap<(&'static str, u32, usize, u32), u32>,
}

/// The kernels of one device, loaded lazily (compiled by NVRTC or read from the disk cache).
pub struct Kernels {
    label: String,
    arch: u32,
    compiler: Compiler,
    loaded: Mutex<Loaded>,
    /// The device's stream hold, let go before a module is compiled or loaded.
    holder: Arc<Holder>,
    /// Kernels launched so far (queued or captured), for launch counts.
    launched: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernels({}, sm_{})", self.label, self.arch)
    }
}

/// A launch shape: grid, block, dynamic shared memory.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    /// Grid.
    pub grid: (u32, u32, u32),
    /// Block.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory, bytes.
    pub smem: u32,
}

impl Dims {
    /// 1-D grid and block.
    pub fn linear(grid: u32, block: u32) -> Self {
        Self {
            grid: (grid.max(1), 1, 1),
            block: (block, 1, 1),
            smem: 0,
        }
    }

    /// A grid-stride launch over `n` items: enough blocks to fill the device a few times.
    pub fn stride(n: u64, block: u32, sms: u32) -> Self {
        let want = n.div_ceil(block as u64).max(1);
        let cap = (sms as u64 * 16).max(1);
        Self::linear(want.min(cap) as u32, block)
    }

    /// With dynamic shared memory.
    pub fn smem(mut self, bytes: usize) -> Self {
        self.smem = bytes as u32;
        self
    }
}

impl Kernels {
    /// No modules loaded yet; `compiler` builds them at first use, after `holder` lets the
    /// stream go.
    pub fn new(label: &str, arch: u32, compiler: Compiler, holder: Arc<Holder>) -> Self {
        Self {
            label: label.to_string(),
            arch,
            compiler,
            loaded: Mutex::new(Loaded::default()),
            holder,
            launched: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The function of an entry point, loading its module at first use.
    fn function(&self, name: &'static str) -> Result<sys::CUfunction> {
        let mut l = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = l.funcs.get(name) {
            return Ok(f.0);
        }
        let module = Module::of_kernel(name)
            .ok_or_else(|| Error::Internal(format!("no module defines kernel {name}")))?;
        if !module.runs_on(self.arch) {
            return Err(Error::Unsupported {
                op: name.into(),
                device: self.label.clone(),
                why: format!(
                    "{} runs on sm_{} (this device is sm_{})",
                    module.path(),
                    module.min_arch(),
                    self.arch
                ),
            });
        }
        let md = match l.modules.get(&module) {
            Some(&m) => m as sys::CUmodule,
            None => {
                // Compiling or loading is host work the device must not be held for.
                self.holder.release();
                let bin = self.compiler.cubin(&self.label, module, self.arch)?;
                // SAFETY: `bin` is a complete CUBIN image, alive for the call.
                let m = unsafe { drv::module::load_data(bin.as_ptr() as *const c_void) }
                    .map_err(|e| error::module_load(&self.label, module.path(), e))?;
                l.modules.insert(module, m as usize);
                m
            }
        };
        let cname = CString::new(name).map_err(|e| Error::Internal(e.to_string()))?;
        // SAFETY: md is a loaded module.
        let f = unsafe { drv::module::get_function(md, cname) }
            .ctx(&self.label, &format!("cuModuleGetFunction({name})"))?;
        l.funcs.insert(name, Func(f));
        Ok(f)
    }

    fn smem_raised(&self, name: &'static str, bytes: u32) -> bool {
        let l = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        l.smem.get(name).is_some_and(|&b| b >= bytes)
    }

    /// Kernels launched on this device so far (every stream; a launch recorded into a graph
    /// counts once, when recorded). The difference across a piece of work is its launch
    /// count.
    pub fn launched(&self) -> u64 {
        self.launched.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Loads the module of `name` now (so compile time stays out of timed launches).
    pub fn preload(&self, name: &'static str) -> Result<()> {
        self.function(name).map(|_| ())
    }

    /// Launches `name` on `stream`, raising its dynamic shared memory limit when needed.
    pub fn launch(
        &self,
        name: &'static str,
        dims: Dims,
        stream: sys::CUstream,
        args: &[Arg],
    ) -> Result<()> {
        self.launch_with(name, dims, stream, args, false)
    }

    /// As [`Kernels::launch`], as a cooperative launch (every block co-resident, or the
    /// launch fails): for kernels that synchronise their whole grid. The grid must not exceed
    /// [`Kernels::blocks_per_sm`] times the multiprocessors.
    pub fn launch_cooperative(
        &self,
        name: &'static str,
        dims: Dims,
        stream: sys::CUstream,
        args: &[Arg],
    ) -> Result<()> {
        self.launch_with(name, dims, stream, args, true)
    }

    /// How many blocks of `threads` threads and `smem` bytes of dynamic shared memory of
    /// kernel `name` fit on one multiprocessor at once.
    pub fn blocks_per_sm(&self, name: &'static str, threads: u32, smem: usize) -> Result<u32> {
        self.memo(
            |l| &mut l.per_sm,
            (name, threads, smem),
            || {
                let f = self.function(name)?;
                // SAFETY: f is a valid function.
                let n = unsafe {
                    drv::occupancy::max_active_block_per_multiprocessor(f, threads as i32, smem)
                }
                .ctx(&self.label, &format!("occupancy of {name}"))?;
                Ok(n.max(0) as u32)
            },
        )
    }

    /// The value `map` (one of the occupancy caches) holds for `key`, computed by `compute`
    /// (outside the lock: it may load a module) and kept the first time.
    fn memo<K: std::hash::Hash + Eq>(
        &self,
        map: fn(&mut Loaded) -> &mut HashMap<K, u32>,
        key: K,
        compute: impl FnOnce() -> Result<u32>,
    ) -> Result<u32> {
        {
            let mut l = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(&n) = map(&mut l).get(&key) {
                return Ok(n);
            }
        }
        let n = compute()?;
        let mut l = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        map(&mut l).insert(key, n);
        Ok(n)
    }

    /// How many clusters of `cluster` blocks (`threads` threads, `smem` bytes of dynamic
    /// shared memory each) of kernel `name`, which declares that cluster size, the device runs
    /// at once (`cuOccupancyMaxActiveClusters`; asked once per shape, and where none fits, a
    /// warning is logged that once).
    pub fn max_active_clusters(
        &self,
        name: &'static str,
        threads: u32,
        smem: usize,
        cluster: u32,
    ) -> Result<u32> {
        self.memo(
            |l| &mut l.clusters,
            (name, threads, smem, cluster),
            || {
                let f = self.function(name)?;
                self.raise_smem(name, f, smem as u32)?;
                let config = sys::CUlaunchConfig {
                    gridDimX: cluster,
                    gridDimY: 1,
                    gridDimZ: 1,
                    blockDimX: threads,
                    blockDimY: 1,
                    blockDimZ: 1,
                    sharedMemBytes: smem as u32,
                    hStream: std::ptr::null_mut(),
                    attrs: std::ptr::null_mut(),
                    numAttrs: 0,
                };
                let mut n: std::ffi::c_int = 0;
                // SAFETY: f is a valid function; config and n outlive the call.
                unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, f, &config) }
                    .result()
                    .ctx(&self.label, &format!("cluster occupancy of {name}"))?;
                if n <= 0 {
                    tracing::warn!(
                        "no cluster of {cluster} blocks of {name} ({smem} bytes of shared memory \
                         each) fits on {}",
                        self.label
                    );
                }
                Ok(n.max(0) as u32)
            },
        )
    }

    /// Raises `f`'s dynamic shared memory limit to `bytes` where it is above the default 48 KiB
    /// and not raised that far yet.
    fn raise_smem(&self, name: &'static str, f: sys::CUfunction, bytes: u32) -> Result<()> {
        if bytes <= 48 * 1024 || self.smem_raised(name, bytes) {
            return Ok(());
        }
        // SAFETY: f is a valid function.
        unsafe {
            drv::function::set_function_attribute(
                f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        }
        .ctx(&self.label, &format!("raising shared memory of {name}"))?;
        let mut l = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        l.smem.insert(name, bytes);
        Ok(())
    }

    fn launch_with(
        &self,
        name: &'static str,
        dims: Dims,
        stream: sys::CUstream,
        args: &[Arg],
        cooperative: bool,
    ) -> Result<()> {
        let f = self.function(name)?;
        self.raise_smem(name, f, dims.smem)?;
        let mut vals: Vec<Arg> = args.to_vec();
        let mut ptrs: Vec<*mut c_void> = vals
            .iter_mut()
            .map(|a| match a {
                Arg::Ptr(p) => p as *mut u64 as *mut c_void,
                Arg::I32(v) => v as *mut i32 as *mut c_void,
                Arg::U64(v) => v as *mut u64 as *mut c_void,
                Arg::F32(v) => v as *mut f32 as *mut c_void,
                Arg::U16(v) => v as *mut u16 as *mut c_void,
                Arg::TensorMap(m) => m as *mut sys::CUtensorMap as *mut c_void,
            })
            .collect();
        // SAFETY: the argument list matches the kernel's signature (each call site mirrors its
        // .cu declaration) and the values outlive the call, which copies them.
        unsafe {
            if cooperative {
                drv::launch_cooperative_kernel(
                    f, dims.grid, dims.block, dims.smem, stream, &mut ptrs,
                )
            } else {
                drv::launch_kernel(f, dims.grid, dims.block, dims.smem, stream, &mut ptrs)
            }
        }
        .ctx(&self.label, &format!("launching {name}"))?;
        self.launched
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}
