//! `Buffer`: one logical tensor with a replica per device and the set of valid replicas.
//!
//! `acquire(device, access)` hands back the replica on a device, migrating the data there first
//! when the device's replica is stale: a direct peer copy where the backend offers one, else
//! staged through host memory (a valid host replica is uploaded from where it lies, never
//! copied first). Writing makes the written replica the only valid one.
//!
//! Every replica made on a device through a registry is charged to the registry's
//! [`DeviceMemory`] (`budget`): a device at its limit evicts, least recently used first, the
//! replicas the host still holds valid, which the next use fetches again.

mod budget;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

pub use budget::{Charge, DeviceMemory, DeviceMemoryReport, DeviceUsage, Direction};

use crate::backend::{DeviceId, DeviceRegistry, DeviceStorage};
use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorMeta};

/// How a replica is about to be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read only: the replica must hold current data.
    Read,
    /// Overwritten whole: no need to migrate; afterwards the only valid replica.
    Write,
    /// Read then written: migrated, then the only valid replica.
    ReadWrite,
}

/// One device's copy of the data, and what it is charged to.
#[derive(Debug)]
struct Replica {
    storage: DeviceStorage,
    charge: Option<budget::Charge>,
}

impl Replica {
    fn uncharged(storage: DeviceStorage) -> Self {
        Self {
            storage,
            charge: None,
        }
    }
}

#[derive(Debug, Default)]
struct Replicas {
    by_device: BTreeMap<DeviceId, Replica>,
    valid: Vec<DeviceId>,
}

/// Statistics of the copies a buffer made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Bytes moved host -> device.
    pub uploaded: u64,
    /// Bytes moved device -> host.
    pub downloaded: u64,
    /// Bytes moved device -> device directly.
    pub peer: u64,
}

/// A buffer's name: its own, or borrowed from the execution that holds the buffer (one
/// string for all of an execution's tensors instead of an allocation per tensor).
enum BufferName {
    Own(Arc<str>),
    /// Points into a string that outlives the buffer (see [`Buffer::with_borrowed_name`]).
    Borrowed(std::ptr::NonNull<str>),
}

// SAFETY: a borrowed name points to immutable string data that outlives the buffer (the
// contract of `Buffer::with_borrowed_name`); reading it from any thread is sound.
unsafe impl Send for BufferName {}
// SAFETY: as for `Send`: the data is never written while the buffer exists.
unsafe impl Sync for BufferName {}

impl BufferName {
    fn as_str(&self) -> &str {
        match self {
            BufferName::Own(s) => s,
            // SAFETY: the pointed-to string outlives the buffer that holds this name (the
            // contract of `Buffer::with_borrowed_name`), and `&self` borrows that buffer.
            BufferName::Borrowed(p) => unsafe { p.as_ref() },
        }
    }
}

impl std::fmt::Display for BufferName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for BufferName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

/// One logical tensor, replicated across devices.
#[derive(Debug)]
pub struct Buffer {
    name: BufferName,
    meta: TensorMeta,
    /// The replicas, made at the first use: a tensor nothing writes or reads (an empty op's
    /// token) costs no allocation. Shared with the device accounts (`budget`), which hold it
    /// weakly to evict replicas.
    state: OnceLock<Arc<Mutex<Replicas>>>,
    stats: Mutex<TransferStats>,
}

impl Buffer {
    /// A buffer holding `tensor` on the host.
    pub fn from_host(name: impl Into<Arc<str>>, tensor: Tensor) -> Self {
        let meta = tensor.meta();
        let b = Self::empty(name, meta.clone());
        {
            let mut s = b.lock();
            s.by_device.insert(
                DeviceId::CPU,
                Replica::uncharged(DeviceStorage::new(DeviceId::CPU, meta, tensor)),
            );
            s.valid = vec![DeviceId::CPU];
        }
        b
    }

    /// A buffer holding a shared host tensor (a graph's input), without copying it.
    pub fn from_shared(name: impl Into<Arc<str>>, tensor: Arc<Tensor>) -> Self {
        let meta = tensor.meta();
        let b = Self::empty(name, meta.clone());
        b.hold_shared(meta, tensor);
        b
    }

    fn hold_shared(&self, meta: TensorMeta, tensor: Arc<Tensor>) {
        let mut s = self.lock();
        s.by_device.insert(
            DeviceId::CPU,
            Replica::uncharged(DeviceStorage::shared(DeviceId::CPU, meta, tensor)),
        );
        s.valid = vec![DeviceId::CPU];
    }

    /// A buffer with no data yet (an op's output before it runs).
    pub fn empty(name: impl Into<Arc<str>>, meta: TensorMeta) -> Self {
        Self::named(BufferName::Own(name.into()), meta)
    }

