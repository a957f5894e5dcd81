//! The MoE block on one CUDA device, as one unit of work: router logits (linear H -> E on
//! cuBLASLt), routing (top-k softmax, renormalise, the padded permutation), experts (gate/up
//! GEMM + SwiGLU, down GEMM, weighted combine). The three ops are queued back to back on the
//! compute stream, run eagerly or replayed as one CUDA graph ([`super::graph`]).
//!
//! [`CudaBackend::moe_block`] in [`BlockMode::Auto`] runs a block eagerly the first time its
//! key is seen (shapes, storage precisions, routing parameters, the weights' addresses and
//! the experts path), captures it the second time ("when shapes repeat") and replays the graph
//! from then on. Where an op of the block is not capture-safe (`ops::capture_safe`: the
//! cuBLASLt experts path synchronises the stream to read the expert offsets on the host) or
//! the capture fails, the block runs eagerly, never fails for it, and says why
//! ([`GraphUse::Eager`]; a `tracing` info line once per key).
//!
//! Memory: the graph owns every block it addresses (see [`super::graph`]): the intermediates
//! (held from the pool during the capture), its outputs (the experts' output and the routing's
//! two losses), and a slot for x. A replay copies x into the slot (skipped when x already is
//! the slot), launches the graph, and copies the outputs into fresh pool blocks the caller owns
//! like any launch's outputs, so a later replay never overwrites a result still in use.
//!
//! The executor runs the block through `Backend::launch_fused` ([`crate::backend::FusedUnit`])
//! where `crate::exec::ExecOptions::fuse` is on. The weights are read where they lie: their
//! addresses are part of the key, so new weights capture a new graph. At most
//! [`GRAPHS_KEPT`] graphs are kept per device, least recently used dropped first.

use std::sync::{Arc, Mutex};

use cudarc::driver::result as drv;

use super::error::DrvResultExt;
use super::graph::{self, Cached, Captured, GraphCache, NodeCounts};
use super::{CudaBackend, CudaStorage, ops};
use crate::backend::{DeviceStorage, LaunchInfo, Support};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{Activation, LinearParams, MoeExpertsParams, MoeRouteParams, Op};
use crate::sync::Completion;
use crate::tensor::TensorMeta;

/// Most captured MoE blocks a device keeps (each holds its intermediates: about 0.4 GB at
/// T4096 H4096 F14336 E8 k2).
pub const GRAPHS_KEPT: usize = 4;

/// The MoE block: its routing parameters (the sizes come from the inputs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeBlock {
    /// Top-k, renormalisation and the padded segments' block size.
    pub route: MoeRouteParams,
}

/// The device inputs of one MoE block.
#[derive(Debug, Clone, Copy)]
pub struct MoeBlockInputs<'a> {
    /// Hidden states x [T, H].
    pub x: &'a DeviceStorage,
    /// Router weight [E, H] (logits = x W^T).
    pub router: &'a DeviceStorage,
    /// Experts' gate and up projections stacked, [E, 2F, H].
    pub gate_up: &'a DeviceStorage,
    /// Experts' down projections, [E, H, F].
    pub down: &'a DeviceStorage,
}

/// How [`CudaBackend::moe_block`] runs the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockMode {
    /// Always eagerly: three ops' launches queued one by one.
    Eager,
    /// Eagerly the first time a key is seen, captured the second, replayed after; eagerly
    /// (saying why) where the block is not capture-safe.
    Auto,
}

/// Whether a block run used a graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GraphUse {
    /// Ran eagerly, and why.
    Eager {
        /// Why no graph (asked for, first sight of the key, an op not capture-safe, a capture
        /// that failed).
        why: String,
    },
    /// Captured by this run, then replayed.
    Captured {
        /// The graph's nodes.
        nodes: NodeCounts,
    },
    /// A graph captured earlier, replayed.
    Replayed {
        /// The graph's nodes.
        nodes: NodeCounts,
    },
}

impl GraphUse {
    /// The graph's nodes, where one ran.
    pub fn nodes(&self) -> Option<NodeCounts> {
        match self {
            GraphUse::Eager { .. } => None,
            GraphUse::Captured { nodes } | GraphUse::Replayed { nodes } => Some(*nodes),
        }
    }
}

/// One MoE block handed to the device.
#[derive(Debug)]
pub struct BlockLaunch {
    /// The block's output [T, H] (valid once `done` completes).
    pub output: DeviceStorage,
    /// The routing's load-balancing and z losses (scalars, as `moe_route` gives them).
    pub losses: [DeviceStorage; 2],
    /// Completes when the block's work has.
    pub done: Completion,
    /// The kernels of the three ops (`linear | routing | experts`) and, once `done`
    /// completes, the event-timed device time of the whole block (copies of a replay
    /// included).
    pub info: Arc<Mutex<LaunchInfo>>,
    /// Whether a graph ran.
    pub graph: GraphUse,
    /// The experts path: `grouped-<tile>`, `wgmma` or `blaslt`.
    pub experts_path: String,
    /// An eager run: kernel launches and cuBLASLt calls the host queued (each cuBLASLt call
    /// launches one kernel or more; memsets apart), read from the device's counters around
    /// the block (a cast kernel of an upload queued by another thread meanwhile would count
    /// too). `None` for a replay (one `cuGraphLaunch` and two copies).
    pub eager_launches: Option<u64>,
}

