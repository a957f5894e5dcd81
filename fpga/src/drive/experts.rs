//! The MoE experts on one card as a sequence of launches whose intermediates stay in card
//! memory (semantics: [`crate::golden::experts`]). The card switches between its GEMM and
//! vecops kernels (`FpgaDevice::load_core`; the simulated cards keep their memory across
//! loads, a board needs an xclbin with both kernels); the host writes each expert's token rows
//! and weights and reads only the combined output.
//!
//! Per expert (the GEMM loaded): for each chunk `c` of F (at most the builds' `n_max` /
//! `k_max`), the gate and up GEMMs of the expert's rows into `G_c`, `U_c`; (vecops) `A_c =
//! silu_mul8(G_c, U_c)`; (GEMM) the down GEMM with one K pass per chunk reading `A_c` (int32
//! partials in card memory), its int8 rows written into the expert's rows of `Y`. Consecutive
//! experts share a GEMM load (the down GEMM of one and the gate/up of the next). Last (vecops):
//! `combine` over `Y` by the table, a launch per `n_max / 4 / k` tokens, into the int16 output.

use std::time::{Duration, Instant};

use super::{Scratch, WBufs, bad, bytes_of, read, u32_of, with_scratch, words};
use crate::core::KernelCore;
use crate::device::{DeviceBuffer, FpgaDevice, FpgaError, RunStats};
use crate::golden::experts::{Expert8, Experts8};
use crate::golden::gemm::k_slice;
use crate::golden::vecops::{LANES, VecArgs, words as words16};
use crate::kernels::gemm::{
    GemmCore, MODE_ACC_IN, MODE_PART_OUT, pack_params_lanes, pack_w_lanes, pad_lanes, pad_x_lanes,
};
use crate::kernels::vecops::VecopsCore;
use crate::shell::ShellConfig;
use crate::timing::{self, MemTiming, WPlacement};

const KERNEL: &str = "experts";

/// Counters of an experts run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExpertsStats {
    /// Kernel cycles of all launches.
    pub cycles: u64,
    /// GEMM launches.
    pub gemm_launches: u64,
    /// vecops launches.
    pub vecops_launches: u64,
    /// Kernel loads (switches between the GEMM and vecops kernels).
    pub loads: u64,
    /// Wall time of the launches.
    pub wall: Duration,
}

impl ExpertsStats {
    fn add(&mut self, st: &RunStats, gemm: bool) {
        self.cycles += st.cycles;
        self.wall += st.wall;
        if gemm {
            self.gemm_launches += 1;
        } else {
            self.vecops_launches += 1;
        }
    }
}

/// The GEMM build's lanes (its layouts pad N and K to multiples of them; at least 8, the
/// vecops rows' padding, which divides every build's lanes).
fn lanes(gemm: &GemmCore) -> usize {
    (gemm.lanes as usize).max(8)
}

/// The F chunks: column chunks of the gate/up GEMMs, silu launches and K passes of the down
/// GEMM, at most `min(gemm n_max, gemm k_max, vecops n_max)` (a multiple of the GEMM's
/// lanes) each.
pub fn f_chunks(gemm: &GemmCore, vecops: &VecopsCore, f: usize) -> Vec<std::ops::Range<usize>> {
    let l = lanes(gemm);
    let c = (gemm.n_max.min(gemm.k_max).min(vecops.n_max) as usize / l * l).max(l);
    (0..f).step_by(c).map(|s| s..(s + c).min(f)).collect()
}

/// Tokens per combine launch: the table bank holds `n_max / 4` entries.
pub fn combine_tokens(vecops: &VecopsCore, k: usize) -> usize {
    (vecops.n_max as usize / LANES / k.max(1)).max(1)
}

