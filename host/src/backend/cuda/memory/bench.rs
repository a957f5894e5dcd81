//! Transfer bandwidths of one device, measured in one run: the raw copy ceilings (pinned and
//! pageable host memory, each direction, plain driver copies) beside tandem's own upload and
//! download (pinned staging in chunks, with and without dtype conversion), so the data
//! plane is judged against what this machine's link does (`tandem bench transfer`).

use std::time::Instant;

use cudarc::driver::result as drv;

use super::super::CudaBackend;
use super::super::error::{self, DrvResultExt};
use std::sync::Arc;

use crate::backend::{Backend, DeviceId, DeviceStorage};
use crate::error::Result;
use crate::tensor::Tensor;

pub use crate::bench::transfer::TransferFigure;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A pinned host allocation, freed on drop.
struct Pinned {
    ptr: *mut u8,
    len: usize,
}

impl Pinned {
    fn new(label: &str, len: usize) -> Result<Self> {
        // SAFETY: plain pinned allocation (the context is current).
        let p = unsafe { drv::malloc_host(len, 0) }
            .map_err(|e| error::alloc_host(label, "cuMemHostAlloc", len, e))?;
        // Touch it so no first-use cost lands in a timed copy.
        // SAFETY: len bytes were just allocated.
        unsafe { std::ptr::write_bytes(p as *mut u8, 1, len) };
        Ok(Self {
            ptr: p as *mut u8,
            len,
        })
    }

    fn slice(&mut self) -> &mut [u8] {
        // SAFETY: a live allocation of len bytes, borrowed mutably through self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated by malloc_host; every copy using it was waited for.
        unsafe {
            let _ = drv::free_host(self.ptr as *mut _);
        }
    }
}

