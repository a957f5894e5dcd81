//! Memory accounting of the planner: what each device will hold as the schedule runs, against
//! its limit (`--memory-limit`, else its capacity).
//!
//! The executor keeps every output a device writes until the run ends, while the inputs a
//! device fetches (weights, inputs, activations from other devices) stay valid on the host and
//! can be evicted and fetched again. So a node fits a device when the outputs the device
//! already holds, plus the node's outputs and the inputs it must fetch, are within the limit;
//! the outputs then stay counted. A node whose working set (inputs + outputs) is over a
//! device's limit can never run there. Nodes named with a layer (`model.layers.3.attn`,
//! `layers.3.moe`) are kept together: a layer whose outputs would not fit beside what the
//! device holds goes whole to another device, so a model that does not fit one device is
//! split by layer.
//!
//! Weights stay resident on the device that uses them (the executor keeps them across runs
//! and evicts the least recently used when a limit is reached), so they are counted too: a
//! layer whose weights would not stay resident beside what the device already keeps is a
//! [`NoRoom::Evicts`], which the planner weighs against the other devices by adding the time
//! to fetch those weights again to that device's finish time. A second GPU with room wins
//! over evicting; the CPU (seconds for a layer) loses to a GPU that re-fetches its weights.
//!
//! What a device derives from a weight and keeps beside it ([`Backend::derived_weight_bytes`]:
//! the CUDA backend's e4m3 copies of the MoE experts' weights under FP8 experts) is counted
//! with that weight: in the working set of every node that reads it, and once in what stays
//! resident. The messages name those copies where there are any.
//!
//! [`Backend::derived_weight_bytes`]: crate::backend::Backend::derived_weight_bytes

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::backend::{DeviceId, DeviceRegistry};
use crate::error::{Error, Result};
use crate::graph::{Graph, GraphIndex, Node};
use crate::limits::human_bytes;

/// What the plan expects a device to hold.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedMemory {
    /// Device.
    pub device: DeviceId,
    /// Bytes it may hold (its `--memory-limit`, else its capacity; `u64::MAX` where neither
    /// is known).
    pub limit_bytes: u64,
    /// Whether `limit_bytes` was set (`--memory-limit`, `TANDEM_MEMORY_LIMIT`) rather than
    /// the device's capacity.
    pub limit_set: bool,
    /// Most bytes the schedule has it hold at once (outputs kept plus one node's fetched
    /// inputs, with the copies the device derives from them).
    pub peak_bytes: u64,
    /// Bytes of the weights its nodes use, kept resident across runs (each weight once), with
    /// the copies the device derives from them and keeps beside them.
    pub resident_bytes: u64,
    /// Of `resident_bytes`, the derived copies ([`crate::backend::Backend::derived_weight_bytes`]).
    pub derived_bytes: u64,
}

impl PlannedMemory {
    /// Whether the plan has the device hold anything (its peak or its resident weights).
    pub fn holds_anything(&self) -> bool {
        self.peak_bytes > 0 || self.resident_bytes > 0
    }

    /// One line for `plan` and `--explain`, without a newline: `memory: cuda:0 weights
    /// 1.2 GiB resident (0.6 GiB of it derived copies), peak working set 3.4 GiB of 79.1 GiB
    /// capacity`. The peak is [`PlannedMemory::peak_bytes`] (outputs kept plus one node's
    /// inputs), not the resident weights on top: it can be the smaller of the two.
    pub fn line(&self) -> String {
        let derived = if self.derived_bytes > 0 {
            format!(
                " ({} of it derived copies)",
                human_bytes(self.derived_bytes)
            )
        } else {
            String::new()
        };
        format!(
            "memory: {} weights {} resident{derived}, peak working set {} {}",
            self.device,
            human_bytes(self.resident_bytes),
            human_bytes(self.peak_bytes),
            self.limit_text()
        )
    }

    /// `of 8.0 GiB limit`, `of 79.1 GiB capacity`, or `(no known limit)`.
    fn limit_text(&self) -> String {
        if self.limit_bytes == u64::MAX {
            return "(no known limit)".into();
        }
        let what = if self.limit_set { "limit" } else { "capacity" };
        format!("of {} {what}", human_bytes(self.limit_bytes))
    }
}

