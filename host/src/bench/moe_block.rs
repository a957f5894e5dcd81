//! `tandem bench moe-block`: the whole MoE block (router logits -> routing -> experts ->
//! combine) on a CUDA device, run eagerly and as one replayed CUDA graph, with each mode's
//! median device time and the launches per block (eager: counted as the host queues them;
//! graph: its nodes), the experts path that ran, and whether the graph's output is bit for
//! bit the eager one's on the same input.
//!
//! Both modes go through [`crate::backend::cuda::CudaBackend::moe_block`]; each block is
//! bracketed by the backend's two events (a replay's copies of x in and the output out
//! included). Two sets of x rotate between runs (the weights are one set: at the default shape
//! they are 2.8 GB, far past the L2).

use serde::Serialize;

use crate::error::{Error, Result};

/// The sizes of the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MoeBlockShape {
    /// Tokens T.
    pub tokens: usize,
    /// Hidden size H.
    pub hidden: usize,
    /// FFN size F of one expert.
    pub ffn: usize,
    /// Experts E.
    pub experts: usize,
    /// Experts per token k.
    pub top_k: usize,
}

impl MoeBlockShape {
    /// The default: a Mixtral-sized layer's block at T4096 (H4096 F14336 E8 k2).
    pub const DEFAULT: MoeBlockShape = MoeBlockShape {
        tokens: 4096,
        hidden: 4096,
        ffn: 14336,
        experts: 8,
        top_k: 2,
    };

    /// `T4096 H4096 F14336 E8 k2`.
    pub fn label(&self) -> String {
        format!(
            "T{} H{} F{} E{} k{}",
            self.tokens, self.hidden, self.ffn, self.experts, self.top_k
        )
    }

    /// Checks the sizes (every one above 0, k at most E).
    pub fn check(&self) -> Result<()> {
        let s = self;
        if s.tokens == 0 || s.hidden == 0 || s.ffn == 0 || s.experts == 0 {
            return Err(Error::invalid(
                "bench moe-block",
                format!("every size must be above 0 ({})", s.label()),
            ));
        }
        if s.top_k == 0 || s.top_k > s.experts {
            return Err(Error::invalid(
                "bench moe-block",
                format!("top-k {} must be in 1..={}", s.top_k, s.experts),
            ));
        }
        Ok(())
    }

    /// Floating-point operations of one block: the router GEMM and the experts' three GEMMs
    /// per routed token (2 x T x H x E + 2 x T x k x 3 x H x F).
    pub fn flops(&self) -> f64 {
        let (t, h, f, e, k) = (
            self.tokens as f64,
            self.hidden as f64,
            self.ffn as f64,
            self.experts as f64,
            self.top_k as f64,
        );
        2.0 * t * h * e + 2.0 * t * k * 3.0 * h * f
    }

    /// Bytes of the weights at 16 bits (router and experts): what the block must read at
    /// least once.
    pub fn weight_bytes(&self) -> f64 {
        let (h, f, e) = (self.hidden as f64, self.ffn as f64, self.experts as f64);
        2.0 * (e * h + e * 3.0 * h * f)
    }
}

impl Default for MoeBlockShape {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// One mode's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModeFigure {
    /// Median device time of one block, seconds.
    pub median_s: f64,
    /// Fastest.
    pub min_s: f64,
    /// Slowest.
    pub max_s: f64,
    /// Timed runs.
    pub runs: usize,
    /// Launches per block: eager, the kernel launches and cuBLASLt calls the host queued
    /// (memsets apart); graph, its kernel and memset nodes.
    pub launches: u64,
}

impl ModeFigure {
    /// Reduces `times` (seconds, at least one) to a figure.
    pub fn from_times(mut times: Vec<f64>, launches: u64) -> Result<Self> {
        if times.is_empty() {
            return Err(Error::Internal("bench moe-block: no timed runs".into()));
        }
        times.sort_by(f64::total_cmp);
        let runs = times.len();
        let median_s = if runs % 2 == 1 {
            times[runs / 2]
        } else {
            0.5 * (times[runs / 2 - 1] + times[runs / 2])
        };
        Ok(Self {
            median_s,
            min_s: times[0],
            max_s: times[runs - 1],
            runs,
            launches,
        })
    }
}

/// The graph's nodes by kind (as `NodeCounts` of the CUDA backend, kept here so the report
/// builds without the `cuda` feature).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct GraphNodes {
    /// Kernel nodes.
    pub kernels: usize,
    /// Memset nodes.
    pub memsets: usize,
    /// Memcpy nodes.
    pub memcpys: usize,
    /// Other nodes.
    pub other: usize,
}

