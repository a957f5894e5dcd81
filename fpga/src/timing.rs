//! Analytic cycle models of the kernels: how many clock cycles a run of a build takes, from
//! the pipeline structure in docs/FPGA.md (fill and drain, tile loops, one element or key
//! per cycle) and the memory's latency and bandwidth. They stand in for the RTL where running
//! it cycle by cycle is too slow (the modelled card, the planner's estimates at any size);
//! `sim/tests/cycle_model.rs` checks them against the RTL's simulated cycles (within 5%).

use crate::kernels::attention::AttentionCore;
use crate::kernels::gemm::GemmCore;
use crate::kernels::router::RouterCore;

/// Memory timing the models take into account (the simulated card's `MemConfig`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemTiming {
    /// Cycles from a read request to its first data.
    pub read_latency: u64,
    /// Cycles from the last written word to the write response.
    pub write_latency: u64,
    /// Bytes per cycle the memory delivers to one port.
    pub bytes_per_cycle: f64,
    /// Bytes per cycle of the one bank the kernel's buffers share, reads and writes
    /// together (the simulated card's `bank_bytes_per_cycle`; the driver puts a launch's
    /// buffers in one bank); `None`: banks unlimited, writes take no read bandwidth.
    pub bank_bytes_per_cycle: Option<f64>,
}

impl Default for MemTiming {
    fn default() -> Self {
        Self {
            read_latency: 40,
            write_latency: 20,
            bytes_per_cycle: 8.0,
            bank_bytes_per_cycle: None,
        }
    }
}

impl MemTiming {
    /// Cycles to stream `words` 64-bit words through the port (one per cycle at most).
    fn stream(&self, words: u64) -> u64 {
        self.stream_beats(words, 8)
    }

    /// Cycles to stream `beats` beats of `beat_bytes` bytes through the port (one per cycle
    /// at most).
    fn stream_beats(&self, beats: u64, beat_bytes: u64) -> u64 {
        let per_beat = (beat_bytes as f64 / self.bytes_per_cycle.max(1e-3)).max(1.0);
        (beats as f64 * per_beat).ceil() as u64
    }

    /// Cycles the shared bank needs to move `beats` beats of `beat_bytes` (reads and writes
    /// together); 0 when banks are unlimited.
    fn bank_beats(&self, beats: u64, beat_bytes: u64) -> u64 {
        match self.bank_bytes_per_cycle {
            Some(b) => (beats as f64 * beat_bytes as f64 / b.max(1e-3)).ceil() as u64,
            None => 0,
        }
    }

    /// Cycles a compute loop of `cycles` takes when it reads `words` along the way: the
    /// slower of the two.
    fn bound(&self, cycles: u64, words: u64) -> u64 {
        cycles.max(self.stream(words))
    }
}

/// Cycles of a run whose arguments the kernel refuses (it finishes at once).
pub const REFUSED_RUN_CYCLES: u64 = 8;

/// Fixed cost of a run as the host sees it: the ap_start write, the first read's latency,
/// the last write's response and the ap_done poll.
fn overhead(m: &MemTiming) -> u64 {
    m.read_latency + m.write_latency
}

/// The router with `L = c.lanes` lanes, renormalising over the k chosen: see
/// [`router_cycles_with`].
pub fn router_cycles(c: &RouterCore, tokens: u64, experts: u64, k: u64, m: &MemTiming) -> u64 {
    router_cycles_with(c, tokens, experts, k, true, m)
}