/// What a captured block is recorded with.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct BlockKey {
    inputs: [TensorMeta; 4],
    phys: [DType; 4],
    weights: [u64; 3],
    route: (usize, bool, usize),
    path: String,
    poison: bool,
}

/// A captured block: the graph and the blocks it addresses beyond its intermediates.
#[derive(Debug)]
pub(super) struct BlockGraph {
    graph: Captured,
    x_slot: CudaStorage,
    out: BlockOut,
    kernels: String,
}

/// What a block leaves: the experts' output and the routing's two losses.
#[derive(Debug)]
struct BlockOut {
    y: CudaStorage,
    losses: [CudaStorage; 2],
}

/// The captured blocks of one device.
pub(super) type BlockGraphs = GraphCache<BlockKey, BlockGraph>;

/// A new, empty set of captured blocks.
pub(super) fn block_graphs() -> BlockGraphs {
    GraphCache::new(GRAPHS_KEPT)
}

/// The three ops with their input and output metas, validated.
struct Plan {
    ops: [Op; 3],
    ins: [Vec<TensorMeta>; 3],
    outs: [Vec<TensorMeta>; 3],
}

impl MoeBlock {
    /// The block's ops: router logits, routing, experts.
    pub fn ops(&self) -> [Op; 3] {
        [
            Op::Linear(LinearParams {
                act: Activation::None,
                bias: false,
                f32_out: true,
            }),
            Op::MoeRoute(self.route),
            Op::MoeExperts(MoeExpertsParams {}),
        ]
    }

    /// Checks the inputs' metas ([x, router, gate_up, down]) and gives each op's.
    fn plan(&self, metas: &[TensorMeta; 4]) -> Result<Plan> {
        let [x, router, gate_up, down] = metas;
        let ops = self.ops();
        let lin_in = vec![x.clone(), router.clone()];
        let lin_out = ops[0].validate(&lin_in)?;
        let route_in = vec![lin_out[0].clone()];
        let route_out = ops[1].validate(&route_in)?;
        let r = &route_out;
        let exp_in = vec![
            x.clone(),
            r[0].clone(),
            r[1].clone(),
            r[3].clone(),
            r[4].clone(),
            gate_up.clone(),
            down.clone(),
        ];
        let exp_out = ops[2].validate(&exp_in)?;
        Ok(Plan {
            ops,
            ins: [lin_in, route_in, exp_in],
            outs: [lin_out.to_vec(), route_out.to_vec(), exp_out.to_vec()],
        })
    }
}