/// Whether the builds take experts of hidden size `h` and `k` slots per token (F is chunked).
///
/// Every card buffer's rows are padded to the GEMM's lanes (`pad_lanes`): the gate/up
/// outputs and the silu chunks to `pad_lanes(chunk)` columns, `Y` to `pad_lanes(H)`. The
/// padding columns hold zero weights, bias and requantisation, so they add nothing: the
/// vecops kernel (rows of 8-byte words) reads the same layouts whatever the GEMM's width.
pub fn fits(gemm: &GemmCore, vecops: &VecopsCore, h: usize, k: usize) -> Result<(), String> {
    let l = lanes(gemm);
    if !gemm.lanes.is_multiple_of(8) {
        return Err(format!(
            "the experts sequence needs a GEMM of a multiple of 8 lanes (the vecops rows' \
             words); this build has {}",
            gemm.lanes
        ));
    }
    let lim = gemm.n_max.min(gemm.k_max).min(vecops.n_max) as usize;
    if pad_lanes(h, l) > lim {
        return Err(format!(
            "hidden size {h} ({} padded to the GEMM's {l} lanes) exceeds the GEMM / vecops \
             builds' rows (at most {lim})",
            pad_lanes(h, l)
        ));
    }
    if k > vecops.n_max as usize / LANES {
        return Err(format!(
            "{k} experts per token exceed the combine table ({} entries)",
            vecops.n_max / 4
        ));
    }
    Ok(())
}

/// `buf` from byte `off` on (a pointer into a buffer the scratch owns).
fn view(buf: &DeviceBuffer, off: usize) -> DeviceBuffer {
    DeviceBuffer {
        bank: buf.bank,
        addr: buf.addr + off as u64,
        len: buf.len.saturating_sub(off as u64),
    }
}

struct Card<'a> {
    gemm: &'a GemmCore,
    vecops: &'a VecopsCore,
    shell: ShellConfig,
    gemm_loaded: Option<bool>,
    stats: ExpertsStats,
    /// When the whole sequence must be done (each launch waits at most until then).
    end: Instant,
}