/// The router with `L = c.lanes` lanes: one token per `max(ceil(E/L), merge, ceil(k/2) + 1)`
/// cycles (the row streamed `L` logits per cycle, no faster than the port delivers its words
/// of `data_bits / 16` logits; the lanes' lists merged one entry per cycle,
/// `k` cycles with more than one lane; the normalise stage's two slots per cycle and its
/// hand-off), the words of the logits no faster than the memory delivers them, then the fill
/// and drain of the pipeline (merge, 5 softmax stages, 8 divider stages, normalise) but no
/// sooner than the histogram's clear (`E` cycles), the histogram write-out (`E` cycles) and
/// the memory latencies. With `renormalize = false` the
/// last row's all-expert sum (`ceil(E/L)` + 4 stages after its hand-off) may hold the last
/// token back; the matrix merge of 8 or more lanes hands the lists over one cycle later.
/// Fitted to the simulated builds (e_max 256, k_max 8, lanes 1 / 2 / 4 on 64 bits, 8 on
/// 128).
pub fn router_cycles_with(
    c: &RouterCore,
    tokens: u64,
    experts: u64,
    k: u64,
    renormalize: bool,
    m: &MemTiming,
) -> u64 {
    let lanes = u64::from(c.lanes).max(1);
    let groups = experts.div_ceil(lanes);
    let merge = if lanes > 1 { k } else { 1 };
    let norm = k.div_ceil(2) + 1;
    let per_token = groups.max(merge).max(norm);
    // the logits' words, `data_bits / 16` logits each, no faster than the port moves them
    let per_word = u64::from(c.logits_per_word()).max(1);
    let words = tokens * experts.div_ceil(per_word);
    let beat = u64::from(c.data_bits / 8).max(8);
    let stream = (tokens * per_token).max(m.stream_beats(words, beat));
    // the matrix merge (8 or more lanes) takes the lists a cycle after the row's last group
    let hand = u64::from(c.matrix_merge());
    // the last token: its merge, the softmax pipeline and the divider, its words out
    let fill = if tokens == 0 {
        0
    } else {
        let wait = if renormalize {
            0
        } else {
            (groups + 8).saturating_sub(merge + 6)
        };
        hand + merge + 14 + k.div_ceil(2) + wait
    };
    // the histogram is cleared (E cycles) before the first increment lands
    let body = (m.read_latency + stream + fill).max(experts);
    body + experts + ROUTER_FIXED + m.write_latency
}

/// Cycles of a router run beyond its tokens, histogram and latencies (start, clear, the
/// write-out's hand-shakes), fitted.
const ROUTER_FIXED: u64 = 12;

/// The GEMM (output-stationary, `rows x L` lanes, `L = c.lanes` int8 per beat of `L` bytes,
/// one k per cycle): the parameters (`Np` 8-byte words, `Np 8 / L` beats) once; per M tile
/// of `r` rows, its x rows (`r Kp / L` beats), then each of the `Np / L` column tiles streams
/// `Kp` beats, but no faster than the read-out of the previous tile (`14 + L/2 + 3 r`
/// cycles: the flag's walk to the last PE past `L/2` PEs of lane pairs, then add, multiply,
/// round/shift, saturate, one beat per row); the last read-out drains at the end
/// (`19 + L/2 + 3 r`).
/// Fitted to the simulated rows-8 builds (8 and 64 lanes).
pub fn gemm_cycles(c: &GemmCore, m: u64, np: u64, kp: u64, mem: &MemTiming) -> u64 {
    let rows = u64::from(c.rows).max(1);
    let l = u64::from(c.lanes).max(8);
    let nt = np / l;
    let mut total = mem.stream_beats(np * 8 / l, l);
    let mut left = m;
    let mut last = 0;
    while left > 0 {
        let r = left.min(rows);
        let readout = 14 + l / 2 + 3 * r;
        // a tile's W stream shares the bank with the previous tile's y rows (a beat each;
        // the launch's first tile has none before it)
        let tile = |writes: u64| {
            mem.stream_beats(kp, l)
                .max(readout)
                .max(mem.bank_beats(kp + writes, l))
        };
        let first = if left == m { tile(0) } else { tile(r) };
        total += mem.stream_beats(r * kp / l, l) + first + (nt - 1) * tile(r);
        last = r;
        left -= r;
    }
    total + 19 + l / 2 + 3 * last + overhead(mem)
}

