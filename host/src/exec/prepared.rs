//! A graph and its plan, checked once and indexed for execution: tensors as numbered slots,
//! nodes with their input/output slots, device, dependency count and dependents. An execution
//! then does no name lookups and no graph analysis; a served request is prepared on the
//! client's thread, so workers only run nodes.

use std::sync::{Arc, OnceLock};

use crate::backend::DeviceId;
use crate::error::{Error, Result};
use crate::graph::{Graph, GraphIndex};
use crate::ops::Op;
use crate::plan::Plan;
use crate::tensor::{Tensor, TensorMeta};

/// Where a tensor's data comes from.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// A parameter (weight): kept resident by the executor.
    Param(Arc<Tensor>),
    /// A per-run input: uploaded on every execution.
    Input(Arc<Tensor>),
    /// Written by a node.
    Output,
}

/// One tensor of the graph.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    pub name: Arc<str>,
    pub meta: TensorMeta,
    pub source: Source,
}

/// One node, by slot and node index.
#[derive(Debug, Clone)]
pub(crate) struct PNode {
    pub name: Arc<str>,
    pub op: Op,
    pub inputs: Vec<u32>,
    pub outputs: Vec<u32>,
    /// Where the plan put it.
    pub device: DeviceId,
    /// How many distinct nodes it waits for.
    pub deps: u32,
    /// The nodes that wait for it.
    pub dependents: Vec<u32>,
}

/// A graph with its plan, validated and indexed for the executor ([`super::Executor`],
/// [`super::Service`]). Prepare once, execute many times: the graph's data (inputs and
/// weights) is held by `Arc`, so preparing copies no tensor data.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub(crate) slots: Vec<Slot>,
    pub(crate) nodes: Vec<PNode>,
    /// Nodes with no dependency, in graph order.
    pub(crate) roots: Vec<u32>,
    /// Slots in the order of their names ([`Prepared::by_name`]).
    by_name: OnceLock<Vec<u32>>,
}

impl Prepared {
    /// Validates `graph` (see [`Graph::validate`]) and indexes it with `plan`'s placements.
    /// A plan made for another graph (a different node count) is an error.
    pub fn new(graph: &Graph, plan: &Plan) -> Result<Self> {
        Self::with_index(graph, &graph.index()?, plan)
    }

    /// As [`Prepared::new`], with the graph's index already made ([`Graph::index`], e.g. for
    /// planning): `index` must be the index of `graph`.
    pub fn with_index(graph: &Graph, index: &GraphIndex, plan: &Plan) -> Result<Self> {
        if plan.placements.len() != graph.nodes.len() {
            return Err(Error::invalid(
                "execute",
                format!(
                    "the plan places {} nodes, the graph has {}: plan the graph you execute",
                    plan.placements.len(),
                    graph.nodes.len()
                ),
            ));
        }
        if !index.fits(graph) {
            return Err(Error::Internal(
                "the index given was made of another graph".into(),
            ));
        }
        let mut slots = Vec::with_capacity(index.slots());
        for ((name, t), meta) in graph.constants.iter().zip(index.metas()) {
            let source = if graph.is_param(name) {
                Source::Param(t.clone())
            } else {
                Source::Input(t.clone())
            };
            slots.push(Slot {
                name: name.as_str().into(),
                meta: meta.clone(),
                source,
            });
        }
        let mut nodes = Vec::with_capacity(graph.nodes.len());
        for (i, (node, placement)) in graph.nodes.iter().zip(&plan.placements).enumerate() {
            for (o, s) in node.outputs.iter().zip(index.outputs(i)) {
                slots.push(Slot {
                    name: o.as_str().into(),
                    meta: index.meta(s).clone(),
                    source: Source::Output,
                });
            }
            nodes.push(PNode {
                name: node.name.as_str().into(),
                op: node.op.clone(),
                inputs: index.inputs(i).to_vec(),
                outputs: index.outputs(i).collect(),
                device: placement.device,
                deps: 0,
                dependents: Vec::new(),
            });
        }
        let mut roots = Vec::new();
        let mut deps: Vec<u32> = Vec::new();
        for i in 0..nodes.len() {
            deps.clear();
            deps.extend(index.inputs(i).iter().filter_map(|&s| index.producer(s)));
            if deps.len() > 1 {
                deps.sort_unstable();
                deps.dedup();
            }
            nodes[i].deps = deps.len() as u32;
            for &d in &deps {
                nodes[d as usize].dependents.push(i as u32);
            }
            if deps.is_empty() {
                roots.push(i as u32);
            }
        }
        Ok(Self {
            slots,
            nodes,
            roots,
            by_name: OnceLock::new(),
        })
    }

    /// Slots in the order of their names (an execution's name map is built from it without
    /// sorting); made at the first execution that asks.
    pub(crate) fn by_name(&self) -> &[u32] {
        self.by_name.get_or_init(|| {
            let mut v: Vec<u32> = (0..self.slots.len() as u32).collect();
            v.sort_unstable_by(|&a, &b| {
                self.slots[a as usize]
                    .name
                    .cmp(&self.slots[b as usize].name)
            });
            v
        })
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the graph has no node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}
