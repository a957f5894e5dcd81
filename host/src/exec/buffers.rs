//! The tensors of a finished execution, by name ([`Buffers`]): the execution's own buffer
//! list, looked up through the prepared graph's name order, so finishing an execution builds
//! no map (no key copied, no tree allocated). An execution's own tensors (inputs, outputs)
//! are held in one allocation for all of them ([`SlotBuffer::Own`]); only the resident
//! parameters are shared with other executions.

use std::sync::Arc;

use super::names::Names;
use super::prepared::{Prepared, Source};
use crate::memory::Buffer;
use crate::resident::ResidentCache;

/// One tensor of an execution: its own buffer, or a resident parameter's shared one.
#[derive(Debug)]
pub(crate) enum SlotBuffer {
    /// The execution's own (an input or an output), in the execution's one slab.
    Own(Buffer),
    /// A resident parameter's buffer, shared across executions.
    Shared(Arc<Buffer>),
}

impl std::ops::Deref for SlotBuffer {
    type Target = Buffer;

    fn deref(&self) -> &Buffer {
        match self {
            SlotBuffer::Own(b) => b,
            SlotBuffer::Shared(b) => b,
        }
    }
}

/// The buffers of one execution, by slot, with the names they borrow.
pub(crate) struct Slab {
    // Field order matters: `bufs` is dropped before `names`, whose text its own buffers
    // borrow as their names.
    bufs: Box<[SlotBuffer]>,
    names: Arc<Names>,
}

impl Slab {
    /// The buffers of an execution of `prep`: parameters from `resident`, inputs sharing the
    /// graph's host tensors, outputs empty; one allocation for all of them, the names
    /// borrowed from `prep`'s.
    pub fn new(prep: &Prepared, resident: &ResidentCache) -> Self {
        let names = prep.names.clone();
        let bufs = prep
            .slots
            .iter()
            .enumerate()
            .map(|(k, s)| {
                let name = names.name(k as u32);
                match &s.source {
                    Source::Param(t) => SlotBuffer::Shared(resident.buffer(name, t)),
                    // SAFETY (both): `name` is in `names`' text, which the slab holds (the
                    // same `Arc`) and drops after `bufs` (field order); an own buffer never
                    // leaves the slab (no `&mut` to it is handed out, `bufs` is private).
                    Source::Input(t) => SlotBuffer::Own(unsafe {
                        Buffer::shared_with_borrowed_name(name, t.clone())
                    }),
                    Source::Output => SlotBuffer::Own(unsafe {
                        Buffer::with_borrowed_name(name, prep.meta(k as u32).clone())
                    }),
                }
            })
            .collect();
        Self { bufs, names }
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.bufs.len()
    }
}

impl std::ops::Index<usize> for Slab {
    type Output = Buffer;

    fn index(&self, slot: usize) -> &Buffer {
        &self.bufs[slot]
    }
}

impl std::fmt::Debug for Slab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.bufs.iter()).finish()
    }
}

/// Every tensor of an execution, by name, in name order.
#[derive(Debug, Clone)]
pub struct Buffers {
    slab: Arc<Slab>,
}

impl Buffers {
    pub(crate) fn new(slab: Arc<Slab>) -> Self {
        Self { slab }
    }

    fn slot(&self, name: &str) -> Option<u32> {
        let names = &self.slab.names;
        let order = names.order();
        order
            .binary_search_by(|&s| names.name(s).cmp(name))
            .ok()
            .map(|i| order[i])
    }

    /// The buffer of tensor `name`.
    pub fn get(&self, name: &str) -> Option<&Buffer> {
        self.slot(name).map(|s| &self.slab[s as usize])
    }

    /// Whether the execution has a tensor `name`.
    pub fn contains_key(&self, name: &str) -> bool {
        self.slot(name).is_some()
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.slab.len()
    }

    /// Whether there is no tensor.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// (name, buffer) of every tensor, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Buffer)> {
        let names = &self.slab.names;
        names
            .order()
            .iter()
            .map(|&s| (names.name(s), &self.slab[s as usize]))
    }

    /// Every tensor's name, in name order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.iter().map(|(n, _)| n)
    }
}

impl std::ops::Index<&str> for Buffers {
    type Output = Buffer;

    /// The buffer of tensor `name`; panics when there is none (as a map's index does): use
    /// [`Buffers::get`] where the name comes from outside.
    fn index(&self, name: &str) -> &Buffer {
        match self.get(name) {
            Some(b) => b,
            None => panic!("the execution has no tensor named '{name}'"),
        }
    }
}
