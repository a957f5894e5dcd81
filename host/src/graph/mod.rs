//! The workload DAG: ops over named tensors.

mod index;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::error::Result;
use crate::ops::Op;
use crate::tensor::{Tensor, TensorMeta};

pub use index::GraphIndex;

/// One op in a graph, reading and writing named tensors.
#[derive(Debug, Clone)]
pub struct Node {
    /// Unique name (e.g. `q_proj`).
    pub name: String,
    /// The op.
    pub op: Op,
    /// Names of the tensors it reads, in the op's input order.
    pub inputs: Vec<String>,
    /// Names of the tensors it writes, in the op's output order.
    pub outputs: Vec<String>,
}

/// A DAG of ops. Nodes are kept in a topological order (checked by [`Graph::validate`]).
#[derive(Debug, Clone, Default)]
pub struct Graph {
    /// Nodes in execution order.
    pub nodes: Vec<Node>,
    /// Tensors given from outside: the per-run inputs and the parameters (weights). Held in an
    /// `Arc`, so a graph clones cheaply and an executor can tell whether a parameter's host data
    /// is the very data it uploaded before (see [`crate::resident`]).
    pub constants: BTreeMap<String, Arc<Tensor>>,
    /// Names of the constants that are parameters (weights): never written by any node and the
    /// same from run to run, so an [`crate::exec::Executor`] keeps them resident on the devices.
    /// The other constants are inputs, uploaded on every run.
    pub params: BTreeSet<String>,
    /// Names of the tensors the workload produces.
    pub outputs: Vec<String>,
}

impl Graph {
    /// Appends a node; output names are `{node}.{output}` unless given.
    pub fn add(&mut self, name: &str, op: Op, inputs: &[&str]) -> Vec<String> {
        let outputs: Vec<String> = op
            .output_names()
            .iter()
            .map(|o| format!("{name}.{o}"))
            .collect();
        self.nodes.push(Node {
            name: name.to_string(),
            op,
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs: outputs.clone(),
        });
        outputs
    }

    /// Adds (or replaces) a per-run input tensor.
    pub fn constant(&mut self, name: &str, t: Tensor) -> String {
        self.constants.insert(name.to_string(), Arc::new(t));
        self.params.remove(name);
        name.to_string()
    }

    /// Adds (or replaces) a parameter (a weight), which executors keep resident on devices.
    /// Replacing it gives it a new identity, so a resident copy of the old data is never used.
    pub fn param(&mut self, name: &str, t: Tensor) -> String {
        self.constants.insert(name.to_string(), Arc::new(t));
        self.params.insert(name.to_string());
        name.to_string()
    }

    /// Whether `name` is a parameter (a weight) rather than an input or an op's output.
    pub fn is_param(&self, name: &str) -> bool {
        self.params.contains(name)
    }

    /// Checks that every parameter has data, that every node reads only tensors defined before
    /// it, that names are unique, and that every op accepts its inputs; returns the meta of
    /// every tensor.
    pub fn validate(&self) -> Result<BTreeMap<String, TensorMeta>> {
        let ix = self.index()?;
        Ok(ix
            .slot_names(self)
            .cloned()
            .zip(ix.metas().iter().cloned())
            .collect())
    }

    /// Validates the graph (as [`Graph::validate`]) and numbers its tensors, for walking it
    /// without name lookups.
    pub fn index(&self) -> Result<GraphIndex> {
        GraphIndex::new(self)
    }

    /// For each node, the indices of the nodes it depends on.
    pub fn dependencies(&self) -> Vec<Vec<usize>> {
        let mut producer: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            for o in &n.outputs {
                producer.insert(o.as_str(), i);
            }
        }
        self.nodes
            .iter()
            .map(|n| {
                let mut d: Vec<usize> = n
                    .inputs
                    .iter()
                    .filter_map(|i| producer.get(i.as_str()).copied())
                    .collect();
                d.sort_unstable();
                d.dedup();
                d
            })
            .collect()
    }
}