/// The layer a node belongs to, from its name: the number after `layers.` (`model.layers.3.attn`,
/// `layers.12.moe.router`), if the name has one.
pub fn layer_of(name: &str) -> Option<usize> {
    let mut rest = name;
    // A byte search for the `l` first, then the rest (`str::find` sets up a two-way searcher
    // per call, and comparing every 7-byte window calls memcmp per byte position: costs the
    // planner paid for every node).
    let find = |s: &str| {
        let b = s.as_bytes();
        (0..b.len().saturating_sub(6)).find(|&i| b[i] == b'l' && &b[i..i + 7] == b"layers.")
    };
    while let Some(i) = find(rest) {
        let after = &rest[i + "layers.".len()..];
        let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
        let at_word = i == 0 || rest[..i].ends_with('.') || rest[..i].ends_with('/');
        if at_word && !digits.is_empty() && after[digits.len()..].starts_with('.') {
            return digits.parse().ok();
        }
        rest = after;
    }
    None
}

/// Why a device cannot take a node.
pub(super) enum NoRoom {
    /// The node's working set is over the device's limit: it never fits.
    TooBig {
        /// Its inputs and outputs, bytes on the device.
        need: u64,
        /// Of `need`, the copies the device derives from its inputs.
        derived: u64,
        /// The device's limit.
        limit: u64,
    },
    /// The device holds too much already (or its layer went elsewhere).
    Full(String),
    /// The node's layer fits, but its weights would not stay resident beside the weights
    /// and outputs the device keeps: each run would fetch `bytes` of weights again.
    Evicts {
        /// Bytes of the layer's weights not yet on the device (what each run fetches again;
        /// not the copies derived from them on the device).
        bytes: u64,
        /// What does not fit, for `plan --explain`.
        why: String,
    },
}

/// The bytes of a node on a device ([`Accounts::need`]).
#[derive(Debug, Clone, Copy)]
struct Need {
    /// Its outputs.
    outs: u64,
    /// Its inputs not produced on the device, and the copies derived from its inputs.
    fetch: u64,
    /// Its inputs, outputs and derived copies.
    working: u64,
    /// Of `working` (and `fetch`), the copies the device derives from its inputs.
    derived: u64,
}

/// `, of which X are derived copies ...` for `derived` bytes of copies (nothing for none).
pub(super) fn copies(derived: u64) -> String {
    if derived == 0 {
        return String::new();
    }
    format!(
        ", of which {} are derived copies such as FP8 expert weights",
        human_bytes(derived)
    )
}

/// The accounts of one planning pass.
pub(super) struct Accounts<'a> {
    graph: &'a Graph,
    reg: &'a DeviceRegistry,
    index: &'a GraphIndex,
    /// Devices by position (`dev_pos`), with their limits and the bytes per slot as they
    /// store them, computed once per device.
    devices: Vec<DeviceAccount>,
    /// Where each slot is produced (constants: never), by device position.
    produced_on: Vec<u32>,
    /// Nodes of every layer, by layer.
    layer_nodes: BTreeMap<usize, Vec<usize>>,
    /// The layer of every node (from its name), if any.
    node_layer: Vec<Option<usize>>,
    /// Layers kept off a device (their outputs do not fit beside what it holds).
    banned: BTreeSet<(usize, DeviceId)>,
    /// Layers placed on a device although their weights evict others there
    /// ([`NoRoom::Evicts`] accepted): their later nodes are not asked again.
    evicting: BTreeSet<(usize, DeviceId)>,
    /// Parameter slots (weights) counted as resident, by device position.
    resident_slots: BTreeSet<(usize, u32)>,
    /// Whether each slot is a parameter ([`Graph::is_param`]: kept resident across runs).
    param_slot: Vec<bool>,
    /// The last [`Accounts::need`] asked for, `(node, device position, need)`: a node is
    /// checked on a device, then placed on it, and its need is computed once.
    last_need: Option<(usize, usize, Need)>,
    /// Nodes placed off the device they would have gone to, because it was full: by device.
    pub spilled: BTreeMap<DeviceId, Vec<(String, DeviceId)>>,
}

