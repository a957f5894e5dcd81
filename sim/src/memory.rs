//! Device memory of the simulated card: banks of bytes and an AXI4 slave that serves the
//! kernel's `m_axi_gmem` port with a fixed latency and a bandwidth limit.
//!
//! Two bandwidth limits apply. The *port* delivers at most `bytes_per_cycle` of read data
//! (a token bucket shared by all reads of the port). Each *bank* (HBM pseudo-channel, DDR
//! bank; the bank is the one the address falls in) moves at most `bank_bytes_per_cycle`,
//! reads and writes together: a bank earns that many bytes of credit a cycle (kept up to one
//! beat plus one cycle's worth), a write beat is accepted only when its bank has a beat of
//! credit, and the bank spends the rest fetching the beats of the accepted read bursts that
//! fall in it, oldest burst first, into the interconnect's read buffer (at most
//! `max_outstanding` bursts), from which the port delivers them in order, each
//! `read_latency` cycles after its bank fetched it. A write that waits holds its bank's
//! read fetches until it is taken (writes first, so reads cannot starve them). So two
//! streams in one bank share that bank's bandwidth, and streams in different banks do not:
//! while the port delivers one bank's burst, the next burst's bank fetches in parallel. `bank_bytes_per_cycle = None` (the default, the `ci` profile) leaves the
//! banks unlimited: the port alone sets the pace, as before banks were modelled.
//! [`BankCounters`] count each bank's traffic and the cycles requests waited for it.
//!
//! A kernel with three AXI4 masters (`m_axi_gmem` and the read-only `m_axi_gmem1`,
//! `m_axi_gmem2`) gets a slave per master: each read port has its own read buffer, its own
//! `bytes_per_cycle` and `max_outstanding`, and its own in-order delivery; the banks are
//! shared, and fetch the accepted bursts of all ports oldest first.

use std::collections::VecDeque;

use tandem_fpga::{DeviceBuffer, FpgaError};

use crate::model::{PinsIn, PinsOut};

/// Bank `b` starts at `(b + 1) << BANK_SHIFT` (so no buffer has address 0).
pub const BANK_SHIFT: u32 = 34;

/// Latency and bandwidth of the simulated memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemConfig {
    /// Cycles from an AR handshake to its first R beat.
    pub read_latency: u64,
    /// Cycles from the last W beat to the B response.
    pub write_latency: u64,
    /// Bytes per cycle the memory delivers (a 64-bit beat needs 8); >= 8 means one beat
    /// per cycle.
    pub bytes_per_cycle: f64,
    /// Most AR (and AW) bursts accepted and not yet finished.
    pub max_outstanding: usize,
    /// Capacity of each bank in bytes.
    pub bank_bytes: u64,
    /// Number of banks.
    pub banks: u32,
    /// Bytes per cycle one bank moves, reads and writes together; `None`: unlimited (only
    /// the port's `bytes_per_cycle` applies).
    pub bank_bytes_per_cycle: Option<f64>,
}

impl MemConfig {
    /// The banks of `platform` at `clock_mhz`: their count, size, per-bank bandwidth and
    /// read latency (U55C: 32 banks of 48 bytes a cycle at 300 MHz), with a port that takes
    /// one beat of `beat_bytes` a cycle.
    pub fn for_platform(
        platform: &tandem_fpga::platform::Platform,
        clock_mhz: f64,
        beat_bytes: u64,
    ) -> Self {
        Self {
            read_latency: platform.bank_read_latency_cycles(clock_mhz),
            bytes_per_cycle: beat_bytes as f64,
            bank_bytes: platform.bank_bytes,
            banks: platform.banks,
            bank_bytes_per_cycle: Some(platform.bank_bytes_per_cycle(clock_mhz)),
            ..Self::default()
        }
    }