impl Card<'_> {
    fn left(&self) -> Duration {
        self.end.saturating_duration_since(Instant::now())
    }

    fn load(&mut self, dev: &mut dyn FpgaDevice, gemm: bool) -> Result<(), FpgaError> {
        if self.gemm_loaded != Some(gemm) {
            let core: &dyn KernelCore = if gemm { self.gemm } else { self.vecops };
            dev.load_core(core, self.shell)?;
            self.gemm_loaded = Some(gemm);
            self.stats.loads += 1;
        }
        Ok(())
    }

    /// One GEMM launch on card buffers: `x` [m, k], the packed `w`, `params`, into `y` (`n`
    /// and `k` already padded to the build's lanes).
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &mut self,
        dev: &mut dyn FpgaDevice,
        w: &WBufs,
        bufs: [&DeviceBuffer; 4],
        m: usize,
        n: usize,
        k: usize,
        mode: u32,
    ) -> Result<(), FpgaError> {
        let [x, p, y, part] = bufs;
        let scalars = [
            ("m", u32_of(KERNEL, "m", m)?),
            ("n", u32_of(KERNEL, "n", n)?),
            ("k", u32_of(KERNEL, "k", k)?),
            ("relu", 0),
            ("mode", mode),
        ];
        let pointers = [("x", x), ("params", p), ("y", y), ("part", part)];
        let st = super::launch_gemm(dev, w, &pointers, &scalars, self.left())?;
        self.stats.add(&st, true);
        Ok(())
    }

    /// Gate/up GEMMs of one expert (chunk by chunk), then silu; the act chunks stay in `s`.
    fn act(
        &mut self,
        dev: &mut dyn FpgaDevice,
        s: &mut Scratch,
        p: &Experts8,
        e: &Expert8,
        chunks: &[std::ops::Range<usize>],
    ) -> Result<Vec<DeviceBuffer>, FpgaError> {
        let (h, m, l) = (p.h, e.rows, lanes(self.gemm));
        self.load(dev, true)?;
        let bx = s.upload(dev, &bytes_of(&pad_x_lanes(&e.x, m, h, l)))?;
        let mut gu = Vec::with_capacity(chunks.len());
        for r in chunks {
            let (nc, ncl) = (r.len(), pad_lanes(r.len(), l));
            let mut pair = [bx; 2];
            for (slot, lin) in pair.iter_mut().zip([&e.gate, &e.up]) {
                let by = s.alloc(dev, m * ncl)?;
                let w = pack_w_lanes(&lin.w[r.start * h..r.end * h], nc, h, l);
                let bw = s.upload_w(dev, &w)?;
                let bp = s.upload(
                    dev,
                    &words(&pack_params_lanes(
                        &lin.bias[r.clone()],
                        &lin.rq[r.clone()],
                        l,
                    )),
                )?;
                self.gemm(dev, &bw, [&bx, &bp, &by, &by], m, ncl, pad_lanes(h, l), 0)?;
                s.free_last(dev, 1 + bw.buffers())?;
                *slot = by;
            }
            gu.push(pair);
        }
        self.load(dev, false)?;
        let mut acts = Vec::with_capacity(chunks.len());
        for (r, [g, u]) in chunks.iter().zip(&gu) {
            // the padding columns too (zeros in, whatever silu makes of them out: the down
            // GEMM's padded K columns have zero weights)
            let ncl = pad_lanes(r.len(), l);
            let ba = s.alloc(dev, m * ncl)?;
            let args = Experts8::silu_args(e, ncl);
            let st = super::vecops::launch_silu_mul8(dev, &args, g, u, &ba, self.left())?;
            self.stats.add(&st, false);
            acts.push(ba);
        }
        Ok(acts)
    }

    /// The down GEMM of one expert: a K pass per chunk over the act chunks, into `y`.
    #[allow(clippy::too_many_arguments)]
    fn down(
        &mut self,
        dev: &mut dyn FpgaDevice,
        s: &mut Scratch,
        p: &Experts8,
        e: &Expert8,
        chunks: &[std::ops::Range<usize>],
        acts: &[DeviceBuffer],
        y: &DeviceBuffer,
    ) -> Result<(), FpgaError> {
        let (h, f, m, l) = (p.h, p.f, e.rows, lanes(self.gemm));
        let hl = pad_lanes(h, l);
        self.load(dev, true)?;
        let bp = s.upload(dev, &words(&pack_params_lanes(&e.down.bias, &e.down.rq, l)))?;
        let part = s.alloc(dev, m * hl * 4)?;
        for (i, (r, a)) in chunks.iter().zip(acts).enumerate() {
            let (first, last) = (i == 0, i + 1 == chunks.len());
            let mode = if first { 0 } else { MODE_ACC_IN } | if last { 0 } else { MODE_PART_OUT };
            let ws = k_slice(&e.down.w, f, r.clone());
            let bw = s.upload_w(dev, &pack_w_lanes(&ws, h, r.len(), l))?;
            let kl = pad_lanes(r.len(), l);
            self.gemm(dev, &bw, [a, &bp, y, &part], m, hl, kl, mode)?;
            s.free_last(dev, bw.buffers())?;
        }
        Ok(())
    }
}