impl CudaBackend {
    /// Runs the MoE `block` on `ins` (see the module doc): eagerly, or in [`BlockMode::Auto`]
    /// as a CUDA graph once the same key repeats, where every op of it is capture-safe. The
    /// outputs are the experts' combined output [T, H] and the routing's aux and z losses; the
    /// routing's other outputs stay inside the block. Errors are the ops' (shapes, support) and the device's; a block that cannot
    /// be captured runs eagerly instead.
    pub fn moe_block(
        &self,
        block: &MoeBlock,
        ins: &MoeBlockInputs<'_>,
        mode: BlockMode,
    ) -> Result<BlockLaunch> {
        self.dev.bind()?;
        let given = [ins.x, ins.router, ins.gate_up, ins.down];
        let metas = given.map(|s| s.meta.clone());
        let plan = block.plan(&metas)?;
        for (op, m) in plan.ops.iter().zip(&plan.ins) {
            if let Support::No(why) = crate::backend::Backend::supports(self, op, m) {
                return Err(Error::Unsupported {
                    op: op.name().into(),
                    device: self.dev.label.clone(),
                    why,
                });
            }
        }
        let st = [
            self.storage(ins.x)?,
            self.storage(ins.router)?,
            self.storage(ins.gate_up)?,
            self.storage(ins.down)?,
        ];
        let _g = self.launch_lock.lock().unwrap_or_else(|e| e.into_inner());
        let cx = ops::Cx::new(self);
        for op in &plan.ops {
            ops::prepare(&cx, op)?;
        }
        let path = match &plan.ops[2] {
            Op::MoeExperts(p) => ops::experts_path_name(&cx, p, &plan.ins[2])?,
            _ => return Err(Error::Internal("moe block: experts op expected".into())),
        };
        let key = BlockKey {
            inputs: metas.clone(),
            phys: st.map(|s| s.phys),
            weights: [st[1].ptr(), st[2].ptr(), st[3].ptr()],
            route: (
                block.route.top_k,
                block.route.renormalize,
                block.route.block_size,
            ),
            path: path.clone(),
            poison: self.opts.poison,
        };
        let refusal = plan
            .ops
            .iter()
            .zip(&plan.ins)
            .find_map(|(op, m)| ops::capture_safe(&cx, op, m).err());
        let out_meta = plan.outs[2][0].clone();
        let loss_metas = [plan.outs[1][5].clone(), plan.outs[1][6].clone()];
        // Held (with `hold_stream`) until the block's work is queued, on every way out.
        let _release = super::Release(self);
        self.hold_stream()?;
        let region = self.timeline.begin(&self.dev)?;
        // An eager run: its output, kernels, why no graph, and the launches it queued.
        type Ran = (BlockOut, String, GraphUse, Option<u64>);
        let eager = |why: String| -> Result<Ran> {
            let before = (self.kernels.launched(), self.blas.calls());
            let (out, kernels) = self.block_ops(&cx, &plan, st)?;
            let n = self.kernels.launched() - before.0 + self.blas.calls() - before.1;
            Ok((out, kernels, GraphUse::Eager { why }, Some(n)))
        };
        let (out, kernels, used, eager_launches) = match mode {
            BlockMode::Eager => eager("eager run asked for".into())?,
            BlockMode::Auto => match (refusal, self.blocks.get(&key)) {
                (Some(why), known) => {
                    if !matches!(known, Some(Cached::Refused(_))) {
                        tracing::info!(device = %self.dev.label, %why, "moe block: not captured, runs eagerly");
                        self.blocks.put(key, Cached::Refused(why.clone()));
                    }
                    eager(why)?
                }
                (None, None) => {
                    self.blocks.put(key, Cached::Seen);
                    eager("first run of this shape (captured when it repeats)".into())?
                }
                (None, Some(Cached::Refused(why))) => eager(why)?,
                (None, Some(Cached::Ready(g))) => {
                    let out = self.replay_block(&g, st[0])?;
                    let nodes = g.graph.nodes();
                    (out, g.kernels.clone(), GraphUse::Replayed { nodes }, None)
                }
                (None, Some(Cached::Seen)) => match self.capture_block(&cx, &plan, st) {
                    Ok(g) => {
                        let g = Arc::new(g);
                        let nodes = g.graph.nodes();
                        tracing::debug!(device = %self.dev.label, %nodes, held = g.graph.held_bytes(), "moe block captured");
                        self.blocks.put(key, Cached::Ready(g.clone()));
                        let out = self.replay_block(&g, st[0])?;
                        (out, g.kernels.clone(), GraphUse::Captured { nodes }, None)
                    }
                    Err(e) => {
                        let why = format!("capture failed: {e}");
                        tracing::info!(device = %self.dev.label, %why, "moe block: not captured, runs eagerly");
                        self.blocks.put(key, Cached::Refused(why.clone()));
                        eager(why)?
                    }
                },
            },
        };
        let info = Arc::new(Mutex::new(LaunchInfo {
            kernel: kernels,
            device_time: None,
            cycles: None,
        }));
        let done = self.timeline.end(&self.dev, region, info.clone())?;
        self.release_stream();
        let [aux, z] = out.losses;
        let [aux_meta, z_meta] = loss_metas;
        Ok(BlockLaunch {
            output: self.wrap(out_meta, out.y),
            losses: [self.wrap(aux_meta, aux), self.wrap(z_meta, z)],
            done,
            info,
            graph: used,
            experts_path: path,
            eager_launches,
        })
    }

    /// Captured MoE blocks kept now.
    pub fn block_graphs(&self) -> usize {
        self.blocks.graphs()
    }

    /// Drops every captured MoE block (their memory goes back to the pool) and forgets which
    /// keys were seen.
    pub fn clear_block_graphs(&self) {
        self.blocks.clear();
    }