    /// Bytes per cycle one stream gets when it has its bank to itself: the slower of the
    /// port and the bank (what the cycle models take as the memory's bandwidth).
    pub fn stream_bytes_per_cycle(&self) -> f64 {
        match self.bank_bytes_per_cycle {
            Some(b) => self.bytes_per_cycle.min(b),
            None => self.bytes_per_cycle,
        }
    }
}

/// Traffic of one bank since the card was opened or the counters were reset.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BankCounters {
    /// Bytes read by the kernel (read beats delivered).
    pub bytes_read: u64,
    /// Bytes written by the kernel (write beats accepted).
    pub bytes_written: u64,
    /// Read bursts accepted.
    pub read_bursts: u64,
    /// Write beats accepted.
    pub write_beats: u64,
    /// Cycles a request waited for the bank: the port's next read beat past its latency
    /// but not yet fetched by the bank, or a write beat offered and refused for lack of
    /// the bank's bandwidth.
    pub wait_cycles: u64,
}

/// Bandwidth state of one bank.
#[derive(Debug, Clone, Copy, Default)]
struct BankState {
    /// Bytes the bank may still move this cycle.
    credit: f64,
    counters: BankCounters,
}

impl Default for MemConfig {
    fn default() -> Self {
        Self {
            read_latency: 40,
            write_latency: 20,
            bytes_per_cycle: 8.0,
            max_outstanding: 16,
            bank_bytes: 1 << 30,
            banks: 4,
            bank_bytes_per_cycle: None,
        }
    }
}

#[derive(Debug)]
struct Burst {
    addr: u64,
    beats: u64,
    done: u64,
    ready_at: u64,
    /// Bank of the burst (None: outside memory, faults on access).
    bank: Option<usize>,
    /// Beats its bank has fetched (a read burst).
    fetched: u64,
    /// Order of acceptance over every read port (banks fetch oldest first).
    seq: u64,
    /// The cycle each fetched beat left its bank (limited banks only): a beat reaches the
    /// port `latency` cycles after that.
    fetched_at: Vec<u64>,
}

impl Burst {
    /// Whether the burst's next beat is at the port at `now` (`latency`: the read latency).
    fn next_ready(&self, now: u64, latency: u64) -> bool {
        self.ready_at <= now
            && self.done < self.fetched
            && self
                .fetched_at
                .get(self.done as usize)
                .is_none_or(|&t| t + latency <= now)
    }
}

/// Read ports a kernel may have: `m_axi_gmem` and the read-only `m_axi_gmem1`, `m_axi_gmem2`.
pub const READ_PORTS: usize = 3;

/// One read port's slave state: its accepted bursts in order and its bandwidth credit.
#[derive(Debug, Default)]
struct ReadPort {
    reads: VecDeque<Burst>,
    credit: f64,
}

/// One cycle's read-port pins, whichever master they belong to.
#[derive(Debug, Clone, Copy, Default)]
struct ReadPins {
    arvalid: u64,
    araddr: u64,
    arlen: u64,
    rready: u64,
    arready: u64,
    rvalid: u64,
}

/// Banks and the AXI slave state.
#[derive(Debug)]
pub struct Memory {
    /// Configuration.
    pub cfg: MemConfig,
    banks: Vec<Vec<u8>>,
    /// Bump pointer of each bank (bytes).
    pub tops: Vec<u64>,
    bank_state: Vec<BankState>,
    rports: [ReadPort; READ_PORTS],
    /// Read bursts accepted on each read port since the last [`Memory::reset_bank_counters`].
    port_bursts: [u64; READ_PORTS],
    seq: u64,
    writes: VecDeque<Burst>,
    bresp: VecDeque<u64>,
    /// Bytes of one beat of the kernel's data bus (8 for a 64-bit `m_axi_gmem`, up to 64 for
    /// a 512-bit one): set from the loaded kernel's manifest.
    pub beat_bytes: u64,
    /// Error raised by a bad access from the kernel.
    pub fault: Option<String>,
}

