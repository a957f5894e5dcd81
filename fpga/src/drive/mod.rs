//! The host-side drivers of the kernels, written once over `&mut dyn FpgaDevice`: lay the
//! data out as the cores read it, allocate and fill device buffers, set the arguments by
//! name, start, wait with a timeout, read the results back in the golden models' shapes.
//!
//! ```text
//!  host backend (tandem::backend::fpga), `tandem fpga sim`, tests
//!        |  golden-model arguments (int8 / int16 data, dims)
//!        v
//!  drive::{run_router, run_gemm, run_attention}
//!        |  alloc / write / set_pointer / set_scalar / start / wait / read / free
//!        v
//!  &mut dyn FpgaDevice  <--  tandem_sim::SimCard (Verilator) | the XRT driver (a board)
//! ```
//!
//! Every driver takes its device buffers from a [`Scratch`] inside [`with_scratch`], which
//! frees them whatever happened, so a failed run leaves the card's memory as it found it.

pub mod attention;
pub mod experts;
pub mod gemm;
pub mod router;
pub mod vecops;

use std::time::Duration;

pub use attention::{
    AttentionDims, KvHead, QueryHead, run_attention, run_attention_head, run_attention_split,
};
pub use experts::{ExpertsStats, experts_cycles, experts_cycles_placed, run_experts};
pub use gemm::{launch_gemm, run_gemm, run_gemm_split};
pub use router::{run_router, run_router_with};
pub use vecops::{launch_combine, launch_silu_mul8, run_combine, run_silu_mul8, run_vecops};

use crate::device::{DeviceBuffer, FpgaDevice, FpgaError, RunStats, SyncDir};

/// Device memory that one driver call allocates (bank 0 unless a call names another), freed
/// by [`with_scratch`].
#[derive(Debug, Default)]
pub struct Scratch {
    bufs: Vec<DeviceBuffer>,
}

impl Scratch {
    /// Allocates a buffer of `bytes` (at least 8, the width of a memory word) in bank 0.
    pub fn alloc(
        &mut self,
        dev: &mut dyn FpgaDevice,
        bytes: usize,
    ) -> Result<DeviceBuffer, FpgaError> {
        self.alloc_in(dev, 0, bytes)
    }

    /// Allocates a buffer of `bytes` (at least 8) in `bank`.
    pub fn alloc_in(
        &mut self,
        dev: &mut dyn FpgaDevice,
        bank: u32,
        bytes: usize,
    ) -> Result<DeviceBuffer, FpgaError> {
        let b = dev.alloc(bank, bytes.max(8) as u64)?;
        self.bufs.push(b);
        Ok(b)
    }

    /// Allocates a buffer holding a launch's long read stream (`data`) in [`stream_bank`] and
    /// moves it to the device.
    pub fn upload_stream(
        &mut self,
        dev: &mut dyn FpgaDevice,
        data: &[u8],
    ) -> Result<DeviceBuffer, FpgaError> {
        let bank = stream_bank(dev);
        self.upload_in(dev, bank, data)
    }

    /// The GEMM's packed W stream (`packed`, [`crate::kernels::gemm::pack_w_lanes`]) on the
    /// device: striped over banks 1 and 2 ([`crate::kernels::gemm::pack::stripe_w`]) where
    /// [`w_stripe_banks`] allows, else whole in [`stream_bank`].
    pub fn upload_w(
        &mut self,
        dev: &mut dyn FpgaDevice,
        packed: &[u8],
    ) -> Result<WBufs, FpgaError> {
        match w_stripe_banks(dev) {
            Some((a, b)) => {
                let (even, odd) = crate::kernels::gemm::pack::stripe_w(packed);
                let even = self.upload_in(dev, a, &even)?;
                let odd = self.upload_in(dev, b, &odd)?;
                Ok(WBufs {
                    even,
                    odd: Some(odd),
                })
            }
            None => Ok(WBufs {
                even: self.upload_stream(dev, packed)?,
                odd: None,
            }),
        }
    }

    /// Allocates a buffer holding `data` in `bank` and moves it to the device.
    pub fn upload_in(
        &mut self,
        dev: &mut dyn FpgaDevice,
        bank: u32,
        data: &[u8],
    ) -> Result<DeviceBuffer, FpgaError> {
        let b = self.alloc_in(dev, bank, data.len())?;
        write(dev, &b, data)?;
        Ok(b)
    }

    /// Frees the `count` buffers allocated last (a driver that loops over launches keeps its
    /// device memory to one launch's worth).
    pub fn free_last(&mut self, dev: &mut dyn FpgaDevice, count: usize) -> Result<(), FpgaError> {
        for _ in 0..count {
            if let Some(b) = self.bufs.pop() {
                dev.free(b)?;
            }
        }
        Ok(())
    }

    /// Allocates a buffer holding `data` and moves it to the device.
    pub fn upload(
        &mut self,
        dev: &mut dyn FpgaDevice,
        data: &[u8],
    ) -> Result<DeviceBuffer, FpgaError> {
        let b = self.alloc(dev, data.len())?;
        write(dev, &b, data)?;
        Ok(b)
    }
}