/// What `tandem bench moe-block` measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MoeBlockReport {
    /// `moe_block`.
    pub op: &'static str,
    /// The sizes.
    pub sizes: MoeBlockShape,
    /// `T4096 H4096 F14336 E8 k2`.
    pub shape: String,
    /// The device id (`cuda:0`).
    pub backend: String,
    /// Its name.
    pub device: String,
    /// The storage precision (`bf16`, `f16`).
    pub storage: String,
    /// The experts path (`grouped-s`, `grouped-m`, `grouped-l`, `blaslt`).
    pub experts_path: String,
    /// The kernels of the three ops (`linear | routing | experts`).
    pub kernel: String,
    /// Eager runs.
    pub eager: ModeFigure,
    /// Replayed graph runs, where the block was captured.
    pub graph: Option<ModeFigure>,
    /// The graph's nodes, where captured.
    pub graph_nodes: Option<GraphNodes>,
    /// Why no graph ran, where none did.
    pub graph_refused: Option<String>,
    /// The graph's output equals the eager one's bit for bit on the same x (where captured).
    pub bit_exact: Option<bool>,
    /// The faster mode's median (the graph's where captured), seconds: the figure the PyTorch
    /// peer compares with.
    pub median_s: f64,
    /// Eager median / graph median, where captured.
    pub speedup: Option<f64>,
    /// TFLOP/s at `median_s`.
    pub tflops: f64,
    /// Weight bytes per second at `median_s`, GB/s.
    pub gbps: f64,
}

impl MoeBlockReport {
    /// Fills in the derived fields (`median_s`, `speedup`, rates) from the two modes.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        sizes: MoeBlockShape,
        backend: String,
        device: String,
        storage: String,
        experts_path: String,
        kernel: String,
        eager: ModeFigure,
        graph: Option<(ModeFigure, GraphNodes, bool)>,
        graph_refused: Option<String>,
    ) -> Self {
        let (graph, graph_nodes, bit_exact) = match graph {
            Some((g, n, b)) => (Some(g), Some(n), Some(b)),
            None => (None, None, None),
        };
        let median_s = graph.as_ref().map_or(eager.median_s, |g| g.median_s);
        let speedup = graph.as_ref().map(|g| eager.median_s / g.median_s);
        Self {
            op: "moe_block",
            shape: sizes.label(),
            sizes,
            backend,
            device,
            storage,
            experts_path,
            kernel,
            eager,
            graph,
            graph_nodes,
            graph_refused,
            bit_exact,
            median_s,
            speedup,
            tflops: sizes.flops() / median_s / 1e12,
            gbps: sizes.weight_bytes() / median_s / 1e9,
        }
    }

    /// The report as a JSON object (`tandem bench moe-block --json` adds the envelope).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_else(|e| serde_json::json!({"error": e.to_string()}))
    }
}

impl std::fmt::Display for MoeBlockReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "moe_block {} on {} ({}), {} storage, experts path {}",
            self.shape, self.backend, self.device, self.storage, self.experts_path
        )?;
        writeln!(f, "  kernels: {}", self.kernel)?;
        let e = &self.eager;
        writeln!(
            f,
            "  eager: median {:.1} us (min {:.1}, max {:.1}, {} runs), {} launches per block \
             (kernels + cuBLASLt calls queued by the host)",
            e.median_s * 1e6,
            e.min_s * 1e6,
            e.max_s * 1e6,
            e.runs,
            e.launches
        )?;
        match (&self.graph, &self.graph_nodes) {
            (Some(g), Some(n)) => {
                writeln!(
                    f,
                    "  graph: median {:.1} us (min {:.1}, max {:.1}, {} runs), 1 graph launch of \
                     {} kernel + {} memset nodes{} (x copied in, output out)",
                    g.median_s * 1e6,
                    g.min_s * 1e6,
                    g.max_s * 1e6,
                    g.runs,
                    n.kernels,
                    n.memsets,
                    if n.memcpys + n.other > 0 {
                        format!(" + {} other", n.memcpys + n.other)
                    } else {
                        String::new()
                    }
                )?;
                if let Some(s) = self.speedup {
                    writeln!(f, "  eager / graph: {s:.3}x")?;
                }
                if let Some(b) = self.bit_exact {
                    writeln!(
                        f,
                        "  graph output {} the eager output on the same x",
                        if b { "bit-exact with" } else { "DIFFERS from" }
                    )?;
                }
            }
            _ => writeln!(
                f,
                "  graph: not captured: {}",
                self.graph_refused.as_deref().unwrap_or("unknown reason")
            )?,
        }
        writeln!(
            f,
            "  {:.1} TFLOP/s, {:.1} GB/s of weights at {:.1} us",
            self.tflops,
            self.gbps,
            self.median_s * 1e6
        )
    }
}

