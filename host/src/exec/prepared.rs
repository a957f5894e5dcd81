//! A graph and its plan, checked once and indexed for execution: tensors as numbered slots,
//! nodes with their input/output slots, device, dependency count and dependents. An execution
//! then does no name lookups and no graph analysis; a served request is prepared on the
//! client's thread, so workers only run nodes.

use std::collections::HashMap;
use std::sync::Arc;

use crate::backend::DeviceId;
use crate::error::{Error, Result};
use crate::graph::Graph;
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
    pub name: String,
    pub meta: TensorMeta,
    pub source: Source,
}

/// One node, by slot and node index.
#[derive(Debug, Clone)]
pub(crate) struct PNode {
    pub name: String,
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
    /// Slots in the order of their names, so an execution's name map is built without
    /// sorting.
    pub(crate) by_name: Vec<u32>,
}

impl Prepared {
    /// Validates `graph` (see [`Graph::validate`]) and indexes it with `plan`'s placements.
    /// A plan made for another graph (a different node count) is an error.
    pub fn new(graph: &Graph, plan: &Plan) -> Result<Self> {
        let metas = graph.validate()?;
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
        let too_many = || Error::invalid("execute", "more than 2^32 tensors or nodes in a graph");
        let mut slots = Vec::with_capacity(graph.constants.len() + graph.nodes.len());
        let mut index: HashMap<&str, u32> = HashMap::with_capacity(slots.capacity());
        let mut producer: Vec<Option<u32>> = Vec::with_capacity(slots.capacity());
        for (name, t) in &graph.constants {
            let source = if graph.is_param(name) {
                Source::Param(t.clone())
            } else {
                Source::Input(t.clone())
            };
            index.insert(name, u32::try_from(slots.len()).map_err(|_| too_many())?);
            slots.push(Slot {
                name: name.clone(),
                meta: t.meta(),
                source,
            });
            producer.push(None);
        }
        let mut nodes = Vec::with_capacity(graph.nodes.len());
        for (i, (node, placement)) in graph.nodes.iter().zip(&plan.placements).enumerate() {
            let me = u32::try_from(i).map_err(|_| too_many())?;
            // validate() checked that every input is defined before its reader.
            let inputs = node
                .inputs
                .iter()
                .map(|n| {
                    index
                        .get(n.as_str())
                        .copied()
                        .ok_or_else(|| Error::Internal(format!("no tensor '{n}'")))
                })
                .collect::<Result<Vec<u32>>>()?;
            let mut outputs = Vec::with_capacity(node.outputs.len());
            for o in &node.outputs {
                let s = u32::try_from(slots.len()).map_err(|_| too_many())?;
                let meta = metas
                    .get(o)
                    .cloned()
                    .ok_or_else(|| Error::Internal(format!("no meta for '{o}'")))?;
                index.insert(o, s);
                slots.push(Slot {
                    name: o.clone(),
                    meta,
                    source: Source::Output,
                });
                producer.push(Some(me));
                outputs.push(s);
            }
            nodes.push(PNode {
                name: node.name.clone(),
                op: node.op.clone(),
                inputs,
                outputs,
                device: placement.device,
                deps: 0,
                dependents: Vec::new(),
            });
        }
        let mut roots = Vec::new();
        let mut deps: Vec<u32> = Vec::new();
        for i in 0..nodes.len() {
            deps.clear();
            deps.extend(nodes[i].inputs.iter().filter_map(|&s| producer[s as usize]));
            deps.sort_unstable();
            deps.dedup();
            nodes[i].deps = deps.len() as u32;
            for &d in &deps {
                nodes[d as usize].dependents.push(i as u32);
            }
            if deps.is_empty() {
                roots.push(i as u32);
            }
        }
        let mut by_name: Vec<u32> = (0..slots.len() as u32).collect();
        by_name.sort_unstable_by(|&a, &b| slots[a as usize].name.cmp(&slots[b as usize].name));
        Ok(Self {
            slots,
            nodes,
            roots,
            by_name,
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
