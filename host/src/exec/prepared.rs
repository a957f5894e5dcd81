//! A graph and its plan, checked once and indexed for execution: tensors as numbered slots,
//! nodes with their input/output slots, device, dependency count and dependents. An execution
//! then does no name lookups and no graph analysis; a served request is prepared on the
//! client's thread, so workers only run nodes.

use std::sync::Arc;

use super::names::Names;

use crate::backend::{DeviceId, FusedUnit};
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

/// One tensor of the graph (its name is in [`SlotNames`]).
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    pub source: Source,
}

/// One node, by slot and node index (its name is in `Prepared::node_names`).
#[derive(Debug, Clone)]
pub(crate) struct PNode {
    pub op: Op,
    /// Where the plan put it.
    pub device: DeviceId,
    /// How many distinct nodes it waits for.
    pub deps: u32,
}

/// A node's part in a group that may run as one unit ([`crate::exec::ExecOptions::fuse`]).
#[derive(Debug, Clone)]
pub(crate) enum Role {
    /// The group's first node: it runs the unit on `inputs` and writes the unit's outputs to
    /// `outputs` (slots); `members` run inside it.
    Head {
        unit: FusedUnit,
        inputs: Vec<u32>,
        outputs: Vec<u32>,
        members: Vec<u32>,
    },
    /// Runs inside the unit of node `head`, where that ran fused.
    Member { head: u32 },
}

/// A graph with its plan, validated and indexed for the executor ([`super::Executor`],
/// [`super::Service`]). Prepare once, execute many times: the graph's data (inputs and
/// weights) is held by `Arc`, so preparing copies no tensor data.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The graph's tensors numbered, its nodes' slots (shared with the plan's index).
    index: Arc<GraphIndex>,
    pub(crate) slots: Vec<Slot>,
    /// The nodes waiting for node i: `dependents[dep_off[i]..dep_off[i+1]]`.
    dependents: Vec<u32>,
    dep_off: Vec<u32>,
    pub(crate) nodes: Vec<PNode>,
    /// Nodes with no dependency, in graph order.
    pub(crate) roots: Vec<u32>,
    /// The slots' names, shared with the executions' [`super::Buffers`] (which must not hold
    /// the prepared graph: it holds the host tensors, and so would keep replaced weights and
    /// their resident copies alive).
    pub(crate) names: Arc<Names>,
    /// The nodes' names, shared with the executions' node runs ([`super::NodeName`]).
    pub(crate) node_names: Arc<Names>,
    /// Each node's part in a group that may run fused (empty: no group in the graph).
    pub(crate) roles: Vec<Option<Role>>,
}

impl Prepared {
    /// Validates `graph` (see [`Graph::validate`]) and indexes it with `plan`'s placements.
    /// A plan made for another graph (a different node count) is an error.
    pub fn new(graph: &Graph, plan: &Plan) -> Result<Self> {
        Self::with_index(graph, &Arc::new(graph.index()?), plan)
    }

    /// As [`Prepared::new`], with the graph's index already made ([`Graph::index`], e.g. for
    /// planning with [`crate::plan::plan_indexed`]): `index` must be the index of `graph`.
    pub fn with_index(graph: &Graph, index: &Arc<GraphIndex>, plan: &Plan) -> Result<Self> {
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
        let names = Arc::new(Names::new(index.slot_names(graph).map(String::as_str))?);
        let node_names = Arc::new(Names::new(graph.nodes.iter().map(|n| n.name.as_str()))?);
        let mut slots = Vec::with_capacity(index.slots());
        for (name, t) in &graph.constants {
            let source = if graph.is_param(name) {
                Source::Param(t.clone())
            } else {
                Source::Input(t.clone())
            };
            slots.push(Slot { source });
        }
        let mut nodes = Vec::with_capacity(graph.nodes.len());
        // (dependency, dependent) pairs, then grouped by dependency.
        let mut edges: Vec<(u32, u32)> = Vec::with_capacity(graph.nodes.len());
        let mut roots = Vec::new();
        let mut deps: Vec<u32> = Vec::new();
        for (i, (node, placement)) in graph.nodes.iter().zip(&plan.placements).enumerate() {
            slots.extend(node.outputs.iter().map(|_| Slot {
                source: Source::Output,
            }));
            deps.clear();
            deps.extend(index.inputs(i).iter().filter_map(|&s| index.producer(s)));
            if deps.len() > 1 {
                deps.sort_unstable();
                deps.dedup();
            }
            edges.extend(deps.iter().map(|&d| (d, i as u32)));
            if deps.is_empty() {
                roots.push(i as u32);
            }
            nodes.push(PNode {
                op: node.op.clone(),
                device: placement.device,
                deps: deps.len() as u32,
            });
        }
        // Counting sort of the edges by dependency: each node's dependents in node order.
        let mut dep_off = vec![0u32; nodes.len() + 1];
        for &(d, _) in &edges {
            dep_off[d as usize + 1] += 1;
        }
        for i in 0..nodes.len() {
            dep_off[i + 1] += dep_off[i];
        }
        let mut fill = dep_off.clone();
        let mut dependents = vec![0u32; edges.len()];
        for &(d, j) in &edges {
            dependents[fill[d as usize] as usize] = j;
            fill[d as usize] += 1;
        }
        let roles = moe_blocks(graph, index, plan);
        Ok(Self {
            roles,
            names,
            node_names,
            index: index.clone(),
            slots,
            dependents,
            dep_off,
            nodes,
            roots,
        })
    }