/// Times the block on `be`: `warmup.0` untimed runs and then more for `warmup.1` (see
/// [`super::BenchOptions::warmup_time`]), and `iters` timed eager runs, then (where the
/// block can be captured) the same of replays, then one eager and one replayed run on the
/// same x compared bit for bit.
#[cfg(feature = "cuda")]
pub fn run(
    be: &crate::backend::cuda::CudaBackend,
    shape: MoeBlockShape,
    iters: usize,
    warmup: (usize, std::time::Duration),
    timeout: std::time::Duration,
) -> Result<MoeBlockReport> {
    use crate::backend::Backend;
    use crate::backend::cuda::{BlockLaunch, BlockMode, GraphUse, MoeBlock, MoeBlockInputs};
    use crate::ops::MoeRouteParams;

    shape.check()?;
    let iters = iters.max(1);
    let s = shape;
    let rand = |dims: &[usize], scale: f32, seed: u64| -> Result<crate::Tensor> {
        super::random_tensor(dims, scale, super::SEED ^ seed)
    };
    let up = |t: crate::Tensor| be.upload(&t);
    let xs = [
        up(rand(&[s.tokens, s.hidden], 1.0, 1)?)?,
        up(rand(&[s.tokens, s.hidden], 1.0, 2)?)?,
    ];
    let hs = 1.0 / (s.hidden as f32).sqrt();
    let router = up(rand(&[s.experts, s.hidden], hs, 3)?)?;
    let gate_up = up(rand(&[s.experts, 2 * s.ffn, s.hidden], hs, 4)?)?;
    let down = up(rand(
        &[s.experts, s.hidden, s.ffn],
        1.0 / (s.ffn as f32).sqrt(),
        5,
    )?)?;
    let block = MoeBlock {
        route: MoeRouteParams {
            top_k: s.top_k,
            renormalize: true,
            block_size: super::MOE_BLOCK,
        },
    };
    let launch = |i: usize, mode: BlockMode| -> Result<BlockLaunch> {
        be.moe_block(
            &block,
            &MoeBlockInputs {
                x: &xs[i % 2],
                router: &router,
                gate_up: &gate_up,
                down: &down,
            },
            mode,
        )
    };
    let wait = |l: &BlockLaunch| -> Result<f64> {
        l.done.wait(timeout, "moe_block")?;
        let info = l.info.lock().unwrap_or_else(|e| e.into_inner());
        info.device_time
            .map(|d| d.as_secs_f64())
            .ok_or_else(|| Error::Internal("moe_block: no event-timed device time".into()))
    };
    // Each mode: warm-up runs, then timed runs queued back to back and waited for at the end.
    let timed = |mode: BlockMode, first: usize| -> Result<(Vec<f64>, BlockLaunch)> {
        let i = super::timing::warm_up_runs(warmup.0, warmup.1, |i| {
            wait(&launch(first + i, mode)?).map(|_| ())
        })?;
        let runs: Vec<BlockLaunch> = (0..iters)
            .map(|j| launch(first + i + j, mode))
            .collect::<Result<_>>()?;
        let times = runs.iter().map(wait).collect::<Result<Vec<f64>>>()?;
        let last = runs
            .into_iter()
            .next_back()
            .ok_or_else(|| Error::Internal("no runs".into()))?;
        Ok((times, last))
    };
    // One eager run first (compiles, plans): in Auto mode it also marks the key as seen.
    let first = launch(0, BlockMode::Auto)?;
    wait(&first)?;
    let (eager_times, eager_last) = timed(BlockMode::Eager, 0)?;
    let eager_launches = eager_last.eager_launches.unwrap_or(0);
    let eager = ModeFigure::from_times(eager_times, eager_launches)?;
    let kernel = eager_last
        .info
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .kernel
        .clone();
    // The second sight of the key captures (or says why not).
    let second = launch(1, BlockMode::Auto)?;
    wait(&second)?;
    let mut graph = None;
    let mut refused = None;
    match &second.graph {
        GraphUse::Eager { why } => refused = Some(why.clone()),
        used => {
            let n = used.nodes().unwrap_or_default();
            let nodes = GraphNodes {
                kernels: n.kernels,
                memsets: n.memsets,
                memcpys: n.memcpys,
                other: n.other,
            };
            let (times, _) = timed(BlockMode::Auto, 0)?;
            let fig = ModeFigure::from_times(times, (n.kernels + n.memsets) as u64)?;
            // Same x (set 0), eager then replayed: bit for bit.
            let e = launch(0, BlockMode::Eager)?;
            wait(&e)?;
            let g = launch(0, BlockMode::Auto)?;
            wait(&g)?;
            if !matches!(g.graph, GraphUse::Replayed { .. }) {
                return Err(Error::Internal(format!(
                    "moe_block: expected a replay, ran {:?}",
                    g.graph
                )));
            }
            let (a, b) = (be.download(&e.output)?, be.download(&g.output)?);
            let (a, b) = (a.to_f32(), b.to_f32());
            let same = a.shape() == b.shape()
                && a.iter()
                    .zip(b.iter())
                    .all(|(x, y)| x.to_bits() == y.to_bits());
            graph = Some((fig, nodes, same));
        }
    }
    let info = be.info();
    Ok(MoeBlockReport::new(
        shape,
        info.id.to_string(),
        info.name.clone(),
        be.dtype().to_string(),
        eager_last.experts_path.clone(),
        kernel,
        eager,
        graph,
        refused,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(graph: bool) -> Result<MoeBlockReport> {
        let eager = ModeFigure::from_times(vec![3e-3, 1e-3, 2e-3], 9)?;
        let g = ModeFigure::from_times(vec![1.5e-3, 0.5e-3, 1e-3, 2e-3], 7)?;
        let nodes = GraphNodes {
            kernels: 6,
            memsets: 1,
            ..GraphNodes::default()
        };
        Ok(MoeBlockReport::new(
            MoeBlockShape::DEFAULT,
            "cuda:0".into(),
            "H100".into(),
            "bf16".into(),
            if graph { "grouped-l" } else { "blaslt" }.into(),
            "a | b | c".into(),
            eager,
            graph.then_some((g, nodes, true)),
            (!graph).then(|| "the experts run on the cuBLASLt path".to_string()),
        ))
    }

    #[test]
    fn medians_and_the_default_shape() -> Result<()> {
        let s = MoeBlockShape::DEFAULT;
        assert_eq!(s.label(), "T4096 H4096 F14336 E8 k2");
        s.check()?;
        assert!(MoeBlockShape { top_k: 9, ..s }.check().is_err());
        assert!(MoeBlockShape { tokens: 0, ..s }.check().is_err());
        let m = ModeFigure::from_times(vec![3.0, 1.0, 2.0, 4.0], 5)?;
        assert_eq!((m.median_s, m.min_s, m.max_s, m.runs), (2.5, 1.0, 4.0, 4));
        assert!(ModeFigure::from_times(vec![], 1).is_err());
        // 2*T*H*E + 2*T*k*3*H*F
        assert_eq!(
            s.flops(),
            2.0 * 4096.0 * 4096.0 * 8.0 + 2.0 * 4096.0 * 2.0 * 3.0 * 4096.0 * 14336.0
        );
        Ok(())
    }

    #[test]
    fn the_json_carries_both_modes_and_the_launch_counts() -> Result<()> {
        let r = report(true)?;
        let v = r.to_json();
        assert_eq!(v["op"], "moe_block");
        assert_eq!(v["shape"], "T4096 H4096 F14336 E8 k2");
        assert_eq!(v["sizes"]["tokens"], 4096);
        assert_eq!(v["eager"]["median_s"], 2e-3);
        assert_eq!(v["eager"]["launches"], 9);
        assert_eq!(v["graph"]["median_s"], 1.25e-3);
        assert_eq!(v["graph"]["launches"], 7);
        assert_eq!(v["graph_nodes"]["kernels"], 6);
        assert_eq!(v["median_s"], 1.25e-3, "the graph's where captured");
        assert_eq!(v["speedup"], 1.6);
        assert_eq!(v["bit_exact"], true);
        assert!(v["graph_refused"].is_null());
        for k in ["tflops", "gbps", "storage", "kernel", "experts_path"] {
            assert!(!v[k].is_null(), "{k}");
        }
        let text = r.to_string();
        assert!(
            text.contains("1 graph launch of 6 kernel + 1 memset nodes"),
            "{text}"
        );
        assert!(text.contains("bit-exact"), "{text}");

        let r = report(false)?;
        let v = r.to_json();
        assert!(v["graph"].is_null() && v["speedup"].is_null());
        assert_eq!(v["median_s"], 2e-3, "the eager one's otherwise");
        assert!(
            r.to_string()
                .contains("graph: not captured: the experts run")
        );
        Ok(())
    }
}
