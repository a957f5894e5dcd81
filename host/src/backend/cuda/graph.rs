//! CUDA graphs: a closure's launches on the device's compute stream recorded into one graph
//! ([`capture`]), instantiated once and replayed with one `cuGraphLaunch` ([`Captured`]), kept
//! per key of what was captured ([`GraphCache`]).
//!
//! **Memory: the graph owns it.** A captured kernel keeps the addresses it was recorded with,
//! and the pool hands out different blocks from run to run. Two sound answers exist: update
//! the graph every run (re-capture and `cuGraphExecUpdate`, or patch each kernel node's
//! parameters) or keep the addresses valid for the graph's life. Updating needs a fresh
//! capture per run (about the host cost of the eager launches it replaces) or knowing which
//! argument of which node is which buffer (impossible for cuBLASLt's kernels). So a capture
//! *owns* every block allocated during it: [`Pool::hold`] keeps the blocks the capturing
//! thread frees (scratch, intermediates) out of the free lists, and the [`Captured`] graph
//! hands them back when it is destroyed. Blocks that are still alive when the capture ends
//! (the outputs, an input slot) are the caller's to keep beside the graph. Inputs that change
//! from run to run are copied into such a slot before each replay; inputs that stay (weights)
//! are part of the cache key by address.
//!
//! **Illegal calls are caught**: the capture runs in `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`,
//! so a call on the capturing thread that could wait for the device (a stream
//! synchronisation, a device-to-host copy, `cuMemAlloc`: the pool relaxes the mode for its own
//! allocations) fails the capture instead of recording something that replays wrongly; other
//! threads (the completion watcher waiting on its events, uploads on the copy stream) are not
//! restricted, but must not touch the capturing stream: the backend keeps its own calls that
//! do (the events ordering copies against the compute stream, waits for it) out of a capture
//! with a lock (`CudaBackend::capturing`). One gap remains: a pool allocation on another
//! thread that fails frees the cached blocks after `cuCtxSynchronize`, which fails or ends
//! the capture (the block then runs eagerly). A failed capture is ended (the stream is usable again), its blocks given back,
//! and the error returned: callers run the work eagerly instead.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use cudarc::driver::result as drv;
use cudarc::driver::sys;
use serde::Serialize;

use super::device::Device;
use super::error::DrvResultExt;
use super::memory::Pool;
use super::memory::pool::HeldBlock;
use crate::error::{Error, Result};

/// The nodes of a captured graph by kind: what one replay launches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct NodeCounts {
    /// Kernel nodes (tandem's kernels and cuBLASLt's).
    pub kernels: usize,
    /// Memset nodes.
    pub memsets: usize,
    /// Memcpy nodes.
    pub memcpys: usize,
    /// Every other node (empty, event, child graph...).
    pub other: usize,
}

impl NodeCounts {
    /// Every node.
    pub fn total(&self) -> usize {
        self.kernels + self.memsets + self.memcpys + self.other
    }

    /// Adds one node of driver type `t`.
    fn add(&mut self, t: sys::CUgraphNodeType) {
        use sys::CUgraphNodeType as N;
        match t {
            N::CU_GRAPH_NODE_TYPE_KERNEL => self.kernels += 1,
            N::CU_GRAPH_NODE_TYPE_MEMSET => self.memsets += 1,
            N::CU_GRAPH_NODE_TYPE_MEMCPY => self.memcpys += 1,
            _ => self.other += 1,
        }
    }
}

impl std::fmt::Display for NodeCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} nodes: {} kernels, {} memsets, {} memcpys",
            self.total(),
            self.kernels,
            self.memsets,
            self.memcpys
        )?;
        if self.other > 0 {
            write!(f, ", {} other", self.other)?;
        }
        Ok(())
    }
}

/// A captured graph, instantiated, and the pool blocks its nodes address (held until it is
/// dropped).
pub struct Captured {
    label: String,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    nodes: NodeCounts,
    pool: Arc<Pool>,
    held: Vec<HeldBlock>,
}

// SAFETY: graph and executable graph are driver handles usable from any thread with the
// context bound; launches are serialised by the backend's launch lock.
unsafe impl Send for Captured {}
// SAFETY: as above; `launch` takes `&self` and the driver serialises launches of one exec.
unsafe impl Sync for Captured {}

impl std::fmt::Debug for Captured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Captured({}, {})", self.label, self.nodes)
    }
}

impl Captured {
    /// Queues one replay on `stream` (the device's context current).
    pub fn launch(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: exec is a live instantiated graph; every block it addresses is held by
        // `self` or by its owner beside it.
        unsafe { drv::graph::launch(self.exec, stream) }.ctx(&self.label, "cuGraphLaunch")
    }

