//! A validated graph with its tensors numbered: what the planner and the executor walk, so
//! that neither looks a tensor up by name per node (names are resolved once, here).
//!
//! Slots: the constants first (in name order), then each node's outputs in node order, so a
//! node's outputs are consecutive slots.

use std::ops::Range;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

use super::Graph;
use crate::error::{Error, Result};
use crate::tensor::TensorMeta;

/// No producer: a constant.
const CONSTANT: u32 = u32::MAX;

/// The numbered tensors and per-node slots of a validated [`Graph`] ([`Graph::index`]).
#[derive(Debug, Clone, Default)]
pub struct GraphIndex {
    /// Meta of every slot.
    metas: Vec<TensorMeta>,
    /// Constants: slots `0..constants`.
    constants: usize,
    /// Input slots of every node, node after node; node i's are `inputs[in_off[i]..in_off[i+1]]`.
    inputs: Vec<u32>,
    /// The metas of those inputs, in the same ranges (what ops and backends are asked about).
    input_metas: Vec<TensorMeta>,
    in_off: Vec<u32>,
    /// Node i's outputs are slots `out_off[i]..out_off[i+1]`.
    out_off: Vec<u32>,
    /// The node writing each slot (`CONSTANT` for constants).
    producer: Vec<u32>,
}

/// The hash of a tensor or node name in the index's tables.
fn hash_name(name: &str) -> u64 {
    use std::hash::BuildHasher;
    rustc_hash::FxBuildHasher.hash_one(name)
}

fn too_many() -> Error {
    Error::invalid("workload", "more than 2^32 - 1 tensors or nodes in a graph")
}

impl GraphIndex {
    /// Validates `graph` (as [`Graph::validate`] documents) and numbers its tensors.
    pub fn new(graph: &Graph) -> Result<Self> {
        if let Some(p) = graph
            .params
            .iter()
            .find(|p| !graph.constants.contains_key(*p))
        {
            return Err(Error::invalid(
                "workload",
                format!("parameter '{p}' has no data (it is not among the constants)"),
            ));
        }
        let outputs: usize = graph.nodes.iter().map(|n| n.outputs.len()).sum();
        let slots = graph.constants.len() + outputs;
        if slots >= CONSTANT as usize || graph.nodes.len() >= CONSTANT as usize {
            return Err(too_many());
        }
        let reads: usize = graph.nodes.iter().map(|n| n.inputs.len()).sum();
        let mut ix = GraphIndex {
            metas: Vec::with_capacity(slots),
            constants: graph.constants.len(),
            inputs: Vec::with_capacity(reads),
            input_metas: Vec::with_capacity(reads),
            in_off: Vec::with_capacity(graph.nodes.len() + 1),
            out_off: Vec::with_capacity(graph.nodes.len() + 1),
            producer: Vec::with_capacity(slots),
        };
        // Name -> slot and node-name tables hold 4-byte indices, the names staying in the
        // graph: at 100k nodes the tables are ~1.5 MB instead of ~8 MB of (&str, u32)
        // entries, so a lookup mostly hits cache (the index is most of a plan's cost for
        // small ops: `tandem bench overhead`). Strings are compared only on a hash match.
        let mut slot_names: Vec<&str> = Vec::with_capacity(slots);
        let mut slot: HashTable<u32> = HashTable::with_capacity(slots);
        let rehash = |names: &[&str], s: &u32| hash_name(names[*s as usize]);
        for (name, t) in &graph.constants {
            let s = ix.metas.len() as u32;
            slot_names.push(name);
            slot.insert_unique(hash_name(name), s, |x| rehash(&slot_names, x));
            ix.metas.push(t.meta());
            ix.producer.push(CONSTANT);
        }
        let mut names: HashTable<u32> = HashTable::with_capacity(graph.nodes.len());
        ix.in_off.push(0);
        ix.out_off.push(ix.metas.len() as u32);
        for (i, node) in graph.nodes.iter().enumerate() {
            match names.entry(
                hash_name(&node.name),
                |&j| graph.nodes[j as usize].name == node.name,
                |&j| hash_name(&graph.nodes[j as usize].name),
            ) {
                Entry::Occupied(_) => {
                    return Err(Error::invalid(
                        "workload",
                        format!("two nodes are named '{}'", node.name),
                    ));
                }
                Entry::Vacant(v) => {
                    v.insert(i as u32);
                }
            }
            let first = ix.input_metas.len();
            for input in &node.inputs {
                let s = slot
                    .find(hash_name(input), |&s| {
                        slot_names[s as usize] == input.as_str()
                    })
                    .copied()
                    .ok_or_else(|| {
                        Error::invalid(
                            "workload",
                            format!(
                                "node '{}' reads '{input}', which nothing defines before it",
                                node.name
                            ),
                        )
                    })?;
                ix.inputs.push(s);
                ix.input_metas.push(ix.metas[s as usize].clone());
            }
            let outs = node
                .op
                .validate(&ix.input_metas[first..])
                .map_err(|e| Error::invalid("workload", format!("node '{}': {e}", node.name)))?;
            if outs.len() != node.outputs.len() {
                return Err(Error::Internal(format!(
                    "node '{}' names {} outputs, its op has {}",
                    node.name,
                    node.outputs.len(),
                    outs.len()
                )));
            }
            for (n, m) in node.outputs.iter().zip(outs) {
                let s = ix.metas.len() as u32;
                match slot.entry(
                    hash_name(n),
                    |&t| slot_names[t as usize] == n.as_str(),
                    |x| rehash(&slot_names, x),
                ) {
                    Entry::Occupied(_) => {
                        return Err(Error::invalid(
                            "workload",
                            format!("tensor '{n}' is defined twice"),
                        ));
                    }
                    Entry::Vacant(v) => {
                        v.insert(s);
                    }
                }
                slot_names.push(n);
                ix.metas.push(m);
                ix.producer.push(i as u32);
            }
            ix.in_off.push(ix.inputs.len() as u32);
            ix.out_off.push(ix.metas.len() as u32);
        }
        for o in &graph.outputs {
            if slot
                .find(hash_name(o), |&s| slot_names[s as usize] == o.as_str())
                .is_none()
            {
                return Err(Error::invalid(
                    "workload",
                    format!("output '{o}' is not produced by any node"),
                ));
            }
        }
        Ok(ix)
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.in_off.len().saturating_sub(1)
    }

