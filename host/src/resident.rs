//! Resident parameters: the buffers of a graph's weights, kept with their device replicas from
//! one execution to the next, so each weight is uploaded to a device once.
//!
//! An entry is keyed by the parameter's name and the identity of its host data (the address of
//! the `Arc` allocation in [`crate::graph::Graph::constants`]). The entry holds a `Weak` to that
//! allocation, so the address cannot be reused by other data while the entry exists, and safe
//! code cannot change the data in place behind it (`Arc::get_mut` refuses while a `Weak` exists,
//! `Arc::make_mut` moves the data to a new allocation): changed weights are new entries, never
//! served stale. Device replicas stay valid because no node writes a parameter
//! ([`crate::graph::Graph::validate`] refuses an output named like a constant).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::backend::DeviceId;
use crate::memory::Buffer;
use crate::tensor::Tensor;

#[derive(Debug)]
struct Entry {
    /// The host data the buffer was made from; dead once the graph dropped or replaced it.
    host: Weak<Tensor>,
    buffer: Arc<Buffer>,
}

/// The resident parameter buffers of an [`crate::exec::Executor`].
#[derive(Debug, Default)]
pub struct ResidentCache {
    entries: Mutex<BTreeMap<(String, usize), Entry>>,
}

impl ResidentCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<(String, usize), Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The buffer of parameter `name` holding `host`: the cached one (with the replicas made
    /// by earlier executions) if it was made from this very host data, else a new buffer with
    /// only a host replica, which is cached.
    pub fn buffer(&self, name: &str, host: &Arc<Tensor>) -> Arc<Buffer> {
        let key = (name.to_string(), Arc::as_ptr(host) as usize);
        let mut entries = self.lock();
        if let Some(e) = entries.get(&key) {
            // The entry's Weak keeps the allocation, so an equal address is the same data.
            return e.buffer.clone();
        }
        let buffer = Arc::new(Buffer::from_host(name, (**host).clone()));
        entries.insert(
            key,
            Entry {
                host: Arc::downgrade(host),
                buffer: buffer.clone(),
            },
        );
        buffer
    }

    /// Drops the entries whose host data no longer exists (a graph dropped or replaced the
    /// weight); returns how many. Their device memory is freed once no execution holds them.
    pub fn prune(&self) -> usize {
        let mut entries = self.lock();
        let before = entries.len();
        entries.retain(|_, e| e.host.strong_count() > 0);
        before - entries.len()
    }

    /// Drops every replica on `device` (after the device was lost or timed out, so that no
    /// replica made before the failure is used again; failures that leave the device's memory
    /// intact, such as a kernel that did not compile, keep them); returns how many. The next
    /// use uploads again.
    pub fn forget_device(&self, device: DeviceId) -> usize {
        self.lock()
            .values()
            .filter(|e| e.buffer.drop_replica(device))
            .count()
    }

    /// Drops every entry.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Number of cached parameter buffers.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Logical bytes of the parameter replicas held on devices other than the host (the same
    /// measure as [`crate::memory::TransferStats`]; a device may store fewer, e.g. bf16).
    pub fn device_bytes(&self) -> u64 {
        self.lock()
            .values()
            .map(|e| {
                let on = e
                    .buffer
                    .valid_on()
                    .iter()
                    .filter(|d| **d != DeviceId::CPU)
                    .count();
                on as u64 * e.buffer.meta().bytes() as u64
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;

    fn t(v: f32) -> Arc<Tensor> {
        Arc::new(Tensor::from_vec_f32(&[2], vec![v, v]).expect("shape"))
    }

    #[test]
    fn same_data_same_buffer_changed_data_new_buffer() {
        let c = ResidentCache::new();
        let a = t(1.0);
        let b1 = c.buffer("w", &a);
        assert!(Arc::ptr_eq(&b1, &c.buffer("w", &a)));
        // A clone of the Arc is the same data.
        assert!(Arc::ptr_eq(&b1, &c.buffer("w", &a.clone())));
        // Another name is another buffer.
        assert!(!Arc::ptr_eq(&b1, &c.buffer("v", &a)));
        // Equal values in another allocation are another buffer.
        assert!(!Arc::ptr_eq(&b1, &c.buffer("w", &t(1.0))));
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn make_mut_gives_new_identity_and_dead_entries_are_pruned() {
        let c = ResidentCache::new();
        let mut a = t(1.0);
        let b1 = c.buffer("w", &a);
        // The only strong reference: make_mut moves the data away from the cached Weak.
        *Arc::make_mut(&mut a) = Tensor::from_vec_f32(&[2], vec![5.0, 6.0]).expect("shape");
        let b2 = c.buffer("w", &a);
        assert!(!Arc::ptr_eq(&b1, &b2));
        assert_eq!(c.len(), 2);
        assert_eq!(c.prune(), 1);
        drop(a);
        assert_eq!(c.prune(), 1);
        assert!(c.is_empty());
    }
}
