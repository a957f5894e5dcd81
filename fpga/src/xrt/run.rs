//! One execution of a kernel through XRT's scheduler (`xrtRunOpen`, `xrtRunSetArg`,
//! `xrtRunStart`), waited for with a deadline.
//!
//! XRT 2.13's C API has no abort (`xrt::run::abort` exists only in its C++ API) and its
//! `xrtRunWaitFor` keeps waiting past the timeout while the command is not done. So a wait
//! here polls `xrtRunState` until the deadline, and a run still going then is *abandoned*:
//! its handle is never closed (closing frees the command buffer the scheduler still holds),
//! and the owner refuses further runs until the board is reset (`xbutil reset`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bo::XrtBo;
use super::error::{check, null_handle};
use super::ffi;
use super::kernel::XrtKernel;
use super::loader::Xrt;
use crate::FpgaError;

/// State of a run, from XRT's `ert_cmd_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    /// Made, queued, submitted or running.
    Busy,
    /// Finished.
    Completed,
    /// Failed in XRT's scheduler (error, abort, timeout, no response, crash), with the code.
    Failed(u32),
}

impl RunState {
    fn from_ert(s: ffi::ert_cmd_state) -> Self {
        match s {
            ffi::ERT_CMD_STATE_COMPLETED => RunState::Completed,
            ffi::ERT_CMD_STATE_NEW
            | ffi::ERT_CMD_STATE_QUEUED
            | ffi::ERT_CMD_STATE_SUBMITTED
            | ffi::ERT_CMD_STATE_RUNNING => RunState::Busy,
            other => RunState::Failed(other),
        }
    }
}

/// Name of an `ert_cmd_state` for messages.
pub fn state_name(s: u32) -> &'static str {
    match s {
        ffi::ERT_CMD_STATE_NEW => "NEW",
        ffi::ERT_CMD_STATE_QUEUED => "QUEUED",
        ffi::ERT_CMD_STATE_RUNNING => "RUNNING",
        ffi::ERT_CMD_STATE_COMPLETED => "COMPLETED",
        ffi::ERT_CMD_STATE_ERROR => "ERROR",
        ffi::ERT_CMD_STATE_ABORT => "ABORT",
        ffi::ERT_CMD_STATE_SUBMITTED => "SUBMITTED",
        ffi::ERT_CMD_STATE_TIMEOUT => "TIMEOUT",
        ffi::ERT_CMD_STATE_NORESPONSE => "NORESPONSE",
        ffi::ERT_CMD_STATE_SKERROR => "SKERROR",
        ffi::ERT_CMD_STATE_SKCRASHED => "SKCRASHED",
        _ => "unknown",
    }
}

/// A run of a kernel.
#[derive(Debug)]
pub struct XrtRun {
    xrt: Arc<Xrt>,
    handle: ffi::xrtRunHandle,
    kernel: String,
    started: Option<Instant>,
    /// Set when the run was abandoned: its handle is then never closed.
    abandoned: bool,
}

// SAFETY: as for `XrtDevice`: a key into XRT's mutex-guarded tables, one owner.
unsafe impl Send for XrtRun {}

impl XrtRun {
    /// A run of `kernel`, arguments unset.
    pub fn open(kernel: &XrtKernel) -> Result<Self, FpgaError> {
        let xrt = kernel.xrt().clone();
        // SAFETY: the kernel handle is live.
        let handle = unsafe { xrt.api().xrtRunOpen(kernel.raw()) };
        if handle.is_null() {
            return Err(null_handle(&kernel.name, "xrtRunOpen", &kernel.name));
        }
        Ok(Self {
            xrt,
            handle,
            kernel: kernel.name.clone(),
            started: None,
            abandoned: false,
        })
    }

    /// Sets the 32-bit scalar argument `index`.
    pub fn set_scalar(&mut self, index: usize, value: u32) -> Result<(), FpgaError> {
        // SAFETY: XRT reads a 32-bit scalar (`uint` in the xclbin) with va_arg(unsigned int).
        let rc = unsafe { (self.xrt.api().xrtRunSetArg)(self.handle, index as i32, value) };
        check(
            &self.kernel,
            "xrtRunSetArg",
            &format!("{index} = {value}"),
            rc,
        )
    }

    /// Sets the buffer argument `index` to `bo`.
    pub fn set_buffer(&mut self, index: usize, bo: &XrtBo) -> Result<(), FpgaError> {
        // SAFETY: XRT reads a global argument with va_arg(xrtBufferHandle); `bo` is live.
        let rc = unsafe { (self.xrt.api().xrtRunSetArg)(self.handle, index as i32, bo.raw()) };
        check(
            &self.kernel,
            "xrtRunSetArg",
            &format!("{index} = BO at {:#x}", bo.addr),
            rc,
        )
    }

    /// Starts the run.
    pub fn start(&mut self) -> Result<(), FpgaError> {
        // SAFETY: the run handle is live.
        let rc = unsafe { self.xrt.api().xrtRunStart(self.handle) };
        check(&self.kernel, "xrtRunStart", "", rc)?;
        self.started = Some(Instant::now());
        Ok(())
    }

    /// The run's state now.
    pub fn state(&self) -> RunState {
        // SAFETY: the run handle is live.
        RunState::from_ert(unsafe { self.xrt.api().xrtRunState(self.handle) })
    }

    /// Waits until the run leaves [`RunState::Busy`] or `timeout` passes, polling (from 20 us
    /// up to 5 ms between looks); returns the last state seen.
    pub fn wait(&self, timeout: Duration) -> RunState {
        let t0 = Instant::now();
        let mut nap = Duration::from_micros(20);
        loop {
            let s = self.state();
            if s != RunState::Busy || t0.elapsed() >= timeout {
                return s;
            }
            std::thread::sleep(nap.min(timeout.saturating_sub(t0.elapsed())));
            nap = (nap * 2).min(Duration::from_millis(5));
        }
    }

    /// When the run was started.
    pub fn started(&self) -> Option<Instant> {
        self.started
    }

    /// Gives up on a run that did not finish: the handle is left open for good (see the
    /// module docs) and nothing more is asked of it.
    pub fn abandon(mut self) {
        self.abandoned = true;
        tracing::warn!(kernel = %self.kernel, "abandoned an unfinished XRT run (XRT 2.13's C API cannot abort it)");
    }
}

impl Drop for XrtRun {
    fn drop(&mut self) {
        if self.abandoned || self.state() == RunState::Busy && self.started.is_some() {
            return;
        }
        // SAFETY: the handle is live, not running, and closed once.
        let rc = unsafe { self.xrt.api().xrtRunClose(self.handle) };
        if rc != 0 {
            tracing::warn!(kernel = %self.kernel, rc, "xrtRunClose failed");
        }
    }
}
