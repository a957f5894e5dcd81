//! Progress of long work (Verilator builds, yosys, simulations, f64 references, benches),
//! reported as `tracing` events of target [`TARGET`] that a front end renders: the `tandem`
//! binary draws bars on a terminal and prints plain lines otherwise. The library holds no
//! terminal code; without a subscriber that listens to [`TARGET`] the events cost a level
//! check.
//!
//! The events (every crate of the workspace emits the same fields; `tandem-sim` emits them
//! by hand, since it sits below this crate):
//!
//! | field | value |
//! | --- | --- |
//! | `task` | a key that tells concurrent tasks apart (`reference`, `bench`, `sim:attention`) |
//! | `event` | `start`, `update` or `finish` |
//! | `done` | units done so far (`update`, `finish`) |
//! | `total` | units in all, `0` where unknown (a spinner, not a bar) |
//! | `unit` | what is counted: `nodes`, `runs`, `cycles` |
//! | `elapsed_ms` | milliseconds since the work began (a quiet task starts before its `start`) |
//! | message | what is being done, as a person reads it (`start`) |
//!
//! Updates are sent at most about once a second ([`Task::set`]).

use std::time::{Duration, Instant};

/// The `tracing` target of progress events.
pub const TARGET: &str = "tandem::progress";

/// The least time between two `update` events of one task.
pub const UPDATE_EVERY: Duration = Duration::from_secs(1);

/// One piece of long work in progress. Made by [`Task::announce`] (its start is reported
/// at once) or [`Task::quiet`] (reported only once it has run for [`UPDATE_EVERY`], so that
/// short work says nothing); finished when dropped.
#[derive(Debug)]
pub struct Task {
    key: String,
    message: String,
    total: u64,
    unit: &'static str,
    started: Instant,
    last: Instant,
    done: u64,
    announced: bool,
}

#[allow(clippy::too_many_arguments)]
fn emit(
    key: &str,
    event: &str,
    done: u64,
    total: u64,
    unit: &str,
    elapsed: Duration,
    message: &str,
) {
    let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
    tracing::info!(
        target: "tandem::progress",
        task = key,
        event,
        done,
        total,
        unit,
        elapsed_ms,
        "{message}"
    );
}

impl Task {
    /// Starts a task and reports its start now: work known to be long (a Verilator build,
    /// yosys, a bench of many runs). `total` of `unit` (`None`: unknown).
    pub fn announce(
        key: impl Into<String>,
        message: impl Into<String>,
        total: Option<u64>,
        unit: &'static str,
    ) -> Self {
        let mut t = Self::quiet(key, message, total, unit);
        t.report_start();
        t
    }

    /// Starts a task that is reported only if it is still running [`UPDATE_EVERY`] after it
    /// started (checked at each [`Task::set`]).
    pub fn quiet(
        key: impl Into<String>,
        message: impl Into<String>,
        total: Option<u64>,
        unit: &'static str,
    ) -> Self {
        let now = Instant::now();
        Self {
            key: key.into(),
            message: message.into(),
            total: total.unwrap_or(0),
            unit,
            started: now,
            last: now,
            done: 0,
            announced: false,
        }
    }

    fn report_start(&mut self) {
        if !self.announced {
            self.announced = true;
            emit(
                &self.key,
                "start",
                self.done,
                self.total,
                self.unit,
                self.started.elapsed(),
                &self.message,
            );
        }
    }

    /// Units done so far; an `update` is sent where the last one is [`UPDATE_EVERY`] old.
    pub fn set(&mut self, done: u64) {
        self.done = done;
        let now = Instant::now();
        if now.duration_since(self.last) < UPDATE_EVERY {
            return;
        }
        self.last = now;
        self.report_start();
        emit(
            &self.key,
            "update",
            done,
            self.total,
            self.unit,
            self.started.elapsed(),
            &self.message,
        );
    }

    /// One more unit done.
    pub fn inc(&mut self) {
        self.set(self.done + 1);
    }

    /// How long the task has run.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        if self.announced {
            emit(
                &self.key,
                "finish",
                self.done,
                self.total,
                self.unit,
                self.started.elapsed(),
                &self.message,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_task_counts_without_announcing_and_an_announced_one_reports() {
        let mut t = Task::quiet("k", "short work", Some(3), "runs");
        t.inc();
        t.inc();
        assert_eq!(t.done, 2);
        assert!(!t.announced, "reported before UPDATE_EVERY");
        drop(t);
        let t = Task::announce("k", "long work", None, "cycles");
        assert!(t.announced);
        assert_eq!(t.total, 0);
    }
}
