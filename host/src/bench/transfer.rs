//! What `tandem bench transfer` reports for every device kind: one measured copy path, its
//! bandwidth and its share of the raw ceiling measured in the same run (CUDA:
//! `backend::cuda::memory::bench`; FPGA cards: `backend::fpga::transfer`).

use serde::Serialize;

/// One measured copy.
#[derive(Debug, Clone, Serialize)]
pub struct TransferFigure {
    /// What was copied and how (`raw pinned`, `tandem f32 -> bf16`, ...).
    pub path: String,
    /// `h2d`, `d2h`, or `p2p` (GPU to GPU).
    pub direction: &'static str,
    /// Bytes of the host side (a logical f32 tensor for tandem's paths).
    pub host_bytes: u64,
    /// Bytes that reached device memory (half the host bytes where a GPU stores 16 bits, a
    /// quarter where a card stores int8).
    pub link_bytes: u64,
    /// Median seconds of one copy (wall clock to completion).
    pub median_s: f64,
    /// Host bytes per second, GB/s (1e9).
    pub host_gbps: f64,
    /// Device-side bytes per second, GB/s.
    pub link_gbps: f64,
    /// `host_gbps` over the raw copy of the same direction measured in this run: how fast
    /// the user's tensor moves against what the path's copies alone reach.
    pub of_pinned_ceiling: f64,
}

impl TransferFigure {
    /// A figure from a median time, the bytes on each side and the ceiling (GB/s) of its
    /// direction.
    pub fn new(
        path: impl Into<String>,
        direction: &'static str,
        host_bytes: usize,
        link_bytes: usize,
        median_s: f64,
        ceiling_gbps: f64,
    ) -> Self {
        let host_gbps = host_bytes as f64 / median_s / 1e9;
        Self {
            path: path.into(),
            direction,
            host_bytes: host_bytes as u64,
            link_bytes: link_bytes as u64,
            median_s,
            host_gbps,
            link_gbps: link_bytes as f64 / median_s / 1e9,
            of_pinned_ceiling: host_gbps / ceiling_gbps,
        }
    }
}

/// The median of `iters` timed calls of `f` (seconds), after one untimed call.
pub fn median_time<E>(iters: usize, mut f: impl FnMut() -> Result<(), E>) -> Result<f64, E> {
    f()?;
    let mut v = Vec::with_capacity(iters.max(1));
    for _ in 0..iters.max(1) {
        let t = std::time::Instant::now();
        f()?;
        v.push(t.elapsed().as_secs_f64());
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}