    /// [`Buffer::empty`] under a name it does not own (no allocation, no reference count).
    ///
    /// # Safety
    /// `name` must stay valid and unchanged for as long as the buffer exists: the caller keeps
    /// the string alive beside the buffer and drops it after the buffer (the executor's slab
    /// of an execution's tensors does, holding both).
    pub(crate) unsafe fn with_borrowed_name(name: &str, meta: TensorMeta) -> Self {
        Self::named(BufferName::Borrowed(std::ptr::NonNull::from(name)), meta)
    }

    /// [`Buffer::with_borrowed_name`] holding a shared host tensor ([`Buffer::from_shared`]).
    ///
    /// # Safety
    /// As for [`Buffer::with_borrowed_name`].
    pub(crate) unsafe fn shared_with_borrowed_name(name: &str, tensor: Arc<Tensor>) -> Self {
        let meta = tensor.meta();
        // SAFETY: the caller's guarantee is passed on.
        let b = unsafe { Self::with_borrowed_name(name, meta.clone()) };
        b.hold_shared(meta, tensor);
        b
    }

    fn named(name: BufferName, meta: TensorMeta) -> Self {
        Self {
            name,
            meta,
            state: OnceLock::new(),
            stats: Mutex::new(TransferStats::default()),
        }
    }