struct DeviceAccount {
    id: DeviceId,
    limit: u64,
    limit_set: bool,
    /// Bytes of each slot as the device stores it; empty until the device is first asked
    /// about (then filled for every slot).
    stored: Vec<u64>,
    /// Bytes the device derives from each slot and keeps beside it
    /// ([`crate::backend::Backend::derived_weight_bytes`], the most any node reading the slot
    /// asks for); filled with `stored`.
    derived: Vec<u64>,
    /// Outputs it holds until the run ends.
    held: u64,
    /// Weights its nodes use, kept resident across runs, with their derived copies.
    resident: u64,
    /// Of `resident`, the derived copies.
    resident_derived: u64,
    peak: u64,
    /// Whether any node was placed here.
    used: bool,
}

/// No device produced the slot (a constant).
const NOWHERE: u32 = u32::MAX;

impl<'a> Accounts<'a> {
    pub fn new(graph: &'a Graph, index: &'a GraphIndex, reg: &'a DeviceRegistry) -> Self {
        let mut layer_nodes: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        let node_layer: Vec<Option<usize>> =
            graph.nodes.iter().map(|n| layer_of(&n.name)).collect();
        for (i, l) in node_layer.iter().enumerate() {
            if let Some(l) = l {
                layer_nodes.entry(*l).or_default().push(i);
            }
        }
        Self {
            graph,
            reg,
            index,
            devices: Vec::new(),
            produced_on: vec![NOWHERE; index.slots()],
            layer_nodes,
            node_layer,
            banned: BTreeSet::new(),
            evicting: BTreeSet::new(),
            resident_slots: BTreeSet::new(),
            param_slot: param_slots(graph, index),
            last_need: None,
            spilled: BTreeMap::new(),
        }
    }

    /// The position of `dev` in `devices`, adding it (with its per-slot sizes) at first sight.
    fn dev_pos(&mut self, dev: DeviceId) -> usize {
        if let Some(p) = self.devices.iter().position(|d| d.id == dev) {
            return p;
        }
        let stored = match self.reg.get(dev) {
            Some(b) => self
                .index
                .metas()
                .iter()
                .map(|m| b.stored_bytes(m))
                .collect(),
            None => vec![0; self.index.slots()],
        };
        let mut derived = vec![0; self.index.slots()];
        if let Some(b) = self.reg.get(dev) {
            for (j, node) in self.graph.nodes.iter().enumerate().take(self.index.nodes()) {
                let metas = self.index.input_metas(j);
                for (k, &i) in self.index.inputs(j).iter().enumerate() {
                    let d = b.derived_weight_bytes(&node.op, metas, k);
                    let slot = &mut derived[i as usize];
                    *slot = (*slot).max(d);
                }
            }
        }
        self.devices.push(DeviceAccount {
            id: dev,
            limit: self.reg.memory_limit(dev).unwrap_or(u64::MAX),
            limit_set: self.reg.memory().limits().limit_for(dev).is_some(),
            stored,
            derived,
            held: 0,
            resident: 0,
            resident_derived: 0,
            peak: 0,
            used: false,
        });
        self.devices.len() - 1
    }

    /// Whether the user set `dev`'s limit (`--memory-limit`), rather than its capacity.
    pub fn limit_set(&self, dev: DeviceId) -> bool {
        match self.devices.iter().find(|d| d.id == dev) {
            Some(d) => d.limit_set,
            None => self.reg.memory().limits().limit_for(dev).is_some(),
        }
    }

    fn limit(&self, dev: DeviceId) -> u64 {
        self.reg.memory_limit(dev).unwrap_or(u64::MAX)
    }

    /// The bytes of node `node` on the device at `pos`, as it stores them.
    fn need(&mut self, pos: usize, node: usize) -> Need {
        if let Some((n, p, need)) = self.last_need
            && (n, p) == (node, pos)
        {
            return need;
        }
        let need = self.compute_need(pos, node);
        self.last_need = Some((node, pos, need));
        need
    }

