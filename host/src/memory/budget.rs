//! What each device holds, against its limit: every replica a [`super::Buffer`] makes on a
//! device is charged here (at the size the device stores it, [`crate::backend::Backend::stored_bytes`])
//! and released when the replica goes. When a charge would pass the device's limit, replicas
//! that the host still holds valid (weights, inputs) and that no launch is using are evicted,
//! least recently used first; the next use fetches them again. The peak and the copies per
//! device are kept for the report.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use serde::Serialize;

use super::Replicas;
use crate::backend::DeviceId;
use crate::error::{Error, Result};
use crate::limits::human_bytes;
use crate::options::MemoryLimits;

/// What one device held and moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DeviceUsage {
    /// Bytes held now.
    pub used: u64,
    /// Most bytes held at once since the last [`DeviceMemory::reset_peaks`].
    pub peak: u64,
    /// Replicas evicted to make room (their data stays valid on the host).
    pub evictions: u64,
    /// Bytes of the replicas evicted.
    pub evicted_bytes: u64,
    /// Logical bytes copied host -> device.
    pub uploaded: u64,
    /// Logical bytes copied device -> host.
    pub downloaded: u64,
    /// Logical bytes copied to this device from another directly.
    pub peer: u64,
}

/// One device's memory use against its limit, for reports.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceMemoryReport {
    /// Device.
    pub device: DeviceId,
    /// Bytes it may hold: the `--memory-limit` entry, else its capacity.
    pub limit_bytes: u64,
    /// Whether the limit was set (`--memory-limit`) rather than the device's capacity.
    pub limit_set: bool,
    /// Use and copies.
    #[serde(flatten)]
    pub usage: DeviceUsage,
}

#[derive(Debug)]
struct LruEntry {
    device: DeviceId,
    /// Identity of the buffer's replica set (its allocation's address; kept alive by `state`).
    id: usize,
    tick: u64,
    state: Weak<Mutex<Replicas>>,
}

#[derive(Debug, Default)]
struct State {
    devices: BTreeMap<DeviceId, DeviceUsage>,
    lru: Vec<LruEntry>,
    tick: u64,
}

/// The memory accounts of every device of a registry.
#[derive(Debug, Default)]
pub struct DeviceMemory {
    limits: Mutex<MemoryLimits>,
    state: Mutex<State>,
}

/// Bytes charged to a device: one replica, or a form a backend derived from one and keeps
/// beside it ([`DeviceMemory::charge_derived`]); released (the bytes given back) when dropped.
#[derive(Debug)]
pub struct Charge {
    mem: Arc<DeviceMemory>,
    device: DeviceId,
    bytes: u64,
    armed: bool,
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.armed {
            let mut s = self.mem.lock();
            let u = s.devices.entry(self.device).or_default();
            u.used = u.used.saturating_sub(self.bytes);
        }
    }
}

/// Which copy a transfer was, for [`DeviceMemory::count_transfer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Host to the device.
    Upload,
    /// The device to host.
    Download,
    /// Another device to this one, directly.
    Peer,
}