    /// Its nodes by kind.
    pub fn nodes(&self) -> NodeCounts {
        self.nodes
    }

    /// Device bytes held for the graph's intermediates (the blocks freed during the capture).
    pub fn held_bytes(&self) -> usize {
        self.held.iter().map(HeldBlock::class).sum()
    }
}

impl Drop for Captured {
    fn drop(&mut self) {
        // SAFETY: the handles were made by this capture and are destroyed once; an executable
        // graph still running is freed by the driver when it completes.
        unsafe {
            if !self.exec.is_null() {
                let _ = drv::graph::exec_destroy(self.exec);
            }
            if !self.graph.is_null() {
                let _ = drv::graph::destroy(self.graph);
            }
        }
        // Later users of these blocks queue behind the graph's launches on the one compute
        // stream.
        self.pool.give_back(std::mem::take(&mut self.held));
    }
}

/// Records what `f` queues on `dev`'s compute stream into a graph and instantiates it; returns
/// the graph with `f`'s value (the blocks it allocated and still holds: the caller keeps them
/// alive beside the graph). `f` runs nothing on the device: its launches are only recorded.
/// Any error (from `f`, from a call the capture refuses, from instantiation) ends the capture
/// and gives every held block back; the stream is usable again.
pub fn capture<R>(
    dev: &Device,
    pool: &Arc<Pool>,
    f: impl FnOnce() -> Result<R>,
) -> Result<(Captured, R)> {
    let label = &dev.label;
    pool.hold()?;
    let mut c = Captured {
        label: label.clone(),
        graph: std::ptr::null_mut(),
        exec: std::ptr::null_mut(),
        nodes: NodeCounts::default(),
        pool: pool.clone(),
        held: Vec::new(),
    };
    // SAFETY: the compute stream is live and not capturing (captures are serialised by the
    // backend's launch lock and the pool's hold).
    let begun = unsafe {
        drv::stream::begin_capture(
            dev.stream,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
    }
    .ctx(label, "cuStreamBeginCapture");
    if let Err(e) = begun {
        c.held = pool.take_held();
        return Err(e);
    }
    let value = f();
    // SAFETY: ends the capture begun above, whatever `f` did (an invalidated capture ends
    // with an error and no graph).
    let ended = unsafe { drv::stream::end_capture(dev.stream) };
    c.held = pool.take_held();
    let ended = ended.ctx(label, "cuStreamEndCapture");
    if let Ok(g) = &ended {
        c.graph = *g;
    }
    // The closure's error says more than the invalidated capture's.
    let value = value?;
    if c.graph.is_null() {
        ended?;
        return Err(Error::Internal(format!(
            "{label}: cuStreamEndCapture returned no graph"
        )));
    }
    c.nodes = count_nodes(label, c.graph)?;
    // SAFETY: the graph was just captured.
    c.exec = unsafe { drv::graph::instantiate(c.graph, sys::CUgraphInstantiate_flags(0)) }
        .ctx(label, "cuGraphInstantiateWithFlags")?;
    Ok((c, value))
}

/// The nodes of `graph` by kind.
fn count_nodes(label: &str, graph: sys::CUgraph) -> Result<NodeCounts> {
    let mut n = 0usize;
    // SAFETY: a null array asks for the count only.
    unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) }
        .result()
        .ctx(label, "cuGraphGetNodes")?;
    let mut nodes: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); n];
    // SAFETY: the array holds n handles; the driver writes at most n.
    unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) }
        .result()
        .ctx(label, "cuGraphGetNodes")?;
    let mut counts = NodeCounts::default();
    for &node in nodes.iter().take(n) {
        let mut t = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: node is a node of graph.
        unsafe { sys::cuGraphNodeGetType(node, &mut t) }
            .result()
            .ctx(label, "cuGraphNodeGetType")?;
        counts.add(t);
    }
    Ok(counts)
}

/// What a [`GraphCache`] knows of a key.
#[derive(Debug)]
pub enum Cached<V> {
    /// Ran once, eagerly: the next run with this key captures.
    Seen,
    /// Captured: replay it.
    Ready(Arc<V>),
    /// Not capturable, and why (every later run is eager).
    Refused(String),
}

impl<V> Clone for Cached<V> {
    fn clone(&self) -> Self {
        match self {
            Cached::Seen => Cached::Seen,
            Cached::Ready(g) => Cached::Ready(g.clone()),
            Cached::Refused(w) => Cached::Refused(w.clone()),
        }
    }
}

