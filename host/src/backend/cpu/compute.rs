//! How the CPU computes: its thread count (the planner's view of the machine), its thread
//! pool, and the GEMM its ops multiply matrices with (a BLAS library, or the portable one).
//!
//! The CPU backend runs each op inside [`CpuCompute::run`]: on the backend's own rayon pool,
//! with the GEMM set for the ops on that thread ([`Gemm::current`]). Ops called outside a
//! backend (tests, references, other backends' CPU fallbacks) use the portable GEMM on the
//! caller's rayon pool.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::blas::Blas;
use crate::error::{Error, Result};

/// The thread count of the CPU backend in the planner's view: the machine's `cores` less one
/// for each simulated FPGA card computing now (`sim_busy`; a Verilator model runs on one core
/// of its own, and the executor runs it beside the CPU's work), at least 1. CPU timings then
/// do not include contention with the simulator.
pub fn planned_threads(cores: usize, sim_busy: usize) -> usize {
    cores.saturating_sub(sim_busy).max(1)
}

/// Simulated FPGA cards computing now, process-wide ([`SimCoreClaim`]).
static SIM_BUSY: AtomicUsize = AtomicUsize::new(0);

/// Simulated FPGA cards computing now.
pub fn sim_cores_busy() -> usize {
    SIM_BUSY.load(Ordering::Relaxed)
}

/// Held by a simulated FPGA card while its model computes: the CPU backend's ops that start
/// meanwhile use one thread fewer ([`planned_threads`]).
#[derive(Debug)]
pub struct SimCoreClaim(());

impl SimCoreClaim {
    /// Claims one core until dropped.
    pub fn new() -> Self {
        SIM_BUSY.fetch_add(1, Ordering::Relaxed);
        Self(())
    }
}

impl Default for SimCoreClaim {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for SimCoreClaim {
    fn drop(&mut self) {
        SIM_BUSY.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How many threads the CPU computes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// Always this many.
    Fixed(usize),
    /// [`planned_threads`] of these cores at the start of each op.
    Planned {
        /// The machine's cores.
        cores: usize,
    },
}

/// Rayon pools by thread count.
type Pools = Vec<(usize, Arc<rayon::ThreadPool>)>;

/// The CPU's compute settings: BLAS (or none), threads, and rayon pools of the sizes used.
#[derive(Clone)]
pub struct CpuCompute {
    blas: Option<Arc<Blas>>,
    threads: Threads,
    /// One pool per thread count used so far.
    pools: Arc<Mutex<Pools>>,
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
    /// Multiplying through `blas` when given, else through the portable GEMM, with `threads`
    /// threads (a fixed count is at least 1).
    pub fn new(blas: Option<Arc<Blas>>, threads: Threads) -> Self {
        let threads = match threads {
            Threads::Fixed(n) => Threads::Fixed(n.max(1)),
            planned => planned,
        };
        Self {
            blas,
            threads,
            pools: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// The BLAS library the products go through, if any.
    pub fn blas(&self) -> Option<&Arc<Blas>> {
        self.blas.as_ref()
    }

    /// How the thread count is chosen.
    pub fn thread_policy(&self) -> Threads {
        self.threads
    }

    /// Threads an op starting now computes with (rayon's and the BLAS library's).
    pub fn threads_now(&self) -> usize {
        match self.threads {
            Threads::Fixed(n) => n,
            Threads::Planned { cores } => planned_threads(cores, sim_cores_busy()),
        }
    }

    /// The pool of `n` threads (built at its first use).
    fn pool(&self, n: usize) -> Result<Arc<rayon::ThreadPool>> {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, p)) = pools.iter().find(|(k, _)| *k == n) {
            return Ok(p.clone());
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(move |i| format!("tandem-cpu{n}-{i}"))
            .build()
            .map_err(|e| Error::Internal(format!("CPU thread pool of {n}: {e}")))?;
        let pool = Arc::new(pool);
        pools.push((n, pool.clone()));
        Ok(pool)
    }

    /// Runs `f` on a pool of [`Self::threads_now`] threads with these settings in effect for
    /// the CPU ops it calls.
    pub fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R> {
        let threads = self.threads_now();
        let pool = self.pool(threads)?;
        Ok(pool.install(|| {
            let _restore = Installed::new(Gemm {
                blas: self.blas.clone(),
                threads,
            });
            f()
        }))
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
        let c = CpuCompute::new(None, Threads::Fixed(3));
        let (threads, blas) = c.run(|| {
            (
                rayon::current_num_threads(),
                Gemm::current().blas().is_some(),
            )
        })?;
        assert_eq!((threads, blas), (3, false));
        assert!(Gemm::current().blas().is_none());
        Ok(())
    }

    #[test]
    fn a_busy_simulated_card_takes_a_thread_from_planned_counts() -> Result<()> {
        let c = CpuCompute::new(None, Threads::Planned { cores: 64 });
        let fixed = CpuCompute::new(None, Threads::Fixed(5));
        // Other tests may hold and release claims meanwhile: ours alone takes one thread.
        let claim = SimCoreClaim::new();
        assert!(sim_cores_busy() >= 1);
        assert!(c.threads_now() <= 63);
        assert!(c.run(rayon::current_num_threads)? <= 63);
        assert_eq!(fixed.threads_now(), 5);
        drop(claim);
        Ok(())
    }
}