    fn compute_need(&self, pos: usize, node: usize) -> Need {
        let d = &self.devices[pos];
        let outs: u64 = self.index.outputs(node).map(|o| d.stored[o as usize]).sum();
        let ins = self.index.inputs(node);
        let (mut fetch, mut all, mut derived) = (0u64, 0u64, 0u64);
        for (k, &i) in ins.iter().enumerate() {
            if ins[..k].contains(&i) {
                continue;
            }
            let b = d.stored[i as usize];
            all += b;
            if self.produced_on[i as usize] != pos as u32 {
                fetch += b;
            }
            // Derived from the input once it is here, wherever it came from.
            derived += d.derived[i as usize];
        }
        Need {
            outs,
            fetch: fetch + derived,
            working: outs + all + derived,
            derived,
        }
    }

    /// Whether node `index` fits `dev` now.
    pub fn check(&mut self, node: usize, dev: DeviceId) -> Result<(), NoRoom> {
        let pos = self.dev_pos(dev);
        let limit = self.devices[pos].limit;
        let need = self.need(pos, node);
        let (outs, fetch) = (need.outs, need.fetch);
        if need.working > limit {
            return Err(NoRoom::TooBig {
                need: need.working,
                derived: need.derived,
                limit,
            });
        }
        let held = self.devices[pos].held;
        if let Some(l) = self.node_layer[node] {
            if self.banned.contains(&(l, dev)) {
                return Err(NoRoom::Full(format!(
                    "layer {l} did not fit beside what {dev} holds"
                )));
            }
            // The layer's first node here: do all its outputs fit? Else the layer goes whole.
            let first_here = self.layer_nodes[&l]
                .iter()
                .all(|&j| j >= node || self.placed_on(j) != Some(pos));
            if first_here {
                let d = &self.devices[pos];
                let layer_outs: u64 = self.layer_nodes[&l]
                    .iter()
                    .filter(|&&j| j >= node)
                    .flat_map(|&j| self.index.outputs(j))
                    .map(|o| d.stored[o as usize])
                    .sum();
                if held.saturating_add(layer_outs).saturating_add(fetch) > limit {
                    self.banned.insert((l, dev));
                    let first = if need.derived > 0 {
                        format!(
                            " (and its first node's inputs {}{})",
                            human_bytes(fetch),
                            copies(need.derived)
                        )
                    } else {
                        String::new()
                    };
                    return Err(NoRoom::Full(format!(
                        "layer {l} needs {}{first} beside the {} {dev} holds, over its limit of {}",
                        human_bytes(layer_outs),
                        human_bytes(held),
                        human_bytes(limit)
                    )));
                }
                if !self.evicting.contains(&(l, dev)) {
                    let (weights, derived) = self.layer_weights_new(l, node, pos);
                    let resident = self.devices[pos].resident;
                    let total = held
                        .saturating_add(resident)
                        .saturating_add(layer_outs)
                        .saturating_add(weights);
                    if weights > 0 && total > limit {
                        // Without the copies they would stay: say that they are what does not fit.
                        let cause = if derived > 0 && total - derived <= limit {
                            "; the derived copies are what does not fit (the weights alone would)"
                        } else {
                            ""
                        };
                        return Err(NoRoom::Evicts {
                            bytes: weights - derived,
                            why: format!(
                                "layer {l}'s weights ({}{}) would not stay resident beside the {} \
                                 of weights and outputs {dev} keeps, over its limit of {}{cause}",
                                human_bytes(weights),
                                copies(derived),
                                human_bytes(held + resident),
                                human_bytes(limit)
                            ),
                        });
                    }
                }
            }
        }
        if held.saturating_add(outs).saturating_add(fetch) > limit {
            return Err(NoRoom::Full(format!(
                "needs {}{} beside the {} it holds, over its limit of {}",
                human_bytes(outs + fetch),
                copies(need.derived),
                human_bytes(held),
                human_bytes(limit)
            )));
        }
        Ok(())
    }

