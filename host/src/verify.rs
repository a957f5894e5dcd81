//! Checking a run against the f64 reference: per node (on the node's actual inputs) and for the
//! whole graph (the f64 chain from the constants).

use std::collections::BTreeMap;

use ndarray::ArrayD;
use serde::Serialize;

use crate::backend::DeviceRegistry;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::exec::Execution;
use crate::graph::Graph;
use crate::tensor::{Tensor, rel_error};

/// How far a node's outputs are from the f64 reference on the same inputs.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct NodeError {
    /// Largest ||out - ref|| / ||ref|| over the floating-point outputs.
    pub rel_error: Option<f64>,
    /// Elements of integer outputs (ids, counts) that differ from the reference.
    pub id_mismatches: Option<usize>,
}

/// Compares one op's outputs with its reference outputs.
///
/// The worst error wins, and NaN is the worst of all: a NaN in any output (or a missing or
/// misshapen output) makes the node's error NaN, whatever the other outputs measure.
pub fn compare(outs: &[Tensor], refs: &[ArrayD<f64>]) -> NodeError {
    let mut e = NodeError::default();
    if outs.len() != refs.len() {
        e.rel_error = Some(f64::NAN);
    }
    for (o, r) in outs.iter().zip(refs) {
        if o.dtype() == DType::I32 {
            let got = o.to_f64();
            let n = if got.shape() == r.shape() {
                got.iter().zip(r.iter()).filter(|(a, b)| a != b).count()
            } else {
                got.len().max(r.len())
            };
            e.id_mismatches = Some(e.id_mismatches.unwrap_or(0) + n);
        } else {
            let err = rel_error(&o.to_f64(), r);
            e.rel_error = Some(worst(e.rel_error, err));
        }
    }
    e
}

/// The worse of two errors; NaN is worse than any number.
fn worst(prev: Option<f64>, err: f64) -> f64 {
    match prev {
        None => err,
        Some(p) if p.is_nan() || err.is_nan() => f64::NAN,
        Some(p) => p.max(err),
    }
}

/// For each node, its outputs against the f64 reference computed on its actual inputs.
pub fn check_nodes(
    graph: &Graph,
    exec: &Execution,
    reg: &DeviceRegistry,
) -> Result<Vec<NodeError>> {
    let host = |name: &str| -> Result<Tensor> {
        exec.buffers
            .get(name)
            .ok_or_else(|| Error::Internal(format!("no buffer '{name}'")))?
            .to_host(reg)
    };
    let mut progress = crate::progress::Task::quiet(
        "reference",
        format!(
            "checking {} ops against the f64 reference on their inputs",
            graph.nodes.len()
        ),
        Some(graph.nodes.len() as u64),
        "ops",
    );
    graph
        .nodes
        .iter()
        .map(|node| {
            let ins = node
                .inputs
                .iter()
                .map(|n| host(n).map(|t| t.to_f64()))
                .collect::<Result<Vec<_>>>()?;
            let outs = node
                .outputs
                .iter()
                .map(|n| host(n))
                .collect::<Result<Vec<_>>>()?;
            let refs = node.op.reference(&ins)?;
            progress.inc();
            Ok(compare(&outs, &refs))
        })
        .collect()
}

/// Rejects non-finite inputs and weights: the first constant (by name) holding a NaN or an
/// infinity, with the index of the first such element. Every backend then sees the same
/// finite data (an int8 FPGA kernel cannot even represent NaN).
pub fn check_finite_constants(graph: &Graph) -> Result<()> {
    for (name, t) in &graph.constants {
        if let Some((idx, v)) = t.first_non_finite() {
            let kind = if graph.is_param(name) {
                "weight"
            } else {
                "input"
            };
            return Err(Error::invalid(
                "workload",
                format!(
                    "{kind} '{name}' holds {v} at {idx:?}; tandem accepts finite values only \
                     (--allow-nonfinite runs anyway and fails the run if an output is not finite)"
                ),
            ));
        }
    }
    Ok(())
}