impl DeviceMemory {
    /// Accounts with the limits of `limits` (devices without an entry: their capacity).
    pub fn new(limits: MemoryLimits) -> Arc<Self> {
        Arc::new(Self {
            limits: Mutex::new(limits),
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the limits (devices without an entry: their capacity).
    pub fn set_limits(&self, limits: MemoryLimits) {
        *self.limits.lock().unwrap_or_else(|e| e.into_inner()) = limits;
    }

    /// The limits set.
    pub fn limits(&self) -> MemoryLimits {
        self.limits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The bytes `device` may hold: its limit, else `capacity` (0, a capacity the device does
    /// not know: no limit).
    pub fn limit(&self, device: DeviceId, capacity: u64) -> u64 {
        self.limits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .limit_for(device)
            .unwrap_or(if capacity == 0 { u64::MAX } else { capacity })
    }

    /// What `device` holds and moved.
    pub fn usage(&self, device: DeviceId) -> DeviceUsage {
        self.lock()
            .devices
            .get(&device)
            .copied()
            .unwrap_or_default()
    }

    /// Starts the peaks again from what each device holds now.
    pub fn reset_peaks(&self) {
        for u in self.lock().devices.values_mut() {
            u.peak = u.used;
        }
    }

    /// Counts a completed copy of `bytes` (logical) to or from `device`.
    pub fn count_transfer(&self, device: DeviceId, dir: Direction, bytes: u64) {
        let mut s = self.lock();
        let u = s.devices.entry(device).or_default();
        match dir {
            Direction::Upload => u.uploaded += bytes,
            Direction::Download => u.downloaded += bytes,
            Direction::Peer => u.peer += bytes,
        }
    }

    /// Marks the replica of `state` on `device` as just used.
    pub(super) fn touch(&self, device: DeviceId, state: &Arc<Mutex<Replicas>>) {
        let id = Arc::as_ptr(state) as usize;
        let mut s = self.lock();
        s.tick += 1;
        let tick = s.tick;
        match s.lru.iter_mut().find(|e| e.id == id && e.device == device) {
            Some(e) => e.tick = tick,
            None => s.lru.push(LruEntry {
                device,
                id,
                tick,
                state: Arc::downgrade(state),
            }),
        }
    }

    /// Charges `bytes` on `device` for a replica of `state`, evicting least recently used
    /// replicas the host still holds (and no launch uses) while the charge would pass the
    /// limit (`capacity` where none is set). With `must_fit`, a charge that does not fit even
    /// then is an error ([`Error::OutOfMemory`] naming the device, the bytes and the limit);
    /// without it (memory a launch already allocated), it is recorded over the limit.
    pub(super) fn charge(
        self: &Arc<Self>,
        device: DeviceId,
        capacity: u64,
        bytes: u64,
        state: &Arc<Mutex<Replicas>>,
        must_fit: bool,
    ) -> Result<Charge> {
        let c = self.reserve(device, capacity, bytes, must_fit, "")?;
        self.touch(device, state);
        Ok(c)
    }

    /// Charges `bytes` on `device` for a form a backend derived from a replica and keeps
    /// beside it (the FP8 experts' e4m3 weights), `what` naming it for the error: replicas are
    /// evicted as for [`DeviceMemory::charge`], and a charge that does not fit even then is an
    /// [`Error::OutOfMemory`]. The form is not evicted by itself; it goes with its replica.
    pub fn charge_derived(
        self: &Arc<Self>,
        device: DeviceId,
        capacity: u64,
        bytes: u64,
        what: &str,
    ) -> Result<Charge> {
        self.reserve(device, capacity, bytes, true, what)
    }

    /// The accounting of [`DeviceMemory::charge`], without marking a replica used; `what`
    /// (where not empty) names what the bytes are for in the error.
    fn reserve(
        self: &Arc<Self>,
        device: DeviceId,
        capacity: u64,
        bytes: u64,
        must_fit: bool,
        what: &str,
    ) -> Result<Charge> {
        let limit = self.limit(device, capacity);
        let mut evicted = Vec::new();
        let result = {
            let mut s = self.lock();
            let used = s.devices.get(&device).map_or(0, |u| u.used);
            if used.saturating_add(bytes) > limit {
                Self::evict_locked(
                    &mut s,
                    device,
                    used.saturating_add(bytes) - limit,
                    &mut evicted,
                );
            }
            let u = s.devices.entry(device).or_default();
            if must_fit && u.used.saturating_add(bytes) > limit {
                Err(Error::out_of_memory(
                    format!(
                        "{device}{}{} (limit {}, {} held that cannot be evicted)",
                        if what.is_empty() { "" } else { ", for " },
                        what,
                        human_bytes(limit),
                        human_bytes(u.used)
                    ),
                    bytes,
                    Some(limit.saturating_sub(u.used)),
                ))
            } else {
                u.used += bytes;
                u.peak = u.peak.max(u.used);
                Ok(())
            }
        };
        // The evicted replicas' storage is freed here, outside the accounts' lock.
        drop(evicted);
        result?;
        Ok(Charge {
            mem: self.clone(),
            device,
            bytes,
            armed: true,
        })
    }

    /// Evicts replicas on `device`, least recently used first, until `need` bytes were
    /// given back or none is left that may go: the replica must be on a device other than the
    /// host, the host must hold the data valid, nothing else may hold the storage (a launch in
    /// flight), and the buffer must not be locked (being migrated or written right now).
    fn evict_locked(s: &mut State, device: DeviceId, need: u64, out: &mut Vec<super::Replica>) {
        if device == DeviceId::CPU {
            return;
        }
        s.lru.retain(|e| e.state.strong_count() > 0);
        let mut order: Vec<usize> = (0..s.lru.len())
            .filter(|&i| s.lru[i].device == device)
            .collect();
        order.sort_by_key(|&i| s.lru[i].tick);
        let mut freed = 0u64;
        let mut gone = Vec::new();
        for i in order {
            if freed >= need {
                break;
            }
            let Some(state) = s.lru[i].state.upgrade() else {
                gone.push(i);
                continue;
            };
            let Ok(mut r) = state.try_lock() else {
                continue;
            };
            let evictable = r.valid.contains(&DeviceId::CPU)
                && r.by_device
                    .get(&device)
                    .is_some_and(|x| x.storage.holders() == 1);
            if !evictable {
                if !r.by_device.contains_key(&device) {
                    gone.push(i);
                }
                continue;
            }
            r.valid.retain(|d| *d != device);
            if let Some(mut rep) = r.by_device.remove(&device) {
                if let Some(c) = rep.charge.as_mut() {
                    // Given back here, under the lock we hold.
                    c.armed = false;
                    freed += c.bytes;
                    let u = s.devices.entry(device).or_default();
                    u.used = u.used.saturating_sub(c.bytes);
                    u.evictions += 1;
                    u.evicted_bytes += c.bytes;
                }
                tracing::debug!(%device, "evicted a replica to make room");
                out.push(rep);
            }
            gone.push(i);
        }
        gone.sort_unstable();
        gone.dedup();
        for i in gone.into_iter().rev() {
            s.lru.swap_remove(i);
        }
    }
}