/// Captured graphs (`V`: a graph with the buffers it addresses) by key, at most `capacity`
/// of them (the least recently used is dropped first, its memory back in the pool); keys
/// seen once and keys refused are remembered too (a few bytes each).
#[derive(Debug)]
pub struct GraphCache<K, V> {
    capacity: usize,
    state: Mutex<CacheState<K, V>>,
}

#[derive(Debug)]
struct CacheState<K, V> {
    entries: HashMap<K, (Cached<V>, u64)>,
    clock: u64,
}

impl<K: Hash + Eq + Clone, V> GraphCache<K, V> {
    /// An empty cache keeping at most `capacity` graphs (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            state: Mutex::new(CacheState {
                entries: HashMap::new(),
                clock: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheState<K, V>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What is known of `key` (`None`: never seen), marking it used.
    pub fn get(&self, key: &K) -> Option<Cached<V>> {
        let mut s = self.lock();
        s.clock += 1;
        let now = s.clock;
        s.entries.get_mut(key).map(|(c, used)| {
            *used = now;
            c.clone()
        })
    }

    /// Records what is known of `key` now; a graph beyond the capacity drops the least
    /// recently used other graph.
    pub fn put(&self, key: K, value: Cached<V>) {
        let mut s = self.lock();
        s.clock += 1;
        let now = s.clock;
        let is_graph = matches!(value, Cached::Ready(_));
        s.entries.insert(key.clone(), (value, now));
        if !is_graph {
            return;
        }
        loop {
            let graphs: Vec<(&K, u64)> = s
                .entries
                .iter()
                .filter(|(_, (c, _))| matches!(c, Cached::Ready(_)))
                .map(|(k, (_, used))| (k, *used))
                .collect();
            if graphs.len() <= self.capacity {
                break;
            }
            let Some(oldest) = graphs
                .into_iter()
                .filter(|(k, _)| **k != key)
                .min_by_key(|(_, used)| *used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            // Dropped as seen: the next run with it captures again.
            s.entries.insert(oldest, (Cached::Seen, now));
        }
    }

    /// Graphs held now.
    pub fn graphs(&self) -> usize {
        self.lock()
            .entries
            .values()
            .filter(|(c, _)| matches!(c, Cached::Ready(_)))
            .count()
    }

    /// Drops every graph (their memory back in the pool once nothing else holds them) and
    /// forgets every key.
    pub fn clear(&self) {
        self.lock().entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_captures_on_the_second_sight_and_keeps_the_newest_graphs() {
        let c: GraphCache<u32, &'static str> = GraphCache::new(2);
        assert!(c.get(&1).is_none());
        c.put(1, Cached::Seen);
        assert!(matches!(c.get(&1), Some(Cached::Seen)));
        c.put(1, Cached::Ready(Arc::new("g1")));
        c.put(2, Cached::Ready(Arc::new("g2")));
        assert_eq!(c.graphs(), 2);
        // 1 used after 2: 2 is the least recently used when a third graph comes
        assert!(matches!(c.get(&1), Some(Cached::Ready(g)) if *g == "g1"));
        c.put(3, Cached::Ready(Arc::new("g3")));
        assert_eq!(c.graphs(), 2);
        assert!(matches!(c.get(&2), Some(Cached::Seen)), "evicted to seen");
        assert!(matches!(c.get(&1), Some(Cached::Ready(_))));
        assert!(matches!(c.get(&3), Some(Cached::Ready(_))));
        c.put(4, Cached::Refused("syncs".into()));
        assert!(matches!(c.get(&4), Some(Cached::Refused(w)) if w == "syncs"));
        assert_eq!(c.graphs(), 2, "refusals are no graphs");
        c.clear();
        assert_eq!(c.graphs(), 0);
        assert!(c.get(&1).is_none());
    }

    #[test]
    fn node_counts_add_up_by_kind() {
        use sys::CUgraphNodeType as N;
        let mut n = NodeCounts::default();
        for t in [
            N::CU_GRAPH_NODE_TYPE_KERNEL,
            N::CU_GRAPH_NODE_TYPE_KERNEL,
            N::CU_GRAPH_NODE_TYPE_MEMSET,
            N::CU_GRAPH_NODE_TYPE_EMPTY,
        ] {
            n.add(t);
        }
        assert_eq!((n.kernels, n.memsets, n.memcpys, n.other), (2, 1, 0, 1));
        assert_eq!(n.total(), 4);
        assert_eq!(
            n.to_string(),
            "4 nodes: 2 kernels, 1 memsets, 0 memcpys, 1 other"
        );
    }
}