/// Runs the experts op `p` on `dev` with the builds `gemm` and `vecops` (loaded in turn in
/// `shell`); returns the int16 output `[T, 4 words(H)]` (padded rows, as
/// [`crate::golden::experts::experts`]) and the counters. All launches together wait at most
/// `timeout`. The card is left with the vecops kernel loaded (none is loaded when there are no
/// tokens).
pub fn run_experts(
    dev: &mut dyn FpgaDevice,
    gemm: &GemmCore,
    vecops: &VecopsCore,
    shell: ShellConfig,
    p: &Experts8,
    timeout: Duration,
) -> Result<(Vec<i16>, ExpertsStats), FpgaError> {
    p.check().map_err(|e| bad(KERNEL, e.to_string()))?;
    fits(gemm, vecops, p.h, p.k).map_err(|e| bad(KERNEL, e))?;
    let mut card = Card {
        gemm,
        vecops,
        shell,
        gemm_loaded: None,
        stats: ExpertsStats::default(),
        // (a timeout past what an Instant holds: a year)
        end: Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(365 * 86_400)),
    };
    if p.tokens == 0 {
        return Ok((Vec::new(), card.stats));
    }
    let chunks = f_chunks(gemm, vecops, p.f);
    // Y's rows and the combine's: padded to the GEMM's lanes (zeros past H); the output
    // keeps the first `4 words(H)` columns of each row.
    let hl = pad_lanes(p.h, lanes(gemm));
    let out_row = LANES * words16(p.h);
    let card_row = LANES * words16(hl);
    with_scratch(dev, |dev, s| {
        let by = if p.experts.is_empty() {
            // no expert writes Y: its one row (what the zero weights name) is zeros
            s.upload(dev, &vec![0u8; hl])?
        } else {
            s.alloc(dev, p.y_rows() * hl)?
        };
        let mut row = 0;
        for e in &p.experts {
            let ye = view(&by, row * hl);
            with_scratch(dev, |dev, s2| {
                let acts = card.act(dev, s2, p, e, &chunks)?;
                card.down(dev, s2, p, e, &chunks, &acts, &ye)
            })?;
            row += e.rows;
        }
        card.load(dev, false)?;
        let bt = s.upload(dev, &words(&p.table))?;
        let bo = s.alloc(dev, p.tokens * card_row * 2)?;
        let step = combine_tokens(vecops, p.k);
        for t0 in (0..p.tokens).step_by(step) {
            let rows = step.min(p.tokens - t0);
            let args = VecArgs {
                n: hl,
                ..p.combine_args(rows)
            };
            let st = super::vecops::launch_combine(
                dev,
                &args,
                &view(&bt, t0 * p.k * 8),
                &by,
                &view(&bo, t0 * card_row * 2),
                card.left(),
            )?;
            card.stats.add(&st, false);
        }
        let out = read(dev, &bo, p.tokens * card_row * 2)?;
        let y = out
            .chunks_exact(card_row * 2)
            .flat_map(|r| r[..out_row * 2].chunks_exact(2))
            .map(|c| i16::from_le_bytes([c[0], c[1]]))
            .collect();
        Ok((y, card.stats))
    })
}

/// Cycles of [`run_experts`] from the kernels' cycle models (`crate::timing`): every GEMM and
/// vecops launch it makes for experts of `rows[e]` slots each (experts without slots make
/// none), hidden size `h`, FFN size `f`, `tokens` output rows of `k` table entries.
#[allow(clippy::too_many_arguments)]
pub fn experts_cycles(
    gemm: &GemmCore,
    vecops: &VecopsCore,
    rows: &[usize],
    h: usize,
    f: usize,
    tokens: usize,
    k: usize,
    mem: &MemTiming,
) -> u64 {
    let w = WPlacement::Shared;
    experts_cycles_placed(gemm, vecops, rows, (h, f, tokens, k), mem, w)
}

/// [`experts_cycles`] with the GEMMs' W streams placed as `w` says (the driver's
/// [`super::stream_bank`]).
pub fn experts_cycles_placed(
    gemm: &GemmCore,
    vecops: &VecopsCore,
    rows: &[usize],
    (h, f, tokens, k): (usize, usize, usize, usize),
    mem: &MemTiming,
    w: WPlacement,
) -> u64 {
    let chunks = f_chunks(gemm, vecops, f);
    let l = lanes(gemm);
    let hp = pad_lanes(h, l) as u64;
    let mut total = 0u64;
    for &m in rows.iter().filter(|&&m| m > 0) {
        let m64 = m as u64;
        for (i, r) in chunks.iter().enumerate() {
            let nc = pad_lanes(r.len(), l);
            total += 2 * w.gemm_cycles(gemm, (m64, nc as u64, hp), 0, mem);
            let args = VecArgs {
                op: crate::golden::vecops::OP_SILU_MUL8,
                rows: m,
                n: nc,
                ..VecArgs::default()
            };
            total += timing::vecops_cycles(vecops, &args, mem);
            let (first, last) = (i == 0, i + 1 == chunks.len());
            let mode = if first { 0 } else { MODE_ACC_IN } | if last { 0 } else { MODE_PART_OUT };
            total += w.gemm_cycles(gemm, (m64, hp, nc as u64), mode, mem);
        }
    }
    let step = combine_tokens(vecops, k);
    for t0 in (0..tokens).step_by(step) {
        let args = VecArgs {
            op: crate::golden::vecops::OP_COMBINE,
            rows: step.min(tokens - t0),
            n: hp as usize,
            c0: k as u32,
            ..VecArgs::default()
        };
        total += timing::vecops_cycles(vecops, &args, mem);
    }
    total
}
