//! The tensors of a finished execution, by name ([`Buffers`]): the execution's own buffer
//! list, looked up through the prepared graph's name order, so finishing an execution builds
//! no map (no key copied, no tree allocated).

use std::sync::Arc;

use super::prepared::SlotNames;
use crate::memory::Buffer;

/// Every tensor of an execution, by name, in name order.
#[derive(Debug, Clone)]
pub struct Buffers {
    names: Arc<SlotNames>,
    /// By slot.
    bufs: Arc<[Arc<Buffer>]>,
}

impl Buffers {
    pub(crate) fn new(names: Arc<SlotNames>, bufs: Arc<[Arc<Buffer>]>) -> Self {
        Self { names, bufs }
    }

    fn slot(&self, name: &str) -> Option<u32> {
        let order = self.names.order();
        order
            .binary_search_by(|&s| (*self.names.names[s as usize]).cmp(name))
            .ok()
            .map(|i| order[i])
    }

    /// The buffer of tensor `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Buffer>> {
        self.slot(name).map(|s| &self.bufs[s as usize])
    }

    /// Whether the execution has a tensor `name`.
    pub fn contains_key(&self, name: &str) -> bool {
        self.slot(name).is_some()
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.bufs.len()
    }

    /// Whether there is no tensor.
    pub fn is_empty(&self) -> bool {
        self.bufs.is_empty()
    }

    /// (name, buffer) of every tensor, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<Buffer>)> {
        self.names
            .order()
            .iter()
            .map(|&s| (&*self.names.names[s as usize], &self.bufs[s as usize]))
    }

    /// Every tensor's name, in name order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.iter().map(|(n, _)| n)
    }
}

impl std::ops::Index<&str> for Buffers {
    type Output = Arc<Buffer>;

    /// The buffer of tensor `name`; panics when there is none (as a map's index does): use
    /// [`Buffers::get`] where the name comes from outside.
    fn index(&self, name: &str) -> &Arc<Buffer> {
        match self.get(name) {
            Some(b) => b,
            None => panic!("the execution has no tensor named '{name}'"),
        }
    }
}