    /// Bytes of the parameter inputs (weights) of layer `l`'s nodes from `node` on that are
    /// not yet counted as resident on the device at `pos`, each counted once, with the copies
    /// the device derives from them; and of those, the copies.
    fn layer_weights_new(&self, l: usize, node: usize, pos: usize) -> (u64, u64) {
        let d = &self.devices[pos];
        let mut seen: Vec<u32> = Vec::new();
        let (mut sum, mut derived) = (0u64, 0u64);
        for &j in self.layer_nodes[&l].iter().filter(|&&j| j >= node) {
            for &i in self.index.inputs(j) {
                if self.param_slot[i as usize]
                    && !seen.contains(&i)
                    && !self.resident_slots.contains(&(pos, i))
                {
                    seen.push(i);
                    sum += d.stored[i as usize] + d.derived[i as usize];
                    derived += d.derived[i as usize];
                }
            }
        }
        (sum, derived)
    }

    /// Records that node `node`'s layer goes on `dev` although its weights evict others
    /// there ([`NoRoom::Evicts`]): the layer's later nodes are not asked again.
    pub fn accept_evicting(&mut self, node: usize, dev: DeviceId) {
        if let Some(l) = self.node_layer[node] {
            self.evicting.insert((l, dev));
        }
    }

    /// The device position node `j` was placed on (through its first output).
    fn placed_on(&self, j: usize) -> Option<usize> {
        self.index
            .outputs(j)
            .next()
            .map(|o| self.produced_on[o as usize])
            .filter(|&p| p != NOWHERE)
            .map(|p| p as usize)
    }

    /// Records node `node` placed on `dev`.
    pub fn place(&mut self, node: usize, dev: DeviceId) {
        let pos = self.dev_pos(dev);
        let Need { outs, fetch, .. } = self.need(pos, node);
        // Its parameter inputs (weights) stay resident there from now on, with what the
        // device derives from them.
        let (mut weights, mut derived) = (0u64, 0u64);
        for &i in self.index.inputs(node) {
            if self.param_slot[i as usize] && self.resident_slots.insert((pos, i)) {
                let d = &self.devices[pos];
                weights += d.stored[i as usize] + d.derived[i as usize];
                derived += d.derived[i as usize];
            }
        }
        let d = &mut self.devices[pos];
        d.held += outs;
        d.resident += weights;
        d.resident_derived += derived;
        d.used = true;
        d.peak = d.peak.max(d.held + fetch);
        for o in self.index.outputs(node) {
            self.produced_on[o as usize] = pos as u32;
        }
    }

    /// The error for a node that fits no device: `too_big` lists the devices that support it
    /// but whose limit is under its working set, as (device, need, derived copies in it,
    /// limit).
    pub fn too_big_error(node: &Node, too_big: &[(DeviceId, u64, u64, u64)]) -> Error {
        let parts: Vec<String> = too_big
            .iter()
            .map(|(d, need, derived, limit)| {
                format!(
                    "on {d} it needs {} (inputs + outputs, {need} bytes{}), over the limit of {} ({limit} bytes)",
                    human_bytes(*need),
                    copies(*derived),
                    human_bytes(*limit)
                )
            })
            .collect();
        Error::invalid(
            "memory limit",
            format!(
                "node '{}' ({}) fits no device: {}; raise --memory-limit for one of them \
                 (or make the workload smaller)",
                node.name,
                node.op.name(),
                parts.join("; ")
            ),
        )
    }

    /// What the plan expects each device it uses to hold.
    pub fn planned(&self) -> Vec<PlannedMemory> {
        let mut v: Vec<PlannedMemory> = self
            .devices
            .iter()
            .filter(|d| d.used)
            .map(|d| PlannedMemory {
                device: d.id,
                limit_bytes: d.limit,
                limit_set: d.limit_set,
                peak_bytes: d.peak,
                resident_bytes: d.resident,
                derived_bytes: d.resident_derived,
            })
            .collect();
        v.sort_by_key(|m| m.device);
        v
    }