/// [`gemm_cycles`] for a pass of a K split (`mode`: [`crate::kernels::gemm::MODE_ACC_IN`],
/// [`crate::kernels::gemm::MODE_PART_OUT`]): ACC_IN reads each tile's int32 partials (4 words
/// per row, one request per row) before its W stream; PART_OUT writes them back (4 words per
/// row) instead of one y word, which makes the read-out longer.
pub fn gemm_cycles_mode(c: &GemmCore, m: u64, np: u64, kp: u64, mode: u32, mem: &MemTiming) -> u64 {
    use crate::kernels::gemm::{MODE_ACC_IN, MODE_PART_OUT};
    let (acc_in, part_out) = (mode & MODE_ACC_IN != 0, mode & MODE_PART_OUT != 0);
    if !acc_in && !part_out {
        return gemm_cycles(c, m, np, kp, mem);
    }
    let rows = u64::from(c.rows).max(1);
    let l = u64::from(c.lanes).max(8);
    let nt = np / l;
    let per_row = if part_out { GEMM_PART_ROW } else { 3 };
    let mut total = mem.stream_beats(np * 8 / l, l);
    let mut left = m;
    let mut last = 0;
    while left > 0 {
        let r = left.min(rows);
        let readout = 14 + l / 2 + per_row * r;
        // ACC_IN: a tile's partials are read before its W stream, and only once the
        // read-out of the tile two back (same buffer half) is over, so the partial read
        // does not overlap the read-out: per tile `pin + max(Kp, read-out)`.
        // the W stream shares the bank with the previous tile's writes: a y beat per row,
        // or the row's int32 partials (4 beats) on a PART_OUT pass
        let writes = if part_out { 4 * r } else { r };
        let per_tile = |writes: u64| {
            let stream = mem
                .stream_beats(kp, l)
                .max(readout)
                .max(mem.bank_beats(kp + writes, l));
            if acc_in {
                mem.stream_beats(4 * r, l) + GEMM_PART_IN_FIXED + stream
            } else {
                stream
            }
        };
        let first = if left == m {
            per_tile(0)
        } else {
            per_tile(writes)
        };
        total += mem.stream_beats(r * kp / l, l) + first + (nt - 1) * per_tile(writes);
        last = r;
        left -= r;
    }
    total + 19 + l / 2 + per_row * last + overhead(mem)
}

/// [`gemm_cycles_mode`] when the W stream has a bank of `bank_bytes_per_cycle` to itself
/// and `port` (unlimited banks) is the port: the W bank fetches ahead through the x reads,
/// read-outs and drains (as far as the outstanding bursts reach), so the launch takes the
/// longer of the port-bound time and the W bank's time for every W beat plus what cannot
/// overlap it (the last drain and the fixed overhead; the parameters and x rows, in other
/// banks, are fetched alongside).
pub fn gemm_cycles_w_own_bank(
    c: &GemmCore,
    m: u64,
    np: u64,
    kp: u64,
    mode: u32,
    port: &MemTiming,
    bank_bytes_per_cycle: f64,
) -> u64 {
    use crate::kernels::gemm::MODE_PART_OUT;
    let port = MemTiming {
        bank_bytes_per_cycle: None,
        ..*port
    };
    let base = gemm_cycles_mode(c, m, np, kp, mode, &port);
    let rows = u64::from(c.rows).max(1);
    let l = u64::from(c.lanes).max(8);
    let w_beats = m.div_ceil(rows) * (np / l) * kp;
    let w_time = (w_beats as f64 * l as f64 / bank_bytes_per_cycle.max(1e-3)).ceil() as u64;
    let last = if m.is_multiple_of(rows) {
        rows.min(m)
    } else {
        m % rows
    };
    let per_row = if mode & MODE_PART_OUT != 0 {
        GEMM_PART_ROW
    } else {
        3
    };
    // The parameters and the first tile's x rows come through the port before the first W
    // beat; the W bank fetches ahead meanwhile, but only at its own rate: the part of that
    // lead it cannot cover (the port/bank rate ratio minus one) delays the stream.
    let lead_beats = np * 8 / l + rows.min(m) * kp / l;
    let slower = (port.bytes_per_cycle / bank_bytes_per_cycle.max(1e-3) - 1.0).max(0.0);
    let lead = (lead_beats as f64 * slower).round() as u64;
    let fixed = 19 + l / 2 + per_row * last + overhead(&port) + lead;
    base.max(w_time + fixed)
}