/// The first node (in execution order) whose output holds a NaN or an infinity, as an error
/// naming the node, the op, the device, the tensor and the first index: an op that
/// overflowed, or a non-finite input let through. With `all_nodes` false only the graph's
/// outputs are read back (no download of intermediates).
pub fn check_finite_outputs(
    graph: &Graph,
    exec: &Execution,
    reg: &DeviceRegistry,
    all_nodes: bool,
) -> Result<()> {
    for (node, run) in graph.nodes.iter().zip(&exec.runs) {
        for (index, name) in node.outputs.iter().enumerate() {
            if !all_nodes && !graph.outputs.contains(name) {
                continue;
            }
            let Some(b) = exec.buffers.get(name) else {
                continue;
            };
            if !b.meta().dtype.is_float() {
                continue;
            }
            let neg_inf_ok = node.op.output_may_be_neg_inf(index);
            if let Some((idx, v)) = b.to_host(reg)?.first_non_finite_but(neg_inf_ok) {
                return Err(Error::invalid(
                    format!(
                        "node '{}' ({}) on {}",
                        node.name,
                        node.op.name(),
                        run.device
                    ),
                    format!(
                        "output '{name}' holds {v} at {idx:?} (the op overflowed f32, or a \
                         non-finite input reached it); nothing is saved"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The whole graph in f64, from its constants: every tensor by name.
pub fn reference_chain(graph: &Graph) -> Result<BTreeMap<String, ArrayD<f64>>> {
    let mut vals: BTreeMap<String, ArrayD<f64>> = graph
        .constants
        .iter()
        .map(|(n, t)| (n.clone(), t.to_f64()))
        .collect();
    let mut progress = crate::progress::Task::quiet(
        "reference-chain",
        format!(
            "computing the f64 reference chain of {} ops",
            graph.nodes.len()
        ),
        Some(graph.nodes.len() as u64),
        "ops",
    );
    for node in &graph.nodes {
        let ins = node
            .inputs
            .iter()
            .map(|n| {
                vals.get(n)
                    .cloned()
                    .ok_or_else(|| Error::Internal(format!("reference: '{n}' undefined")))
            })
            .collect::<Result<Vec<_>>>()?;
        let outs = node.op.reference(&ins)?;
        for (n, v) in node.outputs.iter().zip(outs) {
            vals.insert(n.clone(), v);
        }
        progress.inc();
    }
    Ok(vals)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[f32]) -> Tensor {
        Tensor::from_vec_f32(&[v.len()], v.to_vec()).expect("tensor")
    }

    fn r(v: &[f64]) -> ArrayD<f64> {
        ArrayD::from_shape_vec(vec![v.len()], v.to_vec()).expect("array")
    }

    #[test]
    fn a_nan_in_any_output_is_the_worst_error() {
        // NaN first, a finite error after (attention's o, then lse): the old fold kept the
        // later finite number.
        let e = compare(
            &[t(&[f32::NAN, 1.0]), t(&[1.0])],
            &[r(&[1.0, 1.0]), r(&[1.1])],
        );
        assert!(e.rel_error.is_some_and(f64::is_nan), "{e:?}");
        let e = compare(&[t(&[1.0]), t(&[f32::NAN])], &[r(&[1.1]), r(&[1.0])]);
        assert!(e.rel_error.is_some_and(f64::is_nan), "{e:?}");
        let e = compare(&[t(&[1.0]), t(&[2.0])], &[r(&[1.1]), r(&[2.0])]);
        assert!(
            e.rel_error.is_some_and(|x| (x - 0.1 / 1.1).abs() < 1e-6),
            "{e:?}"
        );
    }

    #[test]
    fn a_missing_output_is_a_failure() {
        let e = compare(&[t(&[1.0])], &[r(&[1.0]), r(&[2.0])]);
        assert!(e.rel_error.is_some_and(f64::is_nan), "{e:?}");
    }

    #[test]
    fn equal_infinities_match_and_unequal_ones_fail() {
        let inf = f64::NEG_INFINITY;
        let e = compare(&[t(&[f32::NEG_INFINITY, 2.0])], &[r(&[inf, 2.0])]);
        assert_eq!(e.rel_error, Some(0.0));
        let e = compare(&[t(&[3.0, 2.0])], &[r(&[inf, 2.0])]);
        assert!(e.rel_error.is_some_and(f64::is_nan), "{e:?}");
    }
}