    /// Number of tensors (slots).
    pub fn slots(&self) -> usize {
        self.metas.len()
    }

    /// Number of constants (slots `0..constants()`).
    pub fn constants(&self) -> usize {
        self.constants
    }

    /// The meta of tensor `slot`.
    pub fn meta(&self, slot: u32) -> &TensorMeta {
        &self.metas[slot as usize]
    }

    /// The metas of every slot.
    pub fn metas(&self) -> &[TensorMeta] {
        &self.metas
    }

    /// The slots node `node` reads, in its op's input order.
    pub fn inputs(&self, node: usize) -> &[u32] {
        &self.inputs[self.in_off[node] as usize..self.in_off[node + 1] as usize]
    }

    /// The metas of the tensors node `node` reads, in its op's input order.
    pub fn input_metas(&self, node: usize) -> &[TensorMeta] {
        &self.input_metas[self.in_off[node] as usize..self.in_off[node + 1] as usize]
    }

    /// The slots node `node` writes.
    pub fn outputs(&self, node: usize) -> Range<u32> {
        self.out_off[node]..self.out_off[node + 1]
    }

    /// The node writing `slot`; `None` for a constant.
    pub fn producer(&self, slot: u32) -> Option<u32> {
        match self.producer[slot as usize] {
            CONSTANT => None,
            p => Some(p),
        }
    }

    /// The names of the slots, in slot order (from `graph`, the graph this index was made of).
    pub fn slot_names<'g>(
        &self,
        graph: &'g Graph,
    ) -> impl Iterator<Item = &'g String> + Clone + 'g {
        graph
            .constants
            .keys()
            .chain(graph.nodes.iter().flat_map(|n| n.outputs.iter()))
    }

    /// Whether this index was made of a graph shaped like `graph`: the same numbers of nodes,
    /// constants and tensors (the cheap check before trusting an index given with a graph).
    pub fn fits(&self, graph: &Graph) -> bool {
        self.nodes() == graph.nodes.len()
            && self.constants == graph.constants.len()
            && self.slots()
                == self.constants + graph.nodes.iter().map(|n| n.outputs.len()).sum::<usize>()
    }
}