/// Cycles per row of a PART_OUT read-out (request + 4 data beats + the handshakes).
const GEMM_PART_ROW: u64 = 5;
/// Cycles an ACC_IN partial read adds per column tile beyond its words.
const GEMM_PART_IN_FIXED: u64 = 2;

/// Where a GEMM launch's packed W stream lies ([`crate::drive::stream_bank`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WPlacement {
    /// In the bank of every other buffer (a card of one bank, or banks without a bandwidth
    /// limit): the launch's [`MemTiming`] as is.
    Shared,
    /// In a bank of its own ([`gemm_cycles_w_own_bank`]): the port's bytes per cycle and the
    /// W bank's.
    OwnBank {
        /// Bytes per cycle of the kernel's port.
        port_bytes_per_cycle: f64,
        /// Bytes per cycle of the W stream's bank.
        bank_bytes_per_cycle: f64,
    },
}

impl WPlacement {
    /// Cycles of one GEMM launch with W placed so.
    pub fn gemm_cycles(
        self,
        c: &GemmCore,
        (m, np, kp): (u64, u64, u64),
        mode: u32,
        mem: &MemTiming,
    ) -> u64 {
        match self {
            WPlacement::Shared => gemm_cycles_mode(c, m, np, kp, mode, mem),
            WPlacement::OwnBank {
                port_bytes_per_cycle,
                bank_bytes_per_cycle,
            } => {
                let port = MemTiming {
                    bytes_per_cycle: port_bytes_per_cycle,
                    ..*mem
                };
                gemm_cycles_w_own_bank(c, m, np, kp, mode, &port, bank_bytes_per_cycle)
            }
        }
    }
}

/// A K-split GEMM as [`crate::drive::run_gemm_split`] runs it: one launch per (N chunk of at
/// most `n_max`, K pass of at most `k_max`); the sum of their cycles.
pub fn gemm_split_cycles(c: &GemmCore, m: u64, n: u64, k: u64, mem: &MemTiming) -> u64 {
    gemm_split_cycles_placed(c, m, n, k, mem, WPlacement::Shared)
}

/// [`gemm_split_cycles`] with W placed as `w` says.
pub fn gemm_split_cycles_placed(
    c: &GemmCore,
    m: u64,
    n: u64,
    k: u64,
    mem: &MemTiming,
    w: WPlacement,
) -> u64 {
    use crate::kernels::gemm::{MODE_ACC_IN, MODE_PART_OUT};
    let pad = |v: usize| c.pad(v);
    let (n_max, k_max) = (u64::from(c.n_max).max(8), u64::from(c.k_max).max(8));
    if n <= n_max && k <= k_max {
        let dims = (m, pad(n as usize) as u64, pad(k as usize) as u64);
        return w.gemm_cycles(c, dims, 0, mem);
    }
    let passes = crate::golden::gemm::k_passes(k as usize, k_max as usize);
    let mut total = 0;
    let mut n0 = 0;
    while n0 < n {
        let nc = pad((n - n0).min(n_max) as usize) as u64;
        for (i, r) in passes.iter().enumerate() {
            let mode = if i == 0 { 0 } else { MODE_ACC_IN }
                | if i + 1 == passes.len() {
                    0
                } else {
                    MODE_PART_OUT
                };
            total += w.gemm_cycles(c, (m, nc, pad(r.len()) as u64), mode, mem);
        }
        n0 += n_max;
    }
    total
}

/// Cycles the attention cores' score pipeline gained when its adder tree (bank sums, then the
/// sum over banks) and its logit round (then the tile maximum) were split into two register
/// stages each for a 300 MHz clock: a run's first logit reaches the FIFO, and its last one
/// the softmax stage, that much later (2026-11-27; the fill and drain constants before were
/// fitted without them).
const ATT_SCORE_SPLIT: u64 = 2;

