//! How the CPU computes: its thread count (the planner's view of the machine), its thread
//! pool, and the GEMM its ops multiply matrices with (a BLAS library, or the portable one).
//!
//! The CPU backend runs each op inside [`CpuCompute::run`]: on the backend's own rayon pool,
//! with the GEMM set for the ops on that thread ([`Gemm::current`]). Ops called outside a
//! backend (tests, references, other backends' CPU fallbacks) use the portable GEMM on the
//! caller's rayon pool.

use std::cell::RefCell;
use std::sync::Arc;

use super::blas::Blas;
use crate::error::{Error, Result};

/// The thread count of the CPU backend in the planner's view: the machine's `cores` less one
/// for each simulated FPGA card (`sim_cards`; a Verilator model runs on one core of its own
/// while a simulated card computes, and the executor runs it beside the CPU's work), at
/// least 1. CPU timings then do not include contention with the simulator.
pub fn planned_threads(cores: usize, sim_cards: usize) -> usize {
    cores.saturating_sub(sim_cards).max(1)
}

/// The CPU's compute settings: BLAS (or none), threads, and a rayon pool of that size.
#[derive(Clone)]
pub struct CpuCompute {
    blas: Option<Arc<Blas>>,
    threads: usize,
    pool: Arc<rayon::ThreadPool>,
}

impl std::fmt::Debug for CpuCompute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuCompute")
            .field("blas", &self.blas)
            .field("threads", &self.threads)
            .finish_non_exhaustive()
    }
}

impl CpuCompute {
    /// `threads` threads (at least 1), multiplying through `blas` when given, else through
    /// the portable GEMM.
    pub fn new(blas: Option<Arc<Blas>>, threads: usize) -> Result<Self> {
        let threads = threads.max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("tandem-cpu-{i}"))
            .build()
            .map_err(|e| Error::Internal(format!("CPU thread pool of {threads}: {e}")))?;
        Ok(Self {
            blas,
            threads,
            pool: Arc::new(pool),
        })
    }

    /// The BLAS library the products go through, if any.
    pub fn blas(&self) -> Option<&Arc<Blas>> {
        self.blas.as_ref()
    }

    /// Threads the CPU computes with (rayon's and the BLAS library's).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` on this pool with these settings in effect for the CPU ops it calls.
    pub fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(|| {
            let _restore = Installed::new(Gemm {
                blas: self.blas.clone(),
                threads: self.threads,
            });
            f()
        })
    }
}

/// The GEMM the CPU ops of one thread multiply with: a BLAS library with its thread count, or
/// the portable GEMM over the current rayon pool.
#[derive(Clone, Debug, Default)]
pub struct Gemm {
    blas: Option<Arc<Blas>>,
    threads: usize,
}

thread_local! {
    static CURRENT: RefCell<Option<Gemm>> = const { RefCell::new(None) };
}

/// Puts a [`Gemm`] in effect on this thread until dropped (then the previous one again, also
/// when the op panics).
struct Installed(Option<Gemm>);

impl Installed {
    fn new(g: Gemm) -> Self {
        Self(CURRENT.with(|c| c.replace(Some(g))))
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        let prev = self.0.take();
        CURRENT.with(|c| *c.borrow_mut() = prev);
    }
}

impl Gemm {
    /// The GEMM in effect on this thread: the one [`CpuCompute::run`] set, else the portable
    /// GEMM.
    pub fn current() -> Self {
        CURRENT.with(|c| c.borrow().clone()).unwrap_or_default()
    }

    /// The BLAS library with the thread count it should use, when products go through one.
    pub fn blas(&self) -> Option<(&Blas, usize)> {
        self.blas.as_deref().map(|b| (b, self.threads.max(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_cards_take_cores_but_one_is_left() {
        assert_eq!(planned_threads(2, 0), 2);
        assert_eq!(planned_threads(2, 1), 1);
        assert_eq!(planned_threads(16, 1), 15);
        assert_eq!(planned_threads(1, 1), 1);
        assert_eq!(planned_threads(0, 0), 1);
    }

    #[test]
    fn run_sets_the_pool_and_the_gemm_then_restores() -> Result<()> {
        let c = CpuCompute::new(None, 3)?;
        let (threads, blas) = c.run(|| {
            (
                rayon::current_num_threads(),
                Gemm::current().blas().is_some(),
            )
        });
        assert_eq!((threads, blas), (3, false));
        assert!(Gemm::current().blas().is_none());
        Ok(())
    }
}
