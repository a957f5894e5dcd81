//! The node runs of one execution: one slot per node, written once by whichever worker ran
//! the node, then read by the caller as a plain slice once the execution has finished.
//!
//! A per-node `Mutex<Option<NodeRun>>`, copied into a `Vec` at the end, cost a lock per node
//! on the worker, another in the caller and a copy of every record (~200 bytes each): about
//! a quarter of the executor's own time per empty op (`tandem bench overhead`). Here a worker
//! writes its record in place and marks the slot, and the finished execution hands the same
//! memory out as `&[NodeRun]` ([`NodeRuns`]).

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::NodeRun;
use crate::error::{Error, Result};

/// One slot per node; each written at most once.
pub(crate) struct RunSlots {
    cells: Box<[UnsafeCell<MaybeUninit<NodeRun>>]>,
    set: Box<[AtomicBool]>,
}

// SAFETY: a cell is written only by the caller of `put` that flipped its `set` flag from
// false to true (so by one thread, once), and read only through `NodeRuns`, which exists only
// once every flag is set and the execution has finished: the executor's completion (the
// in-flight counter's AcqRel decrement and the done channel) orders every write before it.
unsafe impl Sync for RunSlots {}
// SAFETY: the slots own their `NodeRun`s, which are `Send`.
unsafe impl Send for RunSlots {}

impl RunSlots {
    /// `n` empty slots.
    pub fn new(n: usize) -> Self {
        Self {
            cells: (0..n)
                .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
                .collect(),
            set: (0..n).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Records node `i`'s run. A second record for the same node is an internal error (and
    /// is dropped); an index past the nodes too.
    pub fn put(&self, i: usize, run: NodeRun) -> Result<()> {
        let (Some(cell), Some(flag)) = (self.cells.get(i), self.set.get(i)) else {
            return Err(Error::Internal(format!(
                "node run {i} recorded for an execution of {} nodes",
                self.cells.len()
            )));
        };
        if flag.swap(true, Ordering::AcqRel) {
            return Err(Error::Internal(format!("node {i} ran twice")));
        }
        // SAFETY: this call flipped the flag, so no other writer exists, and no reader reads
        // before the execution finished (see the `Sync` impl).
        unsafe { (*cell.get()).write(run) };
        Ok(())
    }

    /// The first node without a record, if any.
    pub fn missing(&self) -> Option<usize> {
        self.set.iter().position(|f| !f.load(Ordering::Acquire))
    }

    /// The records as a slice, when every node has one.
    fn all(&self) -> Option<&[NodeRun]> {
        if self.missing().is_some() {
            return None;
        }
        // SAFETY: every cell is initialised (all flags set, each after its write, and the
        // writes ordered before this read by the execution's completion); `UnsafeCell` and
        // `MaybeUninit` are `repr(transparent)`, so the cells have `NodeRun`'s layout; no
        // writer remains (a second `put` fails on the flag without touching the cell).
        Some(unsafe {
            std::slice::from_raw_parts(self.cells.as_ptr().cast::<NodeRun>(), self.cells.len())
        })
    }
}

impl Drop for RunSlots {
    fn drop(&mut self) {
        for (cell, flag) in self.cells.iter_mut().zip(self.set.iter()) {
            if flag.load(Ordering::Acquire) {
                // SAFETY: the flag says the cell was written, and it is dropped once, here.
                unsafe { cell.get_mut().assume_init_drop() };
            }
        }
    }
}

/// The node runs of a finished execution, in graph order: a slice of [`NodeRun`].
#[derive(Clone)]
pub struct NodeRuns(Arc<RunSlots>);

impl NodeRuns {
    /// The records of `slots`, or the index of the first node that has none.
    pub(crate) fn complete(slots: Arc<RunSlots>) -> std::result::Result<Self, usize> {
        match slots.missing() {
            Some(i) => Err(i),
            None => Ok(Self(slots)),
        }
    }
}

impl std::ops::Deref for NodeRuns {
    type Target = [NodeRun];

    fn deref(&self) -> &[NodeRun] {
        // Complete by construction; an empty slice is unreachable.
        self.0.all().unwrap_or(&[])
    }
}

impl<'a> IntoIterator for &'a NodeRuns {
    type Item = &'a NodeRun;
    type IntoIter = std::slice::Iter<'a, NodeRun>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl std::fmt::Debug for NodeRuns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::DeviceId;
    use std::time::Duration;

    fn run(name: &str) -> NodeRun {
        NodeRun {
            wall: Duration::from_nanos(name.len() as u64),
            fallback: Some(format!("{name} moved")),
            ..NodeRun::quiet(name.into(), "nop", DeviceId::CPU, Default::default(), None)
        }
    }

    #[test]
    fn runs_written_from_many_threads_read_back_in_node_order() {
        let slots = Arc::new(RunSlots::new(1000));
        std::thread::scope(|s| {
            for t in 0..4 {
                let slots = &slots;
                s.spawn(move || {
                    for i in (t..1000).step_by(4) {
                        slots.put(i, run(&format!("n{i}"))).expect("first record");
                    }
                });
            }
        });
        let runs = NodeRuns::complete(slots).expect("all written");
        assert_eq!(runs.len(), 1000);
        for (i, r) in runs.iter().enumerate() {
            assert_eq!(&*r.node, format!("n{i}"));
            assert_eq!(r.fallback.as_deref(), Some(format!("n{i} moved").as_str()));
        }
    }

    #[test]
    fn a_missing_or_repeated_record_is_reported_and_partial_slots_drop_cleanly() {
        let slots = Arc::new(RunSlots::new(3));
        slots.put(0, run("a")).expect("first");
        assert!(
            slots.put(0, run("again")).is_err(),
            "second record of node 0"
        );
        assert!(slots.put(3, run("past")).is_err(), "index past the nodes");
        slots.put(2, run("c")).expect("first");
        assert_eq!(slots.missing(), Some(1));
        match NodeRuns::complete(slots) {
            Err(i) => assert_eq!(i, 1),
            Ok(r) => panic!("expected node 1 missing, got {r:?}"),
        }
        // Dropping a partly written set frees the written records only (run under Miri or
        // a leak checker to see it; here it must simply not crash).
        let partial = RunSlots::new(2);
        partial.put(1, run("only")).expect("first");
        drop(partial);
    }
}