impl Memory {
    /// Empty banks.
    pub fn new(cfg: MemConfig) -> Self {
        Self {
            cfg,
            banks: (0..cfg.banks).map(|_| Vec::new()).collect(),
            tops: vec![0; cfg.banks as usize],
            bank_state: vec![BankState::default(); cfg.banks as usize],
            rports: Default::default(),
            port_bursts: [0; READ_PORTS],
            seq: 0,
            writes: VecDeque::new(),
            bresp: VecDeque::new(),
            beat_bytes: 8,
            fault: None,
        }
    }

    /// Drops in-flight transactions (reset).
    pub fn reset_port(&mut self) {
        for p in &mut self.rports {
            p.reads.clear();
            p.credit = 0.0;
        }
        self.writes.clear();
        self.bresp.clear();
        for b in &mut self.bank_state {
            b.credit = 0.0;
        }
    }

    /// Traffic counters of every bank, bank 0 first.
    pub fn bank_counters(&self) -> Vec<BankCounters> {
        self.bank_state.iter().map(|b| b.counters).collect()
    }

    /// Read bursts accepted on each read port (`m_axi_gmem`, `m_axi_gmem1`, `m_axi_gmem2`).
    pub fn port_read_bursts(&self) -> [u64; READ_PORTS] {
        self.port_bursts
    }

    /// Zeroes the bank counters (and the per-port burst counts).
    pub fn reset_bank_counters(&mut self) {
        self.port_bursts = [0; READ_PORTS];
        for b in &mut self.bank_state {
            b.counters = BankCounters::default();
        }
    }

    /// Whether `bank` can take a write beat now.
    fn bank_free(&self, bank: Option<usize>) -> bool {
        self.cfg.bank_bytes_per_cycle.is_none()
            || bank
                .and_then(|b| self.bank_state.get(b))
                .is_none_or(|b| b.credit >= self.beat_bytes as f64)
    }

    /// The banks fetch the beats of accepted read bursts with the credit they have left,
    /// oldest burst first; `hold`: a bank whose write waits and fetches nothing.
    fn fetch(&mut self, now: u64, hold: Option<usize>) {
        let beat = self.beat_bytes as f64;
        let banks = &mut self.bank_state;
        let mut take = |r: &mut Burst| {
            let Some(st) = r
                .bank
                .filter(|&b| Some(b) != hold)
                .and_then(|b| banks.get_mut(b))
            else {
                return;
            };
            while r.fetched < r.beats && st.credit >= beat {
                st.credit -= beat;
                r.fetched += 1;
                r.fetched_at.push(now);
            }
        };
        let [p0, p1, p2] = &mut self.rports;
        if p1.reads.is_empty() && p2.reads.is_empty() {
            // one busy port (every kernel but the three-master GEMM): its queue is in order
            p0.reads.iter_mut().for_each(take);
            return;
        }
        // each port's queue is in acceptance order (pushed with a rising `seq`, popped from
        // the front): merge the three by `seq`
        let mut queues = [
            p0.reads.iter_mut().peekable(),
            p1.reads.iter_mut().peekable(),
            p2.reads.iter_mut().peekable(),
        ];
        while let Some(q) = queues
            .iter_mut()
            .enumerate()
            .filter_map(|(k, q)| q.peek().map(|r| (r.seq, k)))
            .min()
            .map(|(_, k)| k)
        {
            if let Some(r) = queues[q].next() {
                take(r);
            }
        }
    }

    /// (bank, offset) of a device address.
    pub fn locate(&self, addr: u64) -> Option<(usize, u64)> {
        let b = (addr >> BANK_SHIFT).checked_sub(1)? as usize;
        let off = addr & ((1u64 << BANK_SHIFT) - 1);
        (b < self.banks.len()).then_some((b, off))
    }

    /// Mutable bytes `[addr, addr+len)`, growing the bank's backing store as needed.
    pub fn bytes_mut(&mut self, addr: u64, len: u64) -> Option<&mut [u8]> {
        let (b, off) = self.locate(addr)?;
        let end = off.checked_add(len)?;
        if end > self.cfg.bank_bytes {
            return None;
        }
        let v = &mut self.banks[b];
        if (v.len() as u64) < end {
            v.resize(end as usize, 0);
        }
        Some(&mut v[off as usize..end as usize])
    }

