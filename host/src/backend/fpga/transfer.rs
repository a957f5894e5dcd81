//! Host<->card copies of an FPGA backend, measured in one run (`tandem bench transfer`): the
//! card's own buffer write and read (`FpgaDevice::write` + `sync`, `sync` + `read`) beside
//! the raw ceiling of that path, and the path a launch's activations take (per-tensor int8
//! scale and quantisation on the rayon threads, then the write; the read, then the
//! dequantisation).
//!
//! The ceiling: a simulated card's memory is host memory, so a write is one `memcpy` into it
//! and the ceiling is one thread's `memcpy` of the same bytes. On a board the write fills the
//! buffer's host shadow and `sync` moves it by DMA: the same rows then include the link.

use tandem_fpga::device::{DeviceBuffer, SyncDir};
use tandem_fpga::{FpgaDevice, FpgaError};

use super::FpgaBackend;
use crate::bench::transfer::{TransferFigure, median_time};
use crate::error::Result;

impl FpgaBackend {
    /// Measures host<->card copies of `bytes` bytes (card side), `iters` times each after one
    /// untimed copy, in bank 0 of the card the vector kernel runs on (the modelled card where
    /// the backend has one: same memory path, no simulator build).
    pub fn measure_transfers(&self, bytes: usize, iters: usize) -> Result<Vec<TransferFigure>> {
        let bytes = bytes.max(64);
        let modelled = self.modelled.is_some();
        // The host side of the tensor path: an f32 activation of `bytes` int8 values.
        let x: Vec<f32> = (0..bytes)
            .map(|i| ((i.wrapping_mul(2_654_435_761) >> 7) % 2001) as f32 / 100.0 - 10.0)
            .collect();
        let src = vec![0x5au8; bytes];
        let mut dst = vec![0u8; bytes];
        let memcpy = median_time(iters, || -> Result<()> {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
            Ok(())
        })?;
        let (times, _clock) = self.with_card("vecops", &self.vecops, modelled, |dev| {
            let buf = dev.alloc(0, bytes as u64)?;
            let times = time_card(dev, &buf, &src, &x, iters);
            let freed = dev.free(buf);
            let times = times?;
            freed?;
            Ok(times)
        })?;
        let ceiling = bytes as f64 / memcpy / 1e9;
        Ok(vec![
            TransferFigure::new(
                "raw host memcpy (one thread)",
                "h2d",
                bytes,
                bytes,
                memcpy,
                ceiling,
            ),
            TransferFigure::new(
                "card write + sync (bank 0)",
                "h2d",
                bytes,
                bytes,
                times[0],
                ceiling,
            ),
            TransferFigure::new(
                "card sync + read (bank 0)",
                "d2h",
                bytes,
                bytes,
                times[1],
                ceiling,
            ),
            TransferFigure::new(
                "tandem f32 -> int8 (scale, quantise, write)",
                "h2d",
                4 * bytes,
                bytes,
                times[2],
                ceiling,
            ),
            TransferFigure::new(
                "tandem int8 -> f32 (read, dequantise)",
                "d2h",
                4 * bytes,
                bytes,
                times[3],
                ceiling,
            ),
        ])
    }
}

/// Write, read, quantise-and-write, read-and-dequantise of `buf` (the median seconds of each).
fn time_card(
    dev: &mut dyn FpgaDevice,
    buf: &DeviceBuffer,
    src: &[u8],
    x: &[f32],
    iters: usize,
) -> std::result::Result<[f64; 4], FpgaError> {
    let mut out = vec![0u8; src.len()];
    let write = median_time(iters, || {
        dev.write(buf, 0, src)?;
        dev.sync(buf, SyncDir::ToDevice)
    })?;
    let read = median_time(iters, || {
        dev.sync(buf, SyncDir::FromDevice)?;
        dev.read(buf, 0, &mut out)
    })?;
    let up = median_time(iters, || {
        let q = super::quant::quantize(x, super::quant::scale_of(x));
        dev.write(buf, 0, bytemuck::cast_slice(&q))?;
        dev.sync(buf, SyncDir::ToDevice)
    })?;
    let down = median_time(iters, || -> std::result::Result<(), FpgaError> {
        dev.sync(buf, SyncDir::FromDevice)?;
        dev.read(buf, 0, &mut out)?;
        std::hint::black_box(super::quant::dequantize(bytemuck::cast_slice(&out), 0.01));
        Ok(())
    })?;
    Ok([write, read, up, down])
}