    /// The name of node `i`.
    pub(crate) fn node_name(&self, i: u32) -> &str {
        self.node_names.name(i)
    }

    /// The slots node `i` reads.
    pub(crate) fn inputs(&self, i: u32) -> &[u32] {
        self.index.inputs(i as usize)
    }

    /// The slots node `i` writes.
    pub(crate) fn outputs(&self, i: u32) -> std::ops::Range<u32> {
        self.index.outputs(i as usize)
    }

    /// The nodes waiting for node `i`.
    pub(crate) fn dependents(&self, i: u32) -> &[u32] {
        &self.dependents[self.dep_off[i as usize] as usize..self.dep_off[i as usize + 1] as usize]
    }

    /// The meta of tensor `slot`.
    pub(crate) fn meta(&self, slot: u32) -> &TensorMeta {
        self.index.meta(slot)
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

/// The MoE blocks of `graph` that may run as one unit ([`FusedUnit::MoeBlock`]), as each
/// node's role (an empty list where there is none). A block is a linear without bias or
/// activation (the router logits) read only by a routing node, whose ids, weights,
/// permutation and offsets only an experts node reads, on the same x as the logits, none of
/// those intermediates (nor the routing's counts) read by any other node or being a graph
/// output, and all three nodes planned on one device. The routing's losses may be read
/// anywhere: the unit writes them.
fn moe_blocks(graph: &Graph, index: &GraphIndex, plan: &Plan) -> Vec<Option<Role>> {
    let mut readers = vec![0u32; index.slots()];
    for i in 0..graph.nodes.len() {
        for &s in index.inputs(i) {
            readers[s as usize] += 1;
        }
    }
    let outputs: std::collections::BTreeSet<u32> = index
        .slot_names(graph)
        .enumerate()
        .filter(|(_, n)| graph.outputs.contains(n))
        .map(|(s, _)| s as u32)
        .collect();
    // Read by exactly `n` inputs, and not a graph output.
    let inner = |s: u32, n: u32| readers[s as usize] == n && !outputs.contains(&s);
    let mut roles: Vec<Option<Role>> = Vec::new();
    for (e, node) in graph.nodes.iter().enumerate() {
        if !matches!(node.op, Op::MoeExperts(_)) {
            continue;
        }
        let &[x, ids, w, sorted, offs, gate_up, down] = index.inputs(e) else {
            continue;
        };
        let Some(r) = index.producer(ids) else {
            continue;
        };
        let Op::MoeRoute(route) = graph.nodes[r as usize].op else {
            continue;
        };
        let r_out = index.outputs(r as usize);
        let at = |k: u32| r_out.start + k;
        if r_out.len() != 7 || [ids, w, sorted, offs] != [at(0), at(1), at(3), at(4)] {
            continue;
        }
        let &[logits] = index.inputs(r as usize) else {
            continue;
        };
        let Some(h) = index.producer(logits) else {
            continue;
        };
        let router_linear = matches!(graph.nodes[h as usize].op,
            Op::Linear(p) if !p.bias && p.act == crate::ops::Activation::None);
        let &[hx, router_w] = index.inputs(h as usize) else {
            continue;
        };
        let device = plan.placements[e].device;
        let same_device = [h as usize, r as usize]
            .iter()
            .all(|&n| plan.placements[n].device == device);
        if !router_linear
            || hx != x
            || !same_device
            || !inner(logits, 1)
            || ![ids, w, sorted, offs].iter().all(|&s| inner(s, 1))
            || !inner(at(2), 0)
        {
            continue;
        }
        if roles.is_empty() {
            roles = vec![None; graph.nodes.len()];
        }
        let e_out = index.outputs(e);
        roles[h as usize] = Some(Role::Head {
            unit: FusedUnit::MoeBlock(route),
            inputs: vec![x, router_w, gate_up, down],
            outputs: vec![e_out.start, at(5), at(6)],
            members: vec![r, e as u32],
        });
        roles[r as usize] = Some(Role::Member { head: h });
        roles[e] = Some(Role::Member { head: h });
    }
    roles
}
