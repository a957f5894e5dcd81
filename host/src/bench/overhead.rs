//! The runtime's own cost per op: graphs of [`Op::Nop`] (no data, no launch) planned and
//! executed like any workload, so what is measured is the planner and the executor: a
//! dependency chain (each op waits for the one before) and independent ops (all ready at
//! once). `tandem bench overhead` prints it; benches/peers/starpu runs StarPU's empty
//! codelets in the same shapes beside it.
//!
//! Plan = [`crate::graph::Graph::index`] (validation, numbering the tensors, once) +
//! [`plan_indexed`] (placement) + [`Prepared::with_index`] (dependency indexing);
//! execute = [`Service::submit`] + [`crate::exec::Ticket::wait`] + dropping the result, on a
//! service started beforehand (as StarPU is initialised before its timing).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::backend::{DeviceKind, DeviceRegistry};
use crate::error::{Error, Result};
use crate::exec::{ExecOptions, Prepared, Service, ServiceOptions};
use crate::graph::Graph;
use crate::ops::Op;
use crate::plan::{BackendChoice, PlacementPolicy, plan_indexed};
use crate::tensor::{Tensor, TensorMeta};

/// The dependency shape of an overhead graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DepShape {
    /// Op i reads op i-1's token: nothing runs in parallel.
    Chain,
    /// Every op reads the one input: all ready at once.
    Independent,
}

impl DepShape {
    /// Both shapes.
    pub const ALL: [DepShape; 2] = [DepShape::Chain, DepShape::Independent];

    /// `chain` or `independent`.
    pub fn name(self) -> &'static str {
        match self {
            DepShape::Chain => "chain",
            DepShape::Independent => "independent",
        }
    }
}

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverheadOptions {
    /// Ops per graph (the figure is 100k).
    pub ops: usize,
    /// Measured repetitions per shape (the median is reported); one untimed run goes first.
    pub repeats: usize,
}

impl Default for OverheadOptions {
    fn default() -> Self {
        Self {
            ops: 100_000,
            repeats: 5,
        }
    }
}

/// One shape's figures (medians over the repetitions).
#[derive(Debug, Clone, Serialize)]
pub struct OverheadRow {
    /// The dependency shape.
    pub shape: DepShape,
    /// Ops in the graph.
    pub ops: usize,
    /// Ops the execution reported as run (equal to `ops`).
    pub ops_run: usize,
    /// Planning per op, in microseconds.
    pub plan_us_per_op: f64,
    /// Execution per op, in microseconds.
    pub execute_us_per_op: f64,
    /// Both, in microseconds.
    pub total_us_per_op: f64,
    /// Each phase per op, in microseconds: the median over the repetitions.
    pub phases: Phases,
    /// Each phase per op, in microseconds: the minimum over the repetitions (the least noisy
    /// figure on a busy machine).
    pub phases_min: Phases,
}

/// Where the time of one planned and executed graph goes, per op, in microseconds. Plan =
/// `index + place + prepare`; execute = `submit + wait + drop`.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Phases {
    /// [`Graph::index`]: validation and numbering of the tensors.
    pub index: f64,
    /// [`plan_indexed`]: placement (cost model, memory accounts).
    pub place: f64,
    /// [`Prepared::with_index`]: dependency indexing for the executor.
    pub prepare: f64,
    /// [`Service::submit`]: the execution's buffers and counters, the ready nodes sent.
    pub submit: f64,
    /// [`crate::exec::Ticket::wait`]: the nodes run, the result collected.
    pub wait: f64,
    /// Dropping the result (buffers, node runs).
    pub drop: f64,
}

impl Phases {
    const N: usize = 6;

    fn from_array(a: [f64; Self::N]) -> Self {
        let [index, place, prepare, submit, wait, drop] = a;
        Self {
            index,
            place,
            prepare,
            submit,
            wait,
            drop,
        }
    }
}

/// The overhead figures of both shapes.
#[derive(Debug, Clone, Serialize)]
pub struct OverheadReport {
    /// The device the ops were placed on.
    pub device: String,
    /// Measured repetitions per shape.
    pub repeats: usize,
    /// One row per shape.
    pub rows: Vec<OverheadRow>,
}

/// A graph of `ops` [`Op::Nop`] nodes in `shape`, reading one empty input tensor.
pub fn nop_graph(shape: DepShape, ops: usize) -> Graph {
    let mut g = Graph::default();
    let start = g.constant(
        "start",
        Tensor::zeros(&TensorMeta::new(vec![0], crate::dtype::DType::F32)),
    );
    let mut prev = start.clone();
    for i in 0..ops {
        let read = match shape {
            DepShape::Chain => prev.as_str(),
            DepShape::Independent => start.as_str(),
        };
        let out = g.add(&format!("nop{i}"), Op::Nop, &[read]);
        if let Some(o) = out.into_iter().next() {
            prev = o;
        }
    }
    if ops > 0 {
        g.outputs.push(prev);
    }
    g
}