    /// A line per device that could not hold all it would have run, naming where its nodes
    /// (or layers) went.
    pub fn split_notes(&self) -> Vec<String> {
        self.spilled
            .iter()
            .map(|(from, nodes)| {
                let layers: BTreeSet<usize> =
                    nodes.iter().filter_map(|(n, _)| layer_of(n)).collect();
                let to: BTreeSet<String> = nodes.iter().map(|(_, d)| d.to_string()).collect();
                let to = to.into_iter().collect::<Vec<_>>().join(", ");
                let what = if nodes.iter().all(|(n, _)| layer_of(n).is_some()) {
                    let l: Vec<String> = layers.iter().map(usize::to_string).collect();
                    format!("layers {} ({} nodes)", l.join(", "), nodes.len())
                } else {
                    let names: Vec<&str> = nodes.iter().take(4).map(|(n, _)| n.as_str()).collect();
                    format!(
                        "{} node{} ({}{})",
                        nodes.len(),
                        if nodes.len() == 1 { "" } else { "s" },
                        names.join(", "),
                        if nodes.len() > 4 { ", ..." } else { "" }
                    )
                };
                format!(
                    "memory: split across devices: {from} (limit {}) could not hold everything; \
                     {what} placed on {to}",
                    human_bytes(self.limit(*from))
                )
            })
            .chain(self.layers_by_device())
            .collect()
    }

    /// `memory: layers by device: cuda:0 0-1, cuda:1 2-3` when the layers went to more than
    /// one device (a node of a layer counts for the device it ran on).
    fn layers_by_device(&self) -> Option<String> {
        let mut by: BTreeMap<DeviceId, BTreeSet<usize>> = BTreeMap::new();
        for (&l, nodes) in &self.layer_nodes {
            for &j in nodes {
                if let Some(pos) = self.placed_on(j) {
                    by.entry(self.devices[pos].id).or_default().insert(l);
                }
            }
        }
        if by.len() < 2 || self.spilled.is_empty() {
            return None;
        }
        let parts: Vec<String> = by
            .iter()
            .map(|(d, ls)| format!("{d} {}", ranges(ls)))
            .collect();
        Some(format!("memory: layers by device: {}", parts.join(", ")))
    }
}

/// Whether each slot of `index` is a parameter of `graph` (looked up for constants only, and
/// not at all in a graph without parameters: planning stays cheap for graphs of many nodes).
fn param_slots(graph: &Graph, index: &GraphIndex) -> Vec<bool> {
    let mut v = vec![false; index.slots()];
    if graph.params.is_empty() {
        return v;
    }
    for (i, name) in index.slot_names(graph).enumerate() {
        if index.producer(i as u32).is_none() {
            v[i] = graph.is_param(name);
        }
    }
    v
}

/// `0-3, 5, 7-8` for a set of numbers.
fn ranges(v: &BTreeSet<usize>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut it = v.iter().copied().peekable();
    while let Some(a) = it.next() {
        let mut b = a;
        while it.peek() == Some(&(b + 1)) {
            b += 1;
            it.next();
        }
        out.push(if a == b {
            a.to_string()
        } else {
            format!("{a}-{b}")
        });
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::{layer_of, ranges};

    #[test]
    fn number_ranges() {
        let r = |v: &[usize]| ranges(&v.iter().copied().collect());
        assert_eq!(r(&[]), "");
        assert_eq!(r(&[3]), "3");
        assert_eq!(r(&[0, 1, 2, 3, 5, 7, 8]), "0-3, 5, 7-8");
    }

    #[test]
    fn layers_are_read_from_node_names() {
        assert_eq!(layer_of("model.layers.3.self_attn.q"), Some(3));
        assert_eq!(layer_of("layers.12.moe"), Some(12));
        assert_eq!(layer_of("l/layers.0.x"), Some(0));
        assert_eq!(layer_of("attn_q"), None);
        assert_eq!(layer_of("mylayers.3.x"), None);
        assert_eq!(layer_of("layers.x.3"), None);
        assert_eq!(layer_of("layers.3"), None);
        assert_eq!(layer_of("a.layers.b.layers.7.c"), Some(7));
    }
}