/// (query, key) pairs a head sees: all, or the bottom-right causal ones.
pub fn visible_pairs(causal: bool, nq: u64, nkv: u64) -> u64 {
    if !causal {
        return nq * nkv;
    }
    // Row i sees min(nkv, max(0, i + 1 + nkv - nq)) keys: a ramp, then full rows.
    (0..nq).map(|i| visible(causal, i, nq, nkv)).sum()
}

fn visible(causal: bool, i: u64, nq: u64, nkv: u64) -> u64 {
    if causal {
        (i + 1 + nkv).saturating_sub(nq).min(nkv)
    } else {
        nkv
    }
}

/// One launch of `heads` query heads of a GQA group over one K/V range whose sequence has
/// `kv_skip` more keys after it (the driver's K/V split): K and V loaded once, then the rows
/// of every head as in [`attention_cycles`] (a causal row sees `min(Nkv, i + 1 + Nkv +
/// kv_skip - Nq)` keys).
#[allow(clippy::too_many_arguments)]
pub fn attention_group_cycles(
    c: &AttentionCore,
    nq: u64,
    nkv: u64,
    dp: u64,
    causal: bool,
    heads: u64,
    kv_skip: u64,
    m: &MemTiming,
) -> u64 {
    if c.q_rows > 1 {
        return attention_rows_cycles(c, nq, nkv, dp, causal, heads, kv_skip, m);
    }
    let load = m.stream(2 * nkv * dp / 8);
    let fin = 28 + dp / 4;
    let rows_total = nq * heads.max(1);
    let row = |i: u64| -> u64 {
        let ih = i % nq.max(1);
        let vis = if causal {
            (ih + 1 + nkv + kv_skip).saturating_sub(nq).min(nkv)
        } else {
            nkv
        };
        vis.max(1)
    };
    let rows: u64 = if rows_total == 0 {
        0
    } else if !causal {
        nkv.max(1) + (rows_total - 1) * nkv.max(fin)
    } else {
        row(0) + (1..rows_total).map(|i| row(i).max(fin)).sum::<u64>()
    };
    load + m.bound(rows, rows_total * dp / 8)
        + fin
        + 12
        + ATT_SCORE_SPLIT
        + nkv.min(14)
        + dp / 16
        + overhead(m)
}