/// Plans and executes `shape` graphs of `opts.ops` no-ops on `reg`'s CPU, `opts.repeats`
/// times after one warm-up, and returns the median per-op times.
pub fn measure(
    reg: &DeviceRegistry,
    shape: DepShape,
    opts: &OverheadOptions,
) -> Result<OverheadRow> {
    if opts.ops == 0 || opts.repeats == 0 {
        return Err(Error::invalid(
            "bench overhead",
            format!(
                "ops ({}) and repeats ({}) must be at least 1",
                opts.ops, opts.repeats
            ),
        ));
    }
    let graph = nop_graph(shape, opts.ops);
    let service = Service::new(reg, ServiceOptions { queue_depth: 1 })?;
    let exec = ExecOptions::default();
    let policy = PlacementPolicy::default();
    let (mut plans, mut execs) = (Vec::new(), Vec::new());
    let mut phases: [Vec<Duration>; Phases::N] = Default::default();
    let mut ops_run = 0;
    for rep in 0..=opts.repeats {
        let mut t = [Instant::now(); Phases::N + 1];
        let index = Arc::new(graph.index()?);
        t[1] = Instant::now();
        let plan = plan_indexed(
            &graph,
            &index,
            reg,
            BackendChoice::Only(DeviceKind::Cpu),
            None,
            &policy,
        )?;
        t[2] = Instant::now();
        let prepared = Arc::new(Prepared::with_index(&graph, &index, &plan)?);
        t[3] = Instant::now();
        let ticket = service.submit(prepared, &exec)?;
        t[4] = Instant::now();
        let execution = ticket.wait()?;
        t[5] = Instant::now();
        ops_run = execution.runs.len();
        drop(execution);
        t[6] = Instant::now();
        if rep > 0 {
            plans.push(t[3] - t[0]);
            execs.push(t[6] - t[3]);
            for (k, v) in phases.iter_mut().enumerate() {
                v.push(t[k + 1] - t[k]);
            }
        }
    }
    let per_op = |d: Duration| d.as_secs_f64() * 1e6 / opts.ops as f64;
    let plan = per_op(median_of(&mut plans));
    let execute = per_op(median_of(&mut execs));
    let median = Phases::from_array(phases.each_mut().map(|v| per_op(median_of(v))));
    let min = Phases::from_array(
        phases
            .each_ref()
            .map(|v| per_op(v.iter().min().copied().unwrap_or_default())),
    );
    Ok(OverheadRow {
        shape,
        ops: opts.ops,
        ops_run,
        plan_us_per_op: plan,
        execute_us_per_op: execute,
        total_us_per_op: plan + execute,
        phases: median,
        phases_min: min,
    })
}

/// [`measure`] for both shapes.
pub fn run(reg: &DeviceRegistry, opts: &OverheadOptions) -> Result<OverheadReport> {
    let rows = DepShape::ALL
        .into_iter()
        .map(|s| measure(reg, s, opts))
        .collect::<Result<Vec<_>>>()?;
    Ok(OverheadReport {
        device: reg.cpu().id().to_string(),
        repeats: opts.repeats,
        rows,
    })
}

fn median_of(v: &mut [Duration]) -> Duration {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_graphs_have_the_shapes_they_say() -> Result<()> {
        let c = nop_graph(DepShape::Chain, 5);
        let deps = c.dependencies();
        assert_eq!(deps[0], Vec::<usize>::new());
        assert_eq!(deps[4], vec![3]);
        let i = nop_graph(DepShape::Independent, 5);
        assert!(i.dependencies().iter().all(Vec::is_empty));
        assert_eq!(c.validate()?.len(), 6);
        Ok(())
    }

    #[test]
    fn overhead_runs_every_op_and_gives_finite_times() -> Result<()> {
        let reg = DeviceRegistry::cpu_only();
        let r = run(
            &reg,
            &OverheadOptions {
                ops: 300,
                repeats: 2,
            },
        )?;
        assert_eq!(r.rows.len(), 2);
        for row in &r.rows {
            assert_eq!((row.ops, row.ops_run), (300, 300), "{row:?}");
            for v in [
                row.plan_us_per_op,
                row.execute_us_per_op,
                row.total_us_per_op,
            ] {
                assert!(v.is_finite() && v >= 0.0, "{row:?}");
            }
        }
        assert!(
            measure(
                &reg,
                DepShape::Chain,
                &OverheadOptions { ops: 0, repeats: 1 }
            )
            .is_err()
        );
        Ok(())
    }
}