    /// Allocates `bytes` in `bank`, aligned to 4 KiB (a bump allocator per bank).
    pub fn alloc(&mut self, bank: u32, bytes: u64) -> Result<DeviceBuffer, FpgaError> {
        let cap = self.cfg.bank_bytes;
        let banks = self.cfg.banks;
        let top = self
            .tops
            .get_mut(bank as usize)
            .ok_or_else(|| FpgaError::OutOfRange {
                msg: format!("bank {bank} (the card has {banks})"),
            })?;
        let len = bytes.max(1).div_ceil(4096) * 4096;
        if *top + len > cap {
            return Err(FpgaError::OutOfMemory {
                bank,
                bytes,
                free: cap - *top,
            });
        }
        let addr = ((u64::from(bank) + 1) << BANK_SHIFT) + *top;
        *top += len;
        Ok(DeviceBuffer {
            bank,
            addr,
            len: bytes,
        })
    }

    /// Frees a buffer: only the most recent buffer of a bank returns its space.
    pub fn free(&mut self, buf: DeviceBuffer) {
        let len = buf.len.max(1).div_ceil(4096) * 4096;
        if let Some(top) = self.tops.get_mut(buf.bank as usize) {
            let off = buf.addr - ((u64::from(buf.bank) + 1) << BANK_SHIFT);
            if off + len == *top {
                *top = off;
            }
        }
    }

    /// The bytes `[offset, offset + len)` of `buf`, checked against the buffer and the bank.
    pub fn buffer_bytes(
        &mut self,
        buf: &DeviceBuffer,
        offset: u64,
        len: usize,
        what: &str,
    ) -> Result<&mut [u8], FpgaError> {
        if offset
            .checked_add(len as u64)
            .is_none_or(|end| end > buf.len)
        {
            return Err(FpgaError::OutOfRange {
                msg: format!(
                    "{what} of {len} bytes at {offset} in a {}-byte buffer",
                    buf.len
                ),
            });
        }
        self.bytes_mut(buf.addr + offset, len as u64)
            .ok_or_else(|| FpgaError::OutOfRange {
                msg: format!("address {:#x}", buf.addr + offset),
            })
    }

