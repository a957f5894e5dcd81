//! Many requests at once through one [`Service`]: `concurrency` client threads submit
//! `requests` executions of a workload (each with inputs of its own) and wait for them; the
//! result is throughput (requests/s, tokens/s) and latency quantiles, per device mix. What
//! `tandem serve-bench` runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use serde::Serialize;

use crate::backend::DeviceRegistry;
use crate::bench::{quantile, random_tensor};
use crate::error::{Error, Result};
use crate::exec::{ExecOptions, Prepared, Service, ServiceOptions};
use crate::graph::Graph;
use crate::plan::Plan;

/// How to drive the service.
#[derive(Debug, Clone)]
pub struct ServeBenchOptions {
    /// Requests in all.
    pub requests: usize,
    /// Client threads submitting at once.
    pub concurrency: usize,
    /// The service's queue depth (requests in flight at most).
    pub queue_depth: usize,
    /// Distinct input sets, rotated among the requests (at least 1).
    pub input_sets: usize,
    /// Untimed requests first (kernel compilation, weight upload).
    pub warmup: usize,
    /// Executor options of every request.
    pub exec: ExecOptions,
}

/// Throughput and latency of one device mix.
#[derive(Debug, Clone, Serialize)]
pub struct ServeBenchReport {
    /// The devices the plan uses, joined by '+'.
    pub mix: String,
    /// The `--backend` choice it came from.
    pub backend: String,
    /// Requests completed.
    pub requests: usize,
    /// Client threads.
    pub concurrency: usize,
    /// Requests in flight at most.
    pub queue_depth: usize,
    /// Wall time of all requests.
    pub wall_s: f64,
    /// Requests completed per second.
    pub requests_per_s: f64,
    /// Tokens (`tokens_per_request` of each request) per second.
    pub tokens_per_s: f64,
    /// Median latency (submit to result, waiting for room included).
    pub p50_s: f64,
    /// 99th-percentile latency.
    pub p99_s: f64,
    /// Longest latency.
    pub max_s: f64,
}

/// `graph` with fresh inputs: every float input (the non-parameter constants) replaced by
/// seeded random data of its shape; the weights are shared (they stay resident).
pub fn with_fresh_inputs(graph: &Graph, seed: u64) -> Result<Graph> {
    let mut g = graph.clone();
    let inputs: Vec<(String, crate::tensor::TensorMeta)> = graph
        .constants
        .iter()
        .filter(|(n, t)| !graph.is_param(n) && t.dtype().is_float())
        .map(|(n, t)| (n.clone(), t.meta()))
        .collect();
    for (k, (name, meta)) in inputs.into_iter().enumerate() {
        g.constant(
            &name,
            random_tensor(&meta.shape, 1.0, seed ^ ((k as u64) << 32))?,
        );
    }
    Ok(g)
}

/// Drives a [`Service`] on `reg` with `graph` as `plan` places it: `opts.requests` requests
/// from `opts.concurrency` threads. `tokens_per_request` counts the throughput in tokens.
/// Any failed request fails the bench (with its error).
pub fn serve_bench(
    reg: &DeviceRegistry,
    graph: &Graph,
    plan: &Plan,
    backend: &str,
    tokens_per_request: usize,
    opts: &ServeBenchOptions,
) -> Result<ServeBenchReport> {
    if opts.requests == 0 || opts.concurrency == 0 || opts.input_sets == 0 {
        return Err(Error::invalid(
            "serve-bench",
            format!(
                "requests ({}), concurrency ({}) and input sets ({}) must be at least 1",
                opts.requests, opts.concurrency, opts.input_sets
            ),
        ));
    }
    let sets = (0..opts.input_sets.min(opts.requests))
        .map(|s| {
            let g = with_fresh_inputs(graph, crate::bench::SEED + s as u64)?;
            Ok(Arc::new(Prepared::new(&g, plan)?))
        })
        .collect::<Result<Vec<_>>>()?;
    let service = Service::new(
        reg,
        ServiceOptions {
            queue_depth: opts.queue_depth,
        },
    )?;
    for w in 0..opts.warmup {
        service
            .submit(sets[w % sets.len()].clone(), &opts.exec)?
            .wait()?;
    }
    let next = AtomicUsize::new(0);
    let t0 = Instant::now();
    let per_thread = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..opts.concurrency)
            .map(|_| {
                scope.spawn(|| -> Result<Vec<f64>> {
                    let mut lat = Vec::new();
                    loop {
                        let r = next.fetch_add(1, Ordering::Relaxed);
                        if r >= opts.requests {
                            return Ok(lat);
                        }
                        let t = Instant::now();
                        service
                            .submit(sets[r % sets.len()].clone(), &opts.exec)?
                            .wait()?;
                        lat.push(t.elapsed().as_secs_f64());
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| Error::Internal("a serve-bench client panicked".into()))?
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let wall = t0.elapsed().as_secs_f64();
    let mut lat: Vec<f64> = per_thread.into_iter().flatten().collect();
    lat.sort_by(f64::total_cmp);
    let mut devices: Vec<String> = plan
        .placements
        .iter()
        .map(|p| p.device.to_string())
        .collect();
    devices.sort();
    devices.dedup();
    let n = lat.len();
    Ok(ServeBenchReport {
        mix: devices.join("+"),
        backend: backend.to_string(),
        requests: n,
        concurrency: opts.concurrency,
        queue_depth: opts.queue_depth,
        wall_s: wall,
        requests_per_s: n as f64 / wall,
        tokens_per_s: (n * tokens_per_request) as f64 / wall,
        p50_s: quantile(&lat, 0.5),
        p99_s: quantile(&lat, 0.99),
        max_s: lat.last().copied().unwrap_or(f64::NAN),
    })
}
