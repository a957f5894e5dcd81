//! Timeline fences: ordering and completion of device work, with sticky failure.
//!
//! A [`Fence`] holds a monotonically increasing value. Work signals a value when it finishes;
//! waiters block until the value is reached or a timeout passes. A failure is sticky: every
//! current and later waiter sees it (as IREE's `iree_hal_semaphore_fail`).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// When work on the host must stop: a point in time (or none), checked by CPU ops between
/// blocks of work and turned into the remaining wait of device launches, so `--timeout` ends
/// any op on any backend. A block that sees the deadline passed skips its work; the op then
/// returns [`Error::Timeout`] instead of a partial result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    at: Option<Instant>,
    timeout: Duration,
}

impl Deadline {
    /// No deadline.
    pub const NONE: Deadline = Deadline {
        at: None,
        timeout: Duration::MAX,
    };

    /// `timeout` from now (none if that is past what the clock can represent).
    pub fn after(timeout: Duration) -> Self {
        Self {
            at: Instant::now().checked_add(timeout),
            timeout,
        }
    }

    /// Whether the deadline has passed.
    pub fn expired(&self) -> bool {
        self.at.is_some_and(|t| Instant::now() >= t)
    }

    /// Time left (zero once passed; `Duration::MAX` without a deadline).
    pub fn remaining(&self) -> Duration {
        match self.at {
            Some(t) => t.saturating_duration_since(Instant::now()),
            None => Duration::MAX,
        }
    }

    /// The timeout this deadline was made from.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// [`Error::Timeout`] naming `what` once the deadline has passed.
    pub fn check(&self, what: &str) -> Result<()> {
        if self.expired() {
            return Err(Error::Timeout {
                what: what.to_string(),
                timeout: self.timeout,
            });
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
struct State {
    value: u64,
    failure: Option<String>,
}

/// A timeline semaphore.
#[derive(Debug, Clone, Default)]
pub struct Fence {
    inner: Arc<(Mutex<State>, Condvar)>,
}

impl Fence {
    /// A fence at value 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current value.
    pub fn value(&self) -> u64 {
        self.lock().value
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means a waiter panicked; the state itself is still coherent.
        self.inner.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Advances the fence to `value` (no-op if already past it) and wakes waiters.
    pub fn signal(&self, value: u64) {
        let mut s = self.lock();
        if value > s.value {
            s.value = value;
        }
        self.inner.1.notify_all();
    }

    /// Marks the timeline failed; every waiter, now and later, gets the error.
    pub fn fail(&self, msg: impl Into<String>) {
        let mut s = self.lock();
        if s.failure.is_none() {
            s.failure = Some(msg.into());
        }
        self.inner.1.notify_all();
    }

    /// Waits until the fence reaches `value`, failing on a sticky failure or after `timeout`.
    pub fn wait(&self, value: u64, timeout: Duration, what: &str) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        loop {
            if let Some(f) = &s.failure {
                return Err(Error::device(what, f.clone()));
            }
            if s.value >= value {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    what: what.to_string(),
                    timeout,
                });
            }
            s = self
                .inner
                .1
                .wait_timeout(s, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }
}

/// A point on a fence's timeline: "this work is done when the fence reaches `value`".
#[derive(Debug, Clone)]
pub struct Completion {
    fence: Fence,
    value: u64,
}

impl Completion {
    /// A completion at `value` on `fence`.
    pub fn new(fence: Fence, value: u64) -> Self {
        Self { fence, value }
    }

    /// A completion that is already done.
    pub fn done() -> Self {
        let f = Fence::new();
        f.signal(1);
        Self::new(f, 1)
    }

    /// Whether the work has finished (successfully or not).
    pub fn is_done(&self) -> bool {
        let s = self.fence.lock();
        s.value >= self.value || s.failure.is_some()
    }

    /// Waits for the work, with a timeout.
    pub fn wait(&self, timeout: Duration, what: &str) -> Result<()> {
        self.fence.wait(self.value, timeout, what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_wakes_waiter() {
        let f = Fence::new();
        let g = f.clone();
        let h = std::thread::spawn(move || g.wait(3, Duration::from_secs(5), "t"));
        f.signal(1);
        f.signal(3);
        assert!(h.join().expect("thread").is_ok());
        assert_eq!(f.value(), 3);
    }

    #[test]
    fn timeout_is_an_error() {
        let f = Fence::new();
        let r = f.wait(1, Duration::from_millis(20), "kernel");
        assert!(matches!(r, Err(ref e) if e.kind() == crate::error::ErrorKind::DeadlineExceeded));
    }

    #[test]
    fn failure_is_sticky() {
        let f = Fence::new();
        f.fail("boom");
        f.signal(10);
        assert!(f.wait(1, Duration::from_secs(1), "a").is_err());
        assert!(f.wait(5, Duration::from_secs(1), "b").is_err());
        assert!(Completion::new(f, 2).is_done());
    }
}
