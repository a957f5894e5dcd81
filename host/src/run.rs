//! One call that plans, executes, checks and reports a graph: what `tandem run` and
//! `tandem op` do, available to library users too.

use crate::backend::{DeviceKind, DeviceRegistry, Numerics};
use crate::error::Result;
use crate::exec::{ExecOptions, Execution, Executor};
use crate::graph::Graph;
use crate::limits::{self, Limits};
use crate::plan::{BackendChoice, History, PlacementPolicy, Plan, plan_with};
use crate::report::{NodeReport, RunReport};
use crate::tensor::{TensorMeta, rel_error};
use crate::verify::{
    NodeError, check_finite_constants, check_finite_outputs, check_nodes, reference_chain,
};

/// Options of [`run_graph`].
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Which devices to use.
    pub backend: BackendChoice,
    /// What placement may do: lossy numerics in auto placement, the history, a missing or
    /// partial requested backend.
    pub placement: PlacementPolicy,
    /// The `--backend` text, for the report.
    pub backend_label: String,
    /// Executor options.
    pub exec: ExecOptions,
    /// Compare every node and the outputs with the f64 reference.
    pub check: bool,
    /// Name of the workload, for the report.
    pub workload: String,
    /// Untimed executions before the measured one (first-use costs: kernel compilation, plan
    /// and handle creation, simulator model loads, and the upload of the weights, which stay
    /// resident, are kept out of the figures).
    pub warmup: usize,
    /// Measured times: used by the planner, and the run's own times are added to it.
    pub history: Option<std::sync::Arc<std::sync::Mutex<History>>>,
    /// Host memory the run may allocate; checked before anything runs.
    pub limits: Limits,
    /// Run even when inputs or weights hold NaN or infinities (the run still fails if an
    /// output is not finite); by default such inputs are rejected before the run.
    pub allow_nonfinite: bool,
}

/// Everything a run produced.
#[derive(Debug)]
pub struct RunOutcome {
    /// The plan that was executed.
    pub plan: Plan,
    /// Buffers and per-node runs.
    pub exec: Execution,
    /// The report.
    pub report: RunReport,
}

/// Plans `graph` over `reg`, executes it, checks it against the f64 reference and reports.
/// The weights are uploaded once, by the first (warm-up) execution, and stay resident for the
/// others; they are dropped when the call returns (see [`run_graph_with`] to keep them).
pub fn run_graph(graph: &Graph, reg: &DeviceRegistry, opts: &RunOptions) -> Result<RunOutcome> {
    run_graph_with(&Executor::new(), graph, reg, opts)
}

/// [`run_graph`] on `executor`, whose resident weights are used and kept for later calls.
pub fn run_graph_with(
    executor: &Executor,
    graph: &Graph,
    reg: &DeviceRegistry,
    opts: &RunOptions,
) -> Result<RunOutcome> {
    let metas = graph.validate()?;
    limits::admit_graph(graph, opts.check, &opts.limits)?;
    if !opts.allow_nonfinite {
        check_finite_constants(graph)?;
    }
    let plan = match &opts.history {
        Some(h) => {
            let h = h.lock().unwrap_or_else(|e| e.into_inner());
            plan_with(graph, reg, opts.backend, Some(&h), &opts.placement)?
        }
        None => plan_with(graph, reg, opts.backend, None, &opts.placement)?,
    };
    // Checking each node needs every node's outputs: no fused units then.
    let exec_opts = ExecOptions {
        fuse: opts.exec.fuse && !opts.check,
        ..opts.exec.clone()
    };
    let mut weights_uploaded = 0u64;
    for _ in 0..opts.warmup {
        weights_uploaded += executor
            .execute(graph, &plan, reg, &exec_opts)?
            .resident_bytes();
    }
    reg.memory().reset_peaks();
    let exec = executor.execute(graph, &plan, reg, &exec_opts)?;
    let memory = crate::report::memory_of(reg, &exec);
    weights_uploaded += exec.resident_bytes();
    check_finite_outputs(graph, &exec, reg, opts.check)?;
    let errors = if opts.check {
        check_nodes(graph, &exec, reg)?
    } else {
        vec![NodeError::default(); graph.nodes.len()]
    };
    if let Some(h) = &opts.history {
        // CPU times taken while a Verilator simulation shared the cores are recorded apart
        // (the other devices' times are their own: events, simulated cycles).
        let contended = exec
            .runs
            .iter()
            .any(|r| r.device.kind == DeviceKind::FpgaSim);
        let mut h = h.lock().unwrap_or_else(|e| e.into_inner());
        for ((node, run), err) in graph.nodes.iter().zip(&exec.runs).zip(&errors) {
            // A fused unit's time is not one op's.
            if run.fused.is_some() {
                continue;
            }
            let ins: Vec<TensorMeta> = node.inputs.iter().map(|i| metas[i].clone()).collect();
            h.record_sample(
                run.device,
                &node.op,
                &ins,
                run.launch.device_time.unwrap_or(run.wall),
                contended && run.device.kind == DeviceKind::Cpu,
                err.rel_error,
            );
        }
        if let Err(e) = h.save() {
            tracing::warn!(error = %e, "could not save the op-time history");
        }
    }
    let output_rel_error = if opts.check {
        let chain = reference_chain(graph)?;
        let mut worst: Option<f64> = None;
        for name in &graph.outputs {
            if let (Some(r), Some(b)) = (chain.get(name), exec.buffers.get(name)) {
                if b.meta().dtype.is_float() && b.meta().numel() > 1 {
                    let e = rel_error(&b.to_host(reg)?.to_f64(), r);
                    worst = Some(worst.map_or(e, |w: f64| w.max(e)));
                }
            }
        }
        worst
    } else {
        None
    };
    let scalar = |suffix: &str| -> Result<Option<f64>> {
        match graph.outputs.iter().find(|o| o.ends_with(suffix)) {
            Some(n) => Ok(exec.buffers[n]
                .to_host(reg)?
                .to_f64()
                .iter()
                .next()
                .copied()),
            None => Ok(None),
        }
    };
    let nodes = graph
        .nodes
        .iter()
        .zip(exec.runs.iter())
        .zip(errors)
        .map(|((node, run), error)| {
            let ins: Vec<TensorMeta> = node.inputs.iter().map(|i| metas[i].clone()).collect();
            let cost = node.op.cost(&ins);
            let numerics = reg
                .get(run.device)
                .map(|b| b.numerics())
                .unwrap_or(Numerics::F32);
            NodeReport {
                numerics,
                lossy: numerics.is_lossy(),
                run: run.clone(),
                error,
                flops: cost.flops,
                bytes: cost.bytes,
            }
        })
        .collect();
    let devices = crate::report::device_labels(reg);
    let report = RunReport {
        workload: opts.workload.clone(),
        backend: opts.backend_label.clone(),
        placement: plan.summary(opts.backend),
        placements_from_history: plan.from_history,
        devices,
        nodes,
        wall_s: exec.wall.as_secs_f64(),
        weights_uploaded_bytes: weights_uploaded,
        weights_resident_bytes: executor.resident().device_bytes(),
        output_rel_error,
        aux_loss: scalar(".aux_loss")?,
        z_loss: scalar(".z_loss")?,
        warnings: plan.warnings.clone(),
        memory,
    };
    Ok(RunOutcome { plan, exec, report })
}