impl CudaBackend {
    /// Measures host<->device copies of `bytes` bytes, `iters` times each (after one untimed
    /// copy): raw pinned and pageable driver copies (the ceilings), then tandem's upload and
    /// download of an f32 tensor of `bytes` (converted to the storage precision on the way)
    /// and of an i32 tensor (no conversion: the staging path alone).
    pub fn measure_transfers(&self, bytes: usize, iters: usize) -> Result<Vec<TransferFigure>> {
        self.dev.bind()?;
        let l = self.dev.label.clone();
        let bytes = bytes.max(4) / 4 * 4;
        let iters = iters.max(1);
        let stream = self.dev.copy_stream;
        let dbuf = self.pool.alloc(bytes)?;
        let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
            f()?;
            let mut v = Vec::with_capacity(iters);
            for _ in 0..iters {
                let t = Instant::now();
                f()?;
                v.push(t.elapsed().as_secs_f64());
            }
            Ok(median(v))
        };
        let sync = || -> Result<()> {
            // SAFETY: the copy stream is alive.
            unsafe { drv::stream::synchronize(stream) }.ctx(&l, "cuStreamSynchronize")
        };
        let mut raw = Vec::new();
        {
            let mut pinned = Pinned::new(&l, bytes)?;
            let h2d = time(&mut || {
                // SAFETY: the pinned buffer and the device buffer hold `bytes` bytes; the copy
                // is waited for before the buffer is used again.
                unsafe { drv::memcpy_htod_async(dbuf.ptr(), &*pinned.slice(), stream) }
                    .ctx(&l, "cuMemcpyHtoDAsync")?;
                sync()
            })?;
            let d2h = time(&mut || {
                // SAFETY: as above.
                unsafe { drv::memcpy_dtoh_async(pinned.slice(), dbuf.ptr(), stream) }
                    .ctx(&l, "cuMemcpyDtoHAsync")?;
                sync()
            })?;
            raw.push(("raw pinned (cuMemcpyAsync)", "h2d", h2d));
            raw.push(("raw pinned (cuMemcpyAsync)", "d2h", d2h));
        }
        {
            let mut pageable = vec![1u8; bytes];
            let h2d = time(&mut || {
                // SAFETY: both buffers hold `bytes` bytes; the call returns when the source
                // may be reused.
                unsafe { drv::memcpy_htod_sync(dbuf.ptr(), &pageable) }.ctx(&l, "cuMemcpyHtoD")
            })?;
            let d2h = time(&mut || {
                // SAFETY: as above; synchronous.
                unsafe { drv::memcpy_dtoh_sync(&mut pageable, dbuf.ptr()) }.ctx(&l, "cuMemcpyDtoH")
            })?;
            raw.push(("raw pageable (cuMemcpy)", "h2d", h2d));
            raw.push(("raw pageable (cuMemcpy)", "d2h", d2h));
        }
        drop(dbuf);
        let ceiling = |dir: &str| {
            raw.iter()
                .find(|r| r.0.starts_with("raw pinned") && r.1 == dir)
                .map_or(f64::NAN, |r| bytes as f64 / r.2 / 1e9)
        };
        let figure = |path: String, dir: &'static str, host: usize, link: usize, s: f64| {
            let link_gbps = link as f64 / s / 1e9;
            TransferFigure {
                path,
                direction: dir,
                host_bytes: host as u64,
                link_bytes: link as u64,
                median_s: s,
                host_gbps: host as f64 / s / 1e9,
                link_gbps,
                of_pinned_ceiling: host as f64 / s / 1e9 / ceiling(dir),
            }
        };
        let mut out: Vec<TransferFigure> = raw
            .iter()
            .map(|(p, d, s)| figure(p.to_string(), d, bytes, bytes, *s))
            .collect();
        let n = bytes / 4;
        let values: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.001 - 0.5).collect();
        let f = Tensor::from_vec_f32(&[n], values)?;
        let ints = Tensor::from_i32(
            ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[n]), (0..n as i32).collect())
                .map_err(|e| crate::Error::Internal(format!("bench tensor: {e}")))?,
        );
        for (t, path, link) in [
            (&f, format!("tandem f32 -> {}", self.opts.dtype), n * 2),
            (&ints, "tandem i32 (no conversion)".to_string(), n * 4),
        ] {
            let mut stored = None;
            let up = time(&mut || {
                stored = Some(self.upload(t)?);
                self.dev.synchronize()
            })?;
            let st = stored
                .take()
                .ok_or_else(|| crate::Error::Internal("nothing uploaded".into()))?;
            let down = time(&mut || self.download(&st).map(drop))?;
            out.push(figure(format!("{path} upload"), "h2d", bytes, link, up));
            out.push(figure(format!("{path} download"), "d2h", bytes, link, down));
        }
        // The same tensors uploaded again and again from one host replica (an input of a
        // workload run repeatedly): registered in place on the second upload, then copied
        // from their own pages (f32 raw over the link, rounded on the device).
        for (t, what) in [(&f, "f32"), (&ints, "i32")] {
            let host = DeviceStorage::shared(DeviceId::CPU, t.meta(), Arc::new(t.clone()));
            self.upload_storage(&host)?;
            let up = time(&mut || {
                self.upload_storage(&host)?;
                self.dev.synchronize()
            })?;
            let (reg_bytes, _) = self.registered_host();
            let how = if reg_bytes >= bytes {
                "registered in place"
            } else {
                "registration refused: staged"
            };
            out.push(figure(
                format!("tandem {what} again ({how}) upload"),
                "h2d",
                bytes,
                bytes,
                up,
            ));
            drop(host);
        }
        // The same results downloaded again and again (a workload's output fetched after each
        // run): from the second time, into a reused registered landing at the link's rate.
        for (t, what) in [(&f, "f32"), (&ints, "i32")] {
            let st = self.upload(t)?;
            drop(self.download_storage(&st)?);
            drop(self.download_storage(&st)?);
            let down = time(&mut || self.download_storage(&st).map(drop))?;
            let (landed, _) = self.landing_host();
            let how = if landed >= bytes {
                "into a registered landing"
            } else {
                "landing refused: fresh tensor"
            };
            let link = if what == "f32" { n * 2 } else { n * 4 };
            out.push(figure(
                format!("tandem {what} again ({how}) download"),
                "d2h",
                bytes,
                link,
                down,
            ));
        }
        Ok(out)
    }
}