/// The bank of a launch's long read stream (the GEMM's packed W): bank 1 when the loaded
/// kernel reaches a second bank (a simulated card's banks; a board's xclbin connectivity), so
/// that it does not share a bank's bandwidth with the activations in bank 0; else bank 0.
pub fn stream_bank(dev: &dyn FpgaDevice) -> u32 {
    u32::from(dev.banks() > 1)
}

/// The banks a GEMM's W stream is striped over (even stripes, odd stripes), or `None` to keep
/// it whole: banks 1 and 2 when the card has at least three and the loaded kernel takes a
/// second W pointer (`w_odd`), so the stream reads two banks at once (on a U55C one HBM
/// pseudo-channel gives 48 bytes a cycle at 300 MHz, the 512-bit port takes 64).
pub fn w_stripe_banks(dev: &dyn FpgaDevice) -> Option<(u32, u32)> {
    let takes = dev.kernel().is_some_and(|k| k.slot("w_odd").is_ok());
    (takes && stripes_w(dev.banks())).then_some((1, 2))
}

/// Whether a card of `banks` banks gets a GEMM's W striped over two of them (the rule of
/// [`w_stripe_banks`], for estimates made before a kernel is loaded).
pub fn stripes_w(banks: u32) -> bool {
    banks >= 3
}

/// A GEMM launch's W on the device: one buffer, or two holding alternate stripes.
#[derive(Debug, Clone, Copy)]
pub struct WBufs {
    /// The whole stream, or its even stripes.
    pub even: DeviceBuffer,
    /// The odd stripes, when striped.
    pub odd: Option<DeviceBuffer>,
}

impl WBufs {
    /// Buffers allocated for it (what [`Scratch::free_last`] frees).
    pub fn buffers(&self) -> usize {
        1 + usize::from(self.odd.is_some())
    }

    /// Sets the kernel's `w` and `w_odd` (0 when not striped; left alone on a kernel without
    /// `w_odd`).
    pub fn set(&self, dev: &mut dyn FpgaDevice) -> Result<(), FpgaError> {
        dev.set_pointer("w", &self.even)?;
        match &self.odd {
            Some(b) => dev.set_pointer("w_odd", b),
            None => {
                let slot = dev
                    .kernel()
                    .and_then(|k| k.slot("w_odd").ok())
                    .map(|s| s.offset);
                match slot {
                    Some(off) => {
                        dev.write_reg(off, 0)?;
                        dev.write_reg(off + 4, 0)
                    }
                    None => Ok(()),
                }
            }
        }
    }
}

/// Runs `f` with a [`Scratch`], then frees every buffer it allocated (newest first), whatever
/// `f` returned. An error of `f` wins over an error while freeing.
pub fn with_scratch<T>(
    dev: &mut dyn FpgaDevice,
    f: impl FnOnce(&mut dyn FpgaDevice, &mut Scratch) -> Result<T, FpgaError>,
) -> Result<T, FpgaError> {
    let mut scratch = Scratch::default();
    let result = f(dev, &mut scratch);
    let mut freed = Ok(());
    for b in scratch.bufs.into_iter().rev() {
        if let Err(e) = dev.free(b)
            && freed.is_ok()
        {
            freed = Err(e);
        }
    }
    let value = result?;
    freed?;
    Ok(value)
}

/// Writes `data` at the start of `buf` and moves it to the device.
pub fn write(dev: &mut dyn FpgaDevice, buf: &DeviceBuffer, data: &[u8]) -> Result<(), FpgaError> {
    dev.write(buf, 0, data)?;
    dev.sync(buf, SyncDir::ToDevice)
}

/// Moves `buf` from the device and reads its first `len` bytes.
pub fn read(
    dev: &mut dyn FpgaDevice,
    buf: &DeviceBuffer,
    len: usize,
) -> Result<Vec<u8>, FpgaError> {
    dev.sync(buf, SyncDir::FromDevice)?;
    let mut out = vec![0u8; len];
    dev.read(buf, 0, &mut out)?;
    Ok(out)
}

/// Sets the pointer and scalar arguments by name (in the order given), starts the kernel and
/// waits for ap_done, at most `timeout`.
pub fn launch(
    dev: &mut dyn FpgaDevice,
    pointers: &[(&str, &DeviceBuffer)],
    scalars: &[(&str, u32)],
    timeout: Duration,
) -> Result<RunStats, FpgaError> {
    for (name, buf) in pointers {
        dev.set_pointer(name, buf)?;
    }
    for &(name, value) in scalars {
        dev.set_scalar(name, value)?;
    }
    dev.start()?;
    dev.wait(timeout)
}

/// A [`FpgaError::BadArgument`] of `kernel`.
pub(crate) fn bad(kernel: &str, msg: String) -> FpgaError {
    FpgaError::BadArgument {
        kernel: kernel.into(),
        msg,
    }
}

/// `v` as a 32-bit register value, or a [`FpgaError::BadArgument`] naming `what`.
pub(crate) fn u32_of(kernel: &str, what: &str, v: usize) -> Result<u32, FpgaError> {
    u32::try_from(v).map_err(|_| bad(kernel, format!("{what} = {v} is too large")))
}

/// 64-bit words as little-endian bytes.
pub(crate) fn words(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// int8 values as the bytes the cores read.
pub(crate) fn bytes_of(v: &[i8]) -> Vec<u8> {
    v.iter().map(|&x| x as u8).collect()
}