/// The query-parallel core (`q_rows = R > 1`, [`crate::kernels::attention`]'s `rows`): the
/// launch's `heads x Nq` rows go in groups of R, one key slot per cycle for the group up to
/// the group's largest key count (at least one slot). The R rows share one finaliser
/// (`26 + dp / 4` cycles a row), so a group after the first takes at least `R` finaliser
/// times; the last group's R rows drain at the end.
#[allow(clippy::too_many_arguments)]
pub fn attention_rows_cycles(
    c: &AttentionCore,
    nq: u64,
    nkv: u64,
    dp: u64,
    causal: bool,
    heads: u64,
    kv_skip: u64,
    m: &MemTiming,
) -> u64 {
    let r = u64::from(c.q_rows.max(1));
    let load = m.stream(2 * nkv * dp / 8);
    let fin = 26 + dp / 4;
    let nq1 = nq.max(1);
    let rows_total = nq * heads.max(1);
    let keys = |i: u64| -> u64 {
        let ih = i % nq1;
        if causal {
            (ih + 1 + nkv + kv_skip).saturating_sub(nq).min(nkv)
        } else {
            nkv
        }
    };
    // Event walk over the groups, times relative to the first slot's pop: row `r` of a group
    // pops its last key at the group's start + its last slot (+ stalls), unless its hold is
    // still full (the finaliser has not started its previous row): then the whole group
    // waits (the rows pop in lockstep). A hold is full 3 cycles after the pop; the finaliser,
    // when idle, starts the lowest full row and frees its hold 2 cycles later.
    let groups = rows_total.div_ceil(r);
    let mut t = 0u64;
    let mut fin_free = 0u64;
    let mut free = vec![0u64; r as usize];
    // full holds: (time full, row)
    let mut pending: Vec<(u64, usize)> = Vec::with_capacity(r as usize);
    let step = |pending: &mut Vec<(u64, usize)>, fin_free: &mut u64, free: &mut [u64]| {
        let first = pending.iter().map(|p| p.0).min().unwrap_or(0);
        let at = (*fin_free).max(first);
        let (k, _) = pending
            .iter()
            .enumerate()
            .filter(|(_, p)| p.0 <= at)
            .min_by_key(|(_, p)| p.1)
            .unwrap_or((0, &(0, 0)));
        let (_, row) = pending.swap_remove(k);
        free[row] = at + 2;
        *fin_free = at + fin;
    };
    let mut order: Vec<(u64, usize)> = Vec::with_capacity(r as usize);
    for g in 0..groups {
        let (a, b) = (g * r, ((g + 1) * r).min(rows_total));
        order.clear();
        order.extend((a..b).map(|i| (keys(i).max(1) - 1, (i - a) as usize)));
        order.sort_unstable();
        let span = order.iter().map(|&(s, _)| s + 1).max().unwrap_or(1);
        let mut shift = 0u64;
        // rows whose last key is the same slot pop together: all their holds must be free
        let mut k = 0;
        while k < order.len() {
            let slot = order[k].0;
            let same = order[k..].iter().take_while(|o| o.0 == slot).count();
            let rows = &order[k..k + same];
            let mut pop = t + slot + shift;
            while !pending.is_empty() {
                let first = pending.iter().map(|p| p.0).min().unwrap_or(0);
                let at = fin_free.max(first);
                let blocks = pending.iter().any(|p| rows.iter().any(|o| o.1 == p.1));
                if blocks || at < pop + 3 {
                    step(&mut pending, &mut fin_free, &mut free);
                } else {
                    break;
                }
            }
            let need = rows.iter().map(|o| free[o.1]).max().unwrap_or(0);
            if pop < need {
                shift += need - pop;
                pop = need;
            }
            pending.extend(rows.iter().map(|o| (pop + 3, o.1)));
            k += same;
        }
        t += span + shift;
    }
    while !pending.is_empty() {
        step(&mut pending, &mut fin_free, &mut free);
    }
    let run = fin_free.max(t);
    load + m.bound(run, rows_total * dp / 8)
        + 10
        + ATT_SCORE_SPLIT
        + nkv.min(14)
        + dp / 16
        + overhead(m)
}

/// An attention op's heads as [`crate::drive::run_attention_split`] runs them: `groups`
/// launches of `heads` query heads each per K/V range of at most `nkv_max` keys.
#[allow(clippy::too_many_arguments)]
pub fn attention_split_cycles(
    c: &AttentionCore,
    nq: u64,
    nkv: u64,
    dp: u64,
    causal: bool,
    groups: u64,
    heads: u64,
    m: &MemTiming,
) -> u64 {
    let chunk = u64::from(c.nkv_max).max(1);
    let mut total = 0;
    let mut j0 = 0;
    while j0 < nkv {
        let len = chunk.min(nkv - j0);
        total += attention_group_cycles(c, nq, len, dp, causal, heads, nkv - j0 - len, m);
        j0 += len;
    }
    groups * total
}

/// Streaming attention, one head: K and V loaded whole (`2 Nkv dp / 8` words), then one
/// cycle per visible (query, key) pair; a row after the first takes at least the finaliser's
/// time for the previous row (`28 + dp / 4` cycles: the dividers), a row without keys one
/// slot; the last row's finaliser and the pipeline (one tile behind) drain at the end.
/// Fitted to the simulated d_max 64, kv_tile 16 build.
pub fn attention_cycles(
    c: &AttentionCore,
    nq: u64,
    nkv: u64,
    dp: u64,
    causal: bool,
    m: &MemTiming,
) -> u64 {
    if c.q_rows > 1 {
        return attention_rows_cycles(c, nq, nkv, dp, causal, 1, 0, m);
    }
    let load = m.stream(2 * nkv * dp / 8);
    let fin = 28 + dp / 4;
    let rows: u64 = if nq == 0 {
        0
    } else if !causal {
        nkv.max(1) + (nq - 1) * nkv.max(fin)
    } else {
        let row = |i: u64| visible(true, i, nq, nkv).max(1);
        // Rows are a ramp: count those below the finaliser's floor in closed form where
        // the ramp is long.
        row(0) + (1..nq).map(|i| row(i).max(fin)).sum::<u64>()
    };
    load + m.bound(rows, nq * dp / 8)
        + fin
        + 12
        + ATT_SCORE_SPLIT
        + nkv.min(14)
        + dp / 16
        + overhead(m)
}