    fn state(&self) -> &Arc<Mutex<Replicas>> {
        self.state.get_or_init(Default::default)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Replicas> {
        self.state().lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// Logical shape and dtype.
    pub fn meta(&self) -> &TensorMeta {
        &self.meta
    }

    /// Devices holding current data.
    pub fn valid_on(&self) -> Vec<DeviceId> {
        if self.state.get().is_none() {
            return Vec::new();
        }
        self.lock().valid.clone()
    }

    /// Copies made so far.
    pub fn stats(&self) -> TransferStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `storage` as the replica on its device, now the only valid one (not charged to
    /// any device's memory; see [`Buffer::set_written_in`]).
    pub fn set_written(&self, storage: DeviceStorage) -> Result<()> {
        self.check_meta(&storage)?;
        let mut s = self.lock();
        let dev = storage.device;
        s.by_device.insert(dev, Replica::uncharged(storage));
        s.valid = vec![dev];
        Ok(())
    }

    /// [`Buffer::set_written`], charging the replica to its device in `reg`'s
    /// [`DeviceMemory`] (an output a launch already allocated: replicas the host holds are
    /// evicted to make room, and past that it is counted over the limit, never refused).
    pub fn set_written_in(&self, reg: &DeviceRegistry, storage: DeviceStorage) -> Result<()> {
        self.check_meta(&storage)?;
        let dev = storage.device;
        let charge = self.charge(reg, &storage, false)?;
        let mut s = self.lock();
        s.by_device.insert(dev, Replica { storage, charge });
        s.valid = vec![dev];
        Ok(())
    }

    fn check_meta(&self, storage: &DeviceStorage) -> Result<()> {
        if storage.meta != self.meta {
            return Err(Error::Internal(format!(
                "buffer {}: written {} where {} was declared",
                self.name, storage.meta, self.meta
            )));
        }
        Ok(())
    }

    /// The charge of a replica `storage` in `reg`'s accounts (none for the host's replicas of
    /// constants, which exist before the run).
    fn charge(
        &self,
        reg: &DeviceRegistry,
        storage: &DeviceStorage,
        must_fit: bool,
    ) -> Result<Option<budget::Charge>> {
        let dev = storage.device;
        let Some(b) = reg.get(dev) else {
            return Ok(None);
        };
        let bytes = b.stored_bytes(&storage.meta);
        reg.memory()
            .charge(dev, b.info().memory_bytes, bytes, self.state(), must_fit)
            .map(Some)
    }

    /// The replica on `device`, migrated there if needed (for `Read`/`ReadWrite`).
    /// After `ReadWrite`, the replica on `device` is the only valid one. `Write` access
    /// returns `None` when no replica exists yet: the op's output then becomes the replica
    /// through [`Buffer::set_written`].
    pub fn acquire(
        &self,
        reg: &DeviceRegistry,
        device: DeviceId,
        access: Access,
    ) -> Result<Option<DeviceStorage>> {
        self.acquire_counted(reg, device, access).map(|(s, _)| s)
    }

    /// [`Buffer::acquire`], also returning the copies this call made (and only this call:
    /// other threads acquiring the same buffer at the same time are not counted in it).
    pub fn acquire_counted(
        &self,
        reg: &DeviceRegistry,
        device: DeviceId,
        access: Access,
    ) -> Result<(Option<DeviceStorage>, TransferStats)> {
        let mut moved = TransferStats::default();
        let mut s = self.lock();
        if access == Access::Write {
            s.valid = vec![device];
            return Ok((s.by_device.get(&device).map(|r| r.storage.clone()), moved));
        }
        if s.valid.is_empty() {
            return Err(Error::Internal(format!(
                "buffer {} is read before anything wrote it",
                self.name
            )));
        }
        if s.valid.contains(&device) {
            if device != DeviceId::CPU {
                reg.memory().touch(device, self.state());
            }
        } else {
            // A stale replica goes first (its memory is given back before the new one is
            // charged).
            s.by_device.remove(&device);
            let storage = self.migrate(reg, &s, device, &mut moved);
            {
                // Copies that completed are counted even when a later step failed.
                let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
                stats.uploaded += moved.uploaded;
                stats.downloaded += moved.downloaded;
                stats.peer += moved.peer;
            }
            let storage = storage?;
            // Charged under this buffer's lock: the eviction it may cause skips this buffer.
            // A device refuses a copy past its limit; the host counts it (it holds the data).
            let charge = self.charge(reg, &storage, device != DeviceId::CPU)?;
            s.by_device.insert(device, Replica { storage, charge });
            s.valid.push(device);
        }
        if access == Access::ReadWrite {
            s.valid = vec![device];
        }
        Ok((s.by_device.get(&device).map(|r| r.storage.clone()), moved))
    }

    /// Forgets the replica on `device` (after the device failed, or to free its memory), unless
    /// it is the only valid one. Returns whether a replica was dropped. The device memory is
    /// freed once no launch in flight holds the storage any more.
    pub fn drop_replica(&self, device: DeviceId) -> bool {
        let mut s = self.lock();
        if s.valid.iter().all(|d| *d == device) {
            return false;
        }
        s.valid.retain(|d| *d != device);
        let gone = s.by_device.remove(&device);
        drop(s);
        gone.is_some()
    }

    /// The current data as a host tensor (downloading if no host replica is valid), copied
    /// out of the host replica; [`Buffer::to_host_shared`] shares it instead.
    pub fn to_host(&self, reg: &DeviceRegistry) -> Result<Tensor> {
        Ok(self.to_host_shared(reg)?.as_ref().clone())
    }

    /// The current data as the host replica itself (downloading if no host replica is
    /// valid): no copy, and a download may land in reused registered memory.
    pub fn to_host_shared(&self, reg: &DeviceRegistry) -> Result<Arc<Tensor>> {
        let st = self
            .acquire(reg, DeviceId::CPU, Access::Read)?
            .ok_or_else(|| Error::Internal(format!("buffer {} has no host replica", self.name)))?;
        st.host_shared("CPU")
    }

    /// Makes a replica on `to` from a valid one; `moved` counts each copy once it completed.
    fn migrate(
        &self,
        reg: &DeviceRegistry,
        s: &Replicas,
        to: DeviceId,
        moved: &mut TransferStats,
    ) -> Result<DeviceStorage> {
        let backend = |id: DeviceId| {
            reg.get(id)
                .ok_or_else(|| Error::Internal(format!("device {id} is not in the registry")))
        };
        let dst = backend(to)?;
        let bytes = self.meta.bytes() as u64;
        let mem = reg.memory();
        // Direct peer copy between devices of one kind, where the backend offers it.
        for v in &s.valid {
            if v.kind == to.kind && *v != to {
                if let Some(src) = s.by_device.get(v) {
                    if let Some(out) = dst.copy_peer(&src.storage)? {
                        moved.peer += bytes;
                        mem.count_transfer(to, Direction::Peer, bytes);
                        return Ok(out);
                    }
                }
            }
        }
        // Otherwise stage through the host: a valid host replica as it lies (no copy of it
        // first), or one downloaded from the device holding the data.
        let host_replica = s
            .by_device
            .get(&DeviceId::CPU)
            .filter(|_| s.valid.contains(&DeviceId::CPU));
        let downloaded: DeviceStorage;
        let host: &Tensor = match host_replica {
            Some(h) => h.storage.host_tensor("CPU")?,
            None => {
                let from = s.valid[0];
                let src = s
                    .by_device
                    .get(&from)
                    .ok_or_else(|| Error::Internal(format!("no replica on {from}")))?;
                downloaded = backend(from)?.download_storage(&src.storage)?;
                moved.downloaded += bytes;
                mem.count_transfer(from, Direction::Download, bytes);
                if to == DeviceId::CPU {
                    // The downloaded tensor is the host replica.
                    return Ok(downloaded);
                }
                downloaded.host_tensor("CPU")?
            }
        };
        if to == DeviceId::CPU {
            return reg.cpu().upload(host);
        }
        let out = match host_replica {
            Some(h) => dst.upload_storage(&h.storage)?,
            None => dst.upload(host)?,
        };
        moved.uploaded += bytes;
        mem.count_transfer(to, Direction::Upload, bytes);
        Ok(out)
    }
}