    /// Queues the three ops (x, router, gate_up, down in `st`); returns the output, the
    /// routing's losses and the kernels that ran (`linear | routing | experts`). The other
    /// intermediates go back to the pool (or, during a capture, to the graph) when this
    /// returns.
    fn block_ops(
        &self,
        cx: &ops::Cx<'_>,
        plan: &Plan,
        st: [&CudaStorage; 4],
    ) -> Result<(BlockOut, String)> {
        let [x, router, gate_up, down] = st;
        let alloc = |i: usize| -> Result<Vec<CudaStorage>> {
            let outs = ops::alloc_outputs(cx, &plan.ops[i], &plan.outs[i])?;
            if self.opts.poison {
                for o in &outs {
                    cx.poison(o)?;
                }
            }
            Ok(outs)
        };
        let logits = alloc(0)?;
        let k0 = ops::run(cx, &plan.ops[0], &[x, router], &plan.ins[0], &logits)?;
        let r = alloc(1)?;
        let k1 = ops::run(cx, &plan.ops[1], &[&logits[0]], &plan.ins[1], &r)?;
        let out = alloc(2)?;
        let k2 = ops::run(
            cx,
            &plan.ops[2],
            &[x, &r[0], &r[1], &r[3], &r[4], gate_up, down],
            &plan.ins[2],
            &out,
        )?;
        let y = out
            .into_iter()
            .next()
            .ok_or_else(|| Error::Internal("moe_experts: no output".into()))?;
        let mut r = r.into_iter().skip(5);
        let (Some(aux), Some(z)) = (r.next(), r.next()) else {
            return Err(Error::Internal("moe_route: no losses".into()));
        };
        let out = BlockOut {
            y,
            losses: [aux, z],
        };
        Ok((out, format!("{k0} | {k1} | {k2}")))
    }

    /// Records the block into a graph that reads x from a slot of its own.
    fn capture_block(
        &self,
        cx: &ops::Cx<'_>,
        plan: &Plan,
        st: [&CudaStorage; 4],
    ) -> Result<BlockGraph> {
        let x = st[0];
        let x_slot = cx.alloc(plan.ins[0][0].numel(), x.phys)?;
        // No other thread's copies order themselves against the stream while it records.
        let _c = self.capturing.write().unwrap_or_else(|e| e.into_inner());
        let (graph, (out, kernels)) = graph::capture(&self.dev, &self.pool, || {
            self.block_ops(cx, plan, [&x_slot, st[1], st[2], st[3]])
        })?;
        Ok(BlockGraph {
            graph,
            x_slot,
            out,
            kernels,
        })
    }

    /// Queues one replay of `g` on x: x copied into the graph's slot, the graph, its output
    /// and losses copied into fresh blocks (returned).
    fn replay_block(&self, g: &BlockGraph, x: &CudaStorage) -> Result<BlockOut> {
        let l = &self.dev.label;
        let stream = self.dev.stream;
        let x_bytes = g.x_slot.buf.len();
        if x.ptr() != g.x_slot.ptr() && x_bytes > 0 {
            // SAFETY: slot and x hold x_bytes (same shape and precision: both in the key);
            // ordered on the compute stream after x's producer and before the graph.
            unsafe { drv::memcpy_dtod_async(g.x_slot.ptr(), x.ptr(), x_bytes, stream) }
                .ctx(l, "cuMemcpyDtoDAsync(moe block x)")?;
        }
        g.graph.launch(stream)?;
        let copy = |src: &CudaStorage| -> Result<CudaStorage> {
            let bytes = src.buf.len();
            let dst = CudaStorage::new(self.pool.alloc(bytes)?, src.phys);
            if bytes > 0 {
                // SAFETY: both hold `bytes`; ordered after the graph on the compute stream.
                unsafe { drv::memcpy_dtod_async(dst.ptr(), src.ptr(), bytes, stream) }
                    .ctx(l, "cuMemcpyDtoDAsync(moe block output)")?;
            }
            Ok(dst)
        };
        Ok(BlockOut {
            y: copy(&g.out.y)?,
            losses: [copy(&g.out.losses[0])?, copy(&g.out.losses[1])?],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(shape: &[usize]) -> TensorMeta {
        TensorMeta::new(shape, DType::F32)
    }

    #[test]
    fn the_plan_wires_the_routing_into_the_experts() -> Result<()> {
        let b = MoeBlock {
            route: MoeRouteParams {
                top_k: 2,
                renormalize: true,
                block_size: 16,
            },
        };
        let (t, h, e, f) = (64, 32, 8, 48);
        let p = b.plan(&[
            f32s(&[t, h]),
            f32s(&[e, h]),
            f32s(&[e, 2 * f, h]),
            f32s(&[e, h, f]),
        ])?;
        assert_eq!(p.outs[0][0].shape.to_vec(), vec![t, e], "logits");
        assert_eq!(p.ins[2][1].shape.to_vec(), vec![t, 2], "topk ids");
        assert_eq!(p.ins[2][3].dtype, DType::I32, "sorted ids");
        assert_eq!(p.ins[2][4].shape.to_vec(), vec![e + 1], "offsets");
        assert_eq!(p.outs[2][0].shape.to_vec(), vec![t, h]);
        // a router of the wrong width is the linear's error
        let bad = b.plan(&[
            f32s(&[t, h]),
            f32s(&[e, h + 1]),
            f32s(&[e, 2 * f, h]),
            f32s(&[e, h, f]),
        ]);
        assert!(bad.is_err());
        Ok(())
    }
}