    fn read_word(&mut self, addr: u64) -> u64 {
        match self.bytes_mut(addr, 8) {
            Some(s) => u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]),
            None => {
                self.fault.get_or_insert_with(|| {
                    format!("kernel read outside device memory at {addr:#x}")
                });
                0
            }
        }
    }

    /// One beat of `beat_bytes` at `addr`, 64 bits a word.
    fn read_beat(&mut self, addr: u64) -> [u64; 8] {
        let mut out = [0u64; 8];
        for (i, w) in out
            .iter_mut()
            .enumerate()
            .take((self.beat_bytes / 8) as usize)
        {
            *w = self.read_word(addr + 8 * i as u64);
        }
        out
    }

    fn write_beat(&mut self, addr: u64, data: &[u64; 8], strb: u64) {
        for (i, w) in data.iter().enumerate().take((self.beat_bytes / 8) as usize) {
            self.write_word(addr + 8 * i as u64, *w, strb >> (8 * i) & 0xFF);
        }
    }

    fn write_word(&mut self, addr: u64, data: u64, strb: u64) {
        match self.bytes_mut(addr, 8) {
            Some(s) => {
                for (i, b) in data.to_le_bytes().iter().enumerate() {
                    if strb >> i & 1 == 1 {
                        s[i] = *b;
                    }
                }
            }
            None => {
                self.fault.get_or_insert_with(|| {
                    format!("kernel write outside device memory at {addr:#x}")
                });
            }
        }
    }

    /// Sets the slave's outputs for cycle `now`.
    pub fn drive(&mut self, now: u64, i: &mut PinsIn) {
        let beat = self.beat_bytes as f64;
        i.m_awready = u64::from(self.writes.len() < self.cfg.max_outstanding);
        if let Some(bpc) = self.cfg.bank_bytes_per_cycle {
            for b in &mut self.bank_state {
                b.credit = (b.credit + bpc).min(beat + bpc);
            }
        }
        i.m_wready = u64::from(self.writes.front().is_some_and(|w| self.bank_free(w.bank)));
        for p in 0..READ_PORTS {
            let (arready, rvalid, data, last) = self.drive_read(now, p);
            if p == 0 {
                i.m_arready = arready;
                i.m_rvalid = rvalid;
                i.m_rlast = last;
                i.m_rresp = 0;
                if let Some(d) = data {
                    i.m_rdata_w = d;
                    i.m_rdata = d[0];
                }
            } else {
                i.x_arready[p - 1] = arready;
                i.x_rvalid[p - 1] = rvalid;
                i.x_rlast[p - 1] = last;
                i.x_rresp[p - 1] = 0;
                if let Some(d) = data {
                    i.x_rdata_w[p - 1] = d;
                }
            }
        }
        i.m_bvalid = u64::from(self.bresp.front().is_some_and(|&t| t <= now));
        i.m_bresp = 0;
    }

    /// Read port `p`'s outputs for cycle `now`: arready, rvalid, the beat offered, rlast.
    fn drive_read(&mut self, now: u64, p: usize) -> (u64, u64, Option<[u64; 8]>, u64) {
        let beat = self.beat_bytes as f64;
        let latency = self.cfg.read_latency;
        let port = &mut self.rports[p];
        port.credit = (port.credit + self.cfg.bytes_per_cycle).min(64.0f64.max(beat));
        let arready = u64::from(port.reads.len() < self.cfg.max_outstanding);
        let Some(r) = port.reads.front() else {
            return (arready, 0, None, 0);
        };
        if r.next_ready(now, latency) && port.credit >= beat {
            let (addr, last) = (r.addr + self.beat_bytes * r.done, r.done + 1 == r.beats);
            let d = self.read_beat(addr);
            return (arready, 1, Some(d), u64::from(last));
        }
        if r.ready_at <= now
            && !r.next_ready(now, latency)
            && let Some(st) = r.bank.and_then(|b| self.bank_state.get_mut(b))
        {
            st.counters.wait_cycles += 1;
        }
        (arready, 0, None, 0)
    }

    /// Read port `p`'s handshakes of cycle `now`.
    fn commit_read(&mut self, now: u64, p: usize, pins: ReadPins) {
        if pins.arvalid == 1 && pins.arready == 1 {
            let beats = pins.arlen + 1;
            let bank = self.locate(pins.araddr).map(|(b, _)| b);
            if let Some(st) = bank.and_then(|b| self.bank_state.get_mut(b)) {
                st.counters.read_bursts += 1;
            }
            self.seq += 1;
            self.port_bursts[p] += 1;
            self.rports[p].reads.push_back(Burst {
                addr: pins.araddr,
                beats,
                done: 0,
                ready_at: now + self.cfg.read_latency,
                bank,
                // unlimited banks have the whole burst at once
                fetched: if self.cfg.bank_bytes_per_cycle.is_some() {
                    0
                } else {
                    beats
                },
                seq: self.seq,
                fetched_at: Vec::new(),
            });
        }
        if pins.rvalid == 1 && pins.rready == 1 {
            let beat = self.beat_bytes;
            let port = &mut self.rports[p];
            port.credit -= beat as f64;
            if let Some(r) = port.reads.front_mut() {
                if let Some(st) = r.bank.and_then(|b| self.bank_state.get_mut(b)) {
                    st.counters.bytes_read += beat;
                }
                r.done += 1;
                if r.done == r.beats {
                    port.reads.pop_front();
                }
            }
        }
    }

    /// Applies the handshakes of cycle `now` (inputs `i`, outputs `o`).
    pub fn commit(&mut self, now: u64, i: &PinsIn, o: &PinsOut) {
        if i.ap_rst_n == 0 {
            // The interconnect is held in reset with the kernel: nothing is accepted.
            self.reset_port();
            return;
        }
        // bank bandwidth: a write beat taken this cycle spends its bank's credit first; one
        // refused holds its bank's read fetches
        if self.cfg.bank_bytes_per_cycle.is_some() {
            let wbank = self.writes.front().and_then(|w| w.bank);
            let mut hold = None;
            if o.m_wvalid == 1
                && let Some(st) = wbank.and_then(|b| self.bank_state.get_mut(b))
            {
                if i.m_wready == 1 {
                    st.credit -= self.beat_bytes as f64;
                } else {
                    st.counters.wait_cycles += 1;
                    hold = wbank;
                }
            }
            self.fetch(now, hold);
        }
        for p in 0..READ_PORTS {
            let pins = if p == 0 {
                ReadPins {
                    arvalid: o.m_arvalid,
                    araddr: o.m_araddr,
                    arlen: o.m_arlen,
                    rready: o.m_rready,
                    arready: i.m_arready,
                    rvalid: i.m_rvalid,
                }
            } else {
                ReadPins {
                    arvalid: o.x_arvalid[p - 1],
                    araddr: o.x_araddr[p - 1],
                    arlen: o.x_arlen[p - 1],
                    rready: o.x_rready[p - 1],
                    arready: i.x_arready[p - 1],
                    rvalid: i.x_rvalid[p - 1],
                }
            };
            self.commit_read(now, p, pins);
        }
        if o.m_wvalid == 1 && i.m_wready == 1 {
            let (addr, done, beats, bank) = match self.writes.front() {
                Some(w) => (
                    w.addr + self.beat_bytes * w.done,
                    w.done + 1,
                    w.beats,
                    w.bank,
                ),
                None => return,
            };
            let beat = self.beat_bytes;
            if let Some(st) = bank.and_then(|b| self.bank_state.get_mut(b)) {
                st.counters.bytes_written += beat;
                st.counters.write_beats += 1;
            }
            if self.beat_bytes == 8 {
                self.write_word(addr, o.m_wdata, o.m_wstrb);
            } else {
                self.write_beat(addr, &o.m_wdata_w, o.m_wstrb);
            }
            if (done == beats) != (o.m_wlast == 1) {
                self.fault.get_or_insert_with(|| {
                    format!("wlast on beat {done} of a {beats}-beat burst at {addr:#x}")
                });
            }
            if done == beats {
                self.writes.pop_front();
                self.bresp.push_back(now + self.cfg.write_latency);
            } else if let Some(w) = self.writes.front_mut() {
                w.done = done;
            }
        }
        if o.m_awvalid == 1 && i.m_awready == 1 {
            self.writes.push_back(Burst {
                addr: o.m_awaddr,
                beats: o.m_awlen + 1,
                done: 0,
                ready_at: now,
                bank: self.locate(o.m_awaddr).map(|(b, _)| b),
                fetched: 0,
                seq: 0,
                fetched_at: Vec::new(),
            });
        }
        if i.m_bvalid == 1 && o.m_bready == 1 {
            self.bresp.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn banks_are_disjoint_and_bounded() {
        let mut m = Memory::new(MemConfig {
            banks: 2,
            bank_bytes: 1 << 20,
            ..MemConfig::default()
        });
        assert_eq!(m.locate(1 << BANK_SHIFT), Some((0, 0)));
        assert_eq!(m.locate((2 << BANK_SHIFT) + 8), Some((1, 8)));
        assert_eq!(m.locate(0), None);
        assert_eq!(m.locate(3 << BANK_SHIFT), None);
        m.bytes_mut(1 << BANK_SHIFT, 4).expect("bank 0")[0] = 7;
        assert_eq!(m.bytes_mut(2 << BANK_SHIFT, 4).expect("bank 1")[0], 0);
        assert!(m.bytes_mut((1 << BANK_SHIFT) + (1 << 20) - 4, 8).is_none());
    }

    #[test]
    fn reads_wait_for_the_latency_and_writes_honour_strobes() {
        let mut m = Memory::new(MemConfig {
            read_latency: 3,
            ..MemConfig::default()
        });
        let a = 1u64 << BANK_SHIFT;
        m.bytes_mut(a, 16)
            .expect("mem")
            .copy_from_slice(&(0u8..16).collect::<Vec<_>>());
        let mut i = PinsIn::default();
        let o = PinsOut {
            m_arvalid: 1,
            m_araddr: a,
            m_arlen: 1,
            m_rready: 1,
            ..PinsOut::default()
        };
        m.drive(0, &mut i);
        i.ap_rst_n = 1;
        m.commit(0, &i, &o);
        let idle = PinsOut {
            m_rready: 1,
            ..PinsOut::default()
        };
        let mut beats = Vec::new();
        for now in 1..8 {
            m.drive(now, &mut i);
            if i.m_rvalid == 1 {
                beats.push((now, i.m_rdata, i.m_rlast));
            }
            m.commit(now, &i, &idle);
        }
        assert_eq!(beats.len(), 2);
        assert_eq!(beats[0].0, 3, "first beat after the latency");
        assert_eq!(beats[0].1, u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]));
        assert_eq!(beats[1].2, 1, "rlast on the second beat");
        // a one-beat write of the upper four bytes only
        let w = PinsOut {
            m_awvalid: 1,
            m_awaddr: a,
            m_awlen: 0,
            ..PinsOut::default()
        };
        m.drive(10, &mut i);
        m.commit(10, &i, &w);
        let w = PinsOut {
            m_wvalid: 1,
            m_wdata: u64::MAX,
            m_wstrb: 0xf0,
            m_wlast: 1,
            ..PinsOut::default()
        };
        m.drive(11, &mut i);
        m.commit(11, &i, &w);
        assert_eq!(
            m.bytes_mut(a, 8).expect("mem"),
            &[0, 1, 2, 3, 255, 255, 255, 255]
        );
        assert!(m.fault.is_none());
    }

    /// Cycles at which the read beats of two 4-beat bursts at `a` and `b` (issued on cycles
    /// 0 and 1) arrive, and the bank counters after.
    fn two_bursts(a: u64, b: u64) -> (Vec<u64>, Vec<BankCounters>) {
        let mut m = Memory::new(MemConfig {
            read_latency: 2,
            bytes_per_cycle: 8.0,
            bank_bytes_per_cycle: Some(4.0),
            ..MemConfig::default()
        });
        let mut i = PinsIn {
            ap_rst_n: 1,
            ..PinsIn::default()
        };
        let mut got = Vec::new();
        for now in 0..40 {
            m.drive(now, &mut i);
            let o = PinsOut {
                m_arvalid: u64::from(now < 2),
                m_araddr: if now == 0 { a } else { b },
                m_arlen: 3,
                m_rready: 1,
                ..PinsOut::default()
            };
            if i.m_rvalid == 1 {
                got.push(now);
            }
            m.commit(now, &i, &o);
        }
        (got, m.bank_counters())
    }

    #[test]
    fn streams_in_one_bank_share_its_bandwidth() {
        let (b0, b1) = (1u64 << BANK_SHIFT, 2u64 << BANK_SHIFT);
        // two banks: each bank needs 2 cycles a beat (fetched on cycles 1, 3, .. and 2, 4,
        // .., at the port 2 cycles later), but the second burst's bank worked while the
        // first burst was delivered, so its beats follow back to back
        let (two, c2) = two_bursts(b0, b1 + 64);
        assert_eq!(two, vec![3, 5, 7, 9, 10, 11, 12, 13]);
        // the port waited for bank 0 (cycles 2, 4, 6, 8), never for bank 1
        assert_eq!((c2[0].wait_cycles, c2[1].wait_cycles), (4, 0));
        assert_eq!((c2[0].bytes_read, c2[1].bytes_read), (32, 32));
        // one bank: the second burst is fetched only after the first, at the bank's pace
        let (one, c1) = two_bursts(b0, b0 + 64);
        assert_eq!(one, vec![3, 5, 7, 9, 11, 13, 15, 17]);
        assert_eq!(c1[0].wait_cycles, 8);
        assert_eq!((c1[0].bytes_read, c1[0].read_bursts), (64, 2));
    }

    #[test]
    fn banks_fetch_for_every_port_in_request_order() {
        let mut m = Memory::new(MemConfig {
            bank_bytes_per_cycle: Some(8.0),
            ..MemConfig::default()
        });
        // one-beat bursts accepted in this order (port, bank): the ports' queues interleave
        let order = [(1, 0), (0, 0), (2, 1), (2, 0), (0, 1), (1, 0)];
        for (seq, &(p, bank)) in (1..).zip(&order) {
            m.rports[p].reads.push_back(Burst {
                addr: 0,
                beats: 1,
                done: 0,
                ready_at: 0,
                bank: Some(bank),
                fetched: 0,
                seq,
                fetched_at: Vec::new(),
            });
        }
        let fetched = |m: &Memory| -> Vec<Vec<u64>> {
            m.rports
                .iter()
                .map(|p| p.reads.iter().map(|r| r.fetched).collect())
                .collect()
        };
        // bank 0 has two beats of credit: the two oldest bank-0 bursts (port 1's first, then
        // port 0's) get them; bank 1 is held by a waiting write and fetches nothing
        m.bank_state[0].credit = 16.0;
        m.bank_state[1].credit = 16.0;
        m.fetch(7, Some(1));
        assert_eq!(fetched(&m), vec![vec![1, 0], vec![1, 0], vec![0, 0]]);
        assert_eq!(m.rports[1].reads[0].fetched_at, vec![7]);
        // next cycle: bank 0's next oldest is port 2's, then port 1's second
        m.bank_state[0].credit = 8.0;
        m.fetch(8, None);
        assert_eq!(fetched(&m), vec![vec![1, 1], vec![1, 0], vec![1, 1]]);
        assert_eq!(m.bank_state[1].credit, 0.0);
        m.bank_state[0].credit = 8.0;
        m.fetch(9, None);
        assert_eq!(fetched(&m), vec![vec![1, 1], vec![1, 1], vec![1, 1]]);
        assert_eq!(m.rports[1].reads[1].fetched_at, vec![9]);
    }

    #[test]
    fn writes_wait_for_a_busy_bank() {
        let mut m = Memory::new(MemConfig {
            bank_bytes_per_cycle: Some(4.0),
            ..MemConfig::default()
        });
        let a = 1u64 << BANK_SHIFT;
        let mut i = PinsIn {
            ap_rst_n: 1,
            ..PinsIn::default()
        };
        let aw = PinsOut {
            m_awvalid: 1,
            m_awaddr: a,
            m_awlen: 3,
            ..PinsOut::default()
        };
        m.drive(0, &mut i);
        m.commit(0, &i, &aw);
        let mut accepted = Vec::new();
        for now in 1..12 {
            m.drive(now, &mut i);
            let o = PinsOut {
                m_wvalid: u64::from(accepted.len() < 4),
                m_wdata: now,
                m_wstrb: 0xff,
                m_wlast: u64::from(accepted.len() == 3),
                ..PinsOut::default()
            };
            if i.m_wready == 1 && o.m_wvalid == 1 {
                accepted.push(now);
            }
            m.commit(now, &i, &o);
        }
        // a bank of 4 bytes a cycle takes one 8-byte beat every 2 cycles
        assert_eq!(accepted, vec![1, 3, 5, 7]);
        let c = m.bank_counters()[0];
        assert_eq!((c.bytes_written, c.write_beats, c.wait_cycles), (32, 4, 3));
        assert!(m.fault.is_none());
    }
}
