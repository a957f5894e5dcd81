//! Admission of requests into a [`super::Service`]: at most `capacity` requests in flight
//! (submitted and not finished). `acquire` waits for room (back-pressure on the submitting
//! thread), `try_acquire` refuses with [`Error::QueueFull`]; a [`Permit`] gives its room back
//! when the request finishes, whatever its outcome.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::error::{Error, Result};

/// A bounded count of requests in flight.
#[derive(Debug)]
pub(crate) struct Admission {
    capacity: usize,
    in_flight: Mutex<usize>,
    changed: Condvar,
}

/// Room for one request; dropped when the request finishes.
#[derive(Debug)]
pub(crate) struct Permit(Arc<Admission>);

impl Admission {
    /// Room for `capacity` requests (at least 1).
    pub fn new(capacity: usize) -> Result<Arc<Self>> {
        if capacity == 0 {
            return Err(Error::invalid(
                "executor",
                "a queue depth of 0 admits nothing: give at least 1",
            ));
        }
        Ok(Arc::new(Self {
            capacity,
            in_flight: Mutex::new(0),
            changed: Condvar::new(),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, usize> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Most requests in flight at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> usize {
        *self.lock()
    }

    /// Waits until there is room, then takes it.
    pub fn acquire(self: &Arc<Self>) -> Permit {
        let mut n = self.lock();
        while *n >= self.capacity {
            n = self.changed.wait(n).unwrap_or_else(|e| e.into_inner());
        }
        *n += 1;
        Permit(self.clone())
    }

    /// Takes room if there is some, else [`Error::QueueFull`].
    pub fn try_acquire(self: &Arc<Self>) -> Result<Permit> {
        let mut n = self.lock();
        if *n >= self.capacity {
            return Err(Error::QueueFull {
                queue: "the executor's request queue".into(),
                capacity: self.capacity,
            });
        }
        *n += 1;
        Ok(Permit(self.clone()))
    }

    /// Waits until no request is in flight.
    pub fn wait_idle(&self) {
        let mut n = self.lock();
        while *n > 0 {
            n = self.changed.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut n = self.0.lock();
        *n = n.saturating_sub(1);
        drop(n);
        self.0.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_refuses_then_admits_when_a_request_finishes() -> Result<()> {
        let a = Admission::new(2)?;
        let p1 = a.try_acquire()?;
        let _p2 = a.acquire();
        let e = a.try_acquire().expect_err("full");
        assert!(matches!(e, Error::QueueFull { capacity: 2, .. }), "{e}");
        assert_eq!(e.kind(), crate::error::ErrorKind::ResourceExhausted);
        assert_eq!(a.in_flight(), 2);
        drop(p1);
        assert_eq!(a.in_flight(), 1);
        let _p3 = a.try_acquire()?;
        assert!(Admission::new(0).is_err());
        Ok(())
    }

    #[test]
    fn acquire_waits_for_room() -> Result<()> {
        let a = Admission::new(1)?;
        let p = a.acquire();
        let (tx, rx) = crossbeam_channel::bounded(1);
        let a2 = a.clone();
        let t = std::thread::spawn(move || {
            let _p = a2.acquire();
            let _ = tx.send(());
        });
        // Still blocked while the permit is held.
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(50))
                .is_err()
        );
        drop(p);
        assert!(rx.recv_timeout(std::time::Duration::from_secs(30)).is_ok());
        t.join()
            .map_err(|_| Error::Internal("waiter panicked".into()))?;
        a.wait_idle();
        assert_eq!(a.in_flight(), 0);
        Ok(())
    }
}