/// Cycles from a vecops row's last b word to the end of its compute pipeline (9 stages and the
/// bank write).
pub const VECOPS_B_DRAIN: u64 = 10;
/// Cycles from an RMSNorm row's last `a` word to its sum of squares (3 stages and the add).
pub const VECOPS_S_DRAIN: u64 = 4;
/// Cycles a vecops write-out pipeline (5 stages) adds to each written row.
pub const VECOPS_OUT_FILL: u64 = 5;

/// The vecops kernel (one 64-bit word of 4 elements per cycle, rows one after another): the
/// weight row once (RMSNorm), then per row its `a` words, its `b` (or cos/sin) words, the
/// drain of the compute pipeline (add, RMSNorm + residual, silu_mul: [`VECOPS_B_DRAIN`]
/// cycles; the sum of squares of RMSNorm: [`VECOPS_S_DRAIN`]; RoPE 1; combine none), the norm
/// steps (RMSNorm: 4 cycles), the `y` request and words behind the write-out pipeline's
/// [`VECOPS_OUT_FILL`] cycles of fill, and (RMSNorm + residual) the `s` request and words. The read latency is paid once (the requests run ahead of the data); each
/// write request costs a cycle per AXI burst the shell splits it into (bursts of the default
/// shell's 64 beats, never crossing a 512-byte boundary; buffers start 4 KiB aligned).
/// Fitted to the simulated n_max 1024 build.
pub fn vecops_cycles(
    _c: &crate::kernels::vecops::VecopsCore,
    args: &crate::golden::vecops::VecArgs,
    m: &MemTiming,
) -> u64 {
    use crate::golden::vecops::{
        OP_COMBINE, OP_RMSNORM, OP_RMSNORM_RES, OP_ROPE, OP_SILU_MUL8, words, words8,
    };
    const BURST_BYTES: u64 = 64 * 8;
    let n8 = words8(args.n) as u64;
    // words written per row; int8 rows (silu_mul8) are half as many words
    let nw = if args.op == OP_SILU_MUL8 {
        n8
    } else {
        words(args.n) as u64
    };
    let rows = args.rows as u64;
    let norm = matches!(args.op, OP_RMSNORM | OP_RMSNORM_RES);
    let reads = if args.op == OP_COMBINE {
        u64::from(args.c0) * n8
    } else if args.reads_b() || args.op == OP_ROPE {
        2 * nw
    } else {
        nw
    };
    let requests = if args.writes_s() { 2 } else { 1 };
    let row_bytes = nw * 8;
    // bursts of all rows: the 512-byte blocks each row's bytes touch (a row's start modulo
    // 512 repeats every 64 rows, since rows are whole 8-byte words)
    let blocks = |r0: u64, r1: u64| -> u64 {
        (r0..r1)
            .map(|r| {
                let start = r * row_bytes;
                (start + row_bytes - 1) / BURST_BYTES - start / BURST_BYTES + 1
            })
            .sum()
    };
    let bursts = (rows / 64) * blocks(0, 64) + blocks(0, rows % 64);
    let drain = match args.op {
        OP_RMSNORM => VECOPS_S_DRAIN,
        OP_ROPE => 1,
        OP_COMBINE => 0,
        _ => VECOPS_B_DRAIN,
    };
    let per_row =
        m.stream(reads) + requests * (nw + 1 + VECOPS_OUT_FILL) + drain + if norm { 4 } else { 0 };
    let w = if norm {
        m.stream(nw)
    } else if args.op == OP_COMBINE {
        // the table, then the first gather's request waits for it: a second read latency
        m.stream(args.table_len() as u64) + m.read_latency + 1
    } else {
        0
    };
    w + rows * per_row + requests * bursts + 4 + overhead(m)
}
